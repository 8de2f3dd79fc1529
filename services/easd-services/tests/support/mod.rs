//! Real processes on loopback: the three service binaries with tiny models written from code.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use easd_model::{TinySpec, write_tiny_gguf};
use easd_proto::v1::{self as pb, coordinator_client::CoordinatorClient, generate_request::Input};

pub struct TinyPair {
    pub dir: tempfile::TempDir,
    pub draft: PathBuf,
    pub target: PathBuf,
}

pub fn tiny_pair() -> TinyPair {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("tiny-target.gguf");
    let draft = dir.path().join("tiny-draft.gguf");
    write_tiny_gguf(&target, &TinySpec::qwen2(7)).unwrap();
    write_tiny_gguf(&draft, &TinySpec { perturbation: Some((8, 0.3)), ..TinySpec::qwen2(7) }).unwrap();
    TinyPair { dir, draft, target }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A child process killed when dropped.
pub struct Proc {
    pub child: Child,
    pub name: String,
    pub port: u16,
}

impl Proc {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill").arg(format!("-{sig}")).arg(self.child.id().to_string()).status().unwrap();
        assert!(status.success(), "kill -{sig} {}", self.name);
    }

    /// Resident memory in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(bin: &str, name: &str, port: u16, args: &[String]) -> Proc {
    let child = Command::new(bin)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin}: {e}"));
    Proc { child, name: name.to_owned(), port }
}

pub fn worker(kind: &str, model: &Path, port: u16) -> Proc {
    worker_flags(kind, model, port, &[])
}

/// A worker with extra flags.
pub fn worker_flags(kind: &str, model: &Path, port: u16, extra: &[String]) -> Proc {
    let bin = match kind {
        "draft" => env!("CARGO_BIN_EXE_easd-draft"),
        _ => env!("CARGO_BIN_EXE_easd-verifier"),
    };
    let mut args = vec![format!("--listen=127.0.0.1:{port}"), format!("--model={}", model.display())];
    args.extend_from_slice(extra);
    spawn(bin, kind, port, &args)
}

/// The Prometheus text a service serves on `127.0.0.1:port` (`--metrics-listen`).
pub async fn metrics_text(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let request = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

/// The value of the sample `series` (name with its labels, as printed) in a metrics text.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

pub fn coordinator(pair: &TinyPair, drafts: &[&Proc], verifier_ports: &[u16], extra: &[&str]) -> Proc {
    let port = free_port();
    let mut args = vec![format!("--listen=127.0.0.1:{port}"), format!("--tokenizer={}", pair.target.display())];
    args.extend(drafts.iter().map(|d| format!("--draft={}", d.url())));
    args.extend(verifier_ports.iter().map(|p| format!("--verifier=http://127.0.0.1:{p}")));
    args.extend(extra.iter().map(|s| s.to_string()));
    spawn(env!("CARGO_BIN_EXE_easd-coordinator"), "coordinator", port, &args)
}

/// Polls the standard gRPC health service until SERVING (bounded).
pub async fn wait_serving(url: &str) {
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(channel) = tonic::transport::Endpoint::from_shared(url.to_owned()).unwrap().connect().await
            && let Ok(r) = HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await
            && r.into_inner().status() == ServingStatus::Serving
        {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never became healthy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn info(url: &str) -> pb::CoordinatorInfo {
    CoordinatorClient::connect(url.to_owned()).await.unwrap().info(pb::InfoRequest {}).await.unwrap().into_inner()
}

/// Polls the coordinator's view until `pred` holds (bounded).
pub async fn wait_info(url: &str, what: &str, pred: impl Fn(&pb::CoordinatorInfo) -> bool) -> pb::CoordinatorInfo {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let i = info(url).await;
        if pred(&i) {
            return i;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}; last view {:?}", i.replicas);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn healthy_verifiers(i: &pb::CoordinatorInfo) -> usize {
    i.replicas.iter().filter(|r| r.role == "verifier" && r.healthy).count()
}

pub fn request(prompt: &str, max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        input: Some(Input::Prompt(prompt.into())),
        max_tokens: Some(max_tokens),
        temperature: Some(0.0),
        seed: Some(3),
        mode: pb::Mode::Sd as i32,
        k: Some(4),
        ..Default::default()
    }
}

pub struct Outcome {
    pub text: String,
    pub tokens: Vec<u32>,
    pub summary: pb::Summary,
}

/// Streams a generation; `on_tokens` is called with the token count after each delta.
pub async fn generate(
    url: &str,
    req: pb::GenerateRequest,
    mut on_tokens: impl AsyncFnMut(usize),
) -> Result<Outcome, tonic::Status> {
    let mut client = CoordinatorClient::connect(url.to_owned()).await.unwrap();
    let mut stream = client.generate(req).await?.into_inner();
    let (mut text, mut tokens, mut summary) = (String::new(), Vec::new(), None);
    while let Some(ev) = stream.message().await? {
        match ev.event.unwrap() {
            pb::generate_event::Event::Delta(d) => {
                text.push_str(&d.text);
                tokens.extend(d.token_ids);
                on_tokens(tokens.len()).await;
            }
            pb::generate_event::Event::Summary(s) => summary = Some(s),
        }
    }
    Ok(Outcome { text, tokens, summary: summary.expect("summary") })
}
