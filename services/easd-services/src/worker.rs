//! What the two worker binaries share: flags, model loading and serving.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use easd_model::{HeadVocab, LoadOptions, ModelSources, parse_device, resolve_model};
use easd_server::{BatchOptions, SessionLimits, Worker, local::load_model, serve};

use crate::{MetricsArgs, ServerTlsArgs, shutdown_signal};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Draft,
    Verifier,
}

/// Flags both workers take besides their address and model.
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// cpu | cuda | cuda:N
    #[arg(long, default_value = "cpu", env = "EASD_DEVICE")]
    pub device: String,
    /// Also convert Q5_0 tensors to Q8_0 at load (more memory; formats without a CPU kernel are always converted).
    #[arg(long)]
    pub requantize: bool,
    /// Draft only: score only N token ids and the special tokens (0: the whole vocabulary): the first N of
    /// --head-ranking, else the lowest ids. Answers keep their tokens, only acceptance can change (`draft` mode
    /// answers use only those ids). A verifier refuses it: its distribution is the one the answer follows.
    #[arg(long, default_value_t = 0)]
    pub head_vocab: usize,
    /// Token ids most frequent first, one file (white space or commas, `#` comments) for --head-vocab.
    #[arg(long)]
    pub head_ranking: Option<std::path::PathBuf>,
    /// CPU kernel threads (0 = all cores). When the worker shares cores with other busy
    /// processes, give it its share; one forward runs at a time, using all of them.
    #[arg(long, default_value_t = 0, env = "EASD_THREADS")]
    pub threads: usize,
    /// Memory budget for all session KV caches, in MiB.
    #[arg(long, default_value_t = 4096, env = "EASD_KV_BUDGET_MIB")]
    pub kv_budget_mib: usize,
    /// Sessions idle for longer are dropped, in seconds.
    #[arg(long, default_value_t = 300)]
    pub idle_timeout_s: u64,
    /// Cross-session batching: how long a forward waits for other active sessions' requests, in ms (never when
    /// the worker is idle; 0: only what is already queued is batched).
    #[arg(long, default_value_t = 2.0, env = "EASD_BATCH_WINDOW_MS")]
    pub batch_window_ms: f64,
    /// Most input rows (tokens, all sessions together) in one forward (a longer prompt beside other sessions is fed
    /// in pieces); 1 turns batching off.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..), env = "EASD_BATCH_MAX_ROWS")]
    pub batch_max_rows: u64,
    /// Most requests waiting for the model; more wait for room.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_queue: u64,
    /// Most tokens of one prompt fed in one forward, even alone: a long prefill goes in pieces of this size,
    /// reporting progress after each (the coordinator's deadline is on the next report) and stopping within one
    /// piece when its caller leaves.
    #[arg(long, default_value_t = easd_server::batcher::DEFAULT_MAX_PIECE as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_max_piece: u64,
    #[command(flatten)]
    pub tls: ServerTlsArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Listen beyond loopback without client authentication: anyone who reaches the port can use the worker (its
    /// sessions, its cores). Only on a network where nothing but the coordinator can reach it.
    #[arg(long, env = "EASD_INSECURE")]
    pub insecure: bool,
}

/// A worker reachable beyond loopback must know its callers: mutual TLS, or the operator's explicit `--insecure`.
pub fn check_exposure(listen: SocketAddr, tls: &ServerTlsArgs, insecure: bool) -> anyhow::Result<()> {
    if listen.ip().is_loopback() || tls.tls_client_ca.is_some() {
        return Ok(());
    }
    if !insecure {
        anyhow::bail!(
            "refusing to listen on {listen} (beyond loopback) without client authentication: anyone who reaches the \
             port could use this worker. Add --tls-cert, --tls-key and --tls-client-ca (mutual TLS: only callers with a \
             certificate from that CA, the coordinator's, get in), or --insecure if only the coordinator can reach it"
        );
    }
    tracing::warn!(
        addr = %listen,
        "INSECURE: listening beyond loopback without client authentication (--insecure); anyone who reaches this port can use the worker"
    );
    Ok(())
}

/// Loads the model and serves the worker until SIGTERM / Ctrl-C.
pub async fn run_worker(role: Role, listen: SocketAddr, model: &str, args: WorkerArgs) -> anyhow::Result<()> {
    let name = match role {
        Role::Draft => "draft",
        Role::Verifier => "verifier",
    };
    if role == Role::Verifier && args.head_vocab > 0 {
        anyhow::bail!("--head-vocab is for the draft: a verifier must score the whole vocabulary");
    }
    check_exposure(listen, &args.tls, args.insecure)?;
    let options = args.tls.options(None)?;
    let metrics = args.metrics.bind().await?;
    let path = resolve_model(model, &ModelSources::from_env(None), false).context("resolving the model")?;
    easd_model::set_threads(args.threads)?;
    let load = LoadOptions {
        device: parse_device(&args.device)?,
        requantize: args.requantize,
        warmup: true,
        head_vocab: HeadVocab::from_flags(args.head_vocab, args.head_ranking.as_deref())?,
    };
    let model = load_model(&path, &load).await.with_context(|| format!("loading {}", path.display()))?;
    let limits = SessionLimits {
        budget_bytes: args.kv_budget_mib << 20,
        idle_timeout: Duration::from_secs(args.idle_timeout_s),
    };
    let batch = BatchOptions {
        window: batch_window(args.batch_window_ms)?,
        max_rows: args.batch_max_rows as usize,
        queue: args.batch_queue as usize,
        max_piece: args.batch_max_piece as usize,
    };
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("listening on {listen}"))?;
    let worker = Worker::with_batching(model, limits, batch, name);
    metrics.serve(worker.metrics().registry());
    tracing::info!(addr = %listen, model = %path.display(), role = name, "worker serving");
    match role {
        Role::Draft => serve::serve_draft(listener, worker, &options, shutdown_signal()).await,
        Role::Verifier => serve::serve_verifier(listener, worker, &options, shutdown_signal()).await,
    }
    .context("serving")
}

/// `--batch-window-ms` as a duration: finite and not negative.
pub fn batch_window(ms: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(ms / 1000.0)
        .map_err(|_| anyhow::anyhow!("--batch-window-ms must be a finite number ≥ 0, got {ms}"))
}
