//! x86-64 kernels: AVX2 (+F16C), and AVX-512 VNNI (256-bit `vpdpbusd`) where the CPU has it.
//!
//! Each kernel computes the exact integer block sums with SIMD and then performs the float
//! operations of the portable path (`scalar.rs`) in the same order, so its results are
//! bit-identical to it; the tests check that. One weight row is dotted with up to four activation
//! rows at once: the weights are loaded and unpacked once, every row gets its own accumulators,
//! and the arithmetic per row does not depend on how many rows share the call.
//!
//! Learned from ggml-cpu's `ggml_vec_dot_{q4_K,q6_K,q8_0,q5_0}_q8_*` (the sign trick for signed
//! bytes, the Q5 high-bit expansion), written anew around the canonical accumulation.

use core::arch::x86_64::*;

use crate::act::ActRow;
use crate::format::{Format, Q4K_HELD_BYTES, Q4K_QS};
use crate::scalar::{LANES, q4k_value, q6k_value, q8_value, reduce_lanes};

/// Checks what the pointer arithmetic below relies on: whole blocks, and activation rows as long
/// as the weight row.
fn check_shapes<const R: usize>(format: Format, w: &[u8], a: &[ActRow<'_>; R]) {
    let bb = format.held_block_bytes();
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
            Format::Q4K if VNNI => q4k_zmm::<R>(w, a),
            Format::Q6K if VNNI => q6k_zmm::<R>(w, a),
            Format::Q4K => q4k::<R>(w, a),
            Format::Q6K => q6k::<R>(w, a),
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

/// A held Q4_K block's mins as i32, in the lane order of [`q8k_subblock_sums`].
#[inline(always)]
unsafe fn q4k_mins(blk: &[u8]) -> __m256i {
    // SAFETY: `blk` is a whole held block (mins at 12..20).
    unsafe {
        _mm256_permutevar8x32_epi32(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.as_ptr().add(12) as *const __m128i)),
            _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7),
        )
    }
}

/// Sums of the 32-value sub-blocks of one Q8_K block's activations, in the lane order
/// [0, 1, 4, 5, 2, 3, 6, 7] that `hadd` of its sixteen 16-value sums produces.
#[inline(always)]
unsafe fn q8k_subblock_sums(bsums: *const i32) -> __m256i {
    // SAFETY: `bsums` points at the block's 16 sums.
    unsafe {
        _mm256_hadd_epi32(
            _mm256_loadu_si256(bsums as *const __m256i),
            _mm256_loadu_si256(bsums.add(8) as *const __m256i),
        )
    }
}

#[inline(always)]
unsafe fn q4k<const R: usize>(w: &[u8], a: &[ActRow<'_>; R]) -> [f32; R] {
    let nb = w.len() / Q4K_HELD_BYTES;
    let mut acc = [[0f32; LANES]; R];
    // SAFETY: block b occupies w[148b..148b+148] (held layout); activation rows hold nb·256
    // values, nb scales and 16·nb sums.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        for b in 0..nb {
            let blk = &w[Q4K_HELD_BYTES * b..Q4K_HELD_BYTES * (b + 1)];
            let sc = &blk[4..12];
            let mins = q4k_mins(blk);
            let mut iacc = [_mm256_setzero_si256(); R];
            for c in 0..4 {
                // 32 bytes: sub-block `lo` in the low nibbles, `lo + 2` in the high ones (held layout).
                let bits = load(blk.as_ptr().add(Q4K_QS + 32 * c));
                let lo = 4 * (c / 2) + c % 2;
                let w_lo = _mm256_and_si256(bits, m4);
                let w_hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                let s_lo = _mm256_set1_epi16(i16::from(sc[lo]));
                let s_hi = _mm256_set1_epi16(i16::from(sc[lo + 2]));
                for r in 0..R {
                    let ap = a[r].qs.as_ptr().add(256 * b);
                    let p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(w_lo, load_i8(ap.add(32 * lo))), s_lo);
                    let p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(w_hi, load_i8(ap.add(32 * lo + 64))), s_hi);
                    iacc[r] = _mm256_add_epi32(iacc[r], _mm256_add_epi32(p_lo, p_hi));
                }
            }
            let (d, dmin) = f16_pair(blk.as_ptr());
            for r in 0..R {
                let sub = q8k_subblock_sums(a[r].sums.as_ptr().add(16 * b));
                let summin = hsum_i32(_mm256_mullo_epi32(sub, mins));
                acc[r][b % LANES] += q4k_value(a[r].scales[b], d, dmin, hsum_i32(iacc[r]), summin);
            }
        }
    }
    acc.map(|l| reduce_lanes(&l))
}

#[inline(always)]
unsafe fn q6k<const R: usize>(w: &[u8], a: &[ActRow<'_>; R]) -> [f32; R] {
    let nb = w.len() / 210;
    let mut acc = [[0f32; LANES]; R];
    // SAFETY: block b occupies w[210b..210b+210]; activation rows hold nb·256 values.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let m3 = _mm256_set1_epi8(0x03);
        for b in 0..nb {
            let blk = &w[210 * b..210 * b + 210];
            let scales = &blk[192..208];
            let sc_bytes = _mm_loadu_si128(scales.as_ptr() as *const __m128i);
            // i32 scales for the −32 offset, and per 32-weight quarter an i16 vector whose low
            // half repeats group g's scale and high half group g + 1's.
            let sc_lo = _mm256_cvtepi8_epi32(sc_bytes);
            let sc_hi = _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc_bytes));
            let mut sv = [_mm256_setzero_si256(); 8];
            for (i, s) in sv.iter_mut().enumerate() {
                let (g0, g1) = (2 * i as i8, 2 * i as i8 + 1);
                let pick = _mm_setr_epi8(g0, g0, g0, g0, g0, g0, g0, g0, g1, g1, g1, g1, g1, g1, g1, g1);
                *s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc_bytes, pick));
            }
            let mut iacc = [_mm256_setzero_si256(); R];
            for half in 0..2 {
                let ql0 = load(blk.as_ptr().add(64 * half));
                let ql1 = load(blk.as_ptr().add(64 * half + 32));
                let qh = load(blk.as_ptr().add(128 + 32 * half));
                let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m3));
                let h1 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(qh), m3));
                let h2 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(qh), m3));
                let h3 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(qh), m3));
                let u = [
                    _mm256_or_si256(_mm256_and_si256(ql0, m4), h0),
                    _mm256_or_si256(_mm256_and_si256(ql1, m4), h1),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4), h2),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4), h3),
                ];
                // u[i] holds weights 128·half + 32i .. +32: groups 8·half + 2i and the next.
                for r in 0..R {
                    let ap = a[r].qs.as_ptr().add(256 * b + 128 * half);
                    for i in 0..4 {
                        let p =
                            _mm256_madd_epi16(_mm256_maddubs_epi16(u[i], load_i8(ap.add(32 * i))), sv[4 * half + i]);
                        iacc[r] = _mm256_add_epi32(iacc[r], p);
                    }
                }
            }
            let d = f16_pair(blk.as_ptr().add(206)).1; // bytes 206..210: the last two are d
            for r in 0..R {
                let bs = a[r].sums.as_ptr().add(16 * b) as *const __m256i;
                let weighted = _mm256_add_epi32(
                    _mm256_mullo_epi32(_mm256_loadu_si256(bs), sc_lo),
                    _mm256_mullo_epi32(_mm256_loadu_si256(bs.add(1)), sc_hi),
                );
                let offset = 32 * hsum_i32(weighted);
                acc[r][b % LANES] += q6k_value(a[r].scales[b], d, hsum_i32(iacc[r]) - offset);
            }
        }
    }
    acc.map(|l| reduce_lanes(&l))
}

/// Sum of the sixteen i32 lanes (exact).
#[inline(always)]
unsafe fn hsum_i32_zmm(v: __m512i) -> i32 {
    // SAFETY: register-only intrinsics.
    unsafe { hsum_i32(_mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))) }
}

/// Q4_K on 512-bit registers: one 64-byte load gives 128 consecutive weights (held layout), each
/// register one 64-weight run (sub-blocks 2k and 2k + 1) — a third of the AVX2 kernel's
/// instructions per activation row. Same integer sums, same float operations.
#[inline(always)]
unsafe fn q4k_zmm<const R: usize>(w: &[u8], a: &[ActRow<'_>; R]) -> [f32; R] {
    let nb = w.len() / Q4K_HELD_BYTES;
    let mut acc = [[0f32; LANES]; R];
    let mut group = LaneGroup::new();
    // SAFETY: as `q4k`.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        for b in 0..nb {
            let blk = &w[Q4K_HELD_BYTES * b..Q4K_HELD_BYTES * (b + 1)];
            // Scales as i16 (lanes 0..8), then per run k: sixteen lanes of s_2k, sixteen of s_2k+1.
            let sc16 =
                _mm512_cvtepu8_epi16(_mm256_castsi128_si256(_mm_loadl_epi64(blk.as_ptr().add(4) as *const __m128i)));
            let mins = q4k_mins(blk);
            let mut wv = [_mm512_setzero_si512(); 4];
            let mut sv = [_mm512_setzero_si512(); 4];
            for h in 0..2 {
                let bits = _mm512_loadu_si512(blk.as_ptr().add(Q4K_QS + 64 * h) as *const __m512i);
                wv[2 * h] = _mm512_and_si512(bits, m4);
                wv[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(bits), m4);
            }
            for (k, s) in sv.iter_mut().enumerate() {
                let pick = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_set1_epi16(2 * k as i16)),
                    _mm256_set1_epi16(2 * k as i16 + 1),
                );
                *s = _mm512_permutexvar_epi16(pick, sc16);
            }
            let (d, dmin) = f16_pair(blk.as_ptr());
            let mut iacc = [_mm512_setzero_si512(); R];
            let mut minsum = [_mm256_setzero_si256(); R];
            for r in 0..R {
                let ap = a[r].qs.as_ptr().add(256 * b);
                for k in 0..4 {
                    let av = _mm512_loadu_si512(ap.add(64 * k) as *const __m512i);
                    iacc[r] = _mm512_add_epi32(iacc[r], _mm512_madd_epi16(_mm512_maddubs_epi16(wv[k], av), sv[k]));
                }
                minsum[r] = _mm256_mullo_epi32(q8k_subblock_sums(a[r].sums.as_ptr().add(16 * b)), mins);
            }
            if R == 1 {
                group.push(b, half_sum(iacc[0]), minsum[0], d, dmin);
                if group.full() || b + 1 == nb {
                    group.flush_q4k(a[0].scales);
                }
            } else if R == 4 {
                // Four rows reduced together; the float steps run lane-wise, the same IEEE
                // operations as `q4k_value` per row.
                let isum = _mm_cvtepi32_ps(hsum4_zmm(&iacc));
                let summin = _mm_cvtepi32_ps(hsum4_ymm(&minsum));
                let da = _mm_setr_ps(a[0].scales[b], a[1 % R].scales[b], a[2 % R].scales[b], a[3 % R].scales[b]);
                let v = _mm_sub_ps(
                    _mm_mul_ps(_mm_mul_ps(da, _mm_set1_ps(d)), isum),
                    _mm_mul_ps(_mm_mul_ps(da, _mm_set1_ps(dmin)), summin),
                );
                let mut vs = [0f32; 4];
                _mm_storeu_ps(vs.as_mut_ptr(), v);
                for r in 0..R {
                    acc[r][b % LANES] += vs[r];
                }
            } else {
                for r in 0..R {
                    let (isum, summin) = hsum_pair(iacc[r], minsum[r]);
                    acc[r][b % LANES] += q4k_value(a[r].scales[b], d, dmin, isum, summin);
                }
            }
        }
        if R == 1 {
            acc[0] = group.lanes();
        }
    }
    acc.map(|l| reduce_lanes(&l))
}

/// The 16 lanes of `v` folded to 8 (exact).
#[inline(always)]
unsafe fn half_sum(v: __m512i) -> __m256i {
    // SAFETY: register-only intrinsics.
    unsafe { _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v)) }
}

/// One activation row's K-quant blocks, eight at a time: block b's integer sums wait in slot
/// b % 8 until the group of eight is complete, then the group is reduced in one transpose and its
/// float steps run lane-wise — block b's value lands in lane b % 8, as in the portable path.
struct LaneGroup {
    first: usize,
    len: usize,
    isum: [__m256i; 8],
    summin: [__m256i; 8],
    d: [f32; 8],
    dmin: [f32; 8],
    acc: [f32; LANES],
}

impl LaneGroup {
    #[inline(always)]
    fn new() -> Self {
        // SAFETY: zeroed vectors need no features.
        let zero = unsafe { _mm256_setzero_si256() };
        Self { first: 0, len: 0, isum: [zero; 8], summin: [zero; 8], d: [0.0; 8], dmin: [0.0; 8], acc: [0.0; LANES] }
    }

    #[inline(always)]
    fn push(&mut self, b: usize, isum: __m256i, summin: __m256i, d: f32, dmin: f32) {
        if self.len == 0 {
            self.first = b;
        }
        let slot = b % LANES;
        debug_assert_eq!(slot, self.len, "groups start at multiples of eight");
        (self.isum[slot], self.summin[slot], self.d[slot], self.dmin[slot]) = (isum, summin, d, dmin);
        self.len += 1;
    }

    #[inline(always)]
    fn full(&self) -> bool {
        self.len == LANES
    }

    /// Reduces the pending Q4_K blocks and adds `(da·d)·isum − (da·dmin)·summin` to their lanes.
    #[inline(always)]
    unsafe fn flush_q4k(&mut self, scales: &[f32]) {
        // SAFETY: register and in-bounds masked memory intrinsics; AVX-512 F/VL are the caller's.
        unsafe {
            let mask = self.mask();
            let isum = _mm256_cvtepi32_ps(hsum8(&self.isum));
            let summin = _mm256_cvtepi32_ps(hsum8(&self.summin));
            let da = _mm256_maskz_loadu_ps(mask, scales.as_ptr().add(self.first));
            let d = _mm256_loadu_ps(self.d.as_ptr());
            let dmin = _mm256_loadu_ps(self.dmin.as_ptr());
            let v = _mm256_sub_ps(
                _mm256_mul_ps(_mm256_mul_ps(da, d), isum),
                _mm256_mul_ps(_mm256_mul_ps(da, dmin), summin),
            );
            self.add(mask, v);
        }
    }

    /// Reduces the pending Q6_K blocks and adds `(da·d)·isum` to their lanes.
    #[inline(always)]
    unsafe fn flush_q6k(&mut self, scales: &[f32]) {
        // SAFETY: as `flush_q4k`.
        unsafe {
            let mask = self.mask();
            let isum = _mm256_cvtepi32_ps(hsum8(&self.isum));
            let da = _mm256_maskz_loadu_ps(mask, scales.as_ptr().add(self.first));
            let d = _mm256_loadu_ps(self.d.as_ptr());
            self.add(mask, _mm256_mul_ps(_mm256_mul_ps(da, d), isum));
        }
    }

    #[inline(always)]
    fn mask(&self) -> __mmask8 {
        ((1u16 << self.len) - 1) as __mmask8
    }

    /// Adds `v` to the lanes of the pending blocks only (the others keep their sums untouched).
    #[inline(always)]
    unsafe fn add(&mut self, mask: __mmask8, v: __m256) {
        // SAFETY: register-only intrinsics and an 8-float store into `acc`.
        unsafe {
            let acc = _mm256_loadu_ps(self.acc.as_ptr());
            _mm256_storeu_ps(self.acc.as_mut_ptr(), _mm256_mask_add_ps(acc, mask, acc, v));
        }
        self.len = 0;
    }

    fn lanes(&self) -> [f32; LANES] {
        self.acc
    }
}

/// Lane sums of four 16-lane vectors, as the four lanes of the result (exact).
#[inline(always)]
unsafe fn hsum4_zmm(v: &[__m512i]) -> __m128i {
    // SAFETY: register-only intrinsics.
    unsafe {
        let mut y = [_mm256_setzero_si256(); 4];
        for (y, &x) in y.iter_mut().zip(v) {
            *y = _mm256_add_epi32(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64::<1>(x));
        }
        hsum4_ymm(&y)
    }
}

/// Lane sums of four 8-lane vectors, as the four lanes of the result (exact).
#[inline(always)]
unsafe fn hsum4_ymm(v: &[__m256i]) -> __m128i {
    // SAFETY: register-only intrinsics.
    unsafe {
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
    }
}

/// (Σ lanes of `x`, Σ lanes of `y`) in one reduction (exact).
#[inline(always)]
unsafe fn hsum_pair(x: __m512i, y: __m256i) -> (i32, i32) {
    // SAFETY: register-only intrinsics.
    unsafe {
        let x = _mm256_add_epi32(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64::<1>(x));
        let h = _mm256_hadd_epi32(x, y);
        let h = _mm256_hadd_epi32(h, h);
        let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        (_mm_cvtsi128_si32(s), _mm_extract_epi32::<1>(s))
    }
}

/// The two high bits of each byte's weight, from `qh` shifted by `shifts` (per 16-bit lane), in
/// place as bits 4..6.
#[inline(always)]
unsafe fn q6k_high(qh: __m512i, shifts: __m512i, m3: __m512i) -> __m512i {
    // SAFETY: register-only intrinsics.
    unsafe { _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srlv_epi16(qh, shifts), m3)) }
}

/// Q6_K on 512-bit registers: one register per 64 consecutive weights (four groups of 16), and
/// the −32 offset folded into the integer accumulator.
#[inline(always)]
unsafe fn q6k_zmm<const R: usize>(w: &[u8], a: &[ActRow<'_>; R]) -> [f32; R] {
    let nb = w.len() / 210;
    let mut acc = [[0f32; LANES]; R];
    let mut group = LaneGroup::new();
    // SAFETY: as `q6k`.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let m3 = _mm512_set1_epi8(0x03);
        // Per-half shift counts: the low 256 bits take one pair of `qh` bits, the high 256 the next.
        let shift_0_2 = _mm512_inserti64x4::<1>(_mm512_set1_epi16(0), _mm256_set1_epi16(2));
        let shift_4_6 = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(6));
        for b in 0..nb {
            let blk = &w[210 * b..210 * b + 210];
            let sc_bytes = _mm_loadu_si128(blk.as_ptr().add(192) as *const __m128i);
            // −32·s_g per 16-value run of activations, for the offset.
            let neg32 = _mm512_mullo_epi32(_mm512_cvtepi8_epi32(sc_bytes), _mm512_set1_epi32(-32));
            // Per 64 weights (groups 4k .. 4k + 4), i16 scales in runs of eight lanes.
            let sc_both = _mm256_broadcastsi128_si256(sc_bytes);
            let mut sv = [_mm512_setzero_si512(); 4];
            for (k, s) in sv.iter_mut().enumerate() {
                let g = 4 * k as i8;
                let pick = _mm256_setr_epi8(
                    g,
                    g,
                    g,
                    g,
                    g,
                    g,
                    g,
                    g,
                    g + 1,
                    g + 1,
                    g + 1,
                    g + 1,
                    g + 1,
                    g + 1,
                    g + 1,
                    g + 1,
                    g + 2,
                    g + 2,
                    g + 2,
                    g + 2,
                    g + 2,
                    g + 2,
                    g + 2,
                    g + 2,
                    g + 3,
                    g + 3,
                    g + 3,
                    g + 3,
                    g + 3,
                    g + 3,
                    g + 3,
                    g + 3,
                );
                *s = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(sc_both, pick));
            }
            // The file's layout already suits 512-bit registers: 64 bytes of `ql` hold the low four bits
            // of 128 consecutive weights (low nibble: weight i, high nibble: i + 64), and 32 bytes of `qh`
            // their high two bits (bits 2q..2q+2 of byte i: weight 32q + i) — broadcast to both halves
            // of a register and shifted per half.
            let mut wv = [_mm512_setzero_si512(); 4];
            for half in 0..2 {
                let ql = _mm512_loadu_si512(blk.as_ptr().add(64 * half) as *const __m512i);
                let qh = _mm512_broadcast_i64x4(load(blk.as_ptr().add(128 + 32 * half)));
                wv[2 * half] = _mm512_or_si512(_mm512_and_si512(ql, m4), q6k_high(qh, shift_0_2, m3));
                wv[2 * half + 1] =
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4), q6k_high(qh, shift_4_6, m3));
            }
            let d = f16_pair(blk.as_ptr().add(206)).1; // bytes 206..210: the last two are d
            let mut iacc = [_mm512_setzero_si512(); R];
            for r in 0..R {
                let ap = a[r].qs.as_ptr().add(256 * b);
                let bs = _mm512_loadu_si512(a[r].sums.as_ptr().add(16 * b) as *const __m512i);
                iacc[r] = _mm512_mullo_epi32(bs, neg32);
                for i in 0..4 {
                    let av = _mm512_loadu_si512(ap.add(64 * i) as *const __m512i);
                    iacc[r] = _mm512_add_epi32(iacc[r], _mm512_madd_epi16(_mm512_maddubs_epi16(wv[i], av), sv[i]));
                }
            }
            if R == 1 {
                group.push(b, half_sum(iacc[0]), _mm256_setzero_si256(), d, 0.0);
                if group.full() || b + 1 == nb {
                    group.flush_q6k(a[0].scales);
                }
            } else if R == 4 {
                // As in `q4k_zmm`: lane-wise, the same operations as `q6k_value`.
                let isum = _mm_cvtepi32_ps(hsum4_zmm(&iacc));
                let da = _mm_setr_ps(a[0].scales[b], a[1 % R].scales[b], a[2 % R].scales[b], a[3 % R].scales[b]);
                let mut vs = [0f32; 4];
                _mm_storeu_ps(vs.as_mut_ptr(), _mm_mul_ps(_mm_mul_ps(da, _mm_set1_ps(d)), isum));
                for r in 0..R {
                    acc[r][b % LANES] += vs[r];
                }
            } else {
                for r in 0..R {
                    acc[r][b % LANES] += q6k_value(a[r].scales[b], d, hsum_i32_zmm(iacc[r]));
                }
            }
        }
        if R == 1 {
            acc[0] = group.lanes();
        }
    }
    acc.map(|l| reduce_lanes(&l))
}
