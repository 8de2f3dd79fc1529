//! The loop, sequential and pipelined, against scripted fake workers: accept patterns, a stale pre-draft, failures
//! mid-block, a client that goes away. Time is tokio's paused clock, so "slow" fakes cost nothing and timing
//! assertions are exact.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use easd_core::{EasdParams, SamplingParams, SparseDist};
use easd_model::{TinySpec, write_tiny_gguf};

use super::*;

const PROMPT: [u32; 3] = [97, 98, 99];

/// The fake target's next token after `context`: a letter, determined by the position and the last token.
fn target_next(context: &[u32]) -> u32 {
    let last = context.last().copied().unwrap_or(0);
    97 + ((context.len() as u32 * 7 + last) % 26)
}

/// The fake draft agrees with the target except at the positions in `disagree`.
fn draft_next(context: &[u32], disagree: &BTreeSet<usize>) -> u32 {
    let t = target_next(context);
    if disagree.contains(&context.len()) { 97 + (t - 97 + 1) % 26 } else { t }
}

/// The fake target's EASD replacement for a drafted `x` (its best token other than `x`), which is also the fake draft's
/// second choice wherever it drafted `x`.
fn second_choice(x: u32) -> u32 {
    97 + (x - 97 + 3) % 26
}

/// What the target alone generates greedily from the prompt.
fn target_alone(n: usize) -> Vec<u32> {
    let mut context = PROMPT.to_vec();
    for _ in 0..n {
        context.push(target_next(&context));
    }
    context[PROMPT.len()..].to_vec()
}

/// High entropy at every fifth position (for the EASD rule).
fn entropy_at(position: usize) -> f32 {
    if position.is_multiple_of(5) { 1.0 } else { 0.1 }
}

#[derive(Clone, Debug, PartialEq)]
enum Event {
    Propose { context_len: usize, count: usize },
    ProposeCancelled { context_len: usize },
    Verify { context: Vec<u32>, block: Vec<u32> },
    Released(&'static str),
}

type Log = Arc<Mutex<Vec<Event>>>;

fn log(events: &Log, e: Event) {
    events.lock().unwrap().push(e);
}

/// Records a cancelled proposal when dropped before `done`.
struct CancelGuard {
    events: Log,
    context_len: usize,
    done: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.done {
            log(&self.events, Event::ProposeCancelled { context_len: self.context_len });
        }
    }
}

/// What a fake does on its n-th call (1-based).
#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    /// Fails call `n` with UNAVAILABLE (after its delay).
    FailCall(usize),
    /// The draft is gone from call `n` on.
    GoneFrom(usize),
}

struct FakeDraft {
    disagree: BTreeSet<usize>,
    per_token: Duration,
    fault: Fault,
    calls: usize,
    events: Log,
}

impl DraftSide for FakeDraft {
    async fn propose(
        &mut self,
        context: &HashedTokens,
        count: usize,
        cutoff: Option<&Cutoff>,
    ) -> Result<Option<Drafted>, ServerError> {
        self.calls += 1;
        let context_len = context.len();
        log(&self.events, Event::Propose { context_len, count });
        if matches!(self.fault, Fault::GoneFrom(n) if self.calls >= n) {
            return Ok(None);
        }
        let mut guard = CancelGuard { events: self.events.clone(), context_len, done: false };
        let mut ctx = context.tokens().to_vec();
        let mut tokens = Vec::new();
        for _ in 0..count {
            match cutoff {
                Some(c) if !tokens.is_empty() => tokio::select! {
                    biased;
                    () = c.stopped() => break,
                    () = tokio::time::sleep(self.per_token) => {}
                },
                _ => tokio::time::sleep(self.per_token).await,
            }
            let token = draft_next(&ctx, &self.disagree);
            let entropy = entropy_at(ctx.len());
            tokens.push(DraftToken {
                token,
                proposal: SparseDist { ids: vec![token], probs: vec![1.0] },
                entropy,
                top_n: vec![token, second_choice(token)],
            });
            ctx.push(token);
            if let Some(c) = cutoff {
                c.set_arrived(tokens.len());
            }
        }
        guard.done = true;
        if matches!(self.fault, Fault::FailCall(n) if self.calls == n) {
            return Err(ServerError::Internal("scripted draft failure".into()));
        }
        let forward_s = self.per_token.as_secs_f64() * tokens.len() as f64;
        Ok(Some(Drafted { tokens, forward_s, first_s: self.per_token.as_secs_f64() }))
    }

    fn release(&mut self) {
        log(&self.events, Event::Released("draft"));
    }

    fn failovers(&self) -> u32 {
        0
    }
}

struct FakeVerifier {
    delay: Duration,
    /// More delay for each row scored (a block of n has n + 1).
    per_row: Duration,
    fault: Fault,
    calls: usize,
    events: Log,
    /// Sessions live on the replica: `.0` until call `.1` (0: from the start), 1 after.
    load: (usize, usize),
}

impl VerifierSide for FakeVerifier {
    async fn verify(&mut self, context: &HashedTokens, block: &[DraftToken]) -> Result<Scored, ServerError> {
        self.calls += 1;
        let block_tokens: Vec<u32> = block.iter().map(|d| d.token).collect();
        log(&self.events, Event::Verify { context: context.tokens().to_vec(), block: block_tokens.clone() });
        let took = self.delay + self.per_row * (block.len() as u32 + 1);
        tokio::time::sleep(took).await;
        if matches!(self.fault, Fault::FailCall(n) if self.calls == n) {
            return Err(ServerError::Unavailable("scripted verifier failure".into()));
        }
        let mut ctx = context.tokens().to_vec();
        let mut positions = Vec::new();
        for j in 0..=block.len() {
            let best = target_next(&ctx);
            let drafted = block_tokens.get(j).copied();
            positions.push(TargetPosition {
                // Sampled requests accept the target's choice with probability 0.9 and anything else with 0.2.
                draft_token_prob: match drafted {
                    Some(x) if x == best => 0.9,
                    Some(_) => 0.2,
                    None => 0.0,
                },
                argmax: best,
                entropy: entropy_at(ctx.len()),
                top_n: vec![best],
                residual_token: drafted.map(|_| best),
                easd_token: drafted.map(second_choice),
                sample_token: best,
                top_logprobs: vec![],
                candidate_logprobs: vec![],
            });
            if let Some(x) = drafted {
                ctx.push(x);
            }
        }
        Ok(Scored { positions, forward_s: took.as_secs_f64() })
    }

    fn release(&mut self) {
        log(&self.events, Event::Released("verifier"));
    }

    fn live_sessions(&self) -> usize {
        if self.calls < self.load.1 { self.load.0 } else { 1 }
    }

    fn replicas_used(&self) -> Vec<String> {
        vec!["fake".into()]
    }

    fn failovers(&self) -> u32 {
        0
    }
}

fn tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tiny.gguf");
            write_tiny_gguf(&path, &TinySpec::qwen2(7)).unwrap();
            Arc::new(Tokenizer::from_gguf_file(&path).unwrap())
        })
        .clone()
}

/// A scripted run: the fakes' behaviour and the request.
#[derive(Clone)]
struct Script {
    disagree: BTreeSet<usize>,
    mode: Mode,
    sampling: SamplingParams,
    k: usize,
    /// How far a pipelined greedy block may grow (the plan's `max_k`).
    max_k: usize,
    /// The plan's `adaptive_blocks` (the tests of fixed floors leave it off).
    adaptive_blocks: bool,
    max_tokens: usize,
    stop: Vec<String>,
    draft_per_token: Duration,
    verify_delay: Duration,
    verify_per_row: Duration,
    draft_fault: Fault,
    verifier_fault: Fault,
    /// Sessions live on the verifier before its call n, and the n (`FakeVerifier::load`).
    verifier_load: (usize, usize),
    speculation_off_at: usize,
}

impl Default for Script {
    fn default() -> Self {
        Self {
            disagree: BTreeSet::new(),
            mode: Mode::Sd,
            sampling: SamplingParams::greedy(),
            k: 4,
            max_k: 4,
            adaptive_blocks: false,
            max_tokens: 40,
            stop: vec![],
            draft_per_token: Duration::from_millis(10),
            verify_delay: Duration::from_millis(40),
            verify_per_row: Duration::ZERO,
            draft_fault: Fault::None,
            verifier_fault: Fault::None,
            verifier_load: (1, 0),
            speculation_off_at: 0,
        }
    }
}

struct Run {
    result: Result<pb::Summary, ServerError>,
    tokens: Vec<u32>,
    text: String,
    events: Vec<Event>,
    elapsed: Duration,
}

impl Run {
    fn summary(&self) -> &pb::Summary {
        self.result.as_ref().expect("the generation succeeds")
    }

    fn verifies(&self) -> Vec<&Event> {
        self.events.iter().filter(|e| matches!(e, Event::Verify { .. })).collect()
    }

    /// The verifies without the pipelined loop's prefill beside the first proposal (a verify of no block on the
    /// prompt, before the first block's; a step of the target alone comes after none).
    fn block_verifies(&self) -> Vec<&Event> {
        let mut verifies = self.verifies();
        let prefill = Event::Verify { context: PROMPT.to_vec(), block: vec![] };
        if verifies.len() >= 2
            && verifies[0] == &prefill
            && matches!(verifies[1], Event::Verify { context, block } if context[..] == PROMPT[..] && !block.is_empty())
        {
            verifies.remove(0);
        }
        verifies
    }

    fn count(&self, pred: impl Fn(&Event) -> bool) -> usize {
        self.events.iter().filter(|e| pred(e)).count()
    }
}

fn generation(script: &Script, pipeline: bool) -> (Generation<FakeDraft, FakeVerifier>, Log) {
    let events: Log = Arc::default();
    let plan = Plan {
        request_id: "session".into(),
        prompt_tokens: PROMPT.to_vec(),
        max_tokens: script.max_tokens,
        sampling: script.sampling.clone(),
        seed: 11,
        mode: script.mode.clone(),
        k: script.k,
        easd: EasdParams::default(),
        stop: script.stop.clone(),
        logprobs: 0,
        pipeline,
        max_k: script.max_k,
        adaptive_blocks: script.adaptive_blocks,
        speculation_off_at: script.speculation_off_at,
    };
    let draft = FakeDraft {
        disagree: script.disagree.clone(),
        per_token: script.draft_per_token,
        fault: script.draft_fault,
        calls: 0,
        events: events.clone(),
    };
    let verifier = FakeVerifier {
        delay: script.verify_delay,
        per_row: script.verify_per_row,
        fault: script.verifier_fault,
        calls: 0,
        events: events.clone(),
        load: script.verifier_load,
    };
    (Generation::new(plan, draft, verifier, tokenizer(), CoordinatorMetrics::new(), pipeline), events)
}

async fn run(script: &Script, pipeline: bool) -> Run {
    let (generation, events) = generation(script, pipeline);
    let (tx, mut rx) = mpsc::channel(1024);
    let started = tokio::time::Instant::now();
    let result = generation.run(&tx).await;
    let elapsed = started.elapsed();
    drop(tx);
    let (mut tokens, mut text) = (Vec::new(), String::new());
    while let Some(Ok(pb::GenerateEvent { event: Some(pb::generate_event::Event::Delta(d)) })) = rx.recv().await {
        tokens.extend(d.token_ids);
        text.push_str(&d.text);
    }
    let events = events.lock().unwrap().clone();
    Run { result, tokens, text, events, elapsed }
}

/// Runs the script both ways and checks what must not differ: the tokens, the text, the blocks verified.
async fn both(script: &Script) -> (Run, Run) {
    let sequential = run(script, false).await;
    let pipelined = run(script, true).await;
    assert_eq!(pipelined.tokens, sequential.tokens);
    assert_eq!(pipelined.text, sequential.text);
    assert_eq!(pipelined.block_verifies(), sequential.verifies(), "the same blocks are verified on the same contexts");
    let (s, p) = (sequential.summary(), pipelined.summary());
    assert_eq!((p.blocks, p.accepted_tokens, p.easd_triggers), (s.blocks, s.accepted_tokens, s.easd_triggers));
    assert_eq!(p.finish_reason, s.finish_reason);
    assert!(p.pipelined && !s.pipelined);
    (sequential, pipelined)
}

fn every(step: usize, from: usize) -> BTreeSet<usize> {
    (from..200).step_by(step).collect()
}

#[tokio::test(start_paused = true)]
async fn pipelined_and_sequential_loops_emit_the_same_tokens_for_every_accept_pattern() {
    let patterns = [BTreeSet::new(), every(3, 4), every(5, 7), every(2, 3), [8, 9, 10, 30].into()];
    for disagree in patterns {
        let script = Script { disagree: disagree.clone(), ..Script::default() };
        let (_, pipelined) = both(&script).await;
        // Greedy sd is lossless: whatever the draft does, the target's own sequence comes out.
        assert_eq!(pipelined.tokens, target_alone(40), "disagreeing at {disagree:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn sampled_and_easd_requests_are_the_same_pipelined_and_sequential() {
    let sampled = SamplingParams { temperature: 0.8, ..SamplingParams::greedy() };
    let eager = EasdParams { tau_draft: 0.5, tau_target: 0.5, rho: 0.0, top_n: 1, ..EasdParams::default() };
    for (mode, sampling) in [
        (Mode::Sd, sampled.clone()),
        (Mode::Easd(eager.clone()), SamplingParams::greedy()),
        (Mode::Easd(eager), sampled),
    ] {
        let script = Script { mode: mode.clone(), sampling, disagree: every(4, 6), ..Script::default() };
        let (sequential, _) = both(&script).await;
        if let Mode::Easd(_) = mode {
            assert!(sequential.summary().easd_triggers > 0, "the scripted entropies make the rule fire");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn greedy_sd_runs_the_target_alone_while_the_verifier_is_shared_and_speculates_again_after() {
    let loaded = Script { disagree: every(5, 6), speculation_off_at: 4, ..Script::default() };
    // Four sessions on the verifier for the whole answer: no drafting at all, one verify of an empty block per token.
    let (_, run) = both(&Script { verifier_load: (4, usize::MAX), ..loaded.clone() }).await;
    assert_eq!(run.tokens, target_alone(40));
    assert_eq!(run.count(|e| matches!(e, Event::Propose { .. })), 0);
    assert!(run.verifies().iter().all(|e| matches!(e, Event::Verify { block, .. } if block.is_empty())));
    assert_eq!(run.summary().note, "40 of 40 steps ran the target alone: at least 4 sessions shared the verifier");
    // Three sessions: below the threshold, it speculates.
    let (_, run) = both(&Script { verifier_load: (3, usize::MAX), ..loaded.clone() }).await;
    assert_eq!(run.tokens, target_alone(40));
    assert!(run.summary().accepted_tokens > 0 && run.summary().note.is_empty());
    // The batch shrinks after the verifier's tenth call: drafting resumes from where the target got to.
    let (_, run) = both(&Script { verifier_load: (6, 10), ..loaded }).await;
    assert_eq!(run.tokens, target_alone(40));
    assert!(run.summary().note.starts_with("10 of "), "{}", run.summary().note);
    assert!(run.events.contains(&Event::Propose { context_len: PROMPT.len() + 10, count: 4 }), "{:?}", run.events);
}

#[tokio::test(start_paused = true)]
async fn sampled_sd_and_easd_keep_speculating_under_load() {
    let sampled = SamplingParams { temperature: 0.8, ..SamplingParams::greedy() };
    for (mode, sampling) in [(Mode::Sd, sampled), (Mode::Easd(EasdParams::default()), SamplingParams::greedy())] {
        let script =
            Script { mode, sampling, verifier_load: (8, usize::MAX), speculation_off_at: 2, ..Script::default() };
        let run = run(&script, false).await;
        assert!(run.count(|e| matches!(e, Event::Propose { .. })) > 0);
        assert!(run.summary().note.is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn a_block_accepted_whole_keeps_the_block_drafted_ahead() {
    let script = Script { max_tokens: 20, ..Script::default() };
    let (_, run) = both(&script).await;
    // 20 tokens in blocks of 4 + bonus: 4 blocks; each of the first three was kept whole with its bonus guessed.
    let s = run.summary();
    assert_eq!((s.blocks, s.predrafts_kept, s.predrafts_dropped), (4, 3, 0));
    // One proposal from the prompt, then each pre-draft: the guess of the bonus plus the next block, drafted from
    // the committed tokens + the block in flight.
    let proposes: Vec<&Event> = run.events.iter().filter(|e| matches!(e, Event::Propose { .. })).collect();
    assert_eq!(
        proposes,
        [
            &Event::Propose { context_len: 3, count: 4 },
            &Event::Propose { context_len: 7, count: 5 },
            &Event::Propose { context_len: 12, count: 5 },
            &Event::Propose { context_len: 17, count: 5 },
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_stale_predraft_is_dropped_when_the_bonus_is_not_the_drafts_guess() {
    // Block 1 covers positions 3..=6 and is accepted whole; the draft guesses position 7 (the bonus) wrong.
    let script = Script { disagree: [7].into(), max_tokens: 12, ..Script::default() };
    let (_, run) = both(&script).await;
    let s = run.summary();
    // The second block's pre-draft (the last two tokens) is kept.
    assert_eq!((s.predrafts_kept, s.predrafts_dropped), (1, 1), "{s:?}");
    // Drafting restarted from the corrected prefix: prompt + block + the target's bonus.
    assert!(run.events.contains(&Event::Propose { context_len: 8, count: 4 }), "{:?}", run.events);
}

#[tokio::test(start_paused = true)]
async fn an_easd_block_with_a_weak_position_keeps_the_block_drafted_for_its_correction() {
    // The rule fires wherever both fakes are unsure (every fifth position), and the target's replacement there is the
    // draft's second choice: a block holding such a position bets on that correction, and the bet comes true.
    let eager = EasdParams { tau_draft: 0.5, tau_target: 0.5, rho: 0.0, top_n: 1, ..EasdParams::default() };
    for k in [2, 3, 4, 6] {
        let script = Script { mode: Mode::Easd(eager.clone()), k, max_tokens: 60, ..Script::default() };
        let (sequential, pipelined) = both(&script).await;
        let (s, p) = (sequential.summary(), pipelined.summary());
        assert!(s.easd_triggers > 0, "k {k}");
        assert!(p.corrections_kept > 0 && p.corrections_kept <= p.predrafts_kept, "k {k}: {p:?}");
        assert!(pipelined.elapsed < sequential.elapsed);
    }
    // Where the SD test rejects instead and the target's token is not the draft's second choice, the bet is lost.
    let script = Script { mode: Mode::Easd(eager), disagree: every(5, 5), max_tokens: 30, ..Script::default() };
    let (_, pipelined) = both(&script).await;
    assert_eq!(pipelined.summary().corrections_kept, 0);
    assert!(pipelined.summary().predrafts_dropped > 0);
}

#[tokio::test(start_paused = true)]
async fn a_rejection_cancels_the_predraft_while_it_is_still_drafting() {
    // The verifier answers before the pre-draft (5 tokens × 10 ms) is done, and rejects position 4.
    let script =
        Script { disagree: [4].into(), max_tokens: 12, verify_delay: Duration::from_millis(15), ..Script::default() };
    let (_, run) = both(&script).await;
    assert!(run.events.contains(&Event::ProposeCancelled { context_len: 7 }), "{:?}", run.events);
    assert_eq!(run.summary().predrafts_dropped, 1);
}

#[tokio::test(start_paused = true)]
async fn drafting_ahead_overlaps_verification() {
    let script = Script { max_tokens: 40, ..Script::default() };
    let (sequential, pipelined) = both(&script).await;
    // Sequential: 8 blocks × (40 ms drafting + 40 ms verifying). Pipelined: drafting the next block (50 ms with the
    // guess) hides behind verification except for the first block, and the verifier's prefill (a verify of no block)
    // hides behind the first proposal.
    assert_eq!(sequential.elapsed, Duration::from_millis(8 * 80));
    assert_eq!(pipelined.elapsed, Duration::from_millis(40 + 7 * 50 + 40));
    assert_eq!(pipelined.verifies()[0], &Event::Verify { context: PROMPT.to_vec(), block: vec![] });
    assert_eq!(pipelined.verifies().len(), sequential.verifies().len() + 1);
}

#[tokio::test(start_paused = true)]
async fn a_fast_draft_grows_greedy_blocks_with_what_it_made_while_the_verifier_was_busy() {
    // The draft makes a token in 5 ms, the verifier takes 40 ms: by the time a block is verified the draft has its
    // guess of the bonus and seven more tokens, so blocks after the first grow past k (max_k = 8 caps them).
    let fast = Script { max_k: 8, draft_per_token: Duration::from_millis(5), max_tokens: 60, ..Script::default() };
    for disagree in [BTreeSet::new(), every(7, 5), [20, 21, 40].into()] {
        let script = Script { disagree: disagree.clone(), ..fast.clone() };
        let (fixed, grown) = (run(&Script { max_k: 4, ..script.clone() }, true).await, run(&script, true).await);
        // Greedy: the target's own tokens, whatever the blocks.
        assert_eq!(grown.tokens, target_alone(60), "disagreeing at {disagree:?}");
        assert_eq!(fixed.tokens, grown.tokens);
        let blocks = block_sizes(&grown);
        // The first block is empty: the verifier's prefill gives the first token while the draft drafts ahead.
        assert_eq!(blocks[0], 0, "{blocks:?}");
        assert!(blocks[1..].iter().all(|&n| (1..=8).contains(&n)), "{blocks:?}");
        // At most the empty first block's call more.
        assert!(grown.verifies().len() <= fixed.verifies().len() + 1, "{disagree:?}: {blocks:?}");
        // Past k = 4 a block holds only tokens the draft was sure of (the fakes are unsure at every fifth position).
        for e in &grown.events {
            if let Event::Verify { context, block } = e {
                let unsure = (4..block.len()).filter(|j| entropy_at(context.len() + j) > GROW_MAX_ENTROPY).count();
                assert_eq!(unsure, 0, "{context:?} {block:?}");
            }
        }
        if disagree.len() < 5 {
            // Long runs of agreement: blocks grow past k where the draft is sure (it makes the guess + 7 tokens in
            // 40 ms).
            assert!(blocks.iter().any(|&n| n > 4), "{blocks:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_block_waits_for_k_tokens_from_a_slow_draft_and_stops_the_draft_once_it_has_them() {
    // 30 ms a token: when the verifier answers (40 ms) the draft has one token; the block waits for 1 + k = 5, and
    // the draft, asked for 9, is stopped there. Blocks stay at k: the same calls as the fixed-size loop.
    let slow = Script { max_k: 8, draft_per_token: Duration::from_millis(30), max_tokens: 30, ..Script::default() };
    let (fixed, grown) = (run(&Script { max_k: 4, ..slow.clone() }, true).await, run(&slow, true).await);
    assert_eq!(grown.tokens, target_alone(30));
    // After the empty first block, blocks of k: the fixed loop's blocks from the second on.
    let grown_sizes = block_sizes(&grown);
    assert_eq!(grown_sizes[0], 0);
    assert!(grown_sizes[1..grown_sizes.len() - 1].iter().all(|&n| n == 4), "{grown_sizes:?}");
    // The first pre-draft (the guess of the first token, then up to 8) starts from the prompt and is stopped at 5.
    assert!(grown.events.contains(&Event::Propose { context_len: 3, count: 9 }), "{:?}", grown.events);
    // A draft this slow bounds the loop: the guess drafted at the start costs its 30 ms (fakes have no prefill).
    assert_eq!(grown.elapsed, fixed.elapsed + Duration::from_millis(30));
}

/// The drafted tokens of each verified block, in order.
fn block_sizes(r: &Run) -> Vec<usize> {
    r.events
        .iter()
        .filter_map(|e| match e {
            Event::Verify { block, .. } => Some(block.len()),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn adaptive_floors_shorten_blocks_where_verifying_rows_is_dear_and_the_draft_often_wrong() {
    // 20 ms + 20 ms a row to verify, 20 ms a drafted token, a disagreement every third position: a block of four
    // waits 80 ms for the draft and is seldom kept whole, so shorter blocks commit more tokens a second.
    let steep = Script {
        max_k: 8,
        disagree: every(3, 5),
        draft_per_token: Duration::from_millis(20),
        verify_delay: Duration::from_millis(20),
        verify_per_row: Duration::from_millis(20),
        max_tokens: 80,
        ..Script::default()
    };
    let (fixed, adaptive) =
        (run(&steep, true).await, run(&Script { adaptive_blocks: true, ..steep.clone() }, true).await);
    assert_eq!(adaptive.tokens, target_alone(80));
    assert_eq!(fixed.tokens, adaptive.tokens);
    let sizes = block_sizes(&adaptive);
    assert!(sizes.iter().filter(|&&n| (1..4).contains(&n)).count() > sizes.len() / 2, "{sizes:?}");
    assert!(adaptive.elapsed < fixed.elapsed, "{:?} vs {:?}", adaptive.elapsed, fixed.elapsed);
}

#[tokio::test(start_paused = true)]
async fn adaptive_floors_keep_blocks_of_k_where_rows_are_cheap_and_the_draft_right() {
    // A flat verifier, and a draft that always agrees and drafts a block and its guess well within a verify: nothing
    // to gain from shorter blocks after the one exploring block.
    let flat = Script {
        max_k: 8,
        adaptive_blocks: true,
        draft_per_token: Duration::from_millis(5),
        verify_delay: Duration::from_millis(40),
        verify_per_row: Duration::from_micros(100),
        max_tokens: 80,
        ..Script::default()
    };
    let run = run(&flat, true).await;
    assert_eq!(run.tokens, target_alone(80));
    let sizes = block_sizes(&run);
    assert!(sizes.iter().filter(|&&n| n < 4).count() <= 2, "{sizes:?}");
}

#[tokio::test(start_paused = true)]
async fn sampled_blocks_do_not_grow() {
    // Where a block ends decides which draws a sampled position uses: same blocks as the sequential loop.
    let sampled = SamplingParams { temperature: 0.8, ..SamplingParams::greedy() };
    let script = Script { max_k: 8, sampling: sampled, draft_per_token: Duration::from_millis(5), ..Script::default() };
    both(&script).await;
}

#[tokio::test(start_paused = true)]
async fn easd_blocks_do_not_grow() {
    // A bonus position is never tested by the EASD rule, so where blocks end decides which positions it sees: greedy
    // easd keeps the sequential loop's blocks (and so its triggers and tokens) even when a fast draft could grow them.
    let eager = EasdParams { tau_draft: 0.5, tau_target: 0.5, rho: 0.0, top_n: 1, ..EasdParams::default() };
    let script = Script {
        mode: Mode::Easd(eager),
        max_k: 8,
        disagree: every(4, 6),
        draft_per_token: Duration::from_millis(5),
        ..Script::default()
    };
    let (sequential, _) = both(&script).await;
    assert!(sequential.summary().easd_triggers > 0, "the scripted entropies make the rule fire");
}

#[tokio::test(start_paused = true)]
async fn max_tokens_and_stop_strings_end_a_pipelined_generation_where_the_sequential_one_ends() {
    for max_tokens in [1, 5, 6, 13] {
        let (_, run) = both(&Script { max_tokens, ..Script::default() }).await;
        assert_eq!(run.tokens.len(), max_tokens);
        assert_eq!(run.summary().finish_reason, "length");
    }
    let full = run(&Script::default(), true).await.text;
    let stop = full[10..13].to_owned();
    let (_, run) = both(&Script { stop: vec![stop.clone()], ..Script::default() }).await;
    assert_eq!(run.summary().finish_reason, "stop");
    assert_eq!(run.text, full[..full.find(&stop).unwrap()]);
    assert_eq!(run.count(|e| matches!(e, Event::Released(_))), 2, "both sides released");
}

#[tokio::test(start_paused = true)]
async fn a_verifier_failure_mid_block_fails_the_generation_and_cancels_the_predraft() {
    // Call 1 prefills beside the first proposal; call 4 is the third block's.
    let script =
        Script { verifier_fault: Fault::FailCall(4), draft_per_token: Duration::from_millis(20), ..Script::default() };
    let run = run(&script, true).await;
    assert!(matches!(run.result, Err(ServerError::Unavailable(_))), "{:?}", run.result.as_ref().err());
    assert!(run.count(|e| matches!(e, Event::ProposeCancelled { .. })) == 1, "{:?}", run.events);
    assert_eq!(run.count(|e| matches!(e, Event::Released(_))), 2, "both sides released");
    // What was committed before the failure was streamed and is the target's.
    assert_eq!(run.tokens, target_alone(run.tokens.len()));
    assert_eq!(run.tokens.len(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_draft_failure_while_drafting_ahead_costs_only_the_predraft() {
    let script = Script { draft_fault: Fault::FailCall(2), disagree: every(6, 5), ..Script::default() };
    let (sequential, pipelined) = (run(&script, false).await, run(&script, true).await);
    // Sequentially the second proposal is needed, so its failure ends the generation; drafted ahead, it is dropped.
    assert!(sequential.result.is_err());
    assert_eq!(pipelined.tokens, target_alone(40));
    assert!(pipelined.summary().predrafts_dropped >= 1);
}

#[tokio::test(start_paused = true)]
async fn a_draft_that_disappears_mid_generation_leaves_the_target_to_finish() {
    let script = Script { draft_fault: Fault::GoneFrom(3), disagree: every(5, 5), ..Script::default() };
    // The draft's third call comes at a different step in each loop, so only the outcome is compared.
    for (pipeline, max_k) in [(false, 4), (true, 4), (true, 8)] {
        let run = run(&Script { max_k, ..script.clone() }, pipeline).await;
        // Once the draft is gone, no more proposals are asked for.
        let proposes = run.count(|e| matches!(e, Event::Propose { .. }));
        assert_eq!(proposes, 3, "max_k {max_k}: {:?}", run.events);
        assert_eq!(run.tokens, target_alone(40));
        assert!(run.summary().note.contains("target mode"), "{:?}", run.summary().note);
    }
}

#[tokio::test(start_paused = true)]
async fn a_client_that_goes_away_mid_block_ends_the_generation_at_once() {
    let script = Script { verify_delay: Duration::from_secs(10), ..Script::default() };
    let (generation, events) = generation(&script, true);
    let (tx, mut rx) = mpsc::channel(1024);
    let task = tokio::spawn(async move { generation.run(&tx).await });
    // The first block's deltas arrive after one verification; then the client leaves with the next block in flight.
    assert!(rx.recv().await.is_some());
    let left = tokio::time::Instant::now();
    drop(rx);
    let result = task.await.unwrap();
    assert!(matches!(&result, Err(ServerError::Unavailable(m)) if m.contains("went away")), "{:?}", result.err());
    assert!(left.elapsed() < Duration::from_secs(1), "no waiting for the verifier: {:?}", left.elapsed());
    let events = events.lock().unwrap();
    assert_eq!(events.iter().filter(|e| matches!(e, Event::Released(_))).count(), 2, "{events:?}");
}
