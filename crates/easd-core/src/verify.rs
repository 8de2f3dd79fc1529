//! The decision: the coordinator runs this on the draft's and the verifier's summaries.

use crate::dist::overlap;
use crate::draft::DraftToken;
use crate::params::{EasdParams, Mode, Order};
use crate::rng::{Purpose, uniform};
use crate::target::TargetPosition;

/// Why a block stopped before its bonus token.
#[derive(Clone, Debug, PartialEq)]
pub enum Rejection {
    /// The SD test rejected `draft[index]`.
    Sd { index: usize },
    /// The EASD rule rejected `draft[index]`, with the values that triggered it.
    Easd { index: usize, draft_entropy: f32, target_entropy: f32, overlap: f32 },
}

/// What one block produced, with what the metrics need.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockOutcome {
    /// Emitted tokens, in order: the accepted draft tokens, then one target token (the
    /// residual / EASD resample at a rejection, or the bonus).
    pub tokens: Vec<u32>,
    /// Draft tokens kept.
    pub accepted: usize,
    pub rejection: Option<Rejection>,
    /// Whether the last token is the bonus sample of the position after the block.
    pub bonus: bool,
}

impl BlockOutcome {
    pub fn easd_triggered(&self) -> bool {
        matches!(self.rejection, Some(Rejection::Easd { .. }))
    }

    /// Draft tokens thrown away: the rejected one and everything after it.
    pub fn discarded(&self, drafted: usize) -> usize {
        drafted.saturating_sub(self.accepted)
    }
}

/// Returns Some((h_draft, h_target, overlap)) when the EASD rule fires at this position
/// (DESIGN §2.2): H(q̂) ≥ τ_draft, H(p̂) ≥ τ_target and |TopN(q̂) ∩ TopN(p̂)| / N ≥ ρ.
/// NaN entropies never fire.
pub fn easd_fires(params: &EasdParams, draft: &DraftToken, target: &TargetPosition) -> Option<(f32, f32, f32)> {
    easd_rule(params, draft.entropy, target.entropy, &draft.top_n, &target.top_n)
}

/// The EASD rule on plain values — the draft's entropy H(q̂) and top ids, the target's H(p̂) and top ids
/// — for callers without wire summaries (offline calibration). [`easd_fires`] is this on a block
/// position; the top-id lists are cut to N by [`overlap`].
pub fn easd_rule(
    params: &EasdParams,
    h_q: f32,
    h_p: f32,
    draft_top_n: &[u32],
    target_top_n: &[u32],
) -> Option<(f32, f32, f32)> {
    if !(h_q >= params.tau_draft && h_p >= params.tau_target) {
        return None;
    }
    let o = overlap(draft_top_n, target_top_n, params.top_n);
    (o >= params.rho).then_some((h_q, h_p, o))
}

/// Verifies one block: DESIGN §2.1 (lossless speculative sampling) plus §2.2 (EASD).
///
/// `draft[j]` sits at absolute position `first_position + j`; `target[j]` is the verifier's
/// summary there and `target[k]` (k = draft.len()) is the position after the block.
///
/// For j = 0..k, with x = `draft[j].token`:
/// 1. (EASD, order `gate`) if the EASD rule fires, emit `target[j].easd_token` and stop.
/// 2. SD test — greedy: accept iff x = argmax p_j. Sampling: accept iff
///    u · q_j(x) < p_j(x) (u < p/q without a division), u = uniform(seed, position,
///    AcceptTest), q_j(x) = `draft[j].proposal.prob(x)`, p_j(x) = `target[j].draft_token_prob`;
///    i.e. with probability min(1, p/q). On rejection emit
///    `target[j].residual_token` (a sample of norm(max(0, p_j − q_j)); greedy: argmax p_j), stop.
/// 3. (EASD, order `after_sd`) if the EASD rule fires on the accepted x, emit
///    `target[j].easd_token` (p_j with x masked or scaled; greedy: the target's best other token)
///    and stop: the rest of the block is discarded.
/// 4. Otherwise keep x.
///
/// If all k are kept, emit the bonus `target[k].sample_token`. Modes `target` and `draft` do
/// not speculate: `target` emits `target[0].sample_token` as a bonus; `draft` keeps every
/// draft token (or, with an empty draft, behaves as `target`).
///
/// Precondition target.len() == draft.len() + 1 (checked by [`check_block`]); with fewer
/// target positions only the drafts that have a following position are verified, and an
/// empty `target` yields an empty outcome, so bad input never panics.
pub fn verify_block(
    mode: &Mode,
    greedy: bool,
    seed: u64,
    first_position: u64,
    draft: &[DraftToken],
    target: &[TargetPosition],
) -> BlockOutcome {
    let Some(k) = target.len().checked_sub(1) else {
        return BlockOutcome { tokens: Vec::new(), accepted: 0, rejection: None, bonus: false };
    };
    let draft = &draft[..draft.len().min(k)];
    let easd = match mode {
        Mode::Sd => None,
        Mode::Easd(p) => Some(p),
        Mode::Target => return bonus_only(&target[0]),
        Mode::Draft if draft.is_empty() => return bonus_only(&target[0]),
        Mode::Draft => {
            let tokens: Vec<u32> = draft.iter().map(|d| d.token).collect();
            return BlockOutcome { accepted: tokens.len(), tokens, rejection: None, bonus: false };
        }
    };
    let mut tokens = Vec::with_capacity(draft.len() + 1);
    for (j, (d, t)) in draft.iter().zip(target).enumerate() {
        let x = d.token;
        let fires = easd.and_then(|p| easd_fires(p, d, t).map(|v| (p.order, v)));
        let easd_stop = |tokens: &mut Vec<u32>, (h_q, h_p, o): (f32, f32, f32)| {
            tokens.push(t.easd_token.unwrap_or(t.sample_token));
            let rejection = Rejection::Easd { index: j, draft_entropy: h_q, target_entropy: h_p, overlap: o };
            BlockOutcome { tokens: std::mem::take(tokens), accepted: j, rejection: Some(rejection), bonus: false }
        };
        if let Some((Order::Gate, v)) = fires {
            return easd_stop(&mut tokens, v);
        }
        let accept = if greedy {
            x == t.argmax
        } else {
            let u = uniform(seed, first_position + j as u64, Purpose::AcceptTest);
            u * (d.proposal.prob(x) as f64) < t.draft_token_prob as f64
        };
        if !accept {
            tokens.push(t.residual_token.unwrap_or(t.sample_token));
            return BlockOutcome { tokens, accepted: j, rejection: Some(Rejection::Sd { index: j }), bonus: false };
        }
        if let Some((Order::AfterSd, v)) = fires {
            return easd_stop(&mut tokens, v);
        }
        tokens.push(x);
    }
    let accepted = tokens.len();
    tokens.push(target[accepted].sample_token);
    BlockOutcome { tokens, accepted, rejection: None, bonus: true }
}

fn bonus_only(t: &TargetPosition) -> BlockOutcome {
    BlockOutcome { tokens: vec![t.sample_token], accepted: 0, rejection: None, bonus: true }
}

/// Checks the block shape verify_block expects: 1..=MAX_BLOCK_SIZE drafts (0 allowed in
/// target mode) and exactly one more target position than drafts.
pub fn check_block(draft: &[DraftToken], target: &[TargetPosition]) -> Result<(), crate::ParamError> {
    if !draft.is_empty() {
        crate::validate_block_size(draft.len())?;
    }
    if target.len() != draft.len() + 1 {
        return Err(crate::ParamError {
            field: "target",
            reason: format!(
                "expected {} target positions for {} drafted tokens, got {}",
                draft.len() + 1,
                draft.len(),
                target.len()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::SparseDist;
    use crate::params::Penalty;
    use crate::target::{TargetOptions, score_position};
    use crate::{SamplingParams, propose};

    const X: u32 = 10;

    fn draft(token: u32, entropy: f32, top_n: &[u32]) -> DraftToken {
        DraftToken { token, proposal: SparseDist::point(token), entropy, top_n: top_n.to_vec() }
    }

    fn target(p_x: f32, entropy: f32, top_n: &[u32]) -> TargetPosition {
        TargetPosition {
            draft_token_prob: p_x,
            argmax: top_n[0],
            entropy,
            top_n: top_n.to_vec(),
            residual_token: Some(20),
            easd_token: Some(30),
            sample_token: 40,
            top_logprobs: Vec::new(),
            candidate_logprobs: Vec::new(),
        }
    }

    fn easd(order: Order) -> Mode {
        Mode::Easd(EasdParams { order, ..EasdParams::default() })
    }

    /// Defaults: τ_draft 0.81, τ_target 0.68, N 5, ρ 0.6.
    #[test]
    fn the_rule_fires_exactly_when_both_entropies_and_the_overlap_reach_their_thresholds() {
        let p = EasdParams::default();
        let five = [10, 11, 12, 13, 14];
        let three_common = [10, 11, 12, 90, 91]; // overlap 0.6
        let two_common = [10, 11, 90, 91, 92]; // overlap 0.4
        let cases: [(f32, f32, &[u32], bool); 9] = [
            (0.81, 0.68, &three_common, true),
            (2.0, 2.0, &five, true),
            (0.80, 0.68, &three_common, false),
            (0.81, 0.67, &three_common, false),
            (0.81, 0.68, &two_common, false),
            (0.0, 5.0, &five, false),
            (5.0, 0.0, &five, false),
            (f32::NAN, 5.0, &five, false),
            (5.0, 5.0, &[90, 91, 92, 93, 94], false),
        ];
        for (h_q, h_p, target_top, fires) in cases {
            let got = easd_fires(&p, &draft(X, h_q, &five), &target(1.0, h_p, target_top));
            assert_eq!(got.is_some(), fires, "h_q {h_q} h_p {h_p} top {target_top:?}");
            // The same rule on plain values (offline calibration calls it so).
            assert_eq!(got.is_some(), easd_rule(&p, h_q, h_p, &five, target_top).is_some());
            if let Some((a, b, o)) = got {
                assert_eq!((a, b), (h_q, h_p));
                assert!(o >= 0.6);
            }
        }
        // ρ = 0 ignores the overlap; ρ = 1 needs identical sets.
        let loose = EasdParams { rho: 0.0, ..p.clone() };
        assert!(easd_fires(&loose, &draft(X, 1.0, &five), &target(1.0, 1.0, &[90, 91, 92, 93, 94])).is_some());
        let strict = EasdParams { rho: 1.0, ..p };
        assert!(easd_fires(&strict, &draft(X, 1.0, &five), &target(1.0, 1.0, &[14, 13, 12, 11, 10])).is_some());
        assert!(easd_fires(&strict, &draft(X, 1.0, &five), &target(1.0, 1.0, &three_common)).is_none());
        // Ids beyond the first N do not count, however long the lists: one shared id in the top 5 is 0.2.
        let long_draft = [10, 90, 91, 92, 93, 11, 12, 13];
        let long_target = [10, 80, 81, 82, 83, 11, 12, 13];
        assert_eq!(easd_rule(&loose, 1.0, 1.0, &long_draft, &long_target), Some((1.0, 1.0, 0.2)));
        assert_eq!(easd_rule(&p, 1.0, 1.0, &long_draft, &long_target), None);
    }

    #[test]
    fn a_trigger_emits_the_easd_token_and_discards_the_rest_of_the_block() {
        let top = [10, 11, 12, 13, 14];
        let drafts = [draft(1, 0.0, &top), draft(X, 2.0, &top), draft(3, 2.0, &top), draft(4, 2.0, &top)];
        let targets: Vec<_> = (0..5).map(|j| target(1.0, if j == 0 { 0.0 } else { 2.0 }, &top)).collect();
        for order in [Order::AfterSd, Order::Gate] {
            let out = verify_block(&easd(order), false, 1, 100, &drafts, &targets);
            assert_eq!(out.tokens, vec![1, 30]);
            assert_eq!(out.accepted, 1);
            assert_eq!(
                out.rejection,
                Some(Rejection::Easd { index: 1, draft_entropy: 2.0, target_entropy: 2.0, overlap: 1.0 })
            );
            assert!(out.easd_triggered() && !out.bonus);
            assert_eq!(out.discarded(drafts.len()), 3);
        }
        // The same block in mode sd: everything accepted (p = q = 1), plus the bonus.
        let out = verify_block(&Mode::Sd, false, 1, 100, &drafts, &targets);
        assert_eq!(out.tokens, vec![1, X, 3, 4, 40]);
        assert_eq!((out.accepted, out.rejection.clone(), out.bonus), (4, None, true));
        assert_eq!(out.discarded(4), 0);
    }

    #[test]
    fn gate_rejects_through_easd_where_after_sd_reports_the_sd_rejection() {
        let top = [X, 11, 12, 13, 14];
        // p(x) = 0: the SD test must reject, and the EASD rule would fire too.
        let drafts = [draft(X, 2.0, &top)];
        let targets = [target(0.0, 2.0, &top), target(1.0, 2.0, &top)];
        let after = verify_block(&easd(Order::AfterSd), false, 1, 0, &drafts, &targets);
        assert_eq!(after.tokens, vec![20]);
        assert_eq!(after.rejection, Some(Rejection::Sd { index: 0 }));
        let gate = verify_block(&easd(Order::Gate), false, 1, 0, &drafts, &targets);
        assert_eq!(gate.tokens, vec![30]);
        assert!(gate.easd_triggered());
        // Greedy: a mismatch with the argmax is an SD rejection emitting the argmax.
        let mismatch = [target(0.0, 0.0, &[7, 8, 9, 10, 11]), target(1.0, 0.0, &top)];
        let mut greedy_target = mismatch.clone();
        greedy_target[0].residual_token = Some(7);
        let out = verify_block(&easd(Order::AfterSd), true, 1, 0, &drafts, &greedy_target);
        assert_eq!((out.tokens, out.rejection), (vec![7], Some(Rejection::Sd { index: 0 })));
    }

    #[test]
    fn greedy_easd_picks_the_targets_second_best() {
        let logits = [0.5f32, 3.0, 2.9, 2.8, 2.7, 2.6, 0.0, -1.0];
        let opts = TargetOptions { top_n: 5, penalty: Penalty::Mask, logprobs: 0 };
        let greedy = SamplingParams::greedy();
        let d = propose(&logits, &greedy, 64, 5, 3, 0);
        assert_eq!(d.token, 1);
        let t0 = score_position(&logits, &greedy, &opts, Some((d.token, &d.proposal)), 3, 0);
        let t1 = score_position(&logits, &greedy, &opts, None, 3, 1);
        assert_eq!(t0.easd_token, Some(2));
        let params = EasdParams { tau_draft: 1.0, tau_target: 1.0, ..EasdParams::default() };
        assert!(t0.entropy > 1.0 && d.entropy > 1.0);
        let out = verify_block(&Mode::Easd(params), true, 3, 0, &[d], &[t0, t1]);
        assert_eq!(out.tokens, vec![2]);
        assert!(out.easd_triggered());
    }

    #[test]
    fn the_mask_penalty_never_emits_the_drafted_token() {
        let logits = [2.0f32, 1.9, 1.0, -3.0, f32::NEG_INFINITY];
        let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0 };
        let opts = TargetOptions::default();
        let q = SparseDist::point(0);
        let mut seen = [0usize; 5];
        for seed in 0..2000 {
            let t = score_position(&logits, &params, &opts, Some((0, &q)), seed, 5);
            seen[t.easd_token.unwrap() as usize] += 1;
        }
        assert_eq!((seen[0], seen[4]), (0, 0));
        assert!(seen[1] > seen[2] && seen[2] > seen[3] && seen[3] > 0, "{seen:?}");
        // Scale(0.5) keeps x_j with half its mass: p(0) = 0.5·0.44 / (1 - 0.5·0.44) ~ 0.29.
        let opts = TargetOptions { penalty: Penalty::Scale(0.5), ..TargetOptions::default() };
        let kept = (0..2000)
            .filter(|&seed| score_position(&logits, &params, &opts, Some((0, &q)), seed, 5).easd_token == Some(0))
            .count();
        assert!((480..680).contains(&kept), "{kept}");
    }

    #[test]
    fn target_and_draft_modes_do_not_speculate() {
        let top = [10, 11, 12, 13, 14];
        let drafts = [draft(1, 0.0, &top), draft(2, 0.0, &top)];
        let targets: Vec<_> = (0..3).map(|_| target(0.0, 0.0, &top)).collect();
        let t = verify_block(&Mode::Target, false, 1, 0, &[], &targets[..1]);
        assert_eq!((t.tokens, t.bonus), (vec![40], true));
        let d = verify_block(&Mode::Draft, false, 1, 0, &drafts, &targets);
        assert_eq!((d.tokens, d.accepted, d.bonus), (vec![1, 2], 2, false));
    }

    #[test]
    fn malformed_blocks_are_reported_and_never_panic() {
        let top = [10, 11, 12, 13, 14];
        let drafts = [draft(1, 0.0, &top), draft(2, 0.0, &top)];
        let targets = [target(1.0, 0.0, &top), target(1.0, 0.0, &top)];
        assert_eq!(
            check_block(&drafts, &targets).unwrap_err().to_string(),
            "invalid target: expected 3 target positions for 2 drafted tokens, got 2"
        );
        assert!(check_block(&drafts[..1], &targets).is_ok());
        // One draft verified against the one position that has a successor.
        let out = verify_block(&Mode::Sd, false, 1, 0, &drafts, &targets);
        assert_eq!(out.tokens, vec![1, 40]);
        let empty = verify_block(&Mode::Sd, false, 1, 0, &drafts, &[]);
        assert!(empty.tokens.is_empty());
    }
}
