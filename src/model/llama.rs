//! The Llama decoder (Llama 2/3 without RoPE scaling, SmolLM2).
//!
//! Follows HF transformers' `modeling_llama.py`: pre-norm decoder layers,
//! grouped-query attention with RoPE, a SwiGLU MLP, and an optional tied
//! `lm_head` (SmolLM2 ties it). Unlike Qwen3 there is no per-head q/k norm
//! and `head_dim` defaults to `hidden / heads`. Every projection is a
//! [`LoraLinear`]; tensor names follow the checkpoint.

use candle_core::{Device, Result, Tensor};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

use super::Unsupported;
use super::attention::{self, Cache};
use super::lora::{BaseLinear, LoraInit, LoraLinear, TargetModule};
use super::norm::RmsNorm;
use super::rope::{Positions, RopeFields, RotaryEmbedding, Rotation};

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

#[derive(Debug, Clone)]
struct Attention {
    q_proj: LoraLinear,
    k_proj: LoraLinear,
    v_proj: LoraLinear,
    o_proj: LoraLinear,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    fn new(cfg: &Config, vb: VarBuilder, lora: Option<LoraInit>) -> Result<Self> {
        let (hidden, d, bias) = (cfg.hidden_size, cfg.head_dim(), cfg.attention_bias);
        let q_out = cfg.num_attention_heads * d;
        let kv_out = cfg.num_key_value_heads() * d;
        Ok(Self {
            q_proj: LoraLinear::new(
                hidden,
                q_out,
                bias,
                TargetModule::QProj,
                vb.pp("q_proj"),
                lora,
            )?,
            k_proj: LoraLinear::new(
                hidden,
                kv_out,
                bias,
                TargetModule::KProj,
                vb.pp("k_proj"),
                lora,
            )?,
            v_proj: LoraLinear::new(
                hidden,
                kv_out,
                bias,
                TargetModule::VProj,
                vb.pp("v_proj"),
                lora,
            )?,
            o_proj: LoraLinear::new(
                q_out,
                hidden,
                bias,
                TargetModule::OProj,
                vb.pp("o_proj"),
                lora,
            )?,
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_key_value_heads(),
            head_dim: d,
        })
    }

    /// `x: (B, L, hidden)` at the step's positions -> `(B, L, hidden)`.
    fn forward(&self, x: &Tensor, ctx: &mut Step, layer: usize) -> Result<Tensor> {
        let (b, l, _) = x.dims3()?;
        let d = self.head_dim;
        // (B, L, H*D) -> (B, L, H, D) -> (B, H, L, D)
        let q = self
            .q_proj
            .forward(x, ctx.train)?
            .reshape((b, l, self.num_heads, d))?
            .transpose(1, 2)?;
        let k = self
            .k_proj
            .forward(x, ctx.train)?
            .reshape((b, l, self.num_kv_heads, d))?
            .transpose(1, 2)?;
        let v = self
            .v_proj
            .forward(x, ctx.train)?
            .reshape((b, l, self.num_kv_heads, d))?
            .transpose(1, 2)?;
        let q = ctx.rotation.apply(&q)?;
        let k = ctx.rotation.apply(&k)?;
        let (k, v) = match ctx.cache.as_deref_mut() {
            Some(cache) => cache.append(layer, &k, &v)?, // (B, H_kv, T, D)
            None => (k, v),
        };
        let y = attention::attend(&q, &k, &v, ctx.mask)?; // (B, H, L, D)
        let y = y.transpose(1, 2)?.reshape((b, l, self.num_heads * d))?; // (B, L, H*D)
        self.o_proj.forward(&y, ctx.train)
    }
}

#[derive(Debug, Clone)]
struct Mlp {
    gate_proj: LoraLinear,
    up_proj: LoraLinear,
    down_proj: LoraLinear,
}

impl Mlp {
    fn new(cfg: &Config, vb: VarBuilder, lora: Option<LoraInit>) -> Result<Self> {
        let (h, i, bias) = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        Ok(Self {
            gate_proj: LoraLinear::new(
                h,
                i,
                bias,
                TargetModule::GateProj,
                vb.pp("gate_proj"),
                lora,
            )?,
            up_proj: LoraLinear::new(h, i, bias, TargetModule::UpProj, vb.pp("up_proj"), lora)?,
            down_proj: LoraLinear::new(
                i,
                h,
                bias,
                TargetModule::DownProj,
                vb.pp("down_proj"),
                lora,
            )?,
        })
    }

    /// `(B, L, hidden) -> (B, L, hidden)`: `down(silu(gate(x)) * up(x))`.
    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let gate = self.gate_proj.forward(x, train)?.silu()?; // (B, L, I)
        let up = self.up_proj.forward(x, train)?;
        self.down_proj.forward(&(gate * up)?, train)
    }
}

#[derive(Debug, Clone)]
struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    fn new(cfg: &Config, vb: VarBuilder, lora: Option<LoraInit>) -> Result<Self> {
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Self {
            self_attn: Attention::new(cfg, vb.pp("self_attn"), lora)?,
            mlp: Mlp::new(cfg, vb.pp("mlp"), lora)?,
            input_layernorm: RmsNorm::new(h, eps, vb.pp("input_layernorm"))?,
            post_attention_layernorm: RmsNorm::new(h, eps, vb.pp("post_attention_layernorm"))?,
        })
    }

    fn forward(&self, x: &Tensor, ctx: &mut Step, layer: usize) -> Result<Tensor> {
        let h = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, ctx, layer)?;
        let x = (x + h)?;
        let h = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&x)?, ctx.train)?;
        x + h
    }
}

/// What one forward pass shares across layers.
struct Step<'a> {
    rotation: &'a Rotation,
    mask: Option<&'a Tensor>,
    cache: Option<&'a mut Cache>,
    train: bool,
}

/// A Llama causal language model.
#[derive(Debug, Clone)]
pub struct Model {
    /// `(vocab, hidden)`.
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `hidden -> vocab`; shares `embed_tokens` when tied.
    lm_head: BaseLinear,
    rope: RotaryEmbedding,
    config: Config,
}

impl Model {
    /// Builds the model from checkpoint tensors at `vb` (root prefix), adding
    /// LoRA factors to the projections `lora` targets.
    pub fn new(cfg: &Config, vb: VarBuilder, lora: Option<LoraInit>) -> Result<Self> {
        let vb_m = vb.pp("model");
        let embed_tokens = vb_m
            .pp("embed_tokens")
            .get((cfg.vocab_size, cfg.hidden_size), "weight")?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::new(cfg, vb_m.pp(format!("layers.{i}")), lora))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::new(cfg.hidden_size, cfg.rms_norm_eps, vb_m.pp("norm"))?;
        let lm_head = if cfg.tie_word_embeddings {
            BaseLinear::Dense {
                weight: embed_tokens.clone(),
                bias: None,
            }
        } else {
            BaseLinear::load(cfg.hidden_size, cfg.vocab_size, false, &vb.pp("lm_head"))?
        };
        let rope = RotaryEmbedding::new(
            cfg.head_dim(),
            cfg.rope_theta(),
            cfg.max_position_embeddings,
            vb.dtype(),
            vb.device(),
        )?;
        Ok(Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
            config: cfg.clone(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    fn device(&self) -> &Device {
        self.embed_tokens.device()
    }

    /// Training/scoring forward: `ids: (B, L)` u32, `attention_mask: (B, L)`
    /// (1 = token, 0 = padding) -> logits `(B, L, vocab)` in the model's dtype.
    /// Positions are `0..L` in every row, so pad on the right.
    pub fn forward(
        &self,
        ids: &Tensor,
        attention_mask: Option<&Tensor>,
        train: bool,
    ) -> Result<Tensor> {
        let (_, l) = ids.dims2()?;
        let mask = attention::mask(l, 0, attention_mask, self.device())?;
        let rotation = self.rope.at(&Positions::Offset(0), l)?;
        let mut step = Step {
            rotation: &rotation,
            mask: mask.as_ref(),
            cache: None,
            train,
        };
        let x = self.hidden(ids, &mut step)?; // (B, L, hidden)
        self.lm_head.forward(&x) // (B, L, vocab)
    }

    /// Decoding forward: `ids: (B, L)` in columns `offset..offset + L`,
    /// attending to the `offset` columns in `cache` and appending to it.
    /// Returns the logits of the last column, `(B, vocab)`. Eval mode.
    /// Positions are the columns, or, in a left-padded cache, the columns
    /// less each row's padding.
    pub fn forward_with_cache(
        &self,
        ids: &Tensor,
        offset: usize,
        cache: &mut Cache,
    ) -> Result<Tensor> {
        let (b, l) = ids.dims2()?;
        let frame = cache.frame(b, l, offset, self.device())?;
        let rotation = self.rope.at(&frame.positions, l)?;
        let mut step = Step {
            rotation: &rotation,
            mask: frame.mask.as_ref(),
            cache: Some(cache),
            train: false,
        };
        let x = self.hidden(ids, &mut step)?; // (B, L, hidden)
        cache.advance(l);
        let last = x.narrow(1, l - 1, 1)?.squeeze(1)?; // (B, hidden)
        self.lm_head.forward(&last) // (B, vocab)
    }

    /// `(B, L)` ids -> final-normed hidden states `(B, L, hidden)`.
    fn hidden(&self, ids: &Tensor, step: &mut Step) -> Result<Tensor> {
        let (b, l) = ids.dims2()?;
        let mut x = self
            .embed_tokens
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, l, ()))?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x, step, i)?;
        }
        self.norm.forward(&x)
    }

    /// An empty KV cache for this model.
    pub fn new_cache(&self) -> Cache {
        Cache::new(self.layers.len())
    }

    /// Every projection, layer by layer, in checkpoint order.
    pub fn projections(&self) -> Vec<&LoraLinear> {
        self.layers
            .iter()
            .flat_map(|l| {
                let (a, m) = (&l.self_attn, &l.mlp);
                [
                    &a.q_proj,
                    &a.k_proj,
                    &a.v_proj,
                    &a.o_proj,
                    &m.gate_proj,
                    &m.up_proj,
                    &m.down_proj,
                ]
            })
            .collect()
    }
}
