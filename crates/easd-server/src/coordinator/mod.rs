//! The coordinator: the service clients call. It validates requests, pins each session to a verifier replica,
//! runs the speculative loop and streams text with a final summary.

mod generation;
pub mod output;
pub mod request;
pub mod workers;

use std::sync::Arc;
use std::time::Duration;

use easd_core::EasdParams;
use easd_model::Tokenizer;
use easd_proto::v1::{self as pb, coordinator_server};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::error::ServerError;
pub use generation::EventSender;
use generation::Generation;
use request::{Plan, PlanContext, easd_params_to_pb, plan};
use workers::Workers;

#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    pub draft_url: String,
    pub verifier_urls: Vec<String>,
    /// Default EASD parameters (DESIGN §2.2; a calibration file replaces the thresholds).
    pub default_easd: EasdParams,
    /// Deadline of every call to a worker.
    pub call_timeout: Duration,
    /// How long start-up waits for the workers to answer `Info`.
    pub startup_timeout: Duration,
}

impl CoordinatorConfig {
    pub fn new(draft_url: impl Into<String>, verifier_urls: Vec<String>) -> Self {
        Self {
            draft_url: draft_url.into(),
            verifier_urls,
            default_easd: EasdParams::default(),
            call_timeout: Duration::from_secs(60),
            startup_timeout: Duration::from_secs(60),
        }
    }
}

pub struct Coordinator {
    workers: Arc<Workers>,
    tokenizer: Arc<Tokenizer>,
    context_length: usize,
    default_easd: EasdParams,
    draft_info: pb::ModelInfo,
    verifier_infos: Vec<pb::ModelInfo>,
}

impl Coordinator {
    /// Connects to the workers and refuses to start when their tokenizers differ from `tokenizer` (the target's).
    pub async fn connect(config: CoordinatorConfig, tokenizer: Arc<Tokenizer>) -> Result<Arc<Self>, ServerError> {
        let workers = Arc::new(Workers::new(
            &config.draft_url,
            &config.verifier_urls,
            tokenizer.fingerprint().to_owned(),
            config.call_timeout,
        )?);
        let deadline = tokio::time::Instant::now() + config.startup_timeout;
        let draft_info = retry_until(deadline, || workers.draft_info()).await?;
        let mut verifier_infos = Vec::new();
        for replica in &workers.replicas {
            verifier_infos.push(retry_until(deadline, || workers.replica_info(replica)).await?);
        }
        let context_length = verifier_infos
            .iter()
            .map(|i| i.context_length as usize)
            .chain([draft_info.context_length as usize])
            .min()
            .unwrap_or(0);
        tracing::info!(draft = %draft_info.name, verifiers = verifier_infos.len(), context_length, "coordinator connected");
        Ok(Arc::new(Self {
            workers,
            tokenizer,
            context_length,
            default_easd: config.default_easd,
            draft_info,
            verifier_infos,
        }))
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    pub fn info(&self) -> pb::CoordinatorInfo {
        pb::CoordinatorInfo {
            draft: Some(self.draft_info.clone()),
            verifiers: self.verifier_infos.clone(),
            default_easd: Some(easd_params_to_pb(&self.default_easd)),
        }
    }

    /// Validates a request (all errors before any work).
    pub fn plan(&self, req: pb::GenerateRequest) -> Result<Plan, ServerError> {
        let ctx = PlanContext {
            tokenizer: &self.tokenizer,
            context_length: self.context_length,
            default_easd: &self.default_easd,
        };
        plan(req, &ctx)
    }

    /// Runs a validated plan, streaming deltas into `tx` and ending with the summary event.
    /// Returns the summary (or the error, which is also sent as the stream's final status).
    pub async fn generate(&self, plan: Plan, tx: EventSender) -> Result<pb::Summary, ServerError> {
        let replica = self
            .workers
            .pick_replica(&[])
            .ok_or_else(|| ServerError::Unavailable("no verifier replica is configured".into()))?;
        let span = tracing::info_span!("session", id = %plan.request_id, mode = plan.mode.name(), k = plan.k);
        let generation = Generation::new(plan, self.workers.clone(), self.tokenizer.clone(), replica);
        match generation.run(&tx).instrument(span).await {
            Ok(summary) => {
                let event = pb::GenerateEvent { event: Some(pb::generate_event::Event::Summary(summary.clone())) };
                let _ = tx.send(Ok(event)).await;
                Ok(summary)
            }
            Err(e) => {
                tracing::warn!(error = %e, "generation failed");
                let status = Status::new(e.code(), e.to_string());
                let _ = tx.send(Err(status)).await;
                Err(e)
            }
        }
    }
}

async fn retry_until<T, F, Fut>(deadline: tokio::time::Instant, mut f: F) -> Result<T, ServerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ServerError>>,
{
    let mut wait = Duration::from_millis(50);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e @ (ServerError::Unavailable(_) | ServerError::DeadlineExceeded(_)))
                if tokio::time::Instant::now() + wait < deadline =>
            {
                tracing::debug!(error = %e, "worker not ready yet");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The gRPC face of the coordinator.
pub struct CoordinatorService {
    coordinator: Arc<Coordinator>,
}

impl CoordinatorService {
    pub fn new(coordinator: Arc<Coordinator>) -> Self {
        Self { coordinator }
    }
}

#[tonic::async_trait]
impl coordinator_server::Coordinator for CoordinatorService {
    type GenerateStream = ReceiverStream<Result<pb::GenerateEvent, Status>>;

    async fn info(&self, _: Request<pb::InfoRequest>) -> Result<Response<pb::CoordinatorInfo>, Status> {
        Ok(Response::new(self.coordinator.info()))
    }

    async fn generate(&self, request: Request<pb::GenerateRequest>) -> Result<Response<Self::GenerateStream>, Status> {
        let plan = self.coordinator.plan(request.into_inner())?;
        let (tx, rx) = mpsc::channel(64);
        let coordinator = self.coordinator.clone();
        tokio::spawn(async move {
            let _ = coordinator.generate(plan, tx).await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
