//! Flags and start-up pieces shared by the three service binaries: TLS, the metrics listener, telemetry shutdown,
//! the shutdown signal, and the coordinator's EASD defaults ([`defaults`]).

pub mod defaults;
pub mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use easd_server::serve::ServerOptions;
use easd_telemetry::TelemetryGuard;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

/// Telemetry for a service: logs on stderr (`RUST_LOG`), spans over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
/// Keep the guard for the whole of `main` and hand it to [`finish_telemetry`] at the end.
pub fn init_telemetry(service_name: &str) -> anyhow::Result<TelemetryGuard> {
    easd_telemetry::init(service_name).context("initialising telemetry")
}

/// Flushes pending spans and shuts the exporter down, off the async workers (the exporter runs on this runtime).
pub async fn finish_telemetry(guard: TelemetryGuard) {
    if let Err(e) = tokio::task::spawn_blocking(move || drop(guard)).await {
        eprintln!("flushing spans failed: {e}");
    }
}

/// The Prometheus endpoint of a service.
#[derive(clap::Args, Debug, Clone)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics (off when unset), e.g. 0.0.0.0:9100.
    #[arg(long, env = "EASD_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
}

impl MetricsArgs {
    /// Binds the listener now, so a taken port fails the start (before models load or workers answer).
    pub async fn bind(&self) -> anyhow::Result<MetricsListener> {
        let listener = match self.metrics_listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("listening for metrics on {addr}"))?,
            ),
            None => None,
        };
        Ok(MetricsListener(listener))
    }
}

/// A bound metrics listener (or none when `--metrics-listen` is unset).
#[derive(Debug)]
pub struct MetricsListener(Option<tokio::net::TcpListener>);

impl MetricsListener {
    /// Serves `GET /metrics` for `registry` in the background.
    pub fn serve(self, registry: Arc<Registry>) {
        let Some(listener) = self.0 else { return };
        tokio::spawn(async move {
            if let Err(e) = easd_telemetry::serve_metrics_on(listener, registry).await {
                tracing::error!(error = %e, "metrics listener failed");
            }
        });
    }
}

/// TLS for a server's listener.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerTlsArgs {
    /// PEM certificate chain; with --tls-key, the server speaks TLS.
    #[arg(long, requires = "tls_key", env = "EASD_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert", env = "EASD_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA that client certificates must chain to (mutual TLS).
    #[arg(long, requires = "tls_cert", env = "EASD_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
}

impl ServerTlsArgs {
    pub fn options(&self, api_token: Option<String>) -> anyhow::Result<ServerOptions> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(
                easd_server::tls::server_tls(cert, key, self.tls_client_ca.as_deref()).context("configuring TLS")?,
            ),
            _ => None,
        };
        Ok(ServerOptions { tls, api_token })
    }
}

/// A shutdown several servers wait on: every [`Shutdown::wait`] resolves once Ctrl-C or SIGTERM arrives.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Starts listening for the signals (call inside the runtime).
    pub fn on_signal() -> Self {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = tx.send(true);
        });
        Self(rx)
    }

    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

/// Resolves on Ctrl-C or SIGTERM (how containers are stopped).
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}
