//! The coordinator: the service clients call. It validates requests, pins each session to a verifier replica,
//! runs the speculative loop and streams text with a final summary.
//!
//! Every session is one `session` span (a child of the caller's trace) and ends in one `requests` count; the
//! metrics are always kept and served only when the binary is asked to (`Coordinator::metrics`).

mod block_floor;
mod generation;
pub mod output;
pub mod pinned;
pub mod policy;
pub mod pool;
pub mod request;
pub mod retry;
pub mod sides;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use easd_core::{EasdParams, validate_block_size};
use easd_model::Tokenizer;
use easd_proto::v1::{self as pb, coordinator_server};
use easd_telemetry::CoordinatorMetrics;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::error::ServerError;
pub use generation::EventSender;
use generation::Generation;
use pinned::PinnedWorker;
use pool::{Pool, PoolConfig, Role};
pub use request::ModeKind;
use request::{
    DEFAULT_BLOCK_SIZE, DEFAULT_MAX_BLOCK, Plan, PlanContext, RequestDefaults, easd_params_to_pb, new_id, plan,
    requested_mode_name,
};
use sides::{GrpcDraft, GrpcVerifier};

#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Draft replicas; a session fails over between them, and falls back to target mode when none is left.
    pub draft_urls: Vec<String>,
    pub verifier_urls: Vec<String>,
    /// `host:port` re-resolved periodically for verifier replicas (a Kubernetes headless service), instead of
    /// or besides nothing: when set, `verifier_urls` is ignored.
    pub verifier_dns: Option<String>,
    /// Default EASD parameters (DESIGN §2.2; a calibration file replaces the thresholds).
    pub default_easd: EasdParams,
    /// Mode and block size of requests that leave them unset.
    pub default_mode: ModeKind,
    pub default_k: usize,
    /// Draft the next block while the verifier scores this one, for requests that do not say (`pipeline`).
    /// Pays when draft and verifier run on separate machines; the tokens are the same either way.
    pub pipeline: bool,
    /// How far a pipelined greedy sd block may grow with what the draft made while the verifier was busy (at least
    /// the request's k; the tokens are the same either way; easd and sampled requests keep blocks of k).
    pub max_block: usize,
    /// A pipelined greedy sd block that may grow waits for only as many drafted tokens (1..=k) as the session's
    /// measured draft speed, verifier cost and acceptance favour, instead of k. The tokens are the same either way.
    pub adaptive_blocks: bool,
    /// Live sessions on a verifier replica at which greedy `sd` requests stop drafting and run the target alone
    /// (the same tokens; 0: never). Under a large batch, verifying drafted rows costs more than it saves.
    pub speculation_off_at: usize,
    pub pool: PoolConfig,
    /// How long start-up waits for the workers to answer `Info`.
    pub startup_timeout: Duration,
}

impl CoordinatorConfig {
    pub fn new(draft_url: impl Into<String>, verifier_urls: Vec<String>) -> Self {
        Self {
            draft_urls: vec![draft_url.into()],
            verifier_urls,
            verifier_dns: None,
            default_easd: EasdParams::default(),
            default_mode: ModeKind::default(),
            default_k: DEFAULT_BLOCK_SIZE,
            pipeline: true,
            max_block: DEFAULT_MAX_BLOCK,
            adaptive_blocks: true,
            speculation_off_at: 0,
            pool: PoolConfig::default(),
            startup_timeout: Duration::from_secs(60),
        }
    }
}

pub struct Coordinator {
    drafts: Arc<Pool>,
    verifiers: Arc<Pool>,
    tokenizer: Arc<Tokenizer>,
    context_length: usize,
    defaults: RequestDefaults,
    draft_info: pb::ModelInfo,
    verifier_infos: Vec<pb::ModelInfo>,
    metrics: CoordinatorMetrics,
    /// The `request_id`s of the requests running now: a second request with one of them is refused.
    running: Mutex<HashSet<String>>,
}

/// A running request's hold on its `request_id`, given back when the request ends.
struct RunningRequest<'a> {
    id: String,
    running: &'a Mutex<HashSet<String>>,
}

impl<'a> RunningRequest<'a> {
    fn claim(running: &'a Mutex<HashSet<String>>, id: &str) -> Result<Self, ServerError> {
        if !running.lock().expect("running requests poisoned").insert(id.to_owned()) {
            return Err(ServerError::AlreadyExists("request_id is already used by a running request".into()));
        }
        Ok(Self { id: id.to_owned(), running })
    }
}

impl Drop for RunningRequest<'_> {
    fn drop(&mut self) {
        self.running.lock().expect("running requests poisoned").remove(&self.id);
    }
}

impl Coordinator {
    /// Connects to the workers and refuses to start when their tokenizers differ from `tokenizer` (the target's).
    pub async fn connect(config: CoordinatorConfig, tokenizer: Arc<Tokenizer>) -> Result<Arc<Self>, ServerError> {
        let fingerprint = tokenizer.fingerprint().to_owned();
        if config.draft_urls.is_empty() {
            return Err(ServerError::invalid("draft", "at least one draft URL is required"));
        }
        validate_block_size(config.default_k).map_err(|e| ServerError::invalid("default_k", e.reason))?;
        validate_block_size(config.max_block).map_err(|e| ServerError::invalid("max_block", e.reason))?;
        config
            .default_easd
            .validate()
            .map_err(|e| ServerError::invalid("default_easd", format!("{}: {}", e.field, e.reason)))?;
        let metrics = CoordinatorMetrics::new();
        let drafts = Pool::new(Role::Draft, &config.draft_urls, &fingerprint, config.pool.clone(), None)?;
        let live = Some(metrics.clone());
        let verifiers = match &config.verifier_dns {
            Some(name) => Pool::from_dns(Role::Verifier, name, &fingerprint, config.pool.clone(), live).await?,
            None if config.verifier_urls.is_empty() => {
                return Err(ServerError::invalid("verifier", "at least one verifier URL (or a DNS name) is required"));
            }
            None => Pool::new(Role::Verifier, &config.verifier_urls, &fingerprint, config.pool.clone(), live)?,
        };
        let draft_infos = drafts.connect(config.startup_timeout).await?;
        let verifier_infos = verifiers.connect(config.startup_timeout).await?;
        drafts.spawn_health_checker();
        verifiers.spawn_health_checker();
        let context_length =
            verifier_infos.iter().chain(&draft_infos).map(|i| i.context_length as usize).min().unwrap_or(0);
        tracing::info!(
            drafts = draft_infos.len(),
            verifiers = verifier_infos.len(),
            context_length,
            "coordinator connected"
        );
        Ok(Arc::new(Self {
            drafts,
            verifiers,
            tokenizer,
            context_length,
            defaults: RequestDefaults {
                easd: config.default_easd,
                mode: config.default_mode,
                k: config.default_k,
                pipeline: config.pipeline,
                max_block: config.max_block,
                adaptive_blocks: config.adaptive_blocks,
                speculation_off_at: config.speculation_off_at,
            },
            draft_info: draft_infos[0].clone(),
            verifier_infos,
            metrics,
            running: Mutex::default(),
        }))
    }

    /// The verifier pool (replica health and load), for metrics and tests.
    pub fn verifier_pool(&self) -> &Arc<Pool> {
        &self.verifiers
    }

    pub fn draft_pool(&self) -> &Arc<Pool> {
        &self.drafts
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The smallest context window among the workers: what requests are planned against.
    pub fn context_length(&self) -> usize {
        self.context_length
    }

    /// Whether a draft worker and at least one verifier replica are in rotation (what health checks report).
    pub fn readiness(&self) -> Readiness {
        let count = |pool: &Pool| {
            let replicas = pool.replicas();
            (replicas.iter().filter(|r| r.is_healthy()).count(), replicas.len())
        };
        let (drafts_serving, drafts) = count(&self.drafts);
        let (verifiers_serving, verifiers) = count(&self.verifiers);
        Readiness { drafts_serving, drafts, verifiers_serving, verifiers }
    }

    /// The coordinator's metrics (serve `metrics().registry()` to expose them).
    pub fn metrics(&self) -> &CoordinatorMetrics {
        &self.metrics
    }

    pub fn info(&self) -> pb::CoordinatorInfo {
        pb::CoordinatorInfo {
            draft: Some(self.draft_info.clone()),
            verifiers: self.verifier_infos.clone(),
            default_easd: Some(easd_params_to_pb(&self.defaults.easd)),
            replicas: [&self.drafts, &self.verifiers]
                .into_iter()
                .flat_map(|pool| {
                    pool.replicas().into_iter().map(|r| pb::ReplicaStatus {
                        url: r.url.clone(),
                        role: pool.role.name().to_owned(),
                        healthy: r.is_healthy(),
                        live_sessions: r.live_sessions() as u32,
                    })
                })
                .collect(),
        }
    }

    /// Validates a request (all errors before any work); a refused request is counted as finished.
    pub fn plan(&self, req: pb::GenerateRequest) -> Result<Plan, ServerError> {
        let ctx =
            PlanContext { tokenizer: &self.tokenizer, context_length: self.context_length, defaults: &self.defaults };
        let mode = requested_mode_name(req.mode, self.defaults.mode);
        plan(req, &ctx).inspect_err(|e| self.metrics.record_request(mode, code_name(e.code())))
    }

    /// Runs a validated plan, streaming deltas into `tx` and ending with the summary event.
    /// Returns the summary (or the error, which is also sent as the stream's final status).
    pub async fn generate(&self, plan: Plan, tx: EventSender) -> Result<pb::Summary, ServerError> {
        let mode = plan.mode.name();
        let span = tracing::info_span!("session", session_id = %plan.request_id, mode, k = plan.k);
        let result = match RunningRequest::claim(&self.running, &plan.request_id) {
            Ok(_running) => self.run_session(plan, &tx).instrument(span).await,
            Err(e) => Err(e),
        };
        let status = result.as_ref().map_or_else(|e| code_name(e.code()), |_| "ok");
        self.metrics.record_request(mode, status);
        match result {
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

    /// Admission (a verifier slot; none in draft mode), then the loop.
    async fn run_session(&self, plan: Plan, tx: &EventSender) -> Result<pb::Summary, ServerError> {
        let lease = match plan.mode {
            easd_core::Mode::Draft => None,
            _ => Some(self.verifiers.admit().await?),
        };
        // The workers know the session by a secret of ours, never by the client's request_id: a guessed or reused
        // request_id must not reach another session's caches.
        let session = new_id();
        let draft = PinnedWorker::new(self.drafts.clone(), session.clone(), None, self.metrics.clone());
        let verifier = PinnedWorker::new(self.verifiers.clone(), session, lease, self.metrics.clone());
        let (draft, verifier) = (GrpcDraft::new(draft, &plan), GrpcVerifier::new(verifier, &plan));
        let pipeline = plan.pipeline;
        Generation::new(plan, draft, verifier, self.tokenizer.clone(), self.metrics.clone(), pipeline).run(tx).await
    }
}

/// How many draft workers and verifier replicas are in rotation, of how many known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    pub drafts_serving: usize,
    pub drafts: usize,
    pub verifiers_serving: usize,
    pub verifiers: usize,
}

impl Readiness {
    /// Ready to serve every mode: a draft worker and a verifier replica are in rotation.
    pub fn is_ready(&self) -> bool {
        self.drafts_serving > 0 && self.verifiers_serving > 0
    }

    /// What is missing, for health responses; `None` when ready.
    pub fn missing(&self) -> Option<String> {
        let draft = (self.drafts_serving == 0)
            .then(|| format!("no draft worker is serving ({} of {} healthy)", self.drafts_serving, self.drafts));
        let verifier = (self.verifiers_serving == 0).then(|| {
            format!("no verifier replica is serving ({} of {} healthy)", self.verifiers_serving, self.verifiers)
        });
        match (draft, verifier) {
            (None, None) => None,
            (Some(one), None) | (None, Some(one)) => Some(one),
            (Some(d), Some(v)) => Some(format!("{d}; {v}")),
        }
    }
}

/// Put in a `Generate` call's extensions by the server ([`crate::serve`]) and set once the handler has counted the
/// request, so that requests refused before it (undecodable, too large, unauthenticated) are counted there.
#[derive(Clone, Debug, Default)]
pub struct Counted(Arc<std::sync::atomic::AtomicBool>);

impl Counted {
    pub fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// The gRPC status code's name as a metric label (`ok` is the success label).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
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
        // From here on this request is counted (refused by `plan`, or finished by `generate`).
        if let Some(counted) = request.extensions().get::<Counted>() {
            counted.set();
        }
        let plan = self.coordinator.plan(request.into_inner())?;
        let (tx, rx) = mpsc::channel(64);
        let coordinator = self.coordinator.clone();
        // The session continues the request's server span (and so the caller's trace).
        tokio::spawn(
            async move {
                let _ = coordinator.generate(plan, tx).await;
            }
            .in_current_span(),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
