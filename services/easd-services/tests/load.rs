//! Bounded load test on loopback: 64 concurrent sessions over 2 verifier replicas, for a fixed number of
//! requests. All must complete, sessions must spread over both replicas, every worker must have batched forwards
//! across sessions, and memory must not keep growing (RSS after a second round ≈ after the first). Prints latency
//! percentiles, batch sizes and RSS figures.

mod support;

use std::time::Instant;

use support::*;

const CONCURRENCY: usize = 64;
const ROUNDS: usize = 2;
const MAX_TOKENS: u32 = 12;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_sessions_over_two_replicas() {
    let pair = tiny_pair();
    let metrics_ports = [free_port(), free_port(), free_port()];
    let metrics = |i: usize| vec![format!("--metrics-listen=127.0.0.1:{}", metrics_ports[i])];
    let draft = worker_flags("draft", &pair.draft, free_port(), &metrics(0));
    let v1 = worker_flags("verifier", &pair.target, free_port(), &metrics(1));
    let v2 = worker_flags("verifier", &pair.target, free_port(), &metrics(2));
    for p in [&draft, &v1, &v2] {
        wait_serving(&p.url()).await;
    }
    let coord = coordinator(&pair, &[&draft], &[v1.port, v2.port], &["--health-interval-s=0.2"]);
    wait_serving(&coord.url()).await;
    wait_info(&coord.url(), "both verifiers healthy", |i| healthy_verifiers(i) == 2).await;
    let procs = [("coordinator", &coord), ("draft", &draft), ("verifier-1", &v1), ("verifier-2", &v2)];
    let rss = || procs.iter().map(|(n, p)| (*n, p.rss_kib())).collect::<Vec<_>>();
    let before = rss();

    let mut after_round = Vec::new();
    let mut latencies = Vec::new();
    let mut per_replica = std::collections::HashMap::<String, usize>::new();
    for round in 0..ROUNDS {
        let url = coord.url();
        let tasks: Vec<_> = (0..CONCURRENCY)
            .map(|i| {
                let url = url.clone();
                let mut req = request(&format!("Request {round}-{i}: tell me about"), MAX_TOKENS);
                req.temperature = Some(0.8);
                req.seed = Some(i as u64);
                tokio::spawn(async move {
                    let started = Instant::now();
                    let out = generate(&url, req, async |_| {}).await;
                    (started.elapsed().as_secs_f64(), out)
                })
            })
            .collect();
        for t in tasks {
            let (secs, out) = t.await.unwrap();
            let out = out.expect("every request completes");
            assert!(out.summary.generated_tokens > 0);
            latencies.push(secs);
            for v in out.summary.verifiers {
                *per_replica.entry(v).or_default() += 1;
            }
        }
        after_round.push(rss());
    }
    latencies.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&latencies, 50.0), percentile(&latencies, 99.0));
    println!("load: {} requests, concurrency {CONCURRENCY}: p50 {p50:.3} s, p99 {p99:.3} s", latencies.len());
    println!("sessions per replica: {per_replica:?}");
    for (i, (name, kib)) in before.iter().enumerate() {
        let rounds: Vec<String> = after_round.iter().map(|r| format!("{} KiB", r[i].1)).collect();
        println!("RSS {name}: before {kib} KiB, after each round {}", rounds.join(", "));
    }

    assert_eq!(latencies.len(), CONCURRENCY * ROUNDS);
    assert_eq!(per_replica.len(), 2, "sessions spread over both replicas: {per_replica:?}");
    for n in per_replica.values() {
        assert!(*n >= CONCURRENCY * ROUNDS / 4, "neither replica starves: {per_replica:?}");
    }
    // Warm-up (allocator arenas, caches) happens in round one; later rounds must not keep growing.
    for (i, (name, _)) in before.iter().enumerate() {
        let first = after_round[0][i].1 as f64;
        let last = after_round[ROUNDS - 1][i].1 as f64;
        assert!(last <= first * 1.25 + 8.0 * 1024.0, "{name} RSS grew from {first} KiB to {last} KiB after warm-up");
    }
    // Cross-session batching: every worker computed forwards over several sessions' rows.
    for (i, role) in ["draft", "verifier", "verifier"].into_iter().enumerate() {
        let text = metrics_text(metrics_ports[i]).await;
        let series = |stat: &str| {
            sample(&text, &format!("easd_worker_batch_sessions_{stat}{{role=\"{role}\"}}")).expect("batch metric")
        };
        let (forwards, sessions) = (series("count"), series("sum"));
        println!("{role} {i}: {forwards} forwards, {:.2} sessions per forward", sessions / forwards);
        assert!(sessions > forwards, "{role} {i} never batched sessions: {forwards} forwards, {sessions} sessions");
    }
    // Sessions are released: the replicas end with none live.
    wait_info(&coord.url(), "no live sessions", |i| i.replicas.iter().all(|r| r.live_sessions == 0)).await;
}
