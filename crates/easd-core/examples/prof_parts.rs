use easd_core::bench::synthetic_logits;
use std::hint::black_box;
use std::time::Instant;
fn main() {
    let l = synthetic_logits(151_936, 1);
    let n = 300;
    let t = Instant::now();
    for _ in 0..n {
        black_box(easd_core::top_n(black_box(&l), 2));
    }
    println!("top2 {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n {
        black_box(easd_core::top_n(black_box(&l), 64));
    }
    println!("top64 {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n {
        black_box(easd_core::entropy(black_box(&l), 1.0));
    }
    println!("entropy {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n {
        black_box(black_box(&l).iter().map(|&x| x.exp()).sum::<f32>());
    }
    println!("std exp sum {:?}", t.elapsed() / n);
}
