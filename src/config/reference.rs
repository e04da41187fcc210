//! The configuration reference (`trace-train config --reference`,
//! committed as `docs/reference/config.md`): every key of every config
//! file with its type, default and meaning, made from the config types
//! themselves (their doc comments, through `schemars`), so it cannot
//! drift from the code; `tests/config.rs` fails when the committed file
//! differs.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{GenerateConfig, PipelineConfig, SftConfig, Stage3Config};

/// One documented key: its dotted path, type, default and meaning.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub path: String,
    pub kind: String,
    pub default: Value,
    pub meaning: String,
}

/// Every key of `T`'s files, in the order the types declare them: a
/// nested section's keys follow its own line. Defaults are `T::default()`'s
/// (so a stage's own defaults, not those of a group it shares).
pub fn keys<T: JsonSchema + Serialize + Default>() -> Vec<Key> {
    let schema = serde_json::to_value(schemars::schema_for!(T)).expect("a schema serialises");
    let defaults = serde_json::to_value(T::default()).expect("defaults serialise");
    let defs = schema
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    walk(&schema, &defs, "", Some(&defaults), &mut out);
    out
}

/// The meanings of `T`'s keys by dotted path, for `trace-train config`.
pub fn meanings<T: JsonSchema + Serialize + Default>() -> std::collections::BTreeMap<String, String>
{
    keys::<T>()
        .into_iter()
        .map(|k| (k.path, k.meaning))
        .collect()
}

/// The object schema `s` stands for, through a `$ref` or an optional
/// (`anyOf [X, null]`) one.
fn object<'a>(s: &'a Value, defs: &'a Map<String, Value>) -> Option<&'a Value> {
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        return defs.get(r.trim_start_matches("#/$defs/"));
    }
    if s.get("properties").is_some() {
        return Some(s);
    }
    s.get("anyOf")?
        .as_array()?
        .iter()
        .find_map(|v| object(v, defs).filter(|o| o.get("properties").is_some()))
}

fn walk(
    s: &Value,
    defs: &Map<String, Value>,
    prefix: &str,
    defaults: Option<&Value>,
    out: &mut Vec<Key>,
) {
    let Some(props) = object(s, defs)
        .and_then(|o| o.get("properties"))
        .and_then(Value::as_object)
    else {
        return;
    };
    for (name, p) in props {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        // A switch left out of the serialised defaults while off
        // (`skip_serializing_if`) is off by default.
        let default = defaults
            .and_then(|d| d.get(name))
            .or_else(|| p.get("default"))
            .cloned()
            .unwrap_or(
                if p.get("type").and_then(Value::as_str) == Some("boolean") {
                    Value::Bool(false)
                } else {
                    Value::Null
                },
            );
        let nested = object(p, defs).filter(|o| o.get("properties").is_some());
        out.push(Key {
            path: path.clone(),
            kind: if nested.is_some() {
                "section".into()
            } else {
                kind(p, defs)
            },
            default: if nested.is_some() && !default.is_null() {
                Value::Null
            } else {
                default.clone()
            },
            meaning: meaning(p, defs),
        });
        if nested.is_some() {
            walk(p, defs, &path, Some(&default).filter(|d| !d.is_null()), out);
        }
    }
}

/// A property's doc comment as one paragraph (its own, else its type's).
fn meaning(p: &Value, defs: &Map<String, Value>) -> String {
    let own = p.get("description").and_then(Value::as_str);
    let of_type = || {
        object(p, defs)
            .and_then(|o| o.get("description"))
            .and_then(Value::as_str)
    };
    let text = own.or_else(of_type).unwrap_or("");
    // Rust's intra-doc links read as plain code names.
    let links = regex::Regex::new(r"\[(`[^`]+`)\](\([^)]*\))?").expect("a valid pattern");
    let text = links.replace_all(text, "$1");
    text.split("\n\n")
        .map(|para| para.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A property's type in words.
fn kind(p: &Value, defs: &Map<String, Value>) -> String {
    if let Some(r) = p.get("$ref").and_then(Value::as_str) {
        return defs
            .get(r.trim_start_matches("#/$defs/"))
            .map_or("value".into(), |d| kind(d, defs));
    }
    if let Some(choices) = p.get("enum").and_then(Value::as_array) {
        let names: Vec<String> = choices.iter().map(|c| format!("`{}`", plain(c))).collect();
        return format!("one of {}", names.join(", "));
    }
    if let Some(alts) = p
        .get("anyOf")
        .or_else(|| p.get("oneOf"))
        .and_then(Value::as_array)
    {
        let mut words: Vec<String> = alts.iter().map(|a| kind(a, defs)).collect();
        words.dedup();
        return words.join(" or ");
    }
    let one = |t: &str| match t {
        "integer" if p.get("minimum").and_then(Value::as_f64) == Some(0.0) => {
            "whole number >= 0".to_owned()
        }
        "integer" => "whole number".to_owned(),
        "number" => "number".to_owned(),
        "boolean" => "true or false".to_owned(),
        "string" => "string".to_owned(),
        "null" => "null".to_owned(),
        "array" => match p.get("items") {
            Some(items) => format!("list of {}", kind(items, defs)),
            None => "list".to_owned(),
        },
        "object" => "object".to_owned(),
        other => other.to_owned(),
    };
    match p.get("type") {
        Some(Value::String(t)) => one(t),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(one)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => match p.get("const") {
            Some(c) => format!("`{}`", plain(c)),
            None => "value".into(),
        },
    }
}

/// A JSON value as a reader writes it (strings without quotes).
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The reference as Markdown: one section a file, one row a key.
pub fn markdown() -> String {
    let mut md = String::from(
        "# Configuration reference\n\n\
         Every key of every config file: its type, its default and what it does. \
         Made by `trace-train config --reference` from the code's own types; \
         `cargo test` fails when this file and the code differ. Any key may be \
         left out, and then has its default. Flags override files; \
         `trace-train config` shows each resolved value and where it came from \
         (see docs/guide/configuration.md).\n\n\
         | file | what it configures |\n|---|---|\n\
         | [`config/pipeline_config.json`](#configpipeline_configjson) | the model, the hardware, the gate and every stage of `trace-train pipeline` |\n\
         | [`config/generate.json`](#configgeneratejson) | Stage 0 run alone (`trace-train generate`): the `stage0` section's keys |\n\
         | [`config/warmup.json`, `config/sft.json`](#configwarmupjson-configsftjson) | Stages 1 and 2 run alone (`trace-train warmup`, `sft`): the `stage1` and `stage2` sections' keys |\n\
         | [`config/stage3_ppo_config.json`](#configstage3_ppo_configjson) | Stage 3 run alone (`trace-train ppo`, `dpo`): the `stage3` section's keys |\n",
    );
    section::<PipelineConfig>(&mut md, "`config/pipeline_config.json`");
    section::<GenerateConfig>(&mut md, "`config/generate.json`");
    section::<SftConfig>(&mut md, "`config/warmup.json`, `config/sft.json`");
    section::<Stage3Config>(&mut md, "`config/stage3_ppo_config.json`");
    md
}

fn section<T: JsonSchema + Serialize + Default>(md: &mut String, title: &str) {
    md.push_str(&format!(
        "\n## {title}\n\n| key | type | default | meaning |\n|---|---|---|---|\n"
    ));
    for k in keys::<T>() {
        let default = match (&k.default, k.kind.as_str()) {
            (_, "section") => String::new(),
            (Value::Null, _) => "null".into(),
            (v, _) => format!("`{}`", v),
        };
        let cell = |s: &str| s.replace('|', "\\|");
        md.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            k.path,
            cell(&k.kind),
            cell(&default),
            cell(&k.meaning)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key a file may hold is in the reference, with a meaning, and
    /// a stage's shared keys carry the stage's default.
    #[test]
    fn every_key_is_documented_with_the_stages_default() {
        let keys = keys::<PipelineConfig>();
        let find = |p: &str| {
            keys.iter()
                .find(|k| k.path == p)
                .unwrap_or_else(|| panic!("{p}"))
        };
        assert_eq!(find("stage1.lora_r").default, serde_json::json!(16));
        assert_eq!(
            find("stage3.ppo.learning_rate").default,
            serde_json::json!(5e-7)
        );
        assert_eq!(
            find("stage3.dpo.train.learning_rate").default,
            serde_json::json!(1e-5)
        );
        assert_eq!(
            find("stage3.ppo.save_steps").default,
            serde_json::json!(1000)
        );
        assert_eq!(find("stage1").kind, "section");
        // A meaning says what the key does, not only its default.
        let undocumented: Vec<&str> = keys
            .iter()
            .filter(|k| k.meaning.is_empty() || k.meaning.starts_with("Default "))
            .map(|k| k.path.as_str())
            .collect();
        assert!(
            undocumented.is_empty(),
            "keys without a doc comment: {undocumented:?}"
        );
    }
}
