//! `easd up`: the whole system on loopback until Ctrl-C.

use std::net::SocketAddr;

use anyhow::Context;

use easd_server::local::LocalOptions;

use crate::stack::LocalArgs;

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Where the coordinator's gRPC API listens.
    #[arg(long, default_value = "127.0.0.1:50050")]
    pub listen: SocketAddr,
    /// Where the OpenAI-compatible HTTP API listens.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http_listen: SocketAddr,
    /// Do not serve the HTTP API.
    #[arg(long)]
    pub no_http: bool,
    /// Bearer token required by both APIs.
    #[arg(long, env = "EASD_API_TOKEN")]
    pub api_token: Option<String>,
    /// File whose first line is the bearer token (kept out of `ps`).
    #[arg(long, env = "EASD_API_TOKEN_FILE")]
    pub api_token_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub local: LocalArgs,
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    // Logs on stderr as the separate services write them (`RUST_LOG`, default info; OTLP when configured): a
    // retry, a failover or a refused request shows here.
    let _telemetry = easd_telemetry::init("easd-up").context("initialising telemetry")?;
    let api_token = easd_server::serve::api_token(args.api_token.clone(), args.api_token_file.as_deref())
        .map_err(anyhow::Error::msg)?;
    let opts = LocalOptions { coordinator_addr: args.listen, api_token: api_token.clone(), ..LocalOptions::default() };
    let stack = args.local.start(opts).await?;
    println!("coordinator (gRPC): {}", stack.coordinator_url);
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let http = if args.no_http {
        None
    } else {
        let listener = tokio::net::TcpListener::bind(args.http_listen)
            .await
            .with_context(|| format!("listening on {}", args.http_listen))?;
        println!("OpenAI-compatible HTTP API: http://{}/v1", listener.local_addr()?);
        let config = easd_openai::HttpConfig { api_token, ..Default::default() };
        let coordinator = stack.coordinator.clone();
        Some(tokio::spawn(async move {
            let shutdown = async {
                let _ = http_stopped.await;
            };
            if let Err(e) = easd_openai::serve(listener, coordinator, config, shutdown).await {
                tracing::error!(error = %e, "HTTP API failed");
            }
        }))
    };
    println!("draft worker:       {}", stack.draft_url);
    for url in &stack.verifier_urls {
        println!("verifier replica:   {url}");
    }
    println!("try: easd ask --coordinator {} \"What is 17 * 23?\"", stack.coordinator_url);
    println!("Ctrl-C stops.");
    tokio::signal::ctrl_c().await?;
    eprintln!("shutting down");
    let _ = stop_http.send(());
    if let Some(http) = http {
        let _ = http.await;
    }
    stack.shutdown().await;
    Ok(())
}
