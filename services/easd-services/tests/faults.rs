//! Fault tests across real processes on loopback: verifier killed (SIGKILL) or hung (SIGSTOP) mid-generation,
//! a replica coming back, the draft dying. Greedy output must be byte-identical to an undisturbed run.
//!
//! The coordinator runs the pipelined loop (its default with separate workers, and asked for explicitly here), so
//! every failure lands with a block in flight and the next block being drafted; the reference is checked against
//! the sequential loop too.

mod support;

use std::time::Duration;

use easd_proto::v1 as pb;
use support::*;

const MAX_TOKENS: u32 = 300;
const PROMPT: &str = "In a distant galaxy";

/// Draft, two verifiers (the second started only after the coordinator, so the first serves the session),
/// and a coordinator with short deadlines.
struct Cluster {
    pair: TinyPair,
    draft: Proc,
    v1: Proc,
    v2: Proc,
    coord: Proc,
}

async fn cluster() -> Cluster {
    let pair = tiny_pair();
    let draft = worker("draft", &pair.draft, free_port());
    let v1 = worker("verifier", &pair.target, free_port());
    let v2_port = free_port();
    wait_serving(&draft.url()).await;
    wait_serving(&v1.url()).await;
    let coord = coordinator(
        &pair,
        &[&draft],
        &[v1.port, v2_port],
        &["--call-timeout-s=1.5", "--health-interval-s=0.2", "--max-attempts=8"],
    );
    wait_serving(&coord.url()).await;
    let v2 = worker("verifier", &pair.target, v2_port);
    wait_serving(&v2.url()).await;
    wait_info(&coord.url(), "both verifiers healthy", |i| healthy_verifiers(i) == 2).await;
    Cluster { pair, draft, v1, v2, coord }
}

fn pipelined(prompt: &str, max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest { pipeline: Some(true), ..request(prompt, max_tokens) }
}

async fn reference(url: &str) -> Outcome {
    let out = generate(url, pipelined(PROMPT, MAX_TOKENS), async |_| {}).await.unwrap();
    assert!(out.tokens.len() >= 60, "the reference is long enough to interrupt ({} tokens)", out.tokens.len());
    assert_eq!(out.summary.failovers, 0);
    assert!(out.summary.pipelined && out.summary.predrafts_kept > 0, "{:?}", out.summary);
    let sequential = pb::GenerateRequest { pipeline: Some(false), ..request(PROMPT, MAX_TOKENS) };
    let sequential = generate(url, sequential, async |_| {}).await.unwrap();
    assert_eq!(sequential.tokens, out.tokens, "pipelined and sequential loops agree");
    out
}

/// The verifier replica currently serving a session, by the coordinator's live-session view.
async fn serving_verifier(url: &str) -> String {
    let i = wait_info(url, "a verifier with a live session", |i| {
        i.replicas.iter().any(|r| r.role == "verifier" && r.live_sessions > 0)
    })
    .await;
    i.replicas.into_iter().find(|r| r.role == "verifier" && r.live_sessions > 0).unwrap().url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_serving_verifier_mid_answer_loses_nothing() {
    let mut c = cluster().await;
    let expected = reference(&c.coord.url()).await;
    let url = c.coord.url();
    let mut killed = None;
    let out = generate(&url, pipelined(PROMPT, MAX_TOKENS), async |n| {
        if killed.is_none() && n >= 20 {
            let victim = serving_verifier(&url).await;
            if victim == c.v1.url() {
                c.v1.kill()
            } else {
                c.v2.kill()
            }
            killed = Some(victim);
        }
    })
    .await
    .expect("generation survives the failure");
    assert!(killed.is_some());
    assert_eq!(out.tokens, expected.tokens);
    assert_eq!(out.text, expected.text);
    assert!(out.summary.failovers >= 1, "{:?}", out.summary);
    assert_eq!(out.summary.verifiers.len(), 2, "{:?}", out.summary.verifiers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_verifier_is_left_behind_by_the_deadline() {
    let c = cluster().await;
    let expected = reference(&c.coord.url()).await;
    let url = c.coord.url();
    let mut stopped: Option<&Proc> = None;
    let out = generate(&url, pipelined(PROMPT, MAX_TOKENS), async |n| {
        if stopped.is_none() && n >= 20 {
            let victim = serving_verifier(&url).await;
            let p = if victim == c.v1.url() { &c.v1 } else { &c.v2 };
            p.signal("STOP");
            stopped = Some(p);
        }
    })
    .await
    .expect("generation survives a hung replica");
    stopped.expect("a replica was stopped").signal("CONT");
    assert_eq!(out.tokens, expected.tokens);
    assert!(out.summary.failovers >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_comes_back_is_used_again() {
    let mut c = cluster().await;
    let port = c.v1.port;
    c.v1.kill();
    wait_info(&c.coord.url(), "v1 out of rotation", |i| healthy_verifiers(i) == 1).await;
    c.v1 = worker("verifier", &c.pair.target, port);
    wait_info(&c.coord.url(), "v1 back in rotation", |i| healthy_verifiers(i) == 2).await;
    // Sessions at the same time spread over both replicas (power of two choices on live sessions).
    let url = c.coord.url();
    let runs: Vec<_> = (0..6)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move { generate(&url, request(&format!("story {i}"), 40), async |_| {}).await })
        })
        .collect();
    let mut used = Vec::new();
    for r in runs {
        used.extend(r.await.unwrap().unwrap().summary.verifiers);
    }
    assert!(used.contains(&c.v1.url()), "the restarted replica serves sessions again: {used:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_draft_falls_back_to_target_mode() {
    let mut c = cluster().await;
    let expected = reference(&c.coord.url()).await;
    let url = c.coord.url();
    let mut killed = false;
    let out = generate(&url, pipelined(PROMPT, MAX_TOKENS), async |n| {
        if !killed && n >= 20 {
            c.draft.kill();
            killed = true;
        }
    })
    .await
    .expect("generation completes without a draft");
    // Greedy speculative decoding is lossless, so the target alone continues the same text.
    assert_eq!(out.tokens, expected.tokens);
    assert!(out.summary.note.contains("target mode"), "{:?}", out.summary.note);
    // New sessions keep working without a draft too.
    let again = generate(&url, pipelined(PROMPT, 30), async |_| {}).await.unwrap();
    assert_eq!(again.tokens[..], expected.tokens[..again.tokens.len()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_verifier_left_gives_unavailable_not_a_hang() {
    let mut c = cluster().await;
    c.v1.kill();
    c.v2.kill();
    let started = std::time::Instant::now();
    let err = generate(&c.coord.url(), pipelined(PROMPT, 20), async |_| {}).await.err().expect("must fail");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains("verifier"), "{}", err.message());
    assert!(started.elapsed() < Duration::from_secs(30));
    let _ = &c.draft;
}
