//! The draft worker: serves `easd.v1.Draft` with a small model.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use easd_model::{LoadOptions, default_models_dir, parse_device, resolve_model};
use easd_server::{SessionLimits, Worker, local::load_model, serve::serve_draft};
use easd_services::{MetricsArgs, ServerTlsArgs, finish_telemetry, init_telemetry, shutdown_signal};

#[derive(Parser)]
#[command(version, about = "EASD draft worker: proposes token blocks with a small model")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:50051", env = "EASD_LISTEN")]
    listen: SocketAddr,
    /// GGUF path, or "draft" / "target" for the default pair.
    #[arg(long, default_value = "draft", env = "EASD_MODEL")]
    model: String,
    /// cpu | cuda | cuda:N
    #[arg(long, default_value = "cpu", env = "EASD_DEVICE")]
    device: String,
    /// Keep Q5_0/Q5_1/Q4_1 tensors as they are instead of re-quantizing them to Q8_0.
    #[arg(long)]
    no_requantize: bool,
    /// Memory budget for all session KV caches, in MiB.
    #[arg(long, default_value_t = 4096, env = "EASD_KV_BUDGET_MIB")]
    kv_budget_mib: usize,
    /// Sessions idle for longer are dropped, in seconds.
    #[arg(long, default_value_t = 300)]
    idle_timeout_s: u64,
    #[command(flatten)]
    tls: ServerTlsArgs,
    #[command(flatten)]
    metrics: MetricsArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let telemetry = init_telemetry("easd-draft")?;
    run(args).await?;
    finish_telemetry(telemetry).await;
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let options = args.tls.options(None)?;
    let metrics = args.metrics.bind().await?;
    let path = resolve_model(&args.model, &default_models_dir(), false).context("resolving the model")?;
    let load =
        LoadOptions { device: parse_device(&args.device)?, requantize: !args.no_requantize, ..LoadOptions::default() };
    let model = load_model(&path, &load).await.with_context(|| format!("loading {}", path.display()))?;
    let limits = SessionLimits {
        budget_bytes: args.kv_budget_mib << 20,
        idle_timeout: Duration::from_secs(args.idle_timeout_s),
    };
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let worker = Worker::new(model, limits, "draft");
    metrics.serve(worker.metrics().registry());
    tracing::info!(addr = %args.listen, model = %path.display(), "draft worker serving");
    serve_draft(listener, worker, &options, shutdown_signal()).await.context("serving")?;
    Ok(())
}
