//! The Qwen3 decoder (dense models: Qwen3-0.6B ... Qwen3-32B).
//!
//! Follows HF transformers' `modeling_qwen3.py`: pre-norm decoder layers,
//! grouped-query attention with a per-head RMSNorm on queries and keys
//! (`q_norm`, `k_norm`) before RoPE, a SwiGLU MLP, and an optional tied
//! `lm_head`. `head_dim` is explicit and need not be `hidden / heads`.
//! Every projection is a `LoraLinear`; tensor names follow the checkpoint.
//! This file reads the architecture's `config.json` into the [`Spec`] of
//! the decoder every architecture shares (`crate::layers::decoder`).

use serde::{Deserialize, Serialize};

use crate::common::Unsupported;
use crate::layers::decoder::Spec;
use crate::layers::rope::RopeFields;

/// The fields of a Qwen3 `config.json` this code reads; others are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    #[serde(flatten)]
    pub rope: RopeFields,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "silu")]
    pub hidden_act: String,
    #[serde(default)]
    pub use_sliding_window: bool,
}

fn silu() -> String {
    "silu".to_owned()
}

impl Config {
    /// The decoder this config describes.
    pub fn spec(&self) -> Spec {
        Spec {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta(),
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            attention_bias: self.attention_bias,
            mlp_bias: false,
            qk_norm: true,
        }
    }

    /// RoPE base frequency; transformers' Qwen3 default is 10000.
    pub fn rope_theta(&self) -> f64 {
        self.rope.theta(10_000.0)
    }

    /// Values this implementation cannot run.
    pub fn unsupported(&self) -> Vec<Unsupported> {
        let mut out = self.rope.unsupported();
        if self.hidden_act != "silu" {
            out.push(Unsupported::new(
                "hidden_act",
                format!("`{}`", self.hidden_act),
                "only `silu` is implemented",
            ));
        }
        if self.use_sliding_window {
            out.push(Unsupported::new(
                "use_sliding_window",
                "true",
                "sliding-window attention is not implemented",
            ));
        }
        if self.num_key_value_heads == 0
            || !self
                .num_attention_heads
                .is_multiple_of(self.num_key_value_heads)
        {
            out.push(Unsupported::new(
                "num_key_value_heads",
                self.num_key_value_heads,
                "must divide `num_attention_heads`",
            ));
        }
        out
    }
}
