//! Request parameters, EASD parameters, modes, and their validation.
//!
//! Validation happens once, at the edge (the coordinator, the CLI); the algorithm functions
//! assume valid input but never panic on invalid input.

/// A parameter that failed validation, with a message naming the field and the value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct ParamError {
    pub field: &'static str,
    pub reason: String,
}

impl ParamError {
    fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self { field, reason: reason.into() }
    }
}

/// The request's sampling transform: softmax(logits / temperature) → top-k → top-p.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self { temperature: 0.0, top_k: 0, top_p: 1.0 }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    pub fn validate(&self) -> Result<(), ParamError> {
        let t = self.temperature;
        if !t.is_finite() || t < 0.0 {
            return Err(ParamError::new("temperature", format!("must be finite and >= 0 (0 = greedy), got {t}")));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(ParamError::new("top_p", format!("must be in (0, 1], got {p}")));
        }
        Ok(())
    }
}

/// When the EASD rule runs relative to the standard SD test (DESIGN §2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The rule applies only to tokens the SD test accepted (default).
    AfterSd,
    /// The rule runs first; if it fires the token is rejected whatever the SD test would say.
    Gate,
}

/// What the EASD resample does to the rejected token x_j.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Penalty {
    /// Remove x_j from p_j and renormalise (default).
    Mask,
    /// Multiply p_j(x_j) by alpha in [0, 1) and renormalise.
    Scale(f32),
}

/// Largest accepted EASD N (the draft sends at most this many top ids per position).
pub const MAX_EASD_TOP_N: usize = 64;

/// Parameters of the EASD rejection rule (DESIGN §2.2).
#[derive(Clone, Debug, PartialEq)]
pub struct EasdParams {
    /// N: size of the top-N sets compared.
    pub top_n: usize,
    /// ρ: minimum overlap |TopN(q̂) ∩ TopN(p̂)| / N.
    pub rho: f32,
    /// τ_draft: minimum draft entropy H(q̂), nats.
    pub tau_draft: f32,
    /// τ_target: minimum target entropy H(p̂), nats.
    pub tau_target: f32,
    pub order: Order,
    pub penalty: Penalty,
}

impl Default for EasdParams {
    fn default() -> Self {
        Self { top_n: 5, rho: 0.6, tau_draft: 0.81, tau_target: 0.68, order: Order::AfterSd, penalty: Penalty::Mask }
    }
}

impl EasdParams {
    pub fn validate(&self) -> Result<(), ParamError> {
        if self.top_n == 0 || self.top_n > MAX_EASD_TOP_N {
            return Err(ParamError::new("top_n", format!("must be in 1..={MAX_EASD_TOP_N}, got {}", self.top_n)));
        }
        let rho = self.rho;
        if !(0.0..=1.0).contains(&rho) {
            return Err(ParamError::new("rho", format!("must be in [0, 1], got {rho}")));
        }
        for (field, tau) in [("tau_draft", self.tau_draft), ("tau_target", self.tau_target)] {
            if !tau.is_finite() || tau < 0.0 {
                return Err(ParamError::new(field, format!("must be finite and >= 0 nats, got {tau}")));
            }
        }
        if let Penalty::Scale(alpha) = self.penalty
            && !(0.0..1.0).contains(&alpha)
        {
            return Err(ParamError::new("penalty", format!("scale alpha must be in [0, 1), got {alpha}")));
        }
        Ok(())
    }
}

/// Decoding mode (DESIGN §2.1–2.3).
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// The target alone, autoregressive.
    Target,
    /// The draft alone.
    Draft,
    /// Standard lossless speculative sampling.
    Sd,
    /// Speculative sampling plus the entropy-aware rejection rule.
    Easd(EasdParams),
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Target => "target",
            Mode::Draft => "draft",
            Mode::Sd => "sd",
            Mode::Easd(_) => "easd",
        }
    }

    /// Validates the EASD parameters, if any.
    pub fn validate(&self) -> Result<(), ParamError> {
        match self {
            Mode::Easd(p) => p.validate(),
            Mode::Target | Mode::Draft | Mode::Sd => Ok(()),
        }
    }
}

/// Largest block size k the system accepts.
pub const MAX_BLOCK_SIZE: usize = 32;

pub fn validate_block_size(k: usize) -> Result<(), ParamError> {
    if k == 0 || k > MAX_BLOCK_SIZE {
        return Err(ParamError::new("k", format!("block size must be in 1..={MAX_BLOCK_SIZE}, got {k}")));
    }
    Ok(())
}

/// Rejects empty vectors, NaN and +inf anywhere, and vectors where every entry is -inf.
/// A -inf entry alone is fine: it is how a model masks a token.
pub fn validate_logits(logits: &[f32]) -> Result<(), ParamError> {
    if logits.is_empty() {
        return Err(ParamError::new("logits", "empty logit vector"));
    }
    let mut any_finite = false;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            return Err(ParamError::new("logits", format!("NaN at index {i}")));
        }
        if l == f32::INFINITY {
            return Err(ParamError::new("logits", format!("+inf at index {i}")));
        }
        any_finite |= l.is_finite();
    }
    if !any_finite {
        return Err(ParamError::new("logits", format!("all {} entries are -inf", logits.len())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p }
    }

    #[test]
    fn default_sampling_is_greedy_and_valid() {
        let p = SamplingParams::default();
        assert!(p.is_greedy());
        assert_eq!(p.validate(), Ok(()));
        assert!(!sampling(0.7, 40, 0.9).is_greedy());
    }

    #[test]
    fn invalid_sampling_parameters_get_precise_messages() {
        let cases = [
            (sampling(-0.5, 0, 1.0), "invalid temperature: must be finite and >= 0 (0 = greedy), got -0.5"),
            (sampling(f32::NAN, 0, 1.0), "invalid temperature: must be finite and >= 0 (0 = greedy), got NaN"),
            (sampling(f32::INFINITY, 0, 1.0), "invalid temperature: must be finite and >= 0 (0 = greedy), got inf"),
            (sampling(1.0, 0, 1.5), "invalid top_p: must be in (0, 1], got 1.5"),
            (sampling(1.0, 0, 0.0), "invalid top_p: must be in (0, 1], got 0"),
            (sampling(1.0, 0, f32::NAN), "invalid top_p: must be in (0, 1], got NaN"),
        ];
        for (params, message) in cases {
            assert_eq!(params.validate().unwrap_err().to_string(), message);
        }
        assert_eq!(sampling(1e-6, 1, 1e-3).validate(), Ok(()));
    }

    #[test]
    fn invalid_easd_parameters_get_precise_messages() {
        let base = EasdParams::default();
        assert_eq!(base.validate(), Ok(()));
        let cases = [
            (EasdParams { top_n: 0, ..base.clone() }, "top_n", "must be in 1..=64, got 0"),
            (EasdParams { top_n: 65, ..base.clone() }, "top_n", "must be in 1..=64, got 65"),
            (EasdParams { rho: -0.1, ..base.clone() }, "rho", "must be in [0, 1], got -0.1"),
            (EasdParams { rho: 1.01, ..base.clone() }, "rho", "must be in [0, 1], got 1.01"),
            (EasdParams { rho: f32::NAN, ..base.clone() }, "rho", "must be in [0, 1], got NaN"),
            (EasdParams { tau_draft: -1.0, ..base.clone() }, "tau_draft", "must be finite and >= 0 nats, got -1"),
            (
                EasdParams { tau_target: f32::INFINITY, ..base.clone() },
                "tau_target",
                "must be finite and >= 0 nats, got inf",
            ),
            (
                EasdParams { penalty: Penalty::Scale(1.0), ..base.clone() },
                "penalty",
                "scale alpha must be in [0, 1), got 1",
            ),
        ];
        for (params, field, reason) in cases {
            let err = params.validate().unwrap_err();
            assert_eq!((err.field, err.reason.as_str()), (field, reason));
        }
        let ok = EasdParams { rho: 0.0, top_n: 64, penalty: Penalty::Scale(0.0), ..base };
        assert_eq!(Mode::Easd(ok).validate(), Ok(()));
    }

    #[test]
    fn block_size_must_be_between_one_and_the_maximum() {
        assert_eq!(validate_block_size(0).unwrap_err().to_string(), "invalid k: block size must be in 1..=32, got 0");
        assert!(validate_block_size(33).is_err());
        assert_eq!(validate_block_size(1), Ok(()));
        assert_eq!(validate_block_size(MAX_BLOCK_SIZE), Ok(()));
    }

    #[test]
    fn logits_with_nan_inf_or_nothing_finite_are_rejected() {
        let msg = |l: &[f32]| validate_logits(l).unwrap_err().to_string();
        assert_eq!(msg(&[]), "invalid logits: empty logit vector");
        assert_eq!(msg(&[0.0, f32::NAN]), "invalid logits: NaN at index 1");
        assert_eq!(msg(&[f32::INFINITY, 0.0]), "invalid logits: +inf at index 0");
        assert_eq!(msg(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), "invalid logits: all 2 entries are -inf");
        assert_eq!(validate_logits(&[f32::NEG_INFINITY, -3.0]), Ok(()));
    }

    #[test]
    fn modes_have_their_documented_names() {
        let names: Vec<_> =
            [Mode::Target, Mode::Draft, Mode::Sd, Mode::Easd(EasdParams::default())].iter().map(Mode::name).collect();
        assert_eq!(names, ["target", "draft", "sd", "easd"]);
    }
}
