//! Prints the time of one k = 8 verification block on a 151,936-token vocabulary.
//! Run: cargo run --release -p easd-core --example bench_verify [iters]

use easd_core::bench::{QWEN2_VOCAB, verify_block_stats};
use easd_core::{EasdParams, Mode, SamplingParams};

fn main() {
    let iters: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!("vocab {QWEN2_VOCAB}, k = 8, {iters} iterations; per block: median / min / mean ms");
    let sampled = |temperature, top_k, top_p| SamplingParams { temperature, top_k, top_p };
    let cases = [
        ("sd   T=0.7 top_p=0.95 (reference)", sampled(0.7, 0, 0.95), Mode::Sd),
        ("sd   T=1.0                       ", sampled(1.0, 0, 1.0), Mode::Sd),
        ("sd   T=0.7 top_k=50              ", sampled(0.7, 50, 1.0), Mode::Sd),
        ("easd T=1.0                       ", sampled(1.0, 0, 1.0), Mode::Easd(EasdParams::default())),
        ("easd greedy                      ", SamplingParams::greedy(), Mode::Easd(EasdParams::default())),
    ];
    for (name, params, mode) in cases {
        let t = verify_block_stats(QWEN2_VOCAB, 8, &params, &mode, iters);
        println!("  {name}  {:.3} / {:.3} / {:.3}", ms(t.median), ms(t.min), ms(t.mean));
    }
}
