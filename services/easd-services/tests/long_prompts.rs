//! Long prompts across real processes on loopback (issue: a prompt whose prefill outlasts the call deadline used to
//! fail after six full-context retries). Workers that are merely slow — throttled with SIGSTOP/SIGCONT, so that the
//! prefill takes several call timeouts — must answer with the tokens of undisturbed workers and no retry; a worker
//! that truly stalls in the middle of a prefill must still be failed over, within the call timeout of its last
//! progress report.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use easd_model::{TinySpec, write_tiny_gguf};
use support::*;

/// The coordinator's deadline on each worker call (and on each prefill progress report).
const CALL_TIMEOUT_S: f64 = 1.0;
const MAX_TOKENS: u32 = 24;

/// A pair large enough that prefilling a few thousand tokens takes a noticeable time, with room for them.
fn long_pair() -> TinyPair {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("long-target.gguf");
    let draft = dir.path().join("long-draft.gguf");
    let spec = TinySpec { hidden_size: 128, intermediate_size: 256, context_length: 4096, ..TinySpec::qwen2(7) };
    write_tiny_gguf(&target, &spec).unwrap();
    write_tiny_gguf(&draft, &TinySpec { perturbation: Some((8, 0.3)), ..spec }).unwrap();
    TinyPair { dir, draft, target }
}

/// A prompt of a few thousand tokens (the tiny vocabulary merges only short words).
fn long_prompt() -> String {
    (0..80).map(|i| format!("Line {i}: the cat is in the garden and the dog is on the mat. ")).collect()
}

/// Workers feed prompts in pieces of 32 tokens, so that a throttled worker still reports progress well inside the
/// call timeout.
fn workers(pair: &TinyPair, verifiers: usize) -> (Proc, Vec<Proc>) {
    let pieces = ["--batch-max-piece=32".to_owned()];
    let draft = worker_flags("draft", &pair.draft, free_port(), &pieces);
    let verifiers: Vec<Proc> =
        (0..verifiers).map(|_| worker_flags("verifier", &pair.target, free_port(), &pieces)).collect();
    (draft, verifiers)
}

/// The coordinator, and the port of its metrics.
async fn start(pair: &TinyPair, draft: &Proc, verifiers: &[Proc]) -> (Proc, u16) {
    wait_serving(&draft.url()).await;
    for v in verifiers {
        wait_serving(&v.url()).await;
    }
    let ports: Vec<u16> = verifiers.iter().map(|v| v.port).collect();
    let metrics_port = free_port();
    let timeout = format!("--call-timeout-s={CALL_TIMEOUT_S}");
    let metrics = format!("--metrics-listen=127.0.0.1:{metrics_port}");
    let flags = [timeout.as_str(), &metrics, "--health-interval-s=0.2", "--max-attempts=8"];
    let coord = coordinator(pair, &[draft], &ports, &flags);
    wait_serving(&coord.url()).await;
    wait_info(&coord.url(), "every verifier healthy", |i| healthy_verifiers(i) == verifiers.len()).await;
    (coord, metrics_port)
}

/// A generation with the time to its first token and in all.
struct Timed {
    out: Outcome,
    first_token_s: f64,
    total_s: f64,
}

async fn timed(url: &str, mut on_first: impl FnMut()) -> Timed {
    let started = Instant::now();
    let mut first = None;
    let out = generate(url, request(&long_prompt(), MAX_TOKENS), async |_| {
        if first.is_none() {
            first = Some(started.elapsed().as_secs_f64());
            on_first();
        }
    })
    .await
    .expect("the long prompt is answered");
    Timed { out, first_token_s: first.expect("a first token"), total_s: started.elapsed().as_secs_f64() }
}

/// Retries the coordinator counted, all roles together.
async fn retries(metrics_port: u16) -> f64 {
    let text = metrics_text(metrics_port).await;
    text.lines()
        .filter(|l| l.starts_with("easd_coordinator_retries_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Stops and continues processes in turns (stopped `stopped`, running `running`) until dropped: workers that are
/// alive but slow. SIGCONT is sent last.
struct Throttle {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Throttle {
    fn start(pids: Vec<u32>, stopped: Duration, running: Duration) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let signal = move |sig: &str| {
            for pid in &pids {
                let _ = std::process::Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
            }
        };
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                signal("STOP");
                std::thread::sleep(stopped);
                signal("CONT");
                std::thread::sleep(running);
            }
        });
        Self { done, thread: Some(thread) }
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_that_outlasts_several_call_timeouts_answers_with_the_undisturbed_tokens_and_no_retry() {
    let pair = long_pair();
    let (draft, verifiers) = workers(&pair, 1);
    let (coord, metrics_port) = start(&pair, &draft, &verifiers).await;
    let reference = timed(&coord.url(), || {}).await;
    assert_eq!(reference.out.summary.failovers, 0);

    // Both workers run about a tenth of the time until the first token arrives: the prefill takes several call
    // timeouts, yet a piece (32 tokens) still finishes within each running slice.
    let pids = vec![draft.child.id(), verifiers[0].child.id()];
    let throttle =
        std::sync::Mutex::new(Some(Throttle::start(pids, Duration::from_millis(180), Duration::from_millis(20))));
    let slow = timed(&coord.url(), || drop(throttle.lock().unwrap().take())).await;
    eprintln!(
        "{} prompt tokens; undisturbed: first token {:.2} s, all {:.2} s; throttled: first token {:.2} s, all {:.2} s",
        reference.out.summary.prompt_tokens,
        reference.first_token_s,
        reference.total_s,
        slow.first_token_s,
        slow.total_s
    );
    assert!(
        slow.first_token_s >= 3.0 * CALL_TIMEOUT_S,
        "the throttled prefill must outlast several call timeouts to test anything ({:.2} s)",
        slow.first_token_s
    );
    assert_eq!(slow.out.tokens, reference.out.tokens, "the slow workers' answer is the undisturbed one");
    assert_eq!(slow.out.summary.failovers, 0, "{:?}", slow.out.summary);
    assert_eq!(retries(metrics_port).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verifier_that_stalls_in_the_middle_of_a_prefill_is_failed_over_within_the_call_timeout() {
    let pair = long_pair();
    let (draft, verifiers) = workers(&pair, 2);
    let (coord, _) = start(&pair, &draft, &verifiers).await;
    let reference = timed(&coord.url(), || {}).await;

    let url = coord.url();
    let started = Instant::now();
    // The replica the session is pinned to, stopped for good a moment after its prefill began.
    let stop_the_serving_verifier = async {
        let victim_url = wait_info(&url, "a verifier with a live session", |i| {
            i.replicas.iter().any(|r| r.role == "verifier" && r.live_sessions > 0)
        })
        .await
        .replicas
        .into_iter()
        .find(|r| r.role == "verifier" && r.live_sessions > 0)
        .unwrap()
        .url;
        let victim = verifiers.iter().find(|v| v.url() == victim_url).expect("a known verifier");
        tokio::time::sleep(Duration::from_secs_f64(reference.first_token_s / 4.0)).await;
        victim.signal("STOP");
        (victim, started.elapsed().as_secs_f64())
    };
    let (out, (victim, stopped_at)) = tokio::join!(timed(&url, || {}), stop_the_serving_verifier);
    victim.signal("CONT");
    eprintln!(
        "undisturbed: first token {:.2} s, all {:.2} s; stopped at {stopped_at:.2} s: first token {:.2} s, all {:.2} s",
        reference.first_token_s, reference.total_s, out.first_token_s, out.total_s
    );
    assert!(stopped_at < out.first_token_s, "the verifier stopped during the prefill");
    assert_eq!(out.out.tokens, reference.out.tokens, "the failed-over answer is the undisturbed one");
    assert!(out.out.summary.failovers >= 1, "{:?}", out.out.summary);
    // Noticed within the call timeout of its last report, then the other replica prefills from the start.
    let bound = stopped_at + CALL_TIMEOUT_S + 2.0 * reference.total_s + 5.0;
    assert!(out.total_s < bound, "answered after {:.2} s, bound {bound:.2} s", out.total_s);
}
