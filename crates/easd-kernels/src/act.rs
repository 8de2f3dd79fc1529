//! Activation quantization: each row of the input is quantized once per product to 8-bit
//! blocks with an f32 scale, so every dot product below is an exact integer sum followed by a
//! few float operations. Plain scalar code: it is O(m·k) against the product's O(m·n·k), and
//! one implementation for every instruction set (compiled per path, see `new_with`) keeps the
//! paths bit-identical.

use crate::format::ActFormat;
use crate::isa::Isa;

/// `m` rows of `k` values, quantized for one [`ActFormat`].
#[derive(Clone, Debug)]
pub struct QuantizedActs {
    pub(crate) format: ActFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// `rows × cols` values in [-127, 127] (never -128: the kernels negate them).
    pub(crate) qs: Vec<i8>,
    /// One scale per block of `format.block_len()` values.
    pub(crate) scales: Vec<f32>,
    /// Sum of the values of each `format.sum_len()` run.
    pub(crate) sums: Vec<i32>,
    /// Q8_K only: the sums again as pairs of i16 in one u32 (low: run 2p, high: run 2p + 1), the
    /// broadcast operand of a pairwise i16 product: eight per block for the 16-value runs, four per
    /// block for the 32-value sub-blocks (|sum| ≤ 32·127 fits an i16).
    pub(crate) pairs16: Vec<u32>,
    pub(crate) pairs32: Vec<u32>,
}

/// One row's view, as the kernels take it.
#[derive(Clone, Copy)]
pub(crate) struct ActRow<'a> {
    pub qs: &'a [i8],
    pub scales: &'a [f32],
    pub sums: &'a [i32],
    pub pairs16: &'a [u32],
    pub pairs32: &'a [u32],
}

impl QuantizedActs {
    /// Quantizes `x` (`rows × cols`, row-major). `cols` must be a multiple of the format's block.
    pub fn new(format: ActFormat, x: &[f32], rows: usize, cols: usize) -> Self {
        Self::new_with(Isa::active(), format, x, rows, cols)
    }

    /// [`QuantizedActs::new`] compiled for a chosen path: the same scalar code, which the compiler
    /// vectorizes with the path's instructions (the baseline x86-64 has no SSE4.1 truncation and
    /// leaves it mostly scalar). IEEE operations in the same order, so the same bits on every path.
    pub(crate) fn new_with(isa: Isa, format: ActFormat, x: &[f32], rows: usize, cols: usize) -> Self {
        assert_eq!(x.len(), rows * cols, "activation buffer is not rows × cols");
        let block = format.block_len();
        assert!(cols.is_multiple_of(block), "{cols} columns are not whole {block}-value blocks");
        let mut qs = vec![0i8; rows * cols];
        let mut scales = vec![0f32; rows * cols / block];
        match isa {
            // SAFETY: the path's features are checked just before.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512Vnni | Isa::Amx if isa.available() => unsafe {
                quantize_blocks_avx2(x, &mut qs, &mut scales)
            },
            _ => quantize_blocks(x, &mut qs, &mut scales),
        }
        let sums: Vec<i32> = qs.chunks_exact(format.sum_len()).map(|c| c.iter().map(|&q| i32::from(q)).sum()).collect();
        let pair = |lo: i32, hi: i32| u32::from(lo as i16 as u16) | (u32::from(hi as i16 as u16) << 16);
        let (mut pairs16, mut pairs32) = (Vec::new(), Vec::new());
        if format == ActFormat::Q8K {
            pairs16 = sums.chunks_exact(2).map(|s| pair(s[0], s[1])).collect();
            pairs32 = sums.chunks_exact(4).map(|s| pair(s[0] + s[1], s[2] + s[3])).collect();
        }
        Self { format, rows, cols, qs, scales, sums, pairs16, pairs32 }
    }

    pub fn format(&self) -> ActFormat {
        self.format
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub(crate) fn row(&self, r: usize) -> ActRow<'_> {
        let (k, f) = (self.cols, self.format);
        ActRow {
            qs: &self.qs[r * k..(r + 1) * k],
            scales: &self.scales[r * k / f.block_len()..(r + 1) * k / f.block_len()],
            sums: &self.sums[r * k / f.sum_len()..(r + 1) * k / f.sum_len()],
            pairs16: self.pairs16.get(r * k / 32..(r + 1) * k / 32).unwrap_or(&[]),
            pairs32: self.pairs32.get(r * k / 64..(r + 1) * k / 64).unwrap_or(&[]),
        }
    }
}

/// [`quantize_blocks`] compiled with AVX2. Safety: the CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_blocks_avx2(x: &[f32], qs: &mut [i8], scales: &mut [f32]) {
    quantize_blocks(x, qs, scales)
}

/// Every block of `x` into `qs`, one scale per block into `scales`.
#[inline(always)]
fn quantize_blocks(x: &[f32], qs: &mut [i8], scales: &mut [f32]) {
    let block = x.len() / scales.len();
    for ((src, dst), scale) in x.chunks_exact(block).zip(qs.chunks_exact_mut(block)).zip(scales) {
        *scale = quantize_block(src, dst);
    }
}

/// Symmetric 8-bit quantization of one block; returns the scale. Non-finite inputs give 0s.
#[inline(always)]
fn quantize_block(src: &[f32], dst: &mut [i8]) -> f32 {
    let amax = abs_max(src);
    if amax == 0.0 || !amax.is_finite() {
        dst.fill(0);
        return 0.0;
    }
    let inv = 127.0 / amax;
    for (q, &v) in dst.iter_mut().zip(src) {
        *q = round_half_away(v * inv).clamp(-127, 127) as i8;
    }
    amax / 127.0
}

/// The largest |v| of `src` (NaNs ignored; 0 for none): sixteen running maxima, which the compiler
/// keeps in one vector register instead of a chain of dependent `max`es. The same value as a fold
/// in order: `max` of non-negative floats is exact, associative and commutative.
#[inline(always)]
fn abs_max(src: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let chunks = src.chunks_exact(16);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = m.max(v.abs());
        }
    }
    let folded = tail.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    lanes.iter().fold(folded, |a, &m| a.max(m))
}

/// `x.round() as i32` for |x| ≤ 2²⁴ (NaN gives 0), without the libm call `f32::round` makes on
/// the x86-64 baseline — the call was most of the quantization's time — and without the checks of
/// a saturating `as`, which kept the loop scalar. Exact: the truncation `t` is exact, and so is
/// `x − t` (a value and its truncation share a binade, or `t` is 0).
#[inline(always)]
fn round_half_away(x: f32) -> i32 {
    const LIMIT: f32 = (1 << 24) as f32;
    let x = if x.is_nan() { 0.0 } else { x.clamp(-LIMIT, LIMIT) };
    // SAFETY: `x` is finite and within i32's range.
    let t = unsafe { x.to_int_unchecked::<i32>() };
    let frac = x - t as f32;
    t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_stay_in_the_symmetric_range_and_sums_match() {
        let x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.13).collect();
        let a = QuantizedActs::new(ActFormat::Q8K, &x, 2, 256);
        assert!(a.qs.iter().all(|&q| q > -128));
        assert_eq!(a.scales.len(), 2);
        assert_eq!(a.sums.len(), 32);
        assert_eq!(a.sums[3], a.qs[48..64].iter().map(|&q| i32::from(q)).sum::<i32>());
        let row = a.row(1);
        assert_eq!(row.pairs16.len(), 8);
        assert_eq!(row.pairs16[1] as u16 as i16 as i32, a.sums[16 + 2]);
        assert_eq!(
            (row.pairs32[1] >> 16) as u16 as i16 as i32,
            a.qs[256 + 96..256 + 128].iter().map(|&q| i32::from(q)).sum::<i32>()
        );
        for (i, &v) in x.iter().enumerate().take(256) {
            assert!((f32::from(a.qs[i]) * a.scales[0] - v).abs() <= a.scales[0] * 0.5 + 1e-6);
        }
    }

    #[test]
    fn rounding_matches_f32_round() {
        let halves = (-260..=260).map(|i| i as f32 * 0.5);
        let near = (-260..=260).flat_map(|i| {
            let h = i as f32 * 0.5;
            [f32::from_bits(h.to_bits().wrapping_sub(1)), f32::from_bits(h.to_bits() + 1)]
        });
        let spread = (0..20_000).map(|i| ((i * 7919) % 30_011) as f32 / 117.0 - 128.0);
        for x in halves.chain(near).chain(spread).chain([0.0, -0.0, 1e-30, -1e-30, 0.49999997, -0.49999997]) {
            assert_eq!(round_half_away(x), x.round() as i32, "{x:e}");
        }
        assert_eq!(round_half_away(f32::NAN), 0);
    }

    #[test]
    fn every_path_quantizes_to_the_same_bits() {
        let x: Vec<f32> = (0..4 * 512).map(|i| ((i * 7919) % 2003) as f32 / 97.0 - 10.0).collect();
        let portable = QuantizedActs::new_with(Isa::Portable, ActFormat::Q8K, &x, 4, 512);
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            let got = QuantizedActs::new_with(isa, ActFormat::Q8K, &x, 4, 512);
            assert_eq!(got.qs, portable.qs, "{isa:?}");
            assert!(got.scales.iter().zip(&portable.scales).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?}");
        }
    }

    #[test]
    fn blocks_quantize_as_the_plain_formulation_does() {
        // A fold in order for the maximum and `f32::round`: what `quantize_block` computes faster.
        fn plain(src: &[f32], dst: &mut [i8]) -> f32 {
            let amax = src.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
            if amax == 0.0 || !amax.is_finite() {
                dst.fill(0);
                return 0.0;
            }
            for (q, &v) in dst.iter_mut().zip(src) {
                *q = ((v * (127.0 / amax)).round() as i32).clamp(-127, 127) as i8;
            }
            amax / 127.0
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [32, 256, 31, 17, 7] {
            for case in 0..200 {
                let mut src: Vec<f32> = (0..len).map(|_| (next() % 20_001) as f32 / 100.0 - 100.0).collect();
                match case % 4 {
                    1 => src[(next() % len as u64) as usize] = f32::NAN,
                    2 => src.iter_mut().for_each(|v| *v *= 1e-30),
                    3 => src[0] = -src.iter().fold(0.0f32, |a, &v| a.max(v.abs())) * 1.5,
                    _ => {}
                }
                let (mut got, mut want) = (vec![0i8; len], vec![0i8; len]);
                let (s_got, s_want) = (quantize_block(&src, &mut got), plain(&src, &mut want));
                assert_eq!(s_got.to_bits(), s_want.to_bits(), "scale, len {len} case {case}");
                assert_eq!(got, want, "values, len {len} case {case}");
            }
        }
    }

    #[test]
    fn zero_and_non_finite_blocks_quantize_to_zero() {
        let mut x = vec![0.0f32; 64];
        x[40] = f32::INFINITY;
        let a = QuantizedActs::new(ActFormat::Q8x32, &x, 1, 64);
        assert_eq!(a.scales, vec![0.0, 0.0]);
        assert!(a.qs.iter().all(|&q| q == 0));
    }
}
