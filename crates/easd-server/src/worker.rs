//! What the draft and verifier workers share: the loaded model, the session table, prefix-claim handling, the
//! batcher whose model thread runs every forward ([`crate::batcher`]), and the worker's metrics (forward latency,
//! batch sizes, queue wait, KV cache use), which are always kept and served only when asked.

use std::sync::Arc;
use std::time::Duration;

use easd_model::Model;
use easd_proto::v1 as pb;
use easd_telemetry::WorkerMetrics;

use crate::batcher::{BatchOptions, Batcher, Ticket};
use crate::error::ServerError;
use crate::sessions::{Claim, SessionLimits, SessionTable, SharedSession};

/// A loaded model and the sessions computed with it.
pub struct Worker {
    pub model: Arc<Model>,
    pub sessions: SessionTable,
    pub role: &'static str,
    metrics: WorkerMetrics,
    batcher: Batcher,
}

impl Worker {
    /// A worker with the default batching ([`BatchOptions::default`]).
    pub fn new(model: Arc<Model>, limits: SessionLimits, role: &'static str) -> Arc<Self> {
        Self::with_batching(model, limits, BatchOptions::default(), role)
    }

    /// A worker and its model thread.
    pub fn with_batching(
        model: Arc<Model>,
        limits: SessionLimits,
        batch: BatchOptions,
        role: &'static str,
    ) -> Arc<Self> {
        let metrics = WorkerMetrics::new(role);
        Arc::new_cyclic(|worker| Self {
            batcher: Batcher::start(model.clone(), batch, metrics.clone(), worker.clone(), role),
            model,
            sessions: SessionTable::new(limits),
            role,
            metrics,
        })
    }

    /// The worker's metrics (serve `metrics().registry()` to expose them).
    pub fn metrics(&self) -> &WorkerMetrics {
        &self.metrics
    }

    /// Queues a job for the model thread (waits while the queue is full).
    pub async fn submit(&self, ticket: Ticket) -> Result<(), ServerError> {
        self.batcher.submit(ticket).await
    }

    /// Forwards the model thread has finished (a prefill's heartbeat: the worker is making progress).
    pub fn forwards_done(&self) -> u64 {
        self.batcher.forwards_done()
    }

    /// Records a session's cache size after a request (evicting over budget) and updates the cache metrics.
    pub fn checkin(&self, session_id: &str, bytes: usize) {
        let evicted = self.sessions.checkin(session_id, bytes);
        self.metrics.inc_evictions(evicted);
        self.report_cache();
    }

    fn report_cache(&self) {
        let stats = self.sessions.stats();
        self.metrics.set_kv_cache(stats.bytes as u64, stats.sessions);
    }

    pub fn info(&self) -> pb::ModelInfo {
        let info = self.model.info();
        pb::ModelInfo {
            name: info.name.clone(),
            architecture: info.architecture.to_string(),
            context_length: info.context_length as u32,
            vocab_size: info.vocab_size as u32,
            tokenizer_fingerprint: self.model.tokenizer().fingerprint().to_owned(),
            device: info.device.clone(),
            role: self.role.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    /// Validates a request's context part and returns its session with the claim to check under the session's lock
    /// ([`crate::sessions::WorkerSession::resume`]). `extra` counts the tokens the request will add beyond
    /// `new_tokens` (the block, or the proposals).
    pub fn open_session(
        &self,
        session_id: &str,
        claim: Option<&pb::PrefixClaim>,
        new_tokens: &[u32],
        full_context: bool,
        extra: usize,
    ) -> Result<(SharedSession, Claim), ServerError> {
        crate::limits::validate_id("session_id", session_id)?;
        if new_tokens.is_empty() {
            return Err(ServerError::invalid(
                "new_tokens",
                "must hold at least the last committed token (its logits are not cached)",
            ));
        }
        let vocab = self.model.info().vocab_size;
        if let Some(bad) = new_tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ServerError::invalid(
                "new_tokens",
                format!("token id {bad} is outside the vocabulary (size {vocab})"),
            ));
        }
        let (claim_len, claim_hash) = match (full_context, claim) {
            (true, _) => (0, crate::prefix::EMPTY_HASH),
            (false, Some(c)) => (c.length as usize, c.hash),
            (false, None) => return Err(ServerError::invalid("claim", "is required unless full_context is set")),
        };
        let needed = claim_len + new_tokens.len() + extra;
        let limit = self.model.info().context_length;
        if needed > limit {
            return Err(ServerError::ContextOverflow { needed, limit });
        }
        // A session that cannot fit the whole budget would only evict every other one: refuse it precisely.
        let budget = self.sessions.limits().budget_bytes;
        let bytes = self.model.new_cache().bytes_for(needed);
        if bytes > budget {
            return Err(ServerError::KvBudgetExceeded {
                tokens: needed,
                role: self.role,
                needed_bytes: bytes,
                budget_bytes: budget,
            });
        }
        let model = &self.model;
        let session = self.sessions.checkout(session_id, full_context, || model.new_cache())?;
        Ok((session, Claim { len: claim_len, hash: claim_hash }))
    }

    /// Most session ids one `KeepAlive` may carry (a coordinator splits longer lists).
    pub const MAX_KEEPALIVE_IDS: usize = 4096;

    pub fn keep_alive(&self, req: &pb::KeepAliveRequest) -> Result<pb::KeepAliveResponse, ServerError> {
        if req.session_ids.len() > Self::MAX_KEEPALIVE_IDS {
            let reason = format!("at most {} ids, got {}", Self::MAX_KEEPALIVE_IDS, req.session_ids.len());
            return Err(ServerError::invalid("session_ids", reason));
        }
        for id in &req.session_ids {
            crate::limits::validate_id("session_ids", id)?;
        }
        Ok(pb::KeepAliveResponse { held: self.sessions.touch(&req.session_ids) as u32 })
    }

    pub fn release(&self, req: &pb::ReleaseRequest) -> pb::ReleaseResponse {
        let released = self.sessions.release(&req.session_id);
        self.report_cache();
        pb::ReleaseResponse { released }
    }

    /// Background sweep of idle sessions; ends when the worker is dropped.
    pub fn spawn_idle_sweeper(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let period =
            (self.sessions.limits().idle_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                let Some(worker) = weak.upgrade() else { break };
                let removed = worker.sessions.sweep_idle();
                if removed > 0 {
                    tracing::info!(removed, role = worker.role, "dropped idle sessions");
                    worker.metrics.inc_evictions(removed as u64);
                    worker.report_cache();
                }
            }
        });
    }
}

/// Runs blocking model work off the async runtime.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ServerError> + Send + 'static,
) -> Result<T, ServerError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ServerError::Internal(format!("worker task failed: {e}")))?
}
