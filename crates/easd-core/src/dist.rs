//! Distributions over the vocabulary: the request transform (temperature, top-k, top-p, K_q
//! truncation) as a sparse distribution, entropy, top-N sets and their overlap.
//!
//! Conventions: ties in value are broken by lower token id everywhere (top-N, argmax, top-k,
//! the top-p cut), so every set is deterministic. The top-p cut keeps the shortest prefix of
//! the (descending, id-tie-broken) order whose mass reaches `top_p`; a token tied with the
//! last kept one but with a higher id is cut.

use crate::fastmath::{inv_temperature, weight};
use crate::params::SamplingParams;
use crate::scan::scan;
use crate::select::{better, top_ids};

/// Sparse distribution: ids with probabilities, sorted by descending probability (ties by
/// lower id), summing to 1; zero-probability ids are left out.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SparseDist {
    pub ids: Vec<u32>,
    pub probs: Vec<f32>,
}

impl SparseDist {
    /// All mass on one token.
    pub fn point(id: u32) -> Self {
        Self { ids: vec![id], probs: vec![1.0] }
    }

    /// Probability of `id`; 0 if absent.
    pub fn prob(&self, id: u32) -> f32 {
        self.ids.iter().position(|&i| i == id).map_or(0.0, |k| self.probs[k])
    }

    /// Inverse-CDF sample with uniform `u` in [0, 1). Never returns a zero-probability id;
    /// an empty distribution returns 0 (callers never build one from valid logits).
    pub fn sample(&self, u: f64) -> u32 {
        let total: f64 = self.probs.iter().map(|&p| p.max(0.0) as f64).sum();
        let threshold = u * total;
        let mut acc = 0.0f64;
        let mut last_positive = None;
        for (&id, &p) in self.ids.iter().zip(&self.probs) {
            if p > 0.0 {
                acc += p as f64;
                last_positive = Some(id);
                if acc > threshold {
                    return id;
                }
            }
        }
        // Only reachable through rounding when u is within 1e-16 of 1.
        last_positive.unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Sum of the probabilities (1 up to rounding for a well-formed distribution).
    pub fn total(&self) -> f64 {
        self.probs.iter().map(|&p| p as f64).sum()
    }
}

/// Shannon entropy (nats) of softmax(logits / t), t = temperature (1 for greedy). One
/// vectorised pass, no allocation.
pub fn entropy(logits: &[f32], temperature: f32) -> f32 {
    let t = if temperature == 0.0 { 1.0 } else { temperature };
    scan(logits, 0, inv_temperature(t), false, false).at_t.entropy()
}

/// Ids of the n largest logits, descending (partial selection, no full sort). Ties broken by
/// lower id. NaN and -inf entries are never returned.
pub fn top_n(logits: &[f32], n: usize) -> Vec<u32> {
    top_ids(logits, n)
}

/// |a ∩ b| / n (n = the EASD N), counting only the first n ids of each list.
pub fn overlap(a: &[u32], b: &[u32], n: usize) -> f32 {
    if n == 0 {
        return 0.0;
    }
    let (a, b) = (&a[..a.len().min(n)], &b[..b.len().min(n)]);
    let common = a.iter().filter(|id| b.contains(id)).count();
    common as f32 / n as f32
}

/// Greedy argmax, ties -> lowest id (0 when no entry is finite).
pub fn argmax(logits: &[f32]) -> u32 {
    top_ids(logits, 1).first().copied().unwrap_or(0)
}

/// Smallest non-zero of two limits (0 = unlimited).
pub(crate) fn min_limit(a: usize, b: usize) -> usize {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (x, y) => x.min(y),
    }
}

/// How many candidates to select before trying to build the sparse distribution.
pub(crate) fn initial_candidates(params: &SamplingParams, max_support: usize, len: usize) -> usize {
    let limit = min_limit(params.top_k, max_support);
    if limit > 0 {
        limit
    } else if params.top_p < 1.0 {
        256
    } else {
        len
    }
    .min(len)
}

/// Builds the transformed sparse distribution from descending candidates `cands`, replacing
/// them by the whole nucleus when a top-p nucleus is not yet covered.
/// `z` is the full softmax normaliser at `inv_t` (only read when top_k is off and top_p on).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sparse_from(
    logits: &[f32],
    params: &SamplingParams,
    max_support: usize,
    max: f32,
    inv_t: f32,
    z: f64,
    cands: &mut Vec<u32>,
    requested: usize,
) -> SparseDist {
    // Fewer finite logits than requested, or the whole vocabulary: nothing is missing.
    let complete = cands.len() < requested || requested >= logits.len();
    if let Some(d) = try_sparse(logits, params, max_support, max, inv_t, z, cands, complete) {
        return d;
    }
    // The nucleus reaches beyond the candidates (a flat tail at a hot temperature).
    let needed = if params.top_p < 1.0 { params.top_p as f64 * z } else { f64::INFINITY };
    *cands = nucleus_candidates(logits, max, inv_t, needed);
    try_sparse(logits, params, max_support, max, inv_t, z, cands, true).unwrap_or_default()
}

/// A top set of ids (descending, ties by lower id, whole tie groups) whose softmax weight
/// surely reaches `needed` (all ids with a finite logit if it never does), at most ~2% more
/// weight than needed. One pass counts s = (l - max)/T into 4096 buckets; bucket counts times
/// the bucket's lowest weight bound the cumulative weight from below; a second pass collects
/// the ids down to the bucket where that bound crosses `needed`. No exp per element.
fn nucleus_candidates(logits: &[f32], max: f32, inv_t: f32, needed: f64) -> Vec<u32> {
    const BUCKETS: usize = 4096;
    let scale = BUCKETS as f32 / 87.0;
    // s in [-87, 0] -> bucket 0 (largest s) .. BUCKETS - 1; monotone in the logit.
    let bucket = |l: f32| (-((l - max) * inv_t) * scale) as usize;
    let mut count = vec![0u32; BUCKETS];
    for &l in logits {
        if l.is_finite() {
            count[bucket(l).min(BUCKETS - 1)] += 1;
        }
    }
    let mut bound = 0.0;
    let last = count
        .iter()
        .enumerate()
        .position(|(b, &c)| {
            // Lowest weight in bucket b, shaded for f32 rounding of the weights themselves.
            bound += c as f64 * (-((b + 1) as f64) / scale as f64).exp() * (1.0 - 1e-6);
            bound >= needed
        })
        .unwrap_or(usize::MAX);
    let mut pairs: Vec<(f32, u32)> = logits
        .iter()
        .enumerate()
        .filter(|&(_, &l)| l.is_finite() && bucket(l) <= last)
        .map(|(i, &l)| (l, i as u32))
        .collect();
    pairs.sort_unstable_by(better);
    pairs.into_iter().map(|(_, id)| id).collect()
}

#[allow(clippy::too_many_arguments)]
fn try_sparse(
    logits: &[f32],
    params: &SamplingParams,
    max_support: usize,
    max: f32,
    inv_t: f32,
    z: f64,
    cands: &[u32],
    complete: bool,
) -> Option<SparseDist> {
    let kset = if params.top_k > 0 { &cands[..cands.len().min(params.top_k)] } else { cands };
    let w: Vec<f64> = kset.iter().map(|&id| weight(logits[id as usize], max, inv_t) as f64).collect();
    let mut end = kset.len();
    if params.top_p < 1.0 {
        let mass = if params.top_k > 0 { w.iter().sum() } else { z };
        let target = params.top_p as f64 * mass;
        let mut acc = 0.0;
        match w.iter().position(|&x| {
            acc += x;
            acc >= target
        }) {
            Some(i) => end = i + 1,
            None => {
                let truncated = max_support > 0 && kset.len() >= max_support;
                if !(params.top_k > 0 || complete || truncated) {
                    return None;
                }
            }
        }
    } else if params.top_k == 0 && max_support == 0 && !complete {
        return None;
    }
    if max_support > 0 {
        end = end.min(max_support);
    }
    let norm: f64 = w[..end].iter().sum();
    let mut out = SparseDist::default();
    for (&id, &x) in kset[..end].iter().zip(&w[..end]) {
        let p = (x / norm) as f32;
        if p > 0.0 {
            out.ids.push(id);
            out.probs.push(p);
        }
    }
    Some(out)
}

/// Request transform: softmax(logits / T) then top-k then top-p, renormalised, as a sparse
/// distribution (greedy -> point mass on argmax). `max_support`: additionally keep only the
/// top `max_support` tokens (0 = unlimited) — K_q for the draft. Partial selection, no full
/// sort — except when nothing limits the support (no top-k, top-p = 1, max_support = 0),
/// where the whole vocabulary is returned sorted.
pub fn transformed(logits: &[f32], params: &SamplingParams, max_support: usize) -> SparseDist {
    if params.is_greedy() {
        return top_ids(logits, 1).first().map_or_else(SparseDist::default, |&id| SparseDist::point(id));
    }
    let requested = initial_candidates(params, max_support, logits.len());
    let inv_t = inv_temperature(params.temperature);
    let sc = scan(logits, requested.max(1), inv_t, false, false);
    let mut cands = sc.top_ids();
    if cands.is_empty() {
        return SparseDist::default();
    }
    let (max, z) = (sc.max, sc.at_t.z);
    sparse_from(logits, params, max_support, max, inv_t, z, &mut cands, requested.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p }
    }

    fn softmax(logits: &[f32], t: f32) -> Vec<f64> {
        let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let e: Vec<f64> = logits.iter().map(|&l| ((l as f64 - m) / t as f64).exp()).collect();
        let z: f64 = e.iter().sum();
        e.into_iter().map(|x| x / z).collect()
    }

    #[test]
    fn full_transform_is_the_softmax_sorted() {
        let logits = [1.0, 3.0, 2.0, 0.5];
        let d = transformed(&logits, &params(0.5, 0, 1.0), 0);
        assert_eq!(d.ids, vec![1, 2, 0, 3]);
        let exact = softmax(&logits, 0.5);
        for (&id, &p) in d.ids.iter().zip(&d.probs) {
            assert!((p as f64 - exact[id as usize]).abs() < 1e-6);
        }
        assert!((d.total() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn top_k_top_p_and_max_support_apply_in_that_order() {
        // softmax at T=1 of ln([0.4, 0.3, 0.2, 0.1]).
        let logits: Vec<f32> = [0.4f32, 0.3, 0.2, 0.1].iter().map(|p| p.ln()).collect();
        let ids = |t: &SparseDist| t.ids.clone();
        assert_eq!(ids(&transformed(&logits, &params(1.0, 0, 0.65), 0)), vec![0, 1]);
        assert_eq!(ids(&transformed(&logits, &params(1.0, 0, 0.7), 0)), vec![0, 1]);
        assert_eq!(ids(&transformed(&logits, &params(1.0, 0, 0.71), 0)), vec![0, 1, 2]);
        // top-k 2 first: the kept mass is 0.7, so top_p 0.6 needs 0.42 -> both tokens.
        assert_eq!(ids(&transformed(&logits, &params(1.0, 2, 0.6), 0)), vec![0, 1]);
        assert_eq!(ids(&transformed(&logits, &params(1.0, 2, 0.5), 0)), vec![0]);
        let d = transformed(&logits, &params(1.0, 0, 1.0), 3);
        assert_eq!(ids(&d), vec![0, 1, 2]);
        assert!((d.probs[0] - 0.4 / 0.9).abs() < 1e-6);
    }

    #[test]
    fn top_p_with_ties_cuts_by_lower_id() {
        let logits = [0.0f32; 4];
        let d = transformed(&logits, &params(1.0, 0, 0.5), 0);
        assert_eq!(d.ids, vec![0, 1]);
        assert_eq!(d.probs, vec![0.5, 0.5]);
        let d = transformed(&logits, &params(1.0, 0, 0.51), 0);
        assert_eq!(d.ids, vec![0, 1, 2]);
    }

    #[test]
    fn a_nucleus_larger_than_the_first_selection_is_found() {
        // Flat over 5000 tokens: top_p 0.9 needs 4500 of them, far beyond the first 256.
        let logits = vec![0.25f32; 5000];
        let d = transformed(&logits, &params(1.0, 0, 0.9), 0);
        assert_eq!(d.len(), 4500);
        assert!((d.total() - 1.0).abs() < 1e-4);
        assert_eq!(d.ids[..3], [0, 1, 2]);
    }

    #[test]
    fn a_large_nucleus_matches_a_full_sort_and_cut() {
        let logits: Vec<f32> = (0..3000u32).map(|i| (i.wrapping_mul(2654435761) >> 20) as f32 / 400.0).collect();
        for (t, top_p) in [(1.5f32, 0.97f32), (1.0, 0.8), (3.0, 0.999)] {
            let p = softmax(&logits, t);
            let mut order: Vec<usize> = (0..logits.len()).collect();
            order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap().then(a.cmp(&b)));
            let mut acc = 0.0;
            let end = order.iter().position(|&i| {
                acc += p[i];
                acc >= top_p as f64
            });
            let expected: Vec<u32> = order[..=end.unwrap()].iter().map(|&i| i as u32).collect();
            let d = transformed(&logits, &params(t, 0, top_p), 0);
            assert!(expected.len() > 256, "the case must exceed the first selection");
            // The cut may differ by a token whose cumulative mass sits within rounding of top_p.
            assert!(d.len().abs_diff(expected.len()) <= 1, "T={t}: {} vs {}", d.len(), expected.len());
            let n = d.len().min(expected.len());
            assert_eq!(d.ids[..n], expected[..n]);
        }
    }

    #[test]
    fn tiny_temperature_behaves_like_argmax_and_masked_tokens_get_nothing() {
        let logits = [1.0, 1.0 + 1e-3, f32::NEG_INFINITY, 0.0];
        assert_eq!(transformed(&logits, &params(1e-30, 0, 1.0), 0).ids, vec![1]);
        let d = transformed(&logits, &params(1.0, 0, 1.0), 0);
        assert_eq!(d.len(), 3);
        assert_eq!(d.prob(2), 0.0);
        assert_eq!(transformed(&logits, &SamplingParams::greedy(), 64), SparseDist::point(1));
    }

    #[test]
    fn entropy_matches_the_closed_form() {
        let uniform4 = [2.0f32; 4];
        assert!((entropy(&uniform4, 0.7) - 4f32.ln()).abs() < 1e-6);
        assert!((entropy(&uniform4, 0.0) - 4f32.ln()).abs() < 1e-6);
        let logits = [0.0f32, 1.0, -2.0];
        let exact: f64 = -softmax(&logits, 1.0).iter().map(|p| p * p.ln()).sum::<f64>();
        assert!((entropy(&logits, 0.0) as f64 - exact).abs() < 1e-6);
        let exact_hot: f64 = -softmax(&logits, 3.0).iter().map(|p| p * p.ln()).sum::<f64>();
        assert!((entropy(&logits, 3.0) as f64 - exact_hot).abs() < 1e-6);
        assert_eq!(entropy(&[], 1.0), 0.0);
    }

    #[test]
    fn overlap_counts_common_ids_among_the_first_n() {
        assert_eq!(overlap(&[1, 2, 3, 4, 5], &[5, 4, 9, 8, 7], 5), 0.4);
        assert_eq!(overlap(&[1, 2, 3], &[3, 2, 1], 3), 1.0);
        // The sixth id of each list is beyond N.
        assert_eq!(overlap(&[1, 2, 3, 4, 5, 6], &[7, 8, 9, 10, 11, 6], 5), 0.0);
        assert_eq!(overlap(&[1], &[1], 0), 0.0);
    }

    #[test]
    fn sampling_walks_the_cumulative_distribution() {
        let d = SparseDist { ids: vec![7, 3, 9], probs: vec![0.5, 0.3, 0.2] };
        assert_eq!(d.sample(0.0), 7);
        assert_eq!(d.sample(0.49), 7);
        assert_eq!(d.sample(0.5), 3);
        assert_eq!(d.sample(0.81), 9);
        assert_eq!(d.sample(0.999_999_999), 9);
        let with_zero = SparseDist { ids: vec![1, 2], probs: vec![0.0, 1.0] };
        assert_eq!(with_zero.sample(0.0), 2);
        assert_eq!(d.prob(3), 0.3);
        assert_eq!(d.prob(4), 0.0);
        assert_eq!(argmax(&[0.0, 2.0, 2.0]), 1);
    }
}
