//! Conversions between the generated protobuf types and the algorithm crate's types (the service edge).

use easd_core::{DraftToken, Penalty, SamplingParams, SparseDist, TargetPosition};
use easd_proto::v1 as pb;

use crate::error::ServerError;
use crate::limits::MAX_PROPOSAL_SUPPORT;

pub fn sampling_from_pb(s: Option<&pb::SamplingParams>) -> Result<(SamplingParams, u64), ServerError> {
    let s = s.ok_or_else(|| ServerError::invalid("sampling", "is required"))?;
    let params = SamplingParams { temperature: s.temperature, top_k: s.top_k as usize, top_p: s.top_p };
    params.validate()?;
    Ok((params, s.seed))
}

pub fn sampling_to_pb(params: &SamplingParams, seed: u64) -> pb::SamplingParams {
    pb::SamplingParams { temperature: params.temperature, top_k: params.top_k as u32, top_p: params.top_p, seed }
}

pub fn sparse_from_pb(d: Option<&pb::SparseDist>, field: &'static str) -> Result<SparseDist, ServerError> {
    let d = d.ok_or_else(|| ServerError::invalid(field, "is required"))?;
    if d.ids.len() != d.probs.len() || d.ids.is_empty() {
        return Err(ServerError::invalid(field, "ids and probs must be non-empty and of equal length"));
    }
    if d.ids.len() > MAX_PROPOSAL_SUPPORT {
        return Err(ServerError::invalid(
            field,
            format!("at most {MAX_PROPOSAL_SUPPORT} entries, got {}", d.ids.len()),
        ));
    }
    if d.probs.iter().any(|p| !p.is_finite() || *p < 0.0) {
        return Err(ServerError::invalid(field, "probabilities must be finite and non-negative"));
    }
    Ok(SparseDist { ids: d.ids.clone(), probs: d.probs.clone() })
}

pub fn sparse_to_pb(d: &SparseDist) -> pb::SparseDist {
    pb::SparseDist { ids: d.ids.clone(), probs: d.probs.clone() }
}

pub fn penalty_from_alpha(alpha: f32) -> Result<Penalty, ServerError> {
    if alpha < 0.0 {
        Ok(Penalty::Mask)
    } else if alpha < 1.0 {
        Ok(Penalty::Scale(alpha))
    } else {
        Err(ServerError::invalid("penalty_alpha", format!("must be < 0 (mask) or in [0, 1), got {alpha}")))
    }
}

pub fn penalty_to_alpha(p: Penalty) -> f32 {
    match p {
        Penalty::Mask => -1.0,
        Penalty::Scale(alpha) => alpha,
    }
}

pub fn draft_token_to_pb(t: &DraftToken, position: u64, forward_seconds: f32) -> pb::DraftToken {
    pb::DraftToken {
        token: t.token,
        position: position as u32,
        proposal: Some(sparse_to_pb(&t.proposal)),
        entropy: t.entropy,
        top_n: t.top_n.clone(),
        forward_seconds,
    }
}

pub fn draft_token_from_pb(t: pb::DraftToken) -> Result<DraftToken, ServerError> {
    Ok(DraftToken {
        token: t.token,
        proposal: sparse_from_pb(t.proposal.as_ref(), "proposal")?,
        entropy: t.entropy,
        top_n: t.top_n,
    })
}

fn logprobs_to_pb(v: &[(u32, f32)]) -> Vec<pb::TokenLogprob> {
    v.iter().map(|&(token, logprob)| pb::TokenLogprob { token, logprob }).collect()
}

fn logprobs_from_pb(v: Vec<pb::TokenLogprob>) -> Vec<(u32, f32)> {
    v.into_iter().map(|l| (l.token, l.logprob)).collect()
}

pub fn target_position_to_pb(p: &TargetPosition) -> pb::TargetPosition {
    pb::TargetPosition {
        draft_token_prob: p.draft_token_prob,
        argmax: p.argmax,
        entropy: p.entropy,
        top_n: p.top_n.clone(),
        residual_token: p.residual_token,
        easd_token: p.easd_token,
        sample_token: p.sample_token,
        top_logprobs: logprobs_to_pb(&p.top_logprobs),
        candidate_logprobs: logprobs_to_pb(&p.candidate_logprobs),
    }
}

pub fn target_position_from_pb(p: pb::TargetPosition) -> TargetPosition {
    TargetPosition {
        draft_token_prob: p.draft_token_prob,
        argmax: p.argmax,
        entropy: p.entropy,
        top_n: p.top_n,
        residual_token: p.residual_token,
        easd_token: p.easd_token,
        sample_token: p.sample_token,
        top_logprobs: logprobs_from_pb(p.top_logprobs),
        candidate_logprobs: logprobs_from_pb(p.candidate_logprobs),
    }
}
