//! A session's hold on one worker: the lease on the replica its KV cache lives on, what that cache is known to hold,
//! and the one call-with-failover every draft and verifier request goes through.
//!
//! What a worker holds is tracked as a token sequence (`held`), not a length: with the pipelined loop a worker also
//! holds tokens that are not committed (a block being verified, the draft's guess of its bonus, a block drafted
//! ahead). Each request claims the longest prefix that `held` shares with the context it needs (always leaving the
//! last token to be resent: its logits are not cached), so rolling back after a rejection, after a dropped pre-draft
//! or after a failover is the same single rule — and the only writes to `held` are in this file:
//!
//! * before a call is awaited, `held` is cut to the claimed prefix: whether the call then completes, fails or is
//!   cancelled half-way (a dropped pre-draft), the worker holds at least that;
//! * after a call succeeds, the caller records what the worker appended ([`PinnedWorker::now_holds`]);
//! * a lost session or a new replica empties it: the next request carries the full context;
//! * a long run of new tokens (a prompt, a context resent) is fed first with `Prefill`, and `held` follows the
//!   worker's progress reports piece by piece: a prefill cut short by a failure or a stall is resumed from what the
//!   worker reported, never restarted from zero on the same replica.

use std::future::Future;
use std::sync::Arc;

use easd_proto::v1 as pb;
use easd_telemetry::CoordinatorMetrics;
use tonic::Status;

use super::pool::{Lease, Pool, Replica, Role, SessionPin, call_error, is_transport_failure};
use crate::error::{ServerError, is_session_lost};
use crate::prefix::HashedTokens;

/// The context part of a worker request: a claim on what the worker holds, and the tokens after it.
#[derive(Clone, Debug, PartialEq)]
pub struct ContextPart {
    pub claim: Option<pb::PrefixClaim>,
    pub new_tokens: Vec<u32>,
    pub full_context: bool,
}

impl ContextPart {
    fn claimed_len(&self) -> usize {
        self.claim.as_ref().map_or(0, |c| c.length as usize)
    }
}

/// What to claim from a worker that holds `held` (a prefix of what it really holds) for a request on `context`.
pub fn context_part(held: &HashedTokens, context: &HashedTokens) -> ContextPart {
    let common = held.common_prefix_len(context).min(context.len().saturating_sub(1));
    if common == 0 {
        return ContextPart { claim: None, new_tokens: context.tokens().to_vec(), full_context: true };
    }
    let claim = pb::PrefixClaim { length: common as u32, hash: context.hash_of_prefix(common) };
    ContextPart { claim: Some(claim), new_tokens: context.tokens()[common..].to_vec(), full_context: false }
}

pub struct PinnedWorker {
    pool: Arc<Pool>,
    session_id: String,
    lease: Option<Lease>,
    /// The session's entry on the replica it was last sent to: kept alive there until released.
    pin: Option<SessionPin>,
    held: HashedTokens,
    /// Every replica that served the session, in order.
    used: Vec<String>,
    failovers: u32,
    metrics: CoordinatorMetrics,
}

impl PinnedWorker {
    /// `lease`: the replica admission chose (None: leased on the first call).
    pub fn new(pool: Arc<Pool>, session_id: String, lease: Option<Lease>, metrics: CoordinatorMetrics) -> Self {
        let used = lease.iter().map(|l| l.replica.url.clone()).collect();
        Self { pool, session_id, lease, pin: None, held: HashedTokens::default(), used, failovers: 0, metrics }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Sessions this coordinator has live on the replica the session is pinned to (0 before the first lease).
    pub fn live_sessions(&self) -> usize {
        self.lease.as_ref().map_or(0, |l| l.replica.live_sessions())
    }

    pub fn replicas_used(&self) -> &[String] {
        &self.used
    }

    pub fn failovers(&self) -> u32 {
        self.failovers
    }

    /// After a successful call on `context`: the worker now holds `context` followed by `appended`.
    pub fn now_holds(&mut self, context: &HashedTokens, appended: &[u32]) {
        self.held.truncate(self.held.common_prefix_len(context));
        self.held.extend(&context.tokens()[self.held.len()..]);
        self.held.extend(appended);
    }

    /// Sends one request for `context` with `send`, on the pinned replica. A lost session is re-sent with the full
    /// context; a transport failure or an incompatible replica moves the session to another healthy replica (the
    /// verifier waits with backoff while none is healthy). `Ok(None)`: no draft replica can serve (the caller
    /// continues without a draft); a verifier gives up with UNAVAILABLE after the attempt budget.
    pub async fn call<T, F, Fut>(&mut self, context: &HashedTokens, mut send: F) -> Result<Option<T>, ServerError>
    where
        F: FnMut(Arc<Replica>, ContextPart) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let role = self.pool.role;
        let backoff = self.pool.config.backoff;
        let mut failed: Vec<String> = Vec::new();
        let mut last_error: Option<ServerError> = None;
        for attempt in 1..=backoff.max_attempts {
            if self.lease.is_none() {
                match self.lease_another(&failed) {
                    Some(lease) => {
                        if last_error.is_some() {
                            self.failovers += 1;
                            self.metrics.inc_failover();
                            tracing::warn!(session = %self.session_id, role = role.name(), to = %lease.replica.url, "failing over");
                        }
                        if !self.used.contains(&lease.replica.url) {
                            self.used.push(lease.replica.url.clone());
                        }
                        self.lease = Some(lease);
                        self.held = HashedTokens::default();
                    }
                    None if role == Role::Draft => return Ok(None),
                    None => {
                        backoff.wait(attempt).await;
                        self.pool.probe_all().await;
                        continue;
                    }
                }
            }
            let replica = self.lease.as_ref().expect("leased above").replica.clone();
            if self.pin.as_ref().is_none_or(|p| !Arc::ptr_eq(&p.replica, &replica)) {
                self.pin = Some(SessionPin::new(replica.clone(), &self.session_id));
            }
            if attempt > 1 {
                self.metrics.inc_retry(role.name());
            }
            let part = context_part(&self.held, context);
            // Whatever happens to this call — even if it is dropped half-way — the worker keeps the claimed prefix.
            self.held.truncate(part.claimed_len());
            let result = match self.pool.ensure_checked(&replica).await {
                Ok(()) => match self.prefill(&replica, context, part).await {
                    Ok(part) => send(replica.clone(), part).await.map_err(|s| call_error(&replica.url, s)),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            match result {
                Ok(value) => return Ok(Some(value)),
                Err(ServerError::Worker(s)) if is_session_lost(&s) => {
                    tracing::info!(session = %self.session_id, role = role.name(), status = %s.message(), "the worker lost the session; resending the full context");
                    self.held = HashedTokens::default();
                }
                Err(e) if is_transport_failure(&e) || matches!(e, ServerError::Incompatible(_)) => {
                    tracing::warn!(session = %self.session_id, role = role.name(), error = %e, "replica failed");
                    replica.mark_failed();
                    failed.push(replica.url.clone());
                    self.lease = None;
                    last_error = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        if role == Role::Draft {
            return Ok(None);
        }
        let reason = last_error.map_or_else(|| "no replica was healthy".to_owned(), |e| e.to_string());
        Err(ServerError::Unavailable(format!(
            "no {} replica could serve the session after {} attempts (--max-attempts): {reason}",
            role.name(),
            backoff.max_attempts
        )))
    }

    /// Feeds a long `part` (more than `prefill_above_tokens` new tokens) with `Prefill` before the call — all but the
    /// last token, whose logits the call needs — and returns the call's part after it. `held` follows each progress
    /// report, so a prefill that fails half-way is resumed from there. The deadline is on each report, not on the
    /// whole prefill: a live worker reports after every piece and, while it works for other sessions, every
    /// [`crate::prefill::HEARTBEAT`]; silence for the call timeout means the worker stalled. A worker without the
    /// RPC (an older version) gets the whole part in the call, as before.
    async fn prefill(
        &mut self,
        replica: &Arc<Replica>,
        context: &HashedTokens,
        part: ContextPart,
    ) -> Result<ContextPart, ServerError> {
        if part.new_tokens.len() <= self.pool.config.prefill_above_tokens {
            return Ok(part);
        }
        let timeout = self.pool.config.call_timeout;
        let url = &replica.url;
        let stalled = || {
            ServerError::DeadlineExceeded(format!(
                "{url} made no progress for {:.1} s (the coordinator's call timeout, --call-timeout-s)",
                timeout.as_secs_f64()
            ))
        };
        let fed = part.new_tokens.len() - 1;
        let target = context.len() - 1;
        let started = std::time::Instant::now();
        let mut req = tonic::Request::new(pb::PrefillRequest {
            session_id: self.session_id.clone(),
            claim: part.claim,
            new_tokens: part.new_tokens[..fed].to_vec(),
            full_context: part.full_context,
        });
        // A client span whose context the worker continues.
        tracing::info_span!("prefill", otel.kind = "client", replica = %url, tokens = fed)
            .in_scope(|| easd_telemetry::inject_context(&mut req));
        let response = match self.pool.role {
            Role::Draft => tokio::time::timeout(timeout, replica.draft().prefill(req)).await,
            Role::Verifier => tokio::time::timeout(timeout, replica.verifier().prefill(req)).await,
        };
        let mut stream = match response.map_err(|_| stalled())? {
            Ok(stream) => stream.into_inner(),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                tracing::debug!(replica = %url, "the worker has no Prefill: the call carries the whole context");
                return Ok(context_part(&self.held, context));
            }
            Err(status) => return Err(call_error(url, status)),
        };
        loop {
            let progress = tokio::time::timeout(timeout, stream.message())
                .await
                .map_err(|_| stalled())?
                .map_err(|s| call_error(url, s))?
                .ok_or_else(|| ServerError::Unavailable(format!("{url} ended a prefill before it was done")))?;
            let held = progress.held as usize;
            if held > target {
                return Err(ServerError::Internal(format!("{url} reports {held} tokens held of {target} sent")));
            }
            // A heartbeat repeats what the worker held already.
            if held > self.held.len() {
                let from = self.held.len();
                self.held.extend(&context.tokens()[from..held]);
            }
            if progress.done {
                break;
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!(session = %self.session_id, role = self.pool.role.name(), replica = %url, tokens = fed, seconds, "prefilled");
        Ok(context_part(&self.held, context))
    }

    /// Another healthy replica: one that has not failed this call; a verifier takes a failed one back when it is
    /// the only one left (a draft lets the session continue without it instead).
    fn lease_another(&self, failed: &[String]) -> Option<Lease> {
        self.pool.try_lease(failed, false).or_else(|| match self.pool.role {
            Role::Verifier => self.pool.try_lease(&[], false),
            Role::Draft => None,
        })
    }

    /// Frees the session's cache on the pinned replica, without making anyone wait.
    pub fn release(&mut self) {
        // The slot is freed now (the lease drops here); the cache is freed when the worker gets the request.
        self.pin = None;
        let Some(replica) = self.lease.take().map(|lease| lease.replica.clone()) else { return };
        let req = pb::ReleaseRequest { session_id: self.session_id.clone() };
        let timeout = self.pool.config.call_timeout.min(std::time::Duration::from_secs(5));
        let role = self.pool.role;
        tokio::spawn(async move {
            let _ = match role {
                Role::Draft => tokio::time::timeout(timeout, replica.draft().release(req)).await.map(|_| ()),
                Role::Verifier => tokio::time::timeout(timeout, replica.verifier().release(req)).await.map(|_| ()),
            };
        });
        self.held = HashedTokens::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(tokens: &[u32]) -> HashedTokens {
        HashedTokens::from_tokens(tokens)
    }

    #[test]
    fn a_fresh_worker_gets_the_full_context() {
        let part = context_part(&HashedTokens::default(), &seq(&[1, 2, 3]));
        assert_eq!(part, ContextPart { claim: None, new_tokens: vec![1, 2, 3], full_context: true });
    }

    #[test]
    fn the_claim_is_the_shared_prefix_and_the_last_token_is_always_resent() {
        // The worker holds exactly the context: claim all but the last token.
        let part = context_part(&seq(&[1, 2, 3]), &seq(&[1, 2, 3]));
        assert_eq!((part.claimed_len(), part.new_tokens), (2, vec![3]));
        // It holds a rejected block beyond the shared prefix: roll back to where they agree.
        let part = context_part(&seq(&[1, 2, 3, 9, 9]), &seq(&[1, 2, 3, 4]));
        assert_eq!((part.claimed_len(), part.new_tokens), (3, vec![4]));
        assert_eq!(part.claim.unwrap().hash, seq(&[1, 2, 3]).hash_of_prefix(3));
    }

    #[tokio::test]
    async fn now_holds_records_the_context_and_what_the_worker_appended() {
        let urls = ["127.0.0.1:1".to_owned()];
        let pool = Pool::new(Role::Draft, &urls, "fp", Default::default(), None).unwrap();
        let mut w = PinnedWorker::new(pool, "s".into(), None, CoordinatorMetrics::new());
        w.now_holds(&seq(&[1, 2]), &[7, 8]);
        assert_eq!(w.held.tokens(), &[1, 2, 7, 8]);
        w.now_holds(&seq(&[1, 2, 7, 5]), &[]);
        assert_eq!(w.held.tokens(), &[1, 2, 7, 5]);
    }
}
