//! The target side: the per-position summary a verifier computes from its logits
//! (DESIGN §3.1 step 2). Every random choice the coordinator may need is drawn here, with the
//! position-keyed uniforms of §2.4, so the verifier never decides anything: the coordinator
//! picks among these samples in `verify_block`.
//!
//! The target distribution p (request temperature, top-k, top-p) stays dense when no top-k /
//! top-p applies: sampling then walks the best candidates first and reaches the rest of the
//! vocabulary (in id order, by chunked vectorised sums) only when the uniform lands there.

use crate::dist::{SparseDist, sparse_from};
use crate::fastmath::{inv_temperature, tail_walk, weight};
use crate::params::{ParamError, Penalty, SamplingParams};
use crate::rng::{Purpose, uniform};
use crate::scan::scan;
use crate::select::better;

/// Most log-probabilities a request may ask for per position.
pub const MAX_LOGPROBS: usize = 20;
/// Candidates selected for a dense target: samples land among them almost always.
const DENSE_HEAD: usize = 64;

#[derive(Clone, Debug, PartialEq)]
pub struct TargetOptions {
    /// N of TopN(p̂).
    pub top_n: usize,
    /// How the EASD resample treats x_j.
    pub penalty: Penalty,
    /// How many top log-probabilities to report (0..=MAX_LOGPROBS).
    pub logprobs: usize,
}

impl Default for TargetOptions {
    fn default() -> Self {
        Self { top_n: 5, penalty: Penalty::Mask, logprobs: 0 }
    }
}

impl TargetOptions {
    pub fn validate(&self) -> Result<(), ParamError> {
        if self.logprobs > MAX_LOGPROBS {
            return Err(ParamError {
                field: "logprobs",
                reason: format!("must be in 0..={MAX_LOGPROBS}, got {}", self.logprobs),
            });
        }
        if let Penalty::Scale(alpha) = self.penalty
            && !(0.0..1.0).contains(&alpha)
        {
            return Err(ParamError { field: "penalty", reason: format!("scale alpha must be in [0, 1), got {alpha}") });
        }
        Ok(())
    }
}

/// Per-position summary computed by the verifier at one position; small enough to send.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetPosition {
    /// p_j(x_j) under the request-transformed target distribution; 0 when nothing drafted.
    pub draft_token_prob: f32,
    pub argmax: u32,
    /// H(p̂): full softmax at the request temperature (1 for greedy).
    pub entropy: f32,
    /// TopN(p̂), descending.
    pub top_n: Vec<u32>,
    /// Sample from norm(max(0, p - q)) with the sparse q (uniform ResidualSample); greedy:
    /// argmax p. Falls back to a sample of p if the residual has no mass. None if nothing drafted.
    pub residual_token: Option<u32>,
    /// Sample from p with x_j removed (Mask) or p(x_j)·alpha (Scale), renormalised (uniform
    /// EasdResample); greedy: best token of p̂ other than x_j (Scale: argmax of p̂ with
    /// p̂(x_j)·alpha). None if nothing drafted.
    pub easd_token: Option<u32>,
    /// Sample from p (uniform BonusSample); greedy: argmax. The bonus / target-mode token.
    pub sample_token: u32,
    /// The `logprobs` most likely tokens with their raw log-softmax (temperature 1), descending.
    pub top_logprobs: Vec<(u32, f32)>,
    /// Raw log-softmax of every token this position may emit (x_j, residual, easd, sample).
    pub candidate_logprobs: Vec<(u32, f32)>,
}

impl TargetPosition {
    pub fn logprob_of(&self, token: u32) -> Option<f32> {
        self.candidate_logprobs.iter().chain(&self.top_logprobs).find(|(id, _)| *id == token).map(|&(_, lp)| lp)
    }
}

/// The request-transformed target distribution at one position.
enum TargetDist<'a> {
    /// Full softmax at 1/inv_t; `head` = the best ids, descending.
    Dense { logits: &'a [f32], max: f32, inv_t: f32, z: f64, head: &'a [u32], blocks: &'a [f64] },
    /// Top-k / top-p support, sorted by (logit desc, id asc), so `prob` is a binary search.
    Sparse { d: SparseDist, logits: &'a [f32] },
}

impl TargetDist<'_> {
    fn prob(&self, id: u32) -> f64 {
        match self {
            TargetDist::Dense { logits, max, inv_t, z, .. } => {
                logits.get(id as usize).map_or(0.0, |&l| weight(l, *max, *inv_t) as f64 / z)
            }
            TargetDist::Sparse { d, logits } => {
                let Some(&l) = logits.get(id as usize) else { return 0.0 };
                d.ids
                    .binary_search_by(|&probe| better(&(logits[probe as usize], probe), &(l, id)))
                    .map_or(0.0, |k| d.probs[k] as f64)
            }
        }
    }

    /// Inverse-CDF sample of p with the probabilities of a few ids replaced by `overrides`
    /// (each no larger than p(id)); None when no mass is left. Zero-weight ids are never drawn.
    fn sample_with(&self, overrides: &[(u32, f64)], u: f64) -> Option<u32> {
        let mut sorted = overrides.to_vec();
        sorted.sort_unstable_by_key(|o| o.0);
        let weight = |id: u32, p: f64| sorted.binary_search_by_key(&id, |o| o.0).map_or(p, |k| sorted[k].1);
        match self {
            TargetDist::Sparse { d, .. } => {
                let w: Vec<f64> = d.ids.iter().zip(&d.probs).map(|(&id, &p)| weight(id, p as f64).max(0.0)).collect();
                walk(d.ids.iter().copied().zip(w.iter().copied()), w.iter().sum(), u).0
            }
            TargetDist::Dense { logits, max, inv_t, z, head, blocks } => {
                let mut ids: Vec<u32> = head.to_vec();
                ids.extend(
                    overrides.iter().map(|o| o.0).filter(|id| (*id as usize) < logits.len() && !head.contains(id)),
                );
                let (mut head_p, mut head_w) = (0.0, Vec::with_capacity(ids.len()));
                for &id in &ids {
                    let p = self.prob(id);
                    head_p += p;
                    head_w.push(weight(id, p).max(0.0));
                }
                let tail = (1.0 - head_p).max(0.0);
                let total = head_w.iter().sum::<f64>() + tail;
                let (found, acc, last) = walk(ids.iter().copied().zip(head_w.iter().copied()), total, u);
                if found.is_some() {
                    return found;
                }
                ids.sort_unstable();
                let remaining = (u * total - acc) * z;
                tail_walk(logits, *max, *inv_t, blocks, &ids, remaining).or(last)
            }
        }
    }
}

/// Walks (id, weight) pairs until the cumulative weight exceeds u·total. Returns the id found,
/// the weight walked, and the last positive-weight id (for rounding fallbacks).
fn walk(pairs: impl Iterator<Item = (u32, f64)>, total: f64, u: f64) -> (Option<u32>, f64, Option<u32>) {
    if total.is_nan() || total <= 0.0 {
        return (None, 0.0, None);
    }
    let threshold = u * total;
    let (mut acc, mut last) = (0.0, None);
    for (id, w) in pairs {
        if w > 0.0 {
            acc += w;
            last = Some(id);
            if acc > threshold {
                return (Some(id), acc, last);
            }
        }
    }
    (None, acc, last)
}

/// The best id of `cands` (descending) other than `x`; else the lowest other id in the vocabulary.
fn best_other(cands: &[u32], x: u32, vocab: usize) -> u32 {
    cands.iter().copied().find(|&c| c != x).unwrap_or(if x == 0 && vocab > 1 { 1 } else { 0 })
}

/// Computes the verifier's summary at one position. `drafted`: the drafted token at this
/// position and the draft's sparse q; None at the bonus position (and in target mode).
pub fn score_position(
    logits: &[f32],
    params: &SamplingParams,
    opts: &TargetOptions,
    drafted: Option<(u32, &SparseDist)>,
    seed: u64,
    position: u64,
) -> TargetPosition {
    let greedy = params.is_greedy();
    let requested = if greedy { 2 } else { DENSE_HEAD.max(params.top_k) }.max(opts.top_n).max(opts.logprobs);
    let t = if greedy { 1.0 } else { params.temperature };
    let inv_t = inv_temperature(t);
    let dense = !greedy && params.top_k == 0 && params.top_p >= 1.0;
    let sc = scan(logits, requested, inv_t, t != 1.0, dense);
    let cands = sc.top_ids();
    let Some(&best) = cands.first() else {
        // No finite logit (rejected by validate_logits): an inert summary, never a panic.
        return TargetPosition {
            draft_token_prob: 0.0,
            argmax: 0,
            entropy: 0.0,
            top_n: Vec::new(),
            residual_token: drafted.map(|(x, _)| x),
            easd_token: drafted.map(|(x, _)| x),
            sample_token: 0,
            top_logprobs: Vec::new(),
            candidate_logprobs: Vec::new(),
        };
    };
    let (max, sums_t, blocks) = (sc.max, sc.at_t, sc.blocks);
    let ln_z1 = sc.z_one.ln();
    let logprob = |id: u32| ((logits[id as usize] - max) as f64 - ln_z1) as f32;
    let top_n = cands[..cands.len().min(opts.top_n)].to_vec();
    let top_logprobs: Vec<(u32, f32)> =
        cands[..cands.len().min(opts.logprobs)].iter().map(|&id| (id, logprob(id))).collect();

    let (draft_token_prob, residual_token, easd_token, sample_token);
    if greedy {
        sample_token = best;
        draft_token_prob = drafted.map_or(0.0, |(x, _)| if x == best { 1.0 } else { 0.0 });
        residual_token = drafted.map(|_| best);
        easd_token = drafted.map(|(x, _)| {
            let other = best_other(&cands, x, logits.len());
            match opts.penalty {
                Penalty::Scale(alpha) if (x as usize) < logits.len() => {
                    let (lx, lo) = (logits[x as usize] as f64 + (alpha as f64).ln(), logits[other as usize] as f64);
                    if lx > lo || (lx == lo && x < other) { x } else { other }
                }
                _ => other,
            }
        });
    } else {
        let p = if dense {
            TargetDist::Dense { logits, max, inv_t, z: sums_t.z, head: &cands, blocks: &blocks }
        } else {
            let mut c = cands.clone();
            TargetDist::Sparse { d: sparse_from(logits, params, 0, max, inv_t, sums_t.z, &mut c, requested), logits }
        };
        let u = |purpose| uniform(seed, position, purpose);
        sample_token = p.sample_with(&[], u(Purpose::BonusSample)).unwrap_or(best);
        draft_token_prob = drafted.map_or(0.0, |(x, _)| p.prob(x) as f32);
        residual_token = drafted.map(|(_, q)| {
            let overrides: Vec<(u32, f64)> =
                q.ids.iter().zip(&q.probs).map(|(&id, &qp)| (id, (p.prob(id) - qp as f64).max(0.0))).collect();
            let u = u(Purpose::ResidualSample);
            // Zero residual mass means p == q on q's support: rejection is then impossible
            // in exact arithmetic; if rounding rejects anyway, a sample of p is the right law.
            p.sample_with(&overrides, u).or_else(|| p.sample_with(&[], u)).unwrap_or(best)
        });
        easd_token = drafted.map(|(x, _)| {
            let kept = match opts.penalty {
                Penalty::Mask => 0.0,
                Penalty::Scale(alpha) => alpha as f64 * p.prob(x),
            };
            p.sample_with(&[(x, kept)], u(Purpose::EasdResample)).unwrap_or_else(|| best_other(&cands, x, logits.len()))
        });
    }

    let mut candidate_logprobs: Vec<(u32, f32)> = Vec::with_capacity(4);
    let emit = drafted.map(|(x, _)| x).into_iter().chain(residual_token).chain(easd_token).chain([sample_token]);
    for id in emit {
        if (id as usize) < logits.len() && !candidate_logprobs.iter().any(|c| c.0 == id) {
            candidate_logprobs.push((id, logprob(id)));
        }
    }
    TargetPosition {
        draft_token_prob,
        argmax: best,
        entropy: sums_t.entropy(),
        top_n,
        residual_token,
        easd_token,
        sample_token,
        top_logprobs,
        candidate_logprobs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::transformed;

    fn sampling(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p }
    }

    fn log_softmax(logits: &[f32]) -> Vec<f64> {
        let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = logits.iter().map(|&l| (l as f64 - m).exp()).sum();
        logits.iter().map(|&l| l as f64 - m - z.ln()).collect()
    }

    #[test]
    fn a_greedy_summary_is_built_from_the_argmax() {
        let logits = [1.0f32, 4.0, 3.0, 3.5, -2.0];
        let opts = TargetOptions { top_n: 3, penalty: Penalty::Mask, logprobs: 2 };
        let q = SparseDist::point(3);
        let t = score_position(&logits, &SamplingParams::greedy(), &opts, Some((3, &q)), 9, 4);
        assert_eq!((t.argmax, t.sample_token, t.residual_token, t.easd_token), (1, 1, Some(1), Some(1)));
        assert_eq!(t.draft_token_prob, 0.0);
        assert_eq!(t.top_n, vec![1, 3, 2]);
        let exact = log_softmax(&logits);
        assert_eq!(t.top_logprobs.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 3]);
        for &(id, lp) in t.top_logprobs.iter().chain(&t.candidate_logprobs) {
            assert!((lp as f64 - exact[id as usize]).abs() < 1e-5);
        }
        assert_eq!(t.candidate_logprobs.iter().map(|p| p.0).collect::<Vec<_>>(), vec![3, 1]);
        assert_eq!(t.logprob_of(3), Some(t.candidate_logprobs[0].1));
        assert_eq!(t.logprob_of(4), None);
        // Drafting the argmax: the EASD token is the second best; Scale(alpha) keeps x_j
        // only when alpha·p(x_j) still beats it.
        let on_best = score_position(&logits, &SamplingParams::greedy(), &opts, Some((1, &q)), 9, 4);
        assert_eq!((on_best.draft_token_prob, on_best.easd_token), (1.0, Some(3)));
        let scale = |alpha| TargetOptions { penalty: Penalty::Scale(alpha), ..opts.clone() };
        let keep = score_position(&logits, &SamplingParams::greedy(), &scale(0.9), Some((1, &q)), 9, 4);
        assert_eq!(keep.easd_token, Some(1));
        let drop = score_position(&logits, &SamplingParams::greedy(), &scale(0.5), Some((1, &q)), 9, 4);
        assert_eq!(drop.easd_token, Some(3));
    }

    #[test]
    fn the_draft_token_probability_is_taken_under_the_transformed_target() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.7 - (i / 10) as f32).collect();
        let q = SparseDist::point(6);
        for params in [sampling(1.0, 0, 1.0), sampling(0.6, 0, 1.0), sampling(0.8, 5, 1.0), sampling(1.3, 0, 0.5)] {
            let t = score_position(&logits, &params, &TargetOptions::default(), Some((6, &q)), 1, 1);
            let p = transformed(&logits, &params, 0);
            assert!((t.draft_token_prob - p.prob(6)).abs() < 1e-6, "{params:?}");
            assert!((t.entropy - crate::dist::entropy(&logits, params.temperature)).abs() < 1e-5);
            for tok in [t.sample_token, t.residual_token.unwrap(), t.easd_token.unwrap()] {
                assert!(p.prob(tok) > 0.0, "{params:?}: {tok} outside the support");
            }
        }
    }

    #[test]
    fn dense_sampling_reaches_the_tail_with_the_right_frequencies() {
        // 400 tokens, flat except 4 heavier ones: the 64-token head holds ~20% of the mass.
        let mut logits = vec![0.0f32; 400];
        for id in [5, 150, 151, 399] {
            logits[id] = 1.0;
        }
        let params = sampling(1.0, 0, 1.0);
        let z = 396.0 + 4.0 * std::f64::consts::E;
        let (n, mut heavy, mut tail_last) = (40_000u64, 0u64, 0u64);
        for seed in 0..n {
            let t = score_position(&logits, &params, &TargetOptions::default(), None, seed, 0);
            heavy += u64::from([5, 150, 151, 399].contains(&t.sample_token));
            tail_last += u64::from(t.sample_token == 398);
        }
        // Binomial 5-sigma bounds.
        let check = |count: u64, p: f64| {
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            assert!((count as f64 - n as f64 * p).abs() < 5.0 * sd, "{count} vs {}", n as f64 * p);
        };
        check(heavy, 4.0 * std::f64::consts::E / z);
        check(tail_last, 1.0 / z);
    }

    #[test]
    fn the_residual_never_draws_where_q_covers_p_and_falls_back_when_p_equals_q() {
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let params = sampling(1.0, 0, 1.0);
        let p = transformed(&logits, &params, 0);
        // q puts all its mass on 0 and 1 beyond p there: the residual lives on {2, 3}.
        let q = SparseDist { ids: vec![0, 1], probs: vec![0.7, 0.3] };
        for seed in 0..300 {
            let r = score_position(&logits, &params, &TargetOptions::default(), Some((0, &q)), seed, 2).residual_token;
            assert!(matches!(r, Some(2 | 3)), "{r:?}");
        }
        // q == p: no residual mass; the fallback is a sample of p, never a panic.
        let r = score_position(&logits, &params, &TargetOptions::default(), Some((0, &p)), 1, 2).residual_token;
        assert!(r.is_some_and(|id| id < 4));
    }

    #[test]
    fn options_are_validated() {
        assert!(TargetOptions::default().validate().is_ok());
        let bad = TargetOptions { logprobs: 21, ..TargetOptions::default() };
        assert_eq!(bad.validate().unwrap_err().to_string(), "invalid logprobs: must be in 0..=20, got 21");
    }
}
