//! The single pass a position needs over its logits: the top candidates, the maximum, the
//! softmax sums (at the request temperature and, when it differs, at 1) and optionally the
//! per-block sums the dense sampler walks.
//!
//! The maximum is not known in advance, so sums are kept relative to a running maximum
//! and rescaled (in f64) whenever a block raises it — the online-softmax trick. It happens a
//! handful of times per vector; every block is read once, while it is in L1.

use crate::fastmath::{ExpSums, LANES, SUM_BLOCK, weight_arg};
use crate::select::TopBuffer;

pub(crate) struct Scan {
    /// Best candidates, descending, ties by lower id.
    pub top: Vec<(f32, u32)>,
    /// Largest finite logit; -inf when there is none.
    pub max: f32,
    /// Softmax sums at the request temperature.
    pub at_t: ExpSums,
    /// Softmax normaliser at temperature 1 (`at_t.z` unless `two`), relative to `max`.
    pub z_one: f64,
    /// Σ e^s per SUM_BLOCK block at the request temperature, relative to `max` (if asked).
    pub blocks: Vec<f64>,
}

impl Scan {
    pub fn top_ids(&self) -> Vec<u32> {
        self.top.iter().map(|&(_, id)| id).collect()
    }
}

fn block_max(block: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; LANES];
    let chunks = block.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            m[l] = if c[l] > m[l] { c[l] } else { m[l] };
        }
    }
    for &x in rest {
        m[0] = if x > m[0] { x } else { m[0] };
    }
    m.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })
}

/// Lane sums of e^s and s·e^s over one block.
#[inline(always)]
fn block_sums(block: &[f32], max: f32, inv_t: f32) -> (f64, f64) {
    let (mut z, mut se) = ([0f32; LANES], [0f32; LANES]);
    let chunks = block.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            let (e, s) = weight_arg::<true>(c[l], max, inv_t);
            z[l] += e;
            se[l] += s * e;
        }
    }
    for (l, &x) in rest.iter().enumerate() {
        let (e, s) = weight_arg::<true>(x, max, inv_t);
        z[l] += e;
        se[l] += s * e;
    }
    (sum_lanes(z), sum_lanes(se))
}

/// Lane sum of e^(l - max) over one block, with the cheaper exp: Z at temperature 1 only
/// feeds reported log-probabilities (error ~3e-6 nats).
#[inline(always)]
fn block_z_at_one(block: &[f32], max: f32) -> f64 {
    // Two 4-wide accumulators: with an 8-wide array LLVM mixes scalar and vector loads here.
    let (mut z0, mut z1) = ([0f32; 4], [0f32; 4]);
    let chunks = block.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..4 {
            z0[l] += weight_arg::<false>(c[l], max, 1.0).0;
            z1[l] += weight_arg::<false>(c[l + 4], max, 1.0).0;
        }
    }
    for (l, &x) in rest.iter().enumerate() {
        z0[l % 4] += weight_arg::<false>(x, max, 1.0).0;
    }
    z0.iter().chain(&z1).map(|&x| x as f64).sum()
}

fn sum_lanes(v: [f32; LANES]) -> f64 {
    v.iter().map(|&x| x as f64).sum()
}

/// Rescales sums taken relative to an old maximum to a new one: with δ = (new - old)/T,
/// Z' = Z e^-δ and Σ s' e^s' = e^-δ (Σ s e^s - δ Z).
fn rescale(sums: &mut ExpSums, delta: f64) {
    if sums.z > 0.0 {
        let f = (-delta).exp();
        sums.s_e = f * (sums.s_e - delta * sums.z);
        sums.z *= f;
    }
}

/// One pass over `logits`: the `n_top` best candidates, the max, softmax sums at 1/`inv_t`
/// (only Z, at 1, when `two`), and per-block sums when `record_blocks`.
pub(crate) fn scan(logits: &[f32], n_top: usize, inv_t: f32, two: bool, record_blocks: bool) -> Scan {
    let mut top = TopBuffer::new(n_top);
    let (mut at_t, mut z_one) = (ExpSums::default(), 0.0f64);
    let mut max = f32::NEG_INFINITY;
    let mut blocks = Vec::with_capacity(if record_blocks { logits.len().div_ceil(SUM_BLOCK) } else { 0 });
    // (first block index, max in force from it on), to rescale recorded block sums at the end.
    let mut epochs: Vec<(usize, f32)> = Vec::new();
    for (b, block) in logits.chunks(SUM_BLOCK).enumerate() {
        let bmax = block_max(block);
        if bmax > top.threshold() {
            top.offer(block, b * SUM_BLOCK);
        }
        if bmax > max {
            if max > f32::NEG_INFINITY {
                rescale(&mut at_t, ((bmax - max) * inv_t) as f64);
                z_one *= ((max - bmax) as f64).exp();
            }
            max = bmax;
            epochs.push((b, max));
        }
        if max == f32::NEG_INFINITY {
            if record_blocks {
                blocks.push(0.0);
            }
            continue;
        }
        let (z, se) = block_sums(block, max, inv_t);
        at_t.z += z;
        at_t.s_e += se;
        if two {
            z_one += block_z_at_one(block, max);
        }
        if record_blocks {
            blocks.push(z);
        }
    }
    if record_blocks {
        for (i, &(start, m)) in epochs.iter().enumerate() {
            if m < max {
                let f = (((m - max) * inv_t) as f64).exp();
                let end = epochs.get(i + 1).map_or(blocks.len(), |e| e.0);
                blocks[start..end].iter_mut().for_each(|z| *z *= f);
            }
        }
    }
    Scan { top: top.finish(), max, at_t, z_one: if two { z_one } else { at_t.z }, blocks }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fastmath::{exp_sums, exp_sums_two};
    use crate::select::top_pairs;

    #[test]
    fn one_pass_agrees_with_separate_passes_when_the_max_comes_late() {
        // Rising values: the running max changes in almost every block.
        let logits: Vec<f32> = (0..2000u32).map(|i| i as f32 / 200.0 + ((i * 7) % 13) as f32 / 10.0).collect();
        let inv_t = 1.0 / 0.7;
        let s = scan(&logits, 10, inv_t, true, true);
        let top = top_pairs(&logits, 10);
        assert_eq!(s.top, top);
        assert_eq!(s.max, top[0].0);
        let mut blocks = Vec::new();
        let (a, b) = exp_sums_two(&logits, s.max, inv_t, Some(&mut blocks));
        for (x, y) in [(s.at_t.z, a.z), (s.at_t.s_e, a.s_e), (s.z_one, b.z)] {
            assert!((x / y - 1.0).abs() < 1e-5, "{x} vs {y}");
        }
        assert_eq!(s.blocks.len(), blocks.len());
        for (x, y) in s.blocks.iter().zip(&blocks) {
            assert!((x - y).abs() <= 1e-5 * y.max(1e-30), "{x} vs {y}");
        }
        let one = scan(&logits, 0, 1.0, false, false);
        assert!((one.at_t.z / exp_sums(&logits, one.max, 1.0, None).z - 1.0).abs() < 1e-5);
        assert!(one.top.is_empty() && one.blocks.is_empty());
    }

    #[test]
    fn a_vector_without_finite_logits_scans_to_nothing() {
        let s = scan(&[f32::NEG_INFINITY; 300], 3, 1.0, false, true);
        assert!(s.top.is_empty());
        assert_eq!((s.max, s.at_t.z), (f32::NEG_INFINITY, 0.0));
        assert_eq!(s.blocks, vec![0.0; 3]);
    }
}
