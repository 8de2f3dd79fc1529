//! The crate's one error type.

use std::net::SocketAddr;

/// Everything that can go wrong while setting up telemetry or serving metrics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `RUST_LOG` (or a configured filter) does not parse as an `EnvFilter` directive list.
    #[error("invalid {which} filter {filter:?}: {source}")]
    Filter { which: &'static str, filter: String, source: tracing_subscriber::filter::ParseError },
    /// OTLP over gRPC was requested outside a Tokio runtime.
    #[error("OTLP export to {endpoint} needs a Tokio runtime: call init from inside one")]
    NoRuntime { endpoint: String },
    /// The OTLP exporter rejected its configuration (bad endpoint URL, headers, ...).
    #[error("building the OTLP span exporter for {endpoint}: {source}")]
    Exporter { endpoint: String, source: opentelemetry_otlp::ExporterBuildError },
    /// Another global `tracing` subscriber was installed first.
    #[error("installing the tracing subscriber: {0}")]
    SubscriberAlreadySet(#[source] tracing_subscriber::util::TryInitError),
    /// Flushing or shutting down the span exporter failed (collector unreachable, timeout).
    #[error("flushing spans: {0}")]
    Flush(#[source] opentelemetry_sdk::error::OTelSdkError),
    /// The metrics listener could not bind its address.
    #[error("binding the metrics listener on {addr}: {source}")]
    MetricsBind { addr: SocketAddr, source: std::io::Error },
    /// The metrics listener failed while serving.
    #[error("serving metrics: {0}")]
    MetricsServe(#[source] std::io::Error),
    /// The test OTLP receiver could not start or did not see the expected spans in time.
    #[cfg(feature = "testing")]
    #[error("OTLP test receiver: {0}")]
    Receiver(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
