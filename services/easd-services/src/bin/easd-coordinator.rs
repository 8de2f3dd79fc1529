//! The coordinator: the service clients call; drives the draft/verify loop across the workers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use easd_model::{Tokenizer, default_models_dir, resolve_model};
use easd_server::{Coordinator, CoordinatorConfig, serve::serve_coordinator};

#[derive(Parser)]
#[command(
    version,
    about = "EASD coordinator: runs entropy-aware speculative decoding across draft and verifier workers"
)]
struct Args {
    #[arg(long, default_value = "0.0.0.0:50050", env = "EASD_LISTEN")]
    listen: SocketAddr,
    /// Draft worker URL, e.g. http://draft:50051
    #[arg(long, env = "EASD_DRAFT")]
    draft: String,
    /// Verifier replica URL (repeatable).
    #[arg(long = "verifier", env = "EASD_VERIFIERS", value_delimiter = ',', required = true)]
    verifiers: Vec<String>,
    /// GGUF file whose tokenizer and chat template the coordinator uses (the target's): path or "target".
    #[arg(long, default_value = "target", env = "EASD_TOKENIZER")]
    tokenizer: String,
    /// Deadline of each call to a worker, in seconds.
    #[arg(long, default_value_t = 60)]
    call_timeout_s: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let path = resolve_model(&args.tokenizer, &default_models_dir(), false).context("resolving the tokenizer model")?;
    let tokenizer = Arc::new(
        Tokenizer::from_gguf_file(&path).with_context(|| format!("reading the tokenizer of {}", path.display()))?,
    );
    let mut config = CoordinatorConfig::new(args.draft, args.verifiers);
    config.call_timeout = Duration::from_secs(args.call_timeout_s);
    let coordinator = Coordinator::connect(config, tokenizer).await.context("connecting to the workers")?;
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    tracing::info!(addr = %args.listen, "coordinator serving");
    serve_coordinator(listener, coordinator, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .context("serving")?;
    Ok(())
}
