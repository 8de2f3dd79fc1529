//! The draft service: proposes k tokens with their sparse proposals, entropies and top-N sets (DESIGN §3.1 step 1).
//! Each proposal step is one row of a batched forward on the worker's model thread (`crate::batcher`), so the
//! steps of concurrent sessions share one read of the weights.

use std::sync::Arc;
use std::time::Instant;

use easd_core::{DEFAULT_K_Q, DraftToken, MAX_BLOCK_SIZE, propose};
use easd_model::Logits;
use easd_proto::v1::{self as pb, draft_server::Draft};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::batcher::{Job, Round, Ticket};
use crate::convert::{draft_token_to_pb, sampling_from_pb};
use crate::error::ServerError;
use crate::limits::MAX_PROPOSAL_SUPPORT;
use crate::prefill::{PrefillStream, prefill};
use crate::sessions::{Claim, DrawSettings, WorkerSession};
use crate::worker::Worker;

/// Most tokens one `Propose` call may ask for: a block of the largest size plus the guess of its bonus token.
pub const MAX_PROPOSE_COUNT: usize = MAX_BLOCK_SIZE + 1;

pub struct DraftService {
    worker: Arc<Worker>,
}

impl DraftService {
    pub fn new(worker: Arc<Worker>) -> Self {
        Self { worker }
    }
}

#[tonic::async_trait]
impl Draft for DraftService {
    type ProposeStream = ReceiverStream<Result<pb::DraftToken, Status>>;
    type PrefillStream = PrefillStream;

    async fn info(&self, _: Request<pb::InfoRequest>) -> Result<Response<pb::ModelInfo>, Status> {
        Ok(Response::new(self.worker.info()))
    }

    async fn propose(&self, request: Request<pb::ProposeRequest>) -> Result<Response<Self::ProposeStream>, Status> {
        let req = request.into_inner();
        let count = req.count as usize;
        // A block, or (pipelined loop) the guess of a block's bonus token plus the next block.
        if count == 0 || count > MAX_PROPOSE_COUNT {
            return Err(
                ServerError::invalid("count", format!("must be in 1..={MAX_PROPOSE_COUNT}, got {count}")).into()
            );
        }
        let (params, seed) = sampling_from_pb(req.sampling.as_ref())?;
        let support = if req.proposal_support == 0 { DEFAULT_K_Q } else { req.proposal_support as usize };
        if support > MAX_PROPOSAL_SUPPORT {
            let reason = format!("must be in 0..={MAX_PROPOSAL_SUPPORT}, got {support}");
            return Err(ServerError::invalid("proposal_support", reason).into());
        }
        let top_n = req.top_n.max(1) as usize;
        // The last proposal is never fed back, hence count - 1.
        let (session, claim) = self.worker.open_session(
            &req.session_id,
            req.claim.as_ref(),
            &req.new_tokens,
            req.full_context,
            count - 1,
        )?;

        // Room for every token and an error: the model thread never waits on a slow reader.
        let (tx, rx) = mpsc::channel(MAX_PROPOSE_COUNT + 1);
        let job = ProposeJob {
            session_id: req.session_id.clone(),
            claim,
            new_tokens: req.new_tokens,
            count,
            sent: 0,
            settings: DrawSettings { params, seed, support, top_n },
            tx,
        };
        let rows = job.new_tokens.len();
        self.worker.submit(Ticket::new(session, &req.session_id, rows, Box::new(job))).await?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn prefill(&self, request: Request<pb::PrefillRequest>) -> Result<Response<PrefillStream>, Status> {
        Ok(Response::new(prefill(&self.worker, request.into_inner()).await?))
    }

    async fn keep_alive(
        &self,
        request: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::KeepAliveResponse>, Status> {
        Ok(Response::new(self.worker.keep_alive(request.get_ref())?))
    }

    async fn release(&self, request: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseResponse>, Status> {
        Ok(Response::new(self.worker.release(request.get_ref())))
    }
}

/// One proposal on the model thread: the claim check, a forward over the new tokens, then each proposal fed back —
/// `count` rounds, each one row of a batch with the other sessions' rounds. Each token is sent as soon as drawn.
struct ProposeJob {
    session_id: String,
    claim: Claim,
    new_tokens: Vec<u32>,
    count: usize,
    sent: usize,
    settings: DrawSettings,
    tx: mpsc::Sender<Result<pb::DraftToken, Status>>,
}

impl ProposeJob {
    /// Sends `token`, drawn for the session's next position, and keeps it for a later request that may start there
    /// (see `WorkerSession::resume_keeping`); returns the round that feeds it back, or None when done or the stream
    /// closed. `seconds`: what computing it took.
    fn send(&mut self, session: &mut WorkerSession, token: DraftToken, seconds: f32) -> Option<Round> {
        let position = session.tokens.len() as u64;
        let (id, message) = (token.token, draft_token_to_pb(&token, position, seconds));
        session.keep_draw(&self.settings, token);
        self.sent += 1;
        if self.tx.try_send(Ok(message)).is_err() || self.sent == self.count {
            return None; // done, or the coordinator went away: stop drafting
        }
        Some(Round { tokens: vec![id], rows: 1 })
    }
}

impl Job for ProposeJob {
    /// The coordinator dropped the stream (a cancelled pre-draft): a job not started yet leaves the session
    /// untouched — it must not roll back what a later request built — and a running one makes no more forwards.
    fn cancelled(&self) -> bool {
        self.tx.is_closed()
    }

    /// Feeds what the session does not hold yet of the new tokens; when it holds them all with the draw after them
    /// (the end of a pre-draft that was cut short), that draw is the first proposal, without a forward.
    fn start(&mut self, session: &mut WorkerSession) -> Result<Option<Round>, ServerError> {
        let (held, draw) = session.resume_keeping(&self.session_id, self.claim, &self.new_tokens, &self.settings)?;
        match draw {
            Some(token) => Ok(self.send(session, token, 0.0)),
            None => Ok(Some(Round { tokens: self.new_tokens.split_off(held), rows: 1 })),
        }
    }

    fn step(&mut self, session: &mut WorkerSession, logits: Logits, forward_seconds: f32) -> Option<Round> {
        let started = Instant::now();
        let position = session.tokens.len() as u64;
        let s = &self.settings;
        let token = propose(logits.row(0), &s.params, s.support, s.top_n, s.seed, position);
        self.send(session, token, forward_seconds + started.elapsed().as_secs_f32())
    }

    fn fail(&mut self, error: ServerError) {
        match error {
            ServerError::PrefixMismatch { .. } => tracing::info!(error = %error, "propose: resend the full context"),
            _ => tracing::warn!(error = %error, "propose failed"),
        }
        let _ = self.tx.try_send(Err(error.into()));
    }
}

#[cfg(test)]
mod tests {
    use easd_model::{LoadOptions, Model, TinySpec, write_tiny_gguf};
    use tokio_stream::StreamExt;

    use super::*;
    use crate::prefix::HashedTokens;
    use crate::sessions::SessionLimits;

    fn tiny_draft() -> (tempfile::TempDir, Arc<Worker>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("draft.gguf");
        write_tiny_gguf(&path, &TinySpec::qwen2(7)).unwrap();
        let model = Arc::new(Model::load(&path, &LoadOptions { warmup: false, ..LoadOptions::default() }).unwrap());
        (dir, Worker::new(model, SessionLimits::default(), "draft"))
    }

    /// Forwards the worker has run (its batch-size histogram's count).
    fn forwards(worker: &Worker) -> f64 {
        let series = "easd_worker_batch_sessions_count{role=\"draft\"} ";
        let text = worker.metrics().encode();
        text.lines().find_map(|l| l.strip_prefix(series)?.parse().ok()).unwrap_or(0.0)
    }

    /// Proposes `count` tokens after `context`, of which the session is claimed to hold the first `held`
    /// (`None`: the full context is sent). Returns the proposals without their timings.
    async fn propose(
        service: &DraftService,
        session: &str,
        context: &[u32],
        held: Option<usize>,
        count: u32,
    ) -> Vec<pb::DraftToken> {
        let hashed = HashedTokens::from_tokens(context);
        let (claim, new_tokens) = match held {
            Some(len) => {
                let claim = pb::PrefixClaim { length: len as u32, hash: hashed.hash_of_prefix(len) };
                (Some(claim), context[len..].to_vec())
            }
            None => (None, context.to_vec()),
        };
        let req = pb::ProposeRequest {
            session_id: session.to_owned(),
            claim,
            new_tokens,
            full_context: held.is_none(),
            count,
            // Sampled, so that the draws' keys (seed, position) are checked too.
            sampling: Some(pb::SamplingParams { temperature: 0.9, top_k: 0, top_p: 1.0, seed: 11 }),
            proposal_support: 0,
            top_n: 4,
        };
        let stream = service.propose(Request::new(req)).await.unwrap().into_inner();
        let tokens: Vec<pb::DraftToken> = stream.map(|t| t.unwrap()).collect().await;
        tokens.into_iter().map(|t| pb::DraftToken { forward_seconds: 0.0, ..t }).collect()
    }

    /// A proposal that starts right where the session's last forward left it (the end of a pre-draft cut short:
    /// the session fed one token more than its client saw) draws its first token from the logits kept then,
    /// without a forward; a proposal that starts elsewhere feeds what it must. Either way the tokens, proposals and
    /// entropies are bitwise those of a fresh session given the whole context.
    #[tokio::test]
    async fn a_proposal_reuses_what_the_session_already_fed_and_changes_nothing() {
        let (_dir, worker) = tiny_draft();
        let service = DraftService::new(worker.clone());
        let prompt = [3u32, 14, 15, 92, 65];
        // Fed: the prompt, t0 and t1; kept: the logits that drew t2.
        let first = propose(&service, "s", &prompt, None, 3).await;
        let t: Vec<u32> = first.iter().map(|d| d.token).collect();
        let fresh = |context: Vec<u32>, id: &'static str, count: u32| {
            let service = &service;
            async move { propose(service, id, &context, None, count).await }
        };

        // The client saw t0 and t1 but believes t1 unfed: it claims prompt + t0 and sends t1.
        let context = [&prompt[..], &t[..2]].concat();
        let before = forwards(&worker);
        let reused = propose(&service, "s", &context, Some(prompt.len() + 1), 3).await;
        assert_eq!(forwards(&worker) - before, 2.0, "three proposals, the first without a forward");
        assert_eq!(reused[0].token, t[2], "the first proposal is the one the kept logits drew");
        assert_eq!(reused, fresh(context.clone(), "a", 3).await, "bitwise a fresh session's proposals");

        // A close that arrives late lets one more forward through (t2 fed, t3 drawn): the draw after t1 is still kept.
        let late = propose(&service, "late", &prompt, None, 4).await;
        assert_eq!(late[..3], first[..], "the same draws in a fresh session");
        let before = forwards(&worker);
        let reused = propose(&service, "late", &context, Some(prompt.len() + 1), 3).await;
        assert_eq!(forwards(&worker) - before, 2.0, "the first proposal without a forward");
        assert_eq!(reused, fresh(context.clone(), "a", 3).await);

        // Held tokens are kept only while they match: prompt + t0 + something else feeds only the new token.
        let other = (t[1] + 1) % 7;
        let context = [&prompt[..], &[t[0], other]].concat();
        let forked = propose(&service, "s", &context, Some(prompt.len()), 3).await;
        assert_eq!(forked, fresh(context, "b", 3).await);

        // All new tokens held but the draw after them not kept (drawn too long ago): the last one is fed again.
        let held = propose(&service, "s", &prompt, None, 6).await;
        let context = [&prompt[..], &[held[0].token]].concat();
        let before = forwards(&worker);
        let again = propose(&service, "s", &context, Some(prompt.len()), 2).await;
        assert_eq!(forwards(&worker) - before, 2.0, "the held token is fed again, then the first proposal");
        assert_eq!(again, fresh(context, "c", 2).await);
    }
}
