//! One generation session: the loop of DESIGN §3.1 — propose → verify → decide → commit — for every mode.
//!
//! The coordinator holds the committed tokens (the source of truth). Each worker call carries a prefix claim
//! computed from them ([`super::pinned`]), so a worker that lost or diverged from the session is detected and re-fed
//! the full context. The loop talks to the two sides through [`DraftSide`] and [`VerifierSide`].
//!
//! **Pipelined loop** (DESIGN §3.4; sd and easd, on unless the coordinator or the request turns it off): while the
//! verifier scores block i, the draft drafts from the committed prefix + block i + its own next token — its guess of
//! the bonus — and then block i+1. If block i is accepted whole and the target's bonus equals the guess, the committed
//! tokens are exactly the context block i+1 was drafted from, so it is the block the sequential loop would have
//! drafted (every draw is keyed by seed, position and purpose, DESIGN §2.4): it is verified next, with the draft
//! already drafting ahead again. Anything else cancels the pre-draft, and drafting restarts from the corrected
//! prefix. Same blocks, same verifier calls, same decisions: same tokens; only the timing changes. In `easd` a block
//! holding a position where the EASD rule can fire bets on a correction there instead ([`Bet`]): its pre-draft
//! starts after the draft's second choice at that position, and is kept when the target emits exactly that.
//!
//! **Flexible blocks** (pipelined greedy `sd` with `max_k` > `k`): the draft is asked for up to `max_k` tokens ahead,
//! and the next block takes what it made while the verifier was busy — at least its floor, waiting for those if need
//! be, and past the floor only while the draft is sure (entropy ≤ [`GROW_MAX_ENTROPY`]). A fast draft thus fills the
//! verifier's time instead of idling. The least a block takes is its floor: k, or with adaptive blocks (the default)
//! the length the session's measured costs favour ([`BlockFloor`]). And the first block is empty: the verifier's
//! prefill yields the first token while the draft, after its own prefill, drafts ahead from its guess of that token —
//! the two prefills overlap instead of following each other. Greedy `sd` tokens are the target's argmax whatever the
//! blocks are (with the batch-invariant runtime, bit for bit), so only the block boundaries and the timing change.
//! Other requests keep the sequential loop's blocks: where a block ends decides which draws a sampled position uses,
//! and which positions are bonus positions — never tested by the EASD rule — in `easd`.
//!
//! Observability stays at the edges of the loop: each step runs in a `step` span (accepted, triggers), each worker
//! call in a client span (`draft.propose`, `verify`) whose context travels in the request's metadata, and the
//! metrics are fed from the same counters as the summary (`record_block`, `send_delta`).

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Instant;

use easd_core::{BlockOutcome, DraftToken, Mode, TargetPosition, verify_block};
use easd_model::{IncrementalDecoder, Tokenizer};
use easd_proto::v1 as pb;
use easd_telemetry::CoordinatorMetrics;
use tokio::sync::mpsc;
use tonic::Status;
use tracing::Instrument;
use tracing::field::Empty;

use super::block_floor::BlockFloor;
use super::output::StopFilter;
use super::request::Plan;
use super::sides::{Cutoff, DraftSide, Drafted, Scored, VerifierSide};
use crate::error::ServerError;
use crate::prefix::HashedTokens;

pub type EventSender = mpsc::Sender<Result<pb::GenerateEvent, Status>>;

/// The draft entropy (nats, H(q̂)) up to which a flexible block grows past k.
const GROW_MAX_ENTROPY: f32 = 0.5;

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
    predrafts_kept: u32,
    /// Of `predrafts_kept`, those drafted for a correction ([`Bet::Correction`]).
    corrections_kept: u32,
    predrafts_dropped: u32,
    /// Steps run by the target alone because the verifier was busy with other sessions.
    unspeculated: u32,
    triggers: Vec<pb::EasdTrigger>,
    first_token_s: Option<f64>,
}

/// Where a committed token's log probability comes from.
struct Emitted {
    token: u32,
    target: Option<Arc<TargetPosition>>,
}

/// The outcome of a block that the pipelined loop drafts the next block for, while the block is verified.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Bet {
    /// The block is kept whole: the pre-draft continues the block with the draft's guess of the bonus, then the next
    /// block.
    Whole,
    /// The block's drafted token `at` is rejected (SD test or EASD rule) and replaced by `token`, the draft's own next
    /// choice there, after every token before it was accepted: the pre-draft is the next block after that correction.
    Correction { at: usize, token: u32 },
}

impl Bet {
    /// Tokens the block emits if the bet comes true: all drafted + the bonus, or those before `at` + the correction.
    fn emits(self, block_len: usize) -> usize {
        match self {
            Bet::Whole => block_len + 1,
            Bet::Correction { at, .. } => at + 1,
        }
    }

    /// The tokens after the committed ones that the pre-draft continues: the block, or its part before `at` and the
    /// correction.
    fn continued(self, block: &[DraftToken]) -> Vec<u32> {
        let (kept, correction) = match self {
            Bet::Whole => (block, None),
            Bet::Correction { at, token } => (&block[..at], Some(token)),
        };
        kept.iter().map(|d| d.token).chain(correction).collect()
    }

    /// Tokens the pre-draft makes before the next block: the guess of the bonus, when betting on the block kept whole.
    fn guess(self) -> usize {
        usize::from(self == Bet::Whole)
    }
}

/// The next block, when the pipelined loop drafted it while the previous one was being verified.
enum Ahead {
    /// Not drafted (sequential loop, or no room left after this block).
    NotDrafted,
    /// The bet came true (kept whole with the bonus guessed right, or the correction it named): the pre-drafted
    /// tokens after the guess, if any, are the next block.
    Kept(Drafted),
    /// Anything else: the pre-draft was cancelled (or its result discarded); drafting restarts from the corrected
    /// prefix, and the draft's claim rolls its cache back.
    Dropped { forward_s: f64 },
    /// No draft replica could serve the pre-draft: the loop goes on in target mode.
    NoDraft,
}

pub struct Generation<D, V> {
    plan: Plan,
    draft: D,
    verifier: V,
    tokenizer: Arc<Tokenizer>,
    committed: HashedTokens,
    prompt_len: usize,
    /// Draft the next block while the verifier scores this one (sd / easd).
    pipeline: bool,
    /// Flexible blocks (see the module doc): pipelined greedy `sd` with `plan.max_k` > `plan.k`.
    flexible: bool,
    /// The adaptive floor of flexible blocks (`plan.adaptive_blocks`); without it the floor is `plan.k`.
    block_floor: Option<BlockFloor>,
    /// The next block, drafted ahead and kept (pipelined loop).
    ahead: Option<Vec<DraftToken>>,
    notes: Vec<String>,
    /// The mode the client asked for (the plan's mode may fall back to `target`).
    mode_name: &'static str,
    stats: Stats,
    started: Instant,
    metrics: CoordinatorMetrics,
}

impl<D: DraftSide, V: VerifierSide> Generation<D, V> {
    /// `pipeline`: draft block i+1 while block i is verified (only sd and easd speculate).
    pub fn new(
        plan: Plan,
        draft: D,
        verifier: V,
        tokenizer: Arc<Tokenizer>,
        metrics: CoordinatorMetrics,
        pipeline: bool,
    ) -> Self {
        let committed = HashedTokens::from_tokens(&plan.prompt_tokens);
        let mode_name = plan.mode.name();
        let pipeline = pipeline && matches!(plan.mode, Mode::Sd | Mode::Easd(_));
        let flexible = pipeline && matches!(plan.mode, Mode::Sd) && plan.sampling.is_greedy() && plan.max_k > plan.k;
        let block_floor = (flexible && plan.adaptive_blocks).then(|| BlockFloor::new(plan.k));
        Self {
            flexible,
            block_floor,
            prompt_len: plan.prompt_tokens.len(),
            committed,
            plan,
            draft,
            verifier,
            tokenizer,
            pipeline,
            ahead: None,
            notes: Vec::new(),
            mode_name,
            stats: Stats::default(),
            started: Instant::now(),
            metrics,
        }
    }

    /// The most tokens a block drafted ahead may hold: `plan.max_k` with flexible blocks, else `plan.k`.
    fn grow_to(&self) -> usize {
        if self.flexible { self.plan.max_k } else { self.plan.k }
    }

    /// The fewest drafted tokens the next block takes: the adaptive floor, else `plan.k`.
    fn least_block(&self) -> usize {
        self.block_floor.as_ref().map_or(self.plan.k, BlockFloor::floor)
    }

    /// What the pre-draft of `block` bets on. In `easd` the EASD rule can fire only where the draft's entropy reaches
    /// τ_draft, and fires there often (both models unsure, agreeing on their candidates); where it fires, or the SD
    /// test rejects, the target's replacement is usually the draft's own next choice. So a block with such a
    /// position bets on that correction at the first of them; any other block on being kept whole.
    fn bet(&self, block: &[DraftToken]) -> Bet {
        let Mode::Easd(params) = &self.plan.mode else { return Bet::Whole };
        let Some((at, weak)) = block.iter().enumerate().find(|(_, d)| d.entropy >= params.tau_draft) else {
            return Bet::Whole;
        };
        match weak.top_n.iter().find(|&&t| t != weak.token) {
            Some(&token) => Bet::Correction { at, token },
            None => Bet::Whole,
        }
    }

    fn generated(&self) -> usize {
        self.committed.len() - self.prompt_len
    }

    /// Runs to completion, streaming deltas; returns the summary (also sent as the last event). A client that goes
    /// away ends the generation at once, even with a block in flight.
    pub async fn run(mut self, tx: &EventSender) -> Result<pb::Summary, ServerError> {
        let tokenizer = self.tokenizer.clone();
        let mut decoder = IncrementalDecoder::new(&tokenizer);
        let mut filter = StopFilter::new(self.plan.stop.clone());
        let stop_ids = tokenizer.stop_token_ids().to_vec();
        let result: Result<&str, ServerError> = async {
            loop {
                let room = self.plan.max_tokens - self.generated();
                let emitted = tokio::select! {
                    emitted = self.traced_step(room) => emitted?,
                    () = tx.closed() => return Err(client_gone()),
                };
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
        self.draft.release();
        self.verifier.release();
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
        tx.send(Ok(event)).await.map_err(|_| client_gone())?;
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
        match self.plan.mode.clone() {
            Mode::Target => self.target_step().await,
            Mode::Draft => {
                let count = self.plan.k.min(room).max(1);
                let drafted = self.draft.propose(&self.committed, count, None).await?.ok_or_else(|| {
                    ServerError::Unavailable(
                        "no draft replica is available and the request asked for draft mode".into(),
                    )
                })?;
                self.stats.blocks += 1;
                self.stats.draft_forward_s += drafted.forward_s;
                Ok(drafted.tokens.into_iter().map(|d| Emitted { token: d.token, target: None }).collect())
            }
            mode @ (Mode::Sd | Mode::Easd(_)) => self.speculative_step(&mode, room).await,
        }
    }

    /// The target alone: one token from an empty block's bonus position.
    async fn target_step(&mut self) -> Result<Vec<Emitted>, ServerError> {
        let scored = self.verifier.verify(&self.committed, &[]).await?;
        self.stats.target_forwards += 1;
        self.stats.target_forward_s += scored.forward_s;
        self.stats.blocks += 1;
        let p = Arc::new(scored.positions.into_iter().next().expect("one position for an empty block"));
        Ok(vec![Emitted { token: p.sample_token, target: Some(p) }])
    }

    /// propose (or take the block drafted ahead) → verify (drafting the next block meanwhile, when pipelined) →
    /// decide. Pipelined or not, the same blocks are verified (flexible blocks aside, which only greedy requests get),
    /// so the same tokens come out: only the timing differs.
    async fn speculative_step(&mut self, mode: &Mode, room: usize) -> Result<Vec<Emitted>, ServerError> {
        // Under a large batch the target alone is cheaper (plan.speculation_off_at: greedy sd only, same tokens). A
        // block already drafted ahead is verified first: nothing is in flight once it is decided.
        let off_at = self.plan.speculation_off_at;
        let exact = matches!(mode, Mode::Sd) && self.plan.sampling.is_greedy();
        if exact && off_at > 0 && self.ahead.is_none() && self.verifier.live_sessions() >= off_at {
            self.stats.unspeculated += 1;
            return self.target_step().await;
        }
        let least = self.least_block();
        let count = least.min(room).max(1);
        let first = self.generated() == 0;
        let block = match self.ahead.take() {
            Some(block) => block,
            // The verifier's prefill gives the first token while the draft drafts ahead from its guess of it.
            None if self.flexible && first => Vec::new(),
            None => match self.propose_block(count, first).await? {
                Some(drafted) => {
                    self.stats.draft_forward_s += drafted.forward_s;
                    if let (Some(f), Some((tokens, seconds))) = (&mut self.block_floor, drafted.decode_time()) {
                        f.observe_draft(tokens, seconds);
                    }
                    drafted.tokens
                }
                None => {
                    // Without a draft the target generates alone: slower, never wrong (lossless for sd).
                    self.notes.push(format!(
                        "draft unavailable after {} generated tokens: continued in target mode",
                        self.generated()
                    ));
                    self.plan.mode = Mode::Target;
                    return self.target_step().await;
                }
            },
        };
        // A flexible block's floor may have moved since it was drafted ahead.
        let fewest = if self.flexible { 1 } else { count };
        debug_assert!(
            ((fewest..=self.grow_to().max(count)).contains(&block.len()) || (block.is_empty() && first))
                && block.len() <= room,
            "a block has k tokens (flexible: up to max_k, or none at first) and fits"
        );
        let first_position = self.committed.len() as u64;
        let (greedy, seed) = (self.plan.sampling.is_greedy(), self.plan.seed);
        let decide = |positions: &[TargetPosition]| verify_block(mode, greedy, seed, first_position, &block, positions);
        // Room for another block if the bet comes true (kept whole: all accepted + the bonus; a correction at j: j
        // accepted + the correction), and the tokens that block may hold.
        let bet = self.bet(&block);
        let after = room.saturating_sub(bet.emits(block.len()));
        let ahead = least.min(after)..=self.grow_to().min(after);
        let (scored, outcome, ahead) = if self.pipeline && *ahead.start() > 0 {
            let sides = (&mut self.draft, &mut self.verifier);
            verify_drafting_ahead(sides, &self.committed, &block, bet, ahead, decide).await?
        } else {
            let scored = self.verifier.verify(&self.committed, &block).await?;
            let outcome = decide(&scored.positions);
            (scored, outcome, Ahead::NotDrafted)
        };
        self.stats.target_forwards += 1;
        self.stats.target_forward_s += scored.forward_s;
        if let Some(f) = &mut self.block_floor {
            f.observe_verify(block.len(), scored.forward_s);
            f.observe_block(outcome.accepted, outcome.rejection.is_some());
        }
        match ahead {
            Ahead::NotDrafted => {}
            Ahead::Kept(drafted) => {
                self.stats.predrafts_kept += 1;
                self.stats.corrections_kept += u32::from(bet != Bet::Whole);
                self.stats.draft_forward_s += drafted.forward_s;
                if let (Some(f), Some((tokens, seconds))) = (&mut self.block_floor, drafted.decode_time()) {
                    f.observe_draft(tokens, seconds);
                }
                // Betting on a block kept whole, the first token was the guess of its bonus; the rest is the next block.
                let mut next: Vec<DraftToken> = drafted.tokens.into_iter().skip(bet.guess()).collect();
                // Past its floor, a block grows only while the draft is sure of its tokens: each unsure token would
                // put the next pre-draft at risk for little gain.
                if let Some(extra) = next.get(least..) {
                    let sure = extra.iter().take_while(|d| d.entropy <= GROW_MAX_ENTROPY).count();
                    next.truncate(least + sure);
                }
                self.ahead = Some(next);
            }
            Ahead::Dropped { forward_s } => {
                self.stats.predrafts_dropped += 1;
                self.stats.draft_forward_s += forward_s;
            }
            Ahead::NoDraft => {
                // As when a proposal finds no draft: the target finishes alone.
                self.stats.predrafts_dropped += 1;
                self.notes.push(format!(
                    "draft unavailable after {} generated tokens: continued in target mode",
                    self.generated() + outcome.tokens.len()
                ));
                self.plan.mode = Mode::Target;
            }
        }
        self.record_block(&block, &outcome, first_position);
        let positions: Vec<Arc<TargetPosition>> = scored.positions.into_iter().map(Arc::new).collect();
        Ok(outcome
            .tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| Emitted { token, target: Some(positions[i].clone()) })
            .collect())
    }

    /// Drafts a block from the committed tokens. The pipelined loop drafts its first block (of fixed size; flexible
    /// blocks start empty instead) while the verifier prefills the prompt — a verify of no block, whose position it
    /// drops — so the two prefills overlap without moving a block boundary: the block's verify then feeds only the
    /// last prompt token and the block, and gives the same bits (the batch-invariant runtime).
    async fn propose_block(&mut self, count: usize, first: bool) -> Result<Option<Drafted>, ServerError> {
        if !(self.pipeline && first) {
            return self.draft.propose(&self.committed, count, None).await;
        }
        let (prefilled, drafted) =
            tokio::join!(self.verifier.verify(&self.committed, &[]), self.draft.propose(&self.committed, count, None));
        match prefilled {
            Ok(scored) => {
                self.stats.target_forwards += 1;
                self.stats.target_forward_s += scored.forward_s;
            }
            // The block's own verify meets the failure again if it persists.
            Err(e) => tracing::debug!(error = %e, "prefilling the verifier beside the first proposal failed"),
        }
        drafted
    }

    /// Counts a decided block into the summary's stats, the step span and the metrics.
    fn record_block(&mut self, drafted: &[DraftToken], outcome: &BlockOutcome, first_position: u64) {
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

    fn note(&self) -> String {
        let mut notes = self.notes.clone();
        if self.stats.unspeculated > 0 {
            notes.push(format!(
                "{} of {} steps ran the target alone: at least {} sessions shared the verifier",
                self.stats.unspeculated, self.stats.blocks, self.plan.speculation_off_at
            ));
        }
        notes.join("; ")
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
            verifiers: self.verifier.replicas_used(),
            failovers: self.draft.failovers() + self.verifier.failovers(),
            finish_reason: finish_reason.to_owned(),
            time_to_first_token_s: s.first_token_s.unwrap_or(wall_s),
            draft_forward_seconds: s.draft_forward_s,
            target_forward_seconds: s.target_forward_s,
            overhead_seconds: (wall_s - s.draft_forward_s - s.target_forward_s).max(0.0),
            triggers: s.triggers.clone(),
            note: self.note(),
            request_id: self.plan.request_id.clone(),
            pipelined: self.pipeline,
            predrafts_kept: s.predrafts_kept,
            corrections_kept: s.corrections_kept,
            predrafts_dropped: s.predrafts_dropped,
        }
    }
}

fn client_gone() -> ServerError {
    ServerError::Unavailable("the client went away".into())
}

/// Verifies `block` while the draft drafts the next one for the outcome `bet` names. Kept whole: from the committed
/// tokens + `block` + the draft's own next token (its guess of the bonus, drawn like any draft token at that
/// position), then up to `ahead.end()` more. A correction at j: from the committed tokens + `block[..j]` + the
/// correction, up to `ahead.end()` tokens. As soon as the verifier answers and the block is decided, a pre-draft that
/// cannot be used is cancelled (the draft stops at its next token); one that can is cut where the draft has got to,
/// once it has `ahead.start()` tokens of the next block.
async fn verify_drafting_ahead<D: DraftSide, V: VerifierSide>(
    (draft, verifier): (&mut D, &mut V),
    committed: &HashedTokens,
    block: &[DraftToken],
    bet: Bet,
    ahead: RangeInclusive<usize>,
    decide: impl FnOnce(&[TargetPosition]) -> BlockOutcome,
) -> Result<(Scored, BlockOutcome, Ahead), ServerError> {
    let guess = bet.guess();
    let mut guessed = committed.clone();
    guessed.extend(&bet.continued(block));
    let cutoff = Cutoff::default();
    let verify = verifier.verify(committed, block);
    let predraft = draft.propose(&guessed, ahead.end() + guess, Some(&cutoff));
    tokio::pin!(verify, predraft);
    let mut drafted = None;
    let scored = loop {
        tokio::select! {
            biased;
            scored = &mut verify => break scored?,
            result = &mut predraft, if drafted.is_none() => drafted = Some(result),
        }
    };
    let outcome = decide(&scored.positions);
    if matches!(drafted, Some(Ok(None))) {
        return Ok((scored, outcome, Ahead::NoDraft));
    }
    let came_true = match bet {
        Bet::Whole => outcome.bonus && outcome.accepted == block.len(),
        // Rejected at `at` with everything before kept, and replaced by the correction bet on.
        Bet::Correction { at, token } => {
            outcome.rejection.is_some() && outcome.accepted == at && outcome.tokens.last() == Some(&token)
        }
    };
    if !came_true {
        let forward_s = match drafted {
            Some(Ok(Some(d))) => d.forward_s,
            _ => 0.0,
        };
        return Ok((scored, outcome, Ahead::Dropped { forward_s }));
    }
    let result = match drafted {
        Some(result) => result,
        None => tokio::select! {
            biased;
            result = &mut predraft => result,
            () = cutoff.arrived_at_least(ahead.start() + guess) => {
                cutoff.stop();
                predraft.await
            }
        },
    };
    // Betting on a block kept whole, the draft's guess must be the bonus.
    let guessed_right =
        |d: &Drafted| bet != Bet::Whole || d.tokens.first().map(|t| t.token) == outcome.tokens.last().copied();
    let ahead = match result {
        Ok(Some(d)) if d.tokens.len() >= ahead.start() + guess && guessed_right(&d) => Ahead::Kept(d),
        Ok(Some(d)) => Ahead::Dropped { forward_s: d.forward_s },
        Ok(None) => Ahead::NoDraft,
        Err(e) => {
            // The next step drafts again and meets the error there if it persists.
            tracing::warn!(error = %e, "drafting ahead failed; drafting the next block again");
            Ahead::Dropped { forward_s: 0.0 }
        }
    };
    Ok((scored, outcome, ahead))
}

#[cfg(test)]
#[path = "generation_tests.rs"]
mod tests;
