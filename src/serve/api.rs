//! The OpenAI wire format of chat completions and of (legacy) completions:
//! reading a request into what the engine needs (or an OpenAI-style error
//! naming the parameter), and the JSON of answers, stream chunks, model
//! lists and errors.
//!
//! A request is read field by field from the JSON object rather than
//! through a derived struct, so every refusal can name its parameter and
//! say why: unknown fields are refused as the OpenAI API does, features
//! this server lacks (tools, `n` > 1, `logit_bias`, log-probabilities,
//! structured output, penalties) are refused by name, and fields that only
//! concern OpenAI's service (`user`, `metadata`, `store`, ...) are accepted
//! and ignored.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::data::{Message, Role};

/// An error answer: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn invalid(
        message: impl Into<String>,
        param: Option<&str>,
        code: Option<&'static str>,
    ) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
            code,
        }
    }

    /// A parameter this server does not implement.
    fn unsupported(param: &str, what: &str) -> Self {
        Self::invalid(
            format!("`{param}` is not supported by this server: {what}"),
            Some(param),
            Some("unsupported_parameter"),
        )
    }

    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "Incorrect or missing API key: send `Authorization: Bearer <key>` with the key the server was started with".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    pub fn not_found(message: impl Into<String>, code: Option<&'static str>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code,
        }
    }

    pub fn server(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`: messages through the chat template.
    Chat,
    /// `/v1/completions`: a raw prompt continued.
    Completion,
}

/// What the model continues.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A chat, rendered with the model's template.
    Messages(Vec<Message>),
    /// A raw prompt.
    Prompt(String),
}

/// A request, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// Which of the served models (an index into the names).
    pub model: usize,
    pub input: Input,
    /// `max_completion_tokens`, else `max_tokens`; `None`: the server's default.
    pub max_tokens: Option<usize>,
    pub temperature: f64,
    pub top_p: f64,
    pub stop: Vec<String>,
    pub seed: Option<u64>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
}

impl ChatRequest {
    /// The chat's messages (empty for a raw prompt).
    pub fn messages(&self) -> &[Message] {
        match &self.input {
            Input::Messages(m) => m,
            Input::Prompt(_) => &[],
        }
    }
}

/// Accepted and ignored: they concern OpenAI's service, not the answer.
const IGNORED: [&str; 7] = [
    "user",
    "metadata",
    "store",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "parallel_tool_calls",
];

/// Refused by name, with the reason.
const UNSUPPORTED: [(&str, &str); 10] = [
    ("tools", "the server has no tool calling"),
    ("tool_choice", "the server has no tool calling"),
    ("functions", "the server has no function calling"),
    ("function_call", "the server has no function calling"),
    ("audio", "the server answers in text"),
    ("prediction", "predicted outputs are not implemented"),
    (
        "reasoning_effort",
        "the model's reasoning is set by its chat template",
    ),
    ("web_search_options", "the server has no web search"),
    ("top_logprobs", "log-probabilities are not returned"),
    ("modalities", "the server answers in text only"),
];

/// Fields both endpoints read.
const KNOWN: [&str; 13] = [
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "n",
    "stream",
    "stream_options",
    "logit_bias",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
];

/// Reads a `/v1/chat/completions` body for a server serving `names`.
pub fn parse_chat(body: &[u8], names: &[String]) -> Result<ChatRequest, ApiError> {
    parse(body, names, Kind::Chat)
}

/// Reads a `/v1/completions` body for a server serving `names`.
pub fn parse_completion(body: &[u8], names: &[String]) -> Result<ChatRequest, ApiError> {
    parse(body, names, Kind::Completion)
}

/// The served names for a message: `a`, `b` and `c`.
fn listed(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

fn parse(body: &[u8], names: &[String], kind: Kind) -> Result<ChatRequest, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            format!("the body is not valid JSON: {e}"),
            None,
            Some("invalid_json"),
        )
    })?;
    let Value::Object(obj) = v else {
        return Err(ApiError::invalid(
            "the body must be a JSON object",
            None,
            Some("invalid_json"),
        ));
    };
    let own: &[&str] = match kind {
        Kind::Chat => &["messages", "max_completion_tokens", "response_format"],
        Kind::Completion => &["prompt", "echo", "best_of", "suffix"],
    };
    for (k, v) in &obj {
        if v.is_null()
            || IGNORED.contains(&k.as_str())
            || KNOWN.contains(&k.as_str())
            || own.contains(&k.as_str())
        {
            continue;
        }
        if let Some((_, why)) = UNSUPPORTED.iter().find(|(p, _)| p == k) {
            // `modalities: ["text"]` asks for what the server does anyway.
            if k == "modalities" && v == &json!(["text"]) {
                continue;
            }
            return Err(ApiError::unsupported(k, why));
        }
        return Err(ApiError::invalid(
            format!("Unrecognized request argument supplied: {k}"),
            Some(k),
            Some("unknown_parameter"),
        ));
    }
    let get = |k: &str| obj.get(k).filter(|v| !v.is_null());

    let model = match get("model") {
        Some(Value::String(m)) => match names.iter().position(|n| n == m) {
            Some(i) => i,
            None => {
                return Err(ApiError::invalid(
                    format!(
                        "The model `{m}` does not exist; this server serves {}",
                        listed(names)
                    ),
                    Some("model"),
                    Some("model_not_found"),
                ));
            }
        },
        Some(_) => {
            return Err(ApiError::invalid(
                "`model` must be a string",
                Some("model"),
                None,
            ));
        }
        None => {
            return Err(ApiError::invalid(
                format!("`model` is required (this server serves {})", listed(names)),
                Some("model"),
                None,
            ));
        }
    };
    let input = match kind {
        Kind::Chat => Input::Messages(parse_messages(get("messages"))?),
        Kind::Completion => Input::Prompt(parse_prompt(get("prompt"))?),
    };
    if kind == Kind::Completion {
        if let Some(e) = get("echo")
            && e != &Value::Bool(false)
        {
            return Err(ApiError::unsupported(
                "echo",
                "the prompt is not repeated in the answer",
            ));
        }
        if let Some(b) = get("best_of")
            && b.as_u64() != Some(1)
        {
            return Err(ApiError::unsupported("best_of", "one candidate a request"));
        }
        if let Some(s) = get("suffix")
            && s != &json!("")
        {
            return Err(ApiError::unsupported(
                "suffix",
                "text is continued, not inserted",
            ));
        }
    }

    if let Some(n) = get("n")
        && n.as_u64() != Some(1)
    {
        return Err(ApiError::unsupported("n", "one choice a request (n = 1)"));
    }
    if let Some(b) = get("logit_bias")
        && b.as_object().is_none_or(|m| !m.is_empty())
    {
        return Err(ApiError::unsupported("logit_bias", "logits are not biased"));
    }
    if let Some(l) = get("logprobs")
        && l != &Value::Bool(false)
        && l != &json!(0)
    {
        return Err(ApiError::unsupported(
            "logprobs",
            "log-probabilities are not returned",
        ));
    }
    if let Some(f) = get("response_format")
        && f.get("type") != Some(&json!("text"))
    {
        return Err(ApiError::unsupported(
            "response_format",
            "structured output is not implemented (only {\"type\": \"text\"})",
        ));
    }
    for p in ["presence_penalty", "frequency_penalty"] {
        if let Some(x) = get(p)
            && x.as_f64() != Some(0.0)
        {
            return Err(ApiError::unsupported(
                p,
                "penalties are not implemented (only 0)",
            ));
        }
    }

    let count = |k: &str| -> Result<Option<usize>, ApiError> {
        match get(k) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 => Ok(Some(n as usize)),
                _ => Err(ApiError::invalid(
                    format!("`{k}` must be an integer >= 1, not {v}"),
                    Some(k),
                    Some("invalid_value"),
                )),
            },
        }
    };
    let max_tokens = match kind {
        Kind::Chat => count("max_completion_tokens")?.or(count("max_tokens")?),
        Kind::Completion => count("max_tokens")?,
    };
    let number = |k: &str, default: f64, lo: f64, hi: f64| -> Result<f64, ApiError> {
        match get(k) {
            None => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if (lo..=hi).contains(&x) => Ok(x),
                _ => Err(ApiError::invalid(
                    format!("`{k}` must be a number from {lo} to {hi}, not {v}"),
                    Some(k),
                    Some("invalid_value"),
                )),
            },
        }
    };
    let mut temperature = number("temperature", 1.0, 0.0, 2.0)?;
    let mut top_p = number("top_p", 1.0, 0.0, 1.0)?;
    if top_p == 0.0 {
        // A nucleus of no mass: the most likely token alone.
        (temperature, top_p) = (0.0, 1.0);
    }
    let stop = match get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .filter(|v| v.len() <= 4)
            .ok_or_else(|| {
                ApiError::invalid(
                    "`stop` must be a string or a list of at most 4 strings",
                    Some("stop"),
                    Some("invalid_value"),
                )
            })?,
        Some(_) => {
            return Err(ApiError::invalid(
                "`stop` must be a string or a list of at most 4 strings",
                Some("stop"),
                Some("invalid_value"),
            ));
        }
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "`stop` strings must not be empty",
            Some("stop"),
            Some("invalid_value"),
        ));
    }
    let seed = match get("seed") {
        None => None,
        Some(v) => Some(
            v.as_i64()
                .map(|s| s as u64)
                .or_else(|| v.as_u64())
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("`seed` must be an integer, not {v}"),
                        Some("seed"),
                        Some("invalid_value"),
                    )
                })?,
        ),
    };
    let stream = match get("stream") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(ApiError::invalid(
                format!("`stream` must be true or false, not {v}"),
                Some("stream"),
                Some("invalid_value"),
            ));
        }
    };
    let include_usage = match get("stream_options") {
        None => false,
        Some(_) if !stream => {
            return Err(ApiError::invalid(
                "`stream_options` is only allowed with `stream: true`",
                Some("stream_options"),
                Some("invalid_value"),
            ));
        }
        Some(o) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(ApiError::invalid(
                    format!("`stream_options.include_usage` must be true or false, not {v}"),
                    Some("stream_options.include_usage"),
                    Some("invalid_value"),
                ));
            }
        },
    };
    Ok(ChatRequest {
        model,
        input,
        max_tokens,
        temperature,
        top_p,
        stop,
        seed,
        stream,
        include_usage,
    })
}

/// A completion's prompt: a string, or a list holding one.
fn parse_prompt(v: Option<&Value>) -> Result<String, ApiError> {
    let bad = |msg: &str| ApiError::invalid(msg, Some("prompt"), Some("invalid_value"));
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) => match &items[..] {
            [Value::String(s)] => Ok(s.clone()),
            [_, _, ..] if items.iter().all(Value::is_string) => Err(ApiError::unsupported(
                "prompt",
                "one prompt a request (send the others as their own requests)",
            )),
            _ => Err(bad("`prompt` must be a string (or a list of one string)")),
        },
        Some(_) => Err(bad("`prompt` must be a string (or a list of one string)")),
        None => Err(bad("`prompt` is required")),
    }
}

fn parse_messages(v: Option<&Value>) -> Result<Vec<Message>, ApiError> {
    let bad = |i: Option<usize>, field: &str, msg: String| {
        let param = match i {
            Some(i) => format!("messages[{i}]{field}"),
            None => "messages".to_owned(),
        };
        ApiError::invalid(msg, Some(&param), Some("invalid_value"))
    };
    let list = match v {
        Some(Value::Array(l)) if !l.is_empty() => l,
        Some(Value::Array(_)) => {
            return Err(bad(None, "", "`messages` must not be empty".into()));
        }
        Some(_) => return Err(bad(None, "", "`messages` must be a list".into())),
        None => return Err(bad(None, "", "`messages` is required".into())),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let Some(m) = m.as_object() else {
            return Err(bad(Some(i), "", "a message must be an object".into()));
        };
        if m.get("tool_calls").is_some_and(|t| !t.is_null()) {
            return Err(ApiError::unsupported(
                &format!("messages[{i}].tool_calls"),
                "the server has no tool calling",
            ));
        }
        let role = match m.get("role").and_then(Value::as_str) {
            Some("system" | "developer") => Role::System,
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some(r @ ("tool" | "function")) => {
                return Err(ApiError::unsupported(
                    &format!("messages[{i}].role"),
                    &format!("`{r}` messages need tool calling, which the server lacks"),
                ));
            }
            Some(r) => {
                return Err(bad(
                    Some(i),
                    ".role",
                    format!("unknown role `{r}` (system, developer, user or assistant)"),
                ));
            }
            None => return Err(bad(Some(i), ".role", "`role` is required".into())),
        };
        let content =
            text_content(m.get("content")).map_err(|msg| bad(Some(i), ".content", msg))?;
        out.push(Message::new(role, content));
    }
    Ok(out)
}

/// A message's content: a string, or a list of `{"type": "text", "text"}`
/// parts joined.
fn text_content(v: Option<&Value>) -> Result<String, String> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(
                |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => Ok(t.as_str()),
                    (Some(t), _) if t != "text" => Err(format!(
                        "content parts of type `{t}` are not supported (text only)"
                    )),
                    _ => {
                        Err("a content part must be {\"type\": \"text\", \"text\": \"...\"}".into())
                    }
                },
            )
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.concat()),
        None | Some(Value::Null) => Err("`content` is required".into()),
        Some(other) => Err(format!(
            "`content` must be a string or a list of text parts, not {other}"
        )),
    }
}

/// The usage object.
pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// A whole answer (`chat.completion`).
pub fn completion(
    id: &str,
    created: u64,
    model: &str,
    text: &str,
    finish: &str,
    usage: Value,
) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": null},
            "logprobs": null,
            "finish_reason": finish,
        }],
        "usage": usage,
        "system_fingerprint": null,
    })
}

/// A whole answer to a raw prompt (`text_completion`).
pub fn text_completion(
    id: &str,
    created: u64,
    model: &str,
    text: &str,
    finish: &str,
    usage: Value,
) -> Value {
    json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{
            "text": text,
            "index": 0,
            "logprobs": null,
            "finish_reason": finish,
        }],
        "usage": usage,
        "system_fingerprint": null,
    })
}

/// One stream chunk of a raw prompt's answer (`text_completion` with a
/// piece of text); `piece: None` is the usage chunk, whose `choices` is
/// empty.
pub fn text_chunk(
    id: &str,
    created: u64,
    model: &str,
    piece: Option<(&str, Option<&str>)>,
    usage: Option<Value>,
    with_usage: bool,
) -> Value {
    let choices = match piece {
        Some((text, finish)) => json!([{
            "text": text,
            "index": 0,
            "logprobs": null,
            "finish_reason": finish,
        }]),
        None => json!([]),
    };
    stream_chunk(
        "text_completion",
        id,
        created,
        model,
        choices,
        usage,
        with_usage,
    )
}

/// One stream chunk (`chat.completion.chunk`); `choice: None` is the usage
/// chunk, whose `choices` is empty.
pub fn chunk(
    id: &str,
    created: u64,
    model: &str,
    choice: Option<(Value, Option<&str>)>,
    usage: Option<Value>,
    with_usage: bool,
) -> Value {
    let choices = match choice {
        Some((delta, finish)) => json!([{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish,
        }]),
        None => json!([]),
    };
    stream_chunk(
        "chat.completion.chunk",
        id,
        created,
        model,
        choices,
        usage,
        with_usage,
    )
}

/// A stream chunk of `object` around `choices`. With include_usage every
/// chunk has the `usage` field, null but in the last.
fn stream_chunk(
    object: &str,
    id: &str,
    created: u64,
    model: &str,
    choices: Value,
    usage: Option<Value>,
    with_usage: bool,
) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), id.into());
    m.insert("object".into(), object.into());
    m.insert("created".into(), created.into());
    m.insert("model".into(), model.into());
    m.insert("system_fingerprint".into(), Value::Null);
    m.insert("choices".into(), choices);
    if with_usage {
        m.insert("usage".into(), usage.unwrap_or(Value::Null));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["m".to_owned()]
    }

    fn parse(v: Value) -> Result<ChatRequest, ApiError> {
        parse_chat(v.to_string().as_bytes(), &names())
    }

    fn base() -> Value {
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    }

    fn with(k: &str, v: Value) -> Value {
        let mut b = base();
        b[k] = v;
        b
    }

    #[test]
    fn defaults_and_fields() {
        let r = parse(base()).unwrap();
        assert_eq!(
            (r.temperature, r.top_p, r.max_tokens, r.stream),
            (1.0, 1.0, None, false)
        );
        let r = parse(json!({
            "model": "m",
            "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                         {"role": "user", "content": "q"}],
            "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5,
            "stop": ["x", "yy"], "seed": -1, "n": 1, "stream": true,
            "stream_options": {"include_usage": true}, "user": "u", "logit_bias": {}, "tools": null,
        }))
        .unwrap();
        assert_eq!(r.messages()[0], Message::new(Role::System, "ab"));
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!((r.temperature, r.top_p), (0.0, 0.5));
        assert_eq!(r.stop, vec!["x", "yy"]);
        assert_eq!(r.seed, Some(u64::MAX));
        assert!(r.stream && r.include_usage);
        assert_eq!(parse(with("stop", json!("END"))).unwrap().stop, vec!["END"]);
    }

    #[test]
    fn refusals_name_their_parameter() {
        let cases = [
            (with("n", json!(2)), "n", "unsupported_parameter"),
            (
                with("tools", json!([{"type": "function"}])),
                "tools",
                "unsupported_parameter",
            ),
            (
                with("logit_bias", json!({"5": 10})),
                "logit_bias",
                "unsupported_parameter",
            ),
            (
                with("logprobs", json!(true)),
                "logprobs",
                "unsupported_parameter",
            ),
            (with("model", json!("other")), "model", "model_not_found"),
            (with("messages", json!([])), "messages", "invalid_value"),
            (
                with("messages", json!([{"role": "tool", "content": "x"}])),
                "messages[0].role",
                "unsupported_parameter",
            ),
            (
                with("messages", json!([{"role": "user"}])),
                "messages[0].content",
                "invalid_value",
            ),
            (
                with("temperature", json!(3)),
                "temperature",
                "invalid_value",
            ),
            (with("max_tokens", json!(0)), "max_tokens", "invalid_value"),
            (
                with("stop", json!(["a", "b", "c", "d", "e"])),
                "stop",
                "invalid_value",
            ),
            (
                with("frequency_penalty", json!(0.5)),
                "frequency_penalty",
                "unsupported_parameter",
            ),
            (with("bogus", json!(1)), "bogus", "unknown_parameter"),
            (
                with("stream_options", json!({"include_usage": true})),
                "stream_options",
                "invalid_value",
            ),
        ];
        for (body, param, code) in cases {
            let e = parse(body.clone()).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(
                (e.param.as_deref(), e.code),
                (Some(param), Some(code)),
                "{body}: {e:?}"
            );
            assert_eq!(e.body()["error"]["type"], "invalid_request_error");
        }
        let e = parse_chat(b"{not json", &names()).unwrap_err();
        assert_eq!(e.code, Some("invalid_json"));
    }

    #[test]
    fn a_completion_reads_its_prompt_and_refuses_what_it_cannot_do() {
        let names: Vec<String> = ["base", "a1"].map(String::from).to_vec();
        let read = |v: Value| parse_completion(v.to_string().as_bytes(), &names);
        let r = read(json!({"model": "a1", "prompt": "def f():", "max_tokens": 3, "echo": false, "best_of": 1, "suffix": ""})).unwrap();
        assert_eq!(
            (r.model, &r.input, r.max_tokens),
            (1, &Input::Prompt("def f():".into()), Some(3))
        );
        assert_eq!(
            read(json!({"model": "base", "prompt": ["x"]}))
                .unwrap()
                .input,
            Input::Prompt("x".into())
        );
        let cases = [
            (json!({"model": "base"}), "prompt", "invalid_value"),
            (
                json!({"model": "base", "prompt": ["a", "b"]}),
                "prompt",
                "unsupported_parameter",
            ),
            (
                json!({"model": "base", "prompt": [1, 2]}),
                "prompt",
                "invalid_value",
            ),
            (
                json!({"model": "base", "prompt": "x", "echo": true}),
                "echo",
                "unsupported_parameter",
            ),
            (
                json!({"model": "base", "prompt": "x", "best_of": 3}),
                "best_of",
                "unsupported_parameter",
            ),
            (
                json!({"model": "base", "prompt": "x", "suffix": "y"}),
                "suffix",
                "unsupported_parameter",
            ),
            (
                json!({"model": "base", "prompt": "x", "logprobs": 2}),
                "logprobs",
                "unsupported_parameter",
            ),
            (
                json!({"model": "base", "prompt": "x", "messages": []}),
                "messages",
                "unknown_parameter",
            ),
            (
                json!({"model": "a2", "prompt": "x"}),
                "model",
                "model_not_found",
            ),
        ];
        for (body, param, code) in cases {
            let e = read(body.clone()).unwrap_err();
            assert_eq!(
                (e.param.as_deref(), e.code),
                (Some(param), Some(code)),
                "{body}: {e:?}"
            );
        }
        let e = read(json!({"model": "a2", "prompt": "x"})).unwrap_err();
        assert!(e.message.contains("`base` and `a1`"), "{}", e.message);
        // A chat request names its model among several too.
        let r = parse_chat(
            json!({"model": "a1", "messages": [{"role": "user", "content": "hi"}]})
                .to_string()
                .as_bytes(),
            &names,
        )
        .unwrap();
        assert_eq!(r.model, 1);
    }
}
