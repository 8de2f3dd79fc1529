//! `easd ask`: one question, the answer streamed to stdout, the summary at the end.

use std::io::Write;

use anyhow::Context;
use easd_proto::v1::{self as pb, coordinator_client::CoordinatorClient, generate_request::Input};
use easd_server::coordinator::ModeKind;
use easd_server::coordinator::request::check_fields;
use easd_server::local::LocalOptions;
use serde_json::json;

use crate::stack::LocalArgs;

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum OrderArg {
    AfterSd,
    Gate,
}

/// EASD parameters; unset ones take the coordinator's defaults (calibrated thresholds when configured).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct EasdArgs {
    /// N of the top-N overlap.
    #[arg(long, allow_negative_numbers = true)]
    pub top_n: Option<u32>,
    /// Overlap threshold ρ in [0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub rho: Option<f32>,
    /// Draft entropy threshold τ_draft (nats).
    #[arg(long, allow_negative_numbers = true)]
    pub tau_draft: Option<f32>,
    /// Target entropy threshold τ_target (nats).
    #[arg(long, allow_negative_numbers = true)]
    pub tau_target: Option<f32>,
    #[arg(long, value_enum)]
    pub order: Option<OrderArg>,
    /// Scale p(x) by this α in [0, 1) instead of masking the rejected token.
    #[arg(long, allow_negative_numbers = true)]
    pub penalty_alpha: Option<f32>,
}

impl EasdArgs {
    pub fn to_pb(&self) -> pb::EasdParams {
        pb::EasdParams {
            top_n: self.top_n,
            rho: self.rho,
            tau_draft: self.tau_draft,
            tau_target: self.tau_target,
            order: match self.order {
                None => pb::EasdOrder::Unspecified,
                Some(OrderArg::AfterSd) => pb::EasdOrder::AfterSd,
                Some(OrderArg::Gate) => pb::EasdOrder::Gate,
            } as i32,
            penalty_alpha: self.penalty_alpha,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct AskArgs {
    /// The question (or, with --raw, the prompt text).
    pub question: String,
    /// target | draft | sd | easd.
    #[arg(long, default_value = "sd")]
    pub mode: ModeKind,
    /// Verify and draft in turns (`--pipeline false`) or draft ahead (`true`); default: the coordinator's choice.
    #[arg(long)]
    pub pipeline: Option<bool>,
    /// Coordinator URL; without it the whole stack starts in this process.
    #[arg(long)]
    pub coordinator: Option<String>,
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true)]
    pub max_tokens: u32,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    #[arg(long, allow_negative_numbers = true)]
    pub top_k: Option<u32>,
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Block size: tokens drafted per step.
    #[arg(short = 'k', long, default_value_t = 4, allow_negative_numbers = true)]
    pub k: u32,
    /// Log probabilities of the top N alternatives per token (0-20).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub logprobs: u32,
    /// Stop string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Send the question as the prompt, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub easd: EasdArgs,
    #[command(flatten)]
    pub local: LocalArgs,
}

impl AskArgs {
    pub fn request(&self) -> pb::GenerateRequest {
        let input = if self.raw {
            Input::Prompt(self.question.clone())
        } else {
            Input::Chat(pb::ChatMessages {
                messages: vec![pb::ChatMessage { role: "user".into(), content: self.question.clone() }],
            })
        };
        pb::GenerateRequest {
            input: Some(input),
            max_tokens: Some(self.max_tokens),
            temperature: Some(self.temperature),
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed,
            mode: self.mode.to_pb() as i32,
            k: Some(self.k),
            easd: Some(self.easd.to_pb()),
            stop: self.stop.clone(),
            logprobs: self.logprobs,
            request_id: String::new(),
            pipeline: self.pipeline,
        }
    }
}

pub async fn run(args: AskArgs) -> anyhow::Result<()> {
    let (url, stack) = match &args.coordinator {
        Some(url) => (url.clone(), None),
        None => {
            // The coordinator's own validation, before any model loads: first every field that needs no model (before
            // the default pair is even resolved, which may download or checksum it), then the prompt against the
            // models' tokenizer and context window, read from their metadata.
            let opts = LocalOptions::default();
            let request = args.request();
            check_fields(&request, &opts.request_defaults())?;
            let files = args.local.resolve()?;
            files.check(&request, &opts.request_defaults())?;
            let stack = args.local.start_with(&files, opts).await?;
            (stack.coordinator_url.clone(), Some(stack))
        }
    };
    let result = ask(&url, &args).await;
    if let Some(stack) = stack {
        stack.shutdown().await;
    }
    result
}

/// The answer and its summary, as collected from the stream.
pub struct Answer {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<pb::TokenInfo>,
    pub summary: pb::Summary,
}

/// Streams one generation; `on_text` sees each delta as it arrives.
pub async fn stream_answer(
    url: &str,
    request: pb::GenerateRequest,
    mut on_text: impl FnMut(&str),
) -> anyhow::Result<Answer> {
    let mut client =
        CoordinatorClient::connect(url.to_owned()).await.with_context(|| format!("connecting to {url}"))?;
    let mut stream = client.generate(request).await.map_err(status_error)?.into_inner();
    let mut answer = Answer { text: String::new(), token_ids: vec![], logprobs: vec![], summary: Default::default() };
    let mut got_summary = false;
    while let Some(event) = stream.message().await.map_err(status_error)? {
        match event.event {
            Some(pb::generate_event::Event::Delta(d)) => {
                on_text(&d.text);
                answer.text.push_str(&d.text);
                answer.token_ids.extend(d.token_ids);
                answer.logprobs.extend(d.logprobs);
            }
            Some(pb::generate_event::Event::Summary(s)) => {
                answer.summary = s;
                got_summary = true;
            }
            None => {}
        }
    }
    anyhow::ensure!(got_summary, "the coordinator closed the stream without a summary");
    Ok(answer)
}

fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", s.code(), s.message())
}

async fn ask(url: &str, args: &AskArgs) -> anyhow::Result<()> {
    let stream_text = !args.json;
    let answer = stream_answer(url, args.request(), |t| {
        if stream_text {
            print!("{t}");
            let _ = std::io::stdout().flush();
        }
    })
    .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer_json(&answer))?);
    } else {
        println!();
        eprintln!("{}", human_summary(&answer.summary));
    }
    Ok(())
}

pub fn answer_json(a: &Answer) -> serde_json::Value {
    let s = &a.summary;
    let mut v = json!({
        "text": a.text,
        "token_ids": a.token_ids,
        "mode": s.mode,
        "prompt_tokens": s.prompt_tokens,
        "generated_tokens": s.generated_tokens,
        "wall_s": s.wall_s,
        "tokens_per_s": s.tokens_per_s,
        "blocks": s.blocks,
        "drafted_tokens": s.drafted_tokens,
        "accepted_tokens": s.accepted_tokens,
        "acceptance_rate": s.acceptance_rate,
        "mean_accepted_len": s.mean_accepted_len,
        "easd_triggers": s.easd_triggers,
        "target_forwards": s.target_forwards,
        "discarded_tokens": s.discarded_tokens,
        "verifiers": s.verifiers,
        "failovers": s.failovers,
        "finish_reason": s.finish_reason,
        "time_to_first_token_s": s.time_to_first_token_s,
        "draft_forward_s": s.draft_forward_seconds,
        "target_forward_s": s.target_forward_seconds,
        "overhead_s": s.overhead_seconds,
        "note": s.note,
        "pipelined": s.pipelined,
        "predrafts_kept": s.predrafts_kept,
        "corrections_kept": s.corrections_kept,
        "predrafts_dropped": s.predrafts_dropped,
    });
    if !a.logprobs.is_empty() {
        v["logprobs"] = a
            .logprobs
            .iter()
            .map(|t| {
                json!({
                    "token": t.token, "text": t.text, "logprob": t.logprob,
                    "top_logprobs": t.top_logprobs.iter()
                        .map(|l| json!({"token": l.token, "text": l.text, "logprob": l.logprob}))
                        .collect::<Vec<_>>(),
                })
            })
            .collect();
    }
    v
}

pub fn human_summary(s: &pb::Summary) -> String {
    let mut out = format!(
        "── {} · {} tokens in {:.2} s ({:.2} tok/s) · finish: {}\n   blocks {} · drafted {} · accepted {} ({:.1}%) · mean accepted/block {:.2} · EASD triggers {} · target forwards {} · discarded {}\n   verifiers {} · failovers {} · forward time draft {:.2} s, target {:.2} s, other {:.2} s",
        s.mode,
        s.generated_tokens,
        s.wall_s,
        s.tokens_per_s,
        s.finish_reason,
        s.blocks,
        s.drafted_tokens,
        s.accepted_tokens,
        100.0 * s.acceptance_rate,
        s.mean_accepted_len,
        s.easd_triggers,
        s.target_forwards,
        s.discarded_tokens,
        s.verifiers.join(", "),
        s.failovers,
        s.draft_forward_seconds,
        s.target_forward_seconds,
        s.overhead_seconds,
    );
    if !s.note.is_empty() {
        out.push_str(&format!("\n   note: {}", s.note));
    }
    out
}
