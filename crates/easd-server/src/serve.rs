//! Server wiring: each service with the standard gRPC health and reflection services, until a shutdown signal.

use std::future::Future;
use std::sync::Arc;

use easd_proto::v1::{
    coordinator_server::CoordinatorServer, draft_server::DraftServer, verifier_server::VerifierServer,
};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;

use crate::coordinator::{Coordinator, CoordinatorService};
use crate::draft::DraftService;
use crate::verifier::VerifierService;
use crate::worker::Worker;

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

pub async fn serve_draft(
    listener: TcpListener,
    worker: Arc<Worker>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<DraftServer<DraftService>>().await;
    worker.spawn_idle_sweeper();
    Server::builder()
        .add_service(health)
        .add_service(reflection())
        .add_service(DraftServer::new(DraftService::new(worker)).max_decoding_message_size(MAX_MESSAGE_BYTES))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}

pub async fn serve_verifier(
    listener: TcpListener,
    worker: Arc<Worker>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<VerifierServer<VerifierService>>().await;
    worker.spawn_idle_sweeper();
    Server::builder()
        .add_service(health)
        .add_service(reflection())
        .add_service(VerifierServer::new(VerifierService::new(worker)).max_decoding_message_size(MAX_MESSAGE_BYTES))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}

pub async fn serve_coordinator(
    listener: TcpListener,
    coordinator: Arc<Coordinator>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<CoordinatorServer<CoordinatorService>>().await;
    Server::builder()
        .add_service(health)
        .add_service(reflection())
        .add_service(
            CoordinatorServer::new(CoordinatorService::new(coordinator)).max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}
