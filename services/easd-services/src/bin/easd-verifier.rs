//! The verifier worker: serves `easd.v1.Verifier` with the target model.

use std::net::SocketAddr;

use clap::Parser;
use easd_services::worker::{Role, WorkerArgs, run_worker};
use easd_services::{finish_telemetry, init_telemetry};

#[derive(Parser)]
#[command(version, about = "EASD verifier worker: scores drafted blocks with the target model")]
struct Args {
    /// Address to listen on (loopback by default; beyond it the worker needs mutual TLS or --insecure).
    #[arg(long, default_value = "127.0.0.1:50052", env = "EASD_LISTEN")]
    listen: SocketAddr,
    /// GGUF path, `hf:OWNER/NAME/FILE.gguf[@REVISION]` (hub cache, else downloaded and verified;
    /// `HF_ENDPOINT`, `HF_HOME`, `HF_TOKEN` apply), or "draft" / "target" for the default pair.
    #[arg(long, default_value = "target", env = "EASD_MODEL")]
    model: String,
    #[command(flatten)]
    worker: WorkerArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let telemetry = init_telemetry("easd-verifier")?;
    run_worker(Role::Verifier, args.listen, &args.model, args.worker).await?;
    finish_telemetry(telemetry).await;
    Ok(())
}
