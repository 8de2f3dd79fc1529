//! Cross-session batching end to end (real gRPC servers on loopback, tiny models): sessions whose forwards share
//! batches get exactly the tokens each gets alone.

use std::sync::Arc;

use easd_model::{LoadOptions, Model, TinySpec, Tokenizer, write_tiny_gguf};
use easd_proto::v1::{self as pb, coordinator_client::CoordinatorClient, generate_request::Input};
use easd_server::Worker;
use easd_server::local::{LocalOptions, LocalStack};

async fn generate(url: &str, req: pb::GenerateRequest) -> Vec<u32> {
    let mut client = CoordinatorClient::connect(url.to_owned()).await.unwrap();
    let mut stream = client.generate(req).await.unwrap().into_inner();
    let mut tokens = Vec::new();
    while let Some(event) = stream.message().await.unwrap() {
        if let Some(pb::generate_event::Event::Delta(d)) = event.event {
            tokens.extend(d.token_ids);
        }
    }
    tokens
}

/// (forwards, sessions summed over them) from the worker's batch-size histogram.
fn batch_stats(worker: &Worker) -> (f64, f64) {
    let text = worker.metrics().encode();
    let value = |stat: &str| {
        let series = format!("easd_worker_batch_sessions_{stat}{{role=\"{}\"}}", worker.role);
        text.lines().find_map(|l| l.strip_prefix(series.as_str())?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
    };
    (value("count"), value("sum"))
}

/// Eight sessions — sd and easd, greedy and sampled, sequential and pipelined loops, target and draft modes — run
/// one at a time, then all at once: the same seeds give the same tokens, and both workers batched sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_sessions_get_the_tokens_each_gets_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (target_path, draft_path) = (dir.path().join("target.gguf"), dir.path().join("draft.gguf"));
    write_tiny_gguf(&target_path, &TinySpec::qwen2(7)).unwrap();
    write_tiny_gguf(&draft_path, &TinySpec { perturbation: Some((8, 0.3)), ..TinySpec::qwen2(7) }).unwrap();
    let opts = LoadOptions { warmup: false, ..LoadOptions::default() };
    let draft = Arc::new(Model::load(&draft_path, &opts).unwrap());
    let target = Arc::new(Model::load(&target_path, &opts).unwrap());
    let tokenizer = Arc::new(Tokenizer::from_gguf_file(&target_path).unwrap());
    let stack = LocalStack::start(draft, target, tokenizer, LocalOptions::default()).await.unwrap();

    use pb::Mode::{Draft, Easd, Sd, Target};
    let modes = [Sd, Easd, Sd, Target, Sd, Easd, Draft, Sd];
    let requests: Vec<pb::GenerateRequest> = modes
        .iter()
        .enumerate()
        .map(|(i, mode)| pb::GenerateRequest {
            input: Some(Input::Prompt(format!("Session {i}: once upon a time"))),
            max_tokens: Some(32),
            temperature: Some(if i % 2 == 0 { 0.9 } else { 0.0 }),
            seed: Some(40 + i as u64),
            mode: *mode as i32,
            k: Some(3 + (i % 3) as u32),
            pipeline: Some(i % 3 == 0),
            ..Default::default()
        })
        .collect();
    let mut alone = Vec::new();
    for req in &requests {
        alone.push(generate(&stack.coordinator_url, req.clone()).await);
    }
    let workers = [&stack.draft_worker, &stack.verifier_workers[0]];
    let before = workers.map(|w| batch_stats(w));
    for (w, (forwards, sessions)) in workers.iter().zip(before) {
        assert_eq!(forwards, sessions, "{}: one session at a time, one session per forward", w.role);
    }

    let tasks: Vec<_> =
        requests.iter().map(|req| tokio::spawn(generate_owned(stack.coordinator_url.clone(), req.clone()))).collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let together = task.await.unwrap();
        assert!(!together.is_empty(), "session {i} generated tokens");
        assert_eq!(together, alone[i], "session {i} ({:?}): batched = alone", modes[i]);
    }
    for (w, (forwards, sessions)) in workers.iter().zip(before) {
        let (f, s) = batch_stats(w);
        let (forwards, sessions) = (f - forwards, s - sessions);
        println!("{}: {sessions} sessions in {forwards} forwards", w.role);
        assert!(sessions > forwards, "{} batched sessions: {sessions} sessions in {forwards} forwards", w.role);
    }
    stack.shutdown().await;
}

async fn generate_owned(url: String, req: pb::GenerateRequest) -> Vec<u32> {
    generate(&url, req).await
}
