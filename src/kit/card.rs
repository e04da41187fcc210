//! What a trained model folder carries beside its weights, so that the hub,
//! PEFT and transformers read it as one of theirs: a model card
//! (`README.md` whose YAML front matter has the fields PEFT writes:
//! `base_model`, `library_name`, `tags`) and `generation_config.json` (the
//! bos/eos/pad ids, with the chat template's end-of-turn token among the
//! eos ids so that `generate` stops where our decoding stops).
//!
//! The front matter is written by hand: it is a handful of scalars and one
//! list, and each string is emitted as a JSON string, which YAML reads as a
//! double-quoted scalar, so no YAML library is needed to escape it.

use std::path::Path;

use anyhow::Context;
use serde_json::{Value, json};

use crate::config::LoraSettings;
use crate::data::tokenizer::ChatTokenizer;

/// Which kind of folder a card describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A LoRA adapter in PEFT's layout (`final/`).
    Adapter,
    /// The adapter merged into the base weights (`merged/`).
    Merged,
}

/// What a card says about a trained folder.
#[derive(Debug, Clone)]
pub struct CardInfo {
    /// What the adapter applies to: a hub id, or the base folder's absolute
    /// path (see [`base_names`]).
    pub base_model: String,
    /// Where the lineage began: the hub id (or first folder) the first
    /// stage trained from. The merged model's card names it as its base.
    pub origin: String,
    /// The base model's commit, when it came from the hub cache.
    pub base_commit: Option<String>,
    /// The pipeline stage's folder name (`stage1_warmup`, `stage2_sft`).
    pub stage: String,
    pub train_file: String,
    pub steps: u64,
    pub lora: LoraSettings,
}

/// The names a folder trained from `dir` records for its base, as
/// `(direct, origin)`.
///
/// `direct` is what its adapter applies to, the value of
/// `adapter_config.json`'s `base_model_name_or_path`: the hub id when the
/// base came from the hub (`repo`, or a hub cache folder
/// `models--ORG--NAME/snapshots/COMMIT`), else the folder's absolute path,
/// which PEFT follows from any working folder (a relative one only from
/// the folder the run started in).
///
/// `origin` is where the lineage began: the base's own `origin` when the
/// base is a folder trace-train trained (its card says so), else `direct`.
/// A Stage 3 model trained from Stage 2's merged model, trained from Stage
/// 1's, trained from `Qwen/Qwen3-4B`, has that hub id as its origin.
pub fn base_names(repo: Option<&str>, dir: &Path) -> (String, String) {
    let direct = repo
        .map(str::to_owned)
        .or_else(|| hub_id(dir))
        .unwrap_or_else(|| {
            dir.canonicalize()
                .or_else(|_| std::path::absolute(dir))
                .unwrap_or_else(|_| dir.to_owned())
                .display()
                .to_string()
        });
    let origin = card_origin(dir).unwrap_or_else(|| direct.clone());
    (direct, origin)
}

/// The hub id of a hub cache folder (`.../models--ORG--NAME/snapshots/C`).
fn hub_id(dir: &Path) -> Option<String> {
    let parts: Vec<String> = dir
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let at = parts.iter().rposition(|p| p == "snapshots")?;
    let repo = parts.get(at.checked_sub(1)?)?.strip_prefix("models--")?;
    (at + 2 == parts.len() && !repo.is_empty()).then(|| repo.replacen("--", "/", 1))
}

/// The `base_model` of a card trace-train wrote for a merged model in
/// `dir` (its origin); `None` for any other folder.
fn card_origin(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("README.md")).ok()?;
    let front = text.strip_prefix("---\n")?.split("\n---\n").next()?;
    let ours = front.lines().any(|l| l == "- \"trace-train\"")
        && front.lines().any(|l| l == "library_name: transformers");
    let value = front.lines().find_map(|l| l.strip_prefix("base_model: "))?;
    ours.then(|| serde_json::from_str::<String>(value).ok())
        .flatten()
}

/// The card's text: YAML front matter, then a short description.
///
/// An adapter's card names its direct base (PEFT loads it onto that); a
/// merged model's names the lineage's origin, the hub model it is a
/// fine-tune of.
pub fn model_card(info: &CardInfo, kind: Kind) -> String {
    let q = |s: &str| serde_json::to_string(s).expect("a string serialises");
    let (library, relation, what) = match kind {
        Kind::Adapter => ("peft", "adapter", "A LoRA adapter"),
        Kind::Merged => (
            "transformers",
            "finetune",
            "A LoRA adapter merged into its base model",
        ),
    };
    let base = match kind {
        Kind::Adapter => &info.base_model,
        Kind::Merged => &info.origin,
    };
    let mut tags = vec![
        "trace-train".to_owned(),
        "lora".to_owned(),
        info.stage.clone(),
    ];
    // The hub's lineage tag: what this folder is to its base.
    tags.push(format!("base_model:{relation}:{base}"));
    tags.push("text-generation".into());
    let mut out = String::from("---\n");
    out += &format!("base_model: {}\n", q(base));
    out += &format!("library_name: {library}\n");
    out += "pipeline_tag: text-generation\n";
    out += "tags:\n";
    for t in &tags {
        out += &format!("- {}\n", q(t));
    }
    out += "---\n\n";
    out += &format!(
        "# {} ({})\n\n{what}, trained by trace-train on the Trace task: given a Python \
         program with injected `__DBG_` prints and its stdin, predict the program's \
         exact stdout.\n\n",
        info.stage,
        match kind {
            Kind::Adapter => "adapter",
            Kind::Merged => "merged model",
        }
    );
    out += &format!(
        "- base model: `{}`{}\n",
        info.base_model,
        info.base_commit
            .as_deref()
            .map(|c| format!(" at commit `{c}`"))
            .unwrap_or_default()
    );
    if info.origin != info.base_model {
        out += &format!("- lineage: trained from `{}`\n", info.origin);
    }
    out += &format!("- training data: `{}`\n", info.train_file);
    out += &format!("- optimizer steps: {}\n", info.steps);
    out += &format!(
        "- LoRA: r {}, alpha {}, on {}\n",
        info.lora.r,
        info.lora.alpha,
        info.lora.target_modules.join(", ")
    );
    if kind == Kind::Adapter {
        out += "\nLoad it with PEFT: `PeftModel.from_pretrained(base, this_folder)`.\n";
    } else {
        out +=
            "\nLoad it with transformers: `AutoModelForCausalLM.from_pretrained(this_folder)`.\n";
    }
    out
}

/// `generation_config.json` for a model trained from `base_dir`: the base's
/// own file when it has one (its sampling defaults kept), with bos, eos and
/// pad ids from the model's `config.json` and the tokenizer, and the chat
/// end-of-turn token among the eos ids.
pub fn generation_config(base_dir: &Path, tok: &ChatTokenizer) -> anyhow::Result<Value> {
    let read = |name: &str| -> anyhow::Result<Option<Value>> {
        let p = base_dir.join(name);
        if !p.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&p)
            .with_context(|| format!("cannot read `{}`", p.display()))?;
        Ok(Some(serde_json::from_str(&text).with_context(|| {
            format!("`{}` is not valid JSON", p.display())
        })?))
    };
    let model_config = read("config.json")?.unwrap_or_else(|| json!({}));
    let mut generation = read("generation_config.json")?
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    let ids = |v: &Value| -> Vec<u64> {
        match v {
            Value::Number(n) => n.as_u64().into_iter().collect(),
            Value::Array(a) => a.iter().filter_map(Value::as_u64).collect(),
            _ => Vec::new(),
        }
    };
    let mut eos: Vec<u64> = Vec::new();
    for id in ids(&generation["eos_token_id"])
        .into_iter()
        .chain(ids(&model_config["eos_token_id"]))
        .chain([tok.end_of_turn().id as u64, tok.eos().id as u64])
    {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    let bos = ids(&model_config["bos_token_id"])
        .first()
        .copied()
        .or(tok.bos().map(|t| t.id as u64))
        .or_else(|| ids(&generation["bos_token_id"]).first().copied());
    let pad = ids(&model_config["pad_token_id"])
        .first()
        .copied()
        .unwrap_or(tok.pad().id as u64);
    let obj = generation.as_object_mut().expect("an object");
    if let Some(bos) = bos {
        obj.insert("bos_token_id".into(), json!(bos));
    }
    obj.insert(
        "eos_token_id".into(),
        if eos.len() == 1 {
            json!(eos[0])
        } else {
            json!(eos)
        },
    );
    obj.insert("pad_token_id".into(), json!(pad));
    Ok(generation)
}

/// Writes `README.md` and `generation_config.json` into `dir`.
pub fn write(dir: &Path, info: &CardInfo, kind: Kind, generation: &Value) -> anyhow::Result<()> {
    crate::atomic::write(&dir.join("README.md"), model_card(info, kind).as_bytes())?;
    crate::atomic::write(
        &dir.join("generation_config.json"),
        &serde_json::to_vec_pretty(generation)?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> CardInfo {
        CardInfo {
            base_model: "Qwen/Qwen3-4B".into(),
            origin: "Qwen/Qwen3-4B".into(),
            base_commit: Some("c".repeat(40)),
            stage: "stage1_warmup".into(),
            train_file: "datasets/trace_training/stage1_original_train.jsonl".into(),
            steps: 12,
            lora: LoraSettings {
                r: 16,
                alpha: 32.0,
                target_modules: vec!["q_proj".into(), "v_proj".into()],
            },
        }
    }

    /// The front matter's lines between the `---` fences.
    fn front_matter(card: &str) -> Vec<&str> {
        let mut lines = card.lines();
        assert_eq!(lines.next(), Some("---"), "{card}");
        lines.take_while(|l| *l != "---").collect()
    }

    #[test]
    fn adapter_card_has_peft_metadata() {
        let card = model_card(&info(), Kind::Adapter);
        let fm = front_matter(&card);
        assert!(fm.contains(&"base_model: \"Qwen/Qwen3-4B\""), "{card}");
        assert!(fm.contains(&"library_name: peft"), "{card}");
        for tag in [
            "- \"trace-train\"",
            "- \"lora\"",
            "- \"stage1_warmup\"",
            "- \"base_model:adapter:Qwen/Qwen3-4B\"",
        ] {
            assert!(fm.contains(&tag), "missing {tag}: {card}");
        }
        assert!(card.contains(&"c".repeat(40)), "{card}");
    }

    #[test]
    fn merged_card_is_a_transformers_model_and_strings_are_escaped() {
        let mut i = info();
        i.origin = "checkpoints/my \"odd\" folder".into();
        i.stage = "stage2_sft".into();
        let card = model_card(&i, Kind::Merged);
        let fm = front_matter(&card);
        assert!(fm.contains(&"library_name: transformers"), "{card}");
        assert!(fm.contains(&"- \"stage2_sft\""), "{card}");
        assert!(
            fm.contains(&r#"base_model: "checkpoints/my \"odd\" folder""#),
            "{card}"
        );
    }

    /// A relative base is recorded absolute, a hub cache folder by its id,
    /// and a merged model of ours passes its origin on.
    #[test]
    fn base_names_follow_the_lineage() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir
            .path()
            .join("hub/models--Org--My-Model/snapshots/abc123");
        std::fs::create_dir_all(&snap).unwrap();
        assert_eq!(
            base_names(None, &snap),
            ("Org/My-Model".into(), "Org/My-Model".into())
        );
        assert_eq!(base_names(Some("A/B"), dir.path()).0, "A/B");
        let here = std::env::current_dir().unwrap();
        let (direct, origin) = base_names(None, Path::new("src"));
        assert_eq!(direct, here.join("src").display().to_string());
        assert_eq!(origin, direct);
        // Stage 1's merged model, trained from a hub model: Stage 2 trained
        // from it applies its adapter to the folder and descends from the id.
        let merged = dir.path().join("stage1_warmup/merged");
        std::fs::create_dir_all(&merged).unwrap();
        let mut i = info();
        i.base_model = "Qwen/Qwen3-4B".into();
        std::fs::write(merged.join("README.md"), model_card(&i, Kind::Merged)).unwrap();
        let (direct, origin) = base_names(None, &merged);
        assert_eq!(direct, merged.canonicalize().unwrap().display().to_string());
        assert_eq!(origin, "Qwen/Qwen3-4B");
        let mut next = info();
        next.base_model = direct;
        next.origin = origin;
        let adapter = model_card(&next, Kind::Adapter);
        assert!(
            front_matter(&adapter).contains(
                &format!(
                    "base_model: {}",
                    serde_json::to_string(&next.base_model).unwrap()
                )
                .as_str()
            ),
            "{adapter}"
        );
        assert!(
            adapter.contains("- lineage: trained from `Qwen/Qwen3-4B`"),
            "{adapter}"
        );
        assert!(
            front_matter(&model_card(&next, Kind::Merged))
                .contains(&"base_model: \"Qwen/Qwen3-4B\"")
        );
        // An adapter folder's card (PEFT's) is not a base's origin.
        std::fs::write(merged.join("README.md"), model_card(&i, Kind::Adapter)).unwrap();
        assert_eq!(base_names(None, &merged).0, base_names(None, &merged).1);
    }

    #[test]
    fn generation_config_has_the_end_of_turn_among_eos() {
        let dir = tempfile::tempdir().unwrap();
        crate::model::arch::tiny::write_tiny_chat_model(dir.path(), 1).unwrap();
        // A base model whose eos is not the end of turn (as Qwen3 base's
        // `<|endoftext|>`), and a generation config with a sampling default.
        let tc = dir.path().join("tokenizer_config.json");
        let mut t: Value = serde_json::from_slice(&std::fs::read(&tc).unwrap()).unwrap();
        t["eos_token"] = json!("<|endoftext|>");
        std::fs::write(&tc, serde_json::to_vec(&t).unwrap()).unwrap();
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"temperature": 0.6, "eos_token_id": 256}"#,
        )
        .unwrap();
        let tok = ChatTokenizer::from_dir(dir.path()).unwrap();
        assert_eq!((tok.eos().id, tok.end_of_turn().id), (256, 258));
        let g = generation_config(dir.path(), &tok).unwrap();
        assert_eq!(g["temperature"], json!(0.6));
        assert_eq!(g["bos_token_id"], json!(257));
        assert_eq!(g["pad_token_id"], json!(256));
        let eos: Vec<u64> = g["eos_token_id"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert!(eos.contains(&258) && eos.contains(&256), "{g}");
        // Without a generation config of its own: one eos id, the end of turn.
        std::fs::remove_file(dir.path().join("generation_config.json")).unwrap();
        std::fs::write(
            &tc,
            serde_json::to_vec(&{
                t["eos_token"] = json!("<|im_end|>");
                t
            })
            .unwrap(),
        )
        .unwrap();
        let tok = ChatTokenizer::from_dir(dir.path()).unwrap();
        let g = generation_config(dir.path(), &tok).unwrap();
        assert_eq!(g["eos_token_id"], json!(258), "{g}");
    }
}
