//! Prints the time of one k = 8 verification block on a 151,936-token vocabulary.
//! Run: cargo run --release -p easd-core --example bench_verify [iters]

use easd_core::bench::{QWEN2_VOCAB, verify_block_k8, verify_block_timing};
use easd_core::{EasdParams, Mode, SamplingParams};

fn main() {
    let iters: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!("vocab {QWEN2_VOCAB}, k = 8, {iters} iterations, mean per block:");
    println!("  sd   T=0.7 top_p=0.95 (reference)  {:.3} ms", ms(verify_block_k8(QWEN2_VOCAB, iters)));
    let cases = [
        ("sd   T=1.0                       ", SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0 }, Mode::Sd),
        ("sd   T=0.7 top_k=50              ", SamplingParams { temperature: 0.7, top_k: 50, top_p: 1.0 }, Mode::Sd),
        ("easd greedy                      ", SamplingParams::greedy(), Mode::Easd(EasdParams::default())),
    ];
    for (name, params, mode) in cases {
        println!("  {name} {:.3} ms", ms(verify_block_timing(QWEN2_VOCAB, 8, &params, &mode, iters)));
    }
}
