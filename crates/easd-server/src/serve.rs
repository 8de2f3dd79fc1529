//! Server wiring: each service with the standard gRPC health and reflection services, until a shutdown signal.

use std::future::Future;
use std::sync::Arc;

use easd_proto::v1::{
    coordinator_server::CoordinatorServer, draft_server::DraftServer, verifier_server::VerifierServer,
};
use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;

use easd_telemetry::CoordinatorMetrics;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Code, Request, Status};
use tonic_health::ServingStatus;

use crate::coordinator::{Coordinator, CoordinatorService, Counted, Readiness, code_name};
use crate::draft::DraftService;
use crate::limits;
use crate::verifier::VerifierService;
use crate::worker::Worker;

/// Transport security and client authentication of one server.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// TLS (with `client_ca_root` set: mutual TLS, the workers' setting).
    pub tls: Option<ServerTlsConfig>,
    /// Bearer token required on the coordinator's client API (health and reflection stay open for probes).
    pub api_token: Option<String>,
}

/// The bearer token clients must send: from the flag (or its environment variable) or from a file (its first line;
/// a file keeps it out of `ps` and suits a Kubernetes Secret). An empty token is an error, never "no auth".
pub fn api_token(flag: Option<String>, file: Option<&std::path::Path>) -> Result<Option<String>, String> {
    let token = match (flag, file) {
        (Some(_), Some(_)) => return Err("give the API token once: --api-token or --api-token-file".into()),
        (Some(token), None) => token,
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| format!("reading the API token from {}: {e}", path.display()))?
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned(),
        (None, None) => return Ok(None),
    };
    let token = token.trim();
    if token.is_empty() {
        return Err("the API token is empty: an empty token would turn authentication off; give a token or none".into());
    }
    Ok(Some(token.to_owned()))
}

impl ServerOptions {
    fn builder(&self) -> Result<Server, tonic::transport::Error> {
        let builder = Server::builder().trace_fn(request_span);
        match &self.tls {
            Some(tls) => builder.tls_config(tls.clone()),
            None => Ok(builder),
        }
    }
}

/// The accepted connections of `listener`, with Nagle's algorithm off. Tonic's own `tcp_nodelay` applies only to
/// listeners it binds itself; without it a response's last small frames wait for the peer's delayed ACK (up to
/// 40 ms on Linux) — measured as a 40–50 ms stall in about half of the pipelined loop's verify calls.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// A server span per request continuing the caller's trace (W3C `traceparent` in the metadata). Health checks,
/// which the coordinator and orchestrators send every few seconds, stay untraced.
fn request_span(request: &tonic::codegen::http::Request<()>) -> tracing::Span {
    if request.uri().path().starts_with("/grpc.health.v1.Health/") {
        tracing::Span::none()
    } else {
        easd_telemetry::server_span(request)
    }
}

/// Checks `authorization: Bearer <token>` when a token is configured.
#[derive(Clone)]
pub struct BearerAuth {
    expected: Option<String>,
}

impl Interceptor for BearerAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else { return Ok(req) };
        let given = req.metadata().get("authorization").and_then(|v| v.to_str().ok());
        match given.and_then(|v| v.strip_prefix("Bearer ")) {
            Some(token) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => Ok(req),
            Some(_) => Err(Status::unauthenticated("invalid bearer token")),
            None => Err(Status::unauthenticated("missing bearer token: send `authorization: Bearer <token>`")),
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn reflection()
-> tonic_reflection::server::v1::ServerReflectionServer<impl tonic_reflection::server::v1::ServerReflection> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(easd_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the embedded descriptor sets are valid")
}

/// Serves `service` with the standard health (reported serving) and reflection services until `shutdown`.
async fn serve_with_standard_services<S>(
    listener: TcpListener,
    service: S,
    options: &ServerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error>
where
    S: tonic::codegen::Service<
            tonic::codegen::http::Request<tonic::body::Body>,
            Response = tonic::codegen::http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_service_status(S::NAME, tonic_health::ServingStatus::Serving).await;
    options
        .builder()?
        .add_service(health)
        .add_service(reflection())
        .add_service(service)
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await
}

pub async fn serve_draft(
    listener: TcpListener,
    worker: Arc<Worker>,
    options: &ServerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    worker.spawn_idle_sweeper();
    let max_message = worker_max_message(&worker);
    let service = DraftServer::new(DraftService::new(worker)).max_decoding_message_size(max_message);
    serve_with_standard_services(listener, service, options, shutdown).await
}

pub async fn serve_verifier(
    listener: TcpListener,
    worker: Arc<Worker>,
    options: &ServerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    worker.spawn_idle_sweeper();
    let max_message = worker_max_message(&worker);
    let service = VerifierServer::new(VerifierService::new(worker)).max_decoding_message_size(max_message);
    serve_with_standard_services(listener, service, options, shutdown).await
}

pub async fn serve_coordinator(
    listener: TcpListener,
    coordinator: Arc<Coordinator>,
    options: &ServerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let auth = BearerAuth { expected: options.api_token.clone() };
    let max_message = limits::coordinator_max_message_bytes(
        coordinator.context_length(),
        coordinator.tokenizer().longest_token_bytes(),
    );
    tracing::info!(max_message, "largest Generate request decoded (bytes)");
    let metrics = coordinator.metrics().clone();
    let service =
        CoordinatorServer::new(CoordinatorService::new(coordinator.clone())).max_decoding_message_size(max_message);
    let service = CountRefused { inner: InterceptedService::new(service, auth), metrics };
    // The interceptor changes the response body type, so this one is wired by hand.
    let (reporter, health) = tonic_health::server::health_reporter();
    // Registered before the server answers, so a Watch that comes first sees NOT_SERVING, not "not registered";
    // the first readiness check follows at once.
    reporter.set_service_status("", ServingStatus::NotServing).await;
    reporter.set_service_status(COORDINATOR_SERVICE, ServingStatus::NotServing).await;
    let readiness = tokio::spawn(report_readiness(coordinator, reporter));
    let served = options
        .builder()?
        .add_service(health)
        .add_service(reflection())
        .add_service(service)
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await;
    readiness.abort();
    served
}

/// The largest request a worker decodes: see [`limits::worker_max_message_bytes`].
fn worker_max_message(worker: &Worker) -> usize {
    let max_message = limits::worker_max_message_bytes(worker.model.info().context_length);
    tracing::info!(role = worker.role, max_message, "largest request decoded (bytes)");
    max_message
}

/// Keeps the coordinator's health status (the whole server, `""`, and `easd.v1.Coordinator`) equal to its readiness:
/// SERVING while a draft worker and a verifier replica are in rotation, NOT_SERVING otherwise. Checked at the pools'
/// health interval (at most every second), which is when their view of the replicas changes.
async fn report_readiness(coordinator: Arc<Coordinator>, reporter: tonic_health::server::HealthReporter) {
    let period =
        coordinator.verifier_pool().config.health_interval.clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = None;
    loop {
        tick.tick().await;
        let readiness = coordinator.readiness();
        if last == Some(readiness) {
            continue;
        }
        let status = match readiness.missing() {
            None => ServingStatus::Serving,
            Some(missing) => {
                tracing::warn!(%missing, "coordinator not ready");
                ServingStatus::NotServing
            }
        };
        if last.is_none_or(|l: Readiness| l.is_ready() != readiness.is_ready()) {
            tracing::info!(?status, "coordinator health");
        }
        reporter.set_service_status("", status).await;
        reporter.set_service_status(COORDINATOR_SERVICE, status).await;
        last = Some(readiness);
    }
}

const COORDINATOR_SERVICE: &str = <CoordinatorServer<CoordinatorService> as NamedService>::NAME;

/// Counts `Generate` calls refused before the handler ran — a message that does not decode or is too large, a
/// missing bearer token — in the coordinator's `requests` counter under mode `unknown`; the handler counts all
/// others ([`Counted`]).
#[derive(Clone)]
struct CountRefused<S> {
    inner: S,
    metrics: CoordinatorMetrics,
}

impl<S: NamedService> NamedService for CountRefused<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<tonic::body::Body>> for CountRefused<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        let counted = (request.uri().path() == GENERATE_PATH).then(Counted::default);
        if let Some(counted) = &counted {
            request.extensions_mut().insert(counted.clone());
        }
        let response = self.inner.call(request);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let response = response.await?;
            if let Some(counted) = counted
                && !counted.is_set()
            {
                // Refused before the handler: the status is in the headers (a trailers-only response).
                let code = response.headers().get("grpc-status").and_then(|v| v.to_str().ok()?.parse::<i32>().ok());
                if let Some(code) = code.map(Code::from).filter(|&c| c != Code::Ok) {
                    metrics.record_request("unknown", code_name(code));
                }
            }
            Ok(response)
        })
    }
}

const GENERATE_PATH: &str = "/easd.v1.Coordinator/Generate";

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    #[test]
    fn an_api_token_comes_from_the_flag_or_a_file_and_is_never_empty() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cret\n").unwrap();
        assert_eq!(api_token(None, None), Ok(None));
        assert_eq!(api_token(Some("abc".into()), None), Ok(Some("abc".into())));
        assert_eq!(api_token(None, Some(&file)), Ok(Some("s3cret".into())));
        assert!(api_token(Some("abc".into()), Some(&file)).unwrap_err().contains("once"));
        assert!(api_token(Some(" ".into()), None).unwrap_err().contains("empty"));
        std::fs::write(&file, "\n").unwrap();
        assert!(api_token(None, Some(&file)).unwrap_err().contains("empty"));
        let missing = dir.path().join("missing");
        assert!(api_token(None, Some(&missing)).unwrap_err().contains("reading the API token from"));
    }

    #[tokio::test]
    async fn accepted_connections_send_small_frames_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut accepted = incoming(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let server_side = accepted.next().await.expect("a connection").unwrap();
        assert!(server_side.nodelay().unwrap(), "Nagle's algorithm must be off on the server's side");
    }
}
