//! The draft service: proposes k tokens with their sparse proposals, entropies and top-N sets (DESIGN §3.1 step 1).

use std::sync::Arc;
use std::time::Instant;

use easd_core::{DEFAULT_K_Q, MAX_BLOCK_SIZE, propose};
use easd_proto::v1::{self as pb, draft_server::Draft};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::convert::{draft_token_to_pb, sampling_from_pb};
use crate::error::ServerError;
use crate::limits::MAX_PROPOSAL_SUPPORT;
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

        let (tx, rx) = mpsc::channel(MAX_PROPOSE_COUNT);
        let worker = self.worker.clone();
        let session_id = req.session_id.clone();
        // The blocking thread does not inherit the request's span: carry it in, so forwards join the trace.
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || {
            let _entered = span.enter();
            let result = (|| -> Result<(), ServerError> {
                let mut s = session.lock().expect("session poisoned");
                // A request cancelled while it waited for the session (a pre-draft the coordinator dropped) must not
                // roll back what a later request already built: it leaves the session untouched.
                if tx.is_closed() {
                    return Ok(());
                }
                let start = s.resume(&session_id, claim)?;
                let mut started = Instant::now();
                let logits = worker.forward(&mut s.cache, &req.new_tokens, start)?;
                s.tokens.extend(&req.new_tokens);
                let mut row = logits.row(logits.rows() - 1).to_vec();
                for i in 0..count {
                    let position = s.tokens.len() as u64;
                    let token = propose(&row, &params, support, top_n, seed, position);
                    let elapsed = started.elapsed().as_secs_f32();
                    let msg = draft_token_to_pb(&token, position, elapsed);
                    if tx.blocking_send(Ok(msg)).is_err() {
                        break; // the coordinator went away: stop drafting
                    }
                    if i + 1 < count {
                        if tx.is_closed() {
                            break; // cancelled (a dropped pre-draft): no more forwards
                        }
                        started = Instant::now();
                        let pos = s.tokens.len();
                        let logits = worker.forward(&mut s.cache, &[token.token], pos)?;
                        s.tokens.push(token.token);
                        row.copy_from_slice(logits.row(0));
                    }
                }
                let bytes = s.cache.bytes();
                drop(s);
                worker.checkin(&session_id, bytes);
                Ok(())
            })();
            if let Err(e) = result {
                match e {
                    ServerError::PrefixMismatch { .. } => {
                        tracing::info!(error = %e, "propose: resend the full context")
                    }
                    _ => tracing::warn!(error = %e, "propose failed"),
                }
                let _ = tx.blocking_send(Err(e.into()));
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn release(&self, request: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseResponse>, Status> {
        Ok(Response::new(self.worker.release(request.get_ref())))
    }
}
