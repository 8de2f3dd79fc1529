//! Timing of one verification block on synthetic vocabulary-sized logits, for the
//! `easd bench verify` command and `examples/bench_verify.rs`. Reports figures, asserts none.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::draft::{DEFAULT_K_Q, propose};
use crate::params::{Mode, SamplingParams};
use crate::rng::{Purpose, uniform};
use crate::target::{TargetOptions, score_position};
use crate::verify::verify_block;

/// Vocabulary size of the default model pair.
pub const QWEN2_VOCAB: usize = 151_936;

/// LLM-shaped synthetic logits: a Gaussian bulk (sd 2) plus a few peaked candidates, so the
/// distribution has most of its mass on a handful of tokens and a long tail.
pub fn synthetic_logits(vocab: usize, seed: u64) -> Vec<f32> {
    let mut logits: Vec<f32> = (0..vocab as u64)
        .map(|i| {
            // Box–Muller from two keyed uniforms.
            let u1 = uniform(seed, 2 * i, Purpose::BonusSample).max(1e-12);
            let u2 = uniform(seed, 2 * i + 1, Purpose::BonusSample);
            (2.0 * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect();
    for j in 0..8u64 {
        let id = (uniform(seed, j, Purpose::DraftSample) * vocab as f64) as usize;
        logits[id] = 16.0 - 1.5 * j as f32;
    }
    logits
}

/// Wall-time figures of one block over the iterations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockTiming {
    pub min: Duration,
    pub median: Duration,
    pub mean: Duration,
}

/// Times one k-token block: score_position at k + 1 positions (softmax sums, entropy,
/// top-N, the transform, residual / EASD / bonus samples) plus verify_block. Drafts are
/// proposed once, outside the timed region (that work belongs to the draft service).
pub fn verify_block_stats(vocab: usize, k: usize, params: &SamplingParams, mode: &Mode, iters: usize) -> BlockTiming {
    let zero = BlockTiming { min: Duration::ZERO, median: Duration::ZERO, mean: Duration::ZERO };
    if iters == 0 || vocab == 0 {
        return zero;
    }
    let target_logits: Vec<Vec<f32>> = (0..=k as u64).map(|j| synthetic_logits(vocab, 100 + j)).collect();
    let draft: Vec<_> = target_logits[..k]
        .iter()
        .enumerate()
        .map(|(j, t)| {
            let noise = synthetic_logits(vocab, 900 + j as u64);
            let d: Vec<f32> = t.iter().zip(&noise).map(|(a, b)| a + 0.3 * b).collect();
            propose(&d, params, DEFAULT_K_Q, 5, 7, j as u64)
        })
        .collect();
    let opts = TargetOptions::default();
    let mut times: Vec<Duration> = (0..iters as u64)
        .map(|it| {
            let start = Instant::now();
            let seed = black_box(7 + it);
            let target: Vec<_> = target_logits
                .iter()
                .enumerate()
                .map(|(j, l)| {
                    let drafted = draft.get(j).map(|d| (d.token, &d.proposal));
                    score_position(l, params, &opts, drafted, seed, j as u64)
                })
                .collect();
            black_box(verify_block(mode, params.is_greedy(), seed, 0, &draft, &target));
            start.elapsed()
        })
        .collect();
    let mean = times.iter().sum::<Duration>() / iters as u32;
    times.sort_unstable();
    BlockTiming { min: times[0], median: times[iters / 2], mean }
}

/// Median wall time of one k-token block (see [`verify_block_stats`]); the median resists
/// other processes on a shared machine better than the mean.
pub fn verify_block_timing(vocab: usize, k: usize, params: &SamplingParams, mode: &Mode, iters: usize) -> Duration {
    verify_block_stats(vocab, k, params, mode, iters).median
}

/// The reference figure: k = 8, temperature 0.7, top-p 0.95, mode sd, `vocab` tokens.
pub fn verify_block_k8(vocab: usize, iters: usize) -> Duration {
    let params = SamplingParams { temperature: 0.7, top_k: 0, top_p: 0.95 };
    verify_block_timing(vocab, 8, &params, &Mode::Sd, iters)
}
