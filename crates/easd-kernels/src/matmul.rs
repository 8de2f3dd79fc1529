//! Quantized weight matrices and their products with f32 activations, for any number of rows.
//!
//! The work is split over output columns (weight rows); each output value is one call of the
//! row kernel on (weight row, activation row), whose arithmetic does not depend on how many rows
//! are computed together or on the split — the batch-invariance contract.

use crate::KernelError;
use crate::act::{ActRow, QuantizedActs};
use crate::format::{ActFormat, Format, TILE, dequantize_tile_row};
use crate::isa::Isa;
use crate::pool::pool;
use crate::scalar;

/// Activation rows from which the AMX kernels beat the VNNI ones: a whole tile of them
/// (`examples/kernels`: below it, preparing the weights as tile operands costs more than the
/// tile products save).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
const AMX_MIN_ROWS: usize = crate::x86::amx::MAX_ROWS;

/// Weight bytes of one work unit: small enough to stay in L2 while every activation tile passes.
const UNIT_BYTES: usize = 256 << 10;

/// A `rows × cols` weight matrix in one GGML block format, held in stripes of one tile of [`TILE`]
/// interleaved rows each (see `format.rs`).
#[derive(Clone)]
pub struct QMatrix {
    format: Format,
    rows: usize,
    cols: usize,
    /// Bytes of one stripe: the tile blocks of [`TILE`] rows.
    stripe_bytes: usize,
    data: Vec<u8>,
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QMatrix({:?}, {} × {})", self.format, self.rows, self.cols)
    }
}

impl QMatrix {
    /// Tiles the raw GGML blocks of a `rows × cols` tensor (GGUF order: row after row; see
    /// `format.rs`). Borrowed: a loader can read every tensor into one reused buffer.
    pub fn new(format: Format, rows: usize, cols: usize, data: &[u8]) -> Result<Self, KernelError> {
        let file_row_bytes = format.row_bytes(cols)?;
        if data.len() != rows * file_row_bytes {
            return Err(KernelError::DataLength {
                format,
                rows,
                cols,
                expected: rows * file_row_bytes,
                actual: data.len(),
            });
        }
        let nb = cols / format.block_len();
        let stripe_bytes = nb * format.tile_block_bytes();
        let mut held = vec![0u8; rows.div_ceil(TILE) * stripe_bytes];
        let bb = format.block_bytes();
        // Stripes are independent: tiled in parallel (loading the target tiles ~1 GB).
        pool().for_each_item(held.chunks_mut(stripe_bytes).collect(), &|s, stripe| {
            let first = s * TILE;
            for (b, out) in stripe.chunks_exact_mut(format.tile_block_bytes()).enumerate() {
                let blocks: [Option<&[u8]>; TILE] = std::array::from_fn(|o| {
                    let r = first + o;
                    (r < rows).then(|| &data[r * file_row_bytes + b * bb..r * file_row_bytes + (b + 1) * bb])
                });
                format.tile_block(&blocks, out);
            }
        });
        Ok(Self { format, rows, cols, stripe_bytes, data: held })
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `r` as f32 (an embedding lookup); `out.len()` must be `cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if r >= self.rows {
            return Err(KernelError::RowOutOfRange { row: r, rows: self.rows });
        }
        assert_eq!(out.len(), self.cols, "output row length");
        let n = self.format.block_len();
        let stripe = &self.data[r / TILE * self.stripe_bytes..][..self.stripe_bytes];
        for (t, o) in stripe.chunks_exact(self.format.tile_block_bytes()).zip(out.chunks_exact_mut(n)) {
            dequantize_tile_row(self.format, t, r % TILE, o);
        }
        Ok(())
    }
}

/// `x · Wᵀ` for each weight, all sharing the input (one quantization of it, one parallel
/// region): `x` is `m × cols` row-major; result `i` is `m × ws[i].rows()` row-major.
/// Uses [`Isa::active`].
pub fn matmul(ws: &[&QMatrix], x: &[f32], m: usize) -> Result<Vec<Vec<f32>>, KernelError> {
    matmul_with(Isa::active(), ws, x, m)
}

/// [`matmul`] on a chosen path (tests and benchmarks compare paths).
pub fn matmul_with(isa: Isa, ws: &[&QMatrix], x: &[f32], m: usize) -> Result<Vec<Vec<f32>>, KernelError> {
    if !isa.available() {
        return Err(KernelError::IsaUnavailable(isa));
    }
    let Some(cols) = ws.first().map(|w| w.cols) else { return Ok(Vec::new()) };
    if let Some(w) = ws.iter().find(|w| w.cols != cols) {
        return Err(KernelError::Shape { expected: cols, actual: w.cols });
    }
    if x.len() != m * cols {
        return Err(KernelError::InputLength { rows: m, cols, actual: x.len() });
    }
    let mut q8k = None;
    let mut q8x32 = None;
    for w in ws {
        match w.format.act_format() {
            ActFormat::Q8K => q8k.get_or_insert_with(|| QuantizedActs::new_with(isa, ActFormat::Q8K, x, m, cols)),
            ActFormat::Q8x32 => q8x32.get_or_insert_with(|| QuantizedActs::new_with(isa, ActFormat::Q8x32, x, m, cols)),
        };
    }
    let threads = pool().threads();
    // Each unit owns, in every activation row's output, the span of its weight rows.
    let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; m * w.rows]).collect();
    let mut units: Vec<Unit<'_>> = Vec::new();
    for (w, out) in ws.iter().zip(outs.iter_mut()) {
        let acts = match w.format.act_format() {
            ActFormat::Q8K => q8k.as_ref(),
            ActFormat::Q8x32 => q8x32.as_ref(),
        }
        .expect("quantized above");
        let stripes = w.rows.div_ceil(TILE);
        let per_unit = stripes.div_ceil(4 * threads).clamp(1, (UNIT_BYTES / w.stripe_bytes).max(1));
        let mut spans: Vec<_> = out.chunks_mut(w.rows).map(|row| row.chunks_mut(per_unit * TILE)).collect();
        for u in 0..stripes.div_ceil(per_unit) {
            let parts: Vec<&mut [f32]> = spans.iter_mut().map(|s| s.next().expect("one span per unit")).collect();
            units.push((*w, acts, u * per_unit, parts));
        }
    }
    pool().for_each_item(units, &|_, (w, acts, first, mut out)| run_unit(isa, w, acts, first, &mut out));
    Ok(outs)
}

/// A work unit: the weight, its quantized activations, its first stripe, and the outputs it owns
/// (one span of weight rows per activation row).
type Unit<'a> = (&'a QMatrix, &'a QuantizedActs, usize, Vec<&'a mut [f32]>);

/// Stripes `first..` (as many as cover the weight rows of `out`'s spans) against every activation
/// row, tile of activation rows by tile; `out[j]` is activation row j's span.
fn run_unit(isa: Isa, w: &QMatrix, acts: &QuantizedActs, first: usize, out: &mut [&mut [f32]]) {
    let m = acts.rows();
    let n = out.first().map_or(0, |o| o.len());
    let stripes = &w.data[first * w.stripe_bytes..(first + n.div_ceil(TILE)) * w.stripe_bytes];
    // Activation rows per kernel call: each unpacked weight line serves up to eight, or up to
    // sixteen in AMX tiles.
    let mut r = 0;
    while r < m {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if isa == Isa::Amx && m - r >= AMX_MIN_ROWS {
            use crate::x86::amx;
            // Whole tiles of rows in one call: each block's weights are prepared once for all.
            let t = (m - r) / amx::MAX_ROWS * amx::MAX_ROWS;
            let a: Vec<ActRow<'_>> = (r..r + t).map(|i| acts.row(i)).collect();
            let qs = &acts.qs[r * acts.cols..(r + t) * acts.cols];
            // SAFETY: `matmul_with` checked that the CPU has the path's features and the tile state.
            unsafe { amx::tiles_amx(w.format, stripes, w.stripe_bytes, n, qs, &a, &mut out[r..r + t]) };
            r += t;
            continue;
        }
        // Fewer rows than AMX pays for take the VNNI kernels (the same bits).
        let isa = if isa == Isa::Amx { Isa::Avx512Vnni } else { isa };
        let t = (m - r).min(8);
        let dst = &mut out[r..r + t];
        match t {
            1 => tile::<1>(isa, w, stripes, n, acts, r, dst),
            2 => tile::<2>(isa, w, stripes, n, acts, r, dst),
            3 => tile::<3>(isa, w, stripes, n, acts, r, dst),
            4 => tile::<4>(isa, w, stripes, n, acts, r, dst),
            5 => tile::<5>(isa, w, stripes, n, acts, r, dst),
            6 => tile::<6>(isa, w, stripes, n, acts, r, dst),
            7 => tile::<7>(isa, w, stripes, n, acts, r, dst),
            _ => tile::<8>(isa, w, stripes, n, acts, r, dst),
        }
        r += t;
    }
}

/// Activation rows `r0..r0 + R` against the `n` weight rows held in `stripes`; (weight row i,
/// activation row r0 + j) goes to `out[j][i]`.
fn tile<const R: usize>(
    isa: Isa,
    w: &QMatrix,
    stripes: &[u8],
    n: usize,
    acts: &QuantizedActs,
    r0: usize,
    out: &mut [&mut [f32]],
) {
    let a: [ActRow<'_>; R] = std::array::from_fn(|i| acts.row(r0 + i));
    let sb = w.stripe_bytes;
    match isa {
        // SAFETY: `matmul_with` checked that the CPU has the path's features.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { crate::x86::tiles_avx2::<R>(w.format, stripes, sb, n, &a, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { crate::x86::tiles_vnni::<R>(w.format, stripes, sb, n, &a, out) },
        _ => {
            for (t, stripe) in stripes.chunks_exact(sb).enumerate() {
                for o in 0..TILE.min(n - TILE * t) {
                    for (j, act) in a.iter().enumerate() {
                        out[j][TILE * t + o] = scalar::dot_tile_row(w.format, stripe, o, *act);
                    }
                }
            }
        }
    }
}
