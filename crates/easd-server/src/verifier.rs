//! The verifier service: scores a drafted block against the target in one forward pass and returns per-position
//! summaries with the position-keyed samples (DESIGN §3.1 step 2). It decides nothing.

use std::sync::Arc;
use std::time::Instant;

use easd_core::{MAX_BLOCK_SIZE, TargetOptions, score_position};
use easd_proto::v1::{self as pb, verifier_server::Verifier};
use tonic::{Request, Response, Status};

use crate::convert::{penalty_from_alpha, sampling_from_pb, sparse_from_pb, target_position_to_pb};
use crate::error::ServerError;
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

        let worker = self.worker.clone();
        let session_id = req.session_id.clone();
        // The blocking thread does not inherit the request's span: carry it in, so the forward joins the trace.
        let span = tracing::Span::current();
        let response = blocking(move || {
            let _entered = span.enter();
            let mut s = session.lock().expect("session poisoned");
            let start = s.resume(&session_id, claim)?;
            let mut feed = req.new_tokens.clone();
            feed.extend(block.iter().map(|(t, _)| *t));
            let started = Instant::now();
            let logits = worker.forward(&mut s.cache, &feed, start)?;
            let forward_seconds = started.elapsed().as_secs_f32();
            s.tokens.extend(&feed);
            // Row n-1 predicts the first block position; the last row is the bonus position.
            let first_row = req.new_tokens.len() - 1;
            let first_position = (start + req.new_tokens.len()) as u64;
            let positions = (0..=block.len())
                .map(|j| {
                    let drafted = block.get(j).map(|(t, q)| (*t, q));
                    let p = score_position(
                        logits.row(first_row + j),
                        &params,
                        &opts,
                        drafted,
                        seed,
                        first_position + j as u64,
                    );
                    target_position_to_pb(&p)
                })
                .collect();
            let bytes = s.cache.bytes();
            drop(s);
            worker.checkin(&session_id, bytes);
            Ok(pb::VerifyResponse { positions, forward_seconds })
        })
        .await?;
        Ok(Response::new(response))
    }

    async fn release(&self, request: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseResponse>, Status> {
        Ok(Response::new(self.worker.release(request.get_ref())))
    }
}
