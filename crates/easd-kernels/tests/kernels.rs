//! Every kernel against candle's dequantized f32 product and candle's own quantized product, on
//! random blocks of every format; every instruction-set path against the portable one bit for
//! bit; and each row of an m-row product against the same row computed alone (batch invariance).

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use easd_kernels::{Format, Isa, QMatrix, matmul_with};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ROWS_TO_CHECK: [usize; 8] = [1, 2, 3, 4, 7, 8, 16, 64];

fn ggml(format: Format) -> GgmlDType {
    match format {
        Format::Q4K => GgmlDType::Q4K,
        Format::Q6K => GgmlDType::Q6K,
        Format::Q8_0 => GgmlDType::Q8_0,
        Format::Q5_0 => GgmlDType::Q5_0,
    }
}

fn normal(rng: &mut StdRng, n: usize, std: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-7), rng.random());
            std * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect()
}

struct Case {
    ours: QMatrix,
    candle: std::sync::Arc<QTensor>,
    dense: Vec<f32>, // dequantized weights, rows × cols
    rows: usize,
    cols: usize,
}

fn case(format: Format, rows: usize, cols: usize, seed: u64) -> Case {
    let mut rng = StdRng::seed_from_u64(seed);
    let w = Tensor::from_vec(normal(&mut rng, rows * cols, 0.05), (rows, cols), &Device::Cpu).unwrap();
    let candle = QTensor::quantize(&w, ggml(format)).unwrap();
    let ours = QMatrix::new(format, rows, cols, &candle.data().unwrap()).unwrap();
    let dense = candle.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    Case { ours, candle: std::sync::Arc::new(candle), dense, rows, cols }
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

#[test]
fn dequantized_rows_equal_candles_dequantization() {
    for format in Format::ALL {
        let c = case(format, 16, 512, 1);
        let mut row = vec![0f32; c.cols];
        for r in 0..c.rows {
            c.ours.dequantize_row(r, &mut row).unwrap();
            assert_eq!(row, c.dense[r * c.cols..(r + 1) * c.cols], "{format:?} row {r}");
        }
    }
}

#[test]
fn products_agree_with_candles_dequantized_and_quantized_products() {
    let isa = Isa::best();
    for (i, format) in Format::ALL.into_iter().enumerate() {
        // 1280 columns: five K-quant super-blocks; 1344 for the 32-block formats: five groups of
        // eight blocks and a tail of two (candle's Q5_0 wants an even block count).
        let cols = if format.block_len() == 256 { 1280 } else { 1344 };
        let c = case(format, 48, cols, 10 + i as u64);
        let qmm = QMatMul::from_arc(c.candle.clone()).unwrap();
        for m in ROWS_TO_CHECK {
            let x = normal(&mut StdRng::seed_from_u64(100 + m as u64), m * c.cols, 1.0);
            let ours = matmul_with(isa, &[&c.ours], &x, m).unwrap().remove(0);
            let xt = Tensor::from_vec(x.clone(), (m, c.cols), &Device::Cpu).unwrap();
            let theirs = qmm.forward(&xt).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for r in 0..m {
                let xr = &x[r * c.cols..(r + 1) * c.cols];
                for n in 0..c.rows {
                    let wr = &c.dense[n * c.cols..(n + 1) * c.cols];
                    let exact: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
                    // Tolerance: 8-bit activations err by ≤ half a step per value; in practice
                    // the error is ~1e-3 of ‖x‖·‖w‖. Stated bound: 1%.
                    let tol = 0.01 * norm(xr) * norm(wr);
                    let got = ours[r * c.rows + n];
                    assert!(
                        (got - exact).abs() <= tol,
                        "{format:?} m {m} ({r},{n}): {got} vs exact {exact} (tol {tol})"
                    );
                    let candle = theirs[r * c.rows + n];
                    assert!((got - candle).abs() <= tol, "{format:?} m {m} ({r},{n}): {got} vs candle {candle}");
                }
            }
        }
    }
}

#[test]
fn every_instruction_set_path_gives_the_portable_bits() {
    for (i, format) in Format::ALL.into_iter().enumerate() {
        let cols = if format.block_len() == 256 { 768 } else { 896 };
        let c = case(format, 24, cols, 30 + i as u64);
        // 16 and 35: whole AMX tiles of rows, and tiles plus rows left to the VNNI kernels.
        for m in [1, 3, 5, 8, 16, 35] {
            let x = normal(&mut StdRng::seed_from_u64(200 + m as u64), m * cols, 2.0);
            let portable = matmul_with(Isa::Portable, &[&c.ours], &x, m).unwrap();
            for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                let got = matmul_with(isa, &[&c.ours], &x, m).unwrap();
                let same = got[0].iter().zip(&portable[0]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{format:?} {isa:?} m {m} differs from the portable path");
            }
        }
    }
}

#[test]
fn a_row_computed_in_a_batch_equals_it_computed_alone() {
    for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
        for (i, format) in Format::ALL.into_iter().enumerate() {
            let cols = if format.block_len() == 256 { 512 } else { 544 };
            let c = case(format, 40, cols, 50 + i as u64);
            let m = 19;
            let x = normal(&mut StdRng::seed_from_u64(300), m * cols, 1.0);
            let batch = matmul_with(isa, &[&c.ours], &x, m).unwrap().remove(0);
            for r in 0..m {
                let alone = matmul_with(isa, &[&c.ours], &x[r * cols..(r + 1) * cols], 1).unwrap().remove(0);
                let same =
                    alone.iter().zip(&batch[r * c.rows..(r + 1) * c.rows]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{isa:?} {format:?}: row {r} of {m} differs from the row alone");
            }
        }
    }
}

#[test]
fn weights_sharing_an_input_equal_separate_products() {
    let a = case(Format::Q4K, 32, 512, 70);
    let b = case(Format::Q6K, 16, 512, 71);
    let c = case(Format::Q8_0, 8, 512, 72);
    let x = normal(&mut StdRng::seed_from_u64(400), 3 * 512, 1.0);
    let isa = Isa::best();
    let fused = matmul_with(isa, &[&a.ours, &b.ours, &c.ours], &x, 3).unwrap();
    for (i, w) in [&a.ours, &b.ours, &c.ours].into_iter().enumerate() {
        assert_eq!(fused[i], matmul_with(isa, &[w], &x, 3).unwrap()[0]);
    }
}

#[test]
fn bad_shapes_are_errors() {
    use easd_kernels::KernelError;
    assert!(matches!(QMatrix::new(Format::Q4K, 2, 100, &[]), Err(KernelError::Columns { .. })));
    assert!(matches!(QMatrix::new(Format::Q8_0, 2, 64, &[0; 10]), Err(KernelError::DataLength { .. })));
    let c = case(Format::Q8_0, 4, 64, 80);
    let d = case(Format::Q8_0, 4, 96, 81);
    assert!(matches!(matmul_with(Isa::Portable, &[&c.ours], &[0.0; 63], 1), Err(KernelError::InputLength { .. })));
    assert!(matches!(matmul_with(Isa::Portable, &[&c.ours, &d.ours], &[0.0; 64], 1), Err(KernelError::Shape { .. })));
    let mut row = vec![0f32; 64];
    assert!(matches!(c.ours.dequantize_row(4, &mut row), Err(KernelError::RowOutOfRange { .. })));
}

#[test]
fn random_blocks_with_extreme_values_keep_the_paths_identical() {
    // Raw random bytes are valid blocks of every format (any bit pattern decodes; f16 scales
    // are forced finite), including Q8_0 weights of −128 that the sign trick must survive.
    let mut rng = StdRng::seed_from_u64(90);
    for format in Format::ALL {
        let (rows, cols) = (6, 512);
        let mut data: Vec<u8> = (0..rows * format.row_bytes(cols).unwrap()).map(|_| rng.random()).collect();
        let bb = format.block_bytes();
        let scale_at: &[usize] = match format {
            Format::Q4K => &[0, 2],
            Format::Q6K => &[208],
            _ => &[0],
        };
        for blk in data.chunks_exact_mut(bb) {
            for &at in scale_at {
                let h = half_bits(rng.random_range(-0.01f32..0.01));
                blk[at..at + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = normal(&mut rng, 16 * cols, 10.0);
        let portable = matmul_with(Isa::Portable, &[&w], &x, 16).unwrap();
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            for m in [2, 16] {
                let got = matmul_with(isa, &[&w], &x[..m * cols], m).unwrap();
                let same = got[0].iter().zip(&portable[0]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{format:?} {isa:?} m={m}");
            }
        }
        // And against the dense product of the dequantized rows.
        let mut wr = vec![0f32; cols];
        for (n, &got) in portable[0].iter().enumerate().take(rows) {
            w.dequantize_row(n, &mut wr).unwrap();
            let exact: f32 = x[..cols].iter().zip(&wr).map(|(a, b)| a * b).sum();
            let tol = 0.01 * norm(&x[..cols]) * norm(&wr);
            assert!((got - exact).abs() <= tol, "{format:?} row {n}: {got} vs {exact}");
        }
    }
}

#[test]
fn saturated_blocks_keep_the_paths_identical() {
    // Every weight at its largest magnitude (all bits set; Q8_0 at −128, Q6_K's scales at −128)
    // against activations that all quantize to ±127: the largest partial sums any kernel holds,
    // which the AVX2 path keeps in 16-bit halves for a few products at a time.
    for format in Format::ALL {
        let (rows, cols) = (20, 512);
        let fill = if format == Format::Q8_0 { 0x80 } else { 0xFF };
        let mut data = vec![fill; rows * format.row_bytes(cols).unwrap()];
        let (scales_at, i8_scales): (&[usize], Option<std::ops::Range<usize>>) = match format {
            Format::Q4K => (&[0, 2], None),
            Format::Q6K => (&[208], Some(192..208)),
            _ => (&[0], None),
        };
        for blk in data.chunks_exact_mut(format.block_bytes()) {
            if let Some(i8_scales) = i8_scales.clone() {
                blk[i8_scales].fill(0x80);
            }
            for &at in scales_at {
                blk[at..at + 2].copy_from_slice(&half_bits(0.001).to_le_bytes());
            }
        }
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        for m in [1, 2, 3, 8, 16] {
            let x: Vec<f32> = (0..m * cols).map(|i| if (i / cols) % 2 == 0 { 1.0 } else { -1.0 }).collect();
            let portable = matmul_with(Isa::Portable, &[&w], &x, m).unwrap();
            for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                let got = matmul_with(isa, &[&w], &x, m).unwrap();
                let same = got[0].iter().zip(&portable[0]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{format:?} {isa:?} m={m}");
            }
        }
    }
}

fn half_bits(v: f32) -> u16 {
    // f32 → f16 (round toward zero; the value only needs to be some finite scale).
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        return sign;
    }
    sign | ((exp as u16) << 10) | ((b >> 13) & 0x3ff) as u16
}
