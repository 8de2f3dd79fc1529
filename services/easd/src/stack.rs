//! Starting the whole system in this process (`easd up`, `easd ask` without `--coordinator`).

use std::path::PathBuf;

use anyhow::Context;
use easd_model::{LoadOptions, Tokenizer, context_length_of, default_models_dir, parse_device, resolve_model};
use easd_proto::v1 as pb;
use easd_server::coordinator::request::{PlanContext, RequestDefaults, plan};
use easd_server::local::{LocalOptions, LocalStack};

/// Which models to run locally and how.
#[derive(clap::Args, Clone, Debug)]
pub struct LocalArgs {
    /// Draft model: a GGUF path, or "draft" for the default (pulled on first use).
    #[arg(long, default_value = "draft")]
    pub draft_model: String,
    /// Target model: a GGUF path, or "target" for the default (pulled on first use).
    #[arg(long, default_value = "target")]
    pub target_model: String,
    /// Where the default models live [default: $EASD_MODELS_DIR or the user cache directory].
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    /// cpu | cuda | cuda:N
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Also convert Q5_0 tensors to Q8_0 at load (more memory; formats without a CPU kernel are always converted).
    #[arg(long)]
    pub requantize: bool,
    /// CPU kernel threads for the whole process (0 = all cores). With other work on the same
    /// cores, give each process its share (e.g. `--threads 1` beside another busy process).
    #[arg(long, default_value_t = 0, env = "EASD_THREADS")]
    pub threads: usize,
    /// Verifier replicas to start.
    #[arg(long, default_value_t = 1)]
    pub verifiers: usize,
}

impl LocalArgs {
    /// Resolves (pulling the default pair if missing), loads and starts draft, verifier(s) and coordinator.
    pub async fn start(&self, opts: LocalOptions) -> anyhow::Result<LocalStack> {
        let files = self.resolve()?;
        self.start_with(&files, opts).await
    }

    /// The draft and target GGUF files, pulled first when they are the default pair and missing.
    pub fn resolve(&self) -> anyhow::Result<ModelFiles> {
        let dir = self.models_dir.clone().unwrap_or_else(default_models_dir);
        let draft = resolve_model(&self.draft_model, &dir, true).context("resolving the draft model")?;
        let target = resolve_model(&self.target_model, &dir, true).context("resolving the target model")?;
        Ok(ModelFiles { draft, target })
    }

    /// Loads the resolved models and starts draft, verifier(s) and coordinator.
    pub async fn start_with(&self, files: &ModelFiles, opts: LocalOptions) -> anyhow::Result<LocalStack> {
        easd_model::set_threads(self.threads)?;
        let load =
            LoadOptions { device: parse_device(&self.device)?, requantize: self.requantize, ..LoadOptions::default() };
        eprintln!("loading {} and {} …", files.draft.display(), files.target.display());
        let opts = LocalOptions { verifier_replicas: self.verifiers, ..opts };
        LocalStack::start_from_files(&files.draft, &files.target, &load, opts).await.context("starting the local stack")
    }
}

/// The two model files of a local stack.
pub struct ModelFiles {
    pub draft: PathBuf,
    pub target: PathBuf,
}

impl ModelFiles {
    /// Validates `request` exactly as the coordinator of a stack over these files will (`plan`: the target's
    /// tokenizer and chat template, the smaller context window), reading only the files' metadata: a request that
    /// would be refused is refused before any weights load.
    pub fn check(&self, request: &pb::GenerateRequest, defaults: &RequestDefaults) -> anyhow::Result<()> {
        let tokenizer = Tokenizer::from_gguf_file(&self.target).context("reading the target's tokenizer")?;
        let context_length = context_length_of(&self.draft)?.min(context_length_of(&self.target)?);
        plan(request.clone(), &PlanContext { tokenizer: &tokenizer, context_length, defaults })?;
        Ok(())
    }
}
