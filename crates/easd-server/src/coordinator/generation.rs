//! One generation session: the loop of DESIGN §3.1 — propose → verify → decide → commit — for every mode.
//!
//! The coordinator holds the committed tokens (the source of truth). Each worker call carries a prefix claim
//! computed from them, so a worker that lost or diverged from the session is detected and re-fed the full context.
//!
//! Observability stays at the edges of the loop: each step runs in a `step` span (accepted, triggers), each worker
//! call in a client span (`draft.propose`, `verify`) whose context travels in the request's metadata, and the
//! metrics are fed from the same counters as the summary (`record_block`, `send_delta`).

use std::sync::Arc;
use std::time::Instant;

use easd_core::{DraftToken, Mode, TargetPosition, verify_block};
use easd_model::{IncrementalDecoder, Tokenizer};
use easd_proto::v1 as pb;
use easd_telemetry::CoordinatorMetrics;
use tokio::sync::mpsc;
use tonic::{Code, Status};
use tracing::Instrument;
use tracing::field::Empty;

use super::output::StopFilter;
use super::pool::{Lease, Pool, Replica, call_error, is_transport_failure};
use super::request::Plan;
use crate::convert::{draft_token_from_pb, penalty_to_alpha, sampling_to_pb, sparse_to_pb, target_position_from_pb};
use crate::error::ServerError;
use crate::prefix::HashedTokens;

pub type EventSender = mpsc::Sender<Result<pb::GenerateEvent, Status>>;

/// Counters for the final summary.
#[derive(Debug, Default)]
struct Stats {
    blocks: u32,
    drafted: u32,
    accepted: u32,
    easd_triggers: u32,
    target_forwards: u32,
    discarded: u32,
    draft_forward_s: f64,
    target_forward_s: f64,
    failovers: u32,
    triggers: Vec<pb::EasdTrigger>,
    first_token_s: Option<f64>,
}

/// Where a committed token's log probability comes from.
struct Emitted {
    token: u32,
    target: Option<Arc<TargetPosition>>,
}

pub struct Generation {
    plan: Plan,
    drafts: Arc<Pool>,
    verifiers: Arc<Pool>,
    tokenizer: Arc<Tokenizer>,
    session_id: String,
    committed: HashedTokens,
    prompt_len: usize,
    /// How many committed tokens each worker's cache is known to hold (0: send the full context).
    draft_synced: usize,
    verifier_synced: usize,
    /// The replicas this session is pinned to (its KV caches live there); None until first used.
    draft: Option<Lease>,
    verifier: Option<Lease>,
    verifiers_used: Vec<String>,
    notes: Vec<String>,
    /// The mode the client asked for (the plan's mode may fall back to `target`).
    mode_name: &'static str,
    stats: Stats,
    started: Instant,
    metrics: CoordinatorMetrics,
}

impl Generation {
    /// `verifier`: the admitted lease (None in draft mode).
    pub fn new(
        plan: Plan,
        drafts: Arc<Pool>,
        verifiers: Arc<Pool>,
        tokenizer: Arc<Tokenizer>,
        verifier: Option<Lease>,
        metrics: CoordinatorMetrics,
    ) -> Self {
        let committed = HashedTokens::from_tokens(&plan.prompt_tokens);
        let mode_name = plan.mode.name();
        Self {
            session_id: plan.request_id.clone(),
            prompt_len: plan.prompt_tokens.len(),
            committed,
            plan,
            drafts,
            verifiers,
            tokenizer,
            draft_synced: 0,
            verifier_synced: 0,
            verifiers_used: verifier.iter().map(|l| l.replica.url.clone()).collect(),
            draft: None,
            verifier,
            notes: Vec::new(),
            mode_name,
            stats: Stats::default(),
            started: Instant::now(),
            metrics,
        }
    }

    fn generated(&self) -> usize {
        self.committed.len() - self.prompt_len
    }

    /// Runs to completion, streaming deltas; returns the summary (also sent as the last event).
    pub async fn run(mut self, tx: &EventSender) -> Result<pb::Summary, ServerError> {
        let tokenizer = self.tokenizer.clone();
        let mut decoder = IncrementalDecoder::new(&tokenizer);
        let mut filter = StopFilter::new(self.plan.stop.clone());
        let stop_ids = tokenizer.stop_token_ids().to_vec();
        let result: Result<&str, ServerError> = async {
            loop {
                let room = self.plan.max_tokens - self.generated();
                let emitted = self.traced_step(room).await?;
                let mut delta = pb::TextDelta::default();
                let mut finish = None;
                let mut stopped_by_string = false;
                for e in emitted {
                    if stop_ids.contains(&e.token) {
                        finish = Some("stop");
                        break;
                    }
                    self.committed.push(e.token);
                    delta.token_ids.push(e.token);
                    if self.plan.logprobs > 0 {
                        delta.logprobs.push(self.token_info(&e));
                    }
                    let release = filter.push(&decoder.push(e.token)?);
                    delta.text.push_str(&release.text);
                    if release.stopped {
                        (finish, stopped_by_string) = (Some("stop"), true);
                        break;
                    }
                    if self.generated() >= self.plan.max_tokens {
                        finish = Some("length");
                        break;
                    }
                }
                if let Some(reason) = finish {
                    // Release what the decoder and the stop filter still hold, unless a stop string ended the text.
                    if !stopped_by_string {
                        let release = filter.push(&decoder.finish()?);
                        delta.text.push_str(&release.text);
                        if !release.stopped {
                            delta.text.push_str(&filter.flush());
                        }
                    }
                    self.send_delta(tx, delta).await?;
                    return Ok(reason);
                }
                self.send_delta(tx, delta).await?;
            }
        }
        .await;
        self.release_sessions();
        let finish_reason = result?;
        let summary = self.summary(finish_reason);
        Ok(summary)
    }

    async fn send_delta(&mut self, tx: &EventSender, delta: pb::TextDelta) -> Result<(), ServerError> {
        if delta.token_ids.is_empty() && delta.text.is_empty() {
            return Ok(());
        }
        if self.stats.first_token_s.is_none() {
            let ttft_s = self.started.elapsed().as_secs_f64();
            self.stats.first_token_s = Some(ttft_s);
            self.metrics.observe_ttft_seconds(self.mode_name, ttft_s);
        }
        let tokens = delta.token_ids.len() as u64;
        let event = pb::GenerateEvent { event: Some(pb::generate_event::Event::Delta(delta)) };
        tx.send(Ok(event)).await.map_err(|_| ServerError::Unavailable("the client went away".into()))?;
        self.metrics.add_generated_tokens(self.mode_name, tokens);
        Ok(())
    }

    /// [`Self::step`] inside a `step` span (accepted and triggers are recorded once the block is decided), timed.
    async fn traced_step(&mut self, room: usize) -> Result<Vec<Emitted>, ServerError> {
        let span = tracing::info_span!("step", position = self.committed.len(), accepted = Empty, triggers = Empty);
        let started = Instant::now();
        let emitted = self.step(room).instrument(span).await?;
        self.metrics.observe_step_seconds(self.mode_name, started.elapsed().as_secs_f64());
        Ok(emitted)
    }

    /// One step of the loop for the request's mode; returns the tokens to commit, in order.
    async fn step(&mut self, room: usize) -> Result<Vec<Emitted>, ServerError> {
        let count = self.plan.k.min(room).max(1);
        match self.plan.mode.clone() {
            Mode::Target => {
                let positions = self.verify(&[]).await?;
                let p = Arc::new(positions.into_iter().next().expect("one position for an empty block"));
                self.stats.blocks += 1;
                Ok(vec![Emitted { token: p.sample_token, target: Some(p) }])
            }
            Mode::Draft => {
                let drafted = self.propose(count).await?.ok_or_else(|| {
                    ServerError::Unavailable(
                        "no draft replica is available and the request asked for draft mode".into(),
                    )
                })?;
                self.stats.blocks += 1;
                self.draft_synced = self.committed.len() + drafted.len() - 1;
                Ok(drafted.into_iter().map(|d| Emitted { token: d.token, target: None }).collect())
            }
            mode @ (Mode::Sd | Mode::Easd(_)) => {
                let Some(drafted) = self.propose(count).await? else {
                    // Without a draft the target generates alone: slower, never wrong (lossless for sd).
                    self.notes.push(format!(
                        "draft unavailable after {} generated tokens: continued in target mode",
                        self.generated()
                    ));
                    self.plan.mode = Mode::Target;
                    return Box::pin(self.step(room)).await;
                };
                let positions = self.verify(&drafted).await?;
                let first_position = self.committed.len() as u64;
                let outcome = verify_block(
                    &mode,
                    self.plan.sampling.is_greedy(),
                    self.plan.seed,
                    first_position,
                    &drafted,
                    &positions,
                );
                self.record_block(&drafted, &outcome, first_position);
                let base = self.committed.len();
                self.draft_synced = base + outcome.accepted.min(drafted.len() - 1);
                self.verifier_synced = base + outcome.accepted;
                let positions: Vec<Arc<TargetPosition>> = positions.into_iter().map(Arc::new).collect();
                Ok(outcome
                    .tokens
                    .iter()
                    .enumerate()
                    .map(|(i, &token)| Emitted { token, target: Some(positions[i].clone()) })
                    .collect())
            }
        }
    }

    /// Counts a decided block into the summary's stats, the step span and the metrics.
    fn record_block(&mut self, drafted: &[DraftToken], outcome: &easd_core::BlockOutcome, first_position: u64) {
        let triggers = u64::from(outcome.easd_triggered());
        let span = tracing::Span::current();
        span.record("accepted", outcome.accepted);
        span.record("triggers", triggers);
        self.metrics.observe_block(self.mode_name, drafted.len() as u64, outcome.accepted as u64, triggers);
        // Positions 1..=accepted passed; the one after them was evaluated and rejected, if any was.
        let evaluated = outcome.accepted + usize::from(outcome.rejection.is_some());
        for position in 1..=evaluated {
            self.metrics.observe_acceptance_position(position, position <= outcome.accepted);
        }
        self.stats.blocks += 1;
        self.stats.drafted += drafted.len() as u32;
        self.stats.accepted += outcome.accepted as u32;
        self.stats.discarded += outcome.discarded(drafted.len()) as u32;
        if let Some(easd_core::Rejection::Easd { index, draft_entropy, target_entropy, overlap }) = outcome.rejection {
            self.stats.easd_triggers += 1;
            self.stats.triggers.push(pb::EasdTrigger {
                position: (first_position + index as u64) as u32,
                draft_entropy,
                target_entropy,
                overlap,
            });
        }
    }

    /// Claim for a worker that holds `synced` committed tokens: always resend at least the last token.
    fn claim(&self, synced: usize) -> (Option<pb::PrefixClaim>, Vec<u32>, bool) {
        if synced == 0 {
            return (None, self.committed.tokens().to_vec(), true);
        }
        let len = synced.min(self.committed.len() - 1);
        let claim = pb::PrefixClaim { length: len as u32, hash: self.committed.hash_of_prefix(len) };
        (Some(claim), self.committed.tokens()[len..].to_vec(), false)
    }

    /// Drafts `count` tokens; None when no draft replica can serve (the caller falls back to target mode).
    async fn propose(&mut self, count: usize) -> Result<Option<Vec<DraftToken>>, ServerError> {
        let pool = self.drafts.clone();
        let mut failed: Vec<String> = Vec::new();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            if self.draft.is_none() {
                match pool.try_lease(&failed, false) {
                    Some(lease) => {
                        self.draft = Some(lease);
                        self.draft_synced = 0;
                    }
                    None => return Ok(None),
                }
            }
            let replica = self.draft.as_ref().expect("leased above").replica.clone();
            if attempt > 1 {
                self.metrics.inc_retry("draft");
            }
            let result = match pool.ensure_checked(&replica).await {
                Ok(()) => self.propose_on(&replica, count).await.map_err(|s| call_error(&replica.url, s)),
                Err(e) => Err(e),
            };
            match result {
                Ok((tokens, seconds)) => {
                    if tokens.len() != count {
                        return Err(ServerError::Internal(format!(
                            "draft sent {} tokens, {count} asked",
                            tokens.len()
                        )));
                    }
                    self.stats.draft_forward_s += seconds;
                    self.draft_synced = self.committed.len();
                    return tokens.into_iter().map(draft_token_from_pb).collect::<Result<_, _>>().map(Some);
                }
                Err(ServerError::Worker(s)) if session_lost(&s) && attempt <= pool.config.backoff.max_attempts => {
                    tracing::info!(session = %self.session_id, status = %s.message(), "draft lost the session; resending the full context");
                    self.draft_synced = 0;
                }
                Err(e) if is_transport_failure(&e) || matches!(e, ServerError::Incompatible(_)) => {
                    tracing::warn!(session = %self.session_id, error = %e, "draft replica failed");
                    replica.mark_failed();
                    failed.push(replica.url.clone());
                    self.draft = None;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One `Propose` call in a `draft.propose` client span, whose context the draft continues.
    async fn propose_on(&self, replica: &Replica, count: usize) -> Result<(Vec<pb::DraftToken>, f64), Status> {
        let span = tracing::info_span!("draft.propose", otel.kind = "client", replica = %replica.url, count);
        self.propose_call(replica, count).instrument(span).await
    }

    async fn propose_call(&self, replica: &Replica, count: usize) -> Result<(Vec<pb::DraftToken>, f64), Status> {
        let (claim, new_tokens, full_context) = self.claim(self.draft_synced);
        let mut req = tonic::Request::new(pb::ProposeRequest {
            session_id: self.session_id.clone(),
            claim,
            new_tokens,
            full_context,
            count: count as u32,
            sampling: Some(sampling_to_pb(&self.plan.sampling, self.plan.seed)),
            proposal_support: easd_core::DEFAULT_K_Q as u32,
            top_n: self.plan.easd.top_n as u32,
        });
        req.set_timeout(self.drafts.config.call_timeout);
        easd_telemetry::inject_context(&mut req);
        let mut stream = replica.draft().propose(req).await?.into_inner();
        let mut tokens = Vec::with_capacity(count);
        let mut seconds = 0.0;
        while let Some(t) = stream.message().await? {
            seconds += f64::from(t.forward_seconds);
            tokens.push(t);
        }
        Ok((tokens, seconds))
    }

    /// Scores `block` on the pinned verifier; on a transport failure the session moves to another healthy replica,
    /// which rebuilds the cache from the committed tokens. Gives up with UNAVAILABLE after the retry budget.
    async fn verify(&mut self, block: &[DraftToken]) -> Result<Vec<TargetPosition>, ServerError> {
        let pool = self.verifiers.clone();
        let backoff = pool.config.backoff;
        let mut last_error = None;
        for attempt in 1..=backoff.max_attempts {
            if self.verifier.is_none() {
                let failed_url = last_error.as_ref().map(|(url, _): &(String, ServerError)| url.clone());
                let exclude: Vec<String> = failed_url.into_iter().collect();
                // Prefer another replica; the failed one is retried only when it is the only one left.
                match pool.try_lease(&exclude, false).or_else(|| pool.try_lease(&[], false)) {
                    Some(lease) => {
                        if !self.verifiers_used.contains(&lease.replica.url) {
                            self.verifiers_used.push(lease.replica.url.clone());
                        }
                        if last_error.is_some() {
                            self.stats.failovers += 1;
                            self.metrics.inc_failover();
                            tracing::warn!(session = %self.session_id, to = %lease.replica.url, "failing over");
                        }
                        self.verifier = Some(lease);
                        self.verifier_synced = 0;
                    }
                    None => {
                        backoff.wait(attempt).await;
                        pool.probe_all().await;
                        continue;
                    }
                }
            }
            let replica = self.verifier.as_ref().expect("leased above").replica.clone();
            if attempt > 1 {
                self.metrics.inc_retry("verifier");
            }
            let result = match pool.ensure_checked(&replica).await {
                Ok(()) => self.verify_on(&replica, block).await.map_err(|s| call_error(&replica.url, s)),
                Err(e) => Err(e),
            };
            match result {
                Ok(resp) => {
                    if resp.positions.len() != block.len() + 1 {
                        return Err(ServerError::Internal(format!(
                            "verifier sent {} positions for a block of {}",
                            resp.positions.len(),
                            block.len()
                        )));
                    }
                    self.stats.target_forwards += 1;
                    self.stats.target_forward_s += f64::from(resp.forward_seconds);
                    self.verifier_synced = self.committed.len();
                    return Ok(resp.positions.into_iter().map(target_position_from_pb).collect());
                }
                Err(ServerError::Worker(s)) if session_lost(&s) => {
                    tracing::info!(session = %self.session_id, status = %s.message(), "verifier lost the session; resending the full context");
                    self.verifier_synced = 0;
                }
                Err(e) if is_transport_failure(&e) || matches!(e, ServerError::Incompatible(_)) => {
                    tracing::warn!(session = %self.session_id, error = %e, "verifier replica failed");
                    replica.mark_failed();
                    self.verifier = None;
                    last_error = Some((replica.url.clone(), e));
                }
                Err(e) => return Err(e),
            }
        }
        let reason = last_error.map_or_else(|| "no replica was healthy".to_owned(), |(_, e)| e.to_string());
        Err(ServerError::Unavailable(format!(
            "no verifier replica could serve the session after {} attempts: {reason}",
            backoff.max_attempts
        )))
    }

    /// One `Verify` call in a `verify` client span, whose context the verifier continues.
    async fn verify_on(&self, replica: &Replica, block: &[DraftToken]) -> Result<pb::VerifyResponse, Status> {
        let span = tracing::info_span!("verify", otel.kind = "client", replica = %replica.url, block_len = block.len());
        self.verify_call(replica, block).instrument(span).await
    }

    async fn verify_call(&self, replica: &Replica, block: &[DraftToken]) -> Result<pb::VerifyResponse, Status> {
        let (claim, new_tokens, full_context) = self.claim(self.verifier_synced);
        let mut req = tonic::Request::new(pb::VerifyRequest {
            session_id: self.session_id.clone(),
            claim,
            new_tokens,
            full_context,
            block: block
                .iter()
                .map(|d| pb::DraftedToken { token: d.token, proposal: Some(sparse_to_pb(&d.proposal)) })
                .collect(),
            sampling: Some(sampling_to_pb(&self.plan.sampling, self.plan.seed)),
            top_n: self.plan.easd.top_n as u32,
            penalty_alpha: penalty_to_alpha(self.plan.easd.penalty),
            logprobs: self.plan.logprobs as u32,
        });
        req.set_timeout(self.verifiers.config.call_timeout);
        easd_telemetry::inject_context(&mut req);
        Ok(replica.verifier().verify(req).await?.into_inner())
    }

    fn token_info(&self, e: &Emitted) -> pb::TokenInfo {
        let text = |t: u32| self.tokenizer.token_text(t).unwrap_or_default();
        let Some(p) = &e.target else {
            return pb::TokenInfo { token: e.token, text: text(e.token), logprob: f32::NAN, top_logprobs: vec![] };
        };
        pb::TokenInfo {
            token: e.token,
            text: text(e.token),
            logprob: p.logprob_of(e.token).unwrap_or(f32::NEG_INFINITY),
            top_logprobs: p
                .top_logprobs
                .iter()
                .take(self.plan.logprobs)
                .map(|&(token, logprob)| pb::TopLogprob { token, text: text(token), logprob })
                .collect(),
        }
    }

    /// Frees the session's caches on the workers it is pinned to, without making the client wait.
    fn release_sessions(&self) {
        let req = pb::ReleaseRequest { session_id: self.session_id.clone() };
        let draft = self.draft.as_ref().map(|l| l.replica.draft());
        let verifier = self.verifier.as_ref().map(|l| l.replica.verifier());
        let timeout = self.verifiers.config.call_timeout.min(std::time::Duration::from_secs(5));
        tokio::spawn(async move {
            if let Some(mut d) = draft {
                let _ = tokio::time::timeout(timeout, d.release(req.clone())).await;
            }
            if let Some(mut v) = verifier {
                let _ = tokio::time::timeout(timeout, v.release(req)).await;
            }
        });
    }

    fn summary(&self, finish_reason: &str) -> pb::Summary {
        let wall_s = self.started.elapsed().as_secs_f64();
        let generated = self.generated() as u32;
        let s = &self.stats;
        pb::Summary {
            mode: self.mode_name.to_owned(),
            prompt_tokens: self.prompt_len as u32,
            generated_tokens: generated,
            wall_s,
            tokens_per_s: if wall_s > 0.0 { f64::from(generated) / wall_s } else { 0.0 },
            blocks: s.blocks,
            drafted_tokens: s.drafted,
            accepted_tokens: s.accepted,
            acceptance_rate: if s.drafted > 0 { f64::from(s.accepted) / f64::from(s.drafted) } else { 0.0 },
            mean_accepted_len: if s.blocks > 0 { f64::from(s.accepted) / f64::from(s.blocks) } else { 0.0 },
            easd_triggers: s.easd_triggers,
            target_forwards: s.target_forwards,
            discarded_tokens: s.discarded,
            verifiers: self.verifiers_used.clone(),
            failovers: s.failovers,
            finish_reason: finish_reason.to_owned(),
            time_to_first_token_s: s.first_token_s.unwrap_or(wall_s),
            draft_forward_seconds: s.draft_forward_s,
            target_forward_seconds: s.target_forward_s,
            overhead_seconds: (wall_s - s.draft_forward_s - s.target_forward_s).max(0.0),
            triggers: s.triggers.clone(),
            note: self.notes.join("; "),
            request_id: self.plan.request_id.clone(),
        }
    }
}

/// The worker no longer holds (or never held) what we claimed: safe to resend the full context.
fn session_lost(s: &Status) -> bool {
    matches!(s.code(), Code::NotFound | Code::FailedPrecondition) && !s.message().starts_with("incompatible")
}
