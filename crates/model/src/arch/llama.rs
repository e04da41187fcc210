//! The Llama decoder (Llama 2/3 without RoPE scaling, SmolLM2).
//!
//! Follows HF transformers' `modeling_llama.py`: pre-norm decoder layers,
//! grouped-query attention with RoPE, a SwiGLU MLP, and an optional tied
//! `lm_head` (SmolLM2 ties it). Unlike Qwen3 there is no per-head q/k norm
//! and `head_dim` defaults to `hidden / heads`. Every projection is a
//! `LoraLinear`; tensor names follow the checkpoint. This file reads
//! the architecture's `config.json` into the [`Spec`] of the decoder every
//! architecture shares (`crate::layers::decoder`).

use serde::{Deserialize, Serialize};

use crate::common::Unsupported;
use crate::layers::decoder::Spec;
use crate::layers::rope::RopeFields;

/// The fields of a Llama `config.json` this code reads; others are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Defaults to `num_attention_heads` (no GQA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// Defaults to `hidden_size / num_attention_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    #[serde(flatten)]
    pub rope: RopeFields,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "silu")]
    pub hidden_act: String,
    /// Tensor-parallel pretraining slices; only 1 (none) is implemented.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub pretraining_tp: usize,
}

fn one() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
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
            num_key_value_heads: self.num_key_value_heads(),
            head_dim: self.head_dim(),
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta(),
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            attention_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
            qk_norm: false,
        }
    }

    /// RoPE base frequency; transformers' Llama default is 10000.
    pub fn rope_theta(&self) -> f64 {
        self.rope.theta(10_000.0)
    }

    pub fn num_key_value_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
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
        if self.pretraining_tp != 1 {
            out.push(Unsupported::new(
                "pretraining_tp",
                self.pretraining_tp,
                "only 1 is implemented",
            ));
        }
        let kv = self.num_key_value_heads();
        if kv == 0 || !self.num_attention_heads.is_multiple_of(kv) {
            out.push(Unsupported::new(
                "num_key_value_heads",
                kv,
                "must divide `num_attention_heads`",
            ));
        }
        out
    }
}
