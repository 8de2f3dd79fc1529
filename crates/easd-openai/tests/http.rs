//! The HTTP API over a real local stack (draft, verifier, coordinator on loopback) with tiny models, called with a
//! plain HTTP/1.1 client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use easd_model::{LoadOptions, Model, TinySpec, Tokenizer, write_tiny_gguf};
use easd_openai::HttpConfig;
use easd_server::local::{LocalOptions, LocalStack};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

struct Server {
    stack: LocalStack,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
    model: String,
    _dir: tempfile::TempDir,
}

async fn start(config: HttpConfig) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let (target_path, draft_path) = (dir.path().join("target.gguf"), dir.path().join("draft.gguf"));
    write_tiny_gguf(&target_path, &TinySpec::qwen2(7)).unwrap();
    write_tiny_gguf(&draft_path, &TinySpec { perturbation: Some((8, 0.3)), ..TinySpec::qwen2(7) }).unwrap();
    let opts = LoadOptions { warmup: false, ..LoadOptions::default() };
    let draft = Arc::new(Model::load(&draft_path, &opts).unwrap());
    let target = Arc::new(Model::load(&target_path, &opts).unwrap());
    let tokenizer = Arc::new(Tokenizer::from_gguf_file(&target_path).unwrap());
    let stack = LocalStack::start(draft, target, tokenizer, LocalOptions::default()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let token = config.api_token.clone();
    let task = tokio::spawn(easd_openai::serve(listener, stack.coordinator.clone(), config, async {
        let _ = stopped.await;
    }));
    let model = get(addr, "/v1/models", token.as_deref()).await.1["data"][0]["id"].as_str().unwrap().to_owned();
    Server { stack, addr, stop: Some(stop), task, model, _dir: dir }
}

impl Server {
    async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap().unwrap();
        self.stack.shutdown().await;
    }

    fn chat(&self, extra: Value) -> Value {
        let mut body = json!({
            "model": self.model,
            "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 24,
            "temperature": 0,
        });
        merge(&mut body, extra);
        body
    }
}

fn merge(body: &mut Value, extra: Value) {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
}

/// Sends one request on a fresh connection; returns the response with its body still streaming and the connection
/// task (aborting it closes the socket).
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (hyper::Response<Incoming>, JoinHandle<()>) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let response = sender.send_request(req.body(Full::new(Bytes::from(body))).unwrap()).await.unwrap();
    (response, conn)
}

async fn call(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: Vec<u8>) -> (StatusCode, Value) {
    let (response, _conn) = send(addr, method, path, token, body).await;
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({ "raw": String::from_utf8_lossy(&bytes) })))
}

async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (StatusCode, Value) {
    call(addr, "GET", path, token, Vec::new()).await
}

async fn post(addr: SocketAddr, path: &str, body: &Value) -> (StatusCode, Value) {
    call(addr, "POST", path, None, body.to_string().into_bytes()).await
}

/// The `data:` payloads of a whole SSE body.
async fn sse_events(response: hyper::Response<Incoming>) -> Vec<String> {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    parse_sse(std::str::from_utf8(&bytes).unwrap())
}

fn parse_sse(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")).map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_completions_answer_in_openai_format_with_usage_and_the_easd_summary() {
    let server = start(HttpConfig::default()).await;
    let (status, health) = get(server.addr, "/health", None).await;
    assert_eq!((status, health["status"].as_str()), (StatusCode::OK, Some("ok")));
    let (_, models) = get(server.addr, "/v1/models", None).await;
    assert_eq!(models["data"][0]["id"], "tiny-qwen2");
    assert_eq!(models["data"][0]["object"], "model");

    let (status, chat) = post(server.addr, "/v1/chat/completions", &server.chat(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{chat}");
    assert_eq!(chat["object"], "chat.completion");
    assert!(chat["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant");
    assert!(!chat["choices"][0]["message"]["content"].as_str().unwrap().is_empty());
    let usage = &chat["usage"];
    let completion_tokens = usage["completion_tokens"].as_u64().unwrap();
    assert!(completion_tokens > 0 && completion_tokens <= 24);
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 3, "the chat template wraps the message");
    assert_eq!(usage["total_tokens"].as_u64(), Some(usage["prompt_tokens"].as_u64().unwrap() + completion_tokens));
    let reason = chat["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(reason == "stop" || (reason == "length" && completion_tokens == 24), "{reason}");
    assert_eq!(chat["easd"]["mode"], "sd");
    assert!(chat["easd"]["drafted_tokens"].as_u64().unwrap() > 0);

    let prompt = json!({"model": server.model, "prompt": "The quick brown fox", "temperature": 0, "seed": 1});
    let (status, completion) = post(server.addr, "/v1/completions", &prompt).await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    assert_eq!(completion["object"], "text_completion");
    assert!(completion["usage"]["completion_tokens"].as_u64().unwrap() <= 16, "OpenAI's default of 16 tokens");
    // Same request through the target alone: greedy SD is lossless, so the text is identical.
    let mut target_only = prompt.clone();
    merge(&mut target_only, json!({"easd": {"mode": "target"}}));
    let (_, target) = post(server.addr, "/v1/completions", &target_only).await;
    assert_eq!(target["choices"][0]["text"], completion["choices"][0]["text"]);
    assert_eq!(target["easd"]["mode"], "target");
    assert_eq!(target["easd"]["drafted_tokens"], 0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_equals_the_non_streamed_one_and_ends_with_usage_and_done() {
    let server = start(HttpConfig::default()).await;
    let (_, whole) = post(server.addr, "/v1/chat/completions", &server.chat(json!({}))).await;
    let body = server.chat(json!({"stream": true, "stream_options": {"include_usage": true}}));
    let (response, _conn) =
        send(server.addr, "POST", "/v1/chat/completions", None, body.to_string().into_bytes()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let events = sse_events(response).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.len() >= 4, "several text chunks, the end and the usage: {chunks:?}");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    assert_eq!(text, whole["choices"][0]["message"]["content"].as_str().unwrap());
    let (end, usage) = (&chunks[chunks.len() - 2], &chunks[chunks.len() - 1]);
    assert_eq!(end["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
    assert_eq!(end["easd"]["mode"], "sd");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], whole["usage"]);
    assert!(chunks[..chunks.len() - 1].iter().all(|c| c["usage"].is_null()));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_get_openai_error_objects_with_the_right_status() {
    let server =
        start(HttpConfig { api_token: Some("sesame".into()), max_body_bytes: 4096, ..HttpConfig::default() }).await;
    let (addr, token) = (server.addr, Some("sesame"));
    let error_of = |(status, body): (StatusCode, Value)| {
        let e = &body["error"];
        (status, e["param"].as_str().unwrap_or("").to_owned(), e["message"].as_str().unwrap_or("").to_owned())
    };
    let post_json = |body: Value| async move {
        call(addr, "POST", "/v1/chat/completions", token, body.to_string().into_bytes()).await
    };

    let (status, param, message) = error_of(post_json(server.chat(json!({"temperature": 3}))).await);
    assert_eq!((status, param.as_str()), (StatusCode::BAD_REQUEST, "temperature"));
    assert!(message.contains("invalid temperature"), "{message}");
    let (status, param, _) = error_of(post_json(server.chat(json!({"n": 2}))).await);
    assert_eq!((status, param.as_str()), (StatusCode::BAD_REQUEST, "n"));
    let (status, param, _) = error_of(post_json(server.chat(json!({"easd": {"k": 0}}))).await);
    assert_eq!((status, param.as_str()), (StatusCode::BAD_REQUEST, "easd.k"));
    let (status, param, _) = error_of(post_json(server.chat(json!({"messages": []}))).await);
    assert_eq!((status, param.as_str()), (StatusCode::BAD_REQUEST, "messages"));
    // The tiny models' context window is 512 tokens; 2,000 characters of digits and spaces need more.
    let long: String = (0..400).map(|i| format!("{i} ")).collect();
    let too_long = server.chat(json!({"messages": [{"role": "user", "content": long.clone()}]}));
    let mut unlimited = too_long.clone();
    unlimited.as_object_mut().unwrap().remove("max_tokens");
    // OpenAI's shape for a prompt that does not fit: 400, invalid_request_error, param messages, code
    // context_length_exceeded, naming the prompt's tokens, the limit and (when sent) max_tokens.
    for (body, max_tokens) in [(unlimited, None), (too_long, Some(24))] {
        let (status, body) = post_json(body).await;
        let e = &body["error"];
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!((e["type"].as_str(), e["param"].as_str()), (Some("invalid_request_error"), Some("messages")));
        assert_eq!(e["code"], "context_length_exceeded");
        let message = e["message"].as_str().unwrap();
        assert!(message.contains("the prompt has ") && message.contains("context length of 512 tokens"), "{message}");
        match max_tokens {
            Some(m) => assert!(message.contains(&format!("max_tokens is {m}")), "{message}"),
            None => {
                assert!(message.contains("no room for a completion") && !message.contains("max_tokens"), "{message}")
            }
        }
    }
    let (status, body) = call(addr, "POST", "/v1/completions", token, {
        json!({"model": server.model, "prompt": long, "max_tokens": 8}).to_string().into_bytes()
    })
    .await;
    assert_eq!((status, body["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("prompt")), "{body}");
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    let (status, param, _) = error_of(post_json(server.chat(json!({"model": "gpt-4"}))).await);
    assert_eq!((status, param.as_str()), (StatusCode::NOT_FOUND, "model"));
    let (status, _, message) = error_of(call(addr, "POST", "/v1/chat/completions", token, b"{".to_vec()).await);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message.contains("not valid JSON"), "{message}");

    let big = server.chat(json!({"messages": [{"role": "user", "content": "x".repeat(5000)}]}));
    let (status, _, message) = error_of(post_json(big).await);
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{message}");

    let body = server.chat(json!({})).to_string().into_bytes();
    let (status, _, _) = error_of(call(addr, "POST", "/v1/chat/completions", None, body.clone()).await);
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, message) = error_of(call(addr, "POST", "/v1/chat/completions", Some("guess"), body).await);
    assert_eq!((status, message.as_str()), (StatusCode::UNAUTHORIZED, "invalid bearer token"));
    assert_eq!(get(addr, "/v1/models", None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(get(addr, "/health", None).await.0, StatusCode::OK, "health needs no token");

    assert_eq!(get(addr, "/v1/nothing", token).await.0, StatusCode::NOT_FOUND);
    let (status, body) = get(addr, "/v1/chat/completions", token).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(body["error"]["message"].is_string());
    // A streamed request that fails validation is refused before any event.
    let (status, param, _) = error_of(post_json(server.chat(json!({"stream": true, "top_p": 0}))).await);
    assert_eq!((status, param.as_str()), (StatusCode::BAD_REQUEST, "top_p"));
    // Still serving after all that.
    assert_eq!(post_json(server.chat(json!({}))).await.0, StatusCode::OK);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_frees_the_session_on_draft_and_verifier() {
    let server = start(HttpConfig::default()).await;
    let sessions = |s: &Server| {
        (s.stack.draft_worker.sessions.stats().sessions, s.stack.verifier_workers[0].sessions.stats().sessions)
    };
    // Sampling to the end of the context window: far longer than the moments the client stays.
    let body = server.chat(json!({"stream": true, "max_tokens": 400, "temperature": 1, "seed": 3}));
    let (response, conn) = send(server.addr, "POST", "/v1/chat/completions", None, body.to_string().into_bytes()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut seen = String::new();
    while parse_sse(&seen).len() < 2 {
        let frame = body.frame().await.expect("the stream goes on").unwrap();
        seen.push_str(&String::from_utf8_lossy(&frame.into_data().unwrap()));
    }
    assert!(!seen.contains("finish_reason\":\""), "still mid-stream: {seen}");
    assert_eq!(sessions(&server), (1, 1), "both workers hold the live session");

    drop(body);
    conn.abort();
    tokio::time::timeout(Duration::from_secs(10), async {
        while sessions(&server) != (0, 0) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the sessions are released once the client is gone");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_naming_what_is_missing_when_the_workers_are_gone() {
    let workers = start(HttpConfig::default()).await;
    let mut config =
        easd_server::CoordinatorConfig::new(workers.stack.draft_url.clone(), workers.stack.verifier_urls.clone());
    config.pool.health_interval = Duration::from_millis(100);
    let tokenizer = workers.stack.coordinator.tokenizer().clone();
    let coordinator = easd_server::Coordinator::connect(config, tokenizer).await.unwrap();
    let app = easd_openai::router(coordinator, HttpConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (status, health) = get(addr, "/health", None).await;
    assert_eq!((status, health["status"].as_str()), (StatusCode::OK, Some("ok")), "{health}");
    assert_eq!(health["replicas"]["verifier"], json!({"serving": 1, "known": 1}));
    workers.shutdown().await;

    // The pools notice at their next health check (every 100 ms here).
    let health = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let (status, health) = get(addr, "/health", None).await;
            let reason = health["reason"].as_str().unwrap_or_default();
            if reason.contains("draft") && reason.contains("verifier") {
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
                return health;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("/health turns 503 naming both once the workers are gone");
    assert_eq!(health["status"], "unavailable");
    let reason = health["reason"].as_str().unwrap();
    assert!(
        reason.contains("no draft worker is serving") && reason.contains("no verifier replica is serving"),
        "{reason}"
    );
    assert_eq!(health["replicas"]["draft"], json!({"serving": 0, "known": 1}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_get_503_when_no_verifier_is_available() {
    // A coordinator of its own over the workers of a stack that then goes away.
    let workers = start(HttpConfig::default()).await;
    let config =
        easd_server::CoordinatorConfig::new(workers.stack.draft_url.clone(), workers.stack.verifier_urls.clone());
    let tokenizer = workers.stack.coordinator.tokenizer().clone();
    let coordinator = easd_server::Coordinator::connect(config, tokenizer).await.unwrap();
    let app = easd_openai::router(coordinator, HttpConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let body = workers.chat(json!({"easd": {"mode": "target"}}));
    assert_eq!(post(addr, "/v1/chat/completions", &body).await.0, StatusCode::OK);
    workers.shutdown().await;

    let (status, error) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{error}");
    assert_eq!(error["error"]["type"], "server_error");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, _) = post(addr, "/v1/chat/completions", &streamed).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "a stream that cannot start is refused with a status");
}
