//! The target side: the per-position summary a verifier computes from its logits
//! (DESIGN §3.1 step 2). Every random choice the coordinator may need is drawn here, with the
//! position-keyed uniforms of §2.4, so the verifier never decides anything: the coordinator
//! picks among these samples in `verify_block`.
//!
//! The target distribution p (request temperature, top-k, top-p) stays dense when no top-k /
//! top-p applies: sampling then walks the best candidates first and reaches the rest of the
//! vocabulary (in id order, by chunked vectorised sums) only when the uniform lands there.

use crate::dist::{SparseDist, sparse_from};
use crate::fastmath::{LANES, exp_neg, exp_sum_range, exp_sums, exp_sums_two, inv_temperature, scaled};
use crate::params::{ParamError, Penalty, SamplingParams};
use crate::rng::{Purpose, uniform};
use crate::select::top_ids;

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
    Dense {
        logits: &'a [f32],
        max: f32,
        inv_t: f32,
        z: f64,
        head: &'a [u32],
    },
    Sparse(SparseDist),
}

impl TargetDist<'_> {
    fn prob(&self, id: u32) -> f64 {
        match self {
            TargetDist::Dense { logits, max, inv_t, z, .. } => {
                logits.get(id as usize).map_or(0.0, |&l| exp_neg(scaled(l, *max, *inv_t)) as f64 / z)
            }
            TargetDist::Sparse(d) => d.prob(id) as f64,
        }
    }

    /// Inverse-CDF sample of p with the probabilities of a few ids replaced by `overrides`
    /// (each no larger than p(id)); None when no mass is left. Zero-weight ids are never drawn.
    fn sample_with(&self, overrides: &[(u32, f64)], u: f64) -> Option<u32> {
        let weight = |id: u32, p: f64| overrides.iter().find(|o| o.0 == id).map_or(p, |o| o.1);
        match self {
            TargetDist::Sparse(d) => {
                let w: Vec<f64> = d.ids.iter().zip(&d.probs).map(|(&id, &p)| weight(id, p as f64).max(0.0)).collect();
                walk(d.ids.iter().copied().zip(w.iter().copied()), w.iter().sum(), u).0
            }
            TargetDist::Dense { logits, max, inv_t, z, head } => {
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
                tail_walk(logits, *max, *inv_t, &ids, remaining).or(last)
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

/// Continues an inverse-CDF walk over every id not in `excluded` (sorted), in id order, with
/// weights e^((l - max)·inv_t), until `remaining` is used up. Blocks are summed vectorised
/// and only the block where the walk ends is scanned element by element.
fn tail_walk(logits: &[f32], max: f32, inv_t: f32, excluded: &[u32], mut remaining: f64) -> Option<u32> {
    const STEP: usize = 16 * LANES;
    let mut last_block = None;
    let mut start = 0usize;
    for end in excluded.iter().map(|&e| e as usize).chain([logits.len()]) {
        let mut b = start;
        while b < end {
            let e = (b + STEP).min(end);
            let s = exp_sum_range(&logits[b..e], max, inv_t);
            if s > 0.0 {
                last_block = Some((b, e));
            }
            if s > remaining {
                for (i, &l) in logits[b..e].iter().enumerate() {
                    let w = exp_neg(scaled(l, max, inv_t)) as f64;
                    if w > 0.0 {
                        if w > remaining {
                            return Some((b + i) as u32);
                        }
                        remaining -= w;
                    }
                }
            } else {
                remaining -= s;
            }
            b = e;
        }
        start = end + 1;
    }
    // Rounding left a sliver: take the last positive-weight tail id.
    let (b, e) = last_block?;
    (b..e).rev().find(|&i| exp_neg(scaled(logits[i], max, inv_t)) > 0.0).map(|i| i as u32)
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
    let cands = top_ids(logits, requested);
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
    let max = logits[best as usize];
    let t = if greedy { 1.0 } else { params.temperature };
    let inv_t = inv_temperature(t);
    let (sums_t, sums_1) = if t == 1.0 {
        let s = exp_sums(logits, max, inv_t);
        (s, s)
    } else {
        exp_sums_two(logits, max, inv_t)
    };
    let ln_z1 = sums_1.z.ln();
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
        let p = if params.top_k == 0 && params.top_p >= 1.0 {
            TargetDist::Dense { logits, max, inv_t, z: sums_t.z, head: &cands }
        } else {
            let mut c = cands.clone();
            TargetDist::Sparse(sparse_from(logits, params, 0, max, inv_t, sums_t.z, &mut c, requested))
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
