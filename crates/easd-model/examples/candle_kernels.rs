//! Micro-benchmark of candle's CPU quantized matmul kernels at the shapes of the default pair,
//! to choose load-time re-quantization targets: `cargo run --release -p easd-model --example candle_kernels`.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use std::time::Instant;

fn bench(dtype: GgmlDType, n: usize, k: usize, m: usize) -> candle_core::Result<f64> {
    let w = Tensor::randn(0f32, 0.02, (n, k), &Device::Cpu)?;
    let q = QMatMul::from_qtensor(QTensor::quantize(&w, dtype)?)?;
    let x = Tensor::randn(0f32, 1.0, (1, m, k), &Device::Cpu)?;
    for _ in 0..3 {
        q.forward(&x)?;
    }
    let reps = 20;
    let t = Instant::now();
    for _ in 0..reps {
        q.forward(&x)?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / reps as f64)
}

fn main() -> candle_core::Result<()> {
    for (n, k) in [(4864, 896), (4864, 1024), (896, 4864), (8960, 1536)] {
        for m in [1, 8] {
            for dtype in [GgmlDType::Q8_0, GgmlDType::Q5_0, GgmlDType::Q4_0, GgmlDType::Q4K, GgmlDType::Q6K] {
                if k % dtype.block_size() != 0 {
                    continue;
                }
                let ms = bench(dtype, n, k, m)?;
                let gw = (n * k) as f64 / ms / 1e6;
                println!("n={n:5} k={k:5} m={m:2} {dtype:?}: {ms:7.3} ms ({gw:.2} Gweights/s)");
            }
        }
    }
    Ok(())
}
