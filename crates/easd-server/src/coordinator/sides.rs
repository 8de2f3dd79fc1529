//! The two sides of the speculative loop behind small traits — [`DraftSide`] proposes, [`VerifierSide`] scores —
//! so the loop is tested with scripted fakes, and their gRPC implementations over [`PinnedWorker`]s.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use easd_core::{DraftToken, TargetPosition};
use easd_proto::v1 as pb;
use tokio::sync::watch;
use tracing::Instrument;

use super::pinned::PinnedWorker;
use super::request::Plan;
use crate::convert::{draft_token_from_pb, penalty_to_alpha, sampling_to_pb, sparse_to_pb, target_position_from_pb};
use crate::error::ServerError;
use crate::prefix::HashedTokens;

/// Tokens a draft proposed, in order, with the seconds it spent computing them.
#[derive(Clone, Debug)]
pub struct Drafted {
    pub tokens: Vec<DraftToken>,
    pub forward_s: f64,
    /// Of `forward_s`, the first token's: it also fed the call's new tokens (the whole prompt on a session's first
    /// call), or took nothing (a draw the worker kept from the call before).
    pub first_s: f64,
}

impl Drafted {
    /// The tokens after the first and their seconds: what drafting one more token costs, prefills aside.
    pub fn decode_time(&self) -> Option<(usize, f64)> {
        let after_first = self.tokens.len().checked_sub(1).filter(|&n| n > 0)?;
        Some((after_first, self.forward_s - self.first_s))
    }
}

/// The verifier's summaries of a block's positions and of the position after it.
#[derive(Clone, Debug)]
pub struct Scored {
    pub positions: Vec<TargetPosition>,
    pub forward_s: f64,
}

/// A proposal the loop may end early: the draft reports how many tokens have arrived, and once asked to stop it
/// returns those (at least one) instead of all it was asked for. The pipelined loop's growing blocks use it.
#[derive(Clone, Debug)]
pub struct Cutoff {
    arrived: Arc<watch::Sender<usize>>,
    stop: Arc<watch::Sender<bool>>,
}

impl Default for Cutoff {
    fn default() -> Self {
        Self { arrived: Arc::new(watch::channel(0).0), stop: Arc::new(watch::channel(false).0) }
    }
}

impl Cutoff {
    /// The draft's side: `n` tokens of the current attempt have arrived (a failover starts again from 0).
    pub fn set_arrived(&self, n: usize) {
        self.arrived.send_replace(n);
    }

    /// The draft's side: resolves once the loop asked to stop.
    pub async fn stopped(&self) {
        let mut rx = self.stop.subscribe();
        let _ = rx.wait_for(|&stop| stop).await;
    }

    /// The loop's side: resolves once at least `n` tokens have arrived.
    pub async fn arrived_at_least(&self, n: usize) {
        let mut rx = self.arrived.subscribe();
        let _ = rx.wait_for(|&arrived| arrived >= n).await;
    }

    /// The loop's side: return what has arrived.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }
}

/// The draft side of a session.
pub trait DraftSide: Send {
    /// Drafts `count` tokens continuing `context` (the committed tokens, possibly followed by a block that is still
    /// being verified and a guess of its bonus token). `Ok(None)`: no draft can serve; the loop goes on without one.
    /// With a `cutoff`, the result may hold fewer tokens (at least one) once the loop asked it to stop. Dropping
    /// the future cancels the request; the next one still claims correctly.
    fn propose(
        &mut self,
        context: &HashedTokens,
        count: usize,
        cutoff: Option<&Cutoff>,
    ) -> impl Future<Output = Result<Option<Drafted>, ServerError>> + Send;

    /// Frees the session on the worker (end of the generation).
    fn release(&mut self);

    /// Times the session moved to another draft replica.
    fn failovers(&self) -> u32;
}

/// The verifier side of a session.
pub trait VerifierSide: Send {
    /// Scores `block` after `context` (the committed tokens): `block.len() + 1` positions, the last the bonus one.
    fn verify(
        &mut self,
        context: &HashedTokens,
        block: &[DraftToken],
    ) -> impl Future<Output = Result<Scored, ServerError>> + Send;

    fn release(&mut self);

    /// Sessions live on the replica this session is pinned to (its batch, as far as this coordinator knows).
    fn live_sessions(&self) -> usize;

    /// The replicas that served the session, in order.
    fn replicas_used(&self) -> Vec<String>;

    fn failovers(&self) -> u32;
}

/// The draft over gRPC: `Draft/Propose` on the pinned draft replica, streamed token by token.
pub struct GrpcDraft {
    pin: PinnedWorker,
    sampling: pb::SamplingParams,
    top_n: u32,
}

impl GrpcDraft {
    pub fn new(pin: PinnedWorker, plan: &Plan) -> Self {
        Self { pin, sampling: sampling_to_pb(&plan.sampling, plan.seed), top_n: plan.easd.top_n as u32 }
    }
}

impl DraftSide for GrpcDraft {
    async fn propose(
        &mut self,
        context: &HashedTokens,
        count: usize,
        cutoff: Option<&Cutoff>,
    ) -> Result<Option<Drafted>, ServerError> {
        let (session_id, sampling, top_n) = (self.pin.session_id().to_owned(), self.sampling, self.top_n);
        let timeout = self.pin.pool().config.call_timeout;
        let result = self
            .pin
            .call(context, |replica, part| {
                let req = pb::ProposeRequest {
                    session_id: session_id.clone(),
                    claim: part.claim,
                    new_tokens: part.new_tokens,
                    full_context: part.full_context,
                    count: count as u32,
                    sampling: Some(sampling),
                    proposal_support: easd_core::DEFAULT_K_Q as u32,
                    top_n,
                };
                // A client span whose context the draft continues.
                let span = tracing::info_span!("draft.propose", otel.kind = "client", replica = %replica.url, count);
                async move {
                    let mut req = tonic::Request::new(req);
                    req.set_timeout(timeout);
                    easd_telemetry::inject_context(&mut req);
                    let mut tokens = Vec::with_capacity(count);
                    if let Some(c) = cutoff {
                        c.set_arrived(0);
                    }
                    let mut stream = replica.draft().propose(req).await?.into_inner();
                    loop {
                        let next = match cutoff {
                            // Stopping drops the stream: the draft makes no more forwards.
                            Some(c) if !tokens.is_empty() => tokio::select! {
                                biased;
                                next = stream.message() => next?,
                                () = c.stopped() => break,
                            },
                            _ => stream.message().await?,
                        };
                        let Some(t) = next else { break };
                        tokens.push(t);
                        if let Some(c) = cutoff {
                            c.set_arrived(tokens.len());
                        }
                    }
                    Ok(tokens)
                }
                .instrument(span)
            })
            .await?;
        let Some(tokens) = result else { return Ok(None) };
        if tokens.len() > count || tokens.is_empty() || (tokens.len() < count && cutoff.is_none()) {
            return Err(ServerError::Internal(format!("draft sent {} tokens, {count} asked", tokens.len())));
        }
        let count = tokens.len();
        let forward_s = tokens.iter().map(|t| f64::from(t.forward_seconds)).sum();
        let first_s = f64::from(tokens[0].forward_seconds);
        let tokens: Vec<DraftToken> = tokens.into_iter().map(draft_token_from_pb).collect::<Result<_, _>>()?;
        // The draft fed back every proposal but the last.
        let fed: Vec<u32> = tokens[..count - 1].iter().map(|t| t.token).collect();
        self.pin.now_holds(context, &fed);
        Ok(Some(Drafted { tokens, forward_s, first_s }))
    }

    fn release(&mut self) {
        self.pin.release();
    }

    fn failovers(&self) -> u32 {
        self.pin.failovers()
    }
}

/// The verifier over gRPC: `Verifier/Verify` on the pinned replica, failing over to another one.
pub struct GrpcVerifier {
    pin: PinnedWorker,
    sampling: pb::SamplingParams,
    top_n: u32,
    penalty_alpha: f32,
    logprobs: u32,
}

impl GrpcVerifier {
    pub fn new(pin: PinnedWorker, plan: &Plan) -> Self {
        Self {
            pin,
            sampling: sampling_to_pb(&plan.sampling, plan.seed),
            top_n: plan.easd.top_n as u32,
            penalty_alpha: penalty_to_alpha(plan.easd.penalty),
            logprobs: plan.logprobs as u32,
        }
    }
}

impl VerifierSide for GrpcVerifier {
    async fn verify(&mut self, context: &HashedTokens, block: &[DraftToken]) -> Result<Scored, ServerError> {
        let session_id = self.pin.session_id().to_owned();
        let timeout: Duration = self.pin.pool().config.call_timeout;
        let drafted: Vec<pb::DraftedToken> = block
            .iter()
            .map(|d| pb::DraftedToken { token: d.token, proposal: Some(sparse_to_pb(&d.proposal)) })
            .collect();
        let (sampling, top_n, penalty_alpha, logprobs) = (self.sampling, self.top_n, self.penalty_alpha, self.logprobs);
        let result = self
            .pin
            .call(context, |replica, part| {
                let req = pb::VerifyRequest {
                    session_id: session_id.clone(),
                    claim: part.claim,
                    new_tokens: part.new_tokens,
                    full_context: part.full_context,
                    block: drafted.clone(),
                    sampling: Some(sampling),
                    top_n,
                    penalty_alpha,
                    logprobs,
                };
                let span =
                    tracing::info_span!("verify", otel.kind = "client", replica = %replica.url, block_len = block.len());
                async move {
                    let mut req = tonic::Request::new(req);
                    req.set_timeout(timeout);
                    easd_telemetry::inject_context(&mut req);
                    Ok(replica.verifier().verify(req).await?.into_inner())
                }
                .instrument(span)
            })
            .await?;
        let resp =
            result.ok_or_else(|| ServerError::Unavailable("no verifier replica could serve the session".into()))?;
        if resp.positions.len() != block.len() + 1 {
            return Err(ServerError::Internal(format!(
                "verifier sent {} positions for a block of {}",
                resp.positions.len(),
                block.len()
            )));
        }
        let appended: Vec<u32> = block.iter().map(|d| d.token).collect();
        self.pin.now_holds(context, &appended);
        Ok(Scored {
            positions: resp.positions.into_iter().map(target_position_from_pb).collect(),
            forward_s: f64::from(resp.forward_seconds),
        })
    }

    fn release(&mut self) {
        self.pin.release();
    }

    fn live_sessions(&self) -> usize {
        self.pin.live_sessions()
    }

    fn replicas_used(&self) -> Vec<String> {
        self.pin.replicas_used().to_vec()
    }

    fn failovers(&self) -> u32 {
        self.pin.failovers()
    }
}

#[cfg(test)]
mod tests {
    use easd_core::SparseDist;

    use super::*;

    fn drafted(seconds: &[f64]) -> Drafted {
        let token = DraftToken {
            token: 1,
            proposal: SparseDist { ids: vec![1], probs: vec![1.0] },
            entropy: 0.0,
            top_n: vec![1],
        };
        Drafted { tokens: vec![token; seconds.len()], forward_s: seconds.iter().sum(), first_s: seconds[0] }
    }

    /// The first token's seconds hold a prefill (or nothing, a kept draw): the per-token cost leaves them out, so
    /// the adaptive block floor is not misled by a session's first call for many steps.
    #[test]
    fn the_decode_time_leaves_the_first_token_out() {
        assert_eq!(drafted(&[0.5, 0.125, 0.125, 0.125]).decode_time(), Some((3, 0.375)));
        assert_eq!(drafted(&[0.0, 0.125]).decode_time(), Some((1, 0.125)));
        assert_eq!(drafted(&[0.6]).decode_time(), None, "one token says nothing about the next");
    }
}
