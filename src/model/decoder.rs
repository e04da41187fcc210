//! The decoder both architectures share: pre-norm layers of grouped-query
//! attention (with an optional per-head RMSNorm on queries and keys, which
//! Qwen3 has and Llama lacks) and a SwiGLU MLP, token embeddings, a final
//! norm and an optional tied `lm_head`. [`super::qwen3`] and
//! [`super::llama`] read their `config.json` into a [`Spec`] and build one.
//!
//! Training can checkpoint each layer ([`Decoder::set_checkpointing`]): the
//! forward keeps only the layer's input, and the backward runs the layer
//! again under a fresh graph (Chen et al. 2016, "Training Deep Nets with
//! Sublinear Memory Cost"). The recomputation is the same function of the
//! same input, dropout masks included (they are keyed by step and layer
//! name), so the gradients equal the non-checkpointed ones. The LoRA
//! factors' gradients from the inner graphs gather in a [`GradSink`] that
//! [`Decoder::backward`] merges into the outer gradient store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage;
use candle_core::backprop::GradStore;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, Device, Layout, Result, Shape, Storage, Tensor, TensorId,
    Var,
};
use candle_nn::VarBuilder;

use super::attention::{self, Cache};
use super::lora::{self, BaseLinear, LoraInit, LoraLinear, TargetModule};
use super::norm::RmsNorm;
use super::rope::{Positions, RotaryEmbedding, Rotation};

/// The shape of a decoder, read from an architecture's config.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    /// Per-head RMSNorm on queries and keys before RoPE (Qwen3).
    pub qk_norm: bool,
}

#[derive(Debug, Clone)]
struct Attention {
    q_proj: LoraLinear,
    k_proj: LoraLinear,
    v_proj: LoraLinear,
    o_proj: LoraLinear,
    /// `(q_norm, k_norm)` when the architecture has them.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    fn new(s: &Spec, vb: VarBuilder, lora: Option<LoraInit>) -> Result<Self> {
        let (hidden, d, bias) = (s.hidden_size, s.head_dim, s.attention_bias);
        let q_out = s.num_attention_heads * d;
        let kv_out = s.num_key_value_heads * d;
        let proj = |i, o, m, name| LoraLinear::new(i, o, bias, m, vb.pp(name), lora);
        let qk_norm = if s.qk_norm {
            Some((
                RmsNorm::new(d, s.rms_norm_eps, vb.pp("q_norm"))?,
                RmsNorm::new(d, s.rms_norm_eps, vb.pp("k_norm"))?,
            ))
        } else {
            None
        };
        Ok(Self {
            q_proj: proj(hidden, q_out, TargetModule::QProj, "q_proj")?,
            k_proj: proj(hidden, kv_out, TargetModule::KProj, "k_proj")?,
            v_proj: proj(hidden, kv_out, TargetModule::VProj, "v_proj")?,
            o_proj: proj(q_out, hidden, TargetModule::OProj, "o_proj")?,
            qk_norm,
            num_heads: s.num_attention_heads,
            num_kv_heads: s.num_key_value_heads,
            head_dim: d,
        })
    }

    /// `x: (B, L, hidden)` at the step's positions -> `(B, L, hidden)`.
    fn forward(&self, x: &Tensor, ctx: &mut Step, layer: usize) -> Result<Tensor> {
        let (b, l, _) = x.dims3()?;
        let d = self.head_dim;
        // (B, L, H*D) -> (B, L, H, D) -> [per-head norm] -> (B, H, L, D)
        let heads = |p: &LoraLinear, n: usize, norm: Option<&RmsNorm>| -> Result<Tensor> {
            let t = p.forward(x, ctx.train)?.reshape((b, l, n, d))?;
            let t = match norm {
                Some(norm) => norm.forward(&t)?,
                None => t,
            };
            t.transpose(1, 2)
        };
        let (qn, kn) = match &self.qk_norm {
            Some((q, k)) => (Some(q), Some(k)),
            None => (None, None),
        };
        let q = heads(&self.q_proj, self.num_heads, qn)?;
        let k = heads(&self.k_proj, self.num_kv_heads, kn)?;
        let v = heads(&self.v_proj, self.num_kv_heads, None)?;
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
    fn new(s: &Spec, vb: VarBuilder, lora: Option<LoraInit>) -> Result<Self> {
        let (h, i, bias) = (s.hidden_size, s.intermediate_size, s.mlp_bias);
        let proj = |i, o, m, name| LoraLinear::new(i, o, bias, m, vb.pp(name), lora);
        Ok(Self {
            gate_proj: proj(h, i, TargetModule::GateProj, "gate_proj")?,
            up_proj: proj(h, i, TargetModule::UpProj, "up_proj")?,
            down_proj: proj(i, h, TargetModule::DownProj, "down_proj")?,
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
struct Layer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl Layer {
    fn new(s: &Spec, vb: VarBuilder, lora: Option<LoraInit>) -> Result<Self> {
        let (h, eps) = (s.hidden_size, s.rms_norm_eps);
        Ok(Self {
            self_attn: Attention::new(s, vb.pp("self_attn"), lora)?,
            mlp: Mlp::new(s, vb.pp("mlp"), lora)?,
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

    /// The layer's seven projections in checkpoint order.
    fn projections(&self) -> [&LoraLinear; 7] {
        let (a, m) = (&self.self_attn, &self.mlp);
        [
            &a.q_proj,
            &a.k_proj,
            &a.v_proj,
            &a.o_proj,
            &m.gate_proj,
            &m.up_proj,
            &m.down_proj,
        ]
    }

    /// The trainable factors of the layer.
    fn trainable(&self) -> Vec<Var> {
        self.projections()
            .iter()
            .filter_map(|p| p.adapter())
            .flat_map(|ad| [ad.a.clone(), ad.b.clone()])
            .collect()
    }
}

/// What one forward pass shares across layers.
struct Step<'a> {
    rotation: &'a Rotation,
    mask: Option<&'a Tensor>,
    cache: Option<&'a mut Cache>,
    train: bool,
}

/// Gradients of trainable tensors computed inside checkpointed layers'
/// backward passes, waiting to join the outer [`GradStore`].
#[derive(Debug, Clone, Default)]
pub struct GradSink(Arc<Mutex<HashMap<TensorId, (Tensor, Tensor)>>>);

impl GradSink {
    fn add(&self, var: &Tensor, grad: Tensor) -> Result<()> {
        let mut map = self.0.lock().expect("grad sink poisoned");
        match map.get_mut(&var.id()) {
            Some((_, g)) => *g = (&*g + grad)?,
            None => {
                map.insert(var.id(), (var.clone(), grad));
            }
        }
        Ok(())
    }

    /// Moves every waiting gradient into `grads` (adding where one exists).
    fn drain_into(&self, grads: &mut GradStore) -> Result<()> {
        let mut map = self.0.lock().expect("grad sink poisoned");
        for (_, (var, g)) in map.drain() {
            let g = match grads.remove(&var) {
                Some(outer) => (outer + g)?,
                None => g,
            };
            grads.insert(&var, g);
        }
        Ok(())
    }

    fn clear(&self) {
        self.0.lock().expect("grad sink poisoned").clear();
    }
}

/// A decoder-only causal language model.
#[derive(Debug, Clone)]
pub struct Decoder {
    /// `(vocab, hidden)`.
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// `hidden -> vocab`; shares `embed_tokens` when tied.
    lm_head: BaseLinear,
    rope: RotaryEmbedding,
    checkpointing: bool,
    sink: GradSink,
}

impl Decoder {
    /// Builds the decoder from checkpoint tensors at `vb` (root prefix),
    /// adding LoRA factors to the projections `lora` targets.
    pub fn new(s: &Spec, vb: VarBuilder, lora: Option<LoraInit>) -> Result<Self> {
        let vb_m = vb.pp("model");
        let embed_tokens = vb_m
            .pp("embed_tokens")
            .get((s.vocab_size, s.hidden_size), "weight")?;
        let layers = (0..s.num_hidden_layers)
            .map(|i| Layer::new(s, vb_m.pp(format!("layers.{i}")), lora))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::new(s.hidden_size, s.rms_norm_eps, vb_m.pp("norm"))?;
        let lm_head = if s.tie_word_embeddings {
            BaseLinear::dense(embed_tokens.clone(), None)
        } else {
            BaseLinear::load(s.hidden_size, s.vocab_size, false, &vb.pp("lm_head"))?
        };
        let rope = RotaryEmbedding::new(
            s.head_dim,
            s.rope_theta,
            s.max_position_embeddings,
            vb.dtype(),
            vb.device(),
        )?;
        Ok(Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
            checkpointing: false,
            sink: GradSink::default(),
        })
    }

    fn device(&self) -> &Device {
        self.embed_tokens.device()
    }

    /// Recompute each layer in the backward pass instead of keeping its
    /// activations (training only; no effect on eval or decoding).
    pub fn set_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    pub fn checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// The output projection, `(vocab, hidden)`.
    pub fn lm_head(&self) -> &BaseLinear {
        &self.lm_head
    }

    /// Training/scoring forward: `ids: (B, L)` u32, `attention_mask: (B, L)`
    /// (1 = token, 0 = padding) -> final-normed hidden states `(B, L,
    /// hidden)`. Positions are `0..L` in every row, so pad on the right.
    pub fn forward_hidden(
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
        self.hidden(ids, &mut step)
    }

    /// [`Self::forward_hidden`] followed by `lm_head`: logits `(B, L,
    /// vocab)` in the model's dtype.
    pub fn forward(
        &self,
        ids: &Tensor,
        attention_mask: Option<&Tensor>,
        train: bool,
    ) -> Result<Tensor> {
        let x = self.forward_hidden(ids, attention_mask, train)?;
        self.lm_head.forward(&x)
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
        let checkpoint = self.checkpointing && step.train && step.cache.is_none();
        if checkpoint {
            self.sink.clear();
        }
        if step.train {
            // The first layer's input joins the graph as every later
            // layer's does: its norm then takes the same (differentiable)
            // path in a plain and in a checkpointed pass, and a checkpoint
            // node, which joins the graph only through its input, can wrap
            // the first layer too.
            x = Var::from_tensor(&x)?.as_tensor().clone();
        }
        for (i, layer) in self.layers.iter().enumerate() {
            x = if checkpoint && !layer.trainable().is_empty() {
                checkpointed(layer, i, &x, step, &self.sink)?
            } else {
                layer.forward(&x, step, i)?
            };
        }
        self.norm.forward(&x)
    }

    /// Runs the backward pass from `loss` and returns every gradient,
    /// those of checkpointed layers included.
    pub fn backward(&self, loss: &Tensor) -> Result<GradStore> {
        let mut grads = loss.backward()?;
        self.sink.drain_into(&mut grads)?;
        Ok(grads)
    }

    /// An empty KV cache for this model.
    pub fn new_cache(&self) -> Cache {
        Cache::new(self.layers.len())
    }

    /// Every projection, layer by layer, in checkpoint order.
    pub fn projections(&self) -> Vec<&LoraLinear> {
        self.layers.iter().flat_map(|l| l.projections()).collect()
    }
}

/// Layer `index` applied to `x` keeping no activation: the output is
/// computed under a graph that is dropped at once, and attached to `x` by a
/// node whose backward recomputes it.
fn checkpointed(
    layer: &Layer,
    index: usize,
    x: &Tensor,
    step: &mut Step,
    sink: &GradSink,
) -> Result<Tensor> {
    // A tracked copy of the input, as the recomputation will have, so that
    // every op takes the same path (fused kernels only serve untracked
    // inputs) and the two passes compute the same values.
    let input = Var::from_tensor(&x.detach())?;
    let y = layer.forward(input.as_tensor(), step, index)?.detach();
    x.apply_op1(Checkpoint {
        layer: layer.clone(),
        index,
        rotation: step.rotation.clone(),
        mask: step.mask.cloned(),
        dropout_seed: lora::dropout_seed(),
        output: Mutex::new(Some(y)),
        sink: sink.clone(),
    })
}

struct Checkpoint {
    layer: Layer,
    index: usize,
    rotation: Rotation,
    mask: Option<Tensor>,
    dropout_seed: u64,
    /// The forward's result, handed to the graph once.
    output: Mutex<Option<Tensor>>,
    sink: GradSink,
}

impl Checkpoint {
    fn take_output(&self) -> Result<Tensor> {
        match self.output.lock().expect("checkpoint poisoned").take() {
            Some(y) => Ok(y),
            None => candle_core::bail!("checkpointed layer {} ran twice", self.index),
        }
    }
}

impl CustomOp1 for Checkpoint {
    fn name(&self) -> &'static str {
        "checkpointed-layer"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = self.take_output()?;
        let (s, l) = y.storage_and_layout();
        match &*s {
            Storage::Cpu(s) => Ok((s.try_clone(l)?, y.shape().clone())),
            _ => candle_core::bail!("checkpoint: device mismatch"),
        }
    }

    fn cuda_fwd(&self, _: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
        let y = self.take_output()?;
        let (s, l) = y.storage_and_layout();
        match &*s {
            Storage::Cuda(s) => Ok((s.try_clone(l)?, y.shape().clone())),
            _ => candle_core::bail!("checkpoint: device mismatch"),
        }
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let input = Var::from_tensor(&x.detach())?;
        let before = lora::dropout_seed();
        lora::set_dropout_seed(self.dropout_seed);
        let mut step = Step {
            rotation: &self.rotation,
            mask: self.mask.as_ref(),
            cache: None,
            train: true,
        };
        let y = self.layer.forward(input.as_tensor(), &mut step, self.index);
        lora::set_dropout_seed(before);
        let grads = (y? * g)?.sum_all()?.backward()?;
        for var in self.layer.trainable() {
            if let Some(grad) = grads.get(var.as_tensor()) {
                self.sink.add(var.as_tensor(), grad.clone())?;
            }
        }
        Ok(if x.track_op() {
            grads.get(input.as_tensor()).cloned()
        } else {
            None
        })
    }
}
