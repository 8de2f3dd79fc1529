//! The coordinator: the service clients call; drives the draft/verify loop across the workers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use easd_model::{ModelSources, Tokenizer, resolve_model};
use easd_server::coordinator::pool::PoolConfig;
use easd_server::coordinator::retry::Backoff;
use easd_server::{Coordinator, CoordinatorConfig, serve::serve_coordinator};
use easd_services::defaults::EasdDefaultsArgs;
use easd_services::{MetricsArgs, ServerTlsArgs, Shutdown, finish_telemetry, init_telemetry};

#[derive(Parser)]
#[command(
    version,
    about = "EASD coordinator: runs entropy-aware speculative decoding across draft and verifier workers"
)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:50050", env = "EASD_LISTEN")]
    listen: SocketAddr,
    /// Also serve the OpenAI-compatible HTTP API (/v1/chat/completions, …) on this address.
    #[arg(long, env = "EASD_HTTP_LISTEN")]
    http_listen: Option<SocketAddr>,
    /// Draft worker URL, e.g. http://draft:50051 (repeatable: sessions fail over between them).
    #[arg(long = "draft", env = "EASD_DRAFTS", value_delimiter = ',', required = true)]
    drafts: Vec<String>,
    /// Verifier replica URL (repeatable).
    #[arg(long = "verifier", env = "EASD_VERIFIERS", value_delimiter = ',', required_unless_present = "verifier_dns")]
    verifiers: Vec<String>,
    /// host:port re-resolved periodically for verifier replicas (e.g. a Kubernetes headless service).
    #[arg(long, env = "EASD_VERIFIER_DNS", conflicts_with = "verifiers")]
    verifier_dns: Option<String>,
    /// GGUF file whose tokenizer and chat template the coordinator uses (the target's): path,
    /// `hf:OWNER/NAME/FILE.gguf[@REVISION]` or "target".
    #[arg(long, default_value = "target", env = "EASD_TOKENIZER")]
    tokenizer: String,
    /// Deadline of each call to a worker, in seconds; a long prefill's deadline is on its next progress report
    /// instead (a live worker reports at least every piece of 256 tokens), so this bounds how long a stalled worker
    /// goes unnoticed, not how long a prompt may be.
    #[arg(long, default_value_t = 60.0)]
    call_timeout_s: f64,
    /// Period of the replicas' health checks (and DNS re-resolution), in seconds.
    #[arg(long, default_value_t = 2.0)]
    health_interval_s: f64,
    /// Attempts per worker call before the client gets UNAVAILABLE.
    #[arg(long, default_value_t = 6)]
    max_attempts: u32,
    /// Concurrent sessions per verifier replica; more wait in the queue.
    #[arg(long, default_value_t = 64)]
    max_sessions_per_replica: usize,
    /// Sessions that may wait for a replica; more get RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Verify and draft in turns instead of drafting the next block while the verifier scores this one (the
    /// default when draft and verifier are separate workers). The tokens are the same; requests may override it.
    #[arg(long, env = "EASD_NO_PIPELINE")]
    no_pipeline: bool,
    /// Pipelined greedy sd requests: how many tokens a block may grow to with what the draft made while the verifier
    /// was busy (the request's k or more; set it to k to keep blocks fixed). Greedy sd tokens are the same either
    /// way; easd and sampled requests always keep blocks of k.
    #[arg(long, default_value_t = easd_server::coordinator::request::DEFAULT_MAX_BLOCK)]
    max_block: usize,
    /// Growing blocks wait for only as many drafted tokens (1 to k) as the session's measured draft speed, verifier
    /// cost and acceptance favour, instead of always k (`false`: at least k). The tokens are the same either way.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    adaptive_blocks: bool,
    /// Greedy sd requests stop drafting and run the target alone while this many sessions (or more) are live on
    /// their verifier replica: with a large batch, verifying drafted rows costs more than it saves. The tokens are
    /// the same. 0: always speculate.
    #[arg(long, default_value_t = 0)]
    speculation_off_at: usize,
    /// Bearer token clients must send (authorization: Bearer …).
    #[arg(long, env = "EASD_API_TOKEN")]
    api_token: Option<String>,
    /// File whose first line is the bearer token (kept out of `ps`; e.g. a mounted Secret).
    #[arg(long, env = "EASD_API_TOKEN_FILE")]
    api_token_file: Option<PathBuf>,
    /// PEM CA that the workers' certificates chain to: the coordinator talks TLS to its workers.
    #[arg(long, env = "EASD_WORKER_CA")]
    worker_ca: Option<PathBuf>,
    /// Client certificate and key presented to the workers (mutual TLS).
    #[arg(long, requires_all = ["worker_ca", "worker_client_key"])]
    worker_client_cert: Option<PathBuf>,
    #[arg(long, requires = "worker_client_cert")]
    worker_client_key: Option<PathBuf>,
    /// Name the workers' certificates carry (default: the host of each URL).
    #[arg(long)]
    worker_tls_domain: Option<String>,
    #[command(flatten)]
    tls: ServerTlsArgs,
    #[command(flatten)]
    metrics: MetricsArgs,
    #[command(flatten)]
    defaults: EasdDefaultsArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let telemetry = init_telemetry("easd-coordinator")?;
    run(args).await?;
    finish_telemetry(telemetry).await;
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let api_token = easd_server::serve::api_token(args.api_token.clone(), args.api_token_file.as_deref())
        .map_err(anyhow::Error::msg)?;
    let options = args.tls.options(api_token.clone())?;
    let defaults = args.defaults.resolve()?;
    let metrics = args.metrics.bind().await?;
    let path = resolve_model(&args.tokenizer, &ModelSources::from_env(None), false)
        .context("resolving the tokenizer model")?;
    let tokenizer = Arc::new(
        Tokenizer::from_gguf_file(&path).with_context(|| format!("reading the tokenizer of {}", path.display()))?,
    );
    let worker_tls = match &args.worker_ca {
        Some(ca) => {
            let identity = args.worker_client_cert.as_deref().zip(args.worker_client_key.as_deref());
            Some(easd_server::tls::client_tls(ca, identity, args.worker_tls_domain.as_deref())?)
        }
        None => None,
    };
    let mut config = CoordinatorConfig::new(String::new(), args.verifiers);
    config.draft_urls = args.drafts;
    config.verifier_dns = args.verifier_dns;
    config.default_easd = defaults.easd;
    config.default_mode = defaults.mode;
    config.default_k = defaults.k;
    config.pipeline = !args.no_pipeline;
    config.max_block = args.max_block;
    config.adaptive_blocks = args.adaptive_blocks;
    config.speculation_off_at = args.speculation_off_at;
    config.pool = PoolConfig {
        call_timeout: Duration::from_secs_f64(args.call_timeout_s),
        health_interval: Duration::from_secs_f64(args.health_interval_s),
        max_sessions_per_replica: args.max_sessions_per_replica,
        max_queue: args.max_queue,
        backoff: Backoff { max_attempts: args.max_attempts, ..Backoff::default() },
        tls: worker_tls,
        ..PoolConfig::default()
    };
    let coordinator = Coordinator::connect(config, tokenizer).await.context("connecting to the workers")?;
    metrics.serve(coordinator.metrics().registry());
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let http_listener = match args.http_listen {
        Some(addr) => {
            Some(tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening for HTTP on {addr}"))?)
        }
        None => None,
    };
    let shutdown = Shutdown::on_signal();
    let http = http_listener.map(|listener| {
        let config = easd_openai::HttpConfig { api_token: api_token.clone(), ..Default::default() };
        tokio::spawn(easd_openai::serve(listener, coordinator.clone(), config, shutdown.clone().wait()))
    });
    tracing::info!(addr = %args.listen, "coordinator serving");
    serve_coordinator(listener, coordinator, &options, shutdown.wait()).await.context("serving")?;
    if let Some(http) = http {
        http.await.context("the HTTP API task failed")?.context("serving HTTP")?;
    }
    Ok(())
}
