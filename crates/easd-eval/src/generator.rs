//! The generation backend as a small trait, and the request/response types the harness speaks.
//!
//! These mirror the coordinator's `GenerateRequest` / `Summary` (proto `easd.v1`) without depending on the generated
//! code, so the statistics and the report are tested with a fake backend; `crate::grpc` maps them to the wire.

use std::fmt;
use std::future::Future;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{BoxError, Error};

/// A decoding mode of the coordinator (DESIGN §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Draft,
    Target,
    Sd,
    Easd,
}

impl Mode {
    /// Every mode, in the report's order (baselines first).
    pub const ALL: [Mode; 4] = [Mode::Draft, Mode::Target, Mode::Sd, Mode::Easd];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Draft => "draft",
            Mode::Target => "target",
            Mode::Sd => "sd",
            Mode::Easd => "easd",
        }
    }

    /// Parses a comma-separated list such as `draft,target,sd,easd`.
    pub fn parse_list(s: &str) -> Result<Vec<Mode>, Error> {
        let mut modes = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mode: Mode = part.parse()?;
            if !modes.contains(&mode) {
                modes.push(mode);
            }
        }
        if modes.is_empty() {
            return Err(Error::invalid("modes", format!("no mode in {s:?}")));
        }
        Ok(modes)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s.to_ascii_lowercase())
            .ok_or_else(|| Error::invalid("mode", format!("expected draft, target, sd or easd, got {s:?}")))
    }
}

/// Sampling settings shared by every mode of a run (DESIGN: same prompts, seeds and sampling for all modes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 1 = off.
    pub top_p: f32,
    /// Base seed; problem i uses `seed + i` in every mode.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl Sampling {
    /// The coordinator's own check (easd-core's `SamplingParams::validate`), so the harness refuses exactly what the
    /// server would.
    pub fn validate(&self) -> Result<(), Error> {
        easd_core::SamplingParams { temperature: self.temperature, top_k: self.top_k as usize, top_p: self.top_p }
            .validate()
            .map_err(Error::from)
    }

    /// The temperature entropies are measured at: the request's, or 1 for greedy (DESIGN §2.2).
    pub fn entropy_temperature(&self) -> f32 {
        if self.temperature == 0.0 { 1.0 } else { self.temperature }
    }
}

/// EASD's `order` (DESIGN §2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EasdOrder {
    AfterSd,
    Gate,
}

/// EASD parameters; unset fields take the coordinator's defaults (its calibration file).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EasdSettings {
    pub top_n: Option<u32>,
    pub rho: Option<f32>,
    pub tau_draft: Option<f32>,
    pub tau_target: Option<f32>,
    pub order: Option<EasdOrder>,
    /// Unset = mask; set = scale p(x_j) by alpha in [0, 1).
    pub penalty_alpha: Option<f32>,
}

impl EasdSettings {
    /// These settings with their unset fields taken from `defaults`: what the coordinator resolves a request to.
    pub fn or(&self, defaults: &EasdSettings) -> EasdSettings {
        EasdSettings {
            top_n: self.top_n.or(defaults.top_n),
            rho: self.rho.or(defaults.rho),
            tau_draft: self.tau_draft.or(defaults.tau_draft),
            tau_target: self.tau_target.or(defaults.tau_target),
            order: self.order.or(defaults.order),
            penalty_alpha: self.penalty_alpha.or(defaults.penalty_alpha),
        }
    }

    /// The set fields against easd-core's limits (`EasdParams::validate`, e.g. N in 1..=`MAX_EASD_TOP_N`); unset
    /// fields take the core's defaults, which are valid, so an error always names a field that was set.
    pub fn validate(&self) -> Result<(), Error> {
        let defaults = easd_core::EasdParams::default();
        easd_core::EasdParams {
            top_n: self.top_n.map_or(defaults.top_n, |n| n as usize),
            rho: self.rho.unwrap_or(defaults.rho),
            tau_draft: self.tau_draft.unwrap_or(defaults.tau_draft),
            tau_target: self.tau_target.unwrap_or(defaults.tau_target),
            order: defaults.order,
            penalty: self.penalty_alpha.map_or(defaults.penalty, easd_core::Penalty::Scale),
        }
        .validate()
        .map_err(|e| match e.field {
            // The core calls the scale factor `penalty`; here it is the `penalty_alpha` field.
            "penalty" => Error::invalid("penalty_alpha", e.reason),
            _ => Error::from(e),
        })
    }
}

/// One chat message of the prompt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// One generation the harness asks of a backend.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalRequest {
    /// Rendered by the backend with the target model's chat template.
    pub messages: Vec<ChatMessage>,
    pub mode: Mode,
    /// `seed` here is already the per-problem seed.
    pub sampling: Sampling,
    /// Block size.
    pub k: u32,
    /// Only sent for `Mode::Easd`.
    pub easd: EasdSettings,
    pub max_tokens: u32,
    /// For tracing on the coordinator side.
    pub request_id: String,
}

/// One EASD trigger (proto `EasdTrigger`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trigger {
    pub position: u32,
    pub draft_entropy: f32,
    pub target_entropy: f32,
    pub overlap: f32,
}

/// The coordinator's per-request statistics (proto `Summary`, less the echo fields).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationSummary {
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    /// Server-side wall time of the request.
    pub wall_s: f64,
    pub tokens_per_s: f64,
    pub blocks: u32,
    pub drafted_tokens: u32,
    pub accepted_tokens: u32,
    pub acceptance_rate: f64,
    pub mean_accepted_len: f64,
    pub easd_triggers: u32,
    pub target_forwards: u32,
    pub discarded_tokens: u32,
    pub failovers: u32,
    /// "stop", "length" or "context".
    pub finish_reason: String,
    pub time_to_first_token_s: f64,
    pub draft_forward_s: f64,
    pub target_forward_s: f64,
    pub overhead_s: f64,
    pub triggers: Vec<Trigger>,
    #[serde(default)]
    pub note: String,
}

impl GenerationSummary {
    /// Output tokens that came from the draft (accepted proposals) and from the target (residual, EASD resample and
    /// bonus tokens; everything in `target` mode).
    pub fn token_sources(&self, mode: Mode) -> (u32, u32) {
        match mode {
            Mode::Draft => (self.generated_tokens, 0),
            Mode::Target => (0, self.generated_tokens),
            Mode::Sd | Mode::Easd => {
                let draft = self.accepted_tokens.min(self.generated_tokens);
                (draft, self.generated_tokens - draft)
            }
        }
    }
}

/// What a backend returns for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub text: String,
    /// The generated token ids, in order (empty when the backend does not report them).
    pub token_ids: Vec<u32>,
    pub summary: GenerationSummary,
}

/// A generation backend: the coordinator over gRPC in production, a fake in tests.
pub trait Generator: Sync {
    fn generate(&self, request: &EvalRequest) -> impl Future<Output = Result<Generation, BoxError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_lists_parse_dedupe_and_reject_unknown_names() {
        assert_eq!(Mode::parse_list("sd, EASD,sd").unwrap(), vec![Mode::Sd, Mode::Easd]);
        assert!(Mode::parse_list("sd,fast").unwrap_err().to_string().contains("\"fast\""));
        assert!(Mode::parse_list(" , ").is_err());
    }

    #[test]
    fn settings_validation_names_the_field() {
        let bad = EasdSettings { rho: Some(1.5), ..EasdSettings::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("rho"));
        // N's limit is the core's, whatever its value.
        let max = easd_core::MAX_EASD_TOP_N as u32;
        assert!(EasdSettings { top_n: Some(max), ..EasdSettings::default() }.validate().is_ok());
        for n in [0, max + 1] {
            let err = EasdSettings { top_n: Some(n), ..EasdSettings::default() }.validate().unwrap_err().to_string();
            assert!(err.contains("top_n") && err.contains(&format!("1..={max}")), "{err}");
        }
        for (bad, field) in [
            (EasdSettings { tau_draft: Some(-0.1), ..EasdSettings::default() }, "tau_draft"),
            (EasdSettings { tau_target: Some(f32::NAN), ..EasdSettings::default() }, "tau_target"),
            (EasdSettings { penalty_alpha: Some(1.0), ..EasdSettings::default() }, "penalty_alpha"),
        ] {
            assert!(bad.validate().unwrap_err().to_string().contains(field), "{field}");
        }
        assert!(EasdSettings::default().validate().is_ok());
        let bad = Sampling { temperature: -1.0, ..Sampling::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("temperature"));
        let bad = Sampling { top_p: 0.0, ..Sampling::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("top_p"));
        assert_eq!(Sampling::default().entropy_temperature(), 1.0);
    }

    #[test]
    fn tokens_are_attributed_to_the_model_that_produced_them() {
        let s = GenerationSummary { generated_tokens: 10, accepted_tokens: 7, ..GenerationSummary::default() };
        assert_eq!(s.token_sources(Mode::Sd), (7, 3));
        assert_eq!(s.token_sources(Mode::Target), (0, 10));
        assert_eq!(s.token_sources(Mode::Draft), (10, 0));
    }
}
