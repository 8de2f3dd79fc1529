//! Tracing and metrics for the EASD services (draft, verifier, coordinator).
//!
//! Three pieces, each small:
//!
//! * **Setup** — [`init`] installs a `tracing` subscriber: env-filtered logs on stderr
//!   (`RUST_LOG`, default `info`) and, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, an
//!   OpenTelemetry layer exporting spans over OTLP/gRPC. It also installs the W3C
//!   TraceContext propagator. The returned [`TelemetryGuard`] flushes spans when dropped.
//! * **Propagation** — one client request is one trace across processes. Clients put the
//!   current span's context into gRPC metadata ([`inject_context`], or the
//!   [`trace_interceptor`] on a whole client); servers open a span per request that continues
//!   the caller's trace ([`server_span`] for `Server::builder().trace_fn`, or
//!   [`set_remote_parent`] on a handler's own span).
//! * **Metrics** — [`CoordinatorMetrics`] and [`WorkerMetrics`] own a Prometheus registry each;
//!   [`serve_metrics`] serves it as `GET /metrics`.
//!
//! # Wiring a service
//!
//! ```no_run
//! use easd_telemetry::{WorkerMetrics, serve_metrics_on};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Keep the guard alive for the whole of main: dropping it flushes pending spans.
//!     let _telemetry = easd_telemetry::init("easd-verifier")?;
//!     let metrics = WorkerMetrics::new("verifier");
//!     // Bind before spawning so a taken port fails the start, not a background task.
//!     let listener = tokio::net::TcpListener::bind("0.0.0.0:9102").await?;
//!     tokio::spawn(serve_metrics_on(listener, metrics.registry()));
//!     // Every request gets a server span that continues the caller's trace:
//!     // tonic::transport::Server::builder()
//!     //     .trace_fn(easd_telemetry::server_span)
//!     //     .add_service(...)
//!     //     .serve(listen).await?;
//!     Ok(())
//! }
//! ```
//!
//! # Calling another service inside the current trace
//!
//! ```no_run
//! # async fn demo() {
//! use tracing::Instrument;
//!
//! // A span per outgoing call; the server's span becomes its child.
//! let span = tracing::info_span!("draft.propose", otel.kind = "client", k = 4);
//! async {
//!     let mut request = tonic::Request::new(());
//!     easd_telemetry::inject_context(&mut request);
//!     // client.propose(request).await
//! }
//! .instrument(span)
//! .await;
//! # }
//! ```
//!
//! Streaming handlers that spawn a task must carry the span into it
//! (`tokio::spawn(fut.in_current_span())`), otherwise the work runs outside the trace.
//!
//! # Decisions
//!
//! * The OpenTelemetry layer has its own filter (see [`TelemetryConfig::trace_filter`]) so
//!   `RUST_LOG=warn` quiets logs without dropping spans, and so the exporter's own HTTP/2 and
//!   tonic spans are never exported (that would feed back into itself).
//! * Exporting uses the SDK's batch processor (a background thread); the tonic exporter needs
//!   a Tokio runtime, so [`init`] must run inside one when OTLP is enabled and the guard must be
//!   dropped while the (multi-thread) runtime is still running.
//! * Metric label values are passed as `&str` so this crate stays below the algorithm crate;
//!   callers pass a small fixed set (modes, statuses, replica addresses).

mod error;
mod init;
mod metrics;
mod metrics_server;
mod propagation;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::{Error, Result};
pub use init::{DEFAULT_TRACE_FILTER, TelemetryConfig, TelemetryGuard, init, init_with};
pub use metrics::{CoordinatorMetrics, WorkerMetrics, batch_len_label};
pub use metrics_server::{encode_metrics, serve_metrics, serve_metrics_on};
pub use propagation::{extract_context, inject_context, server_span, set_remote_parent, trace_interceptor};

/// Re-exported so callers can set attributes on spans (`span.set_attribute(..)`) without
/// naming the exact tracing-opentelemetry version.
pub use tracing_opentelemetry::OpenTelemetrySpanExt;
