//! OpenAI-compatible HTTP API on the EASD coordinator.
//!
//! `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health`, served next to the
//! coordinator's gRPC API and mapped onto the same path: a body is parsed into a `GenerateRequest`, validated by
//! `Coordinator::plan` and run by `Coordinator::generate` — there is no second implementation of the loop.
//!
//! Decisions:
//! * OpenAI semantics where they differ from the gRPC defaults: temperature defaults to 1, chat without a token
//!   limit runs to the end of the context window, completions default to 16 tokens, a full context window is
//!   `finish_reason: "length"`.
//! * EASD settings travel in an extra body field `easd` (`mode`, `k`, `top_n`, `rho`, `tau_draft`, `tau_target`,
//!   `order`, `penalty_alpha`) that OpenAI clients send only when asked (`extra_body` in the Python client); the
//!   speculative summary comes back in an extra `easd` field of the final response or stream chunk.
//! * Generation runs in its own task feeding a small channel; the response (or the SSE body) owns the receiving
//!   end. A client that disconnects drops it, the coordinator's next send fails, and the coordinator releases the
//!   session on the draft and the verifier.
//! * A streamed response waits for the first event before sending headers, so failures before the first token
//!   (no verifier available, …) get a real HTTP status; later failures end the stream with an error event.

mod endpoint;
mod error;
mod request;
mod response;
mod routes;

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::Duration;

use axum::serve::{ListenerExt, TapIo};
use easd_server::Coordinator;
use tokio::net::{TcpListener, TcpStream};

pub use endpoint::Endpoint;
pub use error::Error;
pub use request::{DEFAULT_COMPLETIONS_MAX_TOKENS, DEFAULT_TEMPERATURE, ParsedRequest, parse};

/// Settings of the HTTP API.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// When set, `/v1/*` requires `Authorization: Bearer <api_token>` (`/health` stays open).
    pub api_token: Option<String>,
    /// Larger request bodies are refused with 413.
    pub max_body_bytes: usize,
    /// The model id clients send and `/v1/models` lists; default: the target model's name, lower-cased, spaces
    /// replaced by dashes ("Qwen2.5 Coder 1.5B Instruct" → "qwen2.5-coder-1.5b-instruct").
    pub model_name: Option<String>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self { api_token: None, max_body_bytes: 4 << 20, model_name: None }
    }
}

/// The API as an axum router (for tests, or to mount next to other routes).
pub fn router(coordinator: Arc<Coordinator>, config: HttpConfig) -> axum::Router {
    routes::router(coordinator, config)
}

/// How long open responses may go on after the shutdown signal (a chat may otherwise run to the context's end).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// `listener` with Nagle's algorithm off on every accepted connection: streamed deltas are small writes, and
/// without it each could wait for the client's delayed ACK (up to 40 ms on Linux).
fn without_nagle(listener: TcpListener) -> TapIo<TcpListener, fn(&mut TcpStream)> {
    fn no_delay(tcp: &mut TcpStream) {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not turn Nagle's algorithm off on an accepted connection");
        }
    }
    listener.tap_io(no_delay)
}

/// Serves the API on `listener` until `shutdown` completes, then lets open responses finish for at most
/// [`SHUTDOWN_GRACE`] (connections still open then end with the runtime).
pub async fn serve(
    listener: TcpListener,
    coordinator: Arc<Coordinator>,
    config: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let app = router(coordinator, config);
    tracing::info!(%addr, "OpenAI-compatible HTTP API listening");
    let (signalled, on_signal) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        let _ = signalled.send(());
    };
    let server = axum::serve(without_nagle(listener), app).with_graceful_shutdown(signal).into_future();
    tokio::select! {
        served = server => served,
        () = async {
            if on_signal.await.is_ok() {
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => {
            tracing::warn!(%addr, "HTTP responses still open {SHUTDOWN_GRACE:?} after shutdown; leaving them");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::serve::Listener;

    use super::*;

    #[tokio::test]
    async fn accepted_connections_send_small_writes_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut accepting = without_nagle(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (server_side, _) = accepting.accept().await;
        assert!(server_side.nodelay().unwrap(), "Nagle's algorithm must be off on the server's side");
    }
}
