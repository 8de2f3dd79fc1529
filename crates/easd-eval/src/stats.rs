//! The statistics the report needs, as pure functions checked against known values.

/// z for a two-sided 95% interval (the 0.975 normal quantile).
pub const Z_95: f64 = 1.959_963_984_540_054;

/// A closed interval `[low, high]`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Interval {
    pub low: f64,
    pub high: f64,
}

/// Wilson score interval for `successes` out of `trials` at normal quantile `z` (use [`Z_95`]).
/// Unlike the normal approximation it stays inside [0, 1] and behaves at 0/n and n/n. `trials == 0` gives [0, 1].
pub fn wilson_interval(successes: u64, trials: u64, z: f64) -> Interval {
    if trials == 0 {
        return Interval { low: 0.0, high: 1.0 };
    }
    let n = trials as f64;
    let p = successes.min(trials) as f64 / n;
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    Interval { low: (centre - half).max(0.0), high: (centre + half).min(1.0) }
}

/// Exact two-sided McNemar test on paired outcomes: `b` = pairs where only the first system was right, `c` = only
/// the second. Under the null the discordant pairs split Binomial(b + c, 1/2); the p-value is
/// min(1, 2·P(X ≤ min(b, c))). No discordant pairs gives 1.
pub fn mcnemar_exact(b: u64, c: u64) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    (2.0 * binomial_cdf_half(b.min(c), n)).min(1.0)
}

/// P(X ≤ k) for X ~ Binomial(n, 1/2), summed in log space so large n neither underflows nor loses precision.
fn binomial_cdf_half(k: u64, n: u64) -> f64 {
    let ln_half_n = -(n as f64) * std::f64::consts::LN_2;
    let mut ln_choose = 0.0; // ln C(n, 0)
    let mut terms = Vec::with_capacity(k as usize + 1);
    for i in 0..=k {
        if i > 0 {
            ln_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        terms.push(ln_choose + ln_half_n);
    }
    let max = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    max.exp() * terms.iter().map(|t| (t - max).exp()).sum::<f64>()
}

/// Holm–Bonferroni step-down adjustment of a family of p-values (same order as given), so that "significant" in a
/// table with every pair of modes keeps its meaning.
pub fn holm_adjust(p_values: &[f64]) -> Vec<f64> {
    let m = p_values.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p_values[a].total_cmp(&p_values[b]));
    let mut adjusted = vec![0.0; m];
    let mut running: f64 = 0.0;
    for (rank, &i) in order.iter().enumerate() {
        running = running.max(((m - rank) as f64 * p_values[i]).min(1.0));
        adjusted[i] = running;
    }
    adjusted
}

/// Percentiles come from easd-core, the one implementation the calibration thresholds also use (numpy's default:
/// linear interpolation between the closest ranks).
pub use easd_core::percentile_sorted;

/// Interval at normal quantile `z` for the difference of two paired proportions, p_A − p_B, by Newcombe's hybrid score
/// method for paired data (Newcombe 1998, *Stat Med* 17:2635, method 10): each proportion's Wilson interval, combined
/// square-and-add with a correction for their correlation φ. Counts of the paired table: `both` right, `only_a`,
/// `only_b`, `neither`. It stays inside [−1, 1] and behaves with few discordant pairs, where the Wald interval does not.
/// No pairs gives [−1, 1].
pub fn paired_difference_interval(both: u64, only_a: u64, only_b: u64, neither: u64, z: f64) -> Interval {
    let n = both + only_a + only_b + neither;
    if n == 0 {
        return Interval { low: -1.0, high: 1.0 };
    }
    let (a_right, b_right) = (both + only_a, both + only_b);
    let (a_wrong, b_wrong) = (n - a_right, n - b_right);
    let total = n as f64;
    let (p_a, p_b) = (a_right as f64 / total, b_right as f64 / total);
    let (wa, wb) = (wilson_interval(a_right, n, z), wilson_interval(b_right, n, z));
    // φ: the correlation of the two outcomes, shrunk towards 0 by n/2 on the positive side (Newcombe's correction).
    let phi = if a_right == 0 || a_wrong == 0 || b_right == 0 || b_wrong == 0 {
        0.0
    } else {
        let cross = both as f64 * neither as f64 - only_a as f64 * only_b as f64;
        let scale = (a_right as f64 * a_wrong as f64 * b_right as f64 * b_wrong as f64).sqrt();
        if cross > total / 2.0 {
            (cross - total / 2.0) / scale
        } else if cross >= 0.0 {
            0.0
        } else {
            cross / scale
        }
    };
    let square_and_add = |x: f64, y: f64| (x * x + y * y - 2.0 * phi * x * y).max(0.0).sqrt();
    let d = p_a - p_b;
    Interval {
        low: (d - square_and_add(p_a - wa.low, wb.high - p_b)).max(-1.0),
        high: (d + square_and_add(p_b - wb.low, wa.high - p_a)).min(1.0),
    }
}

/// Pearson correlation of paired samples; `None` with fewer than two pairs or a constant side.
pub fn pearson(xs: &[f32], ys: &[f32]) -> Option<f64> {
    let n = xs.len().min(ys.len());
    if n < 2 {
        return None;
    }
    let mean = |v: &[f32]| v[..n].iter().map(|&x| x as f64).sum::<f64>() / n as f64;
    let (mx, my) = (mean(xs), mean(ys));
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for i in 0..n {
        let (dx, dy) = (xs[i] as f64 - mx, ys[i] as f64 - my);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    (sxx > 0.0 && syy > 0.0).then(|| sxy / (sxx * syy).sqrt())
}

/// Counts of samples in fixed-width bins starting at 0 (entropies are non-negative); the last bin takes everything
/// at or above its lower edge.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Histogram {
    pub bin_width: f32,
    pub counts: Vec<u64>,
}

impl Histogram {
    /// `bins` bins of `bin_width` (both must be positive; otherwise an empty histogram).
    pub fn new(bin_width: f32, bins: usize) -> Histogram {
        let ok = bin_width > 0.0 && bin_width.is_finite() && bins > 0;
        Histogram { bin_width: if ok { bin_width } else { 0.0 }, counts: if ok { vec![0; bins] } else { Vec::new() } }
    }

    pub fn push(&mut self, x: f32) {
        if self.counts.is_empty() || !x.is_finite() {
            return;
        }
        let bin = ((x.max(0.0) / self.bin_width) as usize).min(self.counts.len() - 1);
        self.counts[bin] += 1;
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Merges every `factor` adjacent bins (for plots: fine bins are noisy with few samples).
    pub fn rebin(&self, factor: usize) -> Histogram {
        let factor = factor.max(1);
        Histogram {
            bin_width: self.bin_width * factor as f32,
            counts: self.counts.chunks(factor).map(|c| c.iter().sum()).collect(),
        }
    }

    /// Probability density per bin (integrates to 1); all zeros when empty.
    pub fn densities(&self) -> Vec<f64> {
        let total = self.total();
        self.counts
            .iter()
            .map(|&c| if total == 0 { 0.0 } else { c as f64 / (total as f64 * self.bin_width as f64) })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn wilson_matches_published_values() {
        // 11/20: the target's GSM8K score in DESIGN §5.
        let i = wilson_interval(11, 20, Z_95);
        assert!(close(i.low, 0.342_085, 1e-5) && close(i.high, 0.741_802, 1e-5), "{i:?}");
        // Values from statsmodels.stats.proportion.proportion_confint(method="wilson").
        let i = wilson_interval(5, 20, Z_95);
        assert!(close(i.low, 0.111_862, 1e-5) && close(i.high, 0.468_701, 1e-5), "{i:?}");
        let i = wilson_interval(0, 10, Z_95);
        assert!(close(i.low, 0.0, 1e-12) && close(i.high, 0.277_530, 1e-5), "{i:?}");
        let i = wilson_interval(10, 10, Z_95);
        assert!(close(i.low, 0.722_470, 1e-5) && close(i.high, 1.0, 1e-12), "{i:?}");
        assert_eq!(wilson_interval(0, 0, Z_95), Interval { low: 0.0, high: 1.0 });
    }

    #[test]
    fn mcnemar_exact_matches_the_binomial_test() {
        // 2 * (1 + 10) / 1024
        assert!(close(mcnemar_exact(1, 9), 0.021_484_375, 1e-12));
        assert!(close(mcnemar_exact(9, 1), 0.021_484_375, 1e-12));
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        assert_eq!(mcnemar_exact(5, 5), 1.0);
        // 2 * 0.5^6
        assert!(close(mcnemar_exact(0, 6), 0.031_25, 1e-12));
        // scipy.stats.binomtest(30, 100).pvalue = 7.85013964559367e-05
        assert!(close(mcnemar_exact(30, 70), 7.850_139_645_593_67e-5, 1e-12));
        // Large n stays accurate instead of underflowing: scipy.stats.binomtest(1000, 3000).pvalue.
        let p = mcnemar_exact(1000, 2000);
        assert!((p / 1.009_014_862_794_065_1e-75 - 1.0).abs() < 1e-9, "{p}");
    }

    #[test]
    fn holm_adjustment_is_monotone_and_capped() {
        let adj = holm_adjust(&[0.01, 0.04, 0.03, 0.5]);
        // sorted 0.01, 0.03, 0.04, 0.5 -> 0.04, 0.09, 0.09 (monotone), 0.5
        let want = [0.04, 0.09, 0.09, 0.5];
        for (a, w) in adj.iter().zip(want) {
            assert!(close(*a, w, 1e-12), "{adj:?}");
        }
        assert_eq!(holm_adjust(&[0.9, 0.8]), vec![1.0, 1.0]);
    }

    #[test]
    fn paired_difference_intervals_match_published_values() {
        // Fagerland, Lydersen & Laake, *Statistical Analysis of Contingency Tables* (2017), ch. 8: complete response
        // before and after consolidation (Cavo et al. 2012), table [[59, 6], [16, 80]]: Newcombe square-and-add
        // estimate −0.0621, 95% CI −0.1186 to −0.0046.
        let i = paired_difference_interval(59, 6, 16, 80, Z_95);
        assert!(close(i.low, -0.1186, 5e-5) && close(i.high, -0.0046, 5e-5), "{i:?}");
        // Swapping A and B mirrors the interval.
        let m = paired_difference_interval(59, 16, 6, 80, Z_95);
        assert!(close(m.low, -i.high, 1e-12) && close(m.high, -i.low, 1e-12), "{m:?}");
        // No discordant pairs: centred on 0; all discordant one way: inside [-1, 1].
        let tie = paired_difference_interval(10, 0, 0, 10, Z_95);
        assert!(tie.low < 0.0 && tie.high > 0.0 && close(tie.low, -tie.high, 1e-12), "{tie:?}");
        let sweep = paired_difference_interval(0, 10, 0, 0, Z_95);
        assert!(sweep.low > 0.5 && sweep.high == 1.0, "{sweep:?}");
        assert_eq!(paired_difference_interval(0, 0, 0, 0, Z_95), Interval { low: -1.0, high: 1.0 });
        // Large n approaches the Wald interval (b − c)/n ± z·sqrt(b + c − (b − c)²/n)/n.
        let (b, c, n): (f64, f64, f64) = (150.0, 100.0, 1000.0);
        let half = Z_95 * (b + c - (b - c) * (b - c) / n).sqrt() / n;
        let w = paired_difference_interval(600, 150, 100, 150, Z_95);
        assert!(close(w.low, 0.05 - half, 2e-3) && close(w.high, 0.05 + half, 2e-3), "{w:?} vs ±{half}");
    }

    #[test]
    fn histograms_bin_clamp_and_normalise() {
        let mut h = Histogram::new(0.5, 4);
        for x in [0.1, 0.6, 0.7, 9.0, -1.0, f32::NAN] {
            h.push(x);
        }
        assert_eq!(h.counts, vec![2, 2, 0, 1]);
        let area: f64 = h.densities().iter().map(|d| d * 0.5).sum();
        assert!(close(area, 1.0, 1e-12));
        assert!(Histogram::new(0.0, 3).counts.is_empty());
        let coarse = h.rebin(3);
        assert_eq!((coarse.bin_width, coarse.counts), (1.5, vec![4, 1]));
    }

    #[test]
    fn pearson_sees_perfect_and_absent_correlation() {
        assert!(close(pearson(&[1.0, 2.0, 3.0], &[2.0, 4.0, 6.0]).unwrap(), 1.0, 1e-12));
        assert!(close(pearson(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]).unwrap(), -1.0, 1e-12));
        assert_eq!(pearson(&[1.0, 1.0], &[1.0, 2.0]), None);
    }
}
