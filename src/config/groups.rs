//! Settings several training stages share, each declared once here and
//! flattened into every stage that has it: a file still writes
//! `"lora_r": 8` beside the stage's other keys, and the code reads
//! `cfg.lora.r`. A stage keeps its own defaults for a shared key (DPO's
//! learning rate is not SFT's) through [`with_defaults`].
//!
//! | group | keys | stages |
//! |---|---|---|
//! | [`LoraSettings`] | `lora_r`, `lora_alpha`, `target_modules` | SFT, DPO, Stage 3 |
//! | [`OptimSettings`] | `learning_rate`, `weight_decay`, `max_grad_norm` | SFT, DPO, Stage 3 |
//! | [`ScheduleSettings`] | `warmup_ratio`, `min_lr_ratio` | SFT, DPO |
//! | [`SaveSettings`] | `output_dir`, `save_steps`, `save_total_limit` | SFT, DPO, Stage 3 |

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::de::{DeserializeOwned, Deserializer, Error as _, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

/// A group of shared settings: its keys, and the checks its values pass in
/// every stage.
pub trait Group: Serialize + DeserializeOwned + Default {
    /// The keys the group reads from its stage's object, as files write them.
    const KEYS: &'static [&'static str];

    /// What is wrong with the values, one line a problem, each starting
    /// with its key.
    fn problems(&self) -> Vec<String>;
}

/// The adapter's shape. Dropout is a choice of the stages that use it
/// (SFT 0.05, DPO 0), not of the shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSettings {
    /// LoRA rank. Default 16.
    #[serde(rename = "lora_r")]
    pub r: usize,
    /// LoRA alpha (the update is scaled by alpha / r). Default 32.
    #[serde(rename = "lora_alpha")]
    pub alpha: f64,
    /// The projections that carry an adapter. Default q, k, v, o, gate,
    /// up, down projections.
    pub target_modules: Vec<String>,
}

impl Default for LoraSettings {
    fn default() -> Self {
        LoraSettings {
            r: 16,
            alpha: 32.0,
            target_modules: [
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ]
            .map(String::from)
            .to_vec(),
        }
    }
}

impl Group for LoraSettings {
    const KEYS: &'static [&'static str] = &["lora_r", "lora_alpha", "target_modules"];

    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.r == 0 {
            p.push("lora_r: must be at least 1".into());
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            p.push(format!("lora_alpha: {} must be positive", self.alpha));
        }
        if self.target_modules.is_empty() {
            p.push("target_modules: name at least one projection".into());
        }
        p
    }
}

/// AdamW on the adapter's factors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OptimSettings {
    /// Peak learning rate of the LoRA factors. Default: the stage's (SFT
    /// 2e-4, DPO 1e-5, Stage 3 5e-7).
    pub learning_rate: f64,
    /// Decoupled weight decay. Default 0.
    pub weight_decay: f64,
    /// Gradient clipping norm. Default 1.0.
    pub max_grad_norm: f64,
}

impl Default for OptimSettings {
    fn default() -> Self {
        OptimSettings {
            learning_rate: 2e-4,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
        }
    }
}

impl Group for OptimSettings {
    const KEYS: &'static [&'static str] = &["learning_rate", "weight_decay", "max_grad_norm"];

    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            p.push(format!(
                "learning_rate: {} must be positive",
                self.learning_rate
            ));
        }
        for (name, v) in [
            ("max_grad_norm", self.max_grad_norm),
            ("weight_decay", self.weight_decay),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                p.push(format!("{name}: {v} must be finite and >= 0"));
            }
        }
        p
    }
}

/// The learning rate's warmup and cosine decay over an epoch-counted run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleSettings {
    /// Share of steps spent warming up. Default: the stage's (SFT 0.03,
    /// DPO 0.1).
    pub warmup_ratio: f64,
    /// Final learning rate as a share of the peak. Default 0.1.
    pub min_lr_ratio: f64,
}

impl Default for ScheduleSettings {
    fn default() -> Self {
        ScheduleSettings {
            warmup_ratio: 0.03,
            min_lr_ratio: 0.1,
        }
    }
}

impl Group for ScheduleSettings {
    const KEYS: &'static [&'static str] = &["warmup_ratio", "min_lr_ratio"];

    fn problems(&self) -> Vec<String> {
        [
            ("warmup_ratio", self.warmup_ratio),
            ("min_lr_ratio", self.min_lr_ratio),
        ]
        .into_iter()
        .filter(|(_, v)| !(0.0..=1.0).contains(v))
        .map(|(name, v)| format!("{name}: {v} is not in [0, 1]"))
        .collect()
    }
}

/// Where a stage writes and how many checkpoints it keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SaveSettings {
    /// Output folder (null: the stage's folder, `checkpoints/stage1_warmup`,
    /// `stage2_sft`, `stage3_ppo` or `stage3_dpo`).
    pub output_dir: Option<PathBuf>,
    /// Checkpoint every N optimizer steps. Default: the stage's (SFT and
    /// DPO 100, Stage 3 1000).
    pub save_steps: usize,
    /// Periodic checkpoints kept; 0 keeps all. Default: the stage's (SFT
    /// and DPO 2, Stage 3 0).
    pub save_total_limit: usize,
}

impl Default for SaveSettings {
    fn default() -> Self {
        SaveSettings {
            output_dir: None,
            save_steps: 100,
            save_total_limit: 2,
        }
    }
}

impl SaveSettings {
    /// How many periodic checkpoints to keep (`save_total_limit`, 0: all).
    pub fn keep(&self) -> usize {
        match self.save_total_limit {
            0 => usize::MAX,
            k => k,
        }
    }
}

impl Group for SaveSettings {
    const KEYS: &'static [&'static str] = &["output_dir", "save_steps", "save_total_limit"];

    fn problems(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Reads group `G` from its stage's object, starting from the stage's
/// defaults for it (`defaults`) rather than the group's own: what a stage's
/// `#[serde(flatten, deserialize_with = ...)]` field calls. Each key is
/// first read alone, so that a wrong value's error names its key
/// (`... (key `lora_r`)`), which [`super::parse`] turns into the key's line.
pub fn with_defaults<'de, D: Deserializer<'de>, G: Group>(
    d: D,
    defaults: G,
) -> Result<G, D::Error> {
    struct Keys<G>(G);
    impl<'de, G: Group> Visitor<'de> for Keys<G> {
        type Value = G;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "the keys {}", G::KEYS.join(", "))
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<G, A::Error> {
            let mut out = serde_json::to_value(&self.0).map_err(A::Error::custom)?;
            while let Some(key) = map.next_key::<String>()? {
                let value: serde_json::Value = map.next_value()?;
                let alone = serde_json::json!({ key.as_str(): value });
                G::deserialize(&alone)
                    .map_err(|e| A::Error::custom(format!("{e} (key `{key}`)")))?;
                out[key.as_str()] = value;
            }
            G::deserialize(out).map_err(A::Error::custom)
        }
    }
    d.deserialize_struct("settings", G::KEYS, Keys(defaults))
}

/// `stage_defaults! { fn_name: Stage.field as Group, ... }` declares the
/// functions a stage's flattened group fields name in `deserialize_with`:
/// each reads its group from the stage's object with the stage's defaults.
macro_rules! stage_defaults {
    ($($f:ident: $stage:ident.$field:ident as $group:ty),* $(,)?) => {
        $(
            fn $f<'de, D: serde::Deserializer<'de>>(d: D) -> Result<$group, D::Error> {
                super::groups::with_defaults(d, $stage::default().$field)
            }
        )*
    };
}
pub(crate) use stage_defaults;

#[cfg(test)]
mod tests {
    use super::*;

    /// `KEYS` is what the group writes, so a flattened group reads back
    /// every key it serialises.
    #[test]
    fn each_groups_keys_are_the_keys_it_writes() {
        fn keys<G: Group>() -> Vec<String> {
            let mut k: Vec<String> = serde_json::to_value(G::default())
                .unwrap()
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            k.sort();
            k
        }
        fn declared<G: Group>() -> Vec<String> {
            let mut k: Vec<String> = G::KEYS.iter().map(|s| s.to_string()).collect();
            k.sort();
            k
        }
        assert_eq!(keys::<LoraSettings>(), declared::<LoraSettings>());
        assert_eq!(keys::<OptimSettings>(), declared::<OptimSettings>());
        assert_eq!(keys::<ScheduleSettings>(), declared::<ScheduleSettings>());
        assert_eq!(keys::<SaveSettings>(), declared::<SaveSettings>());
    }

    #[test]
    fn zero_keeps_every_checkpoint() {
        let s = |k| SaveSettings {
            save_total_limit: k,
            ..SaveSettings::default()
        };
        assert_eq!(s(0).keep(), usize::MAX);
        assert_eq!(s(3).keep(), 3);
    }
}
