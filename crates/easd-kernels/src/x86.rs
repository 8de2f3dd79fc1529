//! x86-64 kernels: AVX2 (+F16C), and AVX-512 VNNI where the CPU has it.
//!
//! Each kernel computes the exact integer block sums with SIMD and then performs the float
//! operations of the portable path (`scalar.rs`) in the same order, so its results are
//! bit-identical to it; the tests check that.
//!
//! * K-quants (Q4_K, Q6_K), held in tiles of sixteen interleaved weight rows (`format.rs`): one
//!   SIMD lane per weight row, each activation quad broadcast to all sixteen (`vpdpbusd` with an
//!   embedded broadcast on AVX-512), no horizontal sums; up to eight activation rows share each
//!   unpacked weight line. Written once against `Lanes` (one `zmm`, or two `ymm` on AVX2).
//! * Q8_0 / Q5_0, held row by row: one weight row against up to four activation rows, eight blocks
//!   at a time so that their sums form one vector in the canonical lane order.
//!
//! In both, the arithmetic per activation row does not depend on how many rows share the call.
//! Learned from ggml-cpu's `ggml_vec_dot_*_q8_*` (the sign trick for signed bytes, the Q5 high-bit
//! expansion) and its repacked `q4_K` GEMV (interleaved rows), written anew around the canonical
//! accumulation.

use core::arch::x86_64::*;

use crate::act::ActRow;
use crate::format::{Format, Q4K_LINES, Q4K_MINS, Q4K_SCALES, Q4K_TILE_BYTES, Q6K_HIGH, Q6K_LOW, Q6K_SCALES, TILE};
use crate::scalar::{LANES, q8_value, reduce_lanes};

/// Checks what the pointer arithmetic below relies on: whole blocks, and activation rows as long
/// as the weight row.
fn check_shapes<const R: usize>(format: Format, w: &[u8], a: &[ActRow<'_>; R]) {
    let bb = format.block_bytes();
    assert!(w.len().is_multiple_of(bb), "weight row of {} bytes is not whole {format:?} blocks", w.len());
    let nb = w.len() / bb;
    let cols = nb * format.block_len();
    let act = format.act_format();
    for row in a {
        assert_eq!(row.qs.len(), cols, "activation row length");
        assert_eq!(row.scales.len(), cols / act.block_len(), "activation scales");
        assert_eq!(row.sums.len(), cols / act.sum_len(), "activation sums");
    }
}

/// Runs the kernel over every weight row of `rows` (each `row_bytes` long): the result for
/// weight row i and activation row j goes to `out[i·stride + j]`.
#[inline(always)]
unsafe fn rows_loop<const R: usize, const VNNI: bool>(
    format: Format,
    rows: &[u8],
    row_bytes: usize,
    a: &[ActRow<'_>; R],
    out: &mut [f32],
    stride: usize,
) {
    assert!(row_bytes > 0 && rows.len().is_multiple_of(row_bytes), "weight rows");
    let n = rows.len() / row_bytes;
    assert!(n == 0 || out.len() >= (n - 1) * stride + R, "output too short");
    check_shapes(format, &rows[..row_bytes.min(rows.len())], a);
    for (i, w) in rows.chunks_exact(row_bytes).enumerate() {
        // SAFETY: every row has the checked shape; the features are the caller's contract.
        let res = unsafe { dispatch::<R, VNNI>(format, w, a) };
        out[i * stride..i * stride + R].copy_from_slice(&res);
    }
}

/// AVX2 + F16C path over several weight rows (see `rows_loop`). Safety: the CPU must have AVX2
/// and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dot_rows_avx2<const R: usize>(
    format: Format,
    rows: &[u8],
    row_bytes: usize,
    a: &[ActRow<'_>; R],
    out: &mut [f32],
    stride: usize,
) {
    // SAFETY: the features are the caller's contract.
    unsafe { rows_loop::<R, false>(format, rows, row_bytes, a, out, stride) }
}

/// AVX-512 path (512-bit K-quant kernels, `vpdpbusd` for the 32-blocks) over several weight rows.
/// Safety: the CPU must have AVX2, F16C, AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_rows_vnni<const R: usize>(
    format: Format,
    rows: &[u8],
    row_bytes: usize,
    a: &[ActRow<'_>; R],
    out: &mut [f32],
    stride: usize,
) {
    // SAFETY: the features are the caller's contract.
    unsafe { rows_loop::<R, true>(format, rows, row_bytes, a, out, stride) }
}

#[inline(always)]
unsafe fn dispatch<const R: usize, const VNNI: bool>(format: Format, w: &[u8], a: &[ActRow<'_>; R]) -> [f32; R] {
    // SAFETY: shapes checked by the entry points, which also hold the features (all arms).
    unsafe {
        match format {
            Format::Q8_0 => q8_family::<R, VNNI, false>(w, a),
            Format::Q5_0 => q8_family::<R, VNNI, true>(w, a),
            Format::Q4K | Format::Q6K => unreachable!("tiled formats run `tiles_*`"),
        }
    }
}

/// The two f16 values at `p` as f32, with F16C (exact, like the portable path's conversion).
#[inline(always)]
unsafe fn f16_pair(p: *const u8) -> (f32, f32) {
    // SAFETY: callers pass pointers with 4 readable bytes; F16C is the caller's feature.
    unsafe {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_shuffle_ps::<1>(v, v)))
    }
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: callers pass pointers with 32 readable bytes.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

#[inline(always)]
unsafe fn load_i8(p: *const i8) -> __m256i {
    // SAFETY: as `load`.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// Sum of the eight i32 lanes (exact).
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: register-only intrinsics; the features are the caller's.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// Lane j of the result is the sum of the lanes of `p[j]` (exact).
#[inline(always)]
unsafe fn hsum8(p: &[__m256i; 8]) -> __m256i {
    // SAFETY: register-only intrinsics.
    unsafe {
        let h01 = _mm256_hadd_epi32(p[0], p[1]);
        let h23 = _mm256_hadd_epi32(p[2], p[3]);
        let h45 = _mm256_hadd_epi32(p[4], p[5]);
        let h67 = _mm256_hadd_epi32(p[6], p[7]);
        let h0123 = _mm256_hadd_epi32(h01, h23);
        let h4567 = _mm256_hadd_epi32(h45, h67);
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(h0123, h4567),
            _mm256_permute2x128_si256::<0x31>(h0123, h4567),
        )
    }
}

/// `acc + Σ` of each four adjacent u8 × i8 products, per i32 lane (exact for our value ranges:
/// the AVX2 pair sums stay far inside i16).
#[inline(always)]
unsafe fn dot4<const VNNI: bool>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; VNNI only in functions that enable it.
    unsafe {
        if VNNI {
            _mm256_dpbusd_epi32(acc, u, s)
        } else {
            _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
        }
    }
}

/// The 32 weights of a Q8_0 block (signed) or a Q5_0 block (unsigned 0..32) at `p`.
#[inline(always)]
unsafe fn block_weights<const Q5: bool>(p: *const u8) -> __m256i {
    // SAFETY: `p` points at a whole block (34 or 22 bytes).
    unsafe {
        if !Q5 {
            return load(p.add(2));
        }
        let q = _mm_loadu_si128(p.add(6) as *const __m128i);
        let m4 = _mm_set1_epi8(0x0F);
        let nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(q), m4), _mm_and_si128(q, m4));
        let qh = (p.add(2) as *const u32).read_unaligned();
        // Byte i ← byte i/8 of qh, then all ones where bit i%8 of it is set.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh as i32),
            _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303),
        );
        let bits = _mm256_cmpeq_epi8(
            _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe)),
            _mm256_set1_epi64x(-1),
        );
        _mm256_or_si256(nibbles, _mm256_and_si256(bits, _mm256_set1_epi8(0x10)))
    }
}

/// Integer dot of one block's weights with 32 activations (lanes still to be summed).
#[inline(always)]
unsafe fn block_dot<const VNNI: bool, const Q5: bool>(wv: __m256i, av: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics.
    unsafe {
        let zero = _mm256_setzero_si256();
        if Q5 {
            dot4::<VNNI>(zero, wv, av)
        } else {
            // |w| × (a with w's sign): unsigned × signed, as the instructions want. a ≠ −128.
            dot4::<VNNI>(zero, _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv))
        }
    }
}

/// Q8_0 and Q5_0 (32-weight blocks): eight blocks at a time, so that their sums form one vector
/// whose lane j is block 8g + j — exactly the portable path's lane `b % 8`.
#[inline(always)]
unsafe fn q8_family<const R: usize, const VNNI: bool, const Q5: bool>(w: &[u8], a: &[ActRow<'_>; R]) -> [f32; R] {
    let bb = if Q5 { 22 } else { 34 };
    let nb = w.len() / bb;
    let groups = nb / LANES;
    let wp = w.as_ptr();
    let mut out = [0f32; R];
    // SAFETY: every pointer below stays inside `w` (nb whole blocks) or inside a row of nb·32
    // activations with nb scales and nb sums (checked by the entry points).
    unsafe {
        let mut accv = [_mm256_setzero_ps(); R];
        for g in 0..groups {
            let mut dh = [0u16; LANES];
            let mut wv = [_mm256_setzero_si256(); LANES];
            for j in 0..LANES {
                let blk = wp.add((LANES * g + j) * bb);
                dh[j] = (blk as *const u16).read_unaligned();
                wv[j] = block_weights::<Q5>(blk);
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr() as *const __m128i));
            for r in 0..R {
                let ap = a[r].qs.as_ptr().add(LANES * 32 * g);
                let mut p = [_mm256_setzero_si256(); LANES];
                for j in 0..LANES {
                    p[j] = block_dot::<VNNI, Q5>(wv[j], load_i8(ap.add(32 * j)));
                }
                let mut sums = hsum8(&p);
                if Q5 {
                    let asum = _mm256_loadu_si256(a[r].sums.as_ptr().add(LANES * g) as *const __m256i);
                    sums = _mm256_sub_epi32(sums, _mm256_slli_epi32::<4>(asum));
                }
                let da = _mm256_loadu_ps(a[r].scales.as_ptr().add(LANES * g));
                accv[r] = _mm256_add_ps(accv[r], _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(sums)));
            }
        }
        for r in 0..R {
            let mut acc = [0f32; LANES];
            _mm256_storeu_ps(acc.as_mut_ptr(), accv[r]);
            for b in LANES * groups..nb {
                let wv = block_weights::<Q5>(wp.add(b * bb));
                let mut isum = hsum_i32(block_dot::<VNNI, Q5>(wv, load_i8(a[r].qs.as_ptr().add(32 * b))));
                if Q5 {
                    isum -= 16 * a[r].sums[b];
                }
                acc[b % LANES] += q8_value(f16_pair(wp.add(b * bb)).0, a[r].scales[b], isum);
            }
            out[r] = reduce_lanes(&acc);
        }
    }
    out
}

/// Sixteen i32 lanes, one per weight row of a tile (see `format.rs`), and sixteen f32 lanes for
/// the float steps: one `zmm`, or two `ymm` on AVX2. The tile kernels below are written once
/// against this and instantiated for both.
trait Lanes: Copy {
    type F: Copy;
    unsafe fn zero() -> Self;
    /// 64 bytes.
    unsafe fn load(p: *const u8) -> Self;
    unsafe fn splat8(v: i8) -> Self;
    unsafe fn and(self, o: Self) -> Self;
    unsafe fn or(self, o: Self) -> Self;
    unsafe fn shl16_4(self) -> Self;
    unsafe fn shl16_2(self) -> Self;
    unsafe fn shr16_2(self) -> Self;
    unsafe fn shr16_4(self) -> Self;
    /// `self + Σ` of each lane's four u8 of `w` times the four i8 of `a` (exact, no saturation
    /// for our value ranges).
    unsafe fn dot4(self, w: Self, a: i32) -> Self;
    /// `self + Σ` of each lane's two i16 of `w` times the two i16 of `a` (exact).
    unsafe fn dot2(self, w: Self, a: i32) -> Self;
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
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_setzero_si512()) }
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
    unsafe fn dot4(self, w: Self, a: i32) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_dpbusd_epi32(self.0, w.0, _mm512_set1_epi32(a))) }
    }
    #[inline(always)]
    unsafe fn dot2(self, w: Self, a: i32) -> Self {
        // SAFETY: see the impl.
        unsafe { Zmm(_mm512_dpwssd_epi32(self.0, w.0, _mm512_set1_epi32(a))) }
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
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: see the impl.
        unsafe { Ymm2([_mm256_setzero_si256(); 2]) }
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
    unsafe fn dot4(self, w: Self, a: i32) -> Self {
        // SAFETY: see the impl.
        unsafe {
            // u8 × i8 pairs stay inside i16 (≤ 2·63·127), so `maddubs` does not saturate.
            let (a, ones) = (_mm256_set1_epi32(a), _mm256_set1_epi16(1));
            self.zip(w, |acc, w| _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones)))
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
    out: &mut [f32],
    stride: usize,
) {
    // SAFETY: the features are the caller's contract.
    unsafe { tiles::<Ymm2, R>(format, stripes, stripe_bytes, n, a, out, stride) }
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
    out: &mut [f32],
    stride: usize,
) {
    // SAFETY: the features are the caller's contract.
    unsafe { tiles::<Zmm, R>(format, stripes, stripe_bytes, n, a, out, stride) }
}

/// The tiles of a tiled format (`stripes`: whole tiles of `stripe_bytes`, covering `n` weight rows)
/// against `R` activation rows: (weight row i, activation row j) goes to `out[i·stride + j]`.
#[inline(always)]
unsafe fn tiles<V: Lanes, const R: usize>(
    format: Format,
    stripes: &[u8],
    stripe_bytes: usize,
    n: usize,
    a: &[ActRow<'_>; R],
    out: &mut [f32],
    stride: usize,
) {
    let nb = stripe_bytes / format.tile_block_bytes();
    assert!(format.tiled() && nb * format.tile_block_bytes() == stripe_bytes, "tile stripes");
    assert_eq!(stripes.len(), n.div_ceil(TILE) * stripe_bytes, "stripes cover the rows");
    assert!(n == 0 || out.len() >= (n - 1) * stride + R, "output too short");
    for row in a {
        assert_eq!(row.qs.len(), 256 * nb, "activation row length");
        assert!(row.scales.len() == nb && row.sums.len() == 16 * nb, "activation scales and sums");
        assert!(row.pairs16.len() == 8 * nb && row.pairs32.len() == 4 * nb, "activation pair sums");
    }
    for (t, stripe) in stripes.chunks_exact(stripe_bytes).enumerate() {
        // SAFETY: shapes checked above; the features are the caller's contract.
        let res = unsafe {
            match format {
                Format::Q4K => q4k_tile::<V, R>(stripe, nb, a),
                _ => q6k_tile::<V, R>(stripe, nb, a),
            }
        };
        for o in 0..TILE.min(n - TILE * t) {
            for (r, res) in res.iter().enumerate() {
                out[(TILE * t + o) * stride + r] = res[o];
            }
        }
    }
}

/// Tile blocks ahead of the one being computed whose lines are requested early: one core's
/// demand loads alone leave memory bandwidth unused when a product streams its weights once.
const PREFETCH_BLOCKS: usize = 2;

/// Asks for the cache lines of the tile block `PREFETCH_BLOCKS` after the one at `t` (`bytes`
/// long). Past the end of the weights this is a harmless hint: prefetches never fault.
#[inline(always)]
unsafe fn prefetch_ahead(t: *const u8, bytes: usize) {
    let ahead = t.wrapping_add(PREFETCH_BLOCKS * bytes);
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch reads nothing architecturally and cannot fault.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8) };
    }
}

/// The canonical lane sums of each row's per-block values: block b went to lane b % 8, reduced in
/// `reduce_lanes`'s tree — lane-wise here, one output per SIMD lane.
#[inline(always)]
unsafe fn finish<V: Lanes, const R: usize>(acc: &[[V::F; LANES]; R]) -> [[f32; TILE]; R] {
    let mut out = [[0f32; TILE]; R];
    for (o, l) in out.iter_mut().zip(acc) {
        // SAFETY: register arithmetic; features are the caller's.
        unsafe {
            let v = V::fadd(
                V::fadd(V::fadd(l[0], l[1]), V::fadd(l[2], l[3])),
                V::fadd(V::fadd(l[4], l[5]), V::fadd(l[6], l[7])),
            );
            V::fstore(v, o);
        }
    }
    out
}

/// One tile of Q4_K rows against `R` activation rows: per sub-block j, eight `dot4`s per row
/// (each quad of activations broadcast to the sixteen rows), then `× s_j`; the mins through the
/// activations' sub-block sums; then `q4k_value`'s float steps, lane-wise.
#[inline(always)]
unsafe fn q4k_tile<V: Lanes, const R: usize>(stripe: &[u8], nb: usize, a: &[ActRow<'_>; R]) -> [[f32; TILE]; R] {
    // SAFETY: `stripe` holds nb tile blocks of Q4K_TILE_BYTES; rows hold nb·256 values, nb scales,
    // 4·nb sub-block pairs (checked by `tiles`).
    unsafe {
        let mut acc = [[V::fzero(); LANES]; R];
        let m4 = V::splat8(0x0F);
        for b in 0..nb {
            let t = stripe.as_ptr().add(b * Q4K_TILE_BYTES);
            prefetch_ahead(t, Q4K_TILE_BYTES);
            let mut isum = [V::zero(); R];
            for p in 0..4 {
                let sc = V::widen_u8(t.add(Q4K_SCALES + 32 * p));
                for (half, s) in [sc.low_i16(), sc.high_i16()].into_iter().enumerate() {
                    let j = 2 * p + half;
                    // Two dependency chains per row when few rows share the call, one otherwise
                    // (the rows' chains already overlap; registers are the limit).
                    let split = R <= 2;
                    let mut lo = [V::zero(); R];
                    let mut hi = [V::zero(); R];
                    for q in 0..4 {
                        let line = V::load(t.add(Q4K_LINES + 64 * (4 * j + q)));
                        let (wl, wh) = (line.and(m4), line.shr16_4().and(m4));
                        for r in 0..R {
                            let ap = a[r].qs.as_ptr().add(256 * b + 32 * j + 4 * q) as *const i32;
                            lo[r] = lo[r].dot4(wl, ap.read_unaligned());
                            if split {
                                hi[r] = hi[r].dot4(wh, ap.add(4).read_unaligned());
                            } else {
                                lo[r] = lo[r].dot4(wh, ap.add(4).read_unaligned());
                            }
                        }
                    }
                    for r in 0..R {
                        let dot = if split { lo[r].add(hi[r]) } else { lo[r] };
                        isum[r] = isum[r].add(dot.mul(s));
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
        finish::<V, R>(&acc)
    }
}

/// One tile of Q6_K rows against `R` activation rows: per group of 16, four `dot4`s per row on
/// the unsigned 6-bit values, then `× s_g`; the −32 offset through the activations' group sums;
/// then `q6k_value`'s float steps, lane-wise.
#[inline(always)]
unsafe fn q6k_tile<V: Lanes, const R: usize>(stripe: &[u8], nb: usize, a: &[ActRow<'_>; R]) -> [[f32; TILE]; R] {
    let tb = Format::Q6K.tile_block_bytes();
    // SAFETY: as `q4k_tile`, with 8·nb group pairs.
    unsafe {
        let mut acc = [[V::fzero(); LANES]; R];
        let (m4, m30) = (V::splat8(0x0F), V::splat8(0x30));
        for b in 0..nb {
            let t = stripe.as_ptr().add(b * tb);
            prefetch_ahead(t, tb);
            let mut isum = [V::zero(); R];
            let mut offset = [V::zero(); R];
            for p in 0..8 {
                let sc = V::widen_i8(t.add(Q6K_SCALES + 32 * p));
                for r in 0..R {
                    offset[r] = offset[r].dot2(sc, a[r].pairs16[8 * b + p] as i32);
                }
                for (half, s) in [sc.low_i16(), sc.high_i16()].into_iter().enumerate() {
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
                        let mut dot = V::zero();
                        for (k, w) in w.iter().enumerate() {
                            dot = dot.dot4(*w, ap.add(k).read_unaligned());
                        }
                        isum[r] = isum[r].add(dot.mul(s));
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
        finish::<V, R>(&acc)
    }
}
