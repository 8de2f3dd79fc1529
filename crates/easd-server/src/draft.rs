//! The draft service: proposes k tokens with their sparse proposals, entropies and top-N sets (DESIGN §3.1 step 1).
//! Each proposal step is one row of a batched forward on the worker's model thread (`crate::batcher`), so the
//! steps of concurrent sessions share one read of the weights.

use std::sync::Arc;
use std::time::Instant;

use easd_core::{DEFAULT_K_Q, MAX_BLOCK_SIZE, SamplingParams, propose};
use easd_model::Logits;
use easd_proto::v1::{self as pb, draft_server::Draft};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::batcher::{Job, Round, Ticket};
use crate::convert::{draft_token_to_pb, sampling_from_pb};
use crate::error::ServerError;
use crate::limits::MAX_PROPOSAL_SUPPORT;
use crate::sessions::{Claim, WorkerSession};
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
            params,
            seed,
            support,
            top_n,
            tx,
        };
        let rows = job.new_tokens.len();
        self.worker.submit(Ticket::new(session, &req.session_id, rows, Box::new(job))).await?;
        Ok(Response::new(ReceiverStream::new(rx)))
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
    params: SamplingParams,
    seed: u64,
    support: usize,
    top_n: usize,
    tx: mpsc::Sender<Result<pb::DraftToken, Status>>,
}

impl Job for ProposeJob {
    /// The coordinator dropped the stream (a cancelled pre-draft): a job not started yet leaves the session
    /// untouched — it must not roll back what a later request built — and a running one makes no more forwards.
    fn cancelled(&self) -> bool {
        self.tx.is_closed()
    }

    fn start(&mut self, session: &mut WorkerSession) -> Result<Round, ServerError> {
        session.resume(&self.session_id, self.claim)?;
        Ok(Round { tokens: std::mem::take(&mut self.new_tokens), rows: 1 })
    }

    fn step(&mut self, session: &mut WorkerSession, logits: Logits, forward_seconds: f32) -> Option<Round> {
        let started = Instant::now();
        let position = session.tokens.len() as u64;
        let token = propose(logits.row(0), &self.params, self.support, self.top_n, self.seed, position);
        let elapsed = forward_seconds + started.elapsed().as_secs_f32();
        self.sent += 1;
        if self.tx.try_send(Ok(draft_token_to_pb(&token, position, elapsed))).is_err() || self.sent == self.count {
            return None; // done, or the coordinator went away: stop drafting
        }
        Some(Round { tokens: vec![token.token], rows: 1 })
    }

    fn fail(&mut self, error: ServerError) {
        match error {
            ServerError::PrefixMismatch { .. } => tracing::info!(error = %error, "propose: resend the full context"),
            _ => tracing::warn!(error = %error, "propose failed"),
        }
        let _ = self.tx.try_send(Err(error.into()));
    }
}
