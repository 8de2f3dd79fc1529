//! `easd bench sessions`: N concurrent sessions against a running coordinator, compared with the same requests one
//! at a time — aggregate and per-session tokens/s, latency percentiles, whether every session produced the tokens
//! it produces alone (batching must not change them), and the resident memory of the services before and after.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use easd_proto::v1::{self as pb, coordinator_client::CoordinatorClient, generate_request::Input};
use easd_server::coordinator::ModeKind;
use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct SessionsArgs {
    /// The coordinator to load.
    #[arg(long, default_value = "http://127.0.0.1:50050")]
    pub coordinator: String,
    /// Sessions at once (each with its own question).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// GSM8K-format JSONL questions.
    #[arg(long, default_value = "../shared/data/gsm8k/train.jsonl")]
    pub data: PathBuf,
    /// 1-based line of the first question (lines 2000+ of the GSM8K train split are the development prompts).
    #[arg(long, default_value_t = 2000)]
    pub first_line: usize,
    /// target | draft | sd | easd.
    #[arg(long, default_value = "sd")]
    pub mode: ModeKind,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Block size.
    #[arg(short = 'k', long, default_value_t = 4)]
    pub k: u32,
    /// Draft ahead or not; default: the coordinator's choice.
    #[arg(long)]
    pub pipeline: Option<bool>,
    /// Skip the one-at-a-time runs (then no comparison and no identical-tokens check).
    #[arg(long)]
    pub no_solo: bool,
    /// A process whose resident memory to report, as NAME=PID (repeatable), e.g. `--pid draft=1234`.
    #[arg(long = "pid", value_parser = parse_pid)]
    pub pids: Vec<(String, u32)>,
    /// Also write the figures as one JSON object to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn parse_pid(s: &str) -> Result<(String, u32), String> {
    let (name, pid) = s.split_once('=').ok_or_else(|| format!("expected NAME=PID, got {s:?}"))?;
    Ok((name.to_owned(), pid.parse().map_err(|e| format!("pid {pid:?}: {e}"))?))
}

/// One finished session as the client saw it.
struct Run {
    tokens: Vec<u32>,
    seconds: f64,
}

impl Run {
    fn tok_s(&self) -> f64 {
        self.tokens.len() as f64 / self.seconds
    }
}

/// Several runs: the requests' results in order, and the wall time of the whole set.
struct Phase {
    runs: Vec<Run>,
    wall_s: f64,
}

impl Phase {
    fn tokens(&self) -> usize {
        self.runs.iter().map(|r| r.tokens.len()).sum()
    }

    fn aggregate_tok_s(&self) -> f64 {
        self.tokens() as f64 / self.wall_s
    }

    fn mean_session_tok_s(&self) -> f64 {
        self.runs.iter().map(Run::tok_s).sum::<f64>() / self.runs.len() as f64
    }

    /// Session latency at percentile `p` (nearest rank).
    fn latency(&self, p: f64) -> f64 {
        let mut xs: Vec<f64> = self.runs.iter().map(|r| r.seconds).collect();
        xs.sort_by(f64::total_cmp);
        xs[((p / 100.0) * (xs.len() - 1) as f64).round() as usize]
    }

    fn describe(&self, what: &str) -> String {
        format!(
            "{what}: {} tokens in {:.1} s = {:.2} tok/s; per session {:.2} tok/s (mean); latency p50 {:.2} s, p99 {:.2} s",
            self.tokens(),
            self.wall_s,
            self.aggregate_tok_s(),
            self.mean_session_tok_s(),
            self.latency(50.0),
            self.latency(99.0)
        )
    }

    fn to_json(&self) -> serde_json::Value {
        json!({
            "tokens": self.tokens(),
            "wall_s": self.wall_s,
            "aggregate_tok_s": self.aggregate_tok_s(),
            "mean_session_tok_s": self.mean_session_tok_s(),
            "latency_p50_s": self.latency(50.0),
            "latency_p99_s": self.latency(99.0),
            "session_tok_s": self.runs.iter().map(Run::tok_s).collect::<Vec<_>>(),
        })
    }
}

async fn generate(url: String, req: pb::GenerateRequest) -> anyhow::Result<Run> {
    let started = Instant::now();
    let mut client = CoordinatorClient::connect(url.clone()).await.with_context(|| format!("connecting to {url}"))?;
    let mut stream = client.generate(req).await?.into_inner();
    let mut tokens = Vec::new();
    while let Some(event) = stream.message().await? {
        if let Some(pb::generate_event::Event::Delta(d)) = event.event {
            tokens.extend(d.token_ids);
        }
    }
    Ok(Run { tokens, seconds: started.elapsed().as_secs_f64() })
}

async fn solo(url: &str, requests: &[pb::GenerateRequest]) -> anyhow::Result<Phase> {
    let started = Instant::now();
    let mut runs = Vec::new();
    for req in requests {
        runs.push(generate(url.to_owned(), req.clone()).await?);
    }
    Ok(Phase { runs, wall_s: started.elapsed().as_secs_f64() })
}

async fn concurrent(url: &str, requests: &[pb::GenerateRequest]) -> anyhow::Result<Phase> {
    let started = Instant::now();
    let tasks: Vec<_> = requests.iter().map(|req| tokio::spawn(generate(url.to_owned(), req.clone()))).collect();
    let mut runs = Vec::new();
    for task in tasks {
        runs.push(task.await.context("session task")??);
    }
    Ok(Phase { runs, wall_s: started.elapsed().as_secs_f64() })
}

/// Resident memory of each named process, in MiB (Linux /proc; None where unreadable).
fn rss_mib(pids: &[(String, u32)]) -> Vec<Option<f64>> {
    pids.iter()
        .map(|(_, pid)| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let kib: f64 =
                status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
            Some(kib / 1024.0)
        })
        .collect()
}

fn mib(x: Option<f64>) -> String {
    x.map_or("?".into(), |v| format!("{v:.0} MiB"))
}

pub async fn run(args: SessionsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    anyhow::ensure!(args.first_line > 0, "--first-line is 1-based");
    let problems = easd_eval::load_problems(&args.data)
        .with_context(|| format!("reading questions from {}", args.data.display()))?;
    let problems = easd_eval::slice(problems, args.first_line - 1, Some(args.concurrency));
    anyhow::ensure!(problems.len() == args.concurrency, "{} has too few questions", args.data.display());
    let requests: Vec<pb::GenerateRequest> = problems
        .iter()
        .enumerate()
        .map(|(i, p)| pb::GenerateRequest {
            input: Some(Input::Chat(pb::ChatMessages {
                messages: vec![pb::ChatMessage { role: "user".into(), content: p.question.clone() }],
            })),
            max_tokens: Some(args.max_tokens),
            temperature: Some(args.temperature),
            seed: Some(i as u64),
            mode: args.mode.to_pb() as i32,
            k: Some(args.k),
            pipeline: args.pipeline,
            ..Default::default()
        })
        .collect();
    let url = args.coordinator.as_str();
    println!(
        "{} sessions, {} questions from line {} of {}, mode {}, k {}, max {} tokens, temperature {}",
        args.concurrency,
        requests.len(),
        args.first_line,
        args.data.display(),
        args.mode,
        args.k,
        args.max_tokens,
        args.temperature
    );
    let rss_before = rss_mib(&args.pids);
    let solo = if args.no_solo { None } else { Some(solo(url, &requests).await?) };
    if let Some(s) = &solo {
        println!("{}", s.describe("alone, one after the other"));
    }
    let rss_solo = rss_mib(&args.pids);
    let together = concurrent(url, &requests).await?;
    let rss_after = rss_mib(&args.pids);
    println!("{}", together.describe(&format!("{} at once", args.concurrency)));
    let mut report = json!({
        "concurrency": args.concurrency,
        "mode": args.mode.to_string(),
        "k": args.k,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "first_line": args.first_line,
        "concurrent": together.to_json(),
    });
    if let Some(s) = &solo {
        let same = s.runs.iter().zip(&together.runs).filter(|(a, b)| a.tokens == b.tokens).count();
        println!(
            "aggregate {:.2}× alone; per session {:.2}× alone; identical tokens: {same}/{} sessions",
            together.aggregate_tok_s() / s.aggregate_tok_s(),
            together.mean_session_tok_s() / s.mean_session_tok_s(),
            s.runs.len()
        );
        report["solo"] = s.to_json();
        report["identical_sessions"] = json!(same);
    }
    let mut rss = serde_json::Map::new();
    for (i, (name, pid)) in args.pids.iter().enumerate() {
        println!(
            "RSS {name} (pid {pid}): before {}, after the solo runs {}, after the concurrent runs {}",
            mib(rss_before[i]),
            mib(rss_solo[i]),
            mib(rss_after[i])
        );
        rss.insert(
            name.clone(),
            json!({ "before_mib": rss_before[i], "after_solo_mib": rss_solo[i], "after_mib": rss_after[i] }),
        );
    }
    report["rss"] = serde_json::Value::Object(rss);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
