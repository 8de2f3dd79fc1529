//! Reading weights out of a GGUF file into the decoder's blocks. Weight names live only here.
//!
//! On the CPU every projection runs on the project's own kernels (`easd-kernels`: Q4_K, Q6_K,
//! Q8_0 and Q5_0 natively, batch-invariant). A tensor in any other format (Q5_1, Q4_1, F16, …) is
//! converted to Q8_0 at load — finer than those formats, so the error added is tiny. With
//! `requantize` on, Q5_0 is converted too (more memory, slightly less work per weight). On other
//! devices the weights stay as stored and candle's kernels run them.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, tensor_bytes};
use crate::head::HeadVocab;
use crate::layers::{Attention, Block, Embedding, Linear, Mlp, RmsNorm, Weight};
use candle_core::quantized::gguf_file::TensorInfo;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Tensor};
use easd_kernels::{Format, QMatrix};
use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;

/// What the loader did, for logs and the benchmark.
#[derive(Clone, Debug, Default)]
pub struct LoadStats {
    /// Tensors converted to Q8_0 for the CPU kernels, and their element count.
    pub requantized_tensors: usize,
    pub requantized_elements: usize,
    /// Bytes of weights held by the CPU kernels (0 on other devices).
    pub kernel_bytes: usize,
}

pub(crate) struct Weights {
    pub embed: Embedding,
    pub blocks: Vec<Block>,
    pub norm: RmsNorm,
    pub lm_head: Linear,
    pub vocab_size: usize,
    /// The ids the head scores, when it scores only some ([`HeadVocab`]); on the CPU `lm_head` has one row per id.
    pub head_ids: Option<Vec<u32>>,
    pub stats: LoadStats,
}

struct Loader<'a> {
    file: &'a mut GgufFile,
    device: &'a Device,
    requantize: bool,
    stats: LoadStats,
    /// The file's bytes of the tensor being tiled. One buffer for all of them: reading each tensor into fresh
    /// memory (and candle's copies of it) made the OS zero and fault in several times the model's size.
    raw: Vec<u8>,
}

impl Loader<'_> {
    fn has(&self, name: &str) -> bool {
        self.file.content.tensor_infos.contains_key(name)
    }

    /// The tensor's entry, checked against the shape the architecture expects.
    fn info(&self, name: &str, expected: &[usize]) -> Result<&TensorInfo> {
        let info = self.file.content.tensor_infos.get(name).ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        if info.shape.dims() != expected {
            return Err(Error::TensorShape {
                name: name.to_string(),
                actual: info.shape.dims().to_vec(),
                expected: expected.to_vec(),
            });
        }
        Ok(info)
    }

    fn qtensor(&mut self, name: &str, expected: &[usize]) -> Result<QTensor> {
        self.info(name, expected)?;
        let path = self.file.path.clone();
        let corrupt =
            |e: candle_core::Error| Error::Corrupt { path: path.clone(), reason: format!("tensor `{name}`: {e}") };
        let device = if self.device.is_cpu() { &Device::Cpu } else { self.device };
        self.file.content.tensor(&mut self.file.reader, name, device).map_err(corrupt)
    }

    /// A `rows × cols` weight for the device: the CPU kernels' matrix, or candle's on other devices.
    fn weight(&mut self, name: &str, out: usize, inp: usize) -> Result<Weight> {
        if self.device.is_cpu() {
            Ok(Weight::Kernel(Arc::new(self.kernel_matrix(name, out, inp)?)))
        } else {
            Ok(Weight::Candle(QMatMul::from_qtensor(self.qtensor(name, &[out, inp])?)?))
        }
    }

    /// The kernels' copy of a `rows × cols` CPU tensor (see `with_kernel_blocks`).
    fn kernel_matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<QMatrix> {
        let m =
            self.with_kernel_blocks(name, [rows, cols], |format, data| Ok(QMatrix::new(format, rows, cols, data)?))?;
        self.held(m)
    }

    /// Calls `f` with the raw GGUF blocks of a `shape` CPU tensor in a format the kernels run: the file's own bytes
    /// when they run its format, else the tensor converted to Q8_0 (also Q5_0 with `requantize`).
    fn with_kernel_blocks<T>(
        &mut self,
        name: &str,
        shape: [usize; 2],
        f: impl FnOnce(Format, &[u8]) -> Result<T>,
    ) -> Result<T> {
        let info = self.info(name, &shape)?;
        let (dtype, start, len) =
            (info.ggml_dtype, self.file.content.tensor_data_offset + info.offset, tensor_bytes(info));
        let native = match dtype {
            GgmlDType::Q4K => Some(Format::Q4K),
            GgmlDType::Q6K => Some(Format::Q6K),
            GgmlDType::Q8_0 => Some(Format::Q8_0),
            GgmlDType::Q5_0 if !self.requantize => Some(Format::Q5_0),
            _ => None,
        };
        if let Some(format) = native {
            // `GgufFile::open` checked that the bytes lie inside the file.
            if self.raw.len() < len {
                self.raw.resize(len, 0);
            }
            let (reader, raw) = (&mut self.file.reader, &mut self.raw[..len]);
            reader
                .seek(SeekFrom::Start(start))
                .and_then(|_| reader.read_exact(raw))
                .map_err(|e| Error::io(&self.file.path, e))?;
            return f(format, raw);
        }
        let dense = self.qtensor(name, &shape)?.dequantize(&Device::Cpu)?;
        self.stats.requantized_tensors += 1;
        self.stats.requantized_elements += dense.elem_count();
        f(Format::Q8_0, &QTensor::quantize(&dense, GgmlDType::Q8_0)?.data()?)
    }

    fn held(&mut self, m: QMatrix) -> Result<QMatrix> {
        self.stats.kernel_bytes += m.bytes();
        Ok(m)
    }

    /// The kernels' matrix of only the rows `ids` (ascending) of a `rows × cols` CPU tensor: a pruned vocabulary
    /// head.
    fn kernel_matrix_rows(&mut self, name: &str, rows: usize, cols: usize, ids: &[u32]) -> Result<QMatrix> {
        let m = self.with_kernel_blocks(name, [rows, cols], |format, data| {
            let row_bytes = format.row_bytes(cols)?;
            let mut kept = Vec::with_capacity(ids.len() * row_bytes);
            for &id in ids {
                kept.extend_from_slice(&data[id as usize * row_bytes..][..row_bytes]);
            }
            Ok(QMatrix::new(format, ids.len(), cols, &kept)?)
        })?;
        self.held(m)
    }

    fn matmul(&mut self, name: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear { weight: self.weight(name, out, inp)?, bias: None, bias_host: None })
    }

    fn dense(&mut self, name: &str, len: usize) -> Result<Tensor> {
        let t = self.qtensor(name, &[len])?;
        Ok(t.dequantize(self.device)?.to_dtype(DType::F32)?)
    }

    fn opt_dense(&mut self, name: &str, len: usize) -> Result<Option<Tensor>> {
        if self.has(name) { self.dense(name, len).map(Some) } else { Ok(None) }
    }

    fn linear(&mut self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        let mut l = self.matmul(&format!("{prefix}.weight"), out, inp)?;
        l.bias = self.opt_dense(&format!("{prefix}.bias"), out)?;
        l.bias_host = match &l.bias {
            Some(b) if b.device().is_cpu() => Some(b.to_vec1::<f32>()?),
            _ => None,
        };
        Ok(l)
    }
}

pub(crate) fn load_weights(
    file: &mut GgufFile,
    cfg: &ModelConfig,
    device: &Device,
    requantize: bool,
    head: (Option<&HeadVocab>, &[u32]),
) -> Result<Weights> {
    let vocab_size = match file.content.tensor_infos.get("token_embd.weight") {
        Some(info) => info.shape.dims().first().copied().unwrap_or(0),
        None => return Err(Error::MissingTensor("token_embd.weight".into())),
    };
    // Only the CPU kernels run a pruned head; on other devices the whole head runs and the model masks the rest.
    let head_ids = head.0.map(|h| h.ids(vocab_size, head.1)).filter(|ids| ids.len() < vocab_size);
    let mut l = Loader { file, device, requantize, stats: LoadStats::default(), raw: Vec::new() };
    let h = cfg.hidden_size;
    let hd = cfg.head_dim;
    let tied = !l.has("output.weight");
    let embed = if device.is_cpu() {
        Embedding::Kernel(Arc::new(l.kernel_matrix("token_embd.weight", vocab_size, h)?))
    } else {
        Embedding::Candle(Arc::new(l.qtensor("token_embd.weight", &[vocab_size, h])?))
    };
    let mut blocks = Vec::with_capacity(cfg.n_layers);
    for i in 0..cfg.n_layers {
        let p = format!("blk.{i}");
        let ffn = match l.file.content.tensor_infos.get(&format!("{p}.ffn_up.weight")) {
            Some(info) => info.shape.dims().first().copied().unwrap_or(0),
            None => return Err(Error::MissingTensor(format!("{p}.ffn_up.weight"))),
        };
        let norm =
            |l: &mut Loader, name: &str| -> Result<RmsNorm> { RmsNorm::new(l.dense(name, h)?, cfg.rms_eps as f32) };
        blocks.push(Block {
            attn_norm: norm(&mut l, &format!("{p}.attn_norm.weight"))?,
            attn: Attention {
                q: l.linear(&format!("{p}.attn_q"), cfg.n_heads * hd, h)?,
                k: l.linear(&format!("{p}.attn_k"), cfg.n_kv_heads * hd, h)?,
                v: l.linear(&format!("{p}.attn_v"), cfg.n_kv_heads * hd, h)?,
                o: l.linear(&format!("{p}.attn_output"), h, cfg.n_heads * hd)?,
                n_heads: cfg.n_heads,
                n_kv_heads: cfg.n_kv_heads,
                head_dim: hd,
            },
            mlp_norm: norm(&mut l, &format!("{p}.ffn_norm.weight"))?,
            mlp: Mlp {
                gate: l.matmul(&format!("{p}.ffn_gate.weight"), ffn, h)?,
                up: l.matmul(&format!("{p}.ffn_up.weight"), ffn, h)?,
                down: l.matmul(&format!("{p}.ffn_down.weight"), h, ffn)?,
            },
        });
    }
    let norm = RmsNorm::new(l.dense("output_norm.weight", h)?, cfg.rms_eps as f32)?;
    // Tied embeddings (qwen2 small models): no `output.weight`, the embedding doubles as head.
    let lm_head = match (&head_ids, tied, &embed) {
        (Some(ids), _, Embedding::Kernel(_)) => {
            let name = if tied { "token_embd.weight" } else { "output.weight" };
            let head = l.kernel_matrix_rows(name, vocab_size, h, ids)?;
            Linear { weight: Weight::Kernel(Arc::new(head)), bias: None, bias_host: None }
        }
        (_, true, Embedding::Kernel(m)) => Linear { weight: Weight::Kernel(m.clone()), bias: None, bias_host: None },
        (_, true, Embedding::Candle(t)) => {
            Linear { weight: Weight::Candle(QMatMul::from_arc(t.clone())?), bias: None, bias_host: None }
        }
        (_, false, _) => l.matmul("output.weight", vocab_size, h)?,
    };
    Ok(Weights { embed, blocks, norm, lm_head, vocab_size, head_ids, stats: l.stats })
}
