//! Connections to the draft worker and the verifier replicas, with the tokenizer-compatibility check.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use easd_proto::v1::{self as pb, draft_client::DraftClient, verifier_client::VerifierClient};
use tonic::transport::{Channel, Endpoint};

use crate::error::ServerError;

pub struct Replica {
    pub url: String,
    pub client: VerifierClient<Channel>,
    pub live_sessions: AtomicUsize,
    /// Set after a transport failure: the fingerprint is checked again before the replica is used.
    pub needs_check: AtomicBool,
}

pub struct Workers {
    pub draft_url: String,
    pub draft: DraftClient<Channel>,
    pub draft_needs_check: AtomicBool,
    pub replicas: Vec<Arc<Replica>>,
    pub fingerprint: String,
    pub call_timeout: Duration,
}

fn endpoint(url: &str, connect_timeout: Duration) -> Result<Endpoint, ServerError> {
    let url = if url.contains("://") { url.to_owned() } else { format!("http://{url}") };
    Ok(Endpoint::from_shared(url.clone())
        .map_err(|e| ServerError::invalid("url", format!("{url}: {e}")))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true))
}

impl Workers {
    /// Connects lazily; `check_all` then verifies every worker's tokenizer against ours.
    pub fn new(
        draft_url: &str,
        verifier_urls: &[String],
        fingerprint: String,
        call_timeout: Duration,
    ) -> Result<Self, ServerError> {
        if verifier_urls.is_empty() {
            return Err(ServerError::invalid("verifier", "at least one verifier URL is required"));
        }
        let connect_timeout = Duration::from_secs(5);
        let draft = DraftClient::new(endpoint(draft_url, connect_timeout)?.connect_lazy());
        let replicas = verifier_urls
            .iter()
            .map(|url| {
                Ok(Arc::new(Replica {
                    url: url.clone(),
                    client: VerifierClient::new(endpoint(url, connect_timeout)?.connect_lazy()),
                    live_sessions: AtomicUsize::new(0),
                    needs_check: AtomicBool::new(true),
                }))
            })
            .collect::<Result<_, ServerError>>()?;
        Ok(Self {
            draft_url: draft_url.to_owned(),
            draft,
            draft_needs_check: AtomicBool::new(true),
            replicas,
            fingerprint,
            call_timeout,
        })
    }

    fn compare(&self, who: &str, info: &pb::ModelInfo) -> Result<(), ServerError> {
        if info.tokenizer_fingerprint != self.fingerprint {
            return Err(ServerError::Incompatible(format!(
                "{who} serves {} whose tokenizer fingerprint {} differs from the coordinator's {}: draft and target must share a tokenizer",
                info.name,
                short(&info.tokenizer_fingerprint),
                short(&self.fingerprint)
            )));
        }
        Ok(())
    }

    pub async fn draft_info(&self) -> Result<pb::ModelInfo, ServerError> {
        let mut req = tonic::Request::new(pb::InfoRequest {});
        req.set_timeout(self.call_timeout);
        let info = self.draft.clone().info(req).await.map_err(|s| unavailable(&self.draft_url, s))?.into_inner();
        self.compare(&format!("draft {}", self.draft_url), &info)?;
        self.draft_needs_check.store(false, Ordering::Relaxed);
        Ok(info)
    }

    pub async fn replica_info(&self, replica: &Replica) -> Result<pb::ModelInfo, ServerError> {
        let mut req = tonic::Request::new(pb::InfoRequest {});
        req.set_timeout(self.call_timeout);
        let info = replica.client.clone().info(req).await.map_err(|s| unavailable(&replica.url, s))?.into_inner();
        self.compare(&format!("verifier {}", replica.url), &info)?;
        replica.needs_check.store(false, Ordering::Relaxed);
        Ok(info)
    }

    /// Checks the draft if it was never checked or failed since (a restarted worker may serve another model).
    pub async fn ensure_draft_checked(&self) -> Result<(), ServerError> {
        if self.draft_needs_check.load(Ordering::Relaxed) {
            self.draft_info().await?;
        }
        Ok(())
    }

    pub async fn ensure_replica_checked(&self, replica: &Replica) -> Result<(), ServerError> {
        if replica.needs_check.load(Ordering::Relaxed) {
            self.replica_info(replica).await?;
        }
        Ok(())
    }

    /// The replica with the fewest live sessions (KV affinity is kept by the caller, which pins the session).
    pub fn pick_replica(&self, exclude: &[String]) -> Option<Arc<Replica>> {
        self.replicas
            .iter()
            .filter(|r| !exclude.contains(&r.url))
            .min_by_key(|r| r.live_sessions.load(Ordering::Relaxed))
            .cloned()
    }
}

pub fn unavailable(url: &str, status: tonic::Status) -> ServerError {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
            ServerError::Unavailable(format!("{url} is unavailable: {}", status.message()))
        }
        tonic::Code::DeadlineExceeded => ServerError::DeadlineExceeded(format!("{url} did not answer in time")),
        _ => ServerError::Worker(status),
    }
}

fn short(fingerprint: &str) -> &str {
    &fingerprint[..fingerprint.len().min(12)]
}
