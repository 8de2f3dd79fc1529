//! Entropy calibration: τ is a percentile of a model's token-entropy distribution (DESIGN §2.2).

/// Collects entropies; percentiles by linear interpolation (numpy's default).
#[derive(Clone, Debug, Default)]
pub struct EntropySamples {
    values: Vec<f32>,
    sorted: bool,
}

impl EntropySamples {
    /// Adds one entropy; NaN is ignored (it has no rank).
    pub fn push(&mut self, h: f32) {
        if !h.is_nan() {
            self.values.push(h);
            self.sorted = false;
        }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The p-th percentile, p in [0, 100], interpolating linearly between the two nearest
    /// ranks (rank = p/100 · (n − 1)). None when empty or p is outside [0, 100].
    pub fn percentile(&mut self, p: f64) -> Option<f32> {
        if self.values.is_empty() || !(0.0..=100.0).contains(&p) {
            return None;
        }
        if !self.sorted {
            self.values.sort_unstable_by(f32::total_cmp);
            self.sorted = true;
        }
        let rank = p / 100.0 * (self.values.len() - 1) as f64;
        let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
        let (a, b) = (self.values[lo] as f64, self.values[hi] as f64);
        Some((a + (b - a) * (rank - lo as f64)) as f32)
    }

    pub fn mean(&self) -> Option<f64> {
        (!self.values.is_empty()).then(|| self.values.iter().map(|&v| v as f64).sum::<f64>() / self.values.len() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let mut s = EntropySamples::default();
        for h in [3.0, 1.0, 4.0, 1.0, 5.0, f32::NAN] {
            s.push(h);
        }
        assert_eq!(s.len(), 5);
        // numpy.percentile([1, 1, 3, 4, 5], [0, 25, 50, 80, 90, 100])
        let expected = [(0.0, 1.0), (25.0, 1.0), (50.0, 3.0), (80.0, 4.2), (90.0, 4.6), (100.0, 5.0)];
        for (p, v) in expected {
            assert!((s.percentile(p).unwrap() - v).abs() < 1e-6, "p{p}");
        }
        assert_eq!(s.mean(), Some(2.8));
        assert_eq!(s.percentile(100.5), None);
        s.push(0.0);
        assert_eq!(s.percentile(0.0), Some(0.0));
    }

    #[test]
    fn an_empty_collection_has_no_statistics() {
        let mut s = EntropySamples::default();
        assert!(s.is_empty());
        assert_eq!(s.percentile(50.0), None);
        assert_eq!(s.mean(), None);
    }
}
