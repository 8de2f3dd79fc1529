//! Hostile input on every service: bytes that do not decode, oversized ids and prompts, each answered with a client
//! error, counted, and followed by a request that succeeds. And the coordinator's health follows its workers.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use easd_model::{LoadOptions, Model, TinySpec, Tokenizer, write_tiny_gguf};
use easd_proto::v1::{
    self as pb, coordinator_client::CoordinatorClient, draft_client::DraftClient, generate_request::Input,
    verifier_client::VerifierClient,
};
use easd_server::coordinator::pool::PoolConfig;
use easd_server::error::error_reason;
use easd_server::local::{LocalOptions, LocalStack};
use easd_server::serve::{ServerOptions, serve_coordinator, serve_draft, serve_verifier};
use easd_server::{Coordinator, CoordinatorConfig, SessionLimits, Worker};
use prost::Message;
use prost::bytes::{Buf, BufMut};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

fn tiny(dir: &Path) -> (Arc<Model>, Arc<Tokenizer>) {
    let path = dir.join("tiny.gguf");
    write_tiny_gguf(&path, &TinySpec::qwen2(7)).unwrap();
    let model = Model::load(&path, &LoadOptions { warmup: false, ..LoadOptions::default() }).unwrap();
    (Arc::new(model), Arc::new(Tokenizer::from_gguf_file(&path).unwrap()))
}

async fn local_stack(dir: &Path) -> LocalStack {
    let (model, tokenizer) = tiny(dir);
    LocalStack::start(model.clone(), model, tokenizer, LocalOptions::default()).await.unwrap()
}

fn request(prompt: &str) -> pb::GenerateRequest {
    pb::GenerateRequest {
        input: Some(Input::Prompt(prompt.into())),
        max_tokens: Some(6),
        temperature: Some(0.0),
        mode: pb::Mode::Sd as i32,
        ..Default::default()
    }
}

async fn generate(url: &str, req: pb::GenerateRequest) -> Result<usize, Status> {
    let mut client = CoordinatorClient::connect(url.to_owned()).await.unwrap();
    let mut stream = client.generate(req).await?.into_inner();
    let mut events = 0;
    while stream.message().await?.is_some() {
        events += 1;
    }
    Ok(events)
}

/// Sends and receives message bodies as they are: what a typed client cannot send.
#[derive(Clone, Copy, Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

/// Calls `path` with `body` as the request message; the status it is refused with (`Ok` when it is not).
async fn raw_call(url: &str, path: &'static str, body: Vec<u8>) -> Status {
    let channel: Channel = Endpoint::from_shared(url.to_owned()).unwrap().connect().await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = PathAndQuery::from_static(path);
    let request = tonic::Request::new(body);
    let result = if path.as_str().ends_with("/Generate") || path.as_str().ends_with("/Propose") {
        grpc.server_streaming(request, path, RawCodec).await.map(|_| ())
    } else {
        grpc.unary(request, path, RawCodec).await.map(|_| ())
    };
    result.err().unwrap_or_else(|| Status::ok(""))
}

/// A string field holding bytes that are not UTF-8.
fn invalid_utf8_field(field: u32) -> Vec<u8> {
    vec![(field << 3 | 2) as u8, 3, 0xFF, 0xFE, 0xFD]
}

/// Bytes that are no protobuf message at all (a length prefix running past the end).
const GARBAGE: [u8; 10] = [0x0A, 0xFF, 0xFF, 0xFF, 0x0F, 0x6B, 0x1C, 0x93, 0x00, 0x42];

fn refused_count(text: &str, status: &str) -> f64 {
    sample_of(text, &format!(r#"easd_coordinator_requests_total{{mode="unknown",status="{status}"}}"#))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_messages_are_invalid_argument_on_every_service_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let stack = local_stack(dir.path()).await;
    assert!(pb::GenerateRequest::decode(&GARBAGE[..]).is_err() && pb::ProposeRequest::decode(&GARBAGE[..]).is_err());

    let cases = [
        (&stack.coordinator_url, "/easd.v1.Coordinator/Generate", invalid_utf8_field(1), "GenerateRequest"),
        (&stack.coordinator_url, "/easd.v1.Coordinator/Generate", GARBAGE.to_vec(), "GenerateRequest"),
        (&stack.draft_url, "/easd.v1.Draft/Propose", invalid_utf8_field(1), "ProposeRequest"),
        (&stack.draft_url, "/easd.v1.Draft/Release", GARBAGE.to_vec(), "ReleaseRequest"),
        (&stack.verifier_urls[0], "/easd.v1.Verifier/Verify", invalid_utf8_field(1), "VerifyRequest"),
        (&stack.verifier_urls[0], "/easd.v1.Verifier/Verify", GARBAGE.to_vec(), "VerifyRequest"),
    ];
    for (url, path, body, message) in cases {
        let status = raw_call(url, path, body).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{path}: {status:?}");
        assert!(status.message().starts_with(&format!("malformed easd.v1.{message} message:")), "{status:?}");
    }
    let metrics = stack.coordinator.metrics().encode();
    assert_eq!(refused_count(&metrics, "invalid_argument"), 2.0, "{metrics}");

    // Each service still serves.
    assert!(generate(&stack.coordinator_url, request("hello")).await.unwrap() >= 2);
    assert!(DraftClient::connect(stack.draft_url.clone()).await.unwrap().info(pb::InfoRequest {}).await.is_ok());
    let mut verifier = VerifierClient::connect(stack.verifier_urls[0].clone()).await.unwrap();
    assert!(verifier.info(pb::InfoRequest {}).await.is_ok());
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_bounded_and_oversized_messages_are_refused_before_they_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let stack = local_stack(dir.path()).await;
    let url = &stack.coordinator_url;

    for (id, expected) in [("r".repeat(129), "is 129 bytes long"), ("a b".to_owned(), "has ' ' at character 1")] {
        let status = generate(url, pb::GenerateRequest { request_id: id, ..request("hello") }).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().starts_with("invalid request_id: ") && status.message().contains(expected),
            "{status:?}"
        );
        assert!(status.message().len() < 200, "the id is not echoed");
    }
    // A megabyte id is more than any legal request needs: refused by size, unread.
    let huge = pb::GenerateRequest { request_id: "r".repeat(1 << 20), ..request("hello") };
    let status = generate(url, huge).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("message length too large"), "{status:?}");
    assert_eq!(refused_count(&stack.coordinator.metrics().encode(), "out_of_range"), 1.0);

    // Workers bound the session ids they log the same way.
    let mut draft = DraftClient::connect(stack.draft_url.clone()).await.unwrap();
    let propose = pb::ProposeRequest {
        session_id: "s".repeat(200),
        new_tokens: vec![1],
        full_context: true,
        count: 1,
        sampling: Some(pb::SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 1 }),
        ..Default::default()
    };
    let status = draft.propose(propose).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("invalid session_id: is 200 bytes long"), "{status:?}");

    let ok = pb::GenerateRequest { request_id: "client-42.a_b:c".into(), ..request("hello") };
    assert!(generate(url, ok).await.is_ok());
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_beyond_the_context_is_context_length_exceeded_and_huge_ones_are_not_tokenized() {
    let dir = tempfile::tempdir().unwrap();
    let stack = local_stack(dir.path()).await;
    let url = &stack.coordinator_url;

    // Counted: 400 numbers are more than the 506 tokens left by max_tokens 6 in the tiny models' 512.
    let counted: String = (0..400).map(|i| format!("{i} ")).collect();
    let status = generate(url, request(&counted)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(error_reason(&status), pb::ErrorReason::ContextLengthExceeded);
    let tokens = stack.coordinator.tokenizer().encode(&counted).unwrap().len();
    assert_eq!(
        status.message(),
        format!(
            "context length exceeded: the prompt has {tokens} tokens and max_tokens is 6, more than the context length of 512 tokens"
        )
    );

    // Bounded from its size, never tokenized: 40 KB of text cannot fit (no token is longer than the longest one).
    let big = "x".repeat(40_000);
    let status = generate(url, request(&big)).await.unwrap_err();
    assert_eq!(error_reason(&status), pb::ErrorReason::ContextLengthExceeded);
    assert!(
        status.message().contains("the prompt has at least ") && status.message().contains("(40000 bytes)"),
        "{status:?}"
    );

    // Megabytes are more than any legal request: refused by size before they are read.
    let status = generate(url, request(&"x".repeat(5 << 20))).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");

    // max_tokens alone can exceed the window.
    let status = generate(url, pb::GenerateRequest { max_tokens: Some(512), ..request("hi") }).await.unwrap_err();
    assert!(status.message().starts_with("invalid max_tokens: must be less than the context length 512"), "{status:?}");

    assert!(generate(url, request("hello")).await.is_ok());
    stack.shutdown().await;
}

async fn listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    (l, url)
}

/// Waits for `service`'s health to become `wanted`, following the Watch stream (no polling).
async fn health_becomes(url: &str, service: &str, wanted: ServingStatus) {
    let channel = Endpoint::from_shared(url.to_owned()).unwrap().connect().await.unwrap();
    let mut client = HealthClient::new(channel);
    let request = HealthCheckRequest { service: service.to_owned() };
    let mut updates = client.watch(request).await.unwrap().into_inner();
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(update) = updates.message().await.unwrap() {
            if update.status() == wanted {
                return;
            }
        }
        panic!("the health stream ended");
    })
    .await
    .unwrap_or_else(|_| panic!("{service:?} did not become {wanted:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_health_is_serving_only_with_a_draft_and_a_verifier() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tokenizer) = tiny(dir.path());
    let (draft_listener, draft_url) = listener().await;
    let (stop_draft, draft_stopped) = oneshot::channel::<()>();
    let draft = Worker::new(model.clone(), SessionLimits::default(), "draft");
    tokio::spawn(async move {
        serve_draft(draft_listener, draft, &ServerOptions::default(), async {
            let _ = draft_stopped.await;
        })
        .await
    });
    let (verifier_listener, verifier_url) = listener().await;
    let verifier = Worker::new(model, SessionLimits::default(), "verifier");
    tokio::spawn(async move {
        serve_verifier(verifier_listener, verifier, &ServerOptions::default(), std::future::pending()).await
    });
    let mut config = CoordinatorConfig::new(draft_url, vec![verifier_url]);
    config.pool = PoolConfig { health_interval: Duration::from_millis(100), ..PoolConfig::default() };
    let coordinator = Coordinator::connect(config, tokenizer).await.unwrap();
    let (coordinator_listener, url) = listener().await;
    let c = coordinator.clone();
    tokio::spawn(async move {
        serve_coordinator(coordinator_listener, c, &ServerOptions::default(), std::future::pending()).await
    });

    for service in ["", "easd.v1.Coordinator"] {
        health_becomes(&url, service, ServingStatus::Serving).await;
    }
    assert_eq!(coordinator.readiness().missing(), None);

    let _ = stop_draft.send(());
    for service in ["", "easd.v1.Coordinator"] {
        health_becomes(&url, service, ServingStatus::NotServing).await;
    }
    assert_eq!(coordinator.readiness().missing().as_deref(), Some("no draft worker is serving (0 of 1 healthy)"));
}

/// Holds a worker's model thread until `release` is sent (or dropped): requests queue behind it.
struct Gate {
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    entered: Option<oneshot::Sender<()>>,
}

impl easd_server::batcher::Job for Gate {
    fn cancelled(&self) -> bool {
        false
    }

    fn start(
        &mut self,
        _: &mut easd_server::sessions::WorkerSession,
    ) -> Result<Option<easd_server::batcher::Round>, easd_server::ServerError> {
        let _ = self.entered.take().map(|e| e.send(()));
        let _ = self.release.lock().unwrap().recv();
        Ok(None)
    }

    fn step(
        &mut self,
        _: &mut easd_server::sessions::WorkerSession,
        _: easd_model::Logits,
        _: f32,
    ) -> Option<easd_server::batcher::Round> {
        None
    }

    fn fail(&mut self, _: easd_server::ServerError) {}
}

async fn hold(worker: &Worker) -> std::sync::mpsc::Sender<()> {
    let (release, wait) = std::sync::mpsc::channel();
    let (entered, is_in) = oneshot::channel();
    let gate = Gate { release: std::sync::Mutex::new(wait), entered: Some(entered) };
    let session = worker.sessions.checkout("gate", true, || worker.model.new_cache()).unwrap();
    worker.submit(easd_server::batcher::Ticket::new(session, "gate", 1, Box::new(gate))).await.unwrap();
    is_in.await.unwrap();
    worker.sessions.release("gate");
    release
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_never_see_the_clients_request_id_and_a_running_one_is_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let stack = local_stack(dir.path()).await;
    let url = stack.coordinator_url.clone();
    let id = "client-42";
    let req = pb::GenerateRequest { request_id: id.into(), ..request("hello") };

    // The verifier holds still, so the first request is running (its draft session open) while the others arrive.
    let release = hold(&stack.verifier_workers[0]).await;
    let first = tokio::spawn(generate_owned(url.clone(), req.clone()));
    let workers = [&stack.draft_worker, &stack.verifier_workers[0]];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while workers.iter().map(|w| w.sessions.stats().sessions).sum::<usize>() < 2 {
        assert!(std::time::Instant::now() < deadline, "the first request never reached both workers");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for w in workers {
        assert!(!w.sessions.contains(id), "the {} worker knows the session by the coordinator's id", w.role);
    }
    let refused = generate(&url, req.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::AlreadyExists, "{refused:?}");
    assert!(!refused.message().contains(id), "the error does not echo the id: {}", refused.message());

    release.send(()).unwrap();
    first.await.unwrap().expect("the first request is undisturbed");
    generate(&url, req).await.expect("a finished request's id is free again");
    stack.shutdown().await;
}

async fn generate_owned(url: String, req: pb::GenerateRequest) -> Result<usize, Status> {
    generate(&url, req).await
}

/// The draft's session waits, idle, while the verifier is held for several idle timeouts (as while it prefills a
/// long prompt): the coordinator's keep-alives keep it, and the generation goes on without resending the context.
/// With keep-alives off, the draft sweeps the session and the next proposal has to rebuild it.
async fn draft_session_survives_a_long_wait(keepalive: Duration) -> (u64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let (model, tokenizer) = tiny(dir.path());
    let opts = LocalOptions {
        limits: SessionLimits { idle_timeout: Duration::from_millis(300), ..SessionLimits::default() },
        pool: PoolConfig {
            health_interval: Duration::from_millis(50),
            keepalive_interval: keepalive,
            ..PoolConfig::default()
        },
        ..LocalOptions::default()
    };
    let stack = LocalStack::start(model.clone(), model, tokenizer, opts).await.unwrap();
    let release = hold(&stack.verifier_workers[0]).await;
    let url = stack.coordinator_url.clone();
    let generation =
        tokio::spawn(generate_owned(url, pb::GenerateRequest { max_tokens: Some(24), ..request("hello") }));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while stack.draft_worker.sessions.stats().sessions == 0 {
        assert!(std::time::Instant::now() < deadline, "the draft never got the session");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    release.send(()).unwrap();
    generation.await.unwrap().expect("the generation finishes");
    let swept = stack.draft_worker.sessions.stats().evictions;
    let retries = sample_of(&stack.coordinator.metrics().encode(), r#"easd_coordinator_retries_total{target="draft"}"#);
    stack.shutdown().await;
    (swept, retries)
}

/// The value of the sample `series` (name with its labels, as printed) in a metrics text; 0 when absent.
fn sample_of(text: &str, series: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_keep_a_waiting_session_from_the_idle_sweep() {
    assert_eq!(draft_session_survives_a_long_wait(Duration::from_millis(100)).await, (0, 0.0));
    let (swept, retries) = draft_session_survives_a_long_wait(Duration::from_secs(3600)).await;
    assert!(swept >= 1 && retries >= 1.0, "without keep-alives the session is swept ({swept}, {retries})");
}
