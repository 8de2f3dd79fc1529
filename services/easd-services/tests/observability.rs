//! Observability across real processes on loopback: one `Generate` call is one OpenTelemetry trace through the
//! coordinator, the draft and the verifier (exported over OTLP to an in-process receiver), and the Prometheus
//! counters of the coordinator and the workers agree with the requests' summaries.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use easd_proto::v1 as pb;
use easd_telemetry::testing::{OtlpReceiver, ReceivedSpan, describe};
use support::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const PROMPT: &str = "In a distant galaxy";

fn spawn(bin: &str, name: &str, port: u16, args: Vec<String>, env: &[(&str, &str)]) -> Proc {
    let child = Command::new(bin)
        .args(args)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin}: {e}"));
    Proc { child, name: name.to_owned(), port }
}

fn worker_with(kind: &str, model: &Path, extra: &[String], env: &[(&str, &str)]) -> Proc {
    let bin = match kind {
        "draft" => env!("CARGO_BIN_EXE_easd-draft"),
        _ => env!("CARGO_BIN_EXE_easd-verifier"),
    };
    let port = free_port();
    let mut args = vec![format!("--listen=127.0.0.1:{port}"), format!("--model={}", model.display())];
    args.extend_from_slice(extra);
    spawn(bin, kind, port, args, env)
}

fn coordinator_with(pair: &TinyPair, draft: &Proc, verifier: &Proc, extra: &[String], env: &[(&str, &str)]) -> Proc {
    let port = free_port();
    let mut args = vec![
        format!("--listen=127.0.0.1:{port}"),
        format!("--tokenizer={}", pair.target.display()),
        format!("--draft={}", draft.url()),
        format!("--verifier={}", verifier.url()),
    ];
    // The span and counter arithmetic below is the sequential loop's (one proposal per block); drafting ahead
    // changes only the timing and is checked by the loop's own tests.
    args.push("--no-pipeline".into());
    args.extend_from_slice(extra);
    spawn(env!("CARGO_BIN_EXE_easd-coordinator"), "coordinator", port, args, env)
}

/// SIGTERM, then a bounded wait for a clean exit (the services flush their spans on the way out).
async fn terminate(p: &mut Proc) {
    p.signal("TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            assert!(status.success(), "{} exited with {status}", p.name);
            return;
        }
        assert!(Instant::now() < deadline, "{} did not exit within 20 s of SIGTERM", p.name);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn find<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn attr_u64(span: &ReceivedSpan, key: &str, spans: &[ReceivedSpan]) -> u64 {
    let value = span.attribute(key).unwrap_or_else(|| panic!("{} has no {key}:\n{}", span.name, describe(spans)));
    value.parse().unwrap_or_else(|_| panic!("{} attribute {key}={value:?} is not a count", span.name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_generate_call_is_one_trace_across_coordinator_draft_and_verifier() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint()), ("OTEL_BSP_SCHEDULE_DELAY", "100")];
    let pair = tiny_pair();
    let mut draft = worker_with("draft", &pair.draft, &[], &env);
    let mut verifier = worker_with("verifier", &pair.target, &[], &env);
    wait_serving(&draft.url()).await;
    wait_serving(&verifier.url()).await;
    let mut coord = coordinator_with(&pair, &draft, &verifier, &[], &env);
    wait_serving(&coord.url()).await;

    let req = pb::GenerateRequest { request_id: "trace-me".into(), mode: pb::Mode::Easd as i32, ..request(PROMPT, 24) };
    let summary = generate(&coord.url(), req, async |_| {}).await.unwrap().summary;
    for p in [&mut coord, &mut draft, &mut verifier] {
        terminate(p).await;
    }
    // Every process flushed before exiting, so everything has arrived; the wait only bounds a slow receiver.
    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| {
            let has = |service: &str, name: &str| spans.iter().any(|s| s.service_name == service && s.name == name);
            has("easd-coordinator", "session") && has("easd-draft", "forward") && has("easd-verifier", "forward")
        })
        .await
        .unwrap();

    let sessions = find(&spans, "session");
    assert_eq!(sessions.len(), 1, "{}", describe(&spans));
    let session = sessions[0];
    assert_eq!(session.service_name, "easd-coordinator");
    assert_eq!(session.attribute("session_id"), Some("trace-me"));
    assert_eq!(session.attribute("mode"), Some("easd"));
    assert_eq!(session.attribute("k"), Some("4"));
    // The test client sent no trace context: the coordinator's server span is the root, the session its child.
    let generate_span = spans.iter().find(|s| session.is_child_of(s)).expect("the session has a parent span");
    assert_eq!(generate_span.name, "easd.v1.Coordinator/Generate");
    assert_eq!((generate_span.kind, generate_span.parent_span_id.as_deref()), ("server", None));

    // One trace: every span of the call, in every service, shares the session's trace id.
    let trace: Vec<ReceivedSpan> = spans.iter().filter(|s| s.trace_id == session.trace_id).cloned().collect();
    let services: std::collections::BTreeSet<&str> = trace.iter().map(|s| s.service_name.as_str()).collect();
    assert_eq!(services.into_iter().collect::<Vec<_>>(), ["easd-coordinator", "easd-draft", "easd-verifier"]);

    // session → step (one per block, with the block's accepted tokens and EASD triggers).
    let steps = find(&trace, "step");
    assert_eq!(steps.len(), summary.blocks as usize, "{}", describe(&trace));
    assert!(steps.iter().all(|s| s.is_child_of(session)), "{}", describe(&trace));
    let accepted: u64 = steps.iter().map(|s| attr_u64(s, "accepted", &trace)).sum();
    let triggers: u64 = steps.iter().map(|s| attr_u64(s, "triggers", &trace)).sum();
    assert_eq!(accepted, u64::from(summary.accepted_tokens));
    assert_eq!(triggers, u64::from(summary.easd_triggers));

    // step → draft.propose / verify client spans, naming the replica.
    let proposes = find(&trace, "draft.propose");
    let verifies = find(&trace, "verify");
    assert_eq!(verifies.len(), summary.target_forwards as usize, "{}", describe(&trace));
    assert_eq!(proposes.len(), summary.blocks as usize, "{}", describe(&trace));
    for call in proposes.iter().chain(&verifies) {
        assert_eq!(call.kind, "client");
        assert!(steps.iter().any(|s| call.is_child_of(s)), "{} outside a step:\n{}", call.name, describe(&trace));
    }
    assert!(proposes.iter().all(|s| s.attribute("replica") == Some(draft.url().as_str())));
    assert!(verifies.iter().all(|s| s.attribute("replica") == Some(verifier.url().as_str())));

    // client span → the worker's server span (joined through the traceparent metadata) → forward / rollback.
    for (client_spans, rpc, service) in
        [(&proposes, "easd.v1.Draft/Propose", "easd-draft"), (&verifies, "easd.v1.Verifier/Verify", "easd-verifier")]
    {
        let servers = find(&trace, rpc);
        assert_eq!(servers.len(), client_spans.len(), "{rpc}:\n{}", describe(&trace));
        for server in &servers {
            assert_eq!((server.kind, server.service_name.as_str()), ("server", service));
            assert!(
                client_spans.iter().any(|c| server.is_child_of(c)),
                "{rpc} not under its call:\n{}",
                describe(&trace)
            );
        }
        let forwards: Vec<&ReceivedSpan> =
            trace.iter().filter(|s| s.service_name == service && s.name == "forward").collect();
        assert!(!forwards.is_empty(), "{service} traced no forward:\n{}", describe(&trace));
        for forward in &forwards {
            assert!(servers.iter().any(|s| forward.is_child_of(s)), "{service} forward outside {rpc}");
            assert!(attr_u64(forward, "batch_len", &trace) >= 1);
        }
        let rollbacks: Vec<&ReceivedSpan> =
            trace.iter().filter(|s| s.service_name == service && s.name == "cache.rollback").collect();
        assert_eq!(rollbacks.len(), servers.len(), "one rollback per {rpc}");
        assert!(rollbacks.iter().all(|r| servers.iter().any(|s| r.is_child_of(s))));
    }
    // The draft forwards once per proposed token (the prefill, then each proposal fed back).
    let draft_forwards = trace.iter().filter(|s| s.service_name == "easd-draft" && s.name == "forward").count();
    assert_eq!(draft_forwards, summary.drafted_tokens as usize);
}

/// `GET path` over a plain TCP connection; returns the body.
async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

/// Sum of the samples of `name` whose labels include every pair of `labels` (None: no such series).
fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut total = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let (series_name, series_labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if series_name != name {
            continue;
        }
        let parsed: BTreeMap<&str, &str> = series_labels
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        if labels.iter().all(|(k, v)| parsed.get(k) == Some(v)) {
            *total.get_or_insert(0.0) += value.parse::<f64>().unwrap();
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_the_requests_summaries() {
    let pair = tiny_pair();
    let (draft_m, verifier_m, coord_m) = (free_port(), free_port(), free_port());
    let flag = |port: u16| vec![format!("--metrics-listen=127.0.0.1:{port}")];
    let draft = worker_with("draft", &pair.draft, &flag(draft_m), &[]);
    let verifier = worker_with("verifier", &pair.target, &flag(verifier_m), &[]);
    wait_serving(&draft.url()).await;
    wait_serving(&verifier.url()).await;
    // The coordinator also serves the OpenAI-compatible HTTP API, as docker-compose and Kubernetes run it.
    let http_port = free_port();
    let coord_flags = [flag(coord_m), vec![format!("--http-listen=127.0.0.1:{http_port}")]].concat();
    let coord = coordinator_with(&pair, &draft, &verifier, &coord_flags, &[]);
    wait_serving(&coord.url()).await;
    http_get(SocketAddr::from(([127, 0, 0, 1], http_port)), "/health").await;

    // Two sd and two easd requests (one with thresholds at zero, so the entropy rule fires), and a refused one.
    let easd = |params: Option<pb::EasdParams>| pb::GenerateRequest {
        mode: pb::Mode::Easd as i32,
        easd: params,
        temperature: Some(1.0),
        ..request(PROMPT, 40)
    };
    let eager = pb::EasdParams { tau_draft: Some(0.0), tau_target: Some(0.0), rho: Some(0.0), ..Default::default() };
    let requests = [request(PROMPT, 40), request("Once upon a time", 30), easd(None), easd(Some(eager))];
    let mut summaries = Vec::new();
    for req in requests {
        summaries.push(generate(&coord.url(), req, async |_| {}).await.unwrap().summary);
    }
    let refused = generate(&coord.url(), pb::GenerateRequest { k: Some(0), ..request(PROMPT, 8) }, async |_| {}).await;
    assert_eq!(refused.err().map(|e| e.code()), Some(tonic::Code::InvalidArgument));

    let text = http_get(SocketAddr::from(([127, 0, 0, 1], coord_m)), "/metrics").await;
    let coordinator = |name: &str, labels: &[(&str, &str)]| sum(&text, name, labels).unwrap_or(0.0);
    let by_mode = |mode: &str, field: fn(&pb::Summary) -> u32| -> f64 {
        summaries.iter().filter(|s| s.mode == mode).map(|s| f64::from(field(s))).sum()
    };
    for mode in ["sd", "easd"] {
        let m = [("mode", mode)];
        assert_eq!(coordinator("easd_coordinator_requests_total", &[("mode", mode), ("status", "ok")]), 2.0);
        assert_eq!(coordinator("easd_coordinator_generated_tokens_total", &m), by_mode(mode, |s| s.generated_tokens));
        assert_eq!(coordinator("easd_coordinator_accepted_tokens_total", &m), by_mode(mode, |s| s.accepted_tokens));
        assert_eq!(coordinator("easd_coordinator_drafted_tokens_total", &m), by_mode(mode, |s| s.drafted_tokens));
        assert_eq!(coordinator("easd_coordinator_blocks_total", &m), by_mode(mode, |s| s.blocks));
        assert_eq!(coordinator("easd_coordinator_easd_triggers_total", &m), by_mode(mode, |s| s.easd_triggers));
        assert_eq!(coordinator("easd_coordinator_step_seconds_count", &m), by_mode(mode, |s| s.blocks));
        let answered = summaries.iter().filter(|s| s.mode == mode && s.generated_tokens > 0).count();
        assert_eq!(coordinator("easd_coordinator_ttft_seconds_count", &m), answered as f64);
    }
    assert!(by_mode("easd", |s| s.easd_triggers) > 0.0, "the eager EASD run triggered: {summaries:?}");
    assert_eq!(coordinator("easd_coordinator_requests_total", &[("status", "invalid_argument")]), 1.0);
    // Per position: every accepted token is one accepted outcome, and every block evaluates position 1.
    let accepted: f64 = summaries.iter().map(|s| f64::from(s.accepted_tokens)).sum();
    let blocks: f64 = summaries.iter().map(|s| f64::from(s.blocks)).sum();
    let outcomes = "easd_coordinator_block_position_outcomes_total";
    assert_eq!(coordinator(outcomes, &[("outcome", "accepted")]), accepted);
    assert_eq!(coordinator(outcomes, &[("position", "1")]), blocks);
    assert_eq!(coordinator("easd_coordinator_failovers_total", &[]), 0.0);
    // The session's verifier slot was freed before its summary was sent.
    assert_eq!(sum(&text, "easd_coordinator_live_sessions", &[("replica", verifier.url().as_str())]), Some(0.0));

    // Workers: one verifier forward per verify call, one draft forward per drafted token.
    let verifier_text = http_get(SocketAddr::from(([127, 0, 0, 1], verifier_m)), "/metrics").await;
    let draft_text = http_get(SocketAddr::from(([127, 0, 0, 1], draft_m)), "/metrics").await;
    let forwards = |text: &str, role: &str| sum(text, "easd_worker_forward_seconds_count", &[("role", role)]);
    let target_forwards: f64 = summaries.iter().map(|s| f64::from(s.target_forwards)).sum();
    let drafted: f64 = summaries.iter().map(|s| f64::from(s.drafted_tokens)).sum();
    assert_eq!(forwards(&verifier_text, "verifier"), Some(target_forwards), "{verifier_text}");
    assert_eq!(forwards(&draft_text, "draft"), Some(drafted), "{draft_text}");
    // Single-token draft forwards land in the batch_len="1" bucket.
    assert!(sum(&draft_text, "easd_worker_forward_seconds_count", &[("batch_len", "1")]).unwrap_or(0.0) > 0.0);
    assert_eq!(sum(&verifier_text, "easd_worker_evictions_total", &[("role", "verifier")]), Some(0.0));
    assert!(sum(&verifier_text, "easd_worker_kv_cache_bytes", &[("role", "verifier")]).is_some(), "{verifier_text}");
}
