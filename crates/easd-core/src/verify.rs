//! The decision: the coordinator runs this on the draft's and the verifier's summaries.

use crate::dist::overlap;
use crate::draft::DraftToken;
use crate::params::{EasdParams, Mode, Order};
use crate::rng::{Purpose, uniform};
use crate::target::TargetPosition;

/// Why a block stopped before its bonus token.
#[derive(Clone, Debug, PartialEq)]
pub enum Rejection {
    /// The SD test rejected draft[index].
    Sd { index: usize },
    /// The EASD rule rejected draft[index], with the values that triggered it.
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
    let (h_q, h_p) = (draft.entropy, target.entropy);
    if !(h_q >= params.tau_draft && h_p >= params.tau_target) {
        return None;
    }
    let o = overlap(&draft.top_n, &target.top_n, params.top_n);
    (o >= params.rho).then_some((h_q, h_p, o))
}

/// Verifies one block: DESIGN §2.1 (lossless speculative sampling) plus §2.2 (EASD).
///
/// `draft[j]` sits at absolute position `first_position + j`; `target[j]` is the verifier's
/// summary there and `target[k]` (k = draft.len()) is the position after the block.
///
/// For j = 0..k, with x = draft[j].token:
/// 1. (EASD, order `gate`) if the EASD rule fires, emit target[j].easd_token and stop.
/// 2. SD test — greedy: accept iff x = argmax p_j. Sampling: accept iff
///    u · q_j(x) < p_j(x) (u < p/q without a division), u = uniform(seed, position,
///    AcceptTest), q_j(x) = draft[j].proposal.prob(x), p_j(x) = target[j].draft_token_prob;
///    i.e. with probability min(1, p/q). On rejection emit
///    target[j].residual_token (a sample of norm(max(0, p_j − q_j)); greedy: argmax p_j), stop.
/// 3. (EASD, order `after_sd`) if the EASD rule fires on the accepted x, emit
///    target[j].easd_token (p_j with x masked or scaled; greedy: the target's best other token)
///    and stop: the rest of the block is discarded.
/// 4. Otherwise keep x.
///
/// If all k are kept, emit the bonus target[k].sample_token. Modes `target` and `draft` do
/// not speculate: `target` emits target[0].sample_token as a bonus; `draft` keeps every
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
