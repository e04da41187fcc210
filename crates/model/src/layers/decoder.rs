//! The decoder both architectures share: pre-norm layers of grouped-query
//! attention (with an optional per-head RMSNorm on queries and keys, which
//! Qwen3 has and Llama lacks) and a SwiGLU MLP, token embeddings, a final
//! norm and an optional tied `lm_head`. `arch::qwen3` and
//! `arch::llama` read their `config.json` into a [`Spec`] and build one.
//!
//! In training each layer is one node of candle's graph whose backward is
//! written by hand ([`Layer::forward_saving`], [`Layer::backward_manual`]):
//! the forward runs without a graph on the fused inference kernels (RMSNorm,
//! RoPE, cuDNN attention where built) and keeps only the activations the
//! backward reads; the backward chains the LoRA projections' own backward
//! ([`crate::layers::ops::lora_backward`]: no frozen-weight gradients), attention's,
//! SwiGLU's, RoPE's (the inverse rotation) and RMSNorm's. Op-by-op autograd
//! kept every intermediate and paid a zero-fill and an add per node of the
//! graph in the backward; the layer node pays none of it. The autograd path
//! stays as the reference ([`Decoder::set_manual_backward`]) and for
//! evaluation.
//!
//! Gradient checkpointing ([`Decoder::set_checkpointing`]) keeps only each
//! layer's input and runs the layer's forward again in the backward (Chen
//! et al. 2016, "Training Deep Nets with Sublinear Memory Cost"): the same
//! function of the same input, dropout masks included (keyed by step and
//! layer name), so the gradients equal the non-checkpointed ones bit for
//! bit. The LoRA factors' gradients computed inside layer nodes gather in a
//! [`GradSink`] that [`Decoder::backward`] merges into the gradient store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::backprop::GradStore;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor, TensorId, Var,
};
use candle_nn::VarBuilder;

use crate::layers::attention::{self, Cache};
use crate::layers::fused;
use crate::layers::lora::{self, BaseLinear, BasePrecision, LoraInit, LoraLinear, TargetModule};
use crate::layers::nf4::Nf4Weight;
use crate::layers::norm::RmsNorm;
use crate::layers::rope::{Positions, RotaryEmbedding, Rotation};
use crate::layers::segments::Segments;

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
        if ctx.fused && ctx.cache.as_deref().is_some_and(Cache::is_empty) {
            return self.prefill(x, ctx, layer);
        }
        let (b, l, _) = x.dims3()?;
        let d = self.head_dim;
        // (B, L, H, D) -> (B, H, L, D)
        let (q, k, v) = self.heads(x, ctx)?;
        let (q, k, v) = (q.transpose(1, 2)?, k.transpose(1, 2)?, v.transpose(1, 2)?);
        let q = ctx.rotation.apply(&q)?;
        let k = ctx.rotation.apply(&k)?;
        let (k, v) = match ctx.cache.as_deref_mut() {
            Some(cache) => cache.append(layer, &k, &v)?, // (B, H_kv, T, D)
            None => (k, v),
        };
        let (q, k, v) = match ctx.segments {
            Some(s) => {
                let to = |t: &Tensor| s.to_attention(&t.transpose(1, 2)?);
                (to(&q)?, to(&k)?, to(&v)?) // (N, H, S, D)
            }
            None => (q, k, v),
        };
        let y = if ctx.fused && ctx.cache.is_none() {
            attention::attend_causal_fused(&q, &k, &v)?
        } else {
            attention::attend(&q, &k, &v, ctx.mask)?
        }; // (B, H, L, D), or (N, H, S, D) packed
        let y = match ctx.segments {
            Some(s) => s.from_attention(&y)?,
            None => y.transpose(1, 2)?,
        }
        .reshape((b, l, self.num_heads * d))?; // (B, L, H*D)
        ctx.project(&self.o_proj, &y)
    }

    /// The projections of `x: (B, L, hidden)` as heads, `(B, L, H, D)`
    /// queries and `(B, L, H_kv, D)` keys and values, the queries and keys
    /// through their per-head norms where the model has them; not rotated.
    fn heads(&self, x: &Tensor, ctx: &Step) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, l, _) = x.dims3()?;
        let split = |p: &LoraLinear, n: usize, norm: Option<&RmsNorm>| -> Result<Tensor> {
            let t = ctx.project(p, x)?.reshape((b, l, n, self.head_dim))?;
            match norm {
                Some(norm) => norm.forward(&t),
                None => Ok(t),
            }
        };
        let (qn, kn) = match &self.qk_norm {
            Some((q, k)) => (Some(q), Some(k)),
            None => (None, None),
        };
        Ok((
            split(&self.q_proj, self.num_heads, qn)?,
            split(&self.k_proj, self.num_kv_heads, kn)?,
            split(&self.v_proj, self.num_kv_heads, None)?,
        ))
    }

    /// [`Self::forward`] for a fused pass into an empty cache
    /// ([`Decoder::prefill_right_padded`]): attention as training's,
    /// causal with no mask and no score matrix, read from the projections'
    /// own `(B, L, H, D)` layout (the rotation applied there too), so only
    /// the cache's keys and values and the output change layout.
    fn prefill(&self, x: &Tensor, ctx: &mut Step, layer: usize) -> Result<Tensor> {
        let (b, l, _) = x.dims3()?;
        let d = self.head_dim;
        let (q, k, v) = self.heads(x, ctx)?;
        let (q, k) = (ctx.rotation.apply_thd(&q)?, ctx.rotation.apply_thd(&k)?);
        let (kt, vt) = (k.transpose(1, 2)?, v.transpose(1, 2)?); // (B, H_kv, L, D) views
        let Some(cache) = ctx.cache.as_deref_mut() else {
            candle_core::bail!("a prefill pass needs a cache");
        };
        cache.append(
            layer,
            &attention::contiguous_rows(&kt)?,
            &attention::contiguous_rows(&vt)?,
        )?;
        let y = attention::attend_causal_fused(&q.transpose(1, 2)?, &kt, &vt)?; // (B, H, L, D)
        let y =
            attention::contiguous_rows(&y.transpose(1, 2)?)?.reshape((b, l, self.num_heads * d))?;
        ctx.project(&self.o_proj, &y)
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
    fn forward(&self, x: &Tensor, ctx: &Step) -> Result<Tensor> {
        let gate = ctx.project(&self.gate_proj, x)?; // (B, L, I)
        let up = ctx.project(&self.up_proj, x)?;
        let h = if gate.track_op() || up.track_op() {
            (gate.silu()? * up)?
        } else {
            fused::swiglu(&gate, &up)? // one kernel on CUDA, not three
        };
        ctx.project(&self.down_proj, &h)
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
            .forward(&self.post_attention_layernorm.forward(&x)?, ctx)?;
        x + h
    }

    /// The forward with no graph, keeping what [`Self::backward_manual`]
    /// needs. Ops take the fused inference kernels (norms, RoPE, and
    /// attention when `ctx.fused`).
    fn forward_saving(&self, x: &Tensor, ctx: &Ctx) -> Result<(Tensor, Acts)> {
        let acts = self.activations(x, ctx)?;
        let h = fused::swiglu(&acts.gate, &acts.up)?;
        let down = self
            .mlp
            .down_proj
            .forward_detached(&h, ctx.train, ctx.dropout_seed)?;
        drop(h);
        let y = (&acts.x2 + down)?;
        Ok((y, acts))
    }

    /// What [`Self::backward_manual`] reads, without the layer's output: a
    /// checkpointed layer's forward run again in the backward needs no down
    /// projection (its product, and its `(B, L, I)` input, are never made).
    fn activations(&self, x: &Tensor, ctx: &Ctx) -> Result<Acts> {
        let (b, l, _) = x.dims3()?;
        let at = &self.self_attn;
        let (hq, hkv, d) = (at.num_heads, at.num_kv_heads, at.head_dim);
        let t = ctx.train;
        let n1 = self.input_layernorm.forward_detached(x)?;
        let q_pre = at
            .q_proj
            .forward_detached(&n1, t, ctx.dropout_seed)?
            .reshape((b, l, hq, d))?;
        let k_pre = at
            .k_proj
            .forward_detached(&n1, t, ctx.dropout_seed)?
            .reshape((b, l, hkv, d))?;
        let v = at
            .v_proj
            .forward_detached(&n1, t, ctx.dropout_seed)?
            .reshape((b, l, hkv, d))?;
        let (qn, kn) = match &at.qk_norm {
            Some((qn, kn)) => (qn.forward_detached(&q_pre)?, kn.forward_detached(&k_pre)?),
            None => (q_pre.clone(), k_pre.clone()),
        };
        let q = ctx.rotation.apply_thd(&qn)?; // (B, L, H, D)
        let k = ctx.rotation.apply_thd(&kn)?;
        // A packed pass on cuDNN's packed sequences; where cuDNN refuses
        // them (before Hopper, an old cuDNN), the gathered layout instead,
        // for the rest of the process.
        let packed = match ctx.ragged() {
            true => match fused_attention_saving(&q, &k, &v, ctx.segments.as_ref()) {
                Ok(out) => {
                    crate::layers::segments::packed_attention_worked();
                    Some(out)
                }
                Err(e) if !crate::layers::segments::packed_attention_proven() => {
                    crate::layers::segments::refuse_packed_attention(&e);
                    None
                }
                Err(e) => return Err(e),
            },
            false => None,
        };
        let (o, attn) = match packed {
            Some(out) => out, // (1, T, H, D)
            None => {
                let (qt, kt, vt) = ctx.attention_layout(&q, &k, &v)?;
                if ctx.fused {
                    fused_attention_saving(&qt, &kt, &vt, None)?
                } else {
                    (
                        attention::attend(&qt, &kt, &vt, ctx.mask.as_ref())?,
                        AttnSaved::Plain,
                    )
                } // (B, H, L, D), or (N, H, S, D) gathered
            }
        };
        let o_flat = ctx.packed_layout(&o)?.reshape((b, l, hq * d))?;
        let x2 = (x.detach() + at.o_proj.forward_detached(&o_flat, t, ctx.dropout_seed)?)?;
        let n2 = self.post_attention_layernorm.forward_detached(&x2)?;
        let gate = self
            .mlp
            .gate_proj
            .forward_detached(&n2, t, ctx.dropout_seed)?;
        let up = self
            .mlp
            .up_proj
            .forward_detached(&n2, t, ctx.dropout_seed)?;
        Ok(Acts {
            x: x.detach(),
            q_pre,
            k_pre,
            q,
            k,
            v,
            o,
            attn,
            x2,
            gate,
            up,
        })
    }

    /// `dL/dx` and every LoRA factor's gradient for `dL/dy = dy`, from the
    /// activations of [`Self::forward_saving`] (same dropout seed).
    ///
    /// Takes the activations by value and drops each tensor after its last
    /// use: at 8,192 tokens a Qwen3-4B layer's MLP temporaries are five
    /// `(B, L, I)` tensors of 160 MB, which would otherwise stay alive
    /// through the attention backward, at the step's memory peak.
    fn backward_manual(
        &self,
        acts: Acts,
        dy: &Tensor,
        ctx: &Ctx,
    ) -> Result<(Tensor, Vec<(Var, Tensor)>)> {
        let t = ctx.train;
        let at = &self.self_attn;
        let (b, l, _) = acts.x.dims3()?;
        let (hq, hkv, d) = (at.num_heads, at.num_kv_heads, at.head_dim);
        let mut grads = Vec::new();
        let mut keep = |p: &LoraLinear, g: Option<(Tensor, Tensor)>| {
            if let (Some(ad), Some((da, db))) = (p.adapter(), g) {
                grads.push((ad.a.clone(), da));
                grads.push((ad.b.clone(), db));
            }
        };
        let dy = dy.contiguous()?;
        // MLP: y = x2 + down(silu(gate(n2)) * up(n2)), n2 = norm(x2).
        let mlp = &self.mlp;
        let dx2 = {
            let h = fused::swiglu(&acts.gate, &acts.up)?;
            let (dh, g) = mlp.down_proj.backward(&h, &dy, t, ctx.dropout_seed)?;
            keep(&mlp.down_proj, g);
            drop(h);
            let (dgate, dup) = fused::swiglu_backward(&acts.gate, &acts.up, &dh)?;
            drop((acts.gate, acts.up, dh));
            let n2 = self.post_attention_layernorm.forward_detached(&acts.x2)?;
            let (dn2, g) = mlp.gate_proj.backward(&n2, &dgate, t, ctx.dropout_seed)?;
            keep(&mlp.gate_proj, g);
            drop(dgate);
            let (dn2_up, g) = mlp.up_proj.backward(&n2, &dup, t, ctx.dropout_seed)?;
            keep(&mlp.up_proj, g);
            drop((dup, n2));
            let dn2 = (dn2 + dn2_up)?;
            (&dy + self.post_attention_layernorm.backward(&acts.x2, &dn2)?)?
        };
        drop((dy, acts.x2));
        mark(&dx2, "layer mlp backward")?;
        // Attention: x2 = x + o_proj(attend(rope(q), rope(k), v)).
        let (dq, dk, dv) = {
            let o_flat = ctx.packed_layout(&acts.o)?.reshape((b, l, hq * d))?;
            let (do_flat, g) = at.o_proj.backward(&o_flat, &dx2, t, ctx.dropout_seed)?;
            keep(&at.o_proj, g);
            drop(o_flat);
            let d_o = do_flat.reshape((b, l, hq, d))?;
            let d_o = match &ctx.segments {
                _ if ctx.ragged() => d_o, // (1, T, H, D)
                // cuDNN's backward takes dO contiguous in the (N, H, S, D) order.
                Some(s) => s.to_attention(&d_o)?.contiguous()?,
                None => d_o.transpose(1, 2)?, // (B, H, L, D)
            };
            let (qt, kt, vt) = ctx.attention_layout(&acts.q, &acts.k, &acts.v)?;
            attention_backward(&acts.attn, &qt, &kt, &vt, &acts.o, &d_o, ctx)?
        };
        drop((acts.q, acts.k, acts.v, acts.o, acts.attn));
        mark(&dx2, "layer attention backward")?;
        let dq = ctx.rotation.invert_thd(&ctx.packed_layout(&dq)?)?; // (B, L, H, D)
        let dk = ctx.rotation.invert_thd(&ctx.packed_layout(&dk)?)?;
        let (dq, dk) = match &at.qk_norm {
            Some((qn, kn)) => (
                qn.backward(&acts.q_pre, &dq)?,
                kn.backward(&acts.k_pre, &dk)?,
            ),
            None => (dq, dk),
        };
        drop((acts.q_pre, acts.k_pre));
        let dv = ctx.packed_layout(&dv)?.contiguous()?; // (B, L, H_kv, D)
        let n1 = self.input_layernorm.forward_detached(&acts.x)?;
        let (dn1, g) =
            at.q_proj
                .backward(&n1, &dq.reshape((b, l, hq * d))?, t, ctx.dropout_seed)?;
        keep(&at.q_proj, g);
        drop(dq);
        let (dn1_k, g) =
            at.k_proj
                .backward(&n1, &dk.reshape((b, l, hkv * d))?, t, ctx.dropout_seed)?;
        keep(&at.k_proj, g);
        let (dn1_v, g) =
            at.v_proj
                .backward(&n1, &dv.reshape((b, l, hkv * d))?, t, ctx.dropout_seed)?;
        keep(&at.v_proj, g);
        drop((dk, dv, n1));
        let dn1 = ((dn1 + dn1_k)? + dn1_v)?;
        let dx = (dx2 + self.input_layernorm.backward(&acts.x, &dn1)?)?;
        mark(&dx, "layer qkv backward")?;
        Ok((dx, grads))
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
}

/// [`trace_train_base::gpu::memory_mark`] on `t`'s device (a candle error).
fn mark(t: &Tensor, label: &str) -> Result<()> {
    trace_train_base::gpu::memory_mark(t.device(), label).map_err(candle_core::Error::wrap)
}

/// What one forward pass shares across layers.
struct Step<'a> {
    rotation: &'a Rotation,
    mask: Option<&'a Tensor>,
    cache: Option<&'a mut Cache>,
    train: bool,
    /// Causal attention through the fused kernel (right-padded batches
    /// without a cache).
    fused: bool,
    /// Decoding's folded weights, when the pass decodes with them.
    view: Option<&'a DecodeView>,
    /// A packed pass: attention runs on each example's own row.
    segments: Option<&'a Segments>,
}

impl Step<'_> {
    /// `p` applied to `x`: through its folded weight when decoding has one,
    /// else as the projection itself.
    fn project(&self, p: &LoraLinear, x: &Tensor) -> Result<Tensor> {
        match self.view.and_then(|v| v.folded.get(p.name())) {
            Some(folded) => folded.forward(x),
            None => p.forward(x, self.train),
        }
    }
}

/// Decoding's view of the weights: every adapted projection with its LoRA
/// update folded into one dense weight, `W + (alpha / r) B A` (Hu et al.
/// 2021, sec. 4.1: no extra latency at inference), so a decoding step runs
/// one GEMM a projection instead of seven kernels (two factor casts, three
/// GEMMs, a scale and an add). Built from the factors' values at the time
/// ([`Decoder::decode_view`]) and dropped after the generation, so decoding
/// never runs on weights older than the call: an RL step that samples after
/// an update samples from that update.
///
/// The fold is computed in f32 and rounded once to the model's dtype: in
/// f32 it equals the unfolded projection to rounding; in bf16 an update
/// smaller than half a unit in the last place of a weight rounds away, as
/// a delta that small also does when added to the projection's bf16 output
/// in the unfolded path. Projections without an adapter, and 4-bit bases
/// (a dense fold would undo what 4 bits save), are used as they are.
#[derive(Debug, Default)]
pub struct DecodeView {
    /// By projection name.
    folded: HashMap<String, BaseLinear>,
}

impl DecodeView {
    /// Projections with a folded weight.
    pub fn len(&self) -> usize {
        self.folded.len()
    }

    pub fn is_empty(&self) -> bool {
        self.folded.is_empty()
    }
}

/// Projections as one [`DecodeProj::Parts`]: the bases as they are, the
/// adapters' factors stacked in `dtype` (`B` scaled).
fn parts_proj(ps: &[&LoraLinear], dtype: DType) -> Result<DecodeProj> {
    let mut parts = Vec::with_capacity(ps.len());
    for p in ps {
        parts.push(match p.base() {
            BaseLinear::Nf4 { weight, .. } => DecodeBase::Nf4 {
                scales: weight.block_scales()?.clone(),
                weight: Arc::clone(weight),
            },
            BaseLinear::Dense { weight, .. } => DecodeBase::Dense(weight.clone()),
            BaseLinear::Fp8 { weight, .. } => DecodeBase::Fp8 {
                codes: weight.rows().codes.clone(),
                scales: weight.rows().scales.clone(),
            },
        });
    }
    if let Some(first) = ps[0].bank().filter(|_| lora::adapters_enabled()) {
        // Several adapters side by side: each segment's blocks, the row
        // mask applied to x A^T picks each row's (`fast_decode`).
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for p in ps {
            let Some(bank) = p.bank() else {
                candle_core::bail!(
                    "decode: {} has no served adapters beside the others",
                    p.name()
                );
            };
            a.push(bank.a.to_dtype(dtype)?);
            b.push(bank.b.to_dtype(dtype)?);
        }
        return Ok(DecodeProj::Parts {
            parts,
            lora: Some(DecodeLora {
                a: Tensor::cat(&a, 0)?.contiguous()?,
                b: Tensor::cat(&b, 0)?.contiguous()?,
                rank: first.count * first.rank,
                blocks: first.count,
            }),
        });
    }
    let adapters: Vec<_> = ps
        .iter()
        .map(|p| p.adapter().filter(|_| lora::adapters_enabled()))
        .collect();
    let Some(first) = adapters.iter().flatten().next() else {
        return Ok(DecodeProj::Parts { parts, lora: None });
    };
    let rank = first.a.dim(0)?;
    let device = first.a.device();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (p, ad) in ps.iter().zip(&adapters) {
        let (out, inp) = p.base().dims()?;
        match ad {
            Some(ad) if ad.a.dim(0)? == rank => {
                a.push(ad.a.as_detached_tensor().to_dtype(dtype)?);
                b.push((ad.b.as_detached_tensor() * ad.scale)?.to_dtype(dtype)?);
            }
            Some(ad) => candle_core::bail!(
                "decode: {} has LoRA rank {} beside rank {rank}",
                p.name(),
                ad.a.dim(0)?
            ),
            None => {
                a.push(Tensor::zeros((rank, inp), dtype, device)?);
                b.push(Tensor::zeros((out, rank), dtype, device)?);
            }
        }
    }
    Ok(DecodeProj::Parts {
        parts,
        lora: Some(DecodeLora {
            a: Tensor::cat(&a, 0)?.contiguous()?,
            b: Tensor::cat(&b, 0)?.contiguous()?,
            rank,
            blocks: 1,
        }),
    })
}

/// `weight` (a projection's dense base) with the projection's LoRA update
/// folded in, `W + (alpha / r) B A` computed in f32 and rounded once to the
/// weight's dtype; `weight` itself without an adapter or inside
/// [`lora::without_adapters`].
fn folded(p: &LoraLinear, weight: &Tensor) -> Result<Tensor> {
    match p.adapter() {
        Some(ad) if lora::adapters_enabled() => {
            let a = ad.a.as_detached_tensor().to_dtype(DType::F32)?;
            let b = ad.b.as_detached_tensor().to_dtype(DType::F32)?;
            let delta = (b.matmul(&a)? * ad.scale)?; // (out, in)
            (weight.to_dtype(DType::F32)? + delta)?.to_dtype(weight.dtype())
        }
        _ => Ok(weight.clone()),
    }
}

/// The weights the fused decode step reads (`model::decode::fast_decode`), made
/// per generation from the LoRA factors as they are then. Each layer's q,
/// k and v projections form one [`DecodeProj`], gate and up another, so a
/// layer runs four products. In a bf16 model the decode kernel reads the
/// bases as they are, bf16 or NF4 (a quarter of the bytes a step), with
/// the adapters' factors beside them: no copy of any weight. Otherwise the
/// projections are one dense copy in the model's dtype with the LoRA
/// update folded in (as [`DecodeView`] does) and NF4 dequantised once.
/// Norms and embeddings are the model's own tensors.
pub struct DecodeWeights {
    /// `(vocab, hidden)`.
    pub embed: Tensor,
    /// The final norm's weight.
    pub norm: Tensor,
    /// `(vocab, hidden)`: the head's weight as the model has it.
    pub head: DecodeProj,
    /// RoPE tables `(max_positions, head_dim / 2)`.
    pub cos: Tensor,
    pub sin: Tensor,
    pub eps: f64,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: Vec<DecodeLayer>,
}

/// One layer of [`DecodeWeights`].
pub struct DecodeLayer {
    pub input_norm: Tensor,
    pub post_norm: Tensor,
    /// Qwen3's per-head query and key norms.
    pub qk_norm: Option<(Tensor, Tensor)>,
    /// `((H + 2 H_kv) D, hidden)`: q, k and v stacked.
    pub qkv: DecodeProj,
    /// `(hidden, H D)`.
    pub o: DecodeProj,
    /// `(2 I, hidden)`: gate then up.
    pub gate_up: DecodeProj,
    /// `(hidden, I)`.
    pub down: DecodeProj,
}

/// One product of the decode step, `x W^T` for a `W` of one or more
/// projections stacked by rows (their outputs side by side).
pub enum DecodeProj {
    /// One dense copy `(out, in)` in the model's dtype, LoRA folded in
    /// (for cuBLAS: f32 and f16 models, inner sizes off the 64-blocks).
    Folded(Tensor),
    /// Each projection's base as it is (a segment: no copy), and the LoRA
    /// update beside it, `y = x W^T + (x A^T) B^T` a segment: for the
    /// decode kernel (`fast_decode::Products`).
    Parts {
        parts: Vec<DecodeBase>,
        lora: Option<DecodeLora>,
    },
}

/// A base weight the decode kernel reads as it is.
pub enum DecodeBase {
    /// `(out, in)` bf16.
    Dense(Tensor),
    /// The packed codes, and the f16 block scales
    /// ([`Nf4Weight::block_scales`], made once a weight).
    Nf4 {
        weight: Arc<Nf4Weight>,
        scales: Tensor,
    },
    /// `(out, in)` E4M3 codes and each row's f32 scale
    /// ([`crate::layers::fp8::Fp8Rows`], the trainer's own tensors).
    Fp8 { codes: Tensor, scales: Tensor },
}

impl DecodeBase {
    /// `(out, in)`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Self::Dense(w) => w.dims2(),
            Self::Nf4 { weight, .. } => Ok(weight.shape()),
            Self::Fp8 { codes, .. } => codes.dims2(),
        }
    }

    /// The decode kernel's name for the format (`skinny_{format}_m..`).
    pub fn format(&self) -> &'static str {
        match self {
            Self::Dense(_) => "bf16",
            Self::Nf4 { .. } => "nf4",
            Self::Fp8 { .. } => "fp8",
        }
    }
}

/// The LoRA factors of a [`DecodeProj::Parts`], in the model's dtype.
pub struct DecodeLora {
    /// `(segments * r, in)`: every segment's `A`, stacked (zeros for a
    /// projection without an adapter).
    pub a: Tensor,
    /// `(out, r)`: every segment's `B` times its scale, stacked.
    pub b: Tensor,
    pub rank: usize,
    /// Adapters side by side in each segment's `r` columns (1: one
    /// adapter); with more, each row keeps its own adapter's `r / blocks`
    /// columns of `x A^T` (the decode step's row mask).
    pub blocks: usize,
}

impl DecodeProj {
    /// `(out, in)` of the stacked matrix.
    pub fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Self::Folded(w) => w.dims2(),
            Self::Parts { parts, .. } => {
                let mut out = 0;
                for p in parts {
                    out += p.dims()?.0;
                }
                Ok((out, parts.first().map_or(Ok(0), |p| p.dims().map(|d| d.1))?))
            }
        }
    }
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

    fn is_empty(&self) -> bool {
        self.0.lock().expect("grad sink poisoned").is_empty()
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
    /// Training forwards run each layer as one node with a hand-written
    /// backward (the default); off, candle's autograd differentiates the
    /// layer op by op (kept as the reference the tests compare against).
    manual_backward: bool,
    /// Training/scoring forwards use fused causal attention (set at build
    /// when the device and build have it).
    fused_attention: bool,
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
            manual_backward: std::env::var_os("TRACE_TRAIN_AUTOGRAD").is_none(),
            fused_attention: attention::fused_available(vb.dtype(), vb.device(), s.head_dim)
                && std::env::var_os("TRACE_TRAIN_PLAIN_ATTENTION").is_none(),
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

    /// Differentiate training forwards with the hand-written layer backward
    /// (on, the default) or with candle's autograd op by op (the reference;
    /// no checkpointing).
    pub fn set_manual_backward(&mut self, on: bool) {
        self.manual_backward = on;
    }

    /// Holds every projection's frozen weight in `precision` (NF4 as
    /// QLoRA, or FP8); embeddings, norms and `lm_head` stay as they are.
    pub fn hold_projections(&mut self, precision: BasePrecision) -> Result<()> {
        for p in self.projections_mut() {
            let name = p.name().to_owned();
            p.hold_base(precision).map_err(|e| {
                e.context(format!("cannot hold `{name}` in {}\nhint: pass --no_4bit to keep the base weights in 16 bits", precision.as_str()))
            })?;
        }
        Ok(())
    }

    /// Every projection, layer by layer in checkpoint order, to change.
    pub fn projections_mut(&mut self) -> Vec<&mut LoraLinear> {
        self.layers
            .iter_mut()
            .flat_map(|layer| {
                let (a, m) = (&mut layer.self_attn, &mut layer.mlp);
                [
                    &mut a.q_proj,
                    &mut a.k_proj,
                    &mut a.v_proj,
                    &mut a.o_proj,
                    &mut m.gate_proj,
                    &mut m.up_proj,
                    &mut m.down_proj,
                ]
            })
            .collect()
    }

    /// Query heads of each attention layer (0 without layers).
    pub fn num_attention_heads(&self) -> usize {
        self.layers.first().map_or(0, |l| l.self_attn.num_heads)
    }

    /// Whether training forwards use fused attention.
    pub fn fused_attention(&self) -> bool {
        self.fused_attention
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
        self.whole_pass(ids, &rotation, mask.as_ref(), None, train)
    }

    /// A pass over whole sequences (no cache): what training and scoring
    /// forwards share.
    fn whole_pass(
        &self,
        ids: &Tensor,
        rotation: &Rotation,
        mask: Option<&Tensor>,
        segments: Option<&Segments>,
        train: bool,
    ) -> Result<Tensor> {
        let mut step = Step {
            rotation,
            mask,
            cache: None,
            train,
            fused: self.fused_attention,
            view: None,
            segments,
        };
        self.hidden(ids, &mut step)
    }

    /// [`Self::forward_hidden`] over a packed row `ids: (1, T)` of several
    /// examples end to end: `positions: (1, T)` restart at each example,
    /// and attention stays inside each (`segments`).
    pub fn forward_hidden_packed(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        segments: &Segments,
        train: bool,
    ) -> Result<Tensor> {
        let (_, l) = ids.dims2()?;
        // Causal over each example's right-padded row: padding slots come
        // after every real one, so no real query sees them.
        let mask = attention::mask(segments.seq_len(), 0, None, self.device())?;
        let rotation = self.rope.at(&Positions::PerRow(positions.clone()), l)?;
        self.whole_pass(ids, &rotation, mask.as_ref(), Some(segments), train)
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
        self.decode_step(ids, offset, cache, None)
    }

    /// Whether [`Self::prefill_right_padded`] can run here: fused attention
    /// serves this model's dtype, device and head size, and
    /// `TRACE_TRAIN_PREFILL` is `fused` or unset (`masked`: the chunked path
    /// with a score matrix, kept for comparison; anything else is an error).
    pub fn fused_prefill_usable(&self) -> Result<bool> {
        let wanted = match std::env::var("TRACE_TRAIN_PREFILL").as_deref() {
            Ok("fused") | Err(_) => true,
            Ok("masked") => false,
            Ok(other) => candle_core::bail!("TRACE_TRAIN_PREFILL={other}\nhint: fused or masked"),
        };
        let Some(l) = self.layers.first() else {
            return Ok(false);
        };
        Ok(wanted
            && attention::fused_available(
                self.embed_tokens.dtype(),
                self.device(),
                l.self_attn.head_dim,
            ))
    }

    /// Prefills right-padded prompts `ids: (B, W)`, row `b`'s tokens in
    /// columns `0..lens[b]`, into the empty, unpadded `cache` in one pass
    /// with fused causal attention: no mask, since no token sees a later
    /// column, and no score matrix. Returns each row's logits at its last
    /// token, `(B, vocab)`. The padding columns hold the pad token's keys
    /// and values, which no real token sees.
    pub fn prefill_right_padded(
        &self,
        ids: &Tensor,
        lens: &[usize],
        cache: &mut Cache,
    ) -> Result<Tensor> {
        let (b, l) = ids.dims2()?;
        if lens.len() != b || lens.iter().any(|&n| n == 0 || n > l) {
            candle_core::bail!(
                "prefill_right_padded: lengths {lens:?} for {b} rows of {l} columns"
            );
        }
        if !cache.is_empty() || cache.is_padded() {
            candle_core::bail!("prefill_right_padded needs an empty cache without left padding");
        }
        let rotation = self.rope.at(&Positions::Offset(0), l)?;
        let mut step = Step {
            rotation: &rotation,
            mask: None,
            cache: Some(cache),
            train: false,
            fused: true,
            view: None,
            segments: None,
        };
        let x = self.hidden(ids, &mut step)?; // (B, L, hidden)
        cache.advance(l);
        let last: Vec<u32> = lens
            .iter()
            .enumerate()
            .map(|(r, &n)| (r * l + n - 1) as u32)
            .collect();
        let last = Tensor::new(last.as_slice(), ids.device())?;
        let x = x.flatten_to(1)?.index_select(&last, 0)?; // (B, hidden)
        self.lm_head.forward(&x) // (B, vocab)
    }

    /// [`Self::forward_with_cache`] through decoding's folded weights
    /// ([`Self::decode_view`]).
    pub fn forward_with_view(
        &self,
        ids: &Tensor,
        offset: usize,
        cache: &mut Cache,
        view: &DecodeView,
    ) -> Result<Tensor> {
        self.decode_step(ids, offset, cache, Some(view))
    }

    /// The folded weights of every adapted dense projection, from the LoRA
    /// factors' current values (see [`DecodeView`]). Empty without
    /// adapters, inside [`lora::without_adapters`] (the base alone), and
    /// when `TRACE_TRAIN_PLAIN_DECODE` is set.
    pub fn decode_view(&self) -> Result<DecodeView> {
        let mut view = DecodeView::default();
        if std::env::var_os("TRACE_TRAIN_PLAIN_DECODE").is_some() || !lora::adapters_enabled() {
            return Ok(view);
        }
        for p in self.projections() {
            let (Some(_), BaseLinear::Dense { weight, bias }) = (p.adapter(), p.base()) else {
                continue;
            };
            let w = folded(p, weight)?;
            view.folded
                .insert(p.name().to_owned(), BaseLinear::dense(w, bias.clone()));
        }
        Ok(view)
    }

    /// Bytes of weights one decode step must read at the least, as they
    /// are held: every projection's base (codes and scales), the head, the
    /// norms. LoRA factors and the embedding rows gathered are left out.
    pub fn step_weight_bytes(&self) -> usize {
        let norms: usize = self
            .layers
            .iter()
            .map(|l| {
                l.input_layernorm.weight().elem_count()
                    + l.post_attention_layernorm.weight().elem_count()
            })
            .sum();
        let elt = self.embed_tokens.dtype().size_in_bytes();
        self.projections()
            .iter()
            .map(|p| p.base().storage_bytes())
            .sum::<usize>()
            + self.lm_head.storage_bytes()
            + (norms + self.norm.weight().elem_count()) * elt
    }

    /// Bytes one token's keys and values take in a KV cache.
    pub fn kv_bytes_per_token(&self) -> usize {
        let Some(l) = self.layers.first() else {
            return 0;
        };
        let at = &l.self_attn;
        2 * self.layers.len()
            * at.num_kv_heads
            * at.head_dim
            * self.embed_tokens.dtype().size_in_bytes()
    }

    /// Bytes [`Self::decode_weights`] allocates: one dense copy of every
    /// projection in the model's dtype, or, reading the bases in place,
    /// the stacked LoRA factors (and, once a weight, NF4's block scales).
    pub fn decode_weights_bytes(&self, in_place: bool) -> Result<usize> {
        let elt = self.embed_tokens.dtype().size_in_bytes();
        let as_parts = in_place && self.decode_can_read_bases();
        let mut bytes = 0;
        for p in self.projections() {
            let (o, i) = p.base().dims()?;
            let factors = match (p.adapter(), p.bank()) {
                (Some(ad), _) => (o + i) * ad.a.dim(0)? * elt,
                (None, Some(bank)) => (o + i) * bank.count * bank.rank * elt,
                (None, None) => 0,
            };
            bytes += match p.base() {
                // NF4's block scales, f16 a 64-block, made for the step.
                BaseLinear::Nf4 { .. } if as_parts => factors + o * i / 32,
                // FP8's codes and scales are read as they are.
                BaseLinear::Fp8 { .. } | BaseLinear::Dense { .. } if as_parts => factors,
                _ => o * i * elt,
            };
        }
        Ok(bytes)
    }

    /// Whether the decode step can read the bases in place (the decode
    /// kernel, `fast_decode::Products`) instead of a folded dense copy: a
    /// bf16 model, every base of one kind (bf16, NF4 or FP8) with its inner
    /// size in whole 64-blocks, LoRA ranks in multiples of 8.
    pub fn decode_can_read_bases(&self) -> bool {
        let projections = self.projections();
        let kind = |p: &&LoraLinear| std::mem::discriminant(p.base());
        !projections.is_empty()
            && self.embed_tokens.dtype() == DType::BF16
            && projections.iter().all(|p| kind(p) == kind(&projections[0]))
            && projections.iter().all(|p| {
                p.base().dims().is_ok_and(|(_, i)| i % 64 == 0)
                    && p.adapter()
                        .is_none_or(|ad| ad.a.dim(0).is_ok_and(|r| r % 8 == 0))
            })
    }

    /// The weights of the fused decode step (`fast_decode`), as they are
    /// now: see [`DecodeWeights`]. `None` for an architecture the step does
    /// not cover (biases, a head size or grouping without a kernel).
    /// `in_place`: read the bases as they are where
    /// [`Self::decode_can_read_bases`] (else one folded copy).
    pub fn decode_weights(&self, in_place: bool) -> Result<Option<DecodeWeights>> {
        let Some(first) = self.layers.first() else {
            return Ok(None);
        };
        let at = &first.self_attn;
        let (heads, kv_heads, head_dim) = (at.num_heads, at.num_kv_heads, at.head_dim);
        let groups = heads / kv_heads.max(1);
        let biased = self.projections().iter().any(|p| p.base().bias().is_some());
        if biased
            || !matches!(head_dim, 32 | 64 | 128)
            || !(1..=8).contains(&groups)
            || heads != groups * kv_heads
        {
            return Ok(None);
        }
        let as_parts = in_place && self.decode_can_read_bases();
        if !as_parts && self.projections().iter().any(|p| p.bank().is_some()) {
            // Several adapters cannot fold into one copy of the weights.
            return Ok(None);
        }
        let proj = |ps: &[&LoraLinear]| -> Result<DecodeProj> {
            if as_parts {
                parts_proj(ps, self.embed_tokens.dtype())
            } else {
                let dense: Vec<Tensor> = ps
                    .iter()
                    .map(|p| folded(p, &p.base().weight()?))
                    .collect::<Result<_>>()?;
                Ok(DecodeProj::Folded(Tensor::cat(&dense, 0)?))
            }
        };
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (a, m) = (&layer.self_attn, &layer.mlp);
            layers.push(DecodeLayer {
                input_norm: layer.input_layernorm.weight().clone(),
                post_norm: layer.post_attention_layernorm.weight().clone(),
                qk_norm: a
                    .qk_norm
                    .as_ref()
                    .map(|(q, k)| (q.weight().clone(), k.weight().clone())),
                qkv: proj(&[&a.q_proj, &a.k_proj, &a.v_proj])?,
                o: proj(&[&a.o_proj])?,
                gate_up: proj(&[&m.gate_proj, &m.up_proj])?,
                down: proj(&[&m.down_proj])?,
            });
        }
        let (cos, sin) = self.rope.tables();
        Ok(Some(DecodeWeights {
            embed: self.embed_tokens.clone(),
            norm: self.norm.weight().clone(),
            head: if as_parts {
                DecodeProj::Parts {
                    parts: vec![DecodeBase::Dense(self.lm_head.weight()?)],
                    lora: None,
                }
            } else {
                DecodeProj::Folded(self.lm_head.weight()?)
            },
            cos: cos.clone(),
            sin: sin.clone(),
            eps: self.norm.eps(),
            heads,
            kv_heads,
            head_dim,
            hidden: self.embed_tokens.dim(1)?,
            intermediate: first.mlp.down_proj.base().dims()?.1,
            layers,
        }))
    }

    fn decode_step(
        &self,
        ids: &Tensor,
        offset: usize,
        cache: &mut Cache,
        view: Option<&DecodeView>,
    ) -> Result<Tensor> {
        let (b, l) = ids.dims2()?;
        let frame = cache.frame(b, l, offset, self.device())?;
        let rotation = self.rope.at(&frame.positions, l)?;
        let mut step = Step {
            rotation: &rotation,
            mask: frame.mask.as_ref(),
            cache: Some(cache),
            train: false,
            fused: false,
            view,
            segments: None,
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
        if step.train && !self.sink.is_empty() {
            // A backward pass that stopped at `loss.backward()` would leave
            // the LoRA factors without gradients and training would go on
            // learning nothing: say so instead.
            candle_core::bail!(
                "the LoRA gradients of the previous training step were never collected\nhint: run the backward pass with `Model::backward(&loss)`, not `loss.backward()`"
            );
        }
        if step.train {
            // The first layer's input joins the graph as every later
            // layer's does: its norm then takes the same (differentiable)
            // path in a plain and in a checkpointed pass, and a checkpoint
            // node, which joins the graph only through its input, can wrap
            // the first layer too.
            x = Var::from_tensor(&x)?.as_tensor().clone();
        }
        let manual = self.manual_backward && step.train && step.cache.is_none();
        for (i, layer) in self.layers.iter().enumerate() {
            x = if manual {
                manual_layer(layer, &x, step, self.checkpointing, &self.sink)?
            } else if checkpoint {
                candle_core::bail!("gradient checkpointing needs the hand-written layer backward")
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

/// What a layer's hand-written backward reads from its forward.
struct Acts {
    /// The layer's input `(B, L, hidden)`.
    x: Tensor,
    /// Query and key projections before the per-head norm, `(B, L, H, D)`.
    q_pre: Tensor,
    k_pre: Tensor,
    /// Rotated queries and keys, and values, `(B, L, H, D)`.
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// Attention output `(B, H, L, D)`.
    o: Tensor,
    attn: AttnSaved,
    /// The residual stream after attention.
    x2: Tensor,
    /// MLP gate and up projections `(B, L, I)`.
    gate: Tensor,
    up: Tensor,
}

/// What the attention backward needs beyond q, k, v and the output.
enum AttnSaved {
    #[cfg(feature = "cudnn")]
    Fused(crate::cuda::sdpa_cudnn::SdpaSaved),
    /// Recomputed under a small graph in the backward.
    Plain,
}

/// cuDNN's attention keeping what its backward needs: over `(B, H, L, D)`
/// rows, or, for a packed pass, over each example of the packed `(1, T, H,
/// D)` row where it lies (cuDNN's packed sequences).
#[cfg(feature = "cudnn")]
fn fused_attention_saving(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    segments: Option<&Segments>,
) -> Result<(Tensor, AttnSaved)> {
    let scale = (1.0 / (q.dim(3)? as f64).sqrt()) as f32;
    let (o, saved) = match segments {
        Some(s) => {
            let (_, _, h, d) = q.dims4()?;
            let layout = s.ragged((h, k.dim(2)?, d), q.device())?;
            crate::cuda::sdpa_cudnn::ragged_causal_sdpa_saving(q, k, v, layout, scale)?
        }
        None => crate::cuda::sdpa_cudnn::causal_sdpa_saving(q, k, v, scale)?,
    };
    Ok((o, AttnSaved::Fused(saved)))
}

#[cfg(not(feature = "cudnn"))]
fn fused_attention_saving(
    _: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: Option<&Segments>,
) -> Result<(Tensor, AttnSaved)> {
    candle_core::bail!("fused attention needs the `cudnn` build")
}

/// `(dq, dk, dv)`, each `(B, H, L, D)`, of attention's output `o` for the
/// output gradient `d_o`.
fn attention_backward(
    saved: &AttnSaved,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    d_o: &Tensor,
    ctx: &Ctx,
) -> Result<(Tensor, Tensor, Tensor)> {
    match saved {
        #[cfg(feature = "cudnn")]
        AttnSaved::Fused(s) => crate::cuda::sdpa_cudnn::causal_sdpa_backward(s, o, d_o),
        AttnSaved::Plain => {
            let _ = o;
            attention::attend_backward(q, k, v, ctx.mask.as_ref(), d_o)
        }
    }
}

/// What a layer op needs of its training step, owned (it lives in the
/// graph until the backward).
#[derive(Clone)]
struct Ctx {
    rotation: Rotation,
    segments: Option<Segments>,
    mask: Option<Tensor>,
    fused: bool,
    train: bool,
    dropout_seed: u64,
}

impl Ctx {
    /// A packed pass whose attention cuDNN computes where the examples lie
    /// (its packed sequences): no change of layout either way.
    fn ragged(&self) -> bool {
        self.fused && self.segments.is_some() && crate::layers::segments::packed_attention_usable()
    }

    /// Rotated queries and keys and the values, `(B, L, H, D)`, as
    /// attention takes them: `(B, H, L, D)` views, or each example's own
    /// row `(N, H, S, D)` in a packed pass (the packed row itself with
    /// cuDNN).
    fn attention_layout(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        match &self.segments {
            _ if self.ragged() => Ok((q.clone(), k.clone(), v.clone())),
            Some(s) => Ok((s.to_attention(q)?, s.to_attention(k)?, s.to_attention(v)?)),
            None => Ok((q.transpose(1, 2)?, k.transpose(1, 2)?, v.transpose(1, 2)?)),
        }
    }

    /// The inverse of [`Self::attention_layout`] for one tensor: `(B, H, L,
    /// D)` or `(N, H, S, D)` -> `(B, L, H, D)`.
    fn packed_layout(&self, x: &Tensor) -> Result<Tensor> {
        match &self.segments {
            _ if self.ragged() => Ok(x.clone()),
            Some(s) => s.from_attention(x),
            None => x.transpose(1, 2),
        }
    }
}

/// Layer `index` applied to `x` as one node of the graph whose backward is
/// written by hand ([`Layer::backward_manual`]): the forward keeps the
/// activations it needs, or, with `recompute`, only `x` (the layer runs
/// again in the backward).
fn manual_layer(
    layer: &Layer,
    x: &Tensor,
    step: &Step,
    recompute: bool,
    sink: &GradSink,
) -> Result<Tensor> {
    let ctx = Ctx {
        rotation: step.rotation.clone(),
        segments: step.segments.cloned(),
        mask: step.mask.cloned(),
        fused: step.fused,
        train: step.train,
        dropout_seed: lora::dropout_seed(),
    };
    let (y, acts) = layer.forward_saving(x, &ctx)?;
    x.apply_op1(LayerOp {
        layer: layer.clone(),
        ctx,
        output: Mutex::new(Some(y)),
        acts: Mutex::new((!recompute).then_some(acts)),
        sink: sink.clone(),
    })
}

struct LayerOp {
    layer: Layer,
    ctx: Ctx,
    /// The forward's result, handed to the graph once.
    output: Mutex<Option<Tensor>>,
    /// Saved activations; `None` to recompute them.
    acts: Mutex<Option<Acts>>,
    sink: GradSink,
}

impl LayerOp {
    fn take_output(&self) -> Result<Tensor> {
        match self.output.lock().expect("layer op poisoned").take() {
            Some(y) => Ok(y),
            None => candle_core::bail!("a decoder layer node ran twice"),
        }
    }
}

impl CustomOp1 for LayerOp {
    fn name(&self) -> &'static str {
        "decoder-layer"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        crate::layers::ops::cpu_storage_copy(&self.take_output()?)
    }

    fn cuda_fwd(&self, _: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
        crate::layers::ops::cuda_storage_copy(&self.take_output()?)
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let saved = self.acts.lock().expect("layer op poisoned").take();
        let acts = match saved {
            Some(acts) => acts,
            None => {
                let acts = self.layer.activations(x, &self.ctx)?;
                mark(x, "layer recompute")?;
                acts
            }
        };
        let (dx, grads) = self.layer.backward_manual(acts, g, &self.ctx)?;
        for (var, grad) in grads {
            self.sink.add(var.as_tensor(), grad)?;
        }
        Ok(x.track_op().then_some(dx))
    }
}
