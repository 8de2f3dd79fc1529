//! The `Prefill` RPC both workers serve: feeds a long run of committed tokens into a session's cache in pieces
//! (`crate::batcher`'s `max_piece`), streaming progress after each piece and a heartbeat while the call waits behind
//! other sessions' work on a worker that is making progress. The coordinator's deadline is on the next message, so
//! a long prompt never times out on a live worker and a stalled one falls silent; what was fed stays in the session
//! when the call is cancelled half-way, so the retry claims it and feeds only the rest.

use std::sync::Arc;
use std::time::Duration;

use easd_model::Logits;
use easd_proto::v1 as pb;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::batcher::{Job, Round, Ticket};
use crate::error::ServerError;
use crate::sessions::{Claim, WorkerSession};
use crate::worker::Worker;

/// How often a waiting prefill tells its caller that the worker is still making progress (on other sessions' work).
pub const HEARTBEAT: Duration = Duration::from_millis(500);

pub type PrefillStream = ReceiverStream<Result<pb::PrefillProgress, Status>>;

/// Where a prefill job is, as the model thread last reported it.
#[derive(Clone, Debug)]
enum State {
    Queued,
    Fed { held: usize, forward_seconds: f32 },
    Done { held: usize, forward_seconds: f32 },
    Failed(Status),
}

/// Serves one `Prefill` call: queues the job, then relays its progress (and heartbeats) until it is done, failed, or
/// the caller went away (which cancels the job before its next piece).
pub async fn prefill(worker: &Arc<Worker>, req: pb::PrefillRequest) -> Result<PrefillStream, ServerError> {
    let (session, claim) =
        worker.open_session(&req.session_id, req.claim.as_ref(), &req.new_tokens, req.full_context, 0)?;
    let (state, mut watch_state) = watch::channel(State::Queued);
    let mut held = claim.len;
    let job = PrefillJob { session_id: req.session_id.clone(), claim, tokens: req.new_tokens, state };
    let rows = job.tokens.len();
    worker.submit(Ticket::new(session, &req.session_id, rows, Box::new(job))).await?;

    let (tx, rx) = mpsc::channel(4);
    let worker = worker.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut forwards = worker.forwards_done();
        loop {
            let message = tokio::select! {
                changed = watch_state.changed() => {
                    if changed.is_err() {
                        // The job was dropped unfinished (the worker is shutting down).
                        let _ = tx.send(Err(Status::unavailable("the worker stopped"))).await;
                        return;
                    }
                    match watch_state.borrow_and_update().clone() {
                        State::Queued => continue,
                        State::Fed { held: h, forward_seconds } => {
                            held = h;
                            Ok(pb::PrefillProgress { held: h as u32, forward_seconds, done: false })
                        }
                        State::Done { held, forward_seconds } => {
                            Ok(pb::PrefillProgress { held: held as u32, forward_seconds, done: true })
                        }
                        State::Failed(status) => Err(status),
                    }
                }
                _ = tick.tick() => {
                    let now = worker.forwards_done();
                    if now == forwards {
                        continue; // the worker is not making progress: say nothing
                    }
                    forwards = now;
                    Ok(pb::PrefillProgress { held: held as u32, forward_seconds: 0.0, done: false })
                }
                () = tx.closed() => return, // the caller left: dropping `watch_state` cancels the job
            };
            let last = !matches!(message, Ok(pb::PrefillProgress { done: false, .. }));
            if tx.send(message).await.is_err() || last {
                return;
            }
        }
    });
    Ok(ReceiverStream::new(rx))
}

/// A prefill on the model thread: the claim check, then the tokens in pieces, reported after each.
struct PrefillJob {
    session_id: String,
    claim: Claim,
    tokens: Vec<u32>,
    state: watch::Sender<State>,
}

impl Job for PrefillJob {
    fn cancelled(&self) -> bool {
        self.state.is_closed()
    }

    fn start(&mut self, session: &mut WorkerSession) -> Result<Option<Round>, ServerError> {
        session.resume(&self.session_id, self.claim)?;
        // One logits row, read by nobody: the model always returns at least one.
        Ok(Some(Round { tokens: std::mem::take(&mut self.tokens), rows: 1 }))
    }

    fn fed(&mut self, held: usize, forward_seconds: f32) {
        self.state.send_replace(State::Fed { held, forward_seconds });
    }

    fn step(&mut self, session: &mut WorkerSession, _logits: Logits, forward_seconds: f32) -> Option<Round> {
        self.state.send_replace(State::Done { held: session.tokens.len(), forward_seconds });
        None
    }

    fn fail(&mut self, error: ServerError) {
        self.state.send_replace(State::Failed(error.into()));
    }
}

#[cfg(test)]
mod tests {
    use easd_model::{LoadOptions, Model, TinySpec, write_tiny_gguf};
    use easd_proto::v1::verifier_server::Verifier;
    use tokio_stream::StreamExt;
    use tonic::Request;

    use super::*;
    use crate::batcher::BatchOptions;
    use crate::prefix::HashedTokens;
    use crate::sessions::SessionLimits;
    use crate::verifier::VerifierService;

    fn tiny_verifier(max_piece: usize) -> (tempfile::TempDir, Arc<Worker>) {
        tiny_verifier_with(max_piece, SessionLimits::default())
    }

    fn tiny_verifier_with(max_piece: usize, limits: SessionLimits) -> (tempfile::TempDir, Arc<Worker>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_tiny_gguf(&path, &TinySpec::qwen2(7)).unwrap();
        let model = Arc::new(Model::load(&path, &LoadOptions { warmup: false, ..LoadOptions::default() }).unwrap());
        let batch = BatchOptions { max_piece, ..BatchOptions::default() };
        (dir, Worker::with_batching(model, limits, batch, "verifier"))
    }

    /// A greedy verify of an empty block after `context`, of which the session is claimed to hold `held` tokens.
    async fn verify(worker: &Arc<Worker>, session: &str, context: &[u32], held: Option<usize>) -> pb::VerifyResponse {
        let hashed = HashedTokens::from_tokens(context);
        let (claim, new_tokens) = match held {
            Some(len) => {
                (Some(pb::PrefixClaim { length: len as u32, hash: hashed.hash_of_prefix(len) }), &context[len..])
            }
            None => (None, context),
        };
        let req = pb::VerifyRequest {
            session_id: session.to_owned(),
            claim,
            new_tokens: new_tokens.to_vec(),
            full_context: held.is_none(),
            sampling: Some(pb::SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 1 }),
            top_n: 4,
            penalty_alpha: -1.0,
            logprobs: 5,
            ..Default::default()
        };
        let resp = VerifierService::new(worker.clone()).verify(Request::new(req)).await.unwrap().into_inner();
        pb::VerifyResponse { forward_seconds: 0.0, ..resp }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prefill_reports_its_pieces_and_the_next_call_scores_as_a_fresh_session_would() {
        let (_d, worker) = tiny_verifier(8);
        let context: Vec<u32> = (0..30).map(|i| (i * 7 + 3) % 50).collect();
        let req = pb::PrefillRequest {
            session_id: "s".into(),
            claim: None,
            new_tokens: context[..29].to_vec(),
            full_context: true,
        };
        let progress: Vec<pb::PrefillProgress> =
            prefill(&worker, req).await.unwrap().map(|p| p.unwrap()).collect().await;
        let held: Vec<u32> = progress.iter().map(|p| p.held).collect();
        assert!(held.windows(2).all(|w| w[0] <= w[1]), "progress only grows: {held:?}");
        assert!(held.iter().all(|&h| h % 8 == 0 || h == 29), "after whole pieces: {held:?}");
        let last = progress.last().unwrap();
        assert!(last.done && last.held == 29, "{progress:?}");
        assert!(progress[..progress.len() - 1].iter().all(|p| !p.done));

        let continued = verify(&worker, "s", &context, Some(29)).await;
        let fresh = verify(&worker, "fresh", &context, None).await;
        assert_eq!(continued, fresh, "the prefilled session scores bitwise as a fresh one");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prefill_on_a_wrong_claim_is_refused_as_a_lost_session() {
        let (_d, worker) = tiny_verifier(8);
        let context: Vec<u32> = (0..20).collect();
        verify(&worker, "s", &context[..5], None).await;
        let hashed = HashedTokens::from_tokens(&context);
        let req = pb::PrefillRequest {
            session_id: "s".into(),
            claim: Some(pb::PrefixClaim { length: 10, hash: hashed.hash_of_prefix(10) }),
            new_tokens: context[10..].to_vec(),
            full_context: false,
        };
        let mut stream = prefill(&worker, req).await.unwrap();
        let status = stream.next().await.unwrap().unwrap_err();
        assert!(crate::error::is_session_lost(&status), "{status:?}");
    }

    #[tokio::test]
    async fn a_session_that_cannot_fit_the_kv_budget_is_refused_with_the_budget_named() {
        // The tiny model's cache: 2 layers x 2 (k, v) x 2 kv heads x 16 dims x 4 bytes = 512 bytes a position,
        // allocated 256 positions at a time: 128 KiB for anything up to 256 tokens.
        let limits = SessionLimits { budget_bytes: 100 << 10, ..SessionLimits::default() };
        let (_d, worker) = tiny_verifier_with(8, limits);
        let req =
            pb::PrefillRequest { session_id: "s".into(), claim: None, new_tokens: vec![1; 20], full_context: true };
        let error = prefill(&worker, req).await.expect_err("refused");
        assert!(matches!(error, ServerError::KvBudgetExceeded { .. }), "{error:?}");
        let message = error.to_string();
        assert!(
            message.starts_with("a session of 20 tokens needs 128 KiB of KV cache on this verifier worker, more than its whole budget of 100 KiB (--kv-budget-mib)"),
            "{message}"
        );
        let status: Status = error.into();
        assert_eq!(status.code(), tonic::Code::OutOfRange, "a client error, not worth retrying");
        assert_eq!(worker.sessions.stats().sessions, 0, "nothing was created");
    }
}
