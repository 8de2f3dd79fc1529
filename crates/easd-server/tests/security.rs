//! TLS on every link (mutual TLS between coordinator and workers) and the bearer token on the client API.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use easd_model::{LoadOptions, Model, TinySpec, Tokenizer, write_tiny_gguf};
use easd_proto::v1::{self as pb, coordinator_client::CoordinatorClient, generate_request::Input};
use easd_server::coordinator::pool::PoolConfig;
use easd_server::local::{LocalOptions, LocalStack};
use easd_server::serve::{ServerOptions, serve_coordinator, serve_draft, serve_verifier};
use easd_server::{Coordinator, CoordinatorConfig, SessionLimits, Worker, tls};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A CA, a server certificate for "localhost" and a client certificate, as PEM files.
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        for name in ["server", "client"] {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(vec!["localhost".to_owned()]).unwrap().signed_by(&key, &ca).unwrap();
            std::fs::write(dir.path().join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.path().join(format!("{name}.key")), key.serialize_pem()).unwrap();
        }
        Self { dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn server_options(&self, mutual: bool) -> ServerOptions {
        let ca = self.path("ca.pem");
        let client_ca = mutual.then_some(ca.as_path());
        ServerOptions {
            tls: Some(tls::server_tls(&self.path("server.pem"), &self.path("server.key"), client_ca).unwrap()),
            api_token: None,
        }
    }

    fn client_tls(&self, with_identity: bool) -> ClientTlsConfig {
        let (cert, key) = (self.path("client.pem"), self.path("client.key"));
        let identity = with_identity.then_some((cert.as_path(), key.as_path()));
        tls::client_tls(&self.path("ca.pem"), identity, Some("localhost")).unwrap()
    }
}

fn tiny(dir: &Path) -> (Arc<Model>, Arc<Tokenizer>) {
    let path = dir.join("tiny.gguf");
    write_tiny_gguf(&path, &TinySpec::qwen2(7)).unwrap();
    let model = Model::load(&path, &LoadOptions { warmup: false, ..LoadOptions::default() }).unwrap();
    (Arc::new(model), Arc::new(Tokenizer::from_gguf_file(&path).unwrap()))
}

fn request() -> pb::GenerateRequest {
    pb::GenerateRequest {
        input: Some(Input::Prompt("hello".into())),
        max_tokens: Some(6),
        temperature: Some(0.0),
        mode: pb::Mode::Sd as i32,
        ..Default::default()
    }
}

async fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// Draft and verifier with mutual TLS; returns their URLs.
async fn tls_workers(pki: &Pki, model: &Arc<Model>) -> (String, String) {
    let mut urls = Vec::new();
    for role in ["draft", "verifier"] {
        let (l, port) = listener().await;
        let worker = Worker::new(model.clone(), SessionLimits::default(), role);
        let opts = pki.server_options(true);
        tokio::spawn(async move {
            let never = std::future::pending::<()>();
            if role == "draft" {
                serve_draft(l, worker, &opts, never).await
            } else {
                serve_verifier(l, worker, &opts, never).await
            }
        });
        urls.push(format!("https://localhost:{port}"));
    }
    (urls[0].clone(), urls[1].clone())
}

fn config(draft: &str, verifier: &str, tls: Option<ClientTlsConfig>) -> CoordinatorConfig {
    let mut c = CoordinatorConfig::new(draft, vec![verifier.to_owned()]);
    c.pool = PoolConfig { tls, ..PoolConfig::default() };
    c.startup_timeout = std::time::Duration::from_secs(2);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_between_coordinator_and_workers_and_tls_for_clients() {
    let pki = Pki::new();
    let (model, tokenizer) = tiny(pki.dir.path());
    let (draft, verifier) = tls_workers(&pki, &model).await;

    // Without a client certificate the workers refuse the coordinator.
    let refused = Coordinator::connect(config(&draft, &verifier, Some(pki.client_tls(false))), tokenizer.clone()).await;
    assert!(refused.is_err(), "mTLS workers must refuse a coordinator without a client certificate");

    let coordinator =
        Coordinator::connect(config(&draft, &verifier, Some(pki.client_tls(true))), tokenizer.clone()).await.unwrap();
    let (l, port) = listener().await;
    let opts = pki.server_options(false);
    tokio::spawn(async move { serve_coordinator(l, coordinator, &opts, std::future::pending()).await });

    // A TLS client that trusts the CA gets an answer.
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(pki.path("ca.pem")).unwrap()))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut stream = CoordinatorClient::new(channel).generate(request()).await.unwrap().into_inner();
    let mut events = 0;
    while stream.message().await.unwrap().is_some() {
        events += 1;
    }
    assert!(events >= 2);

    // A plaintext client fails cleanly (an error, not a hang).
    let plain = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let mut c = CoordinatorClient::connect(format!("http://127.0.0.1:{port}")).await?;
        c.generate(request()).await.map(|_| ()).map_err(|s| -> Box<dyn std::error::Error + Send + Sync> { Box::new(s) })
    })
    .await
    .expect("a plaintext client must not hang on a TLS server");
    assert!(plain.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_api_checks_the_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tokenizer) = tiny(dir.path());
    let opts = LocalOptions { api_token: Some("s3cret".into()), ..LocalOptions::default() };
    let stack = LocalStack::start(model.clone(), model, tokenizer, opts).await.unwrap();
    let mut client = CoordinatorClient::connect(stack.coordinator_url.clone()).await.unwrap();

    let missing = client.generate(request()).await.err().unwrap();
    assert_eq!(missing.code(), Code::Unauthenticated);

    let mut wrong = tonic::Request::new(request());
    wrong.metadata_mut().insert("authorization", "Bearer nope".parse().unwrap());
    let wrong = client.generate(wrong).await.err().unwrap();
    assert_eq!(wrong.code(), Code::Unauthenticated);
    assert!(wrong.message().contains("invalid bearer token"));

    let mut right = tonic::Request::new(request());
    right.metadata_mut().insert("authorization", "Bearer s3cret".parse().unwrap());
    let mut stream = client.generate(right).await.unwrap().into_inner();
    while stream.message().await.unwrap().is_some() {}
    stack.shutdown().await;
}
