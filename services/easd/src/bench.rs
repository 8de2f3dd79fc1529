//! `easd bench model|verify|sessions`: speed figures and the block-verify check on a real model; concurrent sessions
//! against a running system (`bench_sessions.rs`).

use anyhow::Context;
use easd_model::{
    ChatMessage, HeadVocab, LoadOptions, Model, ModelSources, block_agreement, greedy_generate, parse_device,
    resolve_model,
};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Load time, memory, prefill and decode tok/s, latency of one k-token forward.
    Model(ModelBenchArgs),
    /// Greedy answer to a GSM8K question, then one-pass block scoring vs sequential argmax.
    Verify(VerifyArgs),
    /// A TCP forwarder adding a one-way latency to every chunk (simulated hosts; `scripts/bench-two-hosts.sh`).
    Proxy(crate::proxy::ProxyArgs),
    /// N concurrent sessions on GSM8K questions vs each alone, against a running coordinator: tokens/s, latency,
    /// identical tokens, RSS (`scripts/bench-batching.sh`).
    Sessions(crate::bench_sessions::SessionsArgs),
}

#[derive(clap::Args, Debug)]
pub struct ModelSource {
    /// A GGUF file, `hf:OWNER/NAME/FILE.gguf[@REVISION]`, or `draft` / `target` for the default models.
    #[arg(long, default_value = "target")]
    pub model: String,
    /// Models folder for `draft` / `target` [default: $EASD_MODELS_DIR or <cache dir>/easd/models].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Also convert Q5_0 tensors to Q8_0 at load (formats without a CPU kernel are always converted).
    #[arg(long)]
    pub requantize: bool,
    /// CPU kernel threads (0 = all cores).
    #[arg(long, default_value_t = 0, env = "EASD_THREADS")]
    pub threads: usize,
    /// Score only N token ids and the special tokens (0: the whole vocabulary), as a draft may.
    #[arg(long, default_value_t = 0)]
    pub head_vocab: usize,
    /// Token ids most frequent first, for --head-vocab.
    #[arg(long)]
    pub head_ranking: Option<PathBuf>,
}

impl ModelSource {
    fn load(&self) -> anyhow::Result<(Model, f64)> {
        let path = resolve_model(&self.model, &ModelSources::from_env(self.dir.clone()), false)?;
        easd_model::set_threads(self.threads)?;
        let opts = LoadOptions {
            device: parse_device(&self.device)?,
            requantize: self.requantize,
            warmup: true,
            head_vocab: HeadVocab::from_flags(self.head_vocab, self.head_ranking.as_deref())?,
        };
        let t = Instant::now();
        let model = Model::load(&path, &opts).with_context(|| format!("loading {}", path.display()))?;
        Ok((model, t.elapsed().as_secs_f64()))
    }
}

#[derive(clap::Args, Debug)]
pub struct ModelBenchArgs {
    #[command(flatten)]
    pub source: ModelSource,
    /// Prompt length for the prefill figure.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Tokens generated one at a time for the decode figure.
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    /// Block sizes for the k-token forward latency.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub ks: Vec<usize>,
    /// Repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
}

#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub source: ModelSource,
    /// The user question.
    #[arg(
        long,
        default_value = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"
    )]
    pub question: String,
    #[arg(long, default_value_t = 200)]
    pub max_tokens: usize,
    /// Tokens scored per forward.
    #[arg(long, default_value_t = 8)]
    pub block: usize,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Model(args) => bench_model(args),
        BenchCommand::Verify(args) => verify(args),
        BenchCommand::Proxy(args) => crate::runtime()?.block_on(crate::proxy::run(args)),
        BenchCommand::Sessions(args) => crate::runtime()?.block_on(crate::bench_sessions::run(args)),
    }
}

fn bench_model(args: ModelBenchArgs) -> anyhow::Result<()> {
    let (model, load_s) = args.source.load()?;
    let info = model.info();
    let rss_loaded = proc_status_kib("VmRSS");
    println!(
        "model: {} ({}, {} layers, hidden {}, vocab {} ({} in the head), file {:.1} MiB) on {}",
        info.name,
        info.architecture,
        info.n_layers,
        info.hidden_size,
        info.vocab_size,
        info.head_rows,
        info.file_bytes as f64 / 1048576.0,
        info.device
    );
    let stats = model.load_stats();
    println!(
        "load: {load_s:.2} s incl. warm-up; re-quantized to Q8_0: {} tensors ({:.1} M weights); kernel weights {:.1} MiB; kernels: {}",
        stats.requantized_tensors,
        stats.requantized_elements as f64 / 1e6,
        stats.kernel_bytes as f64 / 1048576.0,
        easd_model::kernel_description()
    );

    let prompt = prompt_tokens(&model, args.prompt_tokens)?;
    let reps = args.reps.max(1);
    let mut cache = model.new_cache();
    let prefill = median_of(reps, || model.forward_last(&mut cache, &prompt, 0, 1).map(|_| ()))?;
    println!(
        "prefill: {} tokens in {:.1} ms = {:.1} tok/s (cpu {:.1} ms)",
        prompt.len(),
        prefill.wall_s * 1e3,
        prompt.len() as f64 / prefill.wall_s,
        prefill.cpu_s * 1e3
    );

    let mut logits = model.forward_last(&mut cache, &prompt, 0, 1)?;
    let n = args.decode_tokens.max(1);
    let mut generated = Vec::with_capacity(n);
    let decode = Sample::measure(|| {
        for _ in 0..n {
            let next = logits.argmax(logits.rows() - 1);
            generated.push(next);
            let pos = cache.len();
            logits = model.forward(&mut cache, &[next], pos)?;
        }
        Ok(())
    })?;
    println!(
        "decode: {n} tokens in {:.1} ms = {:.1} tok/s ({:.1} ms/token wall, {:.1} ms/token cpu, context {}..{})",
        decode.wall_s * 1e3,
        n as f64 / decode.wall_s,
        decode.wall_s * 1e3 / n as f64,
        decode.cpu_s * 1e3 / n as f64,
        prompt.len(),
        cache.len()
    );

    println!(
        "k-token forward, all k logits rows, after a {}-token context (median and fastest of {reps}, the ks \
         interleaved so that drift in the machine's load reaches each alike):",
        prompt.len()
    );
    let blocks: Vec<(usize, Vec<u32>)> = args
        .ks
        .iter()
        .map(|&k| (k, generated.iter().copied().cycle().take(k).collect::<Vec<u32>>()))
        .filter(|(_, block)| !block.is_empty())
        .collect();
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); blocks.len()];
    for _ in 0..reps.max(1) {
        for ((_, block), xs) in blocks.iter().zip(samples.iter_mut()) {
            xs.push(Sample::measure(|| model.forward(&mut cache, block, prompt.len()).map(|_| ()))?);
        }
    }
    for ((k, _), mut xs) in blocks.iter().zip(samples) {
        xs.sort_by(|a, b| a.wall_s.total_cmp(&b.wall_s));
        let (s, fastest) = (xs[xs.len() / 2], xs[0]);
        println!(
            "  k = {k:>2}: {:>7.1} ms wall ({:.1} ms/token), cpu {:.1} ms, fastest {:.1} ms",
            s.wall_s * 1e3,
            s.wall_s * 1e3 / *k as f64,
            s.cpu_s * 1e3,
            fastest.wall_s * 1e3
        );
    }
    println!(
        "memory: RSS after load {:.0} MiB, peak RSS {:.0} MiB, KV cache {:.1} MiB for {} positions",
        rss_loaded as f64 / 1024.0,
        proc_status_kib("VmHWM") as f64 / 1024.0,
        cache.bytes() as f64 / 1048576.0,
        cache.len()
    );
    Ok(())
}

fn verify(args: VerifyArgs) -> anyhow::Result<()> {
    let (model, _) = args.source.load()?;
    let tok = model.tokenizer();
    let text = tok.apply_chat_template(&[ChatMessage::new("user", args.question.clone())])?;
    let prompt = tok.encode(&text)?;
    let t = Instant::now();
    let generated = greedy_generate(&model, &prompt, args.max_tokens)?;
    let secs = t.elapsed().as_secs_f64();
    println!("{}\n---", tok.decode(&generated)?);
    println!(
        "{} tokens in {:.1} s ({:.1} tok/s incl. a {}-token prefill)",
        generated.len(),
        secs,
        generated.len() as f64 / secs,
        prompt.len()
    );
    let a = block_agreement(&model, &prompt, &generated, args.block)?;
    println!(
        "{}-token one-pass verify vs sequential greedy: {}/{} positions agree",
        args.block,
        a.positions - a.mismatches.len(),
        a.positions
    );
    for (pos, gap) in &a.mismatches {
        println!("  mismatch at generated position {pos}: top-1/top-2 gap in the block logits {gap:.3}");
    }
    Ok(())
}

/// A prompt of exactly `n` tokens: a GSM8K-style chat, repeated as needed.
fn prompt_tokens(model: &Model, n: usize) -> anyhow::Result<Vec<u32>> {
    let tok = model.tokenizer();
    let q = "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' market?";
    let text = tok.apply_chat_template(&[ChatMessage::new("user", q)]).unwrap_or_else(|_| q.to_string());
    let one = tok.encode(&text)?;
    anyhow::ensure!(!one.is_empty(), "the tokenizer produced no tokens");
    Ok(one.iter().copied().cycle().take(n.max(1)).collect())
}

/// Wall-clock and process CPU time of one measurement. CPU time shows the work done even
/// when other processes compete for the cores (wall time then inflates).
#[derive(Clone, Copy, Debug)]
struct Sample {
    wall_s: f64,
    cpu_s: f64,
}

impl Sample {
    fn measure(f: impl FnOnce() -> easd_model::Result<()>) -> anyhow::Result<Sample> {
        let (t, c) = (Instant::now(), cpu_seconds());
        f()?;
        Ok(Sample { wall_s: t.elapsed().as_secs_f64(), cpu_s: cpu_seconds() - c })
    }
}

/// Median (by wall time) of `reps` runs.
fn median_of(reps: usize, mut f: impl FnMut() -> easd_model::Result<()>) -> anyhow::Result<Sample> {
    let mut xs = (0..reps.max(1)).map(|_| Sample::measure(&mut f)).collect::<anyhow::Result<Vec<_>>>()?;
    xs.sort_by(|a, b| a.wall_s.total_cmp(&b.wall_s));
    Ok(xs[xs.len() / 2])
}

/// User + system CPU seconds of this process (Linux `/proc/self/stat`; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    // USER_HZ is 100 on Linux.
    (tick(11) + tick(12)) as f64 / 100.0
}

/// A field of /proc/self/status in KiB (0 where unavailable, e.g. not Linux).
fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}
