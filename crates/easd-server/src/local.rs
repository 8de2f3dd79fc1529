//! The whole system in one process on loopback: a draft worker, verifier replica(s) and a coordinator, each a real
//! gRPC server on its own port. Used by `easd up`, `easd ask` without `--coordinator`, and the end-to-end tests.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use easd_core::EasdParams;

use crate::coordinator::ModeKind;
use crate::coordinator::request::{DEFAULT_MAX_BLOCK, RequestDefaults};
use easd_model::{LoadOptions, Model, Tokenizer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::batcher::BatchOptions;
use crate::coordinator::{Coordinator, CoordinatorConfig};
use crate::error::ServerError;
use crate::serve::{ServerOptions, serve_coordinator, serve_draft, serve_verifier};
use crate::sessions::SessionLimits;
use crate::worker::Worker;

#[derive(Clone, Debug)]
pub struct LocalOptions {
    pub verifier_replicas: usize,
    pub limits: SessionLimits,
    /// Cross-session batching of each worker.
    pub batch: BatchOptions,
    pub default_easd: EasdParams,
    /// Mode and block size of requests that leave them unset.
    pub default_mode: ModeKind,
    pub default_k: usize,
    /// Pipelined loop by default. Off here: in one process the draft and the verifier share the same cores, so
    /// drafting ahead competes with verification instead of overlapping it (requests may still ask for it).
    pub pipeline: bool,
    /// Live sessions on the verifier at which greedy sd stops speculating (`CoordinatorConfig::speculation_off_at`).
    pub speculation_off_at: usize,
    /// Where the coordinator listens (port 0: any free port).
    pub coordinator_addr: SocketAddr,
    /// Bearer token for the coordinator's client API.
    pub api_token: Option<String>,
    /// The coordinator's calls to its workers: deadlines, health checks, keep-alives.
    pub pool: crate::coordinator::pool::PoolConfig,
}

impl Default for LocalOptions {
    fn default() -> Self {
        Self {
            verifier_replicas: 1,
            limits: SessionLimits::default(),
            batch: BatchOptions::default(),
            default_easd: EasdParams::default(),
            default_mode: ModeKind::default(),
            pipeline: false,
            speculation_off_at: 0,
            default_k: crate::coordinator::request::DEFAULT_BLOCK_SIZE,
            coordinator_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            api_token: None,
            pool: Default::default(),
        }
    }
}

/// How each model of the pair is loaded: the draft and the target may sit on different devices (e.g. the draft on
/// `cuda:0` and the target on `cuda:1`, or the draft on the CPU beside a GPU target).
#[derive(Clone, Debug, Default)]
pub struct PairLoadOptions {
    pub draft: LoadOptions,
    pub target: LoadOptions,
}

impl PairLoadOptions {
    /// Both models loaded the same way.
    pub fn both(load: LoadOptions) -> Self {
        Self { draft: load.clone(), target: load }
    }
}

impl LocalOptions {
    /// What the stack's coordinator gives requests that leave fields unset.
    pub fn request_defaults(&self) -> RequestDefaults {
        RequestDefaults {
            easd: self.default_easd.clone(),
            mode: self.default_mode,
            k: self.default_k,
            pipeline: self.pipeline,
            max_block: DEFAULT_MAX_BLOCK,
            adaptive_blocks: true,
            speculation_off_at: self.speculation_off_at,
        }
    }
}

pub struct LocalStack {
    pub coordinator: Arc<Coordinator>,
    pub coordinator_url: String,
    pub draft_url: String,
    pub verifier_urls: Vec<String>,
    pub draft_worker: Arc<Worker>,
    pub verifier_workers: Vec<Arc<Worker>>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// Loads a model off the async runtime.
pub async fn load_model(path: &Path, opts: &LoadOptions) -> Result<Arc<Model>, ServerError> {
    let (path, opts) = (path.to_owned(), opts.clone());
    tokio::task::spawn_blocking(move || Model::load(&path, &opts).map(Arc::new))
        .await
        .map_err(|e| ServerError::Internal(format!("model loading task failed: {e}")))?
        .map_err(ServerError::from)
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, String), ServerError> {
    let listener =
        TcpListener::bind(addr).await.map_err(|e| ServerError::Unavailable(format!("cannot listen on {addr}: {e}")))?;
    let local = listener.local_addr().map_err(|e| ServerError::Internal(e.to_string()))?;
    Ok((listener, format!("http://{local}")))
}

impl LocalStack {
    /// Starts the stack with already loaded models; the coordinator uses `tokenizer` (the target's).
    pub async fn start(
        draft: Arc<Model>,
        target: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        opts: LocalOptions,
    ) -> Result<Self, ServerError> {
        let (shutdown, signal) = watch::channel(false);
        let wait = move || {
            let mut signal = signal.clone();
            async move {
                let _ = signal.wait_for(|stop| *stop).await;
            }
        };
        let mut tasks = Vec::new();
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));

        let draft_worker = Worker::with_batching(draft, opts.limits, opts.batch, "draft");
        let (listener, draft_url) = bind(loopback).await?;
        let (w, stop) = (draft_worker.clone(), wait());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = serve_draft(listener, w, &ServerOptions::default(), stop).await {
                tracing::error!(error = %e, "draft server failed");
            }
        }));

        let mut verifier_urls = Vec::new();
        let mut verifier_workers = Vec::new();
        for _ in 0..opts.verifier_replicas.max(1) {
            let worker = Worker::with_batching(target.clone(), opts.limits, opts.batch, "verifier");
            let (listener, url) = bind(loopback).await?;
            let (w, stop) = (worker.clone(), wait());
            tasks.push(tokio::spawn(async move {
                if let Err(e) = serve_verifier(listener, w, &ServerOptions::default(), stop).await {
                    tracing::error!(error = %e, "verifier server failed");
                }
            }));
            verifier_urls.push(url);
            verifier_workers.push(worker);
        }

        let mut config = CoordinatorConfig::new(draft_url.clone(), verifier_urls.clone());
        config.default_easd = opts.default_easd;
        config.default_mode = opts.default_mode;
        config.default_k = opts.default_k;
        config.pipeline = opts.pipeline;
        config.speculation_off_at = opts.speculation_off_at;
        config.pool = opts.pool.clone();
        let coordinator = Coordinator::connect(config, tokenizer).await?;
        let (listener, coordinator_url) = bind(opts.coordinator_addr).await?;
        let opts_server = ServerOptions { tls: None, api_token: opts.api_token.clone() };
        let (c, stop) = (coordinator.clone(), wait());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = serve_coordinator(listener, c, &opts_server, stop).await {
                tracing::error!(error = %e, "coordinator server failed");
            }
        }));
        Ok(Self {
            coordinator,
            coordinator_url,
            draft_url,
            verifier_urls,
            draft_worker,
            verifier_workers,
            shutdown,
            tasks,
        })
    }

    /// Loads both models from GGUF files and starts the stack.
    pub async fn start_from_files(
        draft_path: &Path,
        target_path: &Path,
        load: &PairLoadOptions,
        opts: LocalOptions,
    ) -> Result<Self, ServerError> {
        let draft = load_model(draft_path, &load.draft).await?;
        let target = load_model(target_path, &load.target).await?;
        let tokenizer = Arc::new(Tokenizer::from_gguf_file(target_path)?);
        Self::start(draft, target, tokenizer, opts).await
    }

    /// Stops every server and waits for them.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
