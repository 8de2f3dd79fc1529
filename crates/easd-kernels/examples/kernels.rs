//! Micro-benchmark of the products on the default pair's shapes, ours against candle's
//! quantized matmul, one weight read per call.
//! `cargo run --release -p easd-kernels --example kernels [reps] [shape filter] [m]`
//! (`EASD_THREADS=n`: kernel threads, default all cores; the portable path only with `EASD_KERNELS=portable`).

use std::time::Instant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use easd_kernels::{Format, Isa, QMatrix, matmul_with};

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    let filter = std::env::args().nth(2).unwrap_or_default();
    let only_m: Option<usize> = std::env::args().nth(3).and_then(|s| s.parse().ok());
    let with_portable = std::env::var("EASD_KERNELS").is_ok_and(|v| Isa::parse(&v) == Some(Isa::Portable));
    if let Some(n) = std::env::var("EASD_THREADS").ok().and_then(|s| s.parse().ok()) {
        easd_kernels::set_threads(n).expect("kernel threads");
    }
    println!("kernel threads {}, best path {:?}", easd_kernels::threads(), Isa::best());
    let shapes = [
        ("1.5B ffn up   Q4_K", Format::Q4K, GgmlDType::Q4K, 8960, 1536),
        ("1.5B ffn down Q6_K", Format::Q6K, GgmlDType::Q6K, 1536, 8960),
        ("1.5B head     Q6_K", Format::Q6K, GgmlDType::Q6K, 151_936, 1536),
        ("0.5B ffn up   Q5_0", Format::Q5_0, GgmlDType::Q5_0, 4864, 896),
        ("0.5B head     Q8_0", Format::Q8_0, GgmlDType::Q8_0, 151_936, 896),
    ];
    for (name, format, dtype, rows, cols) in shapes.into_iter().filter(|s| s.0.contains(&filter)) {
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 2_654_435_761usize) % 1000) as f32 / 1000.0 - 0.5).collect();
        let wt = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&wt, dtype).unwrap();
        let ours = QMatrix::new(format, rows, cols, &q.data().unwrap()).unwrap();
        let qmm = QMatMul::from_qtensor(q).unwrap();
        for m in only_m.map_or(vec![1usize, 8], |m| vec![m]) {
            let x: Vec<f32> = (0..m * cols).map(|i| ((i * 7919) % 113) as f32 / 113.0 - 0.5).collect();
            let xt = Tensor::from_vec(x.clone(), (m, cols), &Device::Cpu).unwrap();
            let time = |f: &dyn Fn()| {
                f();
                let t = Instant::now();
                for _ in 0..reps {
                    f();
                }
                t.elapsed().as_secs_f64() * 1e3 / reps as f64
            };
            let mut line = format!("{name} m={m:<2}");
            for isa in Isa::ALL.into_iter().filter(|i| i.available() && (*i != Isa::Portable || with_portable)) {
                let ms = time(&|| {
                    matmul_with(isa, &[&ours], &x, m).unwrap();
                });
                line += &format!("  {}: {ms:7.3} ms", isa.name());
            }
            let ms = time(&|| {
                qmm.forward(&xt).unwrap();
            });
            line += &format!("  candle: {ms:7.3} ms");
            println!("{line}");
        }
    }
}
