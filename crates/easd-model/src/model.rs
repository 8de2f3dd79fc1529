//! The causal LM: qwen2 or llama decoder over quantized GGUF weights.
//!
//! Unlike candle-transformers' quantized models, `forward` returns logits for every input
//! position (a verifier scores a whole draft block in one pass) and the KV cache is external,
//! per session, and can be rolled back to any shorter length.

use crate::config::{Architecture, ModelConfig};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::head::HeadVocab;
use crate::kv_cache::KvCache;
use crate::layers::{Block, Embedding, Linear, RmsNorm, Segment, causal_mask, project_host};
use crate::load::{LoadStats, load_weights};
use crate::logits::Logits;
use crate::rope::Rope;
use crate::tokenizer::Tokenizer;
use candle_core::{DType, Device};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// How to load a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub device: Device,
    /// Also convert Q5_0 tensors to Q8_0 at load (CPU only; formats the CPU kernels lack are
    /// always converted — see `load.rs`). Default false: Q5_0 has its own kernel.
    pub requantize: bool,
    /// Run a short forward at load so kernels repack their weights before the first request.
    pub warmup: bool,
    /// For a draft: score only some ids and leave every other logit at −∞ ([`HeadVocab`]; `None`: the whole
    /// vocabulary).
    pub head_vocab: Option<HeadVocab>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { device: Device::Cpu, requantize: false, warmup: true, head_vocab: None }
    }
}

/// What a loaded model is.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// `general.name`, or the file stem.
    pub name: String,
    pub architecture: Architecture,
    pub context_length: usize,
    /// Rows of the embedding = width of each logits row (may exceed the tokenizer's vocabulary).
    pub vocab_size: usize,
    /// Ids the vocabulary head scores (`vocab_size` unless [`LoadOptions::head_vocab`] pruned it).
    pub head_rows: usize,
    pub n_layers: usize,
    pub hidden_size: usize,
    pub file_bytes: u64,
    pub device: String,
}

/// One session's part of a [`Model::forward_batch`]: run `tokens` at positions `start_pos..` on `cache`
/// (truncated to `start_pos` first, as [`Model::forward`] does) and return logits for the last `n_rows` of them.
pub struct BatchItem<'a> {
    pub cache: &'a mut KvCache,
    pub tokens: &'a [u32],
    pub start_pos: usize,
    pub n_rows: usize,
}

/// Weights shared by all sessions (Send + Sync; keep it in an `Arc`).
pub struct Model {
    id: u64,
    info: ModelInfo,
    cfg: ModelConfig,
    tokenizer: Tokenizer,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    /// The ids `lm_head` scores when it scores only some (CPU: one head row per id); all others are −∞.
    head_ids: Option<Vec<u32>>,
    rope: Rope,
    device: Device,
    load_stats: LoadStats,
}

static NEXT_MODEL_ID: AtomicU64 = AtomicU64::new(1);

impl Model {
    /// Loads weights and tokenizer from one GGUF file.
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Model> {
        let mut file = GgufFile::open(path)?;
        let cfg = ModelConfig::from_gguf(&file.content)?;
        let tokenizer = Tokenizer::from_content(&file.content)?;
        let always: Vec<u32> =
            tokenizer.special_token_ids().iter().chain(tokenizer.stop_token_ids()).copied().collect();
        let weights =
            load_weights(&mut file, &cfg, &opts.device, opts.requantize, (opts.head_vocab.as_ref(), &always))?;
        let name = file
            .content
            .metadata
            .get("general.name")
            .and_then(|v| v.to_string().ok().cloned())
            .unwrap_or_else(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default());
        let rope = Rope::new(
            cfg.head_dim,
            cfg.context_length,
            cfg.rope_base,
            cfg.architecture.interleaved_rope(),
            &opts.device,
        )?;
        let info = ModelInfo {
            name,
            architecture: cfg.architecture.clone(),
            context_length: cfg.context_length,
            vocab_size: weights.vocab_size,
            head_rows: weights.head_ids.as_ref().map_or(weights.vocab_size, Vec::len),
            n_layers: cfg.n_layers,
            hidden_size: cfg.hidden_size,
            file_bytes: file.file_bytes,
            device: device_name(&opts.device),
        };
        let model = Model {
            id: NEXT_MODEL_ID.fetch_add(1, Ordering::Relaxed),
            info,
            cfg,
            tokenizer,
            embed: weights.embed,
            blocks: weights.blocks,
            norm: weights.norm,
            lm_head: weights.lm_head,
            head_ids: weights.head_ids,
            rope,
            device: opts.device.clone(),
            load_stats: weights.stats,
        };
        if opts.warmup {
            model.warmup()?;
        }
        Ok(model)
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn load_stats(&self) -> &LoadStats {
        &self.load_stats
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// An empty cache for one session (allocates on first use).
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(
            self.id,
            self.cfg.n_layers,
            self.cfg.n_kv_heads,
            self.cfg.head_dim,
            self.cfg.context_length,
            self.device.clone(),
        )
    }

    /// Runs `tokens` at positions `start_pos..` and returns logits for every input position.
    ///
    /// `start_pos` must be `<= cache.len()`; when smaller, the cache is first truncated to it
    /// (rollback). Empty input, a start beyond the cache, an id outside the vocabulary or a
    /// context longer than the model's maximum are errors, checked before any work.
    pub fn forward(&self, cache: &mut KvCache, tokens: &[u32], start_pos: usize) -> Result<Logits> {
        self.forward_last(cache, tokens, start_pos, tokens.len())
    }

    /// [`Model::forward`] that computes logits only for the last `n_rows` input positions
    /// (`1..=tokens.len()`): a prefill needs one row, a verifier only its block's rows. The
    /// vocabulary projection is a quarter of the 0.5B model's weights, so skipping unneeded
    /// rows makes prompt processing much cheaper.
    pub fn forward_last(&self, cache: &mut KvCache, tokens: &[u32], start_pos: usize, n_rows: usize) -> Result<Logits> {
        let mut items = [BatchItem { cache, tokens, start_pos, n_rows }];
        Ok(self.forward_batch(&mut items)?.pop().expect("one item, one result"))
    }

    /// One forward over the rows of several sessions: each item is a [`Model::forward_last`] on its own cache
    /// and positions, and the result holds each item's logits in order.
    ///
    /// On the CPU the embedding, norms, projections, MLP and vocabulary head run once over the rows of all items
    /// (decode is memory-bound: one read of the weights serves every row), RoPE, the KV writes and attention per
    /// item. The kernels are batch-invariant, so each item's logits are bitwise those of its own forward, whatever
    /// shares the batch. Every item is checked before any work (the first bad one is the error, and then no
    /// cache changes). On other devices the items run one after the other.
    pub fn forward_batch(&self, items: &mut [BatchItem<'_>]) -> Result<Vec<Logits>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        for item in items.iter() {
            self.check_item(item.cache, item.tokens, item.start_pos, item.n_rows)?;
        }
        for item in items.iter_mut() {
            item.cache.truncate(item.start_pos)?;
            item.cache.reserve(item.tokens.len())?;
        }
        if self.device.is_cpu() {
            return self.forward_host(items);
        }
        items.iter_mut().map(|item| self.forward_device(item.cache, item.tokens, item.n_rows)).collect()
    }

    /// Checks one input of [`Model::forward_last`] / [`Model::forward_batch`] without running it: the error the
    /// forward would return, or none. (A batcher uses it to keep one bad request from failing a whole batch.)
    pub fn check_item(&self, cache: &KvCache, tokens: &[u32], start_pos: usize, n_rows: usize) -> Result<()> {
        self.check_input(cache, tokens, start_pos)?;
        if n_rows == 0 || n_rows > tokens.len() {
            return Err(Error::RowsOutOfRange { n_rows, tokens: tokens.len() });
        }
        Ok(())
    }

    /// The candle path for one session whose cache is already truncated to its start and has room.
    fn forward_device(&self, cache: &mut KvCache, tokens: &[u32], n_rows: usize) -> Result<Logits> {
        let (seq, start_pos) = (tokens.len(), cache.len());
        let mut x = self.embed.lookup(tokens, &self.device)?;
        let n_rep = self.cfg.n_heads / self.cfg.n_kv_heads;
        let mask = causal_mask(seq, start_pos, n_rep, &self.device)?;
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(&x, i, cache, &self.rope, mask.as_ref())?;
        }
        cache.advance(seq);
        let x = if n_rows < seq { x.narrow(1, seq - n_rows, n_rows)?.contiguous()? } else { x };
        let x = self.norm.forward(&x)?;
        let logits = self.lm_head.forward(&x)?.squeeze(0)?.to_dtype(DType::F32)?;
        let mut data = logits.flatten_all()?.to_vec1::<f32>()?;
        if let Some(ids) = &self.head_ids {
            // The whole head ran here: mask what a pruned head does not score, as the CPU path leaves it.
            let vocab = self.info.vocab_size;
            let mut kept = vec![false; vocab];
            for &id in ids {
                kept[id as usize] = true;
            }
            for row in data.chunks_exact_mut(vocab) {
                for (score, _) in row.iter_mut().zip(&kept).filter(|(_, kept)| !**kept) {
                    *score = f32::NEG_INFINITY;
                }
            }
        }
        Ok(self.logits(data, n_rows))
    }

    /// The CPU path: every operation on the project's batch-invariant kernels, no candle ops. The items' rows are
    /// concatenated in order; caches are truncated and reserved.
    fn forward_host(&self, items: &mut [BatchItem<'_>]) -> Result<Vec<Logits>> {
        let h = self.cfg.hidden_size;
        let tokens: Vec<u32> = items.iter().flat_map(|item| item.tokens.iter().copied()).collect();
        let mut x = self.embed.lookup_host(&tokens)?;
        let mut segments: Vec<Segment<'_>> =
            items.iter_mut().map(|item| Segment { cache: &mut *item.cache, rows: item.tokens.len() }).collect();
        for (i, block) in self.blocks.iter().enumerate() {
            block.forward_host(&mut x, &mut segments, i, &self.rope)?;
        }
        for segment in &mut segments {
            segment.cache.advance(segment.rows);
        }
        drop(segments);
        // The head over the wanted rows of every item at once: the last `n_rows` rows of each item's segment.
        let wanted: usize = items.iter().map(|item| item.n_rows).sum();
        let mut last = Vec::with_capacity(wanted * h);
        let mut end = 0;
        for item in items.iter() {
            end += item.tokens.len();
            last.extend_from_slice(&x[(end - item.n_rows) * h..end * h]);
        }
        easd_kernels::rms_norm_rows(&mut last, &self.norm.host, self.norm.eps);
        let mut data = project_host(&[&self.lm_head], &last, wanted)?.remove(0);
        // Split from the back, so each item's rows are copied once.
        let vocab = self.info.head_rows;
        let mut out: Vec<Logits> = items
            .iter()
            .rev()
            .map(|item| {
                let mine = data.split_off(data.len() - item.n_rows * vocab);
                self.logits(self.spread_head(mine, item.n_rows), item.n_rows)
            })
            .collect();
        out.reverse();
        Ok(out)
    }

    /// The CPU head's output (`n_rows` rows of `head_rows` scores) at full width: when the head scores only some ids,
    /// each score goes to its id and every other logit is −∞.
    fn spread_head(&self, data: Vec<f32>, n_rows: usize) -> Vec<f32> {
        let Some(ids) = &self.head_ids else { return data };
        let mut full = vec![f32::NEG_INFINITY; n_rows * self.info.vocab_size];
        for (row, scores) in full.chunks_exact_mut(self.info.vocab_size).zip(data.chunks_exact(ids.len())) {
            for (&id, &score) in ids.iter().zip(scores) {
                row[id as usize] = score;
            }
        }
        full
    }

    /// Logits from `n_rows` full-width rows, with the embedding's padding rows (no tokens) masked.
    fn logits(&self, mut data: Vec<f32>, n_rows: usize) -> Logits {
        let vocab = self.info.vocab_size;
        // Padding rows of the embedding (152k logits vs 151.7k Qwen tokens) are no tokens:
        // mask them so no sampler can pick an id the tokenizer cannot decode.
        let known = self.tokenizer.vocab_size();
        if known < vocab {
            for row in data.chunks_mut(vocab) {
                row[known..].fill(f32::NEG_INFINITY);
            }
        }
        Logits::new(data, n_rows, vocab)
    }

    fn check_input(&self, cache: &KvCache, tokens: &[u32], start_pos: usize) -> Result<()> {
        if cache.model_id != self.id {
            return Err(Error::CacheMismatch { cache_model: cache.model_id, model: self.id });
        }
        if tokens.is_empty() {
            return Err(Error::EmptyInput);
        }
        if start_pos > cache.len() {
            return Err(Error::StartBeyondCache { start_pos, cache_len: cache.len() });
        }
        let end = start_pos + tokens.len();
        if end > self.cfg.context_length {
            return Err(Error::ContextOverflow { start_pos, end, max: self.cfg.context_length });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.info.vocab_size) {
            return Err(Error::TokenOutOfRange { id, vocab_size: self.info.vocab_size });
        }
        Ok(())
    }

    /// Exercises the m>1 and m=1 kernel paths once so weight repacking happens at load.
    fn warmup(&self) -> Result<()> {
        let mut cache = self.new_cache();
        let n = 2.min(self.cfg.context_length);
        let ids = vec![0u32; n];
        self.forward(&mut cache, &ids, 0)?;
        if n < self.cfg.context_length {
            self.forward(&mut cache, &[0], n)?;
        }
        Ok(())
    }
}

fn device_name(device: &Device) -> String {
    match device {
        Device::Cpu => "cpu".to_string(),
        Device::Cuda(_) => "cuda".to_string(),
        Device::Metal(_) => "metal".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiny::{TinySpec, write_tiny_gguf};

    /// The same weights and tokens must give identical bits however the positions are split
    /// into forwards (the batch-invariance contract).
    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    fn tiny(spec: &TinySpec) -> (tempfile::TempDir, Model) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_tiny_gguf(&path, spec).unwrap();
        let model = Model::load(&path, &LoadOptions::default()).unwrap();
        (dir, model)
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    fn both() -> [TinySpec; 2] {
        [TinySpec::qwen2(7), TinySpec::llama(7)]
    }

    #[test]
    fn tiny_models_of_both_architectures_load_with_their_shapes() {
        for spec in both() {
            let (_d, m) = tiny(&spec);
            let info = m.info();
            assert_eq!(info.architecture, spec.architecture);
            assert_eq!(info.n_layers, 2);
            assert_eq!(info.hidden_size, 64);
            assert_eq!(info.context_length, 512);
            assert_eq!(info.vocab_size, m.tokenizer().vocab_size());
            assert_eq!(info.name, format!("tiny-{}", spec.architecture));
            // Q5_1 and Q4_1 FFN weights have no kernel: two per layer become Q8_0 (Q5_0 is native).
            assert_eq!(m.load_stats().requantized_tensors, 4);
            assert!(m.load_stats().kernel_bytes > 0);
        }
    }

    #[test]
    fn one_pass_logits_match_token_by_token_decoding() {
        for spec in both() {
            let (_d, m) = tiny(&spec);
            let tokens = [5u32, 77, 300, 12, 256, 9, 41, 100];
            let mut c = m.new_cache();
            let batched = m.forward(&mut c, &tokens, 0).unwrap();
            assert_eq!((batched.rows(), batched.vocab()), (8, m.info().vocab_size));
            assert_eq!(c.len(), 8);
            let mut c2 = m.new_cache();
            for (i, &t) in tokens.iter().enumerate() {
                let one = m.forward(&mut c2, &[t], i).unwrap();
                assert!(same_bits(one.row(0), batched.row(i)), "{} position {i}", spec.architecture);
            }
        }
    }

    /// The batch-invariance contract: one sequence split into blocks at random points (a
    /// prefill, verify blocks, single decode steps, a rollback and redo) gives every position the
    /// same bits as one forward over the whole sequence.
    #[test]
    fn random_block_splits_give_identical_logits() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        for spec in both() {
            let (_d, m) = tiny(&spec);
            let mut rng = StdRng::seed_from_u64(11);
            let tokens: Vec<u32> = (0..90).map(|_| rng.random_range(0..m.info().vocab_size as u32)).collect();
            let whole = m.forward(&mut m.new_cache(), &tokens, 0).unwrap();
            for trial in 0..4 {
                let mut cache = m.new_cache();
                let mut pos = 0;
                while pos < tokens.len() {
                    let len = rng.random_range(1..=17).min(tokens.len() - pos);
                    // Sometimes score a wrong block first and roll it back, as a rejected draft would.
                    if rng.random_bool(0.3) {
                        let junk: Vec<u32> = (0..len).map(|_| rng.random_range(0..200)).collect();
                        m.forward(&mut cache, &junk, pos).unwrap();
                    }
                    let part = m.forward(&mut cache, &tokens[pos..pos + len], pos).unwrap();
                    for i in 0..len {
                        assert!(
                            same_bits(part.row(i), whole.row(pos + i)),
                            "{} trial {trial}: position {} in a {len}-token block",
                            spec.architecture,
                            pos + i
                        );
                    }
                    pos += len;
                }
            }
        }
    }

    /// Cross-session batching: sessions of random lengths at random positions (prefills, verify blocks, single
    /// decode steps, rollbacks) forwarded together give each session bitwise the logits of its own forward, and
    /// leave in its cache what its own forward would (a second batched round checks the keys/values written).
    #[test]
    fn a_batch_of_sessions_gives_each_the_bits_of_its_own_forward() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        for spec in both() {
            let (_d, m) = tiny(&spec);
            let vocab = m.info().vocab_size as u32;
            let mut rng = StdRng::seed_from_u64(23);
            for trial in 0..5 {
                let sessions = rng.random_range(2..=8);
                let (mut batched, mut alone) = (Vec::new(), Vec::new());
                for _ in 0..sessions {
                    let held = rng.random_range(0..40);
                    let history: Vec<u32> = (0..held).map(|_| rng.random_range(0..vocab)).collect();
                    let (mut a, mut b) = (m.new_cache(), m.new_cache());
                    if held > 0 {
                        m.forward(&mut a, &history, 0).unwrap();
                        m.forward(&mut b, &history, 0).unwrap();
                    }
                    batched.push(a);
                    alone.push(b);
                }
                for round in 0..2 {
                    // Round 0: blocks at random starts (a start below the cache length is a rollback); round 1:
                    // one decode token each, reading what round 0 wrote.
                    let inputs: Vec<(Vec<u32>, usize, usize)> = alone
                        .iter()
                        .map(|cache| {
                            let len = if round == 0 { rng.random_range(1..=12) } else { 1 };
                            let start = if round == 0 { rng.random_range(0..=cache.len()) } else { cache.len() };
                            let tokens = (0..len).map(|_| rng.random_range(0..vocab)).collect();
                            (tokens, start, rng.random_range(1..=len))
                        })
                        .collect();
                    let mut items: Vec<BatchItem<'_>> = batched
                        .iter_mut()
                        .zip(&inputs)
                        .map(|(cache, (tokens, start_pos, n_rows))| BatchItem {
                            cache,
                            tokens,
                            start_pos: *start_pos,
                            n_rows: *n_rows,
                        })
                        .collect();
                    let together = m.forward_batch(&mut items).unwrap();
                    assert_eq!(together.len(), sessions);
                    for (i, ((tokens, start, n_rows), cache)) in inputs.iter().zip(&mut alone).enumerate() {
                        let own = m.forward_last(cache, tokens, *start, *n_rows).unwrap();
                        assert_eq!(together[i].rows(), *n_rows);
                        assert_eq!(batched[i].len(), cache.len());
                        for r in 0..*n_rows {
                            assert!(
                                same_bits(together[i].row(r), own.row(r)),
                                "{} trial {trial} round {round}: session {i} of {sessions}, row {r}",
                                spec.architecture
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_bad_item_fails_the_batch_before_any_cache_changes() {
        let (_d, m) = tiny(&TinySpec::qwen2(4));
        let (mut a, mut b) = (m.new_cache(), m.new_cache());
        m.forward(&mut a, &[1, 2, 3], 0).unwrap();
        let bad = [m.info().vocab_size as u32];
        let mut items = [
            BatchItem { cache: &mut a, tokens: &[4, 5], start_pos: 1, n_rows: 2 },
            BatchItem { cache: &mut b, tokens: &bad, start_pos: 0, n_rows: 1 },
        ];
        assert!(matches!(m.forward_batch(&mut items), Err(Error::TokenOutOfRange { .. })));
        assert_eq!((a.len(), b.len()), (3, 0), "no rollback, no write");
        assert!(m.forward_batch(&mut []).unwrap().is_empty());
    }

    /// A pruned head scores its ids with bitwise the whole head's logits (the kernels are row-invariant) and masks
    /// every other id, whether the head is the tied embedding (qwen2) or its own tensor (llama).
    #[test]
    fn a_head_of_the_first_ids_scores_them_and_the_special_tokens_bitwise_and_masks_the_rest() {
        for spec in both() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tiny.gguf");
            write_tiny_gguf(&path, &spec).unwrap();
            let whole = Model::load(&path, &LoadOptions::default()).unwrap();
            let pruned =
                Model::load(&path, &LoadOptions { head_vocab: Some(HeadVocab::first(200)), ..LoadOptions::default() })
                    .unwrap();
            let specials = pruned.tokenizer().special_token_ids().to_vec();
            assert!(specials.len() >= 3 && specials.iter().all(|&id| id >= 200), "{specials:?}");
            assert_eq!(pruned.info().head_rows, 200 + specials.len());
            assert_eq!(whole.info().head_rows, whole.info().vocab_size);
            let tokens = [5u32, 77, 250, 12, 3];
            let a = whole.forward(&mut whole.new_cache(), &tokens, 0).unwrap();
            // Two forwards over the pruned head: a block, then one decode row after a rollback.
            let mut cache = pruned.new_cache();
            let b = pruned.forward(&mut cache, &tokens, 0).unwrap();
            let last = pruned.forward(&mut cache, &tokens[4..], 4).unwrap();
            assert_eq!(b.vocab(), a.vocab());
            for (i, row) in (0..tokens.len()).map(|i| (i, b.row(i))).chain([(4, last.row(0))]) {
                for (id, (&x, &y)) in a.row(i).iter().zip(row).enumerate() {
                    if id < 200 || specials.contains(&(id as u32)) {
                        assert_eq!(x.to_bits(), y.to_bits(), "{} row {i} id {id}", spec.architecture);
                    } else {
                        assert_eq!(y, f32::NEG_INFINITY, "{} row {i} id {id}", spec.architecture);
                    }
                }
            }
            // A head as wide as the vocabulary is the whole head.
            let wide = Model::load(
                &path,
                &LoadOptions { head_vocab: Some(HeadVocab::first(100_000)), ..LoadOptions::default() },
            )
            .unwrap();
            assert_eq!(wide.info().head_rows, wide.info().vocab_size);
        }
    }

    #[test]
    fn logits_are_peaked_not_uniform() {
        let (_d, m) = tiny(&TinySpec::qwen2(3));
        let l = m.forward(&mut m.new_cache(), &[10, 20, 30], 0).unwrap();
        let uniform = (l.vocab() as f32).ln();
        for i in 0..3 {
            let row = l.row(i);
            let max = row.iter().copied().fold(f32::MIN, f32::max);
            let z: f32 = row.iter().map(|x| (x - max).exp()).sum();
            let entropy: f32 = row
                .iter()
                .map(|x| {
                    let p = (x - max).exp() / z;
                    if p > 0.0 { -p * p.ln() } else { 0.0 }
                })
                .sum();
            assert!(entropy < 0.6 * uniform, "row {i}: entropy {entropy} vs uniform {uniform}");
        }
    }

    #[test]
    fn forward_last_returns_the_tail_rows_of_forward() {
        let (_d, m) = tiny(&TinySpec::qwen2(5));
        let tokens = [3u32, 1, 4, 1, 5, 9];
        let all = m.forward(&mut m.new_cache(), &tokens, 0).unwrap();
        let mut c = m.new_cache();
        let tail = m.forward_last(&mut c, &tokens, 0, 2).unwrap();
        assert_eq!((tail.rows(), c.len()), (2, 6));
        assert!(same_bits(tail.row(0), all.row(4)) && same_bits(tail.row(1), all.row(5)));
        assert!(matches!(m.forward_last(&mut c, &tokens, 0, 0), Err(Error::RowsOutOfRange { .. })));
        assert!(matches!(m.forward_last(&mut c, &tokens, 0, 7), Err(Error::RowsOutOfRange { .. })));
    }

    #[test]
    fn rollback_then_forward_equals_fresh_forward() {
        for spec in both() {
            let (_d, m) = tiny(&spec);
            let (a, b, c, d, e) = (11u32, 22, 33, 44, 55);
            let mut cache = m.new_cache();
            m.forward(&mut cache, &[a, b, c], 0).unwrap();
            cache.truncate(1).unwrap();
            let rolled = m.forward(&mut cache, &[d, e], 1).unwrap();
            let fresh = m.forward(&mut m.new_cache(), &[a, d, e], 0).unwrap();
            for i in 0..2 {
                assert!(same_bits(rolled.row(i), fresh.row(i + 1)), "{} row {i}", spec.architecture);
            }
            // The same through start_pos alone: forward at 1 drops d, e again.
            let again = m.forward(&mut cache, &[d, e], 1).unwrap();
            assert!(same_bits(again.row(1), fresh.row(2)));
            assert_eq!(cache.len(), 3);
        }
    }

    #[test]
    fn cache_grows_past_its_first_allocation_without_changing_results() {
        let (_d, m) = tiny(&TinySpec::llama(1));
        let tokens: Vec<u32> = (0..300).map(|i| (i * 7 % 250) as u32).collect();
        let mut grown = m.new_cache();
        m.forward(&mut grown, &tokens[..200], 0).unwrap();
        let before = grown.bytes();
        let tail = m.forward(&mut grown, &tokens[200..], 200).unwrap();
        assert!(grown.bytes() > before);
        let whole = m.forward(&mut m.new_cache(), &tokens, 0).unwrap();
        assert!(same_bits(tail.row(99), whole.row(299)));
    }

    #[test]
    fn requantizing_slow_formats_barely_changes_logits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        write_tiny_gguf(&path, &TinySpec::qwen2(9)).unwrap();
        let a = Model::load(&path, &LoadOptions::default()).unwrap();
        let b = Model::load(&path, &LoadOptions { requantize: true, ..LoadOptions::default() }).unwrap();
        assert_eq!((a.load_stats().requantized_tensors, b.load_stats().requantized_tensors), (4, 6));
        let tokens = [1u32, 2, 3, 4];
        let la = a.forward(&mut a.new_cache(), &tokens, 0).unwrap();
        let lb = b.forward(&mut b.new_cache(), &tokens, 0).unwrap();
        for i in 0..4 {
            // Logits reach ~13 here; re-quantizing Q5_0 to Q8_0 moves them by ~1%.
            assert!(max_diff(la.row(i), lb.row(i)) < 0.5);
            assert_eq!(la.argmax(i), lb.argmax(i));
        }
    }

    #[test]
    fn bad_forward_inputs_are_errors() {
        let (_d, m) = tiny(&TinySpec::qwen2(2));
        let mut c = m.new_cache();
        assert!(matches!(m.forward(&mut c, &[], 0), Err(Error::EmptyInput)));
        assert!(matches!(m.forward(&mut c, &[1], 1), Err(Error::StartBeyondCache { start_pos: 1, cache_len: 0 })));
        let too_long = vec![1u32; 513];
        assert!(matches!(m.forward(&mut c, &too_long, 0), Err(Error::ContextOverflow { end: 513, max: 512, .. })));
        let bad_id = m.info().vocab_size as u32;
        assert!(matches!(m.forward(&mut c, &[bad_id], 0), Err(Error::TokenOutOfRange { .. })));
        assert!(matches!(c.truncate(1), Err(Error::TruncateBeyondLength { .. })));
        let (_d2, other) = tiny(&TinySpec::qwen2(2));
        assert!(matches!(other.forward(&mut c, &[1], 0), Err(Error::CacheMismatch { .. })));
        // A full context is fine; one more position is not.
        let full = vec![1u32; 512];
        m.forward(&mut c, &full, 0).unwrap();
        assert!(matches!(m.forward(&mut c, &[1], 512), Err(Error::ContextOverflow { .. })));
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let opts = LoadOptions::default();
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "hello, not a model").unwrap();
        assert!(matches!(Model::load(&text, &opts), Err(Error::NotGguf { .. })));
        assert!(matches!(Model::load(&dir.path().join("missing.gguf"), &opts), Err(Error::NotFound(_))));

        let good = dir.path().join("good.gguf");
        write_tiny_gguf(&good, &TinySpec::llama(4)).unwrap();
        let bytes = std::fs::read(&good).unwrap();
        let cut = dir.path().join("cut.gguf");
        std::fs::write(&cut, &bytes[..bytes.len() - 1000]).unwrap();
        let e = Model::load(&cut, &opts).err().unwrap();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("truncated"), "{e}");
        let header_only = dir.path().join("header.gguf");
        std::fs::write(&header_only, &bytes[..100]).unwrap();
        assert!(matches!(Model::load(&header_only, &opts), Err(Error::Corrupt { .. })));

        // Same file with another architecture string: patch the metadata value in place.
        let mut patched = bytes.clone();
        let at = patched.windows(5).position(|w| w == b"llama").unwrap();
        patched[at..at + 5].copy_from_slice(b"mamba");
        let other = dir.path().join("mamba.gguf");
        std::fs::write(&other, &patched).unwrap();
        let e = Model::load(&other, &opts).err().unwrap();
        assert!(matches!(&e, Error::UnsupportedArchitecture(a) if a == "mamba"), "{e}");
    }
}
