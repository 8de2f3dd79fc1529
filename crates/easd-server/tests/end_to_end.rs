//! End-to-end: real gRPC servers on loopback (draft, verifier, coordinator), tiny GGUF models written from code.

use std::path::Path;
use std::sync::Arc;

use easd_model::{HeadVocab, LoadOptions, Model, TinySpec, Tokenizer, write_tiny_gguf};
use easd_proto::v1::{self as pb, coordinator_client::CoordinatorClient, generate_request::Input};
use easd_server::local::{LocalOptions, LocalStack};
use easd_server::{ServerError, SessionLimits};
use tonic::Code;

struct Models {
    _dir: tempfile::TempDir,
    draft: Arc<Model>,
    target: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    draft_path: std::path::PathBuf,
}

fn tiny_models(draft_variant: u32) -> Models {
    let dir = tempfile::tempdir().unwrap();
    let target_path = dir.path().join("target.gguf");
    let draft_path = dir.path().join("draft.gguf");
    write_tiny_gguf(&target_path, &TinySpec::qwen2(7)).unwrap();
    // The draft is the target with noise: high but imperfect agreement, like a real pair.
    let draft_spec = TinySpec { perturbation: Some((8, 0.3)), tokenizer_variant: draft_variant, ..TinySpec::qwen2(7) };
    write_tiny_gguf(&draft_path, &draft_spec).unwrap();
    let opts = LoadOptions { warmup: false, ..LoadOptions::default() };
    Models {
        draft: Arc::new(Model::load(&draft_path, &opts).unwrap()),
        target: Arc::new(Model::load(&target_path, &opts).unwrap()),
        tokenizer: Arc::new(Tokenizer::from_gguf_file(&target_path).unwrap()),
        draft_path,
        _dir: dir,
    }
}

async fn stack(models: &Models, opts: LocalOptions) -> LocalStack {
    LocalStack::start(models.draft.clone(), models.target.clone(), models.tokenizer.clone(), opts).await.unwrap()
}

fn request(prompt: &str, mode: pb::Mode, max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        input: Some(Input::Prompt(prompt.into())),
        max_tokens: Some(max_tokens),
        temperature: Some(0.0),
        seed: Some(1),
        mode: mode as i32,
        k: Some(4),
        ..Default::default()
    }
}

struct Collected {
    text: String,
    tokens: Vec<u32>,
    deltas: usize,
    summary: pb::Summary,
}

async fn generate(url: &str, req: pb::GenerateRequest) -> Result<Collected, tonic::Status> {
    let mut client = CoordinatorClient::connect(url.to_owned()).await.unwrap();
    let mut stream = client.generate(req).await?.into_inner();
    let (mut text, mut tokens, mut deltas, mut summary) = (String::new(), Vec::new(), 0, None);
    while let Some(event) = stream.message().await? {
        match event.event.unwrap() {
            pb::generate_event::Event::Delta(d) => {
                assert!(summary.is_none(), "the summary must be the last event");
                text.push_str(&d.text);
                tokens.extend(d.token_ids);
                deltas += 1;
            }
            pb::generate_event::Event::Summary(s) => summary = Some(s),
        }
    }
    Ok(Collected { text, tokens, deltas, summary: summary.expect("a summary ends the stream") })
}

fn never_trigger() -> pb::EasdParams {
    pb::EasdParams { tau_draft: Some(1e9), tau_target: Some(1e9), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_sd_and_non_triggering_easd_reproduce_target_mode_exactly() {
    let models = tiny_models(0);
    let stack = stack(&models, LocalOptions::default()).await;
    let prompt = "The quick brown fox";
    let target = generate(&stack.coordinator_url, request(prompt, pb::Mode::Target, 40)).await.unwrap();
    assert_eq!(target.summary.generated_tokens as usize, target.tokens.len());
    assert!(target.deltas > 1, "text is streamed in several deltas");
    assert_eq!(target.summary.target_forwards, target.summary.generated_tokens);

    let sd = generate(&stack.coordinator_url, request(prompt, pb::Mode::Sd, 40)).await.unwrap();
    assert_eq!(sd.tokens, target.tokens);
    assert_eq!(sd.text, target.text);
    assert!(sd.summary.drafted_tokens > 0);
    assert!(sd.summary.accepted_tokens > 0, "a perturbed draft agrees with its target sometimes");
    assert!(sd.summary.target_forwards < target.summary.target_forwards, "speculation saves target forwards");

    let mut easd_req = request(prompt, pb::Mode::Easd, 40);
    easd_req.easd = Some(never_trigger());
    let easd = generate(&stack.coordinator_url, easd_req).await.unwrap();
    assert_eq!(easd.tokens, target.tokens);
    assert_eq!(easd.summary.easd_triggers, 0);
    assert_eq!(easd.summary.mode, "easd");
    stack.shutdown().await;
}

/// The value of the sample line `series value` in a metrics text (0 when absent).
fn sample(text: &str, series: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_mode_or_k_get_the_coordinator_defaults() {
    let models = tiny_models(0);
    let opts = LocalOptions {
        default_mode: easd_server::coordinator::ModeKind::Easd,
        default_k: 2,
        ..LocalOptions::default()
    };
    let stack = stack(&models, opts).await;
    let req = pb::GenerateRequest {
        mode: pb::Mode::Unspecified as i32,
        k: None,
        ..request("Once upon a time", pb::Mode::Sd, 24)
    };
    let s = generate(&stack.coordinator_url, req).await.unwrap().summary;
    assert_eq!(s.mode, "easd");
    // k = 2: every block drafts two tokens except possibly a last, shortened one.
    assert!(s.drafted_tokens <= 2 * s.blocks && s.drafted_tokens > 2 * (s.blocks - 1), "{s:?}");
    let text = stack.coordinator.metrics().encode();
    assert_eq!(sample(&text, r#"easd_coordinator_requests_total{mode="easd",status="ok"}"#), 1.0, "{text}");
    assert_eq!(sample(&text, r#"easd_coordinator_drafted_tokens_total{mode="easd"}"#), f64::from(s.drafted_tokens));
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn easd_that_always_triggers_changes_the_output_and_counts_triggers() {
    let models = tiny_models(0);
    let stack = stack(&models, LocalOptions::default()).await;
    let mut req = request("Once upon a time", pb::Mode::Easd, 24);
    req.easd =
        Some(pb::EasdParams { tau_draft: Some(0.0), tau_target: Some(0.0), rho: Some(0.0), ..Default::default() });
    let easd = generate(&stack.coordinator_url, req).await.unwrap();
    let target = generate(&stack.coordinator_url, request("Once upon a time", pb::Mode::Target, 24)).await.unwrap();
    assert!(easd.summary.easd_triggers > 0);
    assert_eq!(easd.summary.easd_triggers as usize, easd.summary.triggers.len());
    assert_eq!(easd.summary.accepted_tokens, 0, "with zero thresholds every accepted token is rejected");
    assert_ne!(easd.tokens, target.tokens);
    stack.shutdown().await;
}

/// Greedy decoding with the draft model alone, straight through the model runtime.
fn greedy_alone(model: &Model, tokenizer: &Tokenizer, prompt: &str, n: usize) -> Vec<u32> {
    let mut tokens = tokenizer.encode(prompt).unwrap();
    let mut cache = model.new_cache();
    let mut feed = tokens.clone();
    let mut out = Vec::new();
    for _ in 0..n {
        let start = cache.len();
        let logits = model.forward(&mut cache, &feed, start).unwrap();
        let next = easd_core::argmax(logits.row(logits.rows() - 1));
        if tokenizer.stop_token_ids().contains(&next) {
            break;
        }
        out.push(next);
        tokens.push(next);
        feed = vec![next];
    }
    out
}

/// A draft that scores only some ids (a pruned head: the rest are −∞) proposes only those, and greedy `sd` still
/// emits exactly the target's tokens, those outside the draft's head included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_whose_head_scores_only_some_ids_keeps_greedy_sd_equal_to_target() {
    let mut models = tiny_models(0);
    let pruned = LoadOptions { warmup: false, head_vocab: Some(HeadVocab::first(120)), ..LoadOptions::default() };
    models.draft = Arc::new(Model::load(&models.draft_path, &pruned).unwrap());
    assert!(models.draft.info().head_rows < models.draft.info().vocab_size);
    let stack = stack(&models, LocalOptions::default()).await;
    let prompt = "The quick brown fox";
    let target = generate(&stack.coordinator_url, request(prompt, pb::Mode::Target, 40)).await.unwrap();
    let specials = models.tokenizer.special_token_ids();
    assert!(
        target.tokens.iter().any(|&t| t >= 120 && !specials.contains(&t)),
        "the target picks ids the draft cannot propose: {:?}",
        target.tokens
    );
    let draft_alone = greedy_alone(&models.draft, &models.tokenizer, prompt, 40);
    assert!(draft_alone.iter().all(|&t| t < 120 || specials.contains(&t)), "{draft_alone:?}");
    let sd = generate(&stack.coordinator_url, request(prompt, pb::Mode::Sd, 40)).await.unwrap();
    assert_eq!(sd.tokens, target.tokens);
    assert!(sd.summary.accepted_tokens > 0 && sd.summary.accepted_tokens < sd.summary.drafted_tokens);
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draft_mode_equals_the_draft_model_alone() {
    let models = tiny_models(0);
    let stack = stack(&models, LocalOptions::default()).await;
    let got = generate(&stack.coordinator_url, request("def main():", pb::Mode::Draft, 30)).await.unwrap();
    let expected = greedy_alone(&models.draft, &models.tokenizer, "def main():", 30);
    assert_eq!(got.tokens, expected);
    assert_eq!(got.summary.target_forwards, 0);
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_sessions_each_match_their_sequential_result() {
    let models = tiny_models(0);
    let stack = stack(&models, LocalOptions::default()).await;
    let prompts: Vec<String> = (0..16).map(|i| format!("Question {i}: what is {i} + {i}?")).collect();
    let mut expected = Vec::new();
    for p in &prompts[..4] {
        expected.push(generate(&stack.coordinator_url, request(p, pb::Mode::Sd, 12)).await.unwrap().tokens);
    }
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (url, req) = (stack.coordinator_url.clone(), request(p, pb::Mode::Sd, 12));
            tokio::spawn(async move { generate(&url, req).await })
        })
        .collect();
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.unwrap().unwrap());
    }
    for (i, r) in results.iter().enumerate() {
        assert!(!r.tokens.is_empty(), "session {i} produced tokens");
        if i < expected.len() {
            assert_eq!(r.tokens, expected[i], "session {i} equals its sequential run");
        }
    }
    // Released at the end of each generation: nothing leaks.
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while stack.verifier_workers[0].sessions.stats().sessions > 0
            || stack.draft_worker.sessions.stats().sessions > 0
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("sessions are released after generation");
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_sessions_are_rebuilt_transparently() {
    let models = tiny_models(0);
    // A budget that holds one session's cache (128 KiB: the tiny model's first 256 positions) but not two evicts the
    // idle sessions after each request of another session.
    let tight = LocalOptions {
        limits: SessionLimits { budget_bytes: 200 << 10, ..SessionLimits::default() },
        ..LocalOptions::default()
    };
    // Several long sessions polled together, so their requests interleave and idle sessions get evicted.
    let prompts = ["alpha beta", "gamma delta", "epsilon zeta"];
    let reference_stack = stack(&models, LocalOptions::default()).await;
    let mut expected = Vec::new();
    for p in prompts {
        expected.push(generate(&reference_stack.coordinator_url, request(p, pb::Mode::Sd, 48)).await.unwrap().tokens);
    }
    reference_stack.shutdown().await;

    let stack = stack(&models, tight).await;
    let url = &stack.coordinator_url;
    let (r0, r1, r2) = tokio::join!(
        generate(url, request(prompts[0], pb::Mode::Sd, 48)),
        generate(url, request(prompts[1], pb::Mode::Sd, 48)),
        generate(url, request(prompts[2], pb::Mode::Sd, 48)),
    );
    for (i, r) in [r0, r1, r2].into_iter().enumerate() {
        assert_eq!(r.unwrap().tokens, expected[i], "session {i} is unchanged by evictions");
    }
    let evictions =
        stack.verifier_workers[0].sessions.stats().evictions + stack.draft_worker.sessions.stats().evictions;
    assert!(evictions > 0, "the tight budget evicted sessions");
    let counted: f64 = [&stack.draft_worker, &stack.verifier_workers[0]]
        .iter()
        .map(|w| sample(&w.metrics().encode(), &format!("easd_worker_evictions_total{{role=\"{}\"}}", w.role)))
        .sum();
    assert_eq!(counted, evictions as f64, "every eviction is counted in the worker metrics");
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatched_tokenizers_are_refused() {
    let models = tiny_models(1);
    let err = LocalStack::start(
        models.draft.clone(),
        models.target.clone(),
        models.tokenizer.clone(),
        LocalOptions::default(),
    )
    .await
    .err()
    .expect("the coordinator must refuse a draft with another tokenizer");
    assert!(matches!(err, ServerError::Incompatible(_)), "{err}");
    assert!(err.to_string().contains("tokenizer fingerprint"), "{err}");
    let _ = Path::new(&models.draft_path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_invalid_field_is_rejected_with_its_name() {
    let models = tiny_models(0);
    let stack = stack(&models, LocalOptions::default()).await;
    let base = || request("hello", pb::Mode::Sd, 8);
    let cases: Vec<(&str, pb::GenerateRequest)> = vec![
        ("input", pb::GenerateRequest { input: None, ..base() }),
        ("prompt", pb::GenerateRequest { input: Some(Input::Prompt(String::new())), ..base() }),
        (
            "chat.messages",
            pb::GenerateRequest { input: Some(Input::Chat(pb::ChatMessages { messages: vec![] })), ..base() },
        ),
        (
            "chat.messages.role",
            pb::GenerateRequest {
                input: Some(Input::Chat(pb::ChatMessages {
                    messages: vec![pb::ChatMessage { role: "wizard".into(), content: "hi".into() }],
                })),
                ..base()
            },
        ),
        ("max_tokens", pb::GenerateRequest { max_tokens: Some(0), ..base() }),
        ("max_tokens", pb::GenerateRequest { max_tokens: Some(1_000_000), ..base() }),
        ("temperature", pb::GenerateRequest { temperature: Some(-1.0), ..base() }),
        ("temperature", pb::GenerateRequest { temperature: Some(f32::NAN), ..base() }),
        ("top_p", pb::GenerateRequest { top_p: Some(0.0), ..base() }),
        ("top_p", pb::GenerateRequest { top_p: Some(1.5), ..base() }),
        ("mode", pb::GenerateRequest { mode: 42, ..base() }),
        ("k", pb::GenerateRequest { k: Some(0), ..base() }),
        ("k", pb::GenerateRequest { k: Some(1000), ..base() }),
        (
            "easd.top_n",
            pb::GenerateRequest { easd: Some(pb::EasdParams { top_n: Some(0), ..Default::default() }), ..base() },
        ),
        (
            "easd.rho",
            pb::GenerateRequest { easd: Some(pb::EasdParams { rho: Some(1.5), ..Default::default() }), ..base() },
        ),
        (
            "easd.tau_draft",
            pb::GenerateRequest {
                easd: Some(pb::EasdParams { tau_draft: Some(-1.0), ..Default::default() }),
                ..base()
            },
        ),
        (
            "easd.tau_target",
            pb::GenerateRequest {
                easd: Some(pb::EasdParams { tau_target: Some(f32::INFINITY), ..Default::default() }),
                ..base()
            },
        ),
        ("easd.order", pb::GenerateRequest { easd: Some(pb::EasdParams { order: 9, ..Default::default() }), ..base() }),
        (
            "easd.penalty_alpha",
            pb::GenerateRequest {
                easd: Some(pb::EasdParams { penalty_alpha: Some(1.0), ..Default::default() }),
                ..base()
            },
        ),
        ("stop", pb::GenerateRequest { stop: vec![String::new()], ..base() }),
        ("stop", pb::GenerateRequest { stop: vec!["s".repeat(1025)], ..base() }),
        ("request_id", pb::GenerateRequest { request_id: "r".repeat(129), ..base() }),
        ("request_id", pb::GenerateRequest { request_id: "line\nbreak".into(), ..base() }),
        ("logprobs", pb::GenerateRequest { logprobs: 21, ..base() }),
        ("logprobs", pb::GenerateRequest { logprobs: 2, mode: pb::Mode::Draft as i32, ..base() }),
    ];
    for (field, req) in cases {
        let status =
            generate(&stack.coordinator_url, req).await.err().unwrap_or_else(|| panic!("{field} must be rejected"));
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(status.message().contains(&format!("invalid {field}:")), "{field}: {}", status.message());
    }
    // The server keeps serving after bad input.
    assert!(generate(&stack.coordinator_url, base()).await.is_ok());
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_logprobs_and_chat_work_together() {
    let models = tiny_models(0);
    let stack = stack(&models, LocalOptions::default()).await;
    let full = generate(&stack.coordinator_url, request("abc", pb::Mode::Sd, 30)).await.unwrap();
    // Stop at a string taken from the unconstrained output: the text ends right before it.
    let chars: Vec<char> = full.text.chars().collect();
    if chars.len() > 6 {
        let stop: String = chars[4..6].iter().collect();
        let mut req = request("abc", pb::Mode::Sd, 30);
        req.stop = vec![stop.clone()];
        let cut = generate(&stack.coordinator_url, req).await.unwrap();
        let at = full.text.find(&stop).unwrap();
        assert_eq!(cut.text, full.text[..at]);
        assert_eq!(cut.summary.finish_reason, "stop");
    }
    let mut req = request("abc", pb::Mode::Sd, 10);
    req.logprobs = 3;
    let mut client = CoordinatorClient::connect(stack.coordinator_url.clone()).await.unwrap();
    let mut stream = client.generate(req).await.unwrap().into_inner();
    let mut infos = Vec::new();
    while let Some(ev) = stream.message().await.unwrap() {
        if let Some(pb::generate_event::Event::Delta(d)) = ev.event {
            assert_eq!(d.logprobs.len(), d.token_ids.len());
            infos.extend(d.logprobs);
        }
    }
    assert!(!infos.is_empty());
    for info in &infos {
        assert!(info.logprob <= 0.0 && info.logprob.is_finite());
        assert_eq!(info.top_logprobs.len(), 3);
        // Greedy: the emitted token is the target's most likely one.
        assert_eq!(info.top_logprobs[0].token, info.token);
    }
    let chat = pb::GenerateRequest {
        input: Some(Input::Chat(pb::ChatMessages {
            messages: vec![pb::ChatMessage { role: "user".into(), content: "hi".into() }],
        })),
        ..request("", pb::Mode::Sd, 5)
    };
    let out = generate(&stack.coordinator_url, chat).await.unwrap();
    assert!(out.summary.prompt_tokens > 3, "the chat template wraps the message");
    stack.shutdown().await;
}

/// Pipelined and sequential loops on the same request give the same tokens (greedy and sampled, sd and easd);
/// afterwards no worker holds the session, even though pre-drafts were dropped on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipelined_loop_emits_the_sequential_loops_tokens() {
    let models = tiny_models(0);
    let stack = stack(&models, LocalOptions::default()).await;
    let eager = pb::EasdParams { tau_draft: Some(0.0), tau_target: Some(0.0), rho: Some(0.0), ..Default::default() };
    let cases = [
        (pb::Mode::Sd, 0.0, None, 4),
        (pb::Mode::Sd, 1.0, None, 4),
        (pb::Mode::Sd, 0.7, None, 3),
        (pb::Mode::Easd, 0.0, None, 4),
        (pb::Mode::Easd, 0.0, Some(eager), 4),
        (pb::Mode::Easd, 1.0, Some(eager), 4),
    ];
    let mut kept = 0;
    let mut dropped = 0;
    for (mode, temperature, easd, k) in cases {
        let eager = easd.is_some();
        let req = pb::GenerateRequest {
            temperature: Some(temperature),
            seed: Some(5),
            easd,
            k: Some(k),
            ..request("Once upon a time in a land", mode, 60)
        };
        let sequential = pb::GenerateRequest { pipeline: Some(false), ..req.clone() };
        let pipelined = pb::GenerateRequest { pipeline: Some(true), ..req };
        let s = generate(&stack.coordinator_url, sequential).await.unwrap();
        let p = generate(&stack.coordinator_url, pipelined).await.unwrap();
        let case = format!("{mode:?} at temperature {temperature}, k {k}");
        assert_eq!(p.tokens, s.tokens, "{case}");
        assert_eq!(p.text, s.text, "{case}");
        assert!(p.summary.pipelined && !s.summary.pipelined, "{case}");
        assert!(!eager || s.summary.easd_triggers > 0, "{case}: the thresholds make the rule fire");
        // Greedy sd's pipelined blocks are flexible (an empty first block, then growing with the draft's lead): the
        // same tokens from other blocks. Every other request keeps the sequential loop's blocks, with one more target
        // forward: the verifier's prefill beside the first proposal.
        if temperature > 0.0 || mode == pb::Mode::Easd {
            assert_eq!(
                (p.summary.blocks, p.summary.accepted_tokens, p.summary.easd_triggers, p.summary.target_forwards),
                (s.summary.blocks, s.summary.accepted_tokens, s.summary.easd_triggers, s.summary.target_forwards + 1),
                "{case}: the same blocks were verified"
            );
        }
        kept += p.summary.predrafts_kept;
        dropped += p.summary.predrafts_dropped;
    }
    assert!(kept > 0 && dropped > 0, "both outcomes of drafting ahead were exercised: kept {kept}, dropped {dropped}");
    // Releases are sent without making the client wait: poll (bounded) until both workers hold nothing.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stack.draft_worker.sessions.stats().sessions + stack.verifier_workers[0].sessions.stats().sessions > 0 {
        assert!(std::time::Instant::now() < deadline, "a session leaked on a worker");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    stack.shutdown().await;
}

/// A pipelined request that stops early (max_tokens, stop string) or whose client goes away mid-answer leaves no
/// session behind on either worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_generation_ended_early_releases_both_workers() {
    let models = tiny_models(0);
    let stack = stack(&models, LocalOptions { pipeline: true, ..LocalOptions::default() }).await;
    let full = generate(&stack.coordinator_url, request("abc", pb::Mode::Sd, 40)).await.unwrap();
    assert!(full.summary.pipelined, "the stack's default applies");
    let stop = full.text.chars().skip(12).take(3).collect::<String>();
    let stopped = pb::GenerateRequest { stop: vec![stop.clone()], ..request("abc", pb::Mode::Sd, 40) };
    let stopped = generate(&stack.coordinator_url, stopped).await.unwrap();
    assert_eq!(stopped.summary.finish_reason, "stop");
    assert_eq!(stopped.text, full.text[..full.text.find(&stop).unwrap()]);
    let short = generate(&stack.coordinator_url, request("abc", pb::Mode::Sd, 7)).await.unwrap();
    assert_eq!(short.tokens, full.tokens[..7]);
    // A client that reads one delta and hangs up.
    let mut client = CoordinatorClient::connect(stack.coordinator_url.clone()).await.unwrap();
    let mut stream = client.generate(request("abc", pb::Mode::Sd, 200)).await.unwrap().into_inner();
    assert!(stream.message().await.unwrap().is_some());
    drop(stream);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stack.draft_worker.sessions.stats().sessions + stack.verifier_workers[0].sessions.stats().sessions > 0 {
        assert!(std::time::Instant::now() < deadline, "a session leaked on a worker");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    stack.shutdown().await;
}

/// With speculation off at one live session (every session counts itself), greedy sd runs the target alone: no
/// draft token, the target's tokens, and the summary says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_sd_under_load_runs_the_target_alone_with_the_same_tokens() {
    let models = tiny_models(0);
    let stack = stack(&models, LocalOptions { speculation_off_at: 1, ..LocalOptions::default() }).await;
    let target = generate(&stack.coordinator_url, request("Once upon a time", pb::Mode::Target, 30)).await.unwrap();
    let sd = generate(&stack.coordinator_url, request("Once upon a time", pb::Mode::Sd, 30)).await.unwrap();
    assert_eq!(sd.tokens, target.tokens);
    assert_eq!((sd.summary.drafted_tokens, sd.summary.mode.as_str()), (0, "sd"));
    assert!(sd.summary.note.contains("ran the target alone"), "{:?}", sd.summary.note);
    // Sampled sd keeps speculating.
    let sampled = pb::GenerateRequest { temperature: Some(0.8), ..request("Once upon a time", pb::Mode::Sd, 30) };
    let sampled = generate(&stack.coordinator_url, sampled).await.unwrap();
    assert!(sampled.summary.drafted_tokens > 0);
    stack.shutdown().await;
}
