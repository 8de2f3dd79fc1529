//! Routes and handlers: decode → `Coordinator::plan` → `Coordinator::generate` in a task → encode.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use easd_model::Tokenizer;
use easd_proto::v1::{self as pb, generate_event::Event};
use easd_server::coordinator::request::new_id;
use easd_server::{Coordinator, ServerError};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::HttpConfig;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::request::{ParsedRequest, parse};
use crate::response::{self, Meta, json_response};

/// Events buffered between the generation and the client: small, so a client that stops reading (or leaves)
/// stops the generation within a few blocks.
const EVENT_BUFFER: usize = 4;

struct AppState {
    coordinator: Arc<Coordinator>,
    api_token: Option<String>,
    max_body_bytes: usize,
    model_id: String,
    target_name: String,
    draft_name: String,
    /// The smallest context window among the workers (what the coordinator plans against).
    context_length: usize,
    started: u64,
}

pub fn router(coordinator: Arc<Coordinator>, config: HttpConfig) -> Router {
    let info = coordinator.info();
    let target_name = info.verifiers.first().map(|v| v.name.clone()).unwrap_or_default();
    let draft_name = info.draft.as_ref().map(|d| d.name.clone()).unwrap_or_default();
    let context_length =
        info.verifiers.iter().chain(info.draft.as_ref()).map(|m| m.context_length as usize).min().unwrap_or(0);
    let state = Arc::new(AppState {
        coordinator,
        api_token: config.api_token.filter(|t| !t.is_empty()),
        max_body_bytes: config.max_body_bytes,
        model_id: config.model_name.unwrap_or_else(|| model_id(&target_name)),
        target_name,
        draft_name,
        context_length,
        started: unix_now(),
    });
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    Router::new()
        .route("/health", get(health))
        .merge(v1)
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(state)
}

/// A model id as OpenAI clients expect one: lower case, no spaces.
fn model_id(name: &str) -> String {
    let id = name.split_whitespace().collect::<Vec<_>>().join("-").to_lowercase();
    if id.is_empty() { "easd".into() } else { id }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(expected) = &state.api_token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            None => {
                return Error::Unauthorized("missing bearer token: send `Authorization: Bearer <token>`")
                    .into_response();
            }
            Some(token) if !same_secret(token.trim().as_bytes(), expected.as_bytes()) => {
                return Error::Unauthorized("invalid bearer token").into_response();
            }
            Some(_) => {}
        }
    }
    next.run(request).await
}

/// Compares without an early exit, so response time does not reveal how much of a guess was right.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 200 while a draft worker and a verifier replica are in rotation, 503 saying which is missing otherwise.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    let readiness = state.coordinator.readiness();
    let replicas = json!({
        "draft": { "serving": readiness.drafts_serving, "known": readiness.drafts },
        "verifier": { "serving": readiness.verifiers_serving, "known": readiness.verifiers },
    });
    match readiness.missing() {
        None => {
            json_response(StatusCode::OK, &json!({ "status": "ok", "model": state.model_id, "replicas": replicas }))
        }
        Some(missing) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({ "status": "unavailable", "model": state.model_id, "reason": missing, "replicas": replicas }),
        ),
    }
}

fn model_object(state: &AppState) -> Value {
    json!({
        "id": state.model_id,
        "object": "model",
        "created": state.started,
        "owned_by": "easd",
        "target": state.target_name,
        "draft": state.draft_name,
        "context_length": state.context_length,
    })
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    json_response(StatusCode::OK, &json!({ "object": "list", "data": [model_object(&state)] }))
}

async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if !id.eq_ignore_ascii_case(&state.model_id) {
        return Error::ModelNotFound { requested: id, served: state.model_id.clone() }.into_response();
    }
    json_response(StatusCode::OK, &model_object(&state))
}

async fn no_route(method: Method, uri: Uri) -> Response {
    Error::NoRoute(format!("{method} {}", uri.path())).into_response()
}

async fn method_not_allowed(method: Method) -> Response {
    Error::MethodNotAllowed(method.to_string()).into_response()
}

async fn chat(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(state, body, Endpoint::Chat).await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(state, body, Endpoint::Completions).await.unwrap_or_else(IntoResponse::into_response)
}

async fn generate(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Result<Response, Error> {
    let body = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => Error::BodyTooLarge { limit_bytes: state.max_body_bytes },
        _ => Error::BodyUnreadable(rejection.body_text()),
    })?;
    let parsed = parse(&body, endpoint)?;
    if !parsed.model.eq_ignore_ascii_case(&state.model_id) {
        return Err(Error::ModelNotFound { requested: parsed.model, served: state.model_id.clone() });
    }
    let mut generate = parsed.generate.clone();
    generate.request_id = new_id();
    // Chosen here rather than by the coordinator so that the seed reported back (to reproduce the answer) is a
    // JSON number every client reads exactly: at most 2^53 - 1.
    generate.seed = generate.seed.or_else(|| Some(rand::random::<u64>() >> 11));
    let mut plan = state.coordinator.plan(generate).map_err(|e| match e {
        // Chat without a limit is planned with one token: a max_tokens the client never sent is not reported.
        ServerError::ContextLengthExceeded { prompt, limit, .. } if !parsed.max_tokens_set => {
            Error::server(ServerError::ContextLengthExceeded { prompt, max_tokens: None, limit }, endpoint)
        }
        other => Error::server(other, endpoint),
    })?;
    if !parsed.max_tokens_set && endpoint == Endpoint::Chat {
        // OpenAI chat without a limit: until a stop, or the context window is full.
        plan.max_tokens = state.context_length.saturating_sub(plan.prompt_tokens.len()).max(1);
    }
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let meta = Meta {
        endpoint,
        id: format!("{prefix}-{}", plan.request_id),
        created: unix_now(),
        model: state.model_id.clone(),
        seed: plan.seed,
    };

    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let (done_tx, done) = oneshot::channel();
    let coordinator = state.coordinator.clone();
    tokio::spawn(async move {
        let _ = done_tx.send(coordinator.generate(plan, tx).await);
    });
    let run = Run { rx, done: Some(done), endpoint };
    let tokenizer = state.coordinator.tokenizer().clone();
    if parsed.stream {
        stream(run, meta, &parsed, tokenizer).await
    } else {
        collect(run, meta, &parsed, &tokenizer).await
    }
}

/// The receiving end of one generation.
struct Run {
    rx: mpsc::Receiver<Result<pb::GenerateEvent, tonic::Status>>,
    /// The generation's result: the typed error behind an error event.
    done: Option<oneshot::Receiver<Result<pb::Summary, ServerError>>>,
    endpoint: Endpoint,
}

impl Run {
    /// The next delta or the summary; `Ok(None)` after the summary.
    async fn next(&mut self) -> Result<Option<Event>, Error> {
        loop {
            match self.rx.recv().await {
                Some(Ok(pb::GenerateEvent { event: Some(event) })) => return Ok(Some(event)),
                Some(Ok(pb::GenerateEvent { event: None })) => continue,
                Some(Err(_)) | None => break,
            }
        }
        let outcome = match self.done.take() {
            Some(done) => done.await,
            None => return Ok(None),
        };
        match outcome {
            Ok(Err(e)) => Err(Error::server(e, self.endpoint)),
            Ok(Ok(_)) => Ok(None),
            Err(_) => Err(Error::server(
                ServerError::Internal("the generation task ended without a result".into()),
                self.endpoint,
            )),
        }
    }
}

fn no_summary(endpoint: Endpoint) -> Error {
    Error::server(ServerError::Internal("the generation ended without a summary".into()), endpoint)
}

async fn collect(mut run: Run, meta: Meta, parsed: &ParsedRequest, tokenizer: &Tokenizer) -> Result<Response, Error> {
    let (mut text, mut infos) = (String::new(), Vec::new());
    loop {
        match run.next().await? {
            Some(Event::Delta(d)) => {
                text.push_str(&d.text);
                infos.extend(d.logprobs);
            }
            Some(Event::Summary(summary)) => {
                let logprobs =
                    parsed.logprobs.map(|top| response::logprobs(meta.endpoint, &infos, top, tokenizer, &mut 0));
                return Ok(json_response(StatusCode::OK, &response::completion(&meta, &text, logprobs, &summary)));
            }
            None => return Err(no_summary(meta.endpoint)),
        }
    }
}

/// Server-Sent Events: one chunk per delta, a final chunk with the finish reason and the `easd` summary, the
/// usage chunk when asked, then `data: [DONE]`.
struct SseState {
    run: Run,
    meta: Meta,
    tokenizer: Arc<Tokenizer>,
    include_usage: bool,
    top_logprobs: Option<usize>,
    pending: Option<Event>,
    first: bool,
    text_offset: usize,
    finished: bool,
}

impl SseState {
    async fn next_events(&mut self) -> Option<Vec<SseEvent>> {
        let data = |v: Value| SseEvent::default().data(v.to_string());
        loop {
            if self.finished {
                return None;
            }
            let event = match self.pending.take() {
                Some(event) => Ok(Some(event)),
                None => self.run.next().await,
            };
            match event {
                Ok(Some(Event::Delta(d))) => {
                    if d.text.is_empty() && self.top_logprobs.is_none() {
                        continue;
                    }
                    let endpoint = self.meta.endpoint;
                    let logprobs = self.top_logprobs.map(|top| {
                        response::logprobs(endpoint, &d.logprobs, top, &self.tokenizer, &mut self.text_offset)
                    });
                    let chunk = response::chunk(&self.meta, &d.text, self.first, logprobs, None, self.include_usage);
                    self.first = false;
                    return Some(vec![data(chunk)]);
                }
                Ok(Some(Event::Summary(summary))) => {
                    self.finished = true;
                    let last = response::chunk(&self.meta, "", self.first, None, Some(&summary), self.include_usage);
                    let mut events = vec![data(last)];
                    if self.include_usage {
                        events.push(data(response::usage_chunk(&self.meta, &summary)));
                    }
                    events.push(SseEvent::default().data("[DONE]"));
                    return Some(events);
                }
                Ok(None) => {
                    self.finished = true;
                    return Some(vec![data(no_summary(self.meta.endpoint).to_json())]);
                }
                Err(e) => {
                    self.finished = true;
                    tracing::warn!(error = %e, "generation failed mid-stream");
                    return Some(vec![data(e.to_json())]);
                }
            }
        }
    }
}

async fn stream(
    mut run: Run,
    meta: Meta,
    parsed: &ParsedRequest,
    tokenizer: Arc<Tokenizer>,
) -> Result<Response, Error> {
    // Errors before the first event still get an HTTP status.
    let first = run.next().await?.ok_or_else(|| no_summary(meta.endpoint))?;
    let state = SseState {
        run,
        meta,
        tokenizer,
        include_usage: parsed.include_usage,
        top_logprobs: parsed.logprobs,
        pending: Some(first),
        first: true,
        text_offset: 0,
        finished: false,
    };
    let events =
        futures::stream::unfold(
            state,
            |mut state| async move { state.next_events().await.map(|events| (events, state)) },
        )
        .flat_map(|events| futures::stream::iter(events.into_iter().map(Ok::<_, Infallible>)));
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_are_lower_case_without_spaces() {
        assert_eq!(model_id("Qwen2.5 Coder 1.5B Instruct"), "qwen2.5-coder-1.5b-instruct");
        assert_eq!(model_id("tiny-qwen2"), "tiny-qwen2");
        assert_eq!(model_id("  "), "easd");
    }

    #[test]
    fn secrets_compare_equal_only_when_identical() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
    }
}
