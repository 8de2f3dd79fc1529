//! Serves the OpenAI-compatible API over a whole local stack (draft, verifier, coordinator) in one process: the
//! tiny test models (written into `--dir` or a temporary directory) for the Python client tests
//! (`tests/openai/run.sh`), or a real pair given by path. Prints `listening on http://ADDR` once ready.
//!
//! `cargo run -p easd-openai --example serve_local -- [--port N] [--api-token TOKEN] [--dir DIR]
//!  [--draft-model PATH --target-model PATH]`

use std::path::PathBuf;

use easd_model::{LoadOptions, TinySpec, write_tiny_gguf};
use easd_openai::HttpConfig;
use easd_server::local::{LocalOptions, LocalStack, PairLoadOptions};

struct Args {
    port: u16,
    api_token: Option<String>,
    dir: Option<PathBuf>,
    models: (Option<PathBuf>, Option<PathBuf>),
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { port: 0, api_token: None, dir: None, models: (None, None) };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--port" => args.port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--api-token" => args.api_token = Some(value()?),
            "--dir" => args.dir = Some(PathBuf::from(value()?)),
            "--draft-model" => args.models.0 = Some(PathBuf::from(value()?)),
            "--target-model" => args.models.1 = Some(PathBuf::from(value()?)),
            other => {
                return Err(format!(
                    "unknown argument {other}; expected --port, --api-token, --dir, --draft-model or --target-model"
                ));
            }
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let temp = tempfile::tempdir()?;
    let (draft, target, load) = match args.models {
        (Some(draft), Some(target)) => (draft, target, LoadOptions::default()),
        (None, None) => {
            let dir = args.dir.unwrap_or_else(|| temp.path().to_owned());
            std::fs::create_dir_all(&dir)?;
            // The pair of the end-to-end tests: the draft is the target with noise.
            let (draft, target) = (dir.join("tiny-draft.gguf"), dir.join("tiny-target.gguf"));
            write_tiny_gguf(&target, &TinySpec::qwen2(7))?;
            write_tiny_gguf(&draft, &TinySpec { perturbation: Some((8, 0.3)), ..TinySpec::qwen2(7) })?;
            (draft, target, LoadOptions { warmup: false, ..LoadOptions::default() })
        }
        _ => return Err("--draft-model and --target-model go together".into()),
    };
    let stack =
        LocalStack::start_from_files(&draft, &target, &PairLoadOptions::both(load), LocalOptions::default()).await?;

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!("grpc coordinator on {}", stack.coordinator_url);
    let config = HttpConfig { api_token: args.api_token, ..HttpConfig::default() };
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let served = easd_openai::serve(listener, stack.coordinator.clone(), config, shutdown).await;
    stack.shutdown().await;
    Ok(served?)
}
