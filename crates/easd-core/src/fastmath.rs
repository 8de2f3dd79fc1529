//! Vectorisable kernels for 152k-entry logit vectors: a branch-free `exp` for arguments
//! <= 0 and lane-parallel sums (Rust does not reassociate float adds, so plain `sum()` is
//! scalar; eight independent accumulators let the compiler use SIMD).

pub(crate) const LANES: usize = 8;
/// Flush lane accumulators into f64 this often: f32 error stays ~1e-7 relative per block.
const BLOCK: usize = 1024;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// e^x for x <= 0 (relative error ~2e-7); exactly 0 below -87 and for -inf.
/// Same operations on every path, so a scalar call and a vectorised loop agree bit for bit.
#[inline(always)]
pub(crate) fn exp_neg(x: f32) -> f32 {
    let xc = x.clamp(-87.0, 0.0);
    let k = xc * LOG2E + ROUND_MAGIC;
    let n = k - ROUND_MAGIC;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let bits = ((k.to_bits() as i32 - 0x4B40_0000 + 127) << 23) as u32;
    let y = p * f32::from_bits(bits);
    if x < -87.0 { 0.0 } else { y }
}

/// Scaled, clamped exponent argument s = (l - max) / T, never NaN for -inf or NaN logits.
#[inline(always)]
pub(crate) fn scaled(l: f32, max: f32, inv_t: f32) -> f32 {
    ((l - max) * inv_t).max(-88.0)
}

/// 1/T, kept finite so that a tiny temperature behaves as a (tie-splitting) argmax.
pub(crate) fn inv_temperature(t: f32) -> f32 {
    (1.0 / t).min(f32::MAX)
}

/// Sums over the softmax at one temperature: Z = Σ e^s and Σ s e^s, with s = (l - max)/T.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ExpSums {
    pub z: f64,
    pub s_e: f64,
}

impl ExpSums {
    /// Shannon entropy (nats) of the softmax: H = ln Z - Σ s e^s / Z.
    pub fn entropy(&self) -> f32 {
        if self.z > 0.0 { (self.z.ln() - self.s_e / self.z).max(0.0) as f32 } else { 0.0 }
    }
}

/// One pass: softmax sums at `inv_t`.
pub(crate) fn exp_sums(logits: &[f32], max: f32, inv_t: f32) -> ExpSums {
    let (mut z, mut s_e) = (0.0f64, 0.0f64);
    for block in logits.chunks(BLOCK) {
        let mut zl = [0f32; LANES];
        let mut sl = [0f32; LANES];
        let chunks = block.chunks_exact(LANES);
        let rest = chunks.remainder();
        for c in chunks {
            for l in 0..LANES {
                let s = scaled(c[l], max, inv_t);
                let e = exp_neg(s);
                zl[l] += e;
                sl[l] += s * e;
            }
        }
        for &x in rest {
            let s = scaled(x, max, inv_t);
            let e = exp_neg(s);
            zl[0] += e;
            sl[0] += s * e;
        }
        z += zl.iter().map(|&v| v as f64).sum::<f64>();
        s_e += sl.iter().map(|&v| v as f64).sum::<f64>();
    }
    ExpSums { z, s_e }
}

/// One pass, two temperatures (the request's and 1): used when T != 1 and both the sampling
/// distribution and raw log-probabilities are needed.
pub(crate) fn exp_sums_two(logits: &[f32], max: f32, inv_t: f32) -> (ExpSums, ExpSums) {
    let (mut a, mut b) = (ExpSums { z: 0.0, s_e: 0.0 }, ExpSums { z: 0.0, s_e: 0.0 });
    for block in logits.chunks(BLOCK) {
        let mut za = [0f32; LANES];
        let mut sa = [0f32; LANES];
        let mut zb = [0f32; LANES];
        let mut sb = [0f32; LANES];
        let chunks = block.chunks_exact(LANES);
        let rest = chunks.remainder();
        for c in chunks {
            for l in 0..LANES {
                let s = scaled(c[l], max, inv_t);
                let e = exp_neg(s);
                za[l] += e;
                sa[l] += s * e;
                let s1 = scaled(c[l], max, 1.0);
                let e1 = exp_neg(s1);
                zb[l] += e1;
                sb[l] += s1 * e1;
            }
        }
        for &x in rest {
            let s = scaled(x, max, inv_t);
            let e = exp_neg(s);
            za[0] += e;
            sa[0] += s * e;
            let s1 = scaled(x, max, 1.0);
            let e1 = exp_neg(s1);
            zb[0] += e1;
            sb[0] += s1 * e1;
        }
        let f = |v: &[f32; LANES]| v.iter().map(|&x| x as f64).sum::<f64>();
        a.z += f(&za);
        a.s_e += f(&sa);
        b.z += f(&zb);
        b.s_e += f(&sb);
    }
    (a, b)
}

/// Σ e^s over a contiguous range, lane-parallel (the tail walk of a dense sampler).
pub(crate) fn exp_sum_range(logits: &[f32], max: f32, inv_t: f32) -> f64 {
    let mut acc = [0f32; LANES];
    let chunks = logits.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            acc[l] += exp_neg(scaled(c[l], max, inv_t));
        }
    }
    let mut total: f64 = acc.iter().map(|&v| v as f64).sum();
    for &x in rest {
        total += exp_neg(scaled(x, max, inv_t)) as f64;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_std_exp_to_a_few_ulps() {
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (fast, exact) = (exp_neg(x) as f64, (x as f64).exp());
            assert!(((fast - exact) / exact).abs() < 5e-7, "x={x}: {fast} vs {exact}");
            x += 0.0137;
        }
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(-87.5), 0.0);
        assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn sums_and_entropy_match_a_direct_f64_computation() {
        let logits: Vec<f32> = (0..5003).map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0).collect();
        let max = logits.iter().cloned().fold(f32::MIN, f32::max);
        for t in [0.3f32, 1.0, 2.5] {
            let z: f64 = logits.iter().map(|&l| ((l - max) as f64 / t as f64).exp()).sum();
            let h: f64 = -logits
                .iter()
                .map(|&l| {
                    let p = ((l - max) as f64 / t as f64).exp() / z;
                    p * p.ln()
                })
                .sum::<f64>();
            let sums = exp_sums(&logits, max, 1.0 / t);
            assert!((sums.z / z - 1.0).abs() < 1e-5);
            assert!((sums.entropy() as f64 - h).abs() < 1e-4);
            let (a, b) = exp_sums_two(&logits, max, 1.0 / t);
            assert_eq!(a.z, sums.z);
            assert_eq!(b.z, exp_sums(&logits, max, 1.0).z);
        }
    }

    #[test]
    fn masked_logits_contribute_nothing() {
        let logits = [0.0, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY];
        let sums = exp_sums(&logits, 0.0, 1.0);
        assert_eq!(sums.z, 2.0);
        assert!((sums.entropy() - std::f32::consts::LN_2).abs() < 1e-6);
        assert_eq!(exp_sum_range(&logits, 0.0, 1.0), 2.0);
    }
}
