//! The `GET /metrics` listener.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::{Error, Result};

/// Content type of prometheus-client's text output (OpenMetrics, which Prometheus scrapes).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `registry` in the OpenMetrics text format (what `GET /metrics` returns).
pub fn encode_metrics(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail; an encoder error would be a bug in a metric type.
    if let Err(err) = prometheus_client::encoding::text::encode(&mut text, registry) {
        tracing::error!(%err, "encoding metrics failed");
    }
    text
}

/// Serves `GET /metrics` for `registry` on `addr` until the task is dropped or fails.
pub async fn serve_metrics(addr: SocketAddr, registry: Arc<Registry>) -> Result<()> {
    let listener = TcpListener::bind(addr).await.map_err(|source| Error::MetricsBind { addr, source })?;
    serve_metrics_on(listener, registry).await
}

/// Like [`serve_metrics`] on an already bound listener (tests bind port 0 and read the port).
pub async fn serve_metrics_on(listener: TcpListener, registry: Arc<Registry>) -> Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving Prometheus metrics on /metrics");
    }
    let app = Router::new().route("/metrics", get(metrics_handler)).with_state(registry);
    axum::serve(listener, app).await.map_err(Error::MetricsServe)
}

async fn metrics_handler(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    ([(CONTENT_TYPE, OPENMETRICS)], encode_metrics(&registry))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WorkerMetrics;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    async fn http_get(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn the_listener_serves_current_values_and_404s_elsewhere() {
        let metrics = WorkerMetrics::new("draft");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_metrics_on(listener, metrics.registry()));

        metrics.inc_evictions(2);
        let response = http_get(addr, "/metrics").await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("application/openmetrics-text"), "{response}");
        assert!(response.contains(r#"easd_worker_evictions_total{role="draft"} 2"#), "{response}");

        metrics.inc_evictions(1);
        let response = http_get(addr, "/metrics").await;
        assert!(response.contains(r#"easd_worker_evictions_total{role="draft"} 3"#), "{response}");

        let response = http_get(addr, "/other").await;
        assert!(response.starts_with("HTTP/1.1 404"), "{response}");
        server.abort();
    }

    #[tokio::test]
    async fn binding_a_taken_port_names_the_address() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = serve_metrics(addr, WorkerMetrics::new("draft").registry()).await.unwrap_err();
        assert!(matches!(err, Error::MetricsBind { .. }), "{err}");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }
}
