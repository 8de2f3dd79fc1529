//! The least length of a flexible block (pipelined greedy `sd`), chosen each step from what the session measured.
//!
//! A flexible block takes at least its floor of drafted tokens — the loop waits for the draft until it has them —
//! and past the floor only tokens the draft is sure of. A fixed floor of k suits one pair of machines and not
//! another: where the verifier's forward grows steeply with its rows (one CPU core running compute-bound
//! multi-row products), shorter blocks verify sooner and lose less when a pre-draft is dropped; where the
//! verifier's cost is flat and the draft is usually right, k is best. So the floor is the length in `1..=k`
//! with the most expected tokens per second under a small model of the pipelined step:
//!
//! * a drafted token is accepted with probability `a` (the session's running rate), so a block of `n` commits
//!   `Σ_{i≤n} aⁱ` tokens, and is kept whole with the draft's guess of its bonus right with probability `aⁿ⁺¹`;
//! * verifying `n` tokens (`n + 1` rows) takes `c₀ + c₁·(n + 1)` seconds (a line fitted to the verifies seen);
//! * the draft takes `d` seconds a token;
//! * a kept step lasts `max(verify, d·(n + 1))` (the next block and its guess were drafted meanwhile); a dropped
//!   one lasts `verify + d·n` (the next block is drafted from the corrected prefix while the verifier waits).
//!
//! Until two block lengths have been verified the line is unknown: the floor is k, then about k/2 (exploring once;
//! greedy `sd` tokens do not depend on the blocks). Only the timing changes.

/// Weight of the newest observation in the running estimates (about the last sixteen count).
const DECAY: f64 = 1.0 / 16.0;

/// Prior acceptance rate and its weight in positions, so the first blocks do not swing the rate to 0 or 1.
const PRIOR_RATE: f64 = 0.75;
const PRIOR_POSITIONS: f64 = 4.0;

/// A line `y = c₀ + c₁·x` fitted by exponentially weighted least squares.
#[derive(Debug, Default, Clone)]
struct LineFit {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

impl LineFit {
    fn add(&mut self, x: f64, y: f64) {
        let keep = 1.0 - DECAY;
        for s in [&mut self.w, &mut self.x, &mut self.y, &mut self.xx, &mut self.xy] {
            *s *= keep;
        }
        self.w += 1.0;
        self.x += x;
        self.y += y;
        self.xx += x * x;
        self.xy += x * y;
    }

    /// `(c₀, c₁)`, once the points span more than one `x`. A negative slope (noise) counts as flat.
    fn line(&self) -> Option<(f64, f64)> {
        let spread = self.w * self.xx - self.x * self.x;
        if self.w == 0.0 || spread <= 1e-9 * self.w * self.w {
            return None;
        }
        let slope = ((self.w * self.xy - self.x * self.y) / spread).max(0.0);
        let mean_x = self.x / self.w;
        let mean_y = self.y / self.w;
        Some((mean_y - slope * mean_x, slope))
    }
}

/// The running estimates of one session, and the floor they give.
#[derive(Debug, Clone)]
pub(crate) struct BlockFloor {
    k: usize,
    draft_s_per_token: Option<f64>,
    verify: LineFit,
    accepted: f64,
    evaluated: f64,
}

impl BlockFloor {
    /// Floors in `1..=k`.
    pub(crate) fn new(k: usize) -> Self {
        Self { k: k.max(1), draft_s_per_token: None, verify: LineFit::default(), accepted: 0.0, evaluated: 0.0 }
    }

    /// The draft computed `tokens` tokens in `seconds`.
    pub(crate) fn observe_draft(&mut self, tokens: usize, seconds: f64) {
        if tokens == 0 || !seconds.is_finite() {
            return;
        }
        let per_token = seconds / tokens as f64;
        self.draft_s_per_token = Some(match self.draft_s_per_token {
            Some(d) => d + DECAY * (per_token - d),
            None => per_token,
        });
    }

    /// The verifier scored a block of `block_len` drafted tokens (`block_len + 1` rows) in `seconds`. An empty block
    /// (the first one, which includes the prompt's prefill) says nothing about blocks.
    pub(crate) fn observe_verify(&mut self, block_len: usize, seconds: f64) {
        if block_len == 0 || !seconds.is_finite() {
            return;
        }
        self.verify.add((block_len + 1) as f64, seconds);
    }

    /// A block's decision: `accepted` drafted tokens passed, and the next one was rejected if `rejected`.
    pub(crate) fn observe_block(&mut self, accepted: usize, rejected: bool) {
        let keep = 1.0 - DECAY;
        self.accepted = self.accepted * keep + accepted as f64;
        self.evaluated = self.evaluated * keep + (accepted + usize::from(rejected)) as f64;
    }

    /// The session's acceptance rate per drafted token.
    fn acceptance(&self) -> f64 {
        ((self.accepted + PRIOR_RATE * PRIOR_POSITIONS) / (self.evaluated + PRIOR_POSITIONS)).clamp(0.0, 0.99)
    }

    /// The floor for the next block.
    pub(crate) fn floor(&self) -> usize {
        let (Some(d), Some((c0, c1))) = (self.draft_s_per_token, self.verify.line()) else {
            return if self.verify.w == 0.0 { self.k } else { self.k.div_ceil(2) };
        };
        let a = self.acceptance();
        let mut best = (self.k, f64::MIN);
        // Longest first, so that a tie keeps the longer block.
        for n in (1..=self.k).rev() {
            let rate = expected_rate(n, a, d, c0, c1);
            if rate > best.1 {
                best = (n, rate);
            }
        }
        best.0
    }
}

/// Expected committed tokens per second of pipelined blocks of `n` (see the module doc).
fn expected_rate(n: usize, a: f64, draft_s: f64, c0: f64, c1: f64) -> f64 {
    let rows = (n + 1) as f64;
    let verify = (c0 + c1 * rows).max(0.0);
    let tokens: f64 = (0..=n as i32).map(|i| a.powi(i)).sum();
    let kept = a.powi(n as i32 + 1);
    let step = kept * verify.max(draft_s * rows) + (1.0 - kept) * (verify + draft_s * n as f64);
    if step > 0.0 { tokens / step } else { f64::MAX }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session that saw sixteen blocks of each length in `lengths` with a verifier of `c0 + c1·rows` seconds, a
    /// draft of `d` seconds a token, and `run` tokens accepted before each rejection.
    fn measured(k: usize, lengths: &[usize], c0: f64, c1: f64, d: f64, run: usize) -> BlockFloor {
        let mut f = BlockFloor::new(k);
        for _ in 0..16 {
            for &n in lengths {
                f.observe_verify(n, c0 + c1 * (n + 1) as f64);
                f.observe_draft(n, d * n as f64);
                f.observe_block(run, true);
            }
        }
        f
    }

    #[test]
    fn a_line_needs_two_lengths_and_recovers_its_coefficients() {
        let mut fit = LineFit::default();
        fit.add(5.0, 1.0);
        fit.add(5.0, 1.0);
        assert_eq!(fit.line(), None);
        fit.add(3.0, 0.6);
        let (c0, c1) = fit.line().unwrap();
        assert!((c0 - 0.0).abs() < 1e-9 && (c1 - 0.2).abs() < 1e-9, "{c0} {c1}");
    }

    #[test]
    fn unmeasured_sessions_start_at_k_then_try_half_of_it() {
        let mut f = BlockFloor::new(4);
        assert_eq!(f.floor(), 4);
        f.observe_draft(4, 0.1);
        f.observe_verify(4, 0.12);
        assert_eq!(f.floor(), 2, "one length seen: explore a shorter block");
        f.observe_verify(2, 0.09);
        assert!((1..=4).contains(&f.floor()));
        assert_eq!(BlockFloor::new(1).floor(), 1);
        // The empty first block (with the prefill) is not a block length.
        let mut g = BlockFloor::new(4);
        g.observe_verify(0, 2.0);
        assert_eq!(g.floor(), 4);
    }

    #[test]
    fn a_steep_verifier_and_a_fallible_draft_get_shorter_blocks() {
        // One core's verifier: 50 ms + 14 ms a row; draft 23 ms a token; 75 % of drafted tokens accepted.
        let f = measured(4, &[2, 4], 0.050, 0.014, 0.023, 3);
        assert!(f.floor() < 4, "floor {}", f.floor());
    }

    #[test]
    fn a_flat_verifier_and_a_reliable_draft_keep_blocks_of_k() {
        // A verifier whose rows cost almost nothing, a fast draft that is right 95 % of the time.
        let f = measured(4, &[2, 4], 0.060, 0.001, 0.005, 19);
        assert_eq!(f.floor(), 4);
    }

    #[test]
    fn the_model_prefers_what_it_should() {
        // Everything accepted and a free draft: longer blocks only add tokens.
        assert!(expected_rate(4, 0.99, 0.0, 0.1, 0.0) > expected_rate(2, 0.99, 0.0, 0.1, 0.0));
        // Nothing accepted: every block commits about one token, so the cheapest block wins.
        assert!(expected_rate(1, 0.0, 0.02, 0.05, 0.02) > expected_rate(4, 0.0, 0.02, 0.05, 0.02));
    }
}
