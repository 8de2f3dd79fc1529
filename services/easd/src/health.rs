//! `easd health URL`: the standard gRPC health check, for container healthchecks and scripts.

use std::time::Duration;

use anyhow::Context;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

#[derive(clap::Args, Debug)]
pub struct HealthArgs {
    /// Server URL, e.g. http://127.0.0.1:50050
    pub url: String,
    /// Service name to check ("" = the whole server).
    #[arg(long, default_value = "")]
    pub service: String,
    #[arg(long, default_value_t = 5)]
    pub timeout_s: u64,
}

pub async fn run(args: HealthArgs) -> anyhow::Result<()> {
    let url = if args.url.contains("://") { args.url.clone() } else { format!("http://{}", args.url) };
    let check = async {
        let channel = tonic::transport::Endpoint::from_shared(url.clone())?
            .connect()
            .await
            .with_context(|| format!("connecting to {url}"))?;
        let mut client = HealthClient::new(channel);
        let status = client
            .check(HealthCheckRequest { service: args.service.clone() })
            .await
            .map_err(|s| anyhow::anyhow!("{:?}: {}", s.code(), s.message()))?
            .into_inner()
            .status();
        anyhow::Ok(status)
    };
    let status = tokio::time::timeout(Duration::from_secs(args.timeout_s), check)
        .await
        .with_context(|| format!("{url} did not answer within {} s", args.timeout_s))??;
    println!("{}", status.as_str_name());
    anyhow::ensure!(status == ServingStatus::Serving, "{url} is not serving");
    Ok(())
}
