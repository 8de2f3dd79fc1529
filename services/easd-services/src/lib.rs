//! Flags shared by the three service binaries.

use std::path::PathBuf;

use anyhow::Context;
use easd_server::serve::ServerOptions;

/// Logs to stderr, filtered by RUST_LOG (default info).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_env_filter(filter).init();
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
