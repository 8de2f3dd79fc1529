//! The verifier service: scores a drafted block against the target in one forward pass and returns per-position
//! summaries with the position-keyed samples (DESIGN §3.1 step 2). It decides nothing. The forward is one
//! session's part of a batch on the worker's model thread (`crate::batcher`); its logits are bitwise those of a
//! forward alone.

use std::sync::Arc;

use easd_core::{MAX_BLOCK_SIZE, TargetOptions, score_position};
use easd_model::Logits;
use easd_proto::v1::{self as pb, verifier_server::Verifier};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::batcher::{Job, Round, Ticket};
use crate::convert::{penalty_from_alpha, sampling_from_pb, sparse_from_pb, target_position_to_pb};
use crate::error::ServerError;
use crate::prefill::{PrefillStream, prefill};
use crate::sessions::{Claim, WorkerSession};
use crate::worker::{Worker, blocking};

pub const MAX_LOGPROBS: u32 = 20;

pub struct VerifierService {
    worker: Arc<Worker>,
}

impl VerifierService {
    pub fn new(worker: Arc<Worker>) -> Self {
        Self { worker }
    }
}

#[tonic::async_trait]
impl Verifier for VerifierService {
    async fn info(&self, _: Request<pb::InfoRequest>) -> Result<Response<pb::ModelInfo>, Status> {
        Ok(Response::new(self.worker.info()))
    }

    async fn verify(&self, request: Request<pb::VerifyRequest>) -> Result<Response<pb::VerifyResponse>, Status> {
        let req = request.into_inner();
        if req.block.len() > MAX_BLOCK_SIZE {
            return Err(ServerError::invalid(
                "block",
                format!("at most {MAX_BLOCK_SIZE} tokens, got {}", req.block.len()),
            )
            .into());
        }
        if req.logprobs > MAX_LOGPROBS {
            return Err(ServerError::invalid(
                "logprobs",
                format!("must be in 0..={MAX_LOGPROBS}, got {}", req.logprobs),
            )
            .into());
        }
        let (params, seed) = sampling_from_pb(req.sampling.as_ref())?;
        let opts = TargetOptions {
            top_n: req.top_n.max(1) as usize,
            penalty: penalty_from_alpha(req.penalty_alpha)?,
            logprobs: req.logprobs as usize,
        };
        let vocab = self.worker.model.info().vocab_size;
        let mut block = Vec::with_capacity(req.block.len());
        for d in &req.block {
            if d.token as usize >= vocab {
                return Err(ServerError::invalid(
                    "block",
                    format!("token id {} is outside the vocabulary (size {vocab})", d.token),
                )
                .into());
            }
            block.push((d.token, sparse_from_pb(d.proposal.as_ref(), "block.proposal")?));
        }
        let (session, claim) = self.worker.open_session(
            &req.session_id,
            req.claim.as_ref(),
            &req.new_tokens,
            req.full_context,
            block.len(),
        )?;

        let mut feed = req.new_tokens.clone();
        feed.extend(block.iter().map(|(t, _)| *t));
        let (reply, scored) = oneshot::channel();
        // Row n-1 predicts the first block position; the last row is the bonus position: the block's rows + 1.
        let job =
            VerifyJob { session_id: req.session_id.clone(), claim, feed, rows: block.len() + 1, reply: Some(reply) };
        self.worker.submit(Ticket::new(session, &req.session_id, job.feed.len(), Box::new(job))).await?;
        let scored = scored.await.map_err(|_| ServerError::Unavailable("the worker stopped".into()))??;
        let first_position = (scored.start + req.new_tokens.len()) as u64;
        let response = blocking(move || {
            let positions = (0..=block.len())
                .map(|j| {
                    let drafted = block.get(j).map(|(t, q)| (*t, q));
                    let p =
                        score_position(scored.logits.row(j), &params, &opts, drafted, seed, first_position + j as u64);
                    target_position_to_pb(&p)
                })
                .collect();
            Ok(pb::VerifyResponse { positions, forward_seconds: scored.forward_seconds })
        })
        .await?;
        Ok(Response::new(response))
    }

    type PrefillStream = PrefillStream;

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

/// A block's logits from the model thread.
struct Scored {
    /// Where the request's new tokens started (after the claim check).
    start: usize,
    /// The last `block + 1` rows.
    logits: Logits,
    forward_seconds: f32,
}

/// One verify on the model thread: the claim check, then one forward over the new tokens and the block. Scoring the
/// rows happens back in the request, off the model thread.
struct VerifyJob {
    session_id: String,
    claim: Claim,
    feed: Vec<u32>,
    rows: usize,
    reply: Option<oneshot::Sender<Result<Scored, ServerError>>>,
}

impl VerifyJob {
    fn send(&mut self, result: Result<Scored, ServerError>) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(result); // a client gone meanwhile needs no answer
        }
    }
}

impl Job for VerifyJob {
    fn cancelled(&self) -> bool {
        self.reply.as_ref().is_none_or(|r| r.is_closed())
    }

    fn start(&mut self, session: &mut WorkerSession) -> Result<Option<Round>, ServerError> {
        session.resume(&self.session_id, self.claim)?;
        Ok(Some(Round { tokens: self.feed.clone(), rows: self.rows }))
    }

    fn step(&mut self, session: &mut WorkerSession, logits: Logits, forward_seconds: f32) -> Option<Round> {
        let start = session.tokens.len() - self.feed.len();
        self.send(Ok(Scored { start, logits, forward_seconds }));
        None
    }

    fn fail(&mut self, error: ServerError) {
        self.send(Err(error));
    }
}
