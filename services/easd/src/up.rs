//! `easd up`: the whole system on loopback until Ctrl-C.

use std::net::SocketAddr;

use easd_server::local::LocalOptions;

use crate::stack::LocalArgs;

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Where the coordinator's gRPC API listens.
    #[arg(long, default_value = "127.0.0.1:50050")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub local: LocalArgs,
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    let stack = args.local.start(LocalOptions { coordinator_addr: args.listen, ..LocalOptions::default() }).await?;
    println!("coordinator (gRPC): {}", stack.coordinator_url);
    println!("draft worker:       {}", stack.draft_url);
    for url in &stack.verifier_urls {
        println!("verifier replica:   {url}");
    }
    println!("try: easd ask --coordinator {} \"What is 17 * 23?\"", stack.coordinator_url);
    println!("Ctrl-C stops.");
    tokio::signal::ctrl_c().await?;
    eprintln!("shutting down");
    stack.shutdown().await;
    Ok(())
}
