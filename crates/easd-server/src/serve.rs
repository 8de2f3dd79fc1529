//! Server wiring: each service with the standard gRPC health and reflection services, until a shutdown signal.

use std::future::Future;
use std::sync::Arc;

use easd_proto::v1::{
    coordinator_server::CoordinatorServer, draft_server::DraftServer, verifier_server::VerifierServer,
};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Interceptor;
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Status};

use crate::coordinator::{Coordinator, CoordinatorService};
use crate::draft::DraftService;
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

impl ServerOptions {
    fn builder(&self) -> Result<Server, tonic::transport::Error> {
        let builder = Server::builder().trace_fn(request_span);
        match &self.tls {
            Some(tls) => builder.tls_config(tls.clone()),
            None => Ok(builder),
        }
    }
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

/// Messages carry at most a block of sparse summaries; prompts are the largest thing sent.
const MAX_MESSAGE_BYTES: usize = 64 << 20;

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
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}

pub async fn serve_draft(
    listener: TcpListener,
    worker: Arc<Worker>,
    options: &ServerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    worker.spawn_idle_sweeper();
    let service = DraftServer::new(DraftService::new(worker)).max_decoding_message_size(MAX_MESSAGE_BYTES);
    serve_with_standard_services(listener, service, options, shutdown).await
}

pub async fn serve_verifier(
    listener: TcpListener,
    worker: Arc<Worker>,
    options: &ServerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    worker.spawn_idle_sweeper();
    let service = VerifierServer::new(VerifierService::new(worker)).max_decoding_message_size(MAX_MESSAGE_BYTES);
    serve_with_standard_services(listener, service, options, shutdown).await
}

pub async fn serve_coordinator(
    listener: TcpListener,
    coordinator: Arc<Coordinator>,
    options: &ServerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let auth = BearerAuth { expected: options.api_token.clone() };
    let service =
        CoordinatorServer::new(CoordinatorService::new(coordinator)).max_decoding_message_size(MAX_MESSAGE_BYTES);
    // The interceptor changes the response body type, so this one is wired by hand.
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<CoordinatorServer<CoordinatorService>>().await;
    options
        .builder()?
        .add_service(health)
        .add_service(reflection())
        .add_service(tonic::service::interceptor::InterceptedService::new(service, auth))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}
