//! CPU kernels for the model runtime: products of GGML-quantized weights (Q4_K, Q6_K, Q8_0,
//! Q5_0) with f32 activations for any number of rows, and causal attention over a KV cache.
//!
//! **Batch invariance is the contract.** A row's result is bitwise the same whether it is
//! computed alone, in a block of rows, or beside other sessions' rows, and on every instruction
//! set path (AVX-512 VNNI, AVX2, portable): every reduction runs in one fixed order that depends
//! only on the row's own data. How: activations are quantized once per row (ggml's Q8_K / a
//! 32-block Q8 with f32 scales), each block's dot product is an exact integer sum, and the few
//! float operations that combine blocks are the same scalar operations on every path
//! (`scalar.rs` documents the order). Greedy speculative decoding then equals greedy target
//! decoding token for token, and a session rebuilt on another replica equals the undisturbed one.
//!
//! This is the only crate of the workspace with `unsafe`: SIMD intrinsics in `x86.rs`, behind
//! the safe [`matmul`] and [`attention`], chosen at run time ([`Isa::active`]).

mod act;
mod attention;
mod elementwise;
mod format;
mod isa;
mod matmul;
mod pool;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use act::QuantizedActs;
pub use attention::{AttentionShape, attention};
pub use elementwise::{add_assign, add_bias_rows, rms_norm_rows, rope_rows, silu_mul};
pub use format::{ActFormat, Format};
pub use isa::Isa;
pub use matmul::{QMatrix, matmul, matmul_with};
pub use pool::{set_threads, threads};

/// What a kernel call can refuse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    #[error("{format:?} rows need a multiple of {block} columns, got {cols}")]
    Columns { format: Format, cols: usize, block: usize },
    #[error("{format:?} {rows} × {cols} needs {expected} bytes, got {actual}")]
    DataLength { format: Format, rows: usize, cols: usize, expected: usize, actual: usize },
    #[error("weights sharing one input must have the same columns: {expected} vs {actual}")]
    Shape { expected: usize, actual: usize },
    #[error("input of {actual} values is not {rows} rows × {cols} columns")]
    InputLength { rows: usize, cols: usize, actual: usize },
    #[error("row {row} out of range (matrix has {rows})")]
    RowOutOfRange { row: usize, rows: usize },
    #[error("this CPU cannot run the {0:?} kernels")]
    IsaUnavailable(Isa),
    #[error("kernel threads already set to {current}; cannot change to {requested}")]
    ThreadsAlreadySet { current: usize, requested: usize },
}
