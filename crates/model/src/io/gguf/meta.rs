//! The GGUF's metadata, read leniently (integers of any width, floats of
//! either width), and the model shape its `<arch>.*` keys give, checked.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

/// The shortest decimal that reads back as `v`, as f64: an f32 `1e-5` is
/// written as `1e-5`, not `9.999999747378752e-6`.
pub(super) fn shortest_f64(v: f32) -> f64 {
    v.to_string().parse().expect("a printed f32 parses")
}

/// The GGUF's metadata, read leniently: integers of any width, floats of
/// either width.
pub(super) struct Meta<'a>(pub(super) &'a HashMap<String, Value>);

impl Meta<'_> {
    pub(super) fn uint(&self, key: &str) -> Option<u64> {
        self.0.get(key).and_then(as_uint)
    }

    pub(super) fn float(&self, key: &str) -> Option<f64> {
        match self.0.get(key)? {
            Value::F32(v) => Some(shortest_f64(*v)),
            Value::F64(v) => Some(*v),
            v => as_uint(v).map(|u| u as f64),
        }
    }

    pub(super) fn string(&self, key: &str) -> Option<&str> {
        match self.0.get(key)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub(super) fn boolean(&self, key: &str) -> Option<bool> {
        match self.0.get(key)? {
            Value::Bool(b) => Some(*b),
            v => as_uint(v).map(|u| u != 0),
        }
    }

    pub(super) fn strings(&self, key: &str) -> Option<Vec<String>> {
        match self.0.get(key)? {
            Value::Array(items) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    pub(super) fn ints(&self, key: &str) -> Option<Vec<i64>> {
        match self.0.get(key)? {
            Value::Array(items) => items.iter().map(as_int).collect(),
            _ => None,
        }
    }
}

fn as_int(v: &Value) -> Option<i64> {
    Some(match *v {
        Value::U8(x) => x.into(),
        Value::I8(x) => x.into(),
        Value::U16(x) => x.into(),
        Value::I16(x) => x.into(),
        Value::U32(x) => x.into(),
        Value::I32(x) => x.into(),
        Value::U64(x) => i64::try_from(x).ok()?,
        Value::I64(x) => x,
        _ => return None,
    })
}

pub(super) fn as_uint(v: &Value) -> Option<u64> {
    as_int(v).and_then(|i| u64::try_from(i).ok())
}

/// The model's shape, from the `<arch>.*` metadata (`llama.*`, `qwen3.*`).
pub(super) struct Hparams {
    pub(super) vocab_size: usize,
    pub(super) hidden_size: usize,
    pub(super) intermediate_size: usize,
    pub(super) num_hidden_layers: usize,
    pub(super) num_attention_heads: usize,
    pub(super) num_key_value_heads: usize,
    pub(super) head_dim: usize,
    pub(super) max_position_embeddings: usize,
    pub(super) rms_norm_eps: f64,
    pub(super) rope_theta: f64,
}

pub(super) fn read_hparams(
    meta: &Meta,
    arch: &str,
    vocab_size: Option<usize>,
    problems: &mut Vec<String>,
) -> Option<Hparams> {
    let key = |name: &str| format!("{arch}.{name}");
    let mut required = |name: &str| {
        let key = key(name);
        let v = meta.uint(&key).map(|v| v as usize);
        if v.is_none() {
            problems.push(format!("missing or non-integer metadata `{key}`"));
        }
        v
    };
    let hidden = required("embedding_length");
    let intermediate = required("feed_forward_length");
    let layers = required("block_count");
    let heads = required("attention.head_count");
    let context = required("context_length");
    let kv_heads = meta
        .uint(&key("attention.head_count_kv"))
        .map(|v| v as usize)
        .or(heads);
    let eps = meta.float(&key("attention.layer_norm_rms_epsilon"));
    if eps.is_none() {
        problems.push(format!(
            "missing metadata `{}`",
            key("attention.layer_norm_rms_epsilon")
        ));
    }
    // llama.cpp's default base frequency.
    let theta = meta.float(&key("rope.freq_base")).unwrap_or(10_000.0);
    if let Some(kind) = meta.string(&key("rope.scaling.type"))
        && kind != "none"
    {
        problems.push(format!(
            "RoPE scaling `{kind}` (`{}`) is not supported; only unscaled RoPE is",
            key("rope.scaling.type")
        ));
    }
    if meta.uint(&key("expert_count")).unwrap_or(0) > 0 {
        problems.push(format!(
            "mixture-of-experts models (`{}` > 0) are not supported",
            key("expert_count")
        ));
    }
    let (hidden, intermediate, layers, heads, kv_heads, context, eps, vocab_size) = (
        hidden?,
        intermediate?,
        layers?,
        heads?,
        kv_heads?,
        context?,
        eps?,
        vocab_size?,
    );
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        problems.push(format!(
            "{kv_heads} key/value heads do not divide {heads} attention heads"
        ));
        return None;
    }
    let head_dim = meta
        .uint(&key("attention.key_length"))
        .map(|v| v as usize)
        .unwrap_or(hidden / heads);
    if let Some(v) = meta.uint(&key("attention.value_length"))
        && v as usize != head_dim
    {
        problems.push(format!(
            "value head size {v} differs from key head size {head_dim}; HF models need them equal"
        ));
    }
    if let Some(r) = meta.uint(&key("rope.dimension_count"))
        && r as usize != head_dim
    {
        problems.push(format!(
            "RoPE covers {r} of {head_dim} head channels (`{}`); only full-head RoPE is supported",
            key("rope.dimension_count")
        ));
    }
    if !head_dim.is_multiple_of(2) {
        problems.push(format!("head size {head_dim} is odd; RoPE needs pairs"));
    }
    if let Some(v) = meta.uint(&key("vocab_size"))
        && v as usize != vocab_size
    {
        problems.push(format!(
            "`{}` is {v} but `tokenizer.ggml.tokens` has {vocab_size} tokens",
            key("vocab_size")
        ));
    }
    Some(Hparams {
        vocab_size,
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        max_position_embeddings: context,
        rms_norm_eps: eps,
        rope_theta: theta,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_metadata_reads_as_its_shortest_decimal() {
        assert_eq!(shortest_f64(1e-5), 1e-5);
        assert_eq!(shortest_f64(100_000.0), 100_000.0);
        assert_eq!(shortest_f64(1e-6), 1e-6);
    }
}
