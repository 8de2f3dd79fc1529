//! EASD algorithm core: everything that decides which tokens are emitted, as pure functions
//! on plain slices (no I/O, no model, no network, no async).
//!
//! # Who computes what (DESIGN §3.1)
//! * **Draft** — from its logits at each proposed position, [`propose`] samples the token from
//!   q (the request transform truncated to the top K_q, renormalised) and returns what goes
//!   on the wire: the token, q as ≤ K_q (id, prob) pairs, H(q̂) and TopN(q̂).
//! * **Verifier** — from the target's logits at each block position (and the one after it),
//!   [`score_position`] returns p_j(x_j), H(p̂_j), TopN(p̂_j) and pre-drawn samples: the
//!   residual, the EASD resample and the bonus. It draws but never decides.
//! * **Coordinator** — [`verify_block`] decides from those summaries alone (DESIGN §2.1–2.2):
//!   accepted prefix, then one residual / EASD / bonus token.
//!
//! # Invariants
//! * `sd` is lossless for any proposal q, provided the residual uses the same q the draft
//!   sampled from; the draft therefore sends its truncated q exactly, and the verifier builds
//!   the residual from that sparse q (tests/lossless.rs checks the emitted law against p).
//! * Every uniform is [`uniform`]`(seed, absolute position, purpose)`: same seed, same logits
//!   → same outcome, whichever replica computes it and however often it is retried. Reusing a
//!   position's draft uniform after a rejection is sound: the token rejected at j depends only
//!   on positions ≤ j, so the uniforms of later positions are still fresh.
//! * Distributions never give mass to a -inf logit; a sampler never returns a zero-weight id;
//!   ties are broken by lower token id everywhere.
//! * Functions never panic on bad input; [`validate_logits`], [`SamplingParams::validate`],
//!   [`EasdParams::validate`], [`validate_block_size`] and [`check_block`] reject it at the
//!   edge with a message naming the field.
//!
//! # Cost (151,936-token vocabulary)
//! Each position costs one fused pass over its logits (`scan`: online max, top candidates,
//! softmax sums with a vectorised minimax exp, per-block sums); samplers walk the best
//! candidates first and reach the tail through the block sums, scanning one 128-logit block.
//! A temperature other than 1 adds a second, cheaper exp per logit for the raw log-softmax.
//! A top-p nucleus larger than the first selection (a flat tail at a hot temperature) is
//! found by a histogram cutoff and then sorted: that case costs milliseconds per position.
//! `examples/bench_verify.rs` prints the figures; [`mod@bench`] exposes them to the CLI.

mod calibrate;
mod dist;
mod draft;
mod fastmath;
mod params;
mod rng;
mod scan;
mod select;
mod target;
mod verify;

pub mod bench;

pub use calibrate::{EntropySamples, percentile_sorted};
pub use dist::{SparseDist, argmax, entropy, overlap, top_n, transformed};
pub use draft::{DEFAULT_K_Q, DraftToken, propose};
pub use params::{
    EasdParams, MAX_BLOCK_SIZE, MAX_EASD_TOP_N, Mode, Order, ParamError, Penalty, SamplingParams, validate_block_size,
    validate_logits,
};
pub use rng::{Purpose, uniform};
pub use target::{MAX_LOGPROBS, TargetOptions, TargetPosition, score_position};
pub use verify::{BlockOutcome, Rejection, check_block, easd_fires, easd_rule, verify_block};
