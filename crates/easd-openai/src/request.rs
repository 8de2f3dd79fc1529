//! OpenAI request bodies → the coordinator's `GenerateRequest`.
//!
//! Bodies are read as untyped JSON and each field is taken with its type checked, so that every error names the
//! field in OpenAI's vocabulary (`invalid top_logprobs: must be an integer in 0..=20, got 30`); ranges the
//! coordinator already checks (temperature, top_p, stop, easd thresholds) are left to `Coordinator::plan`.
//! Fields this server cannot honour (n > 1, penalties, tools, logit_bias) are refused, never silently ignored;
//! fields that do not change the output (user, metadata, store, …) are ignored.

use easd_proto::v1::{self as pb, generate_request::Input};
use easd_server::coordinator::ModeKind;
use serde_json::{Map, Value};

use crate::endpoint::Endpoint;
use crate::error::Error;

/// OpenAI's default sampling temperature (the coordinator's own default is greedy).
pub const DEFAULT_TEMPERATURE: f32 = 1.0;
/// OpenAI's default `max_tokens` for the legacy completions endpoint.
pub const DEFAULT_COMPLETIONS_MAX_TOKENS: u32 = 16;
/// OpenAI allows 0..=20 alternatives per token.
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// A request body, validated as far as the HTTP layer can.
#[derive(Clone, Debug)]
pub struct ParsedRequest {
    pub generate: pb::GenerateRequest,
    pub model: String,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk carries the usage.
    pub include_usage: bool,
    /// `Some(n)`: return the chosen tokens' log probabilities with `n` alternatives each.
    pub logprobs: Option<usize>,
    /// Whether the client set a token limit; chat requests without one run to the end of the context window.
    pub max_tokens_set: bool,
}

pub fn parse(body: &[u8], endpoint: Endpoint) -> Result<ParsedRequest, Error> {
    let value: Value = serde_json::from_slice(body).map_err(|e| Error::BadJson(e.to_string()))?;
    let Value::Object(obj) = value else {
        return Err(Error::BadJson(format!("expected a JSON object, got {}", kind(&value))));
    };
    let f = Fields { obj: &obj, prefix: String::new() };
    let model = f.string("model")?.ok_or_else(|| Error::invalid("model", "is required"))?.to_owned();
    refuse_unsupported(&f, endpoint)?;

    let input = match endpoint {
        Endpoint::Chat => Input::Chat(messages(&f)?),
        Endpoint::Completions => Input::Prompt(prompt(&f)?),
    };
    // Chat: `max_completion_tokens` supersedes the deprecated `max_tokens`.
    let max_tokens = match endpoint {
        Endpoint::Chat => match f.u32("max_completion_tokens")? {
            Some(m) => Some(m),
            None => f.u32("max_tokens")?,
        },
        Endpoint::Completions => f.u32("max_tokens")?,
    };
    let max_tokens_set = max_tokens.is_some();
    let max_tokens = match (max_tokens, endpoint) {
        (Some(m), _) => Some(m),
        // Chat without a limit: planned with 1 and widened to the context window by the caller.
        (None, Endpoint::Chat) => Some(1),
        (None, Endpoint::Completions) => Some(DEFAULT_COMPLETIONS_MAX_TOKENS),
    };

    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        Some(options) => {
            Fields { obj: options, prefix: "stream_options.".into() }.bool("include_usage")?.unwrap_or(false)
        }
        None => false,
    };

    let logprobs = match endpoint {
        Endpoint::Chat => {
            let wanted = f.bool("logprobs")?.unwrap_or(false);
            let top = f.uint("top_logprobs")?;
            match (wanted, top) {
                (false, Some(t)) if t > 0 => {
                    return Err(Error::invalid("top_logprobs", "requires logprobs to be true"));
                }
                (false, _) => None,
                (true, top) => Some(top_logprobs("top_logprobs", top.unwrap_or(0))?),
            }
        }
        Endpoint::Completions => f.uint("logprobs")?.map(|n| top_logprobs("logprobs", n)).transpose()?,
    };

    let mut generate = pb::GenerateRequest {
        input: Some(input),
        max_tokens,
        temperature: Some(f.f32("temperature")?.unwrap_or(DEFAULT_TEMPERATURE)),
        top_p: f.f32("top_p")?,
        top_k: f.u32("top_k")?,
        seed: f.seed("seed")?,
        stop: stop(&f)?,
        // The coordinator computes target log probabilities when asked for at least one alternative.
        logprobs: logprobs.map_or(0, |n| n.max(1) as u32),
        ..Default::default()
    };
    if let Some(easd) = f.object("easd")? {
        easd_fields(&Fields { obj: easd, prefix: "easd.".into() }, &mut generate)?;
    }
    Ok(ParsedRequest { generate, model, stream, include_usage, logprobs, max_tokens_set })
}

fn top_logprobs(field: &str, n: u64) -> Result<usize, Error> {
    if n > MAX_TOP_LOGPROBS {
        return Err(Error::invalid(field, format!("must be an integer in 0..={MAX_TOP_LOGPROBS}, got {n}")));
    }
    Ok(n as usize)
}

/// Fields whose non-default values would change the output in ways this server does not implement.
fn refuse_unsupported(f: &Fields<'_>, endpoint: Endpoint) -> Result<(), Error> {
    if let Some(n) = f.uint("n")?
        && n != 1
    {
        return Err(Error::invalid("n", format!("only n = 1 is supported, got {n}")));
    }
    for field in ["presence_penalty", "frequency_penalty"] {
        if let Some(p) = f.f32(field)?
            && p != 0.0
        {
            return Err(Error::invalid(field, format!("is not supported (must be 0), got {p}")));
        }
    }
    if f.object("logit_bias")?.is_some_and(|m| !m.is_empty()) {
        return Err(Error::invalid("logit_bias", "is not supported"));
    }
    for field in ["tools", "functions"] {
        if f.get(field).is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
            return Err(Error::invalid(field, "tool calling is not supported"));
        }
    }
    let format = f.object("response_format")?.map(|obj| Fields { obj, prefix: "response_format.".into() });
    if let Some(format) = format
        && format.string("type")? != Some("text")
    {
        return Err(Error::invalid("response_format", "only {\"type\": \"text\"} is supported"));
    }
    if endpoint == Endpoint::Completions {
        if let Some(b) = f.uint("best_of")?
            && b != 1
        {
            return Err(Error::invalid("best_of", format!("only best_of = 1 is supported, got {b}")));
        }
        if f.bool("echo")? == Some(true) {
            return Err(Error::invalid("echo", "is not supported"));
        }
        if f.string("suffix")?.is_some_and(|s| !s.is_empty()) {
            return Err(Error::invalid("suffix", "is not supported"));
        }
    }
    Ok(())
}

fn messages(f: &Fields<'_>) -> Result<pb::ChatMessages, Error> {
    let items = f.array("messages")?.ok_or_else(|| Error::invalid("messages", "is required"))?;
    let mut messages = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(obj) = item else {
            return Err(Error::invalid(format!("messages[{i}]"), format!("must be an object, got {}", kind(item))));
        };
        let m = Fields { obj, prefix: format!("messages[{i}].") };
        let role = m.string("role")?.ok_or_else(|| Error::invalid(m.name("role"), "is required"))?;
        // OpenAI's newer name for the system role.
        let role = if role == "developer" { "system" } else { role };
        let content = match m.get("content") {
            None if role == "assistant" => String::new(),
            None => return Err(Error::invalid(m.name("content"), "is required")),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => text_parts(&m.name("content"), parts)?,
            Some(other) => {
                return Err(Error::invalid(
                    m.name("content"),
                    format!("must be a string or an array of text parts, got {}", kind(other)),
                ));
            }
        };
        messages.push(pb::ChatMessage { role: role.to_owned(), content });
    }
    Ok(pb::ChatMessages { messages })
}

fn text_parts(field: &str, parts: &[Value]) -> Result<String, Error> {
    let mut text = String::new();
    for part in parts {
        let part_type = part.get("type").and_then(Value::as_str);
        match (part_type, part.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => text.push_str(t),
            (Some(other), _) if other != "text" => {
                return Err(Error::invalid(
                    field,
                    format!("only text parts are supported, got a part of type {other}"),
                ));
            }
            _ => return Err(Error::invalid(field, "each part must be {\"type\": \"text\", \"text\": string}")),
        }
    }
    Ok(text)
}

fn prompt(f: &Fields<'_>) -> Result<String, Error> {
    match f.get("prompt") {
        None => Err(Error::invalid("prompt", "is required")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(s)] => Ok(s.clone()),
            [Value::Number(_), ..] => Err(Error::invalid("prompt", "token-id prompts are not supported; send text")),
            _ => Err(Error::invalid("prompt", "exactly one prompt string per request is supported")),
        },
        Some(other) => Err(Error::invalid("prompt", format!("must be a string, got {}", kind(other)))),
    }
}

fn stop(f: &Fields<'_>) -> Result<Vec<String>, Error> {
    match f.get("stop") {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| Error::invalid("stop", format!("must hold strings, got {}", kind(v))))
            })
            .collect(),
        Some(other) => {
            Err(Error::invalid("stop", format!("must be a string or an array of strings, got {}", kind(other))))
        }
    }
}

const EASD_FIELDS: &str = "mode, k, top_n, rho, tau_draft, tau_target, order, penalty_alpha, pipeline";

/// The `easd` extension object: mode, block size and the EASD rule's parameters (DESIGN §2.2).
fn easd_fields(f: &Fields<'_>, generate: &mut pb::GenerateRequest) -> Result<(), Error> {
    if let Some(key) = f.obj.keys().find(|k| !EASD_FIELDS.split(", ").any(|known| known == k.as_str())) {
        return Err(Error::invalid(f.name(key), format!("unknown field; expected one of {EASD_FIELDS}")));
    }
    if let Some(mode) = f.string("mode")? {
        let kind = ModeKind::ALL.into_iter().find(|m| m.name() == mode).ok_or_else(|| {
            Error::invalid(f.name("mode"), format!("must be one of sd, easd, target, draft; got {mode:?}"))
        })?;
        generate.mode = kind.to_pb() as i32;
    }
    generate.k = f.u32("k")?;
    generate.pipeline = f.bool("pipeline")?;
    let order = match f.string("order")? {
        None => pb::EasdOrder::Unspecified,
        Some("after_sd") => pb::EasdOrder::AfterSd,
        Some("gate") => pb::EasdOrder::Gate,
        Some(other) => {
            return Err(Error::invalid(f.name("order"), format!("must be after_sd or gate; got {other:?}")));
        }
    };
    generate.easd = Some(pb::EasdParams {
        top_n: f.u32("top_n")?,
        rho: f.f32("rho")?,
        tau_draft: f.f32("tau_draft")?,
        tau_target: f.f32("tau_target")?,
        order: order as i32,
        penalty_alpha: f.f32("penalty_alpha")?,
    });
    Ok(())
}

/// Typed access to the fields of one JSON object; `null` counts as absent, as in OpenAI's API.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    /// Path of the object in the body (`easd.`), so errors name the full field.
    prefix: String,
}

impl<'a> Fields<'a> {
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn typed<T>(&self, key: &str, what: &str, cast: impl FnOnce(&'a Value) -> Option<T>) -> Result<Option<T>, Error> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => cast(v)
                .map(Some)
                .ok_or_else(|| Error::invalid(self.name(key), format!("must be {what}, got {}", kind(v)))),
        }
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>, Error> {
        self.typed(key, "a string", Value::as_str)
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, Error> {
        self.typed(key, "a boolean", Value::as_bool)
    }

    fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, Error> {
        self.typed(key, "an object", Value::as_object)
    }

    fn array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, Error> {
        self.typed(key, "an array", Value::as_array)
    }

    fn f32(&self, key: &str) -> Result<Option<f32>, Error> {
        self.typed(key, "a number", Value::as_f64).map(|v| v.map(|x| x as f32))
    }

    fn uint(&self, key: &str) -> Result<Option<u64>, Error> {
        self.typed(key, "a non-negative integer", Value::as_u64)
    }

    fn u32(&self, key: &str) -> Result<Option<u32>, Error> {
        match self.uint(key)? {
            None => Ok(None),
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| Error::invalid(self.name(key), format!("must be at most {}, got {v}", u32::MAX))),
        }
    }

    /// OpenAI seeds are 64-bit signed; negative ones map to distinct unsigned seeds.
    fn seed(&self, key: &str) -> Result<Option<u64>, Error> {
        self.typed(key, "an integer", |v| v.as_u64().or_else(|| v.as_i64().map(|i| i as u64)))
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a fractional number",
        Value::Number(n) if n.as_i64().is_some_and(|i| i < 0) => "a negative integer",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<ParsedRequest, Error> {
        parse(body.as_bytes(), Endpoint::Chat)
    }

    fn field_of(e: Error) -> String {
        match e {
            Error::InvalidField { field, .. } => field,
            other => panic!("expected an invalid field, got {other}"),
        }
    }

    const HI: &str = r#""model":"m","messages":[{"role":"user","content":"hi"}]"#;

    #[test]
    fn a_minimal_chat_request_gets_openai_defaults() {
        let p = chat(&format!("{{{HI}}}")).unwrap();
        assert_eq!(p.model, "m");
        assert_eq!(p.generate.temperature, Some(1.0));
        assert_eq!(p.generate.max_tokens, Some(1));
        assert!(!p.max_tokens_set && !p.stream && p.logprobs.is_none());
        assert_eq!(p.generate.mode, pb::Mode::Unspecified as i32);
        let Some(Input::Chat(c)) = p.generate.input else { panic!("chat input") };
        assert_eq!((c.messages[0].role.as_str(), c.messages[0].content.as_str()), ("user", "hi"));
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let p = chat(&format!(r#"{{{HI},"max_tokens":5,"max_completion_tokens":7}}"#)).unwrap();
        assert_eq!((p.generate.max_tokens, p.max_tokens_set), (Some(7), true));
    }

    #[test]
    fn completions_default_to_sixteen_tokens_and_take_integer_logprobs() {
        let p = parse(br#"{"model":"m","prompt":["once"],"logprobs":2,"stop":"\n"}"#, Endpoint::Completions).unwrap();
        assert_eq!(p.generate.max_tokens, Some(16));
        assert_eq!((p.logprobs, p.generate.logprobs), (Some(2), 2));
        assert_eq!(p.generate.stop, vec!["\n".to_string()]);
        assert_eq!(p.generate.input, Some(Input::Prompt("once".into())));
    }

    #[test]
    fn chat_logprobs_without_alternatives_still_ask_the_target() {
        let p = chat(&format!(r#"{{{HI},"logprobs":true}}"#)).unwrap();
        assert_eq!((p.logprobs, p.generate.logprobs), (Some(0), 1));
        assert_eq!(field_of(chat(&format!(r#"{{{HI},"top_logprobs":3}}"#)).unwrap_err()), "top_logprobs");
        assert_eq!(
            field_of(chat(&format!(r#"{{{HI},"logprobs":true,"top_logprobs":21}}"#)).unwrap_err()),
            "top_logprobs"
        );
    }

    #[test]
    fn the_easd_object_sets_mode_block_size_and_thresholds() {
        let p = chat(&format!(r#"{{{HI},"easd":{{"mode":"easd","k":6,"tau_draft":0.5,"rho":0.2,"order":"gate"}}}}"#))
            .unwrap();
        assert_eq!(p.generate.mode, pb::Mode::Easd as i32);
        assert_eq!(p.generate.pipeline, None);
        let sequential = chat(&format!(r#"{{{HI},"easd":{{"pipeline":false}}}}"#)).unwrap();
        assert_eq!(sequential.generate.pipeline, Some(false));
        assert_eq!(p.generate.k, Some(6));
        let e = p.generate.easd.unwrap();
        assert_eq!(
            (e.tau_draft, e.rho, e.tau_target, e.order),
            (Some(0.5), Some(0.2), None, pb::EasdOrder::Gate as i32)
        );
        assert_eq!(field_of(chat(&format!(r#"{{{HI},"easd":{{"mode":"fast"}}}}"#)).unwrap_err()), "easd.mode");
        assert_eq!(field_of(chat(&format!(r#"{{{HI},"easd":{{"tua_draft":1}}}}"#)).unwrap_err()), "easd.tua_draft");
    }

    #[test]
    fn every_malformed_field_is_named() {
        let cases = [
            (r#"{"messages":[{"role":"user","content":"hi"}]}"#.to_string(), "model"),
            (r#"{"model":"m"}"#.to_string(), "messages"),
            (r#"{"model":"m","messages":[3]}"#.to_string(), "messages[0]"),
            (r#"{"model":"m","messages":[{"content":"x"}]}"#.to_string(), "messages[0].role"),
            (
                r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#.to_string(),
                "messages[0].content",
            ),
            (format!(r#"{{{HI},"temperature":"hot"}}"#), "temperature"),
            (format!(r#"{{{HI},"n":2}}"#), "n"),
            (format!(r#"{{{HI},"max_tokens":-1}}"#), "max_tokens"),
            (format!(r#"{{{HI},"max_tokens":1.5}}"#), "max_tokens"),
            (format!(r#"{{{HI},"seed":0.5}}"#), "seed"),
            (format!(r#"{{{HI},"stop":[1]}}"#), "stop"),
            (format!(r#"{{{HI},"stream":"yes"}}"#), "stream"),
            (format!(r#"{{{HI},"stream_options":{{"include_usage":1}}}}"#), "stream_options.include_usage"),
            (format!(r#"{{{HI},"frequency_penalty":0.5}}"#), "frequency_penalty"),
            (format!(r#"{{{HI},"tools":[{{"type":"function"}}]}}"#), "tools"),
            (format!(r#"{{{HI},"easd":{{"k":"four"}}}}"#), "easd.k"),
        ];
        for (body, field) in cases {
            assert_eq!(field_of(chat(&body).unwrap_err()), field, "{body}");
        }
        let completions =
            [(r#"{"model":"m","prompt":[1,2]}"#, "prompt"), (r#"{"model":"m","prompt":"a","echo":true}"#, "echo")];
        for (body, field) in completions {
            assert_eq!(field_of(parse(body.as_bytes(), Endpoint::Completions).unwrap_err()), field, "{body}");
        }
    }

    #[test]
    fn nulls_count_as_absent_and_negative_seeds_are_accepted() {
        let p = chat(&format!(r#"{{{HI},"temperature":null,"stop":null,"seed":-1,"n":1}}"#)).unwrap();
        assert_eq!(p.generate.temperature, Some(1.0));
        assert_eq!(p.generate.seed, Some(u64::MAX));
    }

    #[test]
    fn text_parts_are_joined_and_developer_is_a_system_message() {
        let p = chat(
            r#"{"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        )
        .unwrap();
        let Some(Input::Chat(c)) = p.generate.input else { panic!("chat input") };
        assert_eq!((c.messages[0].role.as_str(), c.messages[0].content.as_str()), ("system", "ab"));
    }

    #[test]
    fn bodies_that_are_not_json_objects_are_refused() {
        assert!(matches!(chat("{"), Err(Error::BadJson(_))));
        assert!(matches!(chat("[1]"), Err(Error::BadJson(_))));
    }
}
