//! OpenAI response objects built from the coordinator's events: completions, stream chunks, usage, logprobs,
//! and the `easd` extension field that carries the speculative summary.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use easd_model::Tokenizer;
use easd_proto::v1 as pb;
use serde_json::{Value, json};

use crate::endpoint::Endpoint;

pub fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// What every object of one response shares.
#[derive(Clone, Debug)]
pub struct Meta {
    pub endpoint: Endpoint,
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    /// The seed the coordinator used (chosen at random when the client sent none): reported for reproducibility.
    pub seed: u64,
}

impl Meta {
    fn header(&self, streaming: bool) -> serde_json::Map<String, Value> {
        let object = match (self.endpoint, streaming) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        };
        let mut m = serde_json::Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(object));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m
    }
}

/// OpenAI reports a full context window as "length" too.
pub fn finish_reason(summary: &pb::Summary) -> &str {
    match summary.finish_reason.as_str() {
        "context" => "length",
        other => other,
    }
}

pub fn usage(summary: &pb::Summary) -> Value {
    json!({
        "prompt_tokens": summary.prompt_tokens,
        "completion_tokens": summary.generated_tokens,
        "total_tokens": summary.prompt_tokens + summary.generated_tokens,
    })
}

/// The speculative summary, returned in the extra `easd` field of the final response or chunk.
pub fn easd_summary(summary: &pb::Summary, seed: u64) -> Value {
    let triggers: Vec<Value> = summary
        .triggers
        .iter()
        .map(|t| {
            json!({
                "position": t.position,
                "draft_entropy": t.draft_entropy,
                "target_entropy": t.target_entropy,
                "overlap": t.overlap,
            })
        })
        .collect();
    json!({
        "mode": summary.mode,
        "seed": seed,
        "request_id": summary.request_id,
        "blocks": summary.blocks,
        "drafted_tokens": summary.drafted_tokens,
        "accepted_tokens": summary.accepted_tokens,
        "acceptance_rate": summary.acceptance_rate,
        "mean_accepted_len": summary.mean_accepted_len,
        "easd_triggers": summary.easd_triggers,
        "triggers": triggers,
        "target_forwards": summary.target_forwards,
        "discarded_tokens": summary.discarded_tokens,
        "verifiers": summary.verifiers,
        "failovers": summary.failovers,
        "finish_reason": summary.finish_reason,
        "wall_s": summary.wall_s,
        "tokens_per_s": summary.tokens_per_s,
        "time_to_first_token_s": summary.time_to_first_token_s,
        "draft_forward_seconds": summary.draft_forward_seconds,
        "target_forward_seconds": summary.target_forward_seconds,
        "overhead_seconds": summary.overhead_seconds,
        "note": summary.note,
    })
}

/// Log probabilities of `infos` in the endpoint's format, with `top` alternatives per token.
/// `text_offset` is where the first token's text starts in the completion (completions format only).
pub fn logprobs(
    endpoint: Endpoint,
    infos: &[pb::TokenInfo],
    top: usize,
    tokenizer: &Tokenizer,
    text_offset: &mut usize,
) -> Value {
    let bytes = |token: u32| tokenizer.token_bytes(token).map(<[u8]>::to_vec).unwrap_or_default();
    match endpoint {
        Endpoint::Chat => {
            let content: Vec<Value> = infos
                .iter()
                .map(|info| {
                    let alternatives: Vec<Value> = info
                        .top_logprobs
                        .iter()
                        .take(top)
                        .map(|t| json!({ "token": t.text, "logprob": t.logprob, "bytes": bytes(t.token) }))
                        .collect();
                    json!({
                        "token": info.text,
                        "logprob": info.logprob,
                        "bytes": bytes(info.token),
                        "top_logprobs": alternatives,
                    })
                })
                .collect();
            json!({ "content": content })
        }
        Endpoint::Completions => {
            let mut offsets = Vec::with_capacity(infos.len());
            for info in infos {
                offsets.push(*text_offset);
                *text_offset += info.text.len();
            }
            let top_logprobs: Vec<Value> = infos
                .iter()
                .map(|info| {
                    let map: serde_json::Map<String, Value> =
                        info.top_logprobs.iter().take(top).map(|t| (t.text.clone(), json!(t.logprob))).collect();
                    Value::Object(map)
                })
                .collect();
            json!({
                "tokens": infos.iter().map(|i| i.text.as_str()).collect::<Vec<_>>(),
                "token_logprobs": infos.iter().map(|i| i.logprob).collect::<Vec<_>>(),
                "top_logprobs": top_logprobs,
                "text_offset": offsets,
            })
        }
    }
}

/// The non-streamed response.
pub fn completion(meta: &Meta, text: &str, logprobs: Option<Value>, summary: &pb::Summary) -> Value {
    let choice = match meta.endpoint {
        Endpoint::Chat => json!({
            "index": 0,
            "message": { "role": "assistant", "content": text },
            "logprobs": logprobs,
            "finish_reason": finish_reason(summary),
        }),
        Endpoint::Completions => json!({
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish_reason(summary),
        }),
    };
    let mut m = meta.header(false);
    m.insert("choices".into(), json!([choice]));
    m.insert("usage".into(), usage(summary));
    m.insert("easd".into(), easd_summary(summary, meta.seed));
    Value::Object(m)
}

/// One streamed chunk: text (with the assistant role on the first chat chunk), or the end with its finish
/// reason and the `easd` summary. With `include_usage`, every chunk carries `"usage": null` as OpenAI's do.
pub fn chunk(
    meta: &Meta,
    text: &str,
    first: bool,
    logprobs: Option<Value>,
    end: Option<&pb::Summary>,
    include_usage: bool,
) -> Value {
    let finish = end.map(finish_reason);
    let choice = match meta.endpoint {
        Endpoint::Chat => {
            let delta = match (first, end) {
                (true, _) => json!({ "role": "assistant", "content": text }),
                (false, Some(_)) if text.is_empty() => json!({}),
                (false, _) => json!({ "content": text }),
            };
            json!({ "index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish })
        }
        Endpoint::Completions => json!({ "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish }),
    };
    let mut m = meta.header(true);
    m.insert("choices".into(), json!([choice]));
    if include_usage {
        m.insert("usage".into(), Value::Null);
    }
    if let Some(summary) = end {
        m.insert("easd".into(), easd_summary(summary, meta.seed));
    }
    Value::Object(m)
}

/// The last chunk with `stream_options.include_usage`: no choices, only the usage.
pub fn usage_chunk(meta: &Meta, summary: &pb::Summary) -> Value {
    let mut m = meta.header(true);
    m.insert("choices".into(), json!([]));
    m.insert("usage".into(), usage(summary));
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> pb::Summary {
        pb::Summary {
            mode: "sd".into(),
            prompt_tokens: 7,
            generated_tokens: 5,
            finish_reason: "context".into(),
            drafted_tokens: 8,
            accepted_tokens: 4,
            acceptance_rate: 0.5,
            ..Default::default()
        }
    }

    fn meta(endpoint: Endpoint) -> Meta {
        Meta { endpoint, id: "chatcmpl-1".into(), created: 1, model: "m".into(), seed: 9 }
    }

    #[test]
    fn usage_adds_prompt_and_completion_tokens() {
        assert_eq!(usage(&summary()), json!({"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}));
    }

    #[test]
    fn a_full_context_window_finishes_with_length() {
        let v = completion(&meta(Endpoint::Chat), "hi", None, &summary());
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["choices"][0]["message"], json!({"role": "assistant", "content": "hi"}));
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["easd"]["acceptance_rate"], 0.5);
        assert_eq!(v["easd"]["seed"], 9);
    }

    #[test]
    fn chunks_carry_the_role_first_and_the_summary_last() {
        let m = meta(Endpoint::Chat);
        let first = chunk(&m, "", true, None, None, true);
        assert_eq!(first["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(first["usage"], Value::Null);
        assert!(first.get("easd").is_none());
        let last = chunk(&m, "", false, None, Some(&summary()), false);
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert!(last.get("usage").is_none());
        assert_eq!(last["easd"]["mode"], "sd");
        let u = usage_chunk(&m, &summary());
        assert_eq!(u["choices"], json!([]));
        assert_eq!(u["usage"]["total_tokens"], 12);
    }
}
