//! x86-64 kernels: AVX2 (+F16C), and AVX-512 VNNI where the CPU has it.
//!
//! Each kernel computes the exact integer block sums with SIMD and then performs the float
//! operations of the portable path (`scalar.rs`) in the same order, so its results are
//! bit-identical to it; the tests check that.
//!
//! Every format is held in tiles of sixteen interleaved weight rows (`format.rs`): one SIMD lane per
//! weight row, each activation quad broadcast to all sixteen (`vpdpbusd` with an embedded
//! broadcast on AVX-512), no horizontal sums; up to eight activation rows share each unpacked
//! weight line. Written once against `Lanes` (one `zmm`, or two `ymm` on AVX2).
//!
//! The arithmetic per activation row does not depend on how many rows share the call. Learned
//! from ggml-cpu's `ggml_vec_dot_*_q8_*` (the sign trick for signed bytes) and its repacked `q4_K`
//! GEMV (interleaved rows), written anew around the canonical accumulation.

use core::arch::x86_64::*;

#[cfg(target_os = "linux")]
pub(crate) mod amx;

use crate::act::ActRow;
use crate::format::{
    ActFormat, Format, Q4K_LINES, Q4K_MINS, Q4K_SCALES, Q4K_TILE_BYTES, Q5_0_HIGH, Q6K_HIGH, Q6K_LOW, Q6K_SCALES,
    Q32_LINES, TILE,
};
use crate::scalar::LANES;

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: callers pass pointers with 32 readable bytes.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// Sixteen i32 lanes, one per weight row of a tile (see `format.rs`), and sixteen f32 lanes for
/// the float steps: one `zmm`, or two `ymm` on AVX2. The tile kernels below are written once
/// against this and instantiated for both.
trait Lanes: Copy {
    type F: Copy;
    /// What `dot4_i8` adds to each weight of a Q8_0 line (see there).
    const I8_OFFSET: i32;
    unsafe fn zero() -> Self;
    unsafe fn splat32(v: i32) -> Self;
    /// 64 bytes.
    unsafe fn load(p: *const u8) -> Self;
    unsafe fn splat8(v: i8) -> Self;
    unsafe fn and(self, o: Self) -> Self;
    unsafe fn or(self, o: Self) -> Self;
    unsafe fn shl16_4(self) -> Self;
    unsafe fn shl16_2(self) -> Self;
    unsafe fn shr16_1(self) -> Self;
    unsafe fn shr16_2(self) -> Self;
    unsafe fn shr16_4(self) -> Self;
    /// A Q8_0 line as held (each weight q as u8 q + 128) made the weight operand of `dot4_i8`.
    unsafe fn i8_operand(self) -> Self;
    /// `self + Σ` of each lane's four (q + `I8_OFFSET`) of `w` (from `i8_operand`) times the four
    /// i8 of `a` (exact): AVX-512 keeps the offset and multiplies unsigned, AVX2 (whose pairwise
    /// sums would saturate on 255 · 127) moves q's sign onto `a` and uses no offset.
    unsafe fn dot4_i8(self, w: Self, a: i32) -> Self;
    /// `self + Σ` of each lane's two i16 of `w` times the two i16 of `a` (exact).
    unsafe fn dot2(self, w: Self, a: i32) -> Self;
    /// Whether a run of `dot4`s (`run_dot4`) is held in i16 halves, so that each call site must
    /// bound its run's sum by `i16::MAX` (AVX2) rather than only by `i32::MAX` (AVX-512).
    const NARROW_RUNS: bool;
    /// A `dot4`: `self + Σ` of each lane's four u8 of `w` times the four i8 of `a`, exact within
    /// the run's bound (see `NARROW_RUNS`), summed until one `run_times` / `run_sum`. AVX2 keeps
    /// `maddubs`'s pairwise sums in i16 halves; AVX-512 accumulates i32 (`vpdpbusd`). Starts from
    /// `zero()`.
    unsafe fn run_dot4(self, w: Self, a: i32) -> Self;
    /// Two runs as one (the call site's bound covers both).
    unsafe fn run_add(self, o: Self) -> Self;
    /// A run's sum as i32 lanes.
    unsafe fn run_sum(self) -> Self;
    /// A run's sum times each lane's scale, `s` from `run_scales` (exact), as i32 lanes.
    unsafe fn run_times(self, s: Self) -> Self;
    /// Each lane's low / high i16 of `sc` in the form `run_times` takes.
    unsafe fn run_scales(sc: Self) -> [Self; 2];
    unsafe fn mul(self, o: Self) -> Self;
    unsafe fn add(self, o: Self) -> Self;
    unsafe fn sub(self, o: Self) -> Self;
    unsafe fn times32(self) -> Self;
    /// 32 bytes as 32 i16, zero- or sign-extended: lane o holds bytes 2o, 2o + 1.
    unsafe fn widen_u8(p: *const u8) -> Self;
    unsafe fn widen_i8(p: *const u8) -> Self;
    /// Each lane's low / high i16, sign-extended.
    unsafe fn low_i16(self) -> Self;
    unsafe fn high_i16(self) -> Self;
    unsafe fn to_f(self) -> Self::F;
    unsafe fn fzero() -> Self::F;
    /// 16 f16 (32 bytes) as f32 (exact).
    unsafe fn f16s(p: *const u8) -> Self::F;
    unsafe fn fsplat(v: f32) -> Self::F;
    unsafe fn fmul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn fadd(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn fsub(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn fstore(a: Self::F, out: &mut [f32; TILE]);
}

#[derive(Clone, Copy)]
struct Zmm(__m512i);

// SAFETY (every method): register intrinsics, or reads of the documented width at `p`, which the
// callers guarantee; AVX-512 F/BW/VNNI and F16C are the callers' features.
impl Lanes for Zmm {
    type F = __m512;
    const I8_OFFSET: i32 = 128;
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_setzero_si512()) }
    }
    #[inline(always)]
    unsafe fn splat32(v: i32) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_set1_epi32(v)) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_loadu_si512(p as *const __m512i)) }
    }
    #[inline(always)]
    unsafe fn splat8(v: i8) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_set1_epi8(v)) }
    }
    #[inline(always)]
    unsafe fn and(self, o: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_and_si512(self.0, o.0)) }
    }
    #[inline(always)]
    unsafe fn or(self, o: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_or_si512(self.0, o.0)) }
    }
    #[inline(always)]
    unsafe fn shl16_4(self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_slli_epi16::<4>(self.0)) }
    }
    #[inline(always)]
    unsafe fn shl16_2(self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_slli_epi16::<2>(self.0)) }
    }
    #[inline(always)]
    unsafe fn shr16_1(self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_srli_epi16::<1>(self.0)) }
    }
    #[inline(always)]
    unsafe fn shr16_2(self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_srli_epi16::<2>(self.0)) }
    }
    #[inline(always)]
    unsafe fn shr16_4(self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_srli_epi16::<4>(self.0)) }
    }
    #[inline(always)]
    unsafe fn i8_operand(self) -> Self {
        self
    }
    #[inline(always)]
    unsafe fn dot4_i8(self, w: Self, a: i32) -> Self {
        // SAFETY: see the impl.
        unsafe { self.run_dot4(w, a) }
    }
    #[inline(always)]
    unsafe fn dot2(self, w: Self, a: i32) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_dpwssd_epi32(self.0, w.0, _mm512_set1_epi32(a))) }
    }
    const NARROW_RUNS: bool = false;
    #[inline(always)]
    unsafe fn run_dot4(self, w: Self, a: i32) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_dpbusd_epi32(self.0, w.0, _mm512_set1_epi32(a))) }
    }
    #[inline(always)]
    unsafe fn run_add(self, o: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.add(o) }
    }
    #[inline(always)]
    unsafe fn run_sum(self) -> Self {
        self
    }
    #[inline(always)]
    unsafe fn run_times(self, s: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.mul(s) }
    }
    #[inline(always)]
    unsafe fn run_scales(sc: Self) -> [Self; 2] {
        // SAFETY: see the impl.
        unsafe { [sc.low_i16(), sc.high_i16()] }
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_mullo_epi32(self.0, o.0)) }
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_add_epi32(self.0, o.0)) }
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_sub_epi32(self.0, o.0)) }
    }
    #[inline(always)]
    unsafe fn times32(self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_slli_epi32::<5>(self.0)) }
    }
    #[inline(always)]
    unsafe fn widen_u8(p: *const u8) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_cvtepu8_epi16(_mm256_loadu_si256(p as *const __m256i))) }
    }
    #[inline(always)]
    unsafe fn widen_i8(p: *const u8) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_cvtepi8_epi16(_mm256_loadu_si256(p as *const __m256i))) }
    }
    #[inline(always)]
    unsafe fn low_i16(self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(self.0))) }
    }
    #[inline(always)]
    unsafe fn high_i16(self) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_srai_epi32::<16>(self.0)) }
    }
    #[inline(always)]
    unsafe fn to_f(self) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtepi32_ps(self.0) }
    }
    #[inline(always)]
    unsafe fn fzero() -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn fsplat(v: f32) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn fmul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fadd(a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fsub(a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fstore(a: __m512, out: &mut [f32; TILE]) {
        // SAFETY: see the impl.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), a) }
    }
}

#[derive(Clone, Copy)]
struct Ymm2([__m256i; 2]);

impl Ymm2 {
    #[inline(always)]
    fn map(self, f: impl Fn(__m256i) -> __m256i) -> Self {
        Ymm2([f(self.0[0]), f(self.0[1])])
    }
    #[inline(always)]
    fn zip(self, o: Self, f: impl Fn(__m256i, __m256i) -> __m256i) -> Self {
        Ymm2([f(self.0[0], o.0[0]), f(self.0[1], o.0[1])])
    }
}

#[inline(always)]
fn fzip(a: [__m256; 2], b: [__m256; 2], f: impl Fn(__m256, __m256) -> __m256) -> [__m256; 2] {
    [f(a[0], b[0]), f(a[1], b[1])]
}

// SAFETY (every method): as for `Zmm`, with AVX2 and F16C.
impl Lanes for Ymm2 {
    type F = [__m256; 2];
    const I8_OFFSET: i32 = 0;
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: see the impl.
        unsafe { Ymm2([_mm256_setzero_si256(); 2]) }
    }
    #[inline(always)]
    unsafe fn splat32(v: i32) -> Self {
        // SAFETY: see the impl.
        unsafe { Ymm2([_mm256_set1_epi32(v); 2]) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the impl.
        unsafe { Ymm2([load(p), load(p.add(32))]) }
    }
    #[inline(always)]
    unsafe fn splat8(v: i8) -> Self {
        // SAFETY: see the impl.
        unsafe { Ymm2([_mm256_set1_epi8(v); 2]) }
    }
    #[inline(always)]
    unsafe fn and(self, o: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.zip(o, |a, b| _mm256_and_si256(a, b)) }
    }
    #[inline(always)]
    unsafe fn or(self, o: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.zip(o, |a, b| _mm256_or_si256(a, b)) }
    }
    #[inline(always)]
    unsafe fn shl16_4(self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.map(|a| _mm256_slli_epi16::<4>(a)) }
    }
    #[inline(always)]
    unsafe fn shl16_2(self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.map(|a| _mm256_slli_epi16::<2>(a)) }
    }
    #[inline(always)]
    unsafe fn shr16_1(self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.map(|a| _mm256_srli_epi16::<1>(a)) }
    }
    #[inline(always)]
    unsafe fn shr16_2(self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.map(|a| _mm256_srli_epi16::<2>(a)) }
    }
    #[inline(always)]
    unsafe fn shr16_4(self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.map(|a| _mm256_srli_epi16::<4>(a)) }
    }
    #[inline(always)]
    unsafe fn i8_operand(self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.map(|w| _mm256_xor_si256(w, _mm256_set1_epi8(-128))) }
    }
    #[inline(always)]
    unsafe fn dot4_i8(self, w: Self, a: i32) -> Self {
        // SAFETY: see the impl.
        unsafe {
            // |q| × (a with q's sign): pairs stay inside i16 (≤ 2·128·127); a ≠ −128.
            let (a, ones) = (_mm256_set1_epi32(a), _mm256_set1_epi16(1));
            self.zip(w, |acc, w| {
                let prod = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
                _mm256_add_epi32(acc, _mm256_madd_epi16(prod, ones))
            })
        }
    }
    #[inline(always)]
    unsafe fn dot2(self, w: Self, a: i32) -> Self {
        // SAFETY: see the impl.
        unsafe {
            let a = _mm256_set1_epi32(a);
            self.zip(w, |acc, w| _mm256_add_epi32(acc, _mm256_madd_epi16(w, a)))
        }
    }
    const NARROW_RUNS: bool = true;
    #[inline(always)]
    unsafe fn run_dot4(self, w: Self, a: i32) -> Self {
        // SAFETY: see the impl.
        unsafe {
            // u8 × i8 pairs stay inside i16 (≤ 2·63·127), so `maddubs` does not saturate.
            let a = _mm256_set1_epi32(a);
            self.zip(w, |acc, w| _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, a)))
        }
    }
    #[inline(always)]
    unsafe fn run_add(self, o: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.zip(o, |a, b| _mm256_add_epi16(a, b)) }
    }
    #[inline(always)]
    unsafe fn run_sum(self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.map(|a| _mm256_madd_epi16(a, _mm256_set1_epi16(1))) }
    }
    #[inline(always)]
    unsafe fn run_times(self, s: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.zip(s, |a, s| _mm256_madd_epi16(a, s)) }
    }
    #[inline(always)]
    unsafe fn run_scales(sc: Self) -> [Self; 2] {
        // SAFETY: see the impl.
        unsafe {
            // Each lane's low (high) i16 into both of its halves, for `madd`.
            let low = _mm256_setr_epi8(
                0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
            );
            let high = _mm256_setr_epi8(
                2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15,
                14, 15,
            );
            [sc.map(|v| _mm256_shuffle_epi8(v, low)), sc.map(|v| _mm256_shuffle_epi8(v, high))]
        }
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.zip(o, |a, b| _mm256_mullo_epi32(a, b)) }
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.zip(o, |a, b| _mm256_add_epi32(a, b)) }
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.zip(o, |a, b| _mm256_sub_epi32(a, b)) }
    }
    #[inline(always)]
    unsafe fn times32(self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.map(|a| _mm256_slli_epi32::<5>(a)) }
    }
    #[inline(always)]
    unsafe fn widen_u8(p: *const u8) -> Self {
        // SAFETY: see the impl.
        unsafe {
            Ymm2([
                _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i)),
                _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16) as *const __m128i)),
            ])
        }
    }
    #[inline(always)]
    unsafe fn widen_i8(p: *const u8) -> Self {
        // SAFETY: see the impl.
        unsafe {
            Ymm2([
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p as *const __m128i)),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(16) as *const __m128i)),
            ])
        }
    }
    #[inline(always)]
    unsafe fn low_i16(self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.map(|a| _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(a))) }
    }
    #[inline(always)]
    unsafe fn high_i16(self) -> Self {
        // SAFETY: see the impl.
        unsafe { self.map(|a| _mm256_srai_epi32::<16>(a)) }
    }
    #[inline(always)]
    unsafe fn to_f(self) -> [__m256; 2] {
        // SAFETY: see the impl.
        unsafe { [_mm256_cvtepi32_ps(self.0[0]), _mm256_cvtepi32_ps(self.0[1])] }
    }
    #[inline(always)]
    unsafe fn fzero() -> [__m256; 2] {
        // SAFETY: see the impl.
        unsafe { [_mm256_setzero_ps(); 2] }
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> [__m256; 2] {
        // SAFETY: see the impl.
        unsafe {
            [
                _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i)),
            ]
        }
    }
    #[inline(always)]
    unsafe fn fsplat(v: f32) -> [__m256; 2] {
        // SAFETY: see the impl.
        unsafe { [_mm256_set1_ps(v); 2] }
    }
    #[inline(always)]
    unsafe fn fmul(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        // SAFETY: see the impl.
        unsafe { fzip(a, b, |a, b| _mm256_mul_ps(a, b)) }
    }
    #[inline(always)]
    unsafe fn fadd(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        // SAFETY: see the impl.
        unsafe { fzip(a, b, |a, b| _mm256_add_ps(a, b)) }
    }
    #[inline(always)]
    unsafe fn fsub(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        // SAFETY: see the impl.
        unsafe { fzip(a, b, |a, b| _mm256_sub_ps(a, b)) }
    }
    #[inline(always)]
    unsafe fn fstore(a: [__m256; 2], out: &mut [f32; TILE]) {
        // SAFETY: see the impl.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), a[1]);
        }
    }
}

/// AVX2 + F16C path over tiles (see `tiles`). Safety: the CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn tiles_avx2<const R: usize>(
    format: Format,
    stripes: &[u8],
    stripe_bytes: usize,
    n: usize,
    a: &[ActRow<'_>; R],
    out: &mut [&mut [f32]],
) {
    // SAFETY: the features are the caller's contract.
    unsafe { tiles::<Ymm2, R>(format, stripes, stripe_bytes, n, a, out) }
}

/// AVX-512 VNNI path over tiles (see `tiles`). Safety: the CPU must have AVX2, F16C, AVX-512
/// F/BW/VL/VNNI.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn tiles_vnni<const R: usize>(
    format: Format,
    stripes: &[u8],
    stripe_bytes: usize,
    n: usize,
    a: &[ActRow<'_>; R],
    out: &mut [&mut [f32]],
) {
    // SAFETY: the features are the caller's contract.
    unsafe { tiles::<Zmm, R>(format, stripes, stripe_bytes, n, a, out) }
}

/// The tiles of one format (`stripes`: whole tiles of `stripe_bytes`, covering `n` weight rows)
/// against `R` activation rows: (weight row i, activation row j) goes to `out[j][i]`.
#[inline(always)]
unsafe fn tiles<V: Lanes, const R: usize>(
    format: Format,
    stripes: &[u8],
    stripe_bytes: usize,
    n: usize,
    a: &[ActRow<'_>; R],
    out: &mut [&mut [f32]],
) {
    let nb = check_tiles(format, stripes, stripe_bytes, n, a, out);
    for (t, stripe) in stripes.chunks_exact(stripe_bytes).enumerate() {
        // SAFETY: shapes checked above; the features are the caller's contract.
        let res = unsafe {
            match format {
                Format::Q4K => q4k_tile::<V, R>(stripe, nb, a),
                Format::Q6K => q6k_tile::<V, R>(stripe, nb, a),
                Format::Q8_0 => q32_tile::<V, R, false>(stripe, nb, a),
                Format::Q5_0 => q32_tile::<V, R, true>(stripe, nb, a),
            }
        };
        for (o, acc) in out.iter_mut().zip(&res) {
            // SAFETY: the features are the caller's contract.
            unsafe { store_tile::<V>(acc, o, t, n) };
        }
    }
}

/// Checks a tile kernel's shapes (the safety argument of every load the kernels make) and returns
/// the tile blocks per stripe.
fn check_tiles(
    format: Format,
    stripes: &[u8],
    stripe_bytes: usize,
    n: usize,
    a: &[ActRow<'_>],
    out: &[&mut [f32]],
) -> usize {
    let nb = stripe_bytes / format.tile_block_bytes();
    assert!(nb * format.tile_block_bytes() == stripe_bytes, "tile stripes");
    assert_eq!(stripes.len(), n.div_ceil(TILE) * stripe_bytes, "stripes cover the rows");
    assert!(out.len() == a.len() && out.iter().all(|o| o.len() >= n), "output too short");
    let (k, act) = (nb * format.block_len(), format.act_format());
    for row in a {
        assert_eq!(row.qs.len(), k, "activation row length");
        assert!(row.scales.len() == k / act.block_len() && row.sums.len() == k / act.sum_len(), "activation sums");
        if act == ActFormat::Q8K {
            assert!(row.pairs16.len() == k / 32 && row.pairs32.len() == k / 64, "activation pair sums");
        }
    }
    nb
}

/// Writes one activation row's lane sums of tile `t` (`finish`) into its output row, of `n` weight
/// rows in all (the last tile may be partial).
#[inline(always)]
unsafe fn store_tile<V: Lanes>(acc: &[V::F; LANES], out: &mut [f32], t: usize, n: usize) {
    let len = TILE.min(n - TILE * t);
    let o = &mut out[TILE * t..TILE * t + len];
    // SAFETY: register arithmetic; the features are the caller's contract.
    unsafe {
        if let Ok(whole) = <&mut [f32; TILE]>::try_from(&mut *o) {
            finish::<V>(acc, whole);
        } else {
            let mut part = [0f32; TILE];
            finish::<V>(acc, &mut part);
            o.copy_from_slice(&part[..len]);
        }
    }
}

/// Tile blocks ahead of the one being computed whose lines are requested early: one core's
/// demand loads alone leave memory bandwidth unused when a product streams its weights once.
const PREFETCH_BLOCKS: usize = 2;

/// Asks for part `part` of `parts` of the cache lines of the tile block `PREFETCH_BLOCKS` after
/// the one at `t` (`bytes` long). Spread over the block's loop rather than issued at once, the
/// requests do not queue behind each other. Past the end of the weights this is a harmless hint:
/// prefetches never fault.
#[inline(always)]
unsafe fn prefetch_ahead(t: *const u8, bytes: usize, part: usize, parts: usize) {
    let ahead = t.wrapping_add(PREFETCH_BLOCKS * bytes);
    let (from, to) = (bytes * part / parts, bytes * (part + 1) / parts);
    for line in (from.next_multiple_of(64)..to).step_by(64) {
        // SAFETY: a prefetch reads nothing architecturally and cannot fault.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8) };
    }
}

/// The canonical lane sums of one row's per-block values into `out`: block b went to lane b % 8,
/// reduced in `reduce_lanes`'s tree — lane-wise here, one output per SIMD lane.
#[inline(always)]
unsafe fn finish<V: Lanes>(l: &[V::F; LANES], out: &mut [f32; TILE]) {
    // SAFETY: register arithmetic; features are the caller's.
    unsafe {
        let v = V::fadd(
            V::fadd(V::fadd(l[0], l[1]), V::fadd(l[2], l[3])),
            V::fadd(V::fadd(l[4], l[5]), V::fadd(l[6], l[7])),
        );
        V::fstore(v, out);
    }
}

/// One tile of Q4_K rows against `R` activation rows: per sub-block j, eight `dot4`s per row
/// (each quad of activations broadcast to the sixteen rows), then `× s_j`; the mins through the
/// activations' sub-block sums; then `q4k_value`'s float steps, lane-wise.
#[inline(always)]
unsafe fn q4k_tile<V: Lanes, const R: usize>(stripe: &[u8], nb: usize, a: &[ActRow<'_>; R]) -> [[V::F; LANES]; R] {
    // SAFETY: `stripe` holds nb tile blocks of Q4K_TILE_BYTES; rows hold nb·256 values, nb scales,
    // 4·nb sub-block pairs (checked by `tiles`).
    unsafe {
        let mut acc = [[V::fzero(); LANES]; R];
        let m4 = V::splat8(0x0F);
        for b in 0..nb {
            let t = stripe.as_ptr().add(b * Q4K_TILE_BYTES);
            let mut isum = [V::zero(); R];
            for p in 0..4 {
                prefetch_ahead(t, Q4K_TILE_BYTES, p, 4);
                let sc = V::widen_u8(t.add(Q4K_SCALES + 32 * p));
                for (half, s) in V::run_scales(sc).into_iter().enumerate() {
                    let j = 2 * p + half;
                    // Two dependency chains per row when few rows share the call, one otherwise
                    // (the rows' chains already overlap; registers are the limit). One run of
                    // eight `dot4`s: |sum| ≤ 8 · 2 · 15 · 127 = 30,480 fits i16.
                    let split = R <= 2;
                    let mut lo = [V::zero(); R];
                    let mut hi = [V::zero(); R];
                    for q in 0..4 {
                        let line = V::load(t.add(Q4K_LINES + 64 * (4 * j + q)));
                        let (wl, wh) = (line.and(m4), line.shr16_4().and(m4));
                        for r in 0..R {
                            let ap = a[r].qs.as_ptr().add(256 * b + 32 * j + 4 * q) as *const i32;
                            lo[r] = lo[r].run_dot4(wl, ap.read_unaligned());
                            if split {
                                hi[r] = hi[r].run_dot4(wh, ap.add(4).read_unaligned());
                            } else {
                                lo[r] = lo[r].run_dot4(wh, ap.add(4).read_unaligned());
                            }
                        }
                    }
                    for r in 0..R {
                        let run = if split { lo[r].run_add(hi[r]) } else { lo[r] };
                        isum[r] = isum[r].add(run.run_times(s));
                    }
                }
            }
            let (d, dmin) = (V::f16s(t), V::f16s(t.add(32)));
            for r in 0..R {
                let mut summin = V::zero();
                for p in 0..4 {
                    summin = summin.dot2(V::widen_u8(t.add(Q4K_MINS + 32 * p)), a[r].pairs32[4 * b + p] as i32);
                }
                let da = V::fsplat(a[r].scales[b]);
                let v = V::fsub(V::fmul(V::fmul(da, d), isum[r].to_f()), V::fmul(V::fmul(da, dmin), summin.to_f()));
                acc[r][b % LANES] = V::fadd(acc[r][b % LANES], v);
            }
        }
        acc
    }
}

/// One tile of Q6_K rows against `R` activation rows: per group of 16, four `dot4`s per row on
/// the unsigned 6-bit values, then `× s_g`; the −32 offset through the activations' group sums;
/// then `q6k_value`'s float steps, lane-wise.
#[inline(always)]
unsafe fn q6k_tile<V: Lanes, const R: usize>(stripe: &[u8], nb: usize, a: &[ActRow<'_>; R]) -> [[V::F; LANES]; R] {
    let tb = Format::Q6K.tile_block_bytes();
    // SAFETY: as `q4k_tile`, with 8·nb group pairs.
    unsafe {
        let mut acc = [[V::fzero(); LANES]; R];
        let (m4, m30) = (V::splat8(0x0F), V::splat8(0x30));
        for b in 0..nb {
            let t = stripe.as_ptr().add(b * tb);
            let mut isum = [V::zero(); R];
            let mut offset = [V::zero(); R];
            for p in 0..8 {
                prefetch_ahead(t, tb, p, 8);
                let sc = V::widen_i8(t.add(Q6K_SCALES + 32 * p));
                for r in 0..R {
                    offset[r] = offset[r].dot2(sc, a[r].pairs16[8 * b + p] as i32);
                }
                for (half, s) in V::run_scales(sc).into_iter().enumerate() {
                    let g = 2 * p + half;
                    let l0 = V::load(t.add(Q6K_LOW + 64 * (2 * g)));
                    let l1 = V::load(t.add(Q6K_LOW + 64 * (2 * g + 1)));
                    let h = V::load(t.add(Q6K_HIGH + 64 * g));
                    let w = [
                        l0.and(m4).or(h.shl16_4().and(m30)),
                        l0.shr16_4().and(m4).or(h.shl16_2().and(m30)),
                        l1.and(m4).or(h.and(m30)),
                        l1.shr16_4().and(m4).or(h.shr16_2().and(m30)),
                    ];
                    for r in 0..R {
                        let ap = a[r].qs.as_ptr().add(256 * b + 16 * g) as *const i32;
                        // The run of `w[ks]`, scaled.
                        let scaled_run = |ks: core::ops::Range<usize>| {
                            let mut run = V::zero();
                            for k in ks {
                                run = run.run_dot4(w[k], ap.add(k).read_unaligned());
                            }
                            run.run_times(s)
                        };
                        // Narrow runs of two: |sum| ≤ 2 · 2 · 63 · 127 = 32,004 fits i16.
                        let scaled =
                            if V::NARROW_RUNS { scaled_run(0..2).add(scaled_run(2..4)) } else { scaled_run(0..4) };
                        isum[r] = isum[r].add(scaled);
                    }
                }
            }
            let d = V::f16s(t);
            for r in 0..R {
                let da = V::fsplat(a[r].scales[b]);
                let v = V::fmul(V::fmul(da, d), isum[r].sub(offset[r].times32()).to_f());
                acc[r][b % LANES] = V::fadd(acc[r][b % LANES], v);
            }
        }
        acc
    }
}

/// One tile of Q8_0 (`Q5` false) or Q5_0 rows against `R` activation rows: per block, eight
/// `dot4`s per row (each activation quad broadcast to the sixteen rows); the Q8_0 offset of 128
/// (where `I8_OFFSET` keeps one) or the Q5_0 offset of 16 through the activations' block sum; then
/// `q8_value`'s float steps, lane-wise.
#[inline(always)]
unsafe fn q32_tile<V: Lanes, const R: usize, const Q5: bool>(
    stripe: &[u8],
    nb: usize,
    a: &[ActRow<'_>; R],
) -> [[V::F; LANES]; R] {
    let tb = if Q5 { Format::Q5_0 } else { Format::Q8_0 }.tile_block_bytes();
    let offset = if Q5 { 16 } else { V::I8_OFFSET };
    // SAFETY: `stripe` holds nb tile blocks of `tb` bytes; rows hold nb·32 values, nb scales and
    // nb sums (checked by `tiles`).
    unsafe {
        let mut acc = [[V::fzero(); LANES]; R];
        let (m4, m10) = (V::splat8(0x0F), V::splat8(0x10));
        for b in 0..nb {
            let t = stripe.as_ptr().add(b * tb);
            prefetch_ahead(t, tb, 0, 1);
            // The block's weights as eight lines: line k holds weights 4k ..+4 of every row.
            let mut w = [V::zero(); 8];
            if Q5 {
                // Fifth bits: bit 2q of a byte for line q, bit 2q + 1 for line 4 + q; shifting
                // the odd bits down once lets both use the same shifts to reach bit 4.
                let h = V::load(t.add(Q5_0_HIGH));
                let h_odd = h.shr16_1();
                for q in 0..4 {
                    let fifth = |h: V| match q {
                        0 => h.shl16_4(),
                        1 => h.shl16_2(),
                        2 => h,
                        _ => h.shr16_2(),
                    };
                    let line = V::load(t.add(Q32_LINES + 64 * q));
                    w[q] = line.and(m4).or(fifth(h).and(m10));
                    w[4 + q] = line.shr16_4().and(m4).or(fifth(h_odd).and(m10));
                }
            } else {
                for (k, w) in w.iter_mut().enumerate() {
                    *w = V::load(t.add(Q32_LINES + 64 * k)).i8_operand();
                }
            }
            let d = V::f16s(t);
            for r in 0..R {
                let ap = a[r].qs.as_ptr().add(32 * b) as *const i32;
                // Two dependency chains per row; Q5_0's are runs of four: |sum| ≤ 4 · 2 · 31 · 127
                // = 31,496 fits i16.
                let (mut lo, mut hi) = (V::zero(), V::zero());
                for k in 0..4 {
                    let (qa_lo, qa_hi) = (ap.add(k).read_unaligned(), ap.add(4 + k).read_unaligned());
                    if Q5 {
                        lo = lo.run_dot4(w[k], qa_lo);
                        hi = hi.run_dot4(w[4 + k], qa_hi);
                    } else {
                        lo = lo.dot4_i8(w[k], qa_lo);
                        hi = hi.dot4_i8(w[4 + k], qa_hi);
                    }
                }
                let (lo, hi) = if Q5 { (lo.run_sum(), hi.run_sum()) } else { (lo, hi) };
                let isum = lo.add(hi).sub(V::splat32(offset * a[r].sums[b]));
                let v = V::fmul(V::fmul(d, V::fsplat(a[r].scales[b])), isum.to_f());
                acc[r][b % LANES] = V::fadd(acc[r][b % LANES], v);
            }
        }
        acc
    }
}
