//! LoRA: a frozen linear layer plus a trainable low-rank update.
//!
//! Owns [`LoraLinear`], the projection type every decoder layer uses, its
//! frozen base ([`BaseLinear`]) and the LoRA hyper-parameters
//! ([`LoraConfig`]). The update follows Hu et al. 2021, "LoRA: Low-Rank
//! Adaptation of Large Language Models", eq. (3): `h = W x + (alpha / r) B A x`,
//! with `A` Kaiming-uniform and `B` zero at the start, as PEFT does, and
//! dropout on the input of the LoRA path during training only.
//!
//! The factors are `Var`s in a `VarMap` (the only thing an optimizer sees),
//! kept in f32 whatever the model's dtype and cast to it in the forward, so
//! AdamW updates do not round away in bf16. They are named after the HF
//! module, e.g. `model.layers.0.self_attn.q_proj.lora_A.weight`.

use std::sync::Arc;

use candle_core::{DType, Result, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use serde::{Deserialize, Serialize};

use crate::layers::fp8::Fp8Weight;
use crate::layers::init::Rng;
use crate::layers::nf4::Nf4Weight;
use crate::layers::ops::{self, FrozenWeight};

/// A projection LoRA may adapt, named as in HF checkpoints and PEFT configs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetModule {
    QProj,
    KProj,
    VProj,
    OProj,
    GateProj,
    UpProj,
    DownProj,
}

impl TargetModule {
    /// All seven projections of a decoder layer.
    pub const ALL: [TargetModule; 7] = [
        Self::QProj,
        Self::KProj,
        Self::VProj,
        Self::OProj,
        Self::GateProj,
        Self::UpProj,
        Self::DownProj,
    ];

    /// The module's name in checkpoints: `q_proj`, ..., `down_proj`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::QProj => "q_proj",
            Self::KProj => "k_proj",
            Self::VProj => "v_proj",
            Self::OProj => "o_proj",
            Self::GateProj => "gate_proj",
            Self::UpProj => "up_proj",
            Self::DownProj => "down_proj",
        }
    }

    /// Parses a checkpoint module name such as `q_proj`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }
}

/// LoRA hyper-parameters (the fields of PEFT's `LoraConfig` that matter here).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// Rank of the update.
    pub r: usize,
    /// Scale numerator: the update is multiplied by `alpha / r`.
    pub alpha: f64,
    /// Dropout probability on the LoRA path's input during training; default 0.
    #[serde(default)]
    pub dropout: f32,
    /// Projections to adapt.
    pub target_modules: Vec<TargetModule>,
    /// Seed of the `A` initialisation; default 0.
    #[serde(default)]
    pub seed: u64,
}

impl LoraConfig {
    /// `alpha / r`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.r as f64
    }

    /// Whether `module` gets an adapter.
    pub fn targets(&self, module: TargetModule) -> bool {
        self.target_modules.contains(&module)
    }

    /// Every problem with the values, empty when they are usable.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.r == 0 {
            problems.push("`r` must be at least 1".to_owned());
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            problems.push(format!("`alpha` must be positive, got {}", self.alpha));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            problems.push(format!("`dropout` must be in [0, 1), got {}", self.dropout));
        }
        if self.target_modules.is_empty() {
            problems.push("`target_modules` is empty; name at least one projection".to_owned());
        }
        problems
    }
}

/// Where new LoRA factors go while a model is built.
#[derive(Clone, Copy)]
pub struct LoraInit<'a> {
    pub config: &'a LoraConfig,
    pub varmap: &'a VarMap,
}

/// How the frozen projections of a model are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BasePrecision {
    /// As loaded, in the model's dtype (16 bits on a GPU).
    Bf16,
    /// NF4 with double quantisation (QLoRA): 4 bits, dequantised for each
    /// product.
    Nf4,
    /// FP8 (E4M3) with a scale an output channel: 8 bits, the forward
    /// products in FP8.
    Fp8,
}

impl BasePrecision {
    pub const ALL: [Self; 3] = [Self::Bf16, Self::Nf4, Self::Fp8];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::Nf4 => "nf4",
            Self::Fp8 => "fp8",
        }
    }
}

impl std::str::FromStr for BasePrecision {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("`{s}` is not bf16, nf4 or fp8"))
    }
}

/// The frozen weight of a projection: dense as loaded, or held in 4 bits
/// (QLoRA's NF4 with double quantisation) and dequantised into a fresh
/// buffer (from the device's memory pool) each time a forward or backward
/// pass needs it. [`LoraLinear`] sees both the same way.
#[derive(Debug, Clone)]
pub enum BaseLinear {
    /// `weight: (out, in)`, `bias: (out,)`, in the model's dtype.
    Dense {
        weight: Tensor,
        bias: Option<Tensor>,
    },
    /// `weight` in NF4, used as `dtype`; `bias` dense.
    Nf4 {
        weight: Arc<Nf4Weight>,
        dtype: DType,
        bias: Option<Tensor>,
    },
    /// `weight` in FP8 (E4M3, a scale an output channel), multiplied in
    /// FP8 in the forward; `bias` dense.
    Fp8 {
        weight: Arc<Fp8Weight>,
        bias: Option<Tensor>,
    },
}

/// An NF4 weight as the fused ops take it: dequantised on each use.
struct Nf4Dense {
    weight: Arc<Nf4Weight>,
    dtype: DType,
}

impl FrozenWeight for Nf4Dense {
    fn dense(&self) -> Result<Tensor> {
        self.weight.dequantize(self.dtype)
    }
}

/// An FP8 weight as the fused ops take it: its own product forward,
/// dequantised for the input gradient.
struct Fp8Dense(Arc<Fp8Weight>);

impl FrozenWeight for Fp8Dense {
    fn dense(&self) -> Result<Tensor> {
        self.0.dequantize(self.0.dtype())
    }

    fn product(&self, x: &Tensor) -> Result<Option<Tensor>> {
        self.0.product(x).map(Some)
    }
}

impl BaseLinear {
    /// A dense base from its tensors.
    pub fn dense(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self::Dense { weight, bias }
    }

    /// Reads `weight` (and `bias`) of an `in_dim -> out_dim` projection.
    pub fn load(in_dim: usize, out_dim: usize, bias: bool, vb: &VarBuilder) -> Result<Self> {
        let weight = vb.get((out_dim, in_dim), "weight")?;
        let bias = if bias {
            Some(vb.get(out_dim, "bias")?)
        } else {
            None
        };
        Ok(Self::Dense { weight, bias })
    }

    /// The same weight in NF4 (a no-op if it already is).
    pub fn to_nf4(&self) -> Result<Self> {
        match self {
            Self::Dense { weight, bias } => Ok(Self::Nf4 {
                weight: Arc::new(Nf4Weight::quantize(weight)?),
                dtype: weight.dtype(),
                bias: bias.clone(),
            }),
            Self::Nf4 { .. } | Self::Fp8 { .. } => Ok(self.clone()),
        }
    }

    /// The same weight in FP8 (a no-op if it already is; a 4-bit weight
    /// stays 4-bit).
    pub fn to_fp8(&self) -> Result<Self> {
        match self {
            Self::Dense { weight, bias } => Ok(Self::Fp8 {
                weight: Arc::new(Fp8Weight::quantize(weight)?),
                bias: bias.clone(),
            }),
            Self::Nf4 { .. } | Self::Fp8 { .. } => Ok(self.clone()),
        }
    }

    /// `(out, in)`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Self::Dense { weight, .. } => weight.dims2(),
            Self::Nf4 { weight, .. } => Ok(weight.shape()),
            Self::Fp8 { weight, .. } => weight.shape(),
        }
    }

    /// The weight as a dense `(out, in)` tensor in the model's dtype (4-bit
    /// weights dequantised).
    pub fn weight(&self) -> Result<Tensor> {
        match self {
            Self::Dense { weight, .. } => Ok(weight.clone()),
            Self::Nf4 { weight, dtype, .. } => weight.dequantize(*dtype),
            Self::Fp8 { weight, .. } => weight.dequantize(weight.dtype()),
        }
    }

    /// Bytes the frozen weight occupies.
    pub fn storage_bytes(&self) -> usize {
        match self {
            Self::Dense { weight, .. } => weight.elem_count() * weight.dtype().size_in_bytes(),
            Self::Nf4 { weight, .. } => weight.storage_bytes(),
            Self::Fp8 { weight, .. } => weight.storage_bytes(),
        }
    }

    /// The bias, if the projection has one.
    pub fn bias(&self) -> Option<&Tensor> {
        match self {
            Self::Dense { bias, .. } | Self::Nf4 { bias, .. } | Self::Fp8 { bias, .. } => {
                bias.as_ref()
            }
        }
    }

    /// The weight as the fused ops take it.
    fn frozen(&self) -> Arc<dyn FrozenWeight> {
        match self {
            Self::Dense { weight, .. } => Arc::new(weight.clone()),
            Self::Nf4 { weight, dtype, .. } => Arc::new(Nf4Dense {
                weight: Arc::clone(weight),
                dtype: *dtype,
            }),
            Self::Fp8 { weight, .. } => Arc::new(Fp8Dense(Arc::clone(weight))),
        }
    }

    /// `(.., in) -> (.., out)`: `x W^T + bias`, differentiable with respect
    /// to `x` only.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (x2, out_shape) = flatten(x, self.dims()?.0)?;
        if let Self::Fp8 { .. } = self {
            let y = ops::frozen_product(&x2, self.frozen())?;
            return self.finish(y, out_shape);
        }
        let w = self.weight()?;
        let y = if x.track_op() {
            ops::frozen_matmul(&x2, &w)?
        } else {
            x2.matmul(&w.t()?)?
        };
        self.finish(y, out_shape)
    }

    /// Adds the bias to `y: (N, out)` and gives it the shape `out_shape`.
    fn finish(&self, y: Tensor, out_shape: Vec<usize>) -> Result<Tensor> {
        let y = match self.bias() {
            Some(bias) => y.broadcast_add(bias)?,
            None => y,
        };
        y.reshape(out_shape)
    }
}

/// An adapter's `A: (r, in)` and `B: (out, r)` cast to `dtype`, in the
/// graph (gradients reach the f32 factors through the cast) when `track`.
fn factors(ad: &LoraAdapter, dtype: DType, track: bool) -> Result<(Tensor, Tensor)> {
    let (a, b) = if track {
        (ad.a.as_tensor().clone(), ad.b.as_tensor().clone())
    } else {
        (ad.a.as_detached_tensor(), ad.b.as_detached_tensor())
    };
    Ok((a.to_dtype(dtype)?, b.to_dtype(dtype)?))
}

/// `(.., in)` as a contiguous `(N, in)` matrix, and the output shape
/// `(.., out)`.
fn flatten(x: &Tensor, out_dim: usize) -> Result<(Tensor, Vec<usize>)> {
    let in_dim = x.dim(candle_core::D::Minus1)?;
    let mut out_shape = x.dims().to_vec();
    *out_shape.last_mut().expect("x has at least one dim") = out_dim;
    Ok((x.reshape(((), in_dim))?.contiguous()?, out_shape))
}

thread_local! {
    /// The dropout stream of the current training step. Set by the trainer
    /// before each forward pass ([`set_dropout_seed`]); masks are drawn from
    /// it and the layer's name, so a step's masks are the same in a run and
    /// in its resumption, whatever the device (candle's own generator cannot
    /// be seeded). One a thread: ranks trained as threads of one process
    /// (the data-parallel tests) each keep their own.
    static DROPOUT_SEED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Seeds the LoRA dropout masks of this thread's next forward passes.
pub fn set_dropout_seed(seed: u64) {
    DROPOUT_SEED.with(|s| s.set(seed));
}

/// The seed [`set_dropout_seed`] set last on this thread.
pub fn dropout_seed() -> u64 {
    DROPOUT_SEED.with(std::cell::Cell::get)
}

thread_local! {
    /// Off inside [`without_adapters`] on this thread.
    static ADAPTERS_ON: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Whether LoRA updates apply to forward passes on this thread.
pub fn adapters_enabled() -> bool {
    ADAPTERS_ON.with(|c| c.get())
}

/// Runs `f` with every LoRA update switched off on this thread: the
/// projections compute their frozen base alone. RL's reference policy is
/// the model without its adapter (with a fresh adapter on a merged SFT
/// model, exactly the SFT policy), so it needs no second copy of the
/// weights. Thread-local rather than a flag on the model so that a
/// concurrent forward on another thread (a test, a sampler) is unaffected
/// and the model stays shareable by `&`; restored on return and on panic.
pub fn without_adapters<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ADAPTERS_ON.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(ADAPTERS_ON.with(|c| c.replace(false)));
    f()
}

/// LoRA dropout for the input `x`: an inverted-dropout mask, 0 with
/// probability `p`, else `1 / (1 - p)`, drawn from the step's seed and
/// `name`.
///
/// On the CPU the draws come from the host generator, so a run and its
/// resumption see the same masks bit for bit. On CUDA the mask is never
/// stored: [`ops::Dropout::Drawn`] draws it where it is applied from a
/// counter-based stream of the same two values (the same masks run to run,
/// different numbers from the CPU's; the values
/// [`crate::layers::fused::dropout_mask`] would hold), which saves writing it
/// and reading it back at every use; drawing millions of values a layer on
/// the host and copying them over would cost more than the layer itself,
/// and re-seeding candle's generator makes a new cuRAND generator each
/// time. Another accelerator re-seeds its own generator.
fn dropout(x: &Tensor, p: f32, name: &str, seed: u64) -> Result<ops::Dropout> {
    let device = x.device();
    let keep = 1.0 / (1.0 - p);
    if device.is_cuda() {
        let stream = Rng::for_tensor(seed, name).next_u64();
        return Ok(ops::Dropout::Drawn { stream, p });
    }
    if !device.is_cpu() {
        device.set_seed(Rng::for_tensor(seed, name).next_u64())?;
        let u = Tensor::rand(0f32, 1f32, x.shape(), device)?;
        let mask = (u.ge(p as f64)?.to_dtype(DType::F32)? * keep as f64)?.to_dtype(x.dtype())?;
        return Ok(ops::Dropout::Mask(mask));
    }
    let u = Rng::for_tensor(seed, name).uniform(x.elem_count(), 0.0, 1.0);
    let mask: Vec<f32> = u
        .into_iter()
        .map(|u| if u < p { 0.0 } else { keep })
        .collect();
    let mask = Tensor::from_vec(mask, x.shape(), device)?.to_dtype(x.dtype())?;
    Ok(ops::Dropout::Mask(mask))
}

/// The trainable factors of one projection.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    /// `(r, in)`, f32.
    pub a: Var,
    /// `(out, r)`, f32.
    pub b: Var,
    /// `alpha / r`.
    pub scale: f64,
    /// Dropout probability on the input during training.
    pub dropout: f32,
}

/// A projection: a frozen base plus, when targeted, a LoRA update.
#[derive(Debug, Clone)]
pub struct LoraLinear {
    name: String,
    base: BaseLinear,
    adapter: Option<LoraAdapter>,
    /// Several served adapters side by side (`serve` with more than one).
    bank: Option<AdapterBank>,
}

/// Several adapters over one frozen base, served side by side: adapter
/// `k`'s factors are block `k` of `a` (its rows `k r .. (k + 1) r`) and of
/// `b` (those columns), `b` already multiplied by the adapter's scale, so
/// one product serves a batch whose rows take different adapters
/// ([`with_row_adapters`] says which row takes which). An adapter of lower
/// rank, or one that leaves this projection alone, is zeros in its block.
#[derive(Debug, Clone)]
pub struct AdapterBank {
    /// `(count r, in)`, in the model's dtype.
    pub a: Tensor,
    /// `(out, count r)`, scaled.
    pub b: Tensor,
    /// Each adapter's block (the largest rank, rounded up to 8).
    pub rank: usize,
    pub count: usize,
}

thread_local! {
    /// Each batch row's adapter for the forwards inside
    /// [`with_row_adapters`] on this thread, and the mask built from it.
    static ROW_ADAPTERS: std::cell::RefCell<Option<RowAdapters>> =
        const { std::cell::RefCell::new(None) };
}

struct RowAdapters {
    rows: Vec<usize>,
    /// `(rows, count rank)`: 1 over each row's block; built at first use.
    mask: Option<Tensor>,
}

/// Runs `f` with batch row `i` of its forwards taking adapter `rows[i]` of
/// the projections' [`AdapterBank`]s: 0 for the base alone, `k` for the
/// bank's `k`-th adapter. Projections without a bank ignore it.
/// Thread-local, like [`without_adapters`]; restored on return and panic.
pub fn with_row_adapters<R>(rows: &[usize], f: impl FnOnce() -> R) -> R {
    struct Restore(Option<RowAdapters>);
    impl Drop for Restore {
        fn drop(&mut self) {
            ROW_ADAPTERS.with(|c| *c.borrow_mut() = self.0.take());
        }
    }
    let now = RowAdapters {
        rows: rows.to_vec(),
        mask: None,
    };
    let _restore = Restore(ROW_ADAPTERS.with(|c| c.replace(Some(now))));
    f()
}

/// The `(rows, count rank)` mask of the rows' adapters on this thread.
fn row_mask(bank: &AdapterBank, rows: usize, like: &Tensor) -> Result<Tensor> {
    ROW_ADAPTERS.with(|c| {
        let mut chosen = c.borrow_mut();
        let Some(chosen) = chosen.as_mut() else {
            candle_core::bail!(
                "a forward through {} served adapters without each row's adapter (with_row_adapters)",
                bank.count
            );
        };
        if chosen.rows.len() != rows {
            candle_core::bail!(
                "a forward of {rows} rows with {} rows' adapters chosen",
                chosen.rows.len()
            );
        }
        let width = bank.count * bank.rank;
        if let Some(m) = &chosen.mask
            && m.dims() == [rows, width]
            && m.dtype() == like.dtype()
            && m.device().same_device(like.device())
        {
            return Ok(m.clone());
        }
        let mut values = vec![0f32; rows * width];
        for (i, &k) in chosen.rows.iter().enumerate() {
            if k > bank.count {
                candle_core::bail!("row {i} asks for adapter {k} of {}", bank.count);
            }
            if k > 0 {
                let at = i * width + (k - 1) * bank.rank;
                values[at..at + bank.rank].fill(1.0);
            }
        }
        let m = Tensor::from_vec(values, (rows, width), like.device())?.to_dtype(like.dtype())?;
        chosen.mask = Some(m.clone());
        Ok(m)
    })
}

impl LoraLinear {
    /// Loads the projection at `vb`'s prefix (e.g. `model.layers.0.mlp.up_proj`)
    /// and, if `lora` targets `module`, registers fresh factors in its VarMap:
    /// `A` uniform in `±1/sqrt(in)` (PEFT's `kaiming_uniform_(a=sqrt(5))`),
    /// `B` zero.
    pub fn new(
        in_dim: usize,
        out_dim: usize,
        bias: bool,
        module: TargetModule,
        vb: VarBuilder,
        lora: Option<LoraInit>,
    ) -> Result<Self> {
        let name = vb.prefix();
        let base = BaseLinear::load(in_dim, out_dim, bias, &vb)?;
        let adapter = match lora {
            Some(init) if init.config.targets(module) => {
                let cfg = init.config;
                let device = vb.device();
                let a_name = format!("{name}.lora_A.weight");
                let bound = 1.0 / (in_dim as f32).sqrt();
                let values =
                    Rng::for_tensor(cfg.seed, &a_name).uniform(cfg.r * in_dim, -bound, bound);
                let a = Var::from_tensor(&Tensor::from_vec(values, (cfg.r, in_dim), device)?)?;
                let b = Var::zeros((out_dim, cfg.r), DType::F32, device)?;
                let mut vars = init.varmap.data().lock().expect("VarMap lock poisoned");
                vars.insert(a_name, a.clone());
                vars.insert(format!("{name}.lora_B.weight"), b.clone());
                Some(LoraAdapter {
                    a,
                    b,
                    scale: cfg.scale(),
                    dropout: cfg.dropout,
                })
            }
            _ => None,
        };
        Ok(Self {
            name,
            base,
            adapter,
            bank: None,
        })
    }

    /// Assembles a projection from parts (tests, conversions).
    pub fn from_parts(name: String, base: BaseLinear, adapter: Option<LoraAdapter>) -> Self {
        Self {
            name,
            base,
            adapter,
            bank: None,
        }
    }

    /// The HF module path, e.g. `model.layers.0.self_attn.q_proj`.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn base(&self) -> &BaseLinear {
        &self.base
    }

    /// Holds the frozen weight in `precision` from now on (a dense base
    /// only: one already quantised stays as it is).
    pub fn hold_base(&mut self, precision: BasePrecision) -> Result<()> {
        self.base = match precision {
            BasePrecision::Bf16 => return Ok(()),
            BasePrecision::Nf4 => self.base.to_nf4()?,
            BasePrecision::Fp8 => self.base.to_fp8()?,
        };
        Ok(())
    }

    pub fn adapter(&self) -> Option<&LoraAdapter> {
        self.adapter.as_ref()
    }

    /// The served adapters side by side, when there are several.
    pub fn bank(&self) -> Option<&AdapterBank> {
        self.bank.as_ref()
    }

    /// Serves `bank`'s adapters beside the base from now on.
    pub fn set_bank(&mut self, bank: AdapterBank) {
        self.bank = Some(bank);
    }

    /// `(.., in) -> (.., out)`: `x W^T (+ bias) + scale * dropout(x) A^T B^T`,
    /// one node of the graph whose backward gives the input and factor
    /// gradients only ([`ops::lora_matmul`]).
    ///
    /// With `train` false the factors are detached (no graph is built, so
    /// fused inference kernels apply downstream) and dropout is off.
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.project(x, train, train, dropout_seed())
    }

    /// [`Self::forward`] building no graph whatever `x` and the factors
    /// track, with training's dropout when `train`: the forward of a layer
    /// whose backward is written by hand ([`Self::backward`]).
    pub fn forward_detached(&self, x: &Tensor, train: bool, seed: u64) -> Result<Tensor> {
        self.project(&x.detach(), false, train, seed)
    }

    /// The forward both share: the factors `track`ed or detached, dropout
    /// drawn from `seed` when `train`.
    fn project(&self, x: &Tensor, track: bool, train: bool, seed: u64) -> Result<Tensor> {
        if let Some(bank) = self.bank.as_ref().filter(|_| adapters_enabled()) {
            return self.project_bank(x, bank);
        }
        let Some(ad) = self.adapter.as_ref().filter(|_| adapters_enabled()) else {
            return self.base.forward(x);
        };
        let (x2, out_shape) = flatten(x, self.base.dims()?.0)?;
        let (a, b) = factors(ad, x.dtype(), track)?;
        let mask = self.mask(&x2, train, seed)?;
        let y = ops::lora_matmul(&x2, &a, &b, self.base.frozen(), ad.scale, mask)?;
        self.base.finish(y, out_shape)
    }

    /// `x W^T + ((x A^T) * mask) B^T` for `x` `(B, .., in)`: each batch
    /// row through its own adapter of the bank (inference only).
    fn project_bank(&self, x: &Tensor, bank: &AdapterBank) -> Result<Tensor> {
        let y = self.base.forward(x)?;
        let rows = x.dim(0)?;
        let (x2, _) = flatten(x, bank.b.dim(0)?)?;
        let xa = x2.matmul(&bank.a.to_dtype(x.dtype())?.t()?)?; // (N, count r)
        let width = bank.count * bank.rank;
        let mask = row_mask(bank, rows, &xa)?.unsqueeze(1)?;
        let xa = xa
            .reshape((rows, (), width))?
            .broadcast_mul(&mask)?
            .reshape(((), width))?;
        let delta = xa.matmul(&bank.b.to_dtype(x.dtype())?.t()?)?;
        let delta = delta.reshape(y.shape())?;
        y + delta
    }

    /// Gradients for `dL/dy = g` of [`Self::forward_detached`] at `x`
    /// (same dropout seed): `dL/dx`, and `(dA, dB)` in f32 when the
    /// projection has an adapter.
    pub fn backward(
        &self,
        x: &Tensor,
        g: &Tensor,
        train: bool,
        seed: u64,
    ) -> Result<(Tensor, Option<(Tensor, Tensor)>)> {
        let (out, _) = self.base.dims()?;
        let (x2, _) = flatten(&x.detach(), out)?;
        let g2 = g.reshape(((), out))?;
        let Some(ad) = &self.adapter else {
            let dx = g2.contiguous()?.matmul(&self.base.weight()?)?;
            return Ok((dx.reshape(x.shape())?, None));
        };
        let (a, b) = factors(ad, x.dtype(), false)?;
        let mask = self.mask(&x2, train, seed)?;
        let base = self.base.frozen();
        let (dx, da, db) = ops::lora_backward(
            &x2,
            &a,
            &b,
            base.as_ref(),
            ad.scale,
            mask.as_ref(),
            &g2,
            true,
        )?;
        let dx = dx.expect("asked for dx").reshape(x.shape())?;
        Ok((
            dx,
            Some((da.to_dtype(DType::F32)?, db.to_dtype(DType::F32)?)),
        ))
    }

    /// The dropout mask of the LoRA path for the flattened input `x2`, when
    /// training with dropout, drawn from the step's `seed` and the name.
    fn mask(&self, x2: &Tensor, train: bool, seed: u64) -> Result<Option<ops::Dropout>> {
        match &self.adapter {
            Some(ad) if train && ad.dropout > 0.0 => {
                Ok(Some(dropout(x2, ad.dropout, &self.name, seed)?))
            }
            _ => Ok(None),
        }
    }

    /// `scale * B A`, `(out, in)` in f32; `None` without an adapter.
    pub fn delta_weight(&self) -> Result<Option<Tensor>> {
        let Some(ad) = &self.adapter else {
            return Ok(None);
        };
        let ba =
            ad.b.as_detached_tensor()
                .matmul(&ad.a.as_detached_tensor())?; // (out, in)
        Ok(Some((ba * ad.scale)?))
    }

    /// `W + scale * B A` in the base weight's dtype: the weight of an
    /// equivalent plain linear layer.
    pub fn merge(&self) -> Result<Tensor> {
        let w = self.base.weight()?;
        match self.delta_weight()? {
            Some(delta) => (w.to_dtype(DType::F32)? + delta)?.to_dtype(w.dtype()),
            None => Ok(w),
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    fn layer(scale: f64, dropout: f32, b_value: f32) -> LoraLinear {
        let dev = Device::Cpu;
        let (in_dim, out_dim, r) = (6, 5, 2);
        let w = Tensor::arange(0f32, (out_dim * in_dim) as f32, &dev)
            .unwrap()
            .reshape((out_dim, in_dim))
            .unwrap()
            .affine(0.01, -0.1)
            .unwrap();
        let bias = Tensor::full(0.5f32, out_dim, &dev).unwrap();
        let a = Var::from_tensor(
            &Tensor::from_vec(
                Rng::for_tensor(1, "a").uniform(r * in_dim, -0.4, 0.4),
                (r, in_dim),
                &dev,
            )
            .unwrap(),
        )
        .unwrap();
        let b = Var::from_tensor(&Tensor::full(b_value, (out_dim, r), &dev).unwrap()).unwrap();
        LoraLinear::from_parts(
            "p".into(),
            BaseLinear::Dense {
                weight: w,
                bias: Some(bias),
            },
            Some(LoraAdapter {
                a,
                b,
                scale,
                dropout,
            }),
        )
    }

    fn input() -> Tensor {
        let v = Rng::for_tensor(2, "x").uniform(2 * 3 * 6, -1.0, 1.0);
        Tensor::from_vec(v, (2, 3, 6), &Device::Cpu).unwrap()
    }

    use crate::common::max_abs_diff as max_diff;

    #[test]
    fn zero_b_gives_the_base_output() {
        let l = layer(2.0, 0.0, 0.0);
        let x = input();
        let y = l.forward(&x, true).unwrap();
        assert_eq!(y.dims(), &[2, 3, 5]);
        assert_eq!(max_diff(&y, &l.base().forward(&x).unwrap()), 0.0);
    }

    #[test]
    fn forward_matches_the_formula_and_the_merged_weight() {
        let l = layer(2.0, 0.0, 0.3);
        let x = input();
        let ad = l.adapter().unwrap();
        let w = l.base().weight().unwrap();
        let x2 = x.reshape((6, 6)).unwrap();
        let expected = (x2
            .matmul(&w.t().unwrap())
            .unwrap()
            .broadcast_add(&Tensor::full(0.5f32, 5, &Device::Cpu).unwrap())
            .unwrap()
            + (x2
                .matmul(&ad.a.as_tensor().t().unwrap())
                .unwrap()
                .matmul(&ad.b.as_tensor().t().unwrap())
                .unwrap()
                * 2.0)
                .unwrap())
        .unwrap()
        .reshape((2, 3, 5))
        .unwrap();
        let y = l.forward(&x, false).unwrap();
        assert!(max_diff(&y, &expected) < 1e-6);
        let merged = BaseLinear::Dense {
            weight: l.merge().unwrap(),
            bias: Some(Tensor::full(0.5f32, 5, &Device::Cpu).unwrap()),
        };
        assert!(max_diff(&y, &merged.forward(&x).unwrap()) < 1e-5);
    }

    #[test]
    fn without_adapters_computes_the_base_alone_and_restores() {
        let l = layer(2.0, 0.0, 0.3);
        let x = input();
        let with = l.forward(&x, false).unwrap();
        let base = l.base().forward(&x).unwrap();
        assert!(max_diff(&with, &base) > 1e-3);
        let off = without_adapters(|| l.forward(&x, false).unwrap());
        assert_eq!(max_diff(&off, &base), 0.0);
        assert!(adapters_enabled());
        assert_eq!(max_diff(&l.forward(&x, false).unwrap(), &with), 0.0);
    }

    #[test]
    fn dropout_applies_in_training_only() {
        let l = layer(1.0, 0.5, 1.0);
        let x = input();
        let eval1 = l.forward(&x, false).unwrap();
        let eval2 = l.forward(&x, false).unwrap();
        assert_eq!(max_diff(&eval1, &eval2), 0.0);
        let train = l.forward(&x, true).unwrap();
        assert!(max_diff(&train, &eval1) > 1e-3);
    }

    #[test]
    fn an_fp8_base_multiplies_in_fp8_and_differentiates_through_its_dequantised_weight() {
        let mut l = layer(1.0, 0.0, 0.3);
        let dense = l.forward(&input(), false).unwrap();
        l.hold_base(BasePrecision::Fp8).unwrap();
        assert!(matches!(l.base(), BaseLinear::Fp8 { .. }));
        let x = input();
        let x2 = x.reshape((6, 6)).unwrap();
        // The base: x quantised a row at a time against the codes; the
        // adapter's path exact.
        let xq = crate::layers::fp8::Fp8Rows::quantize(&x2)
            .unwrap()
            .dequantize(DType::F32)
            .unwrap();
        let wq = l.base().weight().unwrap();
        let ad = l.adapter().unwrap();
        let (a, b) = (ad.a.as_tensor(), ad.b.as_tensor());
        let delta = x2
            .matmul(&a.t().unwrap())
            .unwrap()
            .matmul(&b.t().unwrap())
            .unwrap();
        let want = (xq.matmul(&wq.t().unwrap()).unwrap() + delta)
            .unwrap()
            .broadcast_add(l.base().bias().unwrap())
            .unwrap();
        for train in [false, true] {
            let y = l.forward(&x, train).unwrap().reshape((6, 5)).unwrap();
            assert!(max_diff(&y, &want) < 1e-5, "train {train}");
        }
        let moved = max_diff(&l.forward(&x, false).unwrap(), &dense);
        assert!(
            moved > 1e-4 && moved < 0.05,
            "fp8 moved the output by {moved}"
        );
        // The hand-written backward: dx through the dequantised weight and
        // the adapter, g (Wq + B A).
        let g = Tensor::ones((2, 3, 5), DType::F32, &Device::Cpu).unwrap();
        let (dx, factors) = l.backward(&x, &g, true, 0).unwrap();
        assert!(factors.is_some());
        let merged = (&wq + b.matmul(a).unwrap()).unwrap();
        let want_dx = g.reshape((6, 5)).unwrap().matmul(&merged).unwrap();
        assert!(max_diff(&dx.reshape((6, 6)).unwrap(), &want_dx) < 1e-5);
        // Without an adapter, autograd reaches x the same way.
        let base = l.base().clone();
        let xv = Var::from_tensor(&x2).unwrap();
        let y = base.forward(xv.as_tensor()).unwrap();
        let grads = y.sum_all().unwrap().backward().unwrap();
        let want_dx = Tensor::ones((6, 5), DType::F32, &Device::Cpu)
            .unwrap()
            .matmul(&wq)
            .unwrap();
        assert!(max_diff(grads.get(xv.as_tensor()).unwrap(), &want_dx) < 1e-5);
    }

    #[test]
    fn gradients_reach_the_factors_only() {
        let l = layer(1.0, 0.0, 0.1);
        let loss = l
            .forward(&input(), true)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        let grads = loss.backward().unwrap();
        let ad = l.adapter().unwrap();
        assert!(grads.get(ad.a.as_tensor()).is_some());
        assert!(grads.get(ad.b.as_tensor()).is_some());
        // Eval mode builds no graph at all.
        let loss = l.forward(&input(), false).unwrap().sum_all().unwrap();
        assert!(!loss.track_op());
    }

    #[test]
    fn new_registers_peft_initialised_factors_for_targets_only() {
        let dev = Device::Cpu;
        let mut ts = std::collections::HashMap::new();
        ts.insert(
            "m.q_proj.weight".to_owned(),
            Tensor::ones((8, 16), DType::F32, &dev).unwrap(),
        );
        ts.insert(
            "m.v_proj.weight".to_owned(),
            Tensor::ones((8, 16), DType::F32, &dev).unwrap(),
        );
        let vb = VarBuilder::from_tensors(ts, DType::F32, &dev);
        let varmap = VarMap::new();
        let cfg = LoraConfig {
            r: 4,
            alpha: 8.0,
            dropout: 0.0,
            target_modules: vec![TargetModule::QProj],
            seed: 3,
        };
        let init = LoraInit {
            config: &cfg,
            varmap: &varmap,
        };
        let q = LoraLinear::new(
            16,
            8,
            false,
            TargetModule::QProj,
            vb.pp("m.q_proj"),
            Some(init),
        )
        .unwrap();
        let v = LoraLinear::new(
            16,
            8,
            false,
            TargetModule::VProj,
            vb.pp("m.v_proj"),
            Some(init),
        )
        .unwrap();
        assert!(v.adapter().is_none());
        let ad = q.adapter().unwrap();
        assert_eq!(ad.scale, 2.0);
        assert_eq!(ad.a.dims(), &[4, 16]);
        assert_eq!(ad.b.dims(), &[8, 4]);
        let a_max: f32 =
            ad.a.as_tensor()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar()
                .unwrap();
        assert!(
            a_max > 0.0 && a_max <= 0.25,
            "A within ±1/sqrt(16): {a_max}"
        );
        let mut names: Vec<_> = varmap.data().lock().unwrap().keys().cloned().collect();
        names.sort();
        assert_eq!(names, ["m.q_proj.lora_A.weight", "m.q_proj.lora_B.weight"]);
    }

    #[test]
    fn config_problems_are_gathered() {
        let cfg = LoraConfig {
            r: 0,
            alpha: -1.0,
            dropout: 1.0,
            target_modules: vec![],
            seed: 0,
        };
        assert_eq!(cfg.problems().len(), 4);
        let json = r#"{"r": 8, "alpha": 16, "target_modules": ["q_proj", "down_proj"]}"#;
        let cfg: LoraConfig = serde_json::from_str(json).unwrap();
        assert!(cfg.problems().is_empty());
        assert_eq!(cfg.scale(), 2.0);
        assert!(
            serde_json::from_str::<LoraConfig>(
                r#"{"r": 8, "alpha": 16, "target_modules": ["lm_head"]}"#
            )
            .is_err()
        );
    }
}
