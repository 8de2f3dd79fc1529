//! Greedy generation and the block-verify agreement check, shared by the real-model test and
//! `easd bench verify`.

use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::model::Model;

/// Greedy continuation of `prompt` (fresh cache), one token per forward, stopping after a stop
/// token (included) or `max_new` tokens.
pub fn greedy_generate(model: &Model, prompt: &[u32], max_new: usize) -> Result<Vec<u32>> {
    let mut cache = model.new_cache();
    let stops = model.tokenizer().stop_token_ids();
    let mut logits = model.forward_last(&mut cache, prompt, 0, 1)?;
    let mut out = Vec::with_capacity(max_new);
    while out.len() < max_new {
        let next = logits.argmax(logits.rows() - 1);
        out.push(next);
        if stops.contains(&next) || cache.len() >= model.info().context_length {
            break;
        }
        let pos = cache.len();
        logits = model.forward(&mut cache, &[next], pos)?;
    }
    Ok(out)
}

/// How one-pass block scoring agrees with a token-by-token greedy continuation.
#[derive(Clone, Debug, Default)]
pub struct BlockAgreement {
    /// Positions compared.
    pub positions: usize,
    /// Positions where the block's argmax differs from the sequential greedy token, with the
    /// block logits' top-1 minus top-2 gap there (a near-tie explains a flip).
    pub mismatches: Vec<(usize, f32)>,
}

/// Scores `generated` (the greedy continuation of `prompt`) in blocks of `block` tokens, one
/// forward per block as a verifier would, and compares every row's argmax with the next token
/// of `generated`.
pub fn block_agreement(model: &Model, prompt: &[u32], generated: &[u32], block: usize) -> Result<BlockAgreement> {
    let mut cache: KvCache = model.new_cache();
    let mut agreement = BlockAgreement::default();
    let logits = model.forward_last(&mut cache, prompt, 0, 1)?;
    compare(&logits, logits.rows() - 1, generated.first(), 0, &mut agreement);
    for (b, chunk) in generated.chunks(block.max(1)).enumerate() {
        let offset = b * block;
        let logits = model.forward(&mut cache, chunk, prompt.len() + offset)?;
        for j in 0..chunk.len() {
            compare(&logits, j, generated.get(offset + j + 1), offset + j + 1, &mut agreement);
        }
    }
    Ok(agreement)
}

fn compare(logits: &crate::Logits, row: usize, expected: Option<&u32>, pos: usize, acc: &mut BlockAgreement) {
    let Some(&expected) = expected else { return };
    acc.positions += 1;
    let got = logits.argmax(row);
    if got != expected {
        let r = logits.row(row);
        let mut top = [f32::NEG_INFINITY; 2];
        for &v in r {
            if v > top[0] {
                top = [v, top[0]];
            } else if v > top[1] {
                top[1] = v;
            }
        }
        acc.mismatches.push((pos, top[0] - top[1]));
    }
}
