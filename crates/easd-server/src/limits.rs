//! Limits on what a caller may send, in one place: ids that reach traces and logs, and the largest gRPC message each
//! server decodes — what a maximal legal request needs, so anything larger is refused before it is read
//! (`OUT_OF_RANGE`, "decoded message length too large") instead of being buffered and then found invalid.

use easd_core::MAX_BLOCK_SIZE;

use crate::coordinator::request::{MAX_STOP_STRING_BYTES, MAX_STOP_STRINGS};
use crate::error::ServerError;

/// Longest request id (coordinator) or session id (workers) accepted.
pub const MAX_ID_CHARS: usize = 128;

/// Most entries of a sparse proposal q on the wire (the coordinator sends `easd_core::DEFAULT_K_Q` = 64).
pub const MAX_PROPOSAL_SUPPORT: usize = 1024;

/// How much Unicode normalization (NFC) can shorten a text, with margin: composition merges at most three UTF-8
/// characters' worth of bytes into one (Hangul jamo L+V+T, 9 bytes → one 3-byte syllable).
pub const MAX_NORMALIZATION_SHRINK: usize = 4;

/// Room for the fixed-size fields, tags and length prefixes of any message.
const ENVELOPE_BYTES: usize = 16 << 10;

/// A varint-encoded `uint32` takes at most 5 bytes.
const MAX_VARINT32_BYTES: usize = 5;

/// An id that is safe to put in traces, logs and metrics: 1 to [`MAX_ID_CHARS`] characters from `[A-Za-z0-9._:-]`.
/// The error never echoes the id itself.
pub fn validate_id(field: &'static str, id: &str) -> Result<(), ServerError> {
    const ALLOWED: &str = "1 to 128 characters from [A-Za-z0-9._:-]";
    if id.is_empty() {
        return Err(ServerError::invalid(field, format!("must not be empty ({ALLOWED})")));
    }
    if id.len() > MAX_ID_CHARS {
        return Err(ServerError::invalid(field, format!("is {} bytes long; expected {ALLOWED}", id.len())));
    }
    match id.chars().enumerate().find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))) {
        Some((i, c)) => Err(ServerError::invalid(field, format!("has {c:?} at character {i}; expected {ALLOWED}"))),
        None => Ok(()),
    }
}

/// The largest `Propose`/`Verify` request a worker with this context length needs to decode: a full context of
/// token ids (`new_tokens` with `full_context`) plus a block of [`MAX_BLOCK_SIZE`] drafted tokens, each with a
/// proposal of [`MAX_PROPOSAL_SUPPORT`] (id, probability) pairs. 477,184 bytes for a 32,768-token context.
pub fn worker_max_message_bytes(context_length: usize) -> usize {
    let context = MAX_VARINT32_BYTES * context_length;
    let proposal = MAX_PROPOSAL_SUPPORT * (MAX_VARINT32_BYTES + 4) + 64;
    context + MAX_BLOCK_SIZE * proposal + ENVELOPE_BYTES
}

/// The largest `Generate` request the coordinator needs to decode. A legal prompt has fewer tokens than the context
/// length, each token stands for at most `longest_token_bytes` bytes of the normalized text, and normalization
/// shortens a text by less than [`MAX_NORMALIZATION_SHRINK`]; chat messages add their template text. Stop strings
/// and the other fields are bounded on their own. For a 32,768-token context and a longest token of L bytes:
/// 131,072 × L + 32,768 bytes.
pub fn coordinator_max_message_bytes(context_length: usize, longest_token_bytes: usize) -> usize {
    let prompt = MAX_NORMALIZATION_SHRINK.saturating_mul(context_length).saturating_mul(longest_token_bytes.max(1));
    prompt.saturating_add(MAX_STOP_STRINGS * MAX_STOP_STRING_BYTES).saturating_add(ENVELOPE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_short_printable_ascii_and_errors_do_not_echo_them() {
        for ok in ["a", "req-42", "2026-12-01T10:00:00.123_x", &"x".repeat(MAX_ID_CHARS)] {
            assert!(validate_id("request_id", ok).is_ok(), "{ok}");
        }
        let long = "y".repeat(1 << 20);
        let e = validate_id("request_id", &long).unwrap_err().to_string();
        assert_eq!(e, "invalid request_id: is 1048576 bytes long; expected 1 to 128 characters from [A-Za-z0-9._:-]");
        let e = validate_id("request_id", "ab\ncd").unwrap_err().to_string();
        assert!(e.contains("'\\n' at character 2"), "{e}");
        assert!(validate_id("session_id", "").is_err());
        assert!(validate_id("session_id", "é").is_err());
        assert!(validate_id("session_id", "a b").is_err());
    }

    #[test]
    fn message_caps_cover_a_maximal_legal_request() {
        use easd_proto::v1 as pb;
        use prost::Message;
        let context = 32_768;
        assert_eq!(worker_max_message_bytes(context), 477_184, "the number in the docs");
        let id = "s".repeat(MAX_ID_CHARS);
        let claim = || Some(pb::PrefixClaim { length: u32::MAX, hash: u64::MAX });
        let sampling = || Some(pb::SamplingParams { temperature: 1.0, top_k: u32::MAX, top_p: 0.5, seed: u64::MAX });
        let proposal =
            pb::SparseDist { ids: vec![u32::MAX; MAX_PROPOSAL_SUPPORT], probs: vec![0.5; MAX_PROPOSAL_SUPPORT] };
        let verify = pb::VerifyRequest {
            session_id: id.clone(),
            claim: claim(),
            new_tokens: vec![u32::MAX; context],
            full_context: true,
            block: vec![pb::DraftedToken { token: u32::MAX, proposal: Some(proposal) }; MAX_BLOCK_SIZE],
            sampling: sampling(),
            top_n: u32::MAX,
            penalty_alpha: 0.5,
            logprobs: u32::MAX,
        };
        assert!(verify.encoded_len() <= worker_max_message_bytes(context), "{}", verify.encoded_len());
        let propose = pb::ProposeRequest {
            session_id: id.clone(),
            claim: claim(),
            new_tokens: vec![u32::MAX; context],
            full_context: true,
            count: u32::MAX,
            sampling: sampling(),
            proposal_support: u32::MAX,
            top_n: u32::MAX,
        };
        assert!(propose.encoded_len() <= worker_max_message_bytes(context));

        // A prompt as long as a legal one can be (every token of the longest kind, shrunk by normalization).
        let longest = 7;
        let prompt = "\u{1100}\u{1161}\u{11A8}".repeat(context * longest / 3);
        let generate = pb::GenerateRequest {
            input: Some(pb::generate_request::Input::Prompt(prompt)),
            max_tokens: Some(u32::MAX),
            temperature: Some(1.0),
            top_p: Some(1.0),
            top_k: Some(u32::MAX),
            seed: Some(u64::MAX),
            mode: i32::MAX,
            k: Some(u32::MAX),
            easd: Some(pb::EasdParams {
                top_n: Some(u32::MAX),
                rho: Some(1.0),
                tau_draft: Some(1.0),
                tau_target: Some(1.0),
                order: i32::MAX,
                penalty_alpha: Some(0.5),
            }),
            stop: vec!["z".repeat(MAX_STOP_STRING_BYTES); MAX_STOP_STRINGS],
            logprobs: u32::MAX,
            request_id: id,
            pipeline: Some(true),
        };
        let cap = coordinator_max_message_bytes(context, longest);
        assert!(generate.encoded_len() <= cap, "{} > {cap}", generate.encoded_len());
        assert_eq!(coordinator_max_message_bytes(context, 1), 131_072 + 32_768, "the formula in the docs");
    }
}
