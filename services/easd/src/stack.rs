//! Starting the whole system in this process (`easd up`, `easd ask` without `--coordinator`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use easd_model::{HeadVocab, LoadOptions, ModelSources, Tokenizer, context_length_of, parse_device, resolve_model};
use easd_proto::v1 as pb;
use easd_server::BatchOptions;
use easd_server::coordinator::request::{PlanContext, RequestDefaults, plan};
use easd_server::local::{LocalOptions, LocalStack, PairLoadOptions};

/// Which models to run locally and how.
#[derive(clap::Args, Clone, Debug)]
pub struct LocalArgs {
    /// Draft model: a GGUF path, `hf:OWNER/NAME/FILE.gguf[@REVISION]` (from the hub cache, or
    /// downloaded and verified), or "draft" for the default (pulled on first use).
    #[arg(long, default_value = "draft")]
    pub draft_model: String,
    /// Target model: a GGUF path, `hf:OWNER/NAME/FILE.gguf[@REVISION]`, or "target" for the
    /// default (pulled on first use).
    #[arg(long, default_value = "target")]
    pub target_model: String,
    /// Where the default models live [default: $EASD_MODELS_DIR or the user cache directory].
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    #[command(flatten)]
    pub devices: DeviceArgs,
    /// Also convert Q5_0 tensors to Q8_0 at load (more memory; formats without a CPU kernel are always converted).
    #[arg(long)]
    pub requantize: bool,
    /// The draft scores only N token ids and the special tokens (0: the whole vocabulary): the first N of
    /// --draft-head-ranking, else the lowest ids. Same tokens out (speculative sampling stays exact); only
    /// acceptance can change. See docs/BENCHMARKS.md for what it pays.
    #[arg(long, default_value_t = 0, env = "EASD_DRAFT_HEAD_VOCAB")]
    pub draft_head_vocab: usize,
    /// Token ids most frequent first, one file (white space or commas, `#` comments) for --draft-head-vocab.
    #[arg(long, env = "EASD_DRAFT_HEAD_RANKING")]
    pub draft_head_ranking: Option<PathBuf>,
    /// CPU kernel threads for the whole process (0 = all cores). With other work on the same
    /// cores, give each process its share (e.g. `--threads 1` beside another busy process).
    #[arg(long, default_value_t = 0, env = "EASD_THREADS")]
    pub threads: usize,
    /// Verifier replicas to start.
    #[arg(long, default_value_t = 1)]
    pub verifiers: usize,
    /// Cross-session batching: how long a worker's forward waits for other active sessions' requests, in ms
    /// (never when the worker is idle; 0: only what is already queued is batched).
    #[arg(long, default_value_t = 2.0)]
    pub batch_window_ms: f64,
    /// Most input rows (tokens, all sessions together) in one forward of a worker (a longer prompt beside other
    /// sessions is fed in pieces); 1 turns batching off.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_max_rows: u64,
    /// Greedy sd requests run the target alone, without drafting, while this many sessions (or more) share the
    /// verifier: with a large batch, verifying drafted rows costs more than it saves. Same tokens. 0: never.
    #[arg(long, default_value_t = 0)]
    pub speculation_off_at: usize,
}

impl LocalArgs {
    /// Resolves (pulling the default pair if missing), loads and starts draft, verifier(s) and coordinator.
    pub async fn start(&self, opts: LocalOptions) -> anyhow::Result<LocalStack> {
        let files = self.resolve()?;
        self.start_with(&files, opts).await
    }

    /// The draft and target GGUF files, pulled first when they are the default pair and missing.
    pub fn resolve(&self) -> anyhow::Result<ModelFiles> {
        let sources = ModelSources::from_env(self.models_dir.clone());
        let draft = resolve_model(&self.draft_model, &sources, true).context("resolving the draft model")?;
        let target = resolve_model(&self.target_model, &sources, true).context("resolving the target model")?;
        Ok(ModelFiles { draft, target })
    }

    /// Loads the resolved models and starts draft, verifier(s) and coordinator.
    pub async fn start_with(&self, files: &ModelFiles, opts: LocalOptions) -> anyhow::Result<LocalStack> {
        easd_model::set_threads(self.threads)?;
        let mut load = self.devices.load_options(self.requantize)?;
        load.draft.head_vocab = HeadVocab::from_flags(self.draft_head_vocab, self.draft_head_ranking.as_deref())?;
        eprintln!("loading {} and {} …", files.draft.display(), files.target.display());
        let window = Duration::try_from_secs_f64(self.batch_window_ms / 1000.0).map_err(|_| {
            anyhow::anyhow!("--batch-window-ms must be a finite number ≥ 0, got {}", self.batch_window_ms)
        })?;
        let batch = BatchOptions { window, max_rows: self.batch_max_rows as usize, ..opts.batch };
        let opts = LocalOptions {
            verifier_replicas: self.verifiers,
            batch,
            speculation_off_at: self.speculation_off_at,
            ..opts
        };
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

/// Where each model of the pair runs.
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceArgs {
    /// Device of both models: cpu | cuda | cuda:N (cuda needs a build with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Device of the draft model alone [default: --device].
    #[arg(long)]
    pub draft_device: Option<String>,
    /// Device of the target model (every verifier replica) [default: --device].
    #[arg(long)]
    pub target_device: Option<String>,
}

impl DeviceArgs {
    /// Each model's load options, with its own device.
    pub fn load_options(&self, requantize: bool) -> anyhow::Result<PairLoadOptions> {
        let device = |own: &Option<String>, which: &str| {
            let name = own.as_deref().unwrap_or(&self.device);
            parse_device(name).with_context(|| format!("the {which} model's device"))
        };
        let load = |device| LoadOptions { device, requantize, ..LoadOptions::default() };
        Ok(PairLoadOptions {
            draft: load(device(&self.draft_device, "draft")?),
            target: load(device(&self.target_device, "target")?),
        })
    }
}
