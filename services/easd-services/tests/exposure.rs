//! Who can reach a worker: the three binaries bind loopback by default, and a worker asked to listen beyond it
//! refuses to start without client authentication (mutual TLS) unless `--insecure` says so.

mod support;

use std::process::{Command, Stdio};

use support::*;

fn binary(kind: &str) -> &'static str {
    match kind {
        "draft" => env!("CARGO_BIN_EXE_easd-draft"),
        "verifier" => env!("CARGO_BIN_EXE_easd-verifier"),
        _ => env!("CARGO_BIN_EXE_easd-coordinator"),
    }
}

#[test]
fn every_binary_listens_on_loopback_by_default() {
    for (kind, port) in [("coordinator", 50050), ("draft", 50051), ("verifier", 50052)] {
        let help = Command::new(binary(kind)).arg("--help").env_remove("EASD_LISTEN").output().unwrap();
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(text.contains(&format!("[default: 127.0.0.1:{port}]")), "{kind}: {text}");
    }
}

#[test]
fn a_worker_beyond_loopback_without_mutual_tls_refuses_to_start_and_says_what_to_add() {
    let pair = tiny_pair();
    for (kind, model) in [("draft", &pair.draft), ("verifier", &pair.target)] {
        let out = Command::new(binary(kind))
            .arg(format!("--listen=0.0.0.0:{}", free_port()))
            .arg(format!("--model={}", model.display()))
            .env("RUST_LOG", "warn")
            .env_remove("EASD_INSECURE")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{kind} started");
        let stderr = String::from_utf8_lossy(&out.stderr);
        for needed in ["refusing to listen on 0.0.0.0", "--tls-client-ca", "--insecure"] {
            assert!(stderr.contains(needed), "{kind}: {needed:?} missing from: {stderr}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_insecure_a_worker_serves_beyond_loopback() {
    let pair = tiny_pair();
    let port = free_port();
    let child = Command::new(binary("draft"))
        .arg(format!("--listen=0.0.0.0:{port}"))
        .arg(format!("--model={}", pair.draft.display()))
        .arg("--insecure")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let draft = Proc { child, name: "draft".into(), port };
    wait_serving(&draft.url()).await;
}
