//! Intel AMX kernels for products of many activation rows (prefill, large batches; Linux, x86-64).
//!
//! A tile register holds up to sixteen rows of 64 bytes, and `tdpbsud` multiplies a tile of signed
//! activation bytes (rows × k) by a tile of unsigned weight bytes (k/4 rows of sixteen columns × four
//! bytes) into sixteen columns of i32 per activation row. The weight side is exactly the layout
//! the weights are tiled in (`format.rs`: one 64-byte line holds four consecutive weights of each
//! of sixteen rows), so a line unpacked to bytes is a tile row, and the activations load straight
//! from the quantized rows.
//!
//! K-quant blocks have a scale per group of 32 (Q4_K) or 16 (Q6_K) weights, and a product per
//! group, each stored and multiplied by its scales, costs more than it saves. So each block's
//! weights are multiplied by their group scales first, as the two bytes of each 16-bit product
//! ([`GroupScale`]), once for every tile of activation rows; a block then takes four 64-weight
//! products per half. Q8_0 and Q5_0 have one float scale per 32-weight block: one product each.
//! Every integer sum is exact whichever instructions form it, and the float steps are the VNNI
//! kernels', in their order, so the results are bit-identical to every other path (the tests
//! compare them with the portable path). Preparing the weights is the fixed cost that only whole
//! tiles of rows repay (`matmul.rs` sends fewer rows to the VNNI kernels).
//!
//! The tile state is requested from the kernel once per process ([`granted`]); each call
//! configures the tiles for its row count and releases them when it returns.

use core::arch::asm;
use core::arch::x86_64::*;
use std::sync::OnceLock;

use super::{Lanes, Zmm, check_tiles, prefetch_ahead, store_tile};
use crate::act::ActRow;
use crate::format::{
    Format, Q4K_LINES, Q4K_MINS, Q4K_SCALES, Q5_0_HIGH, Q6K_HIGH, Q6K_LOW, Q6K_SCALES, Q32_LINES, TILE,
};
use crate::scalar::LANES;

/// Activation rows one call takes: the rows of a tile register.
pub(crate) const MAX_ROWS: usize = 16;

/// `arch_prctl` request for permission to use an extended state component, and AMX's tile data.
const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
const XFEATURE_XTILEDATA: libc::c_long = 18;

/// Whether the CPU has AMX-TILE and AMX-INT8 and the kernel granted this process the tile state.
/// Asked once; a refusal (an older kernel, a hypervisor that withholds the state) means no AMX.
pub(crate) fn granted() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        // Leaf 7 is read only where the CPU has it.
        let has_tiles = __cpuid(0).eax >= 7 && __cpuid_count(7, 0).edx & (3 << 24) == 3 << 24;
        // SAFETY: a request about this process's register state; it reads and writes no memory.
        has_tiles && unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) } == 0
    })
}

/// The 64-byte operand of `ldtilecfg` (palette 1).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
    reserved_tail: [u8; 16],
}

impl TileConfig {
    /// tmm0/tmm1: products (`m` rows of sixteen i32); tmm2/tmm3: activations (`m` rows of `k`
    /// bytes); tmm4–tmm7: weights (`k / 4` rows of 64 bytes). Registers are used in pairs,
    /// alternately, so one product overlaps the next one's loads.
    fn new(m: usize, k: usize) -> Self {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
            reserved_tail: [0; 16],
        };
        let shapes = [(64, m), (64, m), (k, m), (k, m), (64, k / 4), (64, k / 4), (64, k / 4), (64, k / 4)];
        for (t, (colsb, rows)) in shapes.into_iter().enumerate() {
            c.colsb[t] = colsb as u16;
            c.rows[t] = rows as u8;
        }
        c
    }
}

#[repr(C, align(64))]
struct Aligned<T>(T);

/// One group's products: `c` (`m` rows of sixteen i32, 64 bytes apart) = the activation tile at
/// `a` (`m` rows of k bytes, `a_stride` apart) times the weight tile at `w` (k/4 lines of 64 bytes).
/// `even` picks the pair of tile registers.
///
/// Safety: tiles configured by [`TileConfig::new`] for this m and k; the memory at `a`, `w` and
/// `c` spans those rows.
#[inline(always)]
unsafe fn group_product(even: bool, a: *const i8, a_stride: usize, w: *const u8, c: *mut i32) {
    // SAFETY: the caller's contract; tile instructions touch only the memory named here.
    unsafe {
        if even {
            asm!(
                "tilezero tmm0",
                "tileloadd tmm2, [{a} + {sa}*1]",
                "tileloadd tmm4, [{w} + {line}*1]",
                "tdpbsud tmm0, tmm2, tmm4",
                "tilestored [{c} + {line}*1], tmm0",
                a = in(reg) a, sa = in(reg) a_stride, w = in(reg) w, line = in(reg) 64usize, c = in(reg) c,
                options(nostack),
            );
        } else {
            asm!(
                "tilezero tmm1",
                "tileloadd tmm3, [{a} + {sa}*1]",
                "tileloadd tmm5, [{w} + {line}*1]",
                "tdpbsud tmm1, tmm3, tmm5",
                "tilestored [{c} + {line}*1], tmm1",
                a = in(reg) a, sa = in(reg) a_stride, w = in(reg) w, line = in(reg) 64usize, c = in(reg) c,
                options(nostack),
            );
        }
    }
}

/// One 64-weight chunk of a K-quant block, both halves of its scaled weights (see
/// [`GroupScale`]): tmm0 += activations × low bytes (unsigned), tmm1 += activations × high bytes
/// (signed where `SIGNED_HIGH`). `even` picks the registers for the activations and weights.
///
/// Safety: tiles configured by [`TileConfig::new`] for this m and k = 64; the memory at `a`
/// (`m` rows of 64 bytes, `a_stride` apart), `low` and `high` (16 lines of 64 bytes each) exists.
#[inline(always)]
unsafe fn chunk_product<const SIGNED_HIGH: bool>(
    even: bool,
    a: *const i8,
    a_stride: usize,
    low: *const u8,
    high: *const u8,
) {
    macro_rules! product {
        ($a:literal, $l:literal, $h:literal, $high_op:literal) => {
            asm!(
                concat!("tileloadd ", $a, ", [{a} + {sa}*1]"),
                concat!("tileloadd ", $l, ", [{l} + {line}*1]"),
                concat!("tileloadd ", $h, ", [{h} + {line}*1]"),
                concat!("tdpbsud tmm0, ", $a, ", ", $l),
                concat!($high_op, " tmm1, ", $a, ", ", $h),
                a = in(reg) a, sa = in(reg) a_stride, l = in(reg) low, h = in(reg) high, line = in(reg) 64usize,
                options(nostack, readonly),
            )
        };
    }
    // SAFETY: the caller's contract; tile loads read only the memory named here.
    unsafe {
        match (even, SIGNED_HIGH) {
            (true, false) => product!("tmm2", "tmm4", "tmm5", "tdpbsud"),
            (false, false) => product!("tmm3", "tmm6", "tmm7", "tdpbsud"),
            (true, true) => product!("tmm2", "tmm4", "tmm5", "tdpbssd"),
            (false, true) => product!("tmm3", "tmm6", "tmm7", "tdpbssd"),
        }
    }
}

/// Per-row scales of one group, the multiplier operands that fold them into the group's weight
/// bytes as two halves, `s·q = 2^HIGH_SHIFT·high + low`, both halves bytes: then one tile product
/// covers 64 weights whatever the group size, instead of a product and a multiply per group.
trait GroupScale: Copy {
    /// What the high half's sums are multiplied by.
    const HIGH_SHIFT: u32;
    /// Whether the high half is signed (`tdpbssd`) rather than unsigned (`tdpbsud`).
    const SIGNED_HIGH: bool;
    /// Group 2p's scales (`HIGH` false) or 2p + 1's from a pair vector as `widen_u8` / `widen_i8`
    /// load them (lane o: group 2p's scale in its low i16, 2p + 1's in its high one).
    unsafe fn new<const HIGH: bool>(pairs: Zmm) -> Self;
    /// The two halves of every weight byte `q` of `u` times its row's scale.
    unsafe fn scale(self, u: Zmm) -> (Zmm, Zmm);
}

/// The group's scale in both 16-bit halves of its row's lane.
#[inline(always)]
unsafe fn scale_words<const HIGH: bool>(pairs: Zmm) -> __m512i {
    // SAFETY: register arithmetic; AVX-512 F is the caller's.
    unsafe {
        let half =
            if HIGH { _mm512_srli_epi32::<16>(pairs.0) } else { _mm512_and_si512(pairs.0, _mm512_set1_epi32(0xFFFF)) };
        _mm512_or_si512(half, _mm512_slli_epi32::<16>(half))
    }
}

/// Q4_K (s < 64, q < 16): `s = 16·s_high + s_low`, and `q·s_low < 256`, `q·s_high < 64` are each
/// one 16-bit multiply of both bytes of a lane at once, with no carry between them.
#[derive(Clone, Copy)]
struct Q4kScale {
    low: __m512i,
    high: __m512i,
}

impl GroupScale for Q4kScale {
    const HIGH_SHIFT: u32 = 4;
    const SIGNED_HIGH: bool = false;
    #[inline(always)]
    unsafe fn new<const HIGH: bool>(pairs: Zmm) -> Self {
        // SAFETY: register arithmetic; AVX-512 F/BW are the caller's.
        unsafe {
            let words = scale_words::<HIGH>(pairs);
            let nibble = _mm512_set1_epi16(0x0F);
            Q4kScale { low: _mm512_and_si512(words, nibble), high: _mm512_srli_epi16::<4>(words) }
        }
    }
    #[inline(always)]
    unsafe fn scale(self, u: Zmm) -> (Zmm, Zmm) {
        // SAFETY: register arithmetic; AVX-512 BW is the caller's.
        unsafe { (Zmm(_mm512_mullo_epi16(u.0, self.low)), Zmm(_mm512_mullo_epi16(u.0, self.high))) }
    }
}

/// Q6_K (|s| ≤ 128, q < 64): the low and high byte of the 16-bit product, unsigned and signed.
/// Each byte's product comes from a multiply-add against `(s, 0)` / `(0, s)`, and the bytes are
/// put back in place with in-lane shuffles and blends (no shifts: they share the multiplies' port).
#[derive(Clone, Copy)]
struct Q6kScale {
    even: __m512i,
    odd: __m512i,
}

impl GroupScale for Q6kScale {
    const HIGH_SHIFT: u32 = 8;
    const SIGNED_HIGH: bool = true;
    #[inline(always)]
    unsafe fn new<const HIGH: bool>(pairs: Zmm) -> Self {
        // SAFETY: register arithmetic; AVX-512 F/BW are the caller's.
        unsafe {
            let even = _mm512_and_si512(scale_words::<HIGH>(pairs), _mm512_set1_epi16(0xFF));
            Q6kScale { even, odd: _mm512_slli_epi16::<8>(even) }
        }
    }
    #[inline(always)]
    unsafe fn scale(self, u: Zmm) -> (Zmm, Zmm) {
        // SAFETY: register arithmetic; AVX-512 BW is the caller's.
        unsafe {
            // 16-bit lanes: the lane's even (odd) byte times s.
            let pe = _mm512_maddubs_epi16(u.0, self.even);
            let po = _mm512_maddubs_epi16(u.0, self.odd);
            const ODD_BYTES: u64 = 0xAAAA_AAAA_AAAA_AAAA;
            // Each lane's low byte moved up, and its high byte moved down (0x80: a zero byte).
            let up = _mm512_loadu_si512(MOVE_UP.as_ptr() as *const __m512i);
            let down = _mm512_loadu_si512(MOVE_DOWN.as_ptr() as *const __m512i);
            let low = _mm512_mask_blend_epi8(ODD_BYTES, pe, _mm512_shuffle_epi8(po, up));
            let high = _mm512_mask_blend_epi8(ODD_BYTES, _mm512_shuffle_epi8(pe, down), po);
            (Zmm(low), Zmm(high))
        }
    }
}

/// `vpshufb` indices (within each 16-byte lane) that move every 16-bit lane's low byte up to
/// its high byte (`up`), or its high byte down to its low byte, and zero the other byte (0x80).
const fn byte_moves(up: bool) -> [u8; 64] {
    let mut idx = [0x80u8; 64];
    let mut i = 0;
    while i < 64 {
        let (at, odd) = ((i % 16) as u8, i % 2 == 1);
        if up && odd {
            idx[i] = at - 1;
        } else if !up && !odd {
            idx[i] = at + 1;
        }
        i += 1;
    }
    idx
}

static MOVE_UP: [u8; 64] = byte_moves(true);
static MOVE_DOWN: [u8; 64] = byte_moves(false);

/// The tiles of one format (`stripes`: whole tiles of `stripe_bytes`, covering `n` weight rows)
/// against the activation rows `a`, whose values are `qs`, row after row: (weight row i,
/// activation row j) goes to `out[j][i]`, with the bits of every other path. The rows are taken
/// [`MAX_ROWS`] at a time (fewer only when there are fewer in all), and each block's weights are
/// made tile operands once for all of them.
///
/// Safety: the CPU has AVX-512 F/BW/VL/VNNI, F16C, AMX-TILE and AMX-INT8, and [`granted`]
/// returned true.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn tiles_amx(
    format: Format,
    stripes: &[u8],
    stripe_bytes: usize,
    n: usize,
    qs: &[i8],
    a: &[ActRow<'_>],
    out: &mut [&mut [f32]],
) {
    let m = a.len();
    assert!(m > 0 && (m <= MAX_ROWS || m.is_multiple_of(MAX_ROWS)), "whole tiles of activation rows");
    let nb = check_tiles(format, stripes, stripe_bytes, n, a, out);
    let k_row = nb * format.block_len();
    // The activation tiles read `qs` with a stride of one row: the rows must be its rows.
    assert_eq!(qs.len(), m * k_row, "activation values");
    for (r, row) in a.iter().enumerate() {
        assert!(core::ptr::eq(row.qs.as_ptr(), qs[r * k_row..].as_ptr()), "activation rows are the rows of qs");
    }
    // SAFETY: shapes checked above; the features and the tile permission are the caller's.
    unsafe {
        match format {
            Format::Q4K => k_quant_tiles::<Q4kScale>(format, stripes, stripe_bytes, n, nb, qs, a, out),
            Format::Q6K => k_quant_tiles::<Q6kScale>(format, stripes, stripe_bytes, n, nb, qs, a, out),
            Format::Q8_0 | Format::Q5_0 => q32_tiles(format, stripes, stripe_bytes, n, nb, qs, a, out),
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// Q4_K and Q6_K: per block, the sixteen weight rows times their group scales as the two bytes
/// of each product ([`GroupScale`]); per tile of activation rows, four 64-weight chunks of each
/// half and the exact block sum `2^HIGH_SHIFT·high + low` per (activation row, weight row); then
/// the VNNI kernels' float steps.
///
/// Safety: as [`tiles_amx`], whose checks cover every access.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn k_quant_tiles<S: GroupScale>(
    format: Format,
    stripes: &[u8],
    stripe_bytes: usize,
    n: usize,
    nb: usize,
    qs: &[i8],
    a: &[ActRow<'_>],
    out: &mut [&mut [f32]],
) {
    let (m, k_row, tb) = (a.len(), nb * 256, format.tile_block_bytes());
    let rows = m.min(MAX_ROWS);
    let cfg = TileConfig::new(rows, 64);
    // The block's scaled lines (low and high bytes), and two tiles' worth of products (each
    // tile's low and high halves), used alternately so one tile's float steps overlap the next
    // tile's products.
    let mut low = Aligned([0u8; 64 * 64]);
    let mut high = Aligned([0u8; 64 * 64]);
    let mut sums = Aligned([[[[0i32; TILE]; MAX_ROWS]; 2]; 2]);
    // SAFETY: a register zero; AVX-512 F is the caller's.
    let mut acc = vec![[unsafe { Zmm::fzero() }; LANES]; m];
    // SAFETY: each stripe holds nb tile blocks of `tb` bytes; rows hold nb·256 values, nb scales
    // and the pair sums (checked by the caller); every tile load reads `rows` rows of 64 values
    // inside `qs`, or 16 lines of `low` / `high`; the stores fill `sums`.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        let (m4, m30) = (Zmm::splat8(0x0F), Zmm::splat8(0x30));
        let (lp, hp) = (low.0.as_mut_ptr(), high.0.as_mut_ptr());
        for (t, stripe) in stripes.chunks_exact(stripe_bytes).enumerate() {
            for b in 0..nb {
                let tp = stripe.as_ptr().add(b * tb);
                let put = |quad: usize, u: Zmm, scale: S| {
                    let (l, h) = scale.scale(u);
                    _mm512_store_si512(lp.add(64 * quad) as *mut __m512i, l.0);
                    _mm512_store_si512(hp.add(64 * quad) as *mut __m512i, h.0);
                };
                // Line `quad` holds the block's weights 4·quad ..+4 of every row (unpacked as
                // `q4k_tile` and `q6k_tile` unpack them into registers).
                if format == Format::Q4K {
                    for p in 0..4 {
                        prefetch_ahead(tp, tb, p, 4);
                        let sc = Zmm::widen_u8(tp.add(Q4K_SCALES + 32 * p));
                        for (half, scale) in [S::new::<false>(sc), S::new::<true>(sc)].into_iter().enumerate() {
                            let j = 2 * p + half;
                            for q in 0..4 {
                                let line = Zmm::load(tp.add(Q4K_LINES + 64 * (4 * j + q)));
                                put(8 * j + q, line.and(m4), scale);
                                put(8 * j + 4 + q, line.shr16_4().and(m4), scale);
                            }
                        }
                    }
                } else {
                    for p in 0..8 {
                        prefetch_ahead(tp, tb, p, 8);
                        let sc = Zmm::widen_i8(tp.add(Q6K_SCALES + 32 * p));
                        for (half, scale) in [S::new::<false>(sc), S::new::<true>(sc)].into_iter().enumerate() {
                            let g = 2 * p + half;
                            let l0 = Zmm::load(tp.add(Q6K_LOW + 64 * (2 * g)));
                            let l1 = Zmm::load(tp.add(Q6K_LOW + 64 * (2 * g + 1)));
                            let h = Zmm::load(tp.add(Q6K_HIGH + 64 * g));
                            put(4 * g, l0.and(m4).or(h.shl16_4().and(m30)), scale);
                            put(4 * g + 1, l0.shr16_4().and(m4).or(h.shl16_2().and(m30)), scale);
                            put(4 * g + 2, l1.and(m4).or(h.and(m30)), scale);
                            put(4 * g + 3, l1.shr16_4().and(m4).or(h.shr16_2().and(m30)), scale);
                        }
                    }
                }
                // Per tile of activation rows: the exact sums Σ s·(q·a) as two halves, tmm0 (low
                // bytes) and tmm1 (high bytes), then the float steps.
                for (tile, r0) in (0..m).step_by(rows).enumerate() {
                    asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
                    for c in 0..4 {
                        let a_at = qs.as_ptr().add(r0 * k_row + 256 * b + 64 * c);
                        let (l, h) = (lp.add(1024 * c), hp.add(1024 * c));
                        if S::SIGNED_HIGH {
                            chunk_product::<true>(c % 2 == 0, a_at, k_row, l, h);
                        } else {
                            chunk_product::<false>(c % 2 == 0, a_at, k_row, l, h);
                        }
                    }
                    let [low_sums, high_sums] = &mut sums.0[tile % 2];
                    asm!(
                        "tilestored [{l} + {line}*1], tmm0",
                        "tilestored [{h} + {line}*1], tmm1",
                        l = in(reg) low_sums.as_mut_ptr(), h = in(reg) high_sums.as_mut_ptr(), line = in(reg) 64usize,
                        options(nostack),
                    );
                    let isum = |r: usize| {
                        let l = Zmm::load(low_sums[r].as_ptr() as *const u8);
                        let h = Zmm::load(high_sums[r].as_ptr() as *const u8);
                        l.add(Zmm(_mm512_sll_epi32(h.0, _mm_cvtsi32_si128(S::HIGH_SHIFT as i32))))
                    };
                    if format == Format::Q4K {
                        let (d, dmin) = (Zmm::f16s(tp), Zmm::f16s(tp.add(32)));
                        let mins: [Zmm; 4] = core::array::from_fn(|p| Zmm::widen_u8(tp.add(Q4K_MINS + 32 * p)));
                        for r in 0..rows {
                            let mut summin = Zmm::zero();
                            for (p, mins) in mins.iter().enumerate() {
                                summin = summin.dot2(*mins, a[r0 + r].pairs32[4 * b + p] as i32);
                            }
                            let da = Zmm::fsplat(a[r0 + r].scales[b]);
                            let v = Zmm::fsub(
                                Zmm::fmul(Zmm::fmul(da, d), isum(r).to_f()),
                                Zmm::fmul(Zmm::fmul(da, dmin), summin.to_f()),
                            );
                            acc[r0 + r][b % LANES] = Zmm::fadd(acc[r0 + r][b % LANES], v);
                        }
                    } else {
                        let d = Zmm::f16s(tp);
                        let sc: [Zmm; 8] = core::array::from_fn(|p| Zmm::widen_i8(tp.add(Q6K_SCALES + 32 * p)));
                        for r in 0..rows {
                            let mut offset = Zmm::zero();
                            for (p, sc) in sc.iter().enumerate() {
                                offset = offset.dot2(*sc, a[r0 + r].pairs16[8 * b + p] as i32);
                            }
                            let da = Zmm::fsplat(a[r0 + r].scales[b]);
                            let v = Zmm::fmul(Zmm::fmul(da, d), isum(r).sub(offset.times32()).to_f());
                            acc[r0 + r][b % LANES] = Zmm::fadd(acc[r0 + r][b % LANES], v);
                        }
                    }
                }
            }
            for (o, acc) in out.iter_mut().zip(&mut acc) {
                store_tile::<Zmm>(acc, o, t, n);
                *acc = [Zmm::fzero(); LANES];
            }
        }
    }
}

/// Q8_0 and Q5_0: per tile of activation rows, one product per 32-weight block (its one scale
/// is a float), then the VNNI kernels' float steps.
///
/// Safety: as [`tiles_amx`], whose checks cover every access.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn q32_tiles(
    format: Format,
    stripes: &[u8],
    stripe_bytes: usize,
    n: usize,
    nb: usize,
    qs: &[i8],
    a: &[ActRow<'_>],
    out: &mut [&mut [f32]],
) {
    let (m, k_row, tb) = (a.len(), nb * 32, format.tile_block_bytes());
    let rows = m.min(MAX_ROWS);
    let cfg = TileConfig::new(rows, 32);
    let mut lines = Aligned([0u8; 8 * 64]);
    let mut products = Aligned([[[0i32; TILE]; MAX_ROWS]; 2]);
    // SAFETY: a register zero; AVX-512 F is the caller's.
    let mut acc = vec![[unsafe { Zmm::fzero() }; LANES]; m];
    // Q8_0 is held as q + 128, Q5_0 as q + 16: unsigned bytes, the offset taken out through the
    // activations' block sum.
    let offset = if format == Format::Q5_0 { 16 } else { 128 };
    // SAFETY: each stripe holds nb tile blocks of `tb` bytes; rows hold nb·32 values, nb scales
    // and nb sums (checked by the caller); every tile load reads `rows` rows of 32 values inside
    // `qs`, or 8 lines of the block or of `lines`; the stores fill `products`.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        let (m4, m10) = (Zmm::splat8(0x0F), Zmm::splat8(0x10));
        let lp = lines.0.as_mut_ptr();
        for (t, stripe) in stripes.chunks_exact(stripe_bytes).enumerate() {
            for b in 0..nb {
                let tp = stripe.as_ptr().add(b * tb);
                prefetch_ahead(tp, tb, 0, 1);
                let weights = if format == Format::Q8_0 {
                    tp.add(Q32_LINES)
                } else {
                    // As `q32_tile` unpacks them: line q holds weights 4q ..+4 of every row.
                    let h = Zmm::load(tp.add(Q5_0_HIGH));
                    let h_odd = h.shr16_1();
                    for q in 0..4 {
                        let fifth = |h: Zmm| match q {
                            0 => h.shl16_4(),
                            1 => h.shl16_2(),
                            2 => h,
                            _ => h.shr16_2(),
                        };
                        let line = Zmm::load(tp.add(Q32_LINES + 64 * q));
                        _mm512_store_si512(lp.add(64 * q) as *mut __m512i, line.and(m4).or(fifth(h).and(m10)).0);
                        let upper = line.shr16_4().and(m4).or(fifth(h_odd).and(m10));
                        _mm512_store_si512(lp.add(64 * (4 + q)) as *mut __m512i, upper.0);
                    }
                    lp as *const u8
                };
                let d = Zmm::f16s(tp);
                for (tile, r0) in (0..m).step_by(rows).enumerate() {
                    let pp = products.0[tile % 2].as_mut_ptr() as *mut i32;
                    group_product(tile % 2 == 0, qs.as_ptr().add(r0 * k_row + 32 * b), k_row, weights, pp);
                    for r in 0..rows {
                        let row = &a[r0 + r];
                        let isum = Zmm::load(pp.add(16 * r) as *const u8).sub(Zmm::splat32(offset * row.sums[b]));
                        let v = Zmm::fmul(Zmm::fmul(d, Zmm::fsplat(row.scales[b])), isum.to_f());
                        acc[r0 + r][b % LANES] = Zmm::fadd(acc[r0 + r][b % LANES], v);
                    }
                }
            }
            for (o, acc) in out.iter_mut().zip(&mut acc) {
                store_tile::<Zmm>(acc, o, t, n);
                *acc = [Zmm::fzero(); LANES];
            }
        }
    }
}
