//! Validation of a `Generate` request, once, before any work: every field checked with its name and range.

use easd_core::{EasdParams, MAX_BLOCK_SIZE, Mode, Order, Penalty, SamplingParams, validate_block_size};
use easd_model::{ChatMessage, Tokenizer};
use easd_proto::v1 as pb;

use crate::error::{PromptLength, ServerError};
use crate::limits::validate_id;

pub const DEFAULT_MAX_TOKENS: usize = 256;
pub const DEFAULT_BLOCK_SIZE: usize = 4;
pub const MAX_LOGPROBS: usize = 20;
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_STRING_BYTES: usize = 1024;
pub const MAX_TEMPERATURE: f32 = 2.0;

/// A validated generation request.
#[derive(Clone, Debug)]
pub struct Plan {
    pub request_id: String,
    pub prompt_tokens: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub seed: u64,
    pub mode: Mode,
    pub k: usize,
    /// EASD parameters; also used in other modes for N (top-N sets) and the penalty the verifier applies.
    pub easd: EasdParams,
    pub stop: Vec<String>,
    pub logprobs: usize,
    /// Draft the next block while the verifier scores this one (sd / easd only).
    pub pipeline: bool,
    /// Pipelined greedy requests: a block drafted while the verifier was busy takes what the draft made by then, up
    /// to this many tokens (at least `k`). Greedy tokens do not depend on where blocks end; sampled ones do, so
    /// their blocks stay at `k`.
    pub max_k: usize,
    /// Flexible blocks (`max_k` > `k`) take at least the length the session's measured costs favour (1..=k)
    /// instead of at least `k`.
    pub adaptive_blocks: bool,
    /// Greedy `sd` requests: a step runs the target alone, without drafting, while at least this many sessions are
    /// live on the session's verifier replica (0: always speculate). Greedy `sd` emits the target's argmax whatever
    /// the blocks are, so the tokens are the same; other modes and sampled requests always speculate.
    pub speculation_off_at: usize,
}

/// A mode by name: what the coordinator's default, the CLI and the OpenAI layer all parse and print. The request's
/// [`Mode`] adds the EASD parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModeKind {
    #[default]
    Sd,
    Easd,
    Target,
    Draft,
}

impl ModeKind {
    pub const ALL: [ModeKind; 4] = [Self::Target, Self::Draft, Self::Sd, Self::Easd];

    pub fn name(self) -> &'static str {
        match self {
            Self::Sd => "sd",
            Self::Easd => "easd",
            Self::Target => "target",
            Self::Draft => "draft",
        }
    }

    pub fn to_pb(self) -> pb::Mode {
        match self {
            Self::Sd => pb::Mode::Sd,
            Self::Easd => pb::Mode::Easd,
            Self::Target => pb::Mode::Target,
            Self::Draft => pb::Mode::Draft,
        }
    }

    /// The mode a request names; None when it names none (`MODE_UNSPECIFIED`) or an unknown one.
    pub fn from_pb(mode: i32) -> Option<Self> {
        match pb::Mode::try_from(mode).ok()? {
            pb::Mode::Unspecified => None,
            pb::Mode::Sd => Some(Self::Sd),
            pb::Mode::Easd => Some(Self::Easd),
            pb::Mode::Target => Some(Self::Target),
            pb::Mode::Draft => Some(Self::Draft),
        }
    }

    fn to_mode(self, easd: &EasdParams) -> Mode {
        match self {
            Self::Sd => Mode::Sd,
            Self::Easd => Mode::Easd(easd.clone()),
            Self::Target => Mode::Target,
            Self::Draft => Mode::Draft,
        }
    }
}

impl std::fmt::Display for ModeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ModeKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown mode {s:?}: expected sd, easd, target or draft"))
    }
}

/// The mode label of a request as sent (for metrics of requests refused before planning completes).
pub fn requested_mode_name(mode: i32, default: ModeKind) -> &'static str {
    match (mode, ModeKind::from_pb(mode)) {
        (_, Some(kind)) => kind.name(),
        (0, None) => default.name(),
        (_, None) => "unknown",
    }
}

/// What a request that leaves a field unset gets.
#[derive(Clone, Debug)]
pub struct RequestDefaults {
    pub easd: EasdParams,
    pub mode: ModeKind,
    pub k: usize,
    pub pipeline: bool,
    /// How far a pipelined greedy block may grow ([`Plan::max_k`]).
    pub max_block: usize,
    /// Flexible blocks take the length the measured costs favour ([`Plan::adaptive_blocks`]).
    pub adaptive_blocks: bool,
    /// Live sessions on a verifier at which greedy `sd` stops speculating ([`Plan::speculation_off_at`]).
    pub speculation_off_at: usize,
}

/// How far a pipelined greedy block may grow by default.
pub const DEFAULT_MAX_BLOCK: usize = 2 * DEFAULT_BLOCK_SIZE;

impl Default for RequestDefaults {
    fn default() -> Self {
        Self {
            easd: EasdParams::default(),
            mode: ModeKind::default(),
            k: DEFAULT_BLOCK_SIZE,
            pipeline: true,
            max_block: DEFAULT_MAX_BLOCK,
            adaptive_blocks: true,
            speculation_off_at: 0,
        }
    }
}

/// Limits the coordinator knows from its workers, and its defaults for what a request leaves unset.
pub struct PlanContext<'a> {
    pub tokenizer: &'a Tokenizer,
    pub context_length: usize,
    pub defaults: &'a RequestDefaults,
}

/// Every field of a request checked except what needs the tokenizer (the prompt's length in tokens).
#[derive(Clone, Debug)]
pub struct CheckedFields {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub mode: Mode,
    pub k: usize,
    pub easd: EasdParams,
    pub logprobs: usize,
    pub pipeline: bool,
}

/// Checks every field that needs no model: what a client (the `easd` CLI) runs before loading any, and the first
/// half of [`plan`]. Cheap checks come first, so a request with a bad field and a huge prompt fails at once.
pub fn check_fields(req: &pb::GenerateRequest, defaults: &RequestDefaults) -> Result<CheckedFields, ServerError> {
    match &req.input {
        None => return Err(ServerError::invalid("input", "one of prompt or chat is required")),
        Some(pb::generate_request::Input::Prompt(text)) if text.is_empty() => {
            return Err(ServerError::invalid("prompt", "must not be empty"));
        }
        Some(pb::generate_request::Input::Prompt(_)) => {}
        Some(pb::generate_request::Input::Chat(chat)) => {
            if chat.messages.is_empty() {
                return Err(ServerError::invalid("chat.messages", "must hold at least one message"));
            }
            if let Some(m) =
                chat.messages.iter().find(|m| !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool"))
            {
                let role: String = m.role.chars().take(32).collect();
                return Err(ServerError::invalid(
                    "chat.messages.role",
                    format!("must be one of system, user, assistant, tool; got {role:?}"),
                ));
            }
        }
    }

    let max_tokens = req.max_tokens.map_or(DEFAULT_MAX_TOKENS, |m| m as usize);
    if max_tokens == 0 {
        return Err(ServerError::invalid("max_tokens", "must be at least 1"));
    }

    let temperature = req.temperature.unwrap_or(0.0);
    if !(0.0..=MAX_TEMPERATURE).contains(&temperature) {
        return Err(ServerError::invalid(
            "temperature",
            format!("must be in [0, {MAX_TEMPERATURE}], got {temperature}"),
        ));
    }
    let sampling =
        SamplingParams { temperature, top_k: req.top_k.unwrap_or(0) as usize, top_p: req.top_p.unwrap_or(1.0) };
    sampling.validate()?;

    let kind = match ModeKind::from_pb(req.mode) {
        Some(kind) => kind,
        None if req.mode == pb::Mode::Unspecified as i32 => defaults.mode,
        None => return Err(ServerError::invalid("mode", format!("unknown mode {}", req.mode))),
    };
    let easd = easd_params(req.easd.unwrap_or_default(), &defaults.easd)?;
    let mode = kind.to_mode(&easd);

    let k = req.k.map_or(defaults.k, |k| k as usize);
    validate_block_size(k)
        .map_err(|_| ServerError::invalid("k", format!("must be in 1..={MAX_BLOCK_SIZE}, got {k}")))?;

    if req.stop.len() > MAX_STOP_STRINGS {
        return Err(ServerError::invalid(
            "stop",
            format!("at most {MAX_STOP_STRINGS} strings, got {}", req.stop.len()),
        ));
    }
    if req.stop.iter().any(String::is_empty) {
        return Err(ServerError::invalid("stop", "stop strings must not be empty"));
    }
    if let Some(long) = req.stop.iter().find(|s| s.len() > MAX_STOP_STRING_BYTES) {
        return Err(ServerError::invalid(
            "stop",
            format!("each stop string is at most {MAX_STOP_STRING_BYTES} bytes, got one of {}", long.len()),
        ));
    }

    let logprobs = req.logprobs as usize;
    if logprobs > MAX_LOGPROBS {
        return Err(ServerError::invalid("logprobs", format!("must be in 0..={MAX_LOGPROBS}, got {logprobs}")));
    }
    if logprobs > 0 && mode == Mode::Draft {
        return Err(ServerError::invalid("logprobs", "target log probabilities are not computed in draft mode"));
    }

    if !req.request_id.is_empty() {
        validate_id("request_id", &req.request_id)?;
    }
    Ok(CheckedFields {
        max_tokens,
        sampling,
        mode,
        k,
        easd,
        logprobs,
        pipeline: req.pipeline.unwrap_or(defaults.pipeline),
    })
}

/// Validates a request completely: its fields ([`check_fields`]), then its prompt against the context window.
///
/// A prompt is rejected before it is tokenized when its size alone shows that it cannot fit
/// (`Tokenizer::tokens_exceed`), so a megabytes-long prompt costs a normalization pass, not a BPE run.
pub fn plan(req: pb::GenerateRequest, ctx: &PlanContext<'_>) -> Result<Plan, ServerError> {
    let fields = check_fields(&req, ctx.defaults)?;
    let limit = ctx.context_length;
    let max_tokens = fields.max_tokens;
    if max_tokens >= limit {
        return Err(ServerError::invalid(
            "max_tokens",
            format!(
                "must be less than the context length {limit} (the prompt needs at least one token), got {max_tokens}"
            ),
        ));
    }
    let text = match req.input {
        Some(pb::generate_request::Input::Prompt(text)) => text,
        Some(pb::generate_request::Input::Chat(chat)) => {
            let messages: Vec<ChatMessage> =
                chat.messages.into_iter().map(|m| ChatMessage { role: m.role, content: m.content }).collect();
            ctx.tokenizer.apply_chat_template(&messages)?
        }
        None => return Err(ServerError::invalid("input", "one of prompt or chat is required")),
    };
    let budget = limit - max_tokens;
    let too_long = |prompt| ServerError::ContextLengthExceeded { prompt, max_tokens: Some(max_tokens), limit };
    if let Some(tokens) = ctx.tokenizer.tokens_exceed(&text, budget) {
        return Err(too_long(PromptLength::AtLeast { tokens, bytes: text.len() }));
    }
    let prompt_tokens = ctx.tokenizer.encode(&text)?;
    if prompt_tokens.is_empty() {
        return Err(ServerError::invalid("prompt", "encodes to no tokens"));
    }
    if prompt_tokens.len() > budget {
        return Err(too_long(PromptLength::Tokens(prompt_tokens.len())));
    }

    let request_id = if req.request_id.is_empty() { new_id() } else { req.request_id };
    let max_k =
        if fields.sampling.is_greedy() { ctx.defaults.max_block.clamp(fields.k, MAX_BLOCK_SIZE) } else { fields.k };
    Ok(Plan {
        request_id,
        prompt_tokens,
        max_tokens,
        sampling: fields.sampling,
        seed: req.seed.unwrap_or_else(rand::random),
        mode: fields.mode,
        k: fields.k,
        easd: fields.easd,
        stop: req.stop,
        logprobs: fields.logprobs,
        pipeline: fields.pipeline,
        max_k,
        adaptive_blocks: ctx.defaults.adaptive_blocks,
        speculation_off_at: ctx.defaults.speculation_off_at,
    })
}

fn easd_params(p: pb::EasdParams, defaults: &EasdParams) -> Result<EasdParams, ServerError> {
    let order = match pb::EasdOrder::try_from(p.order) {
        Ok(pb::EasdOrder::Unspecified) => defaults.order,
        Ok(pb::EasdOrder::AfterSd) => Order::AfterSd,
        Ok(pb::EasdOrder::Gate) => Order::Gate,
        Err(_) => return Err(ServerError::invalid("easd.order", format!("unknown order {}", p.order))),
    };
    let penalty = match p.penalty_alpha {
        None => defaults.penalty,
        Some(a) if (0.0..1.0).contains(&a) => Penalty::Scale(a),
        Some(a) => return Err(ServerError::invalid("easd.penalty_alpha", format!("must be in [0, 1), got {a}"))),
    };
    let params = EasdParams {
        top_n: p.top_n.map_or(defaults.top_n, |n| n as usize),
        rho: p.rho.unwrap_or(defaults.rho),
        tau_draft: p.tau_draft.unwrap_or(defaults.tau_draft),
        tau_target: p.tau_target.unwrap_or(defaults.tau_target),
        order,
        penalty,
    };
    params.validate().map_err(|e| ServerError::InvalidArgument {
        field: match e.field {
            "top_n" => "easd.top_n",
            "rho" => "easd.rho",
            "tau_draft" => "easd.tau_draft",
            "tau_target" => "easd.tau_target",
            _ => "easd",
        },
        reason: e.reason,
    })?;
    Ok(params)
}

/// A random 128-bit id in hex.
pub fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

pub fn easd_params_to_pb(p: &EasdParams) -> pb::EasdParams {
    pb::EasdParams {
        top_n: Some(p.top_n as u32),
        rho: Some(p.rho),
        tau_draft: Some(p.tau_draft),
        tau_target: Some(p.tau_target),
        order: match p.order {
            Order::AfterSd => pb::EasdOrder::AfterSd as i32,
            Order::Gate => pb::EasdOrder::Gate as i32,
        },
        penalty_alpha: match p.penalty {
            Penalty::Mask => None,
            Penalty::Scale(a) => Some(a),
        },
    }
}
