//! The draft side: what the draft service computes and sends for one proposed token
//! (DESIGN §2.1 proposal truncation, §3.1 step 1).

use crate::dist::{SparseDist, initial_candidates, sparse_from};
use crate::fastmath::inv_temperature;
use crate::params::SamplingParams;
use crate::rng::{Purpose, uniform};
use crate::scan::scan;

/// Default K_q: how many (id, probability) pairs of q the draft sends per position.
pub const DEFAULT_K_Q: usize = 64;

/// What the draft sends for one proposed token (DESIGN §2.1 truncation, §3.1).
#[derive(Clone, Debug, PartialEq)]
pub struct DraftToken {
    pub token: u32,
    /// q: the request-transformed draft distribution truncated to its top K_q, renormalised.
    /// `token` is always in its support.
    pub proposal: SparseDist,
    /// H(q̂): entropy of the draft's full softmax at the request temperature (1 for greedy).
    pub entropy: f32,
    /// TopN(q̂), descending.
    pub top_n: Vec<u32>,
}

/// Proposes one token from the draft's logits at absolute position `position`:
/// q = transformed(logits, params, k_q); token = sample from q with
/// uniform(seed, position, DraftSample); greedy: argmax (q is then a point mass).
/// `k_q` = 0 means no truncation.
pub fn propose(
    logits: &[f32],
    params: &SamplingParams,
    k_q: usize,
    top_n: usize,
    seed: u64,
    position: u64,
) -> DraftToken {
    let greedy = params.is_greedy();
    let requested = if greedy { 1 } else { initial_candidates(params, k_q, logits.len()) }.max(top_n).max(1);
    let inv_t = inv_temperature(if greedy { 1.0 } else { params.temperature });
    let sc = scan(logits, requested, inv_t, false, false);
    let mut cands = sc.top_ids();
    let Some(&best) = cands.first() else {
        // No finite logit: nothing sensible to propose (validate_logits rejects this input).
        return DraftToken { token: 0, proposal: SparseDist::default(), entropy: 0.0, top_n: Vec::new() };
    };
    let (max, sums) = (sc.max, sc.at_t);
    let top = cands[..cands.len().min(top_n)].to_vec();
    let proposal = if greedy {
        SparseDist::point(best)
    } else {
        sparse_from(logits, params, k_q, max, inv_t, sums.z, &mut cands, requested)
    };
    let token = proposal.sample(uniform(seed, position, Purpose::DraftSample));
    DraftToken { token, proposal, entropy: sums.entropy(), top_n: top }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::{entropy, top_n, transformed};

    fn logits() -> Vec<f32> {
        (0..300u32).map(|i| ((i * 37) % 101) as f32 / 20.0).collect()
    }

    #[test]
    fn a_proposal_is_the_truncated_transform_with_a_token_from_it() {
        let l = logits();
        let p = SamplingParams { temperature: 0.8, top_k: 0, top_p: 0.95 };
        let d = propose(&l, &p, 16, 5, 3, 10);
        assert_eq!(d.proposal, transformed(&l, &p, 16));
        assert_eq!(d.proposal.len(), 16);
        assert!(d.proposal.prob(d.token) > 0.0);
        assert_eq!(d.top_n, top_n(&l, 5));
        assert!((d.entropy - entropy(&l, 0.8)).abs() < 1e-6);
        assert_eq!(d, propose(&l, &p, 16, 5, 3, 10));
    }

    #[test]
    fn a_greedy_proposal_is_the_argmax_with_entropy_at_temperature_one() {
        let l = logits();
        let d = propose(&l, &SamplingParams::greedy(), 64, 3, 1, 0);
        assert_eq!(d.proposal, SparseDist::point(d.token));
        assert_eq!(d.token, crate::dist::argmax(&l));
        assert!((d.entropy - entropy(&l, 1.0)).abs() < 1e-6);
        assert_eq!(d.top_n.len(), 3);
    }

    #[test]
    fn different_seeds_and_positions_vary_the_sampled_token() {
        let l = vec![0.0f32; 50];
        let p = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0 };
        let tokens: std::collections::HashSet<u32> = (0..40).map(|s| propose(&l, &p, 0, 1, s, s * 3).token).collect();
        assert!(tokens.len() > 15, "only {} distinct tokens", tokens.len());
    }
}
