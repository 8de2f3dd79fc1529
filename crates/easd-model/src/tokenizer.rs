//! Tokenizer and chat template, both built from GGUF metadata.
//!
//! Encoding uses candle's `TokenizerFromGguf` (byte-level BPE, the `gpt2` tokenizer model of
//! qwen2 and llama-3-style files). Decoding maps every token to its raw bytes once at load,
//! so whole-sequence and incremental decoding agree byte for byte and a character split over
//! several tokens is never emitted half-way.

use crate::error::{Error, Result};
use crate::gguf::{GgufFile, Meta, value_usize};
use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::tokenizer::TokenizerFromGguf;
use sha2::{Digest, Sha256};
use std::path::Path;

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// Token strings that end a turn or a document, when the vocabulary has them.
const STOP_TOKENS: [&str; 5] = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>"];

/// GGUF token types whose text is literal rather than byte-level encoded.
fn is_literal_type(ty: usize) -> bool {
    matches!(ty, 2..=5) // unknown, control, user-defined, unused
}

/// A model's tokenizer (Send + Sync).
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    token_bytes: Vec<Vec<u8>>,
    stop_ids: Vec<u32>,
    /// Ids of the literal tokens (control, user-defined, …: `<|im_end|>`), ascending.
    special_ids: Vec<u32>,
    fingerprint: String,
    chat: Option<minijinja::Environment<'static>>,
    bos_text: String,
    eos_text: String,
    /// Bytes of the longest token, special tokens included (at least 1).
    longest_token_bytes: usize,
    /// Whether every byte has its own byte-level token, so that BPE never needs an unknown token: then each token
    /// covers at least one and at most `longest_token_bytes` bytes of the text ([`Tokenizer::tokens_exceed`]).
    covers_all_bytes: bool,
}

impl Tokenizer {
    /// Reads only the metadata of a GGUF file (fast); used by `easd tokenize`.
    pub fn from_gguf_file(path: &Path) -> Result<Tokenizer> {
        Self::from_content(&GgufFile::metadata_only(path)?)
    }

    pub(crate) fn from_content(content: &Content) -> Result<Tokenizer> {
        let meta = Meta(content);
        let tokens = meta.strings("tokenizer.ggml.tokens")?;
        let merges = meta.strings("tokenizer.ggml.merges")?;
        let types: Vec<usize> = match meta.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(|e| bad_meta("tokenizer.ggml.token_type", e.to_string()))?
                .iter()
                .map(|t| value_usize(t).map_err(|r| bad_meta("tokenizer.ggml.token_type", r)))
                .collect::<Result<_>>()?,
            None => vec![1; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(bad_meta(
                "tokenizer.ggml.token_type",
                format!("{} types for {} tokens", types.len(), tokens.len()),
            ));
        }
        let inner = tokenizers::Tokenizer::from_gguf(content).map_err(|e| Error::Tokenizer {
            context: "building the tokenizer from GGUF metadata".into(),
            source: Box::new(e),
        })?;

        let byte_of = byte_decoder();
        let token_bytes: Vec<Vec<u8>> = tokens
            .iter()
            .zip(&types)
            .map(|(t, &ty)| {
                if is_literal_type(ty) {
                    return t.as_bytes().to_vec();
                }
                let mut out = Vec::with_capacity(t.len());
                for c in t.chars() {
                    match byte_of(c) {
                        Some(b) => out.push(b),
                        None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                out
            })
            .collect();

        let longest_token_bytes = token_bytes.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let byte_tokens: std::collections::HashSet<&str> = tokens
            .iter()
            .zip(&types)
            .filter(|(t, ty)| !is_literal_type(**ty) && t.chars().count() == 1)
            .map(|(t, _)| *t)
            .collect();
        let covers_all_bytes = byte_encoder().iter().all(|c| byte_tokens.contains(c.encode_utf8(&mut [0; 4]) as &str));

        let bos = meta.opt_usize("tokenizer.ggml.bos_token_id")?;
        let eos = meta.opt_usize("tokenizer.ggml.eos_token_id")?;
        let text_of = |id: Option<usize>| id.and_then(|i| tokens.get(i)).map(|s| s.to_string()).unwrap_or_default();
        // Only special tokens: Qwen's vocabulary also has "</s>" as ordinary text.
        let mut stop_ids: Vec<u32> = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (t, ty))| is_literal_type(**ty) && STOP_TOKENS.contains(t))
            .map(|(i, _)| i as u32)
            .collect();
        if let Some(e) = eos.filter(|&e| e < tokens.len()) {
            stop_ids.push(e as u32);
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        let special_ids: Vec<u32> =
            types.iter().enumerate().filter(|(_, ty)| is_literal_type(**ty)).map(|(i, _)| i as u32).collect();

        let mut h = Sha256::new();
        let pre = meta.opt_string("tokenizer.ggml.pre").unwrap_or("gpt2");
        let add_bos = meta.opt_bool("tokenizer.ggml.add_bos_token").unwrap_or(false);
        h.update(format!("easd-tokenizer-v1\0{pre}\0{add_bos}\0{bos:?}\0{eos:?}\0").as_bytes());
        for (t, ty) in tokens.iter().zip(&types) {
            h.update(t.as_bytes());
            h.update([0, *ty as u8]);
        }
        h.update(b"\0merges\0");
        for m in &merges {
            h.update(m.as_bytes());
            h.update([0]);
        }
        let fingerprint = hex::encode(h.finalize());

        let chat = match meta.opt_string("tokenizer.chat_template") {
            Some(src) => Some(chat_environment(src)?),
            None => None,
        };
        Ok(Tokenizer {
            inner,
            token_bytes,
            stop_ids,
            special_ids,
            fingerprint,
            chat,
            bos_text: text_of(bos),
            eos_text: text_of(eos),
            longest_token_bytes,
            covers_all_bytes,
        })
    }

    /// Token ids of `text`; a BOS is added only when the model's metadata says `add_bos_token`.
    /// Special tokens written in the text (`<|im_start|>`) become their ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc =
            self.inner.encode(text, true).map_err(|e| Error::Tokenizer { context: "encoding".into(), source: e })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Shows, without running BPE, that `text` encodes to more than `budget` tokens: returns a lower bound on its
    /// token count when that bound exceeds `budget`, `None` when it does not (or cannot be shown cheaply).
    ///
    /// Why the bound is sound: encoding splits out the special tokens written in the text (one token each),
    /// normalizes the rest (NFC for qwen2) and runs byte-level BPE on it, where every token stands for at least one
    /// and at most [`Tokenizer::longest_token_bytes`] bytes of the normalized text, the pre-tokenizer only ever
    /// adds bytes (a prefix space) and a BOS only adds a token. So `tokens ≥ ⌈normalized bytes / longest⌉`. This
    /// computes exactly that text (the tokenizer's own special-token split and normalizer), skipping the BPE merges
    /// that dominate the cost. Vocabularies without a token for every byte could fold unknown runs into one token:
    /// no bound is claimed for them. Texts whose raw length cannot reach the budget are not normalized at all:
    /// NFC at most triples the UTF-8 length (UAX #15), so `⌈3 × raw bytes / longest⌉ ≤ budget` rules an
    /// overflow out.
    pub fn tokens_exceed(&self, text: &str, budget: usize) -> Option<usize> {
        use tokenizers::{OffsetReferential, OffsetType};
        if !self.covers_all_bytes || text.len().saturating_mul(3).div_ceil(self.longest_token_bytes) <= budget {
            return None;
        }
        let split = self.inner.get_added_vocabulary().extract_and_normalize(self.inner.get_normalizer(), text);
        let bytes: usize = split
            .get_splits(OffsetReferential::Normalized, OffsetType::None)
            .iter()
            .map(|(piece, _, _)| piece.len())
            .sum();
        Some(bytes.div_ceil(self.longest_token_bytes)).filter(|&tokens| tokens > budget)
    }

    /// Bytes of the vocabulary's longest token (special tokens included).
    pub fn longest_token_bytes(&self) -> usize {
        self.longest_token_bytes
    }

    /// The text of `ids`, special tokens included; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.bytes_of(id)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Raw bytes of one token.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.get(id as usize).map(Vec::as_slice)
    }

    fn bytes_of(&self, id: u32) -> Result<&[u8]> {
        self.token_bytes(id).ok_or(Error::TokenOutOfRange { id, vocab_size: self.token_bytes.len() })
    }

    /// Tokens the tokenizer knows (the model's logits may be wider, padded).
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// EOS plus the chat end tokens present in the vocabulary, sorted.
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Ids of the special (literal) tokens, ascending: the chat markers and stop tokens among them.
    pub fn special_token_ids(&self) -> &[u32] {
        &self.special_ids
    }

    /// Hex sha256 of vocabulary, token types, merges, special ids and pre-tokenizer: two
    /// models can share token ids exactly when their fingerprints are equal.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat.is_some()
    }

    /// Renders the GGUF chat template with `add_generation_prompt = true`.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String> {
        let env = self.chat.as_ref().ok_or(Error::NoChatTemplate)?;
        let template = env.get_template("chat")?;
        Ok(template.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => &self.bos_text,
            eos_token => &self.eos_text,
        })?)
    }

    /// Decoded text of one token (lossy for a partial character), for logprob displays.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.token_bytes(id).map(|b| String::from_utf8_lossy(b).into_owned())
    }
}

fn bad_meta(key: &str, reason: String) -> Error {
    Error::InvalidMetadata { key: key.to_string(), reason }
}

fn chat_environment(src: &str) -> Result<minijinja::Environment<'static>> {
    let mut env = minijinja::Environment::new();
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env.add_template_owned("chat", src.to_string())?;
    Ok(env)
}

/// GPT-2's byte-level alphabet: printable bytes map to themselves, the others to U+0100 + n.
pub(crate) fn byte_encoder() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            b as char
        } else {
            let c = char::from_u32(256 + n).unwrap_or('\u{FFFD}');
            n += 1;
            c
        };
    }
    table
}

fn byte_decoder() -> impl Fn(char) -> Option<u8> {
    let enc = byte_encoder();
    let mut map = std::collections::HashMap::with_capacity(256);
    for (b, c) in enc.iter().enumerate() {
        map.insert(*c, b as u8);
    }
    move |c| map.get(&c).copied()
}

/// Streams the text of a growing token sequence, holding back an incomplete UTF-8 character
/// until the token that completes it arrives.
pub struct IncrementalDecoder<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
}

impl<'a> IncrementalDecoder<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        Self { tokenizer, pending: Vec::new() }
    }

    /// The text completed by `token` ("" while a character is still incomplete).
    pub fn push(&mut self, token: u32) -> Result<String> {
        self.pending.extend_from_slice(self.tokenizer.bytes_of(token)?);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return Ok(out);
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Bytes that can never start a valid character: replace and go on.
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                        // An incomplete character at the end: wait for more tokens.
                        None => {
                            self.pending.drain(..valid);
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is left: lossy only when the sequence ends inside a character.
    pub fn finish(&mut self) -> Result<String> {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiny::{TinySpec, write_tiny_gguf};

    fn tokenizer(spec: &TinySpec) -> Tokenizer {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        write_tiny_gguf(&path, spec).unwrap();
        Tokenizer::from_gguf_file(&path).unwrap()
    }

    const TRICKY: [&str; 8] = [
        "Hello, world! The answer is 42.",
        "naïve café — Ünïcödé 中文字符 ελληνικά",
        "emoji 🦀🚀 and a family 👨‍👩‍👧 and flags 🇫🇷",
        "fn main() {\n    let x = 3.14159;\n\tprintln!(\"{x}\");\n}\n",
        "runs    of     spaces\n\n\n   and tabs\t\t\t",
        "digits 1234567890 0.000001 -12e+10 #$%^&*",
        "",
        "<|im_start|>user\nhi<|im_end|>\n",
    ];

    #[test]
    fn tricky_text_round_trips_through_both_tokenizer_styles() {
        for spec in [TinySpec::qwen2(0), TinySpec::llama(0)] {
            let t = tokenizer(&spec);
            for text in TRICKY {
                let ids = t.encode(text).unwrap();
                assert_eq!(t.decode(&ids).unwrap(), text, "{}: {text:?}", spec.architecture);
            }
        }
    }

    #[test]
    fn merges_and_special_tokens_are_used_when_encoding() {
        let t = tokenizer(&TinySpec::qwen2(0));
        let ids = t.encode(" the").unwrap();
        assert_eq!(ids.len(), 1, "{ids:?}");
        let ids = t.encode("<|im_start|>user").unwrap();
        assert_eq!(t.token_text(ids[0]).as_deref(), Some("<|im_start|>"));
        // qwen2 splits digits one by one.
        assert_eq!(t.encode("123").unwrap().len(), 3);
        // No BOS: one byte is one token.
        assert_eq!(t.encode("x").unwrap().len(), 1);
    }

    #[test]
    fn incremental_decoding_never_emits_broken_utf8() {
        let t = tokenizer(&TinySpec::qwen2(0));
        for text in TRICKY {
            let ids = t.encode(text).unwrap();
            let mut dec = IncrementalDecoder::new(&t);
            let mut out = String::new();
            for &id in &ids {
                let piece = dec.push(id).unwrap();
                assert!(!piece.contains('\u{FFFD}'), "{text:?}: {piece:?}");
                out.push_str(&piece);
            }
            out.push_str(&dec.finish().unwrap());
            assert_eq!(out, text);
        }
        // A 4-byte emoji spread over byte tokens appears only with its last byte.
        let ids = t.encode("🦀").unwrap();
        assert_eq!(ids.len(), 4);
        let mut dec = IncrementalDecoder::new(&t);
        let pieces: Vec<String> = ids.iter().map(|&id| dec.push(id).unwrap()).collect();
        assert_eq!(pieces, ["", "", "", "🦀"]);
        // A sequence cut inside a character ends with one replacement character.
        let mut dec = IncrementalDecoder::new(&t);
        assert_eq!(dec.push(ids[0]).unwrap(), "");
        assert_eq!(dec.finish().unwrap(), "\u{FFFD}");
    }

    #[test]
    fn chat_template_renders_chatml_with_a_generation_prompt() {
        let t = tokenizer(&TinySpec::qwen2(0));
        assert!(t.has_chat_template());
        let text = t
            .apply_chat_template(&[ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "What is 2+2?")])
            .unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
        let ids = t.encode(&text).unwrap();
        let im_end = *t.stop_token_ids().last().unwrap();
        assert_eq!(ids.iter().filter(|&&id| id == im_end).count(), 2);
    }

    #[test]
    fn stop_tokens_are_endoftext_and_im_end() {
        let t = tokenizer(&TinySpec::llama(0));
        let names: Vec<String> = t.stop_token_ids().iter().map(|&id| t.token_text(id).unwrap()).collect();
        assert_eq!(names, ["<|endoftext|>", "<|im_end|>"]);
    }

    #[test]
    fn fingerprint_depends_on_the_vocabulary_only() {
        let a = tokenizer(&TinySpec::qwen2(1));
        let b = tokenizer(&TinySpec::qwen2(2));
        let c = tokenizer(&TinySpec { tokenizer_variant: 1, ..TinySpec::qwen2(1) });
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
        assert_eq!(a.fingerprint().len(), 64);
    }

    #[test]
    fn the_token_lower_bound_never_exceeds_the_real_count() {
        // Hangul jamo triples compose (NFC) into one 3-byte syllable: raw bytes overstate the normalized text 3x.
        let jamo = "\u{1100}\u{1161}\u{11A8}".repeat(300);
        let marks = "e\u{0301}a\u{0300}\u{0323}".repeat(200);
        let specials = "<|im_start|>user\n<|im_end|>".repeat(100);
        let words = " the model token def ment".repeat(200);
        let long: Vec<String> = TRICKY.iter().filter(|t| !t.is_empty()).map(|t| t.repeat(50)).collect();
        for spec in [TinySpec::qwen2(0), TinySpec::llama(0)] {
            let t = tokenizer(&spec);
            let longest = t.longest_token_bytes();
            assert!(longest >= "<|endoftext|>".len(), "special tokens count: {longest}");
            for text in [&jamo, &marks, &specials, &words].into_iter().chain(&long) {
                let real = t.encode(text).unwrap().len();
                // Budget 0 asks for the bound itself whenever it is positive.
                let bound = t.tokens_exceed(text, 0);
                assert!(bound.is_some_and(|b| b <= real), "{}: bound {bound:?} > {real} tokens", spec.architecture);
                assert_eq!(t.tokens_exceed(text, real), None, "never claims more than the real count");
            }
            if spec.architecture == crate::Architecture::Qwen2 {
                // The bound counts the composed text (a third of the raw bytes), as BPE sees it.
                assert_eq!(t.tokens_exceed(&jamo, 0), Some((jamo.len() / 3).div_ceil(longest)));
            }
        }
        // A prompt far beyond a budget is shown to exceed it; a short one is not even normalized.
        let t = tokenizer(&TinySpec::qwen2(0));
        let huge = "x".repeat(100_000);
        assert!(t.tokens_exceed(&huge, 511).is_some_and(|b| b > 511 && b <= t.encode(&huge).unwrap().len()));
        assert_eq!(t.tokens_exceed("short", 511), None);
    }

    #[test]
    fn out_of_range_ids_are_errors() {
        let t = tokenizer(&TinySpec::qwen2(0));
        let n = t.vocab_size() as u32;
        assert!(matches!(t.decode(&[n]), Err(Error::TokenOutOfRange { .. })));
        assert!(IncrementalDecoder::new(&t).push(n).is_err());
        assert_eq!(t.token_text(n), None);
    }
}
