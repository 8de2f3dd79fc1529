//! Times one decode step's attention (one query row, every layer) at a few context lengths, the default target's
//! shape (12 query heads sharing 2 kv heads, head_dim 128, 28 layers).
//!
//! `cargo run --release -p easd-kernels --example attention [reps]`

use std::time::Instant;

use easd_kernels::{AttentionShape, attention};

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    let (n_heads, n_kv_heads, hd, layers) = (12, 2, 128, 28);
    for keys in [256, 1024, 4096] {
        let cap = keys;
        let fill = |n: usize, salt: usize| -> Vec<f32> {
            (0..n).map(|i| (((i + salt) * 2_654_435_761usize) % 1000) as f32 / 1000.0 - 0.5).collect()
        };
        let q = fill(n_heads * hd, 1);
        let caches: Vec<(Vec<f32>, Vec<f32>)> =
            (0..layers).map(|l| (fill(n_kv_heads * cap * hd, 2 + l), fill(n_kv_heads * cap * hd, 99 + l))).collect();
        let shape = AttentionShape { n_heads, n_kv_heads, head_dim: hd, seq: 1, start: keys - 1, kv_capacity: cap };
        let mut times = Vec::new();
        for _ in 0..reps {
            let started = Instant::now();
            for (k, v) in &caches {
                std::hint::black_box(attention(shape, &q, k, v, 0.088));
            }
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{keys:5} keys: median {:.2} ms, fastest {:.2} ms per token ({layers} layers)",
            times[reps / 2],
            times[0]
        );
    }
}
