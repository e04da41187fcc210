//! The fused decode step on CUDA: one new token for every row of a batch,
//! launched as one CUDA graph a step.
//!
//! Why not the op-by-op path: a Qwen3-4B decode step at batch 32 ran about
//! 900 kernels through candle, 12 ms a step where reading the weights and
//! the KV cache takes about 3 ms; the host's cost of each launch, not the
//! GPU, set the pace. Here a step is a fixed sequence of kernels on fixed
//! buffers: per layer an add + RMSNorm, one GEMM for q, k and v, one kernel
//! for the per-head norms, RoPE and the cache write, split-KV attention and
//! its merge, the o GEMM, add + RMSNorm, one GEMM for gate and up, SiLU-mul,
//! the down GEMM; then the head and the sampling kernel. The attention is
//! [`AttentionKernel::Mma`] (tensor cores) on bf16 models where the shape
//! allows, else [`AttentionKernel::Warp`]; `TRACE_TRAIN_DECODE_ATTENTION`
//! picks one by name. What changes from
//! step to step (each row's token, position and random seed) is read from
//! one small device buffer written before the step, so the step can be
//! captured once ([`Mode::Graph`]) and replayed: the host then launches one
//! graph a step instead of hundreds of kernels.
//!
//! Each row owns a slot of the KV cache (`(rows, H_kv, cap, D)` a layer,
//! its token `t` in column `t`), so rows of any lengths decode together
//! with no padding, and a finished row's slot takes a new prompt (prefilled
//! by the model's ordinary forward, then copied in with
//! [`Engine::load_rows`]) without moving the others. The weights are
//! [`DecodeWeights`]: one dense copy a generation, LoRA folded in and NF4
//! dequantised once, so 4-bit models decode at the bf16 rate; or the bases
//! read in place by the decode kernel (`skinny.cu`: bf16, NF4 or FP8
//! codes), LoRA beside them, where the copy does not fit.
//!
//! The graph's inputs and outputs live at addresses fixed at capture: the
//! io buffer, the caches, the split-KV scratch and the sampled ids (an
//! allocation made inside the graph, which `AUTO_FREE_ON_LAUNCH` hands
//! back and makes again, at the same address, at every launch).

use std::sync::Arc;

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{
    CudaGraph, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg, sys,
};
use candle_core::{CudaDevice, DType, Device, Result, Tensor, bail};

use crate::cuda::kernels::{self, DECODE, Kernel, Module, SAMPLE, SKINNY, ptr, uninit};
use crate::decode::draw;
pub use crate::decode::draw::Draw;
use crate::decode::lt_products::{self, LtProducts};
use crate::layers::attention::Cache;
use crate::layers::decoder::{DecodeBase, DecodeProj, DecodeWeights};

/// Weight rows one block of the decode product owns (`SK_TILE` in skinny.cu).
const SKINNY_TILE: usize = 128;
/// Threads of a block of the decode product (`SK_THREADS`).
const SKINNY_THREADS: u32 = 128;
/// Rows of X one launch of the decode product takes.
const SKINNY_ROWS: usize = 32;
/// Keys one attention block reads at least (`decode_attention_keys` in
/// decode.cu: its 4 warps take 32 keys each at a time).
const CHUNK: usize = 128;
/// Keys one block of the tensor-core attention (`decode_attention_mma`)
/// reads at least where the rows' KV heads alone give every multiprocessor
/// a block ([`AttentionPlan::new`]; else [`CHUNK`]): on an H200 at batch
/// 32 (Qwen3-4B), attention + combine took 20.1 us at 266 keys and 30.5 at
/// 511 against 22.5 and 32.6 with 128-key chunks.
const MMA_CHUNK: usize = 256;
/// Most splits of a row's keys (blocks a row and KV head).
const MAX_SPLITS: usize = 16;
/// Threads of an attention block (`32 * ATTN_WARPS`).
const ATTN_THREADS: u32 = 128;

/// How the step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Kernel by kernel from the host, every step.
    Eager,
    /// Captured once as a CUDA graph (after one eager step that loads every
    /// kernel), replayed every later step.
    Graph,
}

/// A captured step. The graph is declared first so that it is destroyed
/// before its output is freed.
struct Captured {
    graph: CudaGraph,
    out: CudaSlice<u32>,
}

/// Per-kernel times of eager steps: the last mark, and each name's total
/// seconds.
type Profile = std::cell::RefCell<(std::time::Instant, Vec<(&'static str, f64)>)>;

/// The fused decode step over `rows` cache slots of `cap` columns.
pub struct Engine<'w> {
    w: &'w DecodeWeights,
    dev: CudaDevice,
    stream: Arc<CudaStream>,
    dtype: DType,
    suffix: &'static str,
    rows: usize,
    cap: usize,
    attention: AttentionPlan,
    /// Per layer, `(rows, H_kv, cap, D)`.
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// `[seed (two words a row) | token id a row | position a row |
    /// the sampling settings, three words a row (`Draw::words`)]`.
    io: CudaSlice<u32>,
    /// Split-KV partial results: `(rows, H_kv, splits, G, D + 2)` f32.
    part: CudaSlice<f32>,
    /// The draw's slices a row, and their results (`draw::slices`).
    draw_slices: usize,
    draw_part: CudaSlice<f32>,
    products: Products,
    mode: Mode,
    graph: Option<Captured>,
    steps: u64,
    /// `TRACE_TRAIN_DECODE_PROFILE` set: eager steps synchronise after each
    /// kernel and add its time (launch included) to its name's total.
    profile: Option<Profile>,
    /// `TRACE_TRAIN_DECODE_NCU_STEP=N`: only step N runs inside the
    /// profiler's range (`ncu --profile-from-start off`), so a profile
    /// holds one step's kernels, graph nodes included, and no prefill.
    ncu_step: Option<u64>,
}

/// Bytes the cache slots of `rows` rows of `cap` columns take.
pub fn cache_bytes(w: &DecodeWeights, rows: usize, cap: usize) -> usize {
    2 * w.layers.len() * rows * w.kv_heads * cap * w.head_dim * w.embed.dtype().size_in_bytes()
}

/// Bytes this process can still allocate on `device` (`None` off CUDA):
/// the driver's free memory plus what the memory pool holds reserved but
/// unused (`gpu::free_memory`). After a training pass the pool keeps its
/// blocks, so the driver's figure alone would see a full card as nearly
/// full and send decoding to a slower path.
pub fn free_memory(device: &Device) -> Result<Option<usize>> {
    trace_train_base::gpu::free_memory(device)
        .map(|f| f.map(|b| b as usize))
        .map_err(|e| candle_core::Error::Msg(format!("{e:#}")))
}

/// The split-KV attention kernel of the decode step. Both write the same
/// partial results, which `attention_combine` merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// `decode_attention_mma_*` (decode.cu): `S = Q K^T` and `O += P V` on
    /// tensor cores (mma.sync, f32 sums), P rounded to bf16; bf16 models
    /// only ([`AttentionPlan::new`] says which shapes). The default.
    Mma,
    /// `decode_attention_*`: one key a lane, everything in f32; every dtype.
    Warp,
}

thread_local! {
    static ATTENTION: std::cell::Cell<Option<AttentionKernel>> = const { std::cell::Cell::new(None) };
    static LAST_ATTENTION: std::cell::Cell<Option<AttentionKernel>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the engines made on this thread asking for `kernel`,
/// whatever `TRACE_TRAIN_DECODE_ATTENTION` says (tests compare the
/// kernels in one process).
pub fn with_attention_kernel<R>(kernel: AttentionKernel, f: impl FnOnce() -> R) -> R {
    let old = ATTENTION.with(|k| k.replace(Some(kernel)));
    let out = f();
    ATTENTION.with(|k| k.set(old));
    out
}

/// The attention kernel of the last engine made on this thread (the one
/// that runs, after any fallback).
pub fn last_attention_kernel() -> Option<AttentionKernel> {
    LAST_ATTENTION.with(|k| k.get())
}

impl AttentionKernel {
    /// Its name in `TRACE_TRAIN_DECODE_ATTENTION`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mma => "mma",
            Self::Warp => "warp",
        }
    }

    /// The kernel asked for: [`with_attention_kernel`]'s on this thread,
    /// else `TRACE_TRAIN_DECODE_ATTENTION`'s.
    pub fn wanted() -> Result<Self> {
        match ATTENTION.with(|k| k.get()) {
            Some(k) => Ok(k),
            None => Self::parse(
                std::env::var("TRACE_TRAIN_DECODE_ATTENTION")
                    .ok()
                    .as_deref(),
            ),
        }
    }

    /// `TRACE_TRAIN_DECODE_ATTENTION`'s value: `mma` (also when unset) or
    /// `warp`; anything else is an error.
    fn parse(value: Option<&str>) -> Result<Self> {
        match value {
            Some("mma") | None => Ok(Self::Mma),
            Some("warp") => Ok(Self::Warp),
            Some(other) => bail!("TRACE_TRAIN_DECODE_ATTENTION={other}\nhint: mma or warp"),
        }
    }
}

/// How an engine's attention runs: the kernel, the keys a block reads at
/// least, and the splits of a row (blocks a row and KV head).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionPlan {
    /// The kernel that runs: the one asked for where it serves the model.
    pub kernel: AttentionKernel,
    /// Keys a block reads at least (a multiple of 64; longer rows lengthen
    /// their chunks, see `split_keys` in decode.cu).
    pub chunk: usize,
    /// Splits of a row's keys (blocks a row and KV head).
    pub splits: usize,
    groups: usize,
    head_dim: usize,
    suffix: &'static str,
}

/// The device addresses one attention launch reads and writes: queries
/// `(rows, H_q, D)`, a layer's caches `(rows, H_kv, cap, D)`, each row's
/// position (u32; row `b` attends to columns `0..=pos[b]`), the split-KV
/// partial results ([`AttentionPlan::part_len`] f32) and the output
/// `(rows, H_q, D)`, all of the model's dtype but `pos` and `part`.
struct AttentionArgs {
    q: u64,
    k: u64,
    v: u64,
    pos: u64,
    part: u64,
    out: u64,
}

impl AttentionPlan {
    /// The plan for `rows` rows of `cap` columns of a model of `dtype` with
    /// `(query heads, KV heads, head dim)`: `wanted` where it serves the
    /// model, else the warp kernel. The tensor-core kernel takes bf16 only
    /// (its products are bf16 mma.sync), head sizes of 32, 64 or 128 (the
    /// sizes both kernels are built for; a multiple of the mma's 16), at
    /// most 8 query heads a KV head (it puts them in the first 8 rows of
    /// the mma's 16-row operand) and a GPU that gives a block its shared
    /// memory (68 KiB at head dim 128); other models, f32 and f16 among
    /// them, fall back to the warp kernel. Its chunk is [`MMA_CHUNK`] where
    /// the rows' KV heads alone give every multiprocessor a block, else
    /// [`CHUNK`] (more, shorter splits for few rows), so its split bounds,
    /// and with them the last bits of a row's attention, depend on the rows
    /// of the engine.
    pub fn new(
        dev: &CudaDevice,
        dtype: DType,
        (heads, kv_heads, head_dim): (usize, usize, usize),
        rows: usize,
        cap: usize,
        wanted: AttentionKernel,
    ) -> Result<Self> {
        let suffix = match dtype {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            other => bail!("the decode attention takes bf16, f16 or f32, not {other:?}"),
        };
        if kv_heads == 0 || heads % kv_heads != 0 {
            bail!("the decode attention: {heads} query heads over {kv_heads} KV heads");
        }
        let groups = heads / kv_heads;
        let mma = wanted == AttentionKernel::Mma
            && dtype == DType::BF16
            && [32, 64, 128].contains(&head_dim)
            && (1..=8).contains(&groups)
            && mma_shared_bytes(head_dim) <= kernels::shared_memory_optin(dev)?;
        let plan = if mma {
            let chunk = if rows * kv_heads >= kernels::multiprocessors(dev)? {
                MMA_CHUNK
            } else {
                CHUNK
            };
            Self::with(AttentionKernel::Mma, chunk, cap, groups, head_dim, suffix)
        } else {
            if wanted == AttentionKernel::Mma {
                tracing::debug!(
                    "decode: the warp attention kernel ({dtype:?}, head dim {head_dim}, \
                     {groups} query heads a KV head: not the tensor-core kernel's)"
                );
            }
            Self::with(AttentionKernel::Warp, CHUNK, cap, groups, head_dim, suffix)
        };
        Ok(plan)
    }

    /// `kernel` with chunks of `chunk` keys over slots of `cap` columns:
    /// one split a chunk of the slot, up to MAX_SPLITS (longer rows
    /// lengthen their chunks instead: a slot of 4,096 columns at 64 rows
    /// would launch 32,768 blocks a layer, most of them idle for rows far
    /// shorter than the slot).
    fn with(
        kernel: AttentionKernel,
        chunk: usize,
        cap: usize,
        groups: usize,
        head_dim: usize,
        suffix: &'static str,
    ) -> Self {
        Self {
            kernel,
            chunk,
            splits: cap.div_ceil(chunk).clamp(1, MAX_SPLITS),
            groups,
            head_dim,
            suffix,
        }
    }

    /// f32 values of the split-KV partial results of `rows` rows:
    /// `(rows, H_kv, splits, G, D + 2)`.
    pub fn part_len(&self, rows: usize, kv_heads: usize) -> usize {
        rows * kv_heads * self.splits * self.groups * (self.head_dim + 2)
    }

    /// The plan's two kernels, loaded (the attention allowed its shared
    /// memory).
    fn load(&self, dev: &CudaDevice) -> Result<AttentionLaunch<'_>> {
        let (d, groups, suffix) = (self.head_dim, self.groups, self.suffix);
        let attend = match self.kernel {
            AttentionKernel::Mma => {
                let f = kernels::kernel(
                    dev,
                    &DECODE,
                    &format!("decode_attention_mma_{suffix}_d{d}_g{groups}"),
                )?;
                f.allow_dynamic_shared(mma_shared_bytes(d) as u32)?;
                f
            }
            AttentionKernel::Warp => kernels::kernel(
                dev,
                &DECODE,
                &format!("decode_attention_{suffix}_d{d}_g{groups}"),
            )?,
        };
        let combine = kernels::kernel(dev, &DECODE, &format!("attention_combine_{suffix}"))?;
        Ok(AttentionLaunch {
            plan: self,
            attend,
            combine,
        })
    }
}

/// An [`AttentionPlan`]'s kernels, loaded for a step's launches.
struct AttentionLaunch<'p> {
    plan: &'p AttentionPlan,
    attend: Kernel,
    combine: Kernel,
}

impl AttentionLaunch<'_> {
    /// Launches the attention of one token a row over `a`'s addresses and
    /// the merge of its splits into `a.out`; calls `mark` after each
    /// kernel (the step's profile).
    ///
    /// # Safety
    ///
    /// `a`'s addresses hold what [`AttentionArgs`] says for `rows` rows,
    /// `kv_heads` KV heads and slots of `cap` columns, every position below
    /// `cap`, and `a.part` at least [`AttentionPlan::part_len`] values.
    unsafe fn launch(
        &self,
        a: &AttentionArgs,
        rows: usize,
        kv_heads: usize,
        cap: usize,
        mark: &dyn Fn(&'static str) -> Result<()>,
    ) -> Result<()> {
        let p = self.plan;
        let d = p.head_dim;
        let shared = match p.kernel {
            AttentionKernel::Mma => mma_shared_bytes(d) as u32,
            AttentionKernel::Warp => 0,
        };
        let (hkv32, cap32, chunk32) = (kv_heads as i32, cap as i32, p.chunk as i32);
        let scale = 1.0f32 / (d as f32).sqrt();
        let mut b = self.attend.builder();
        b.arg(&a.q);
        b.arg(&a.k);
        b.arg(&a.v);
        b.arg(&a.pos);
        b.arg(&a.part);
        b.arg(&hkv32);
        b.arg(&cap32);
        b.arg(&chunk32);
        b.arg(&scale);
        let config = LaunchConfig {
            grid_dim: (kv_heads as u32, rows as u32, p.splits as u32),
            block_dim: (ATTN_THREADS, 1, 1),
            shared_mem_bytes: shared,
        };
        // SAFETY: matches `decode_attention_*` and `decode_attention_mma_*`
        // (the caller vouches for the addresses); `part` holds every (row,
        // head, split, group).
        unsafe { b.launch(config) }.w()?;
        mark("attention")?;
        let (g32, s32) = (p.groups as i32, p.splits as i32);
        let mut b = self.combine.builder();
        b.arg(&a.part);
        b.arg(&a.out);
        b.arg(&hkv32);
        b.arg(&g32);
        b.arg(&s32);
        let grid = ((kv_heads * p.groups) as u32, rows as u32, 1);
        // SAFETY: matches `attention_combine_*`: `part` as written above,
        // `out` rows x H_q x D.
        unsafe { b.launch(cfg(grid, d as u32)) }.w()?;
        mark("combine")
    }
}

/// Dynamic shared memory of a `decode_attention_mma` block
/// (`decode_attention_mma_smem` in decode.cu): its 4 warps' tiles of 32
/// keys and values, rows padded to `2 D + 16` bytes.
fn mma_shared_bytes(head_dim: usize) -> usize {
    (ATTN_THREADS as usize / 32) * 2 * 32 * (2 * head_dim + 16)
}

impl Drop for Engine<'_> {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            let p = p.borrow();
            let total: f64 = p.1.iter().map(|x| x.1).sum();
            let lines: Vec<String> =
                p.1.iter()
                    .map(|(n, t)| {
                        format!(
                            "{n} {:.2} ms/step ({:.0}%)",
                            1e3 * t / self.steps.max(1) as f64,
                            100.0 * t / total.max(1e-12)
                        )
                    })
                    .collect();
            eprintln!(
                "decode profile over {} steps: {}",
                self.steps,
                lines.join(", ")
            );
        }
    }
}

impl<'w> Engine<'w> {
    /// Slots for `rows` rows of up to `cap` tokens each (prompt and answer).
    pub fn new(
        w: &'w DecodeWeights,
        device: &Device,
        rows: usize,
        cap: usize,
        mode: Mode,
    ) -> Result<Self> {
        let Device::Cuda(dev) = device else {
            bail!("the fused decode step runs on CUDA only");
        };
        let dtype = w.embed.dtype();
        let suffix = match dtype {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            other => bail!("the fused decode step takes bf16, f16 or f32 weights, not {other:?}"),
        };
        let max_positions = w.cos.dim(0)?;
        if cap > max_positions {
            bail!("{cap} positions a row, but the model has RoPE tables for {max_positions}");
        }
        let mut mode = mode;
        if mode == Mode::Graph
            && dev
                .cuda_stream()
                .context()
                .is_managing_stream_synchronization()
        {
            // Several streams with event tracking: the events recorded at
            // every tensor use cannot be captured.
            tracing::warn!("decode: CUDA events track tensor uses; decoding without a graph");
            mode = Mode::Eager;
        }
        let shape = (rows, w.kv_heads, cap, w.head_dim);
        let zeros = || Tensor::zeros(shape, dtype, device);
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for _ in &w.layers {
            k.push(zeros()?);
            v.push(zeros()?);
        }
        let attention = AttentionPlan::new(
            dev,
            dtype,
            (w.heads, w.kv_heads, w.head_dim),
            rows,
            cap,
            AttentionKernel::wanted()?,
        )?;
        LAST_ATTENTION.with(|k| k.set(Some(attention.kernel)));
        let io = dev.alloc_zeros::<u32>(7 * rows)?;
        let part = dev.alloc_zeros::<f32>(attention.part_len(rows, w.kv_heads))?;
        let all: Vec<&DecodeProj> = w
            .layers
            .iter()
            .flat_map(|l| [&l.qkv, &l.o, &l.gate_up, &l.down])
            .chain([&w.head])
            .collect();
        let products = Products::new(dev, dtype, &all, rows)?;
        let vocab = w.head.dims()?.0;
        let draw_slices = draw::slices(rows, vocab, kernels::multiprocessors(dev)?);
        let draw_part = dev.alloc_zeros::<f32>(4 * rows * draw_slices)?;
        Ok(Self {
            w,
            stream: dev.cuda_stream(),
            dev: dev.clone(),
            dtype,
            suffix,
            rows,
            cap,
            attention,
            k,
            v,
            io,
            part,
            draw_slices,
            draw_part,
            products,
            mode,
            graph: None,
            steps: 0,
            profile: std::env::var_os("TRACE_TRAIN_DECODE_PROFILE")
                .map(|_| std::cell::RefCell::new((std::time::Instant::now(), Vec::new()))),
            ncu_step: std::env::var("TRACE_TRAIN_DECODE_NCU_STEP")
                .ok()
                .and_then(|s| s.parse().ok()),
        })
    }

    /// Whether rows pick among several adapters ([`Self::set_row_adapters`]).
    pub fn row_adapters(&self) -> bool {
        self.products.row_mask.is_some()
    }

    /// Row `r` decodes through adapter `adapters[r]` (0: the base alone)
    /// from the next step on.
    pub fn set_row_adapters(&mut self, adapters: &[usize]) -> Result<()> {
        self.products.set_row_adapters(adapters)
    }

    /// The mode steps run in now (a failed capture falls back to eager).
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether later steps replay a captured graph.
    pub fn captured(&self) -> bool {
        self.graph.is_some()
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns a slot holds.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// How the step's attention runs.
    pub fn attention(&self) -> &AttentionPlan {
        &self.attention
    }

    /// Copies prefilled prompts into slots: row `r` of `cache` (left-padded
    /// by `pads[r]` columns) holds a prompt of `lens[r]` tokens, which goes
    /// to columns `0..lens[r]` of slot `slots[r]`.
    pub fn load_rows(
        &mut self,
        cache: &Cache,
        slots: &[usize],
        pads: &[usize],
        lens: &[usize],
    ) -> Result<()> {
        let n = slots.len();
        if pads.len() != n || lens.len() != n || n == 0 {
            bail!(
                "load_rows: {n} slots, {} pads, {} lengths",
                pads.len(),
                lens.len()
            );
        }
        if let Some(&r) = slots.iter().find(|&&r| r >= self.rows) {
            bail!("load_rows: slot {r} of {}", self.rows);
        }
        if let Some(&l) = lens.iter().find(|&&l| l > self.cap) {
            bail!("load_rows: a prompt of {l} tokens in slots of {}", self.cap);
        }
        let meta: Vec<u32> = slots
            .iter()
            .chain(pads)
            .chain(lens)
            .map(|&x| x as u32)
            .collect();
        let meta = self.stream.clone_htod(&meta).w()?;
        let base = slice_ptr(&meta, &self.stream);
        let func = self.kernel(&DECODE, "copy_to_slots")?;
        for layer in 0..self.w.layers.len() {
            let Some((ks, vs)) = cache.layer(layer) else {
                bail!("load_rows: the prefill cache has no layer {layer}");
            };
            let (rn, hkv, src_cap, d) = ks.dims4()?;
            if rn != n || hkv != self.w.kv_heads || d != self.w.head_dim {
                bail!("load_rows: prefill cache {:?} for {n} rows", ks.dims());
            }
            for (src, dst) in [(ks, &self.k[layer]), (vs, &self.v[layer])] {
                let (sp, dp) = (ptr(src)?, ptr(dst)?);
                let (rows, pads, lens) = (base, base + 4 * n as u64, base + 8 * n as u64);
                let (hkv, src_cap, cap, d) =
                    (hkv as i32, src_cap as i32, self.cap as i32, d as i32);
                let mut b = func.builder();
                b.arg(&sp);
                b.arg(&dp);
                b.arg(&rows);
                b.arg(&pads);
                b.arg(&lens);
                b.arg(&hkv);
                b.arg(&src_cap);
                b.arg(&cap);
                b.arg(&d);
                // SAFETY: the arguments match `copy_to_slots_*`; every
                // source row holds pads + lens columns, every slot cap.
                unsafe { b.launch(cfg((hkv as u32, n as u32, 1), 256)) }.w()?;
            }
        }
        // `meta` is freed in stream order, after the copies.
        Ok(())
    }

    /// One step: row `r` feeds token `ids[r]` at position `pos[r]` (its
    /// K/V go to column `pos[r]` of its slot; it attends to columns
    /// `0..=pos[r]`) and draws with `seeds[r]` by `draws[r]`. Returns each
    /// row's token and its log-probability. Free rows decode too (their
    /// slot is theirs to spoil); callers ignore them.
    pub fn step(
        &mut self,
        seeds: &[u64],
        ids: &[u32],
        pos: &[u32],
        draws: &[Draw],
    ) -> Result<Vec<(u32, f32)>> {
        let b = self.rows;
        if seeds.len() != b || ids.len() != b || pos.len() != b || draws.len() != b {
            bail!(
                "decode step: {b} rows but {} seeds, {} ids, {} positions, {} settings",
                seeds.len(),
                ids.len(),
                pos.len(),
                draws.len()
            );
        }
        if let Some(&p) = pos.iter().find(|&&p| p as usize >= self.cap) {
            bail!(
                "decode step: position {p} beyond the slots' {} columns",
                self.cap
            );
        }
        let mut host = Vec::with_capacity(7 * b);
        for &s in seeds {
            host.push(s as u32);
            host.push((s >> 32) as u32);
        }
        host.extend_from_slice(ids);
        host.extend_from_slice(pos);
        host.extend(Draw::words(draws));
        self.stream.memcpy_htod(&host, &mut self.io).w()?;
        let first = self.steps == 0;
        self.steps += 1;
        if self.mode == Mode::Graph && !first && self.graph.is_none() && self.profile.is_none() {
            self.capture()?;
        }
        let _range = if self.ncu_step == Some(self.steps) {
            Some(candle_core::cuda_backend::cudarc::driver::Profiler::new().w()?)
        } else {
            None
        };
        let out = match &self.graph {
            Some(c) => {
                c.graph.launch().w()?;
                self.stream.clone_dtoh(&c.out).w()?
            }
            None => {
                let out = self.launch_step()?;
                self.stream.clone_dtoh(&out).w()?
            }
        };
        Ok(out
            .chunks_exact(2)
            .map(|p| (p[0], f32::from_bits(p[1])))
            .collect())
    }

    /// Captures [`Self::launch_step`] as a graph; on failure (a driver
    /// that refuses the capture), says so once and stays eager.
    fn capture(&mut self) -> Result<()> {
        let stream = Arc::clone(&self.stream);
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .w()?;
        let out = self.launch_step();
        let graph = stream.end_capture(
            sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
        );
        match (out, graph) {
            (Ok(out), Ok(Some(graph))) => {
                graph.upload().w()?;
                self.graph = Some(Captured { graph, out });
            }
            (out, graph) => {
                let why = match (&out, &graph) {
                    (Err(e), _) => e.to_string(),
                    (_, Err(e)) => e.to_string(),
                    _ => "the driver returned no graph".to_owned(),
                };
                tracing::warn!(
                    "decode: CUDA graph capture failed ({why}); decoding without a graph"
                );
                self.mode = Mode::Eager;
            }
        }
        Ok(())
    }

    /// Launches one step's kernels; returns the `(token, log-prob bits)`
    /// pairs' buffer.
    fn launch_step(&self) -> Result<CudaSlice<u32>> {
        self.mark("between_steps")?;
        let w = self.w;
        let b = self.rows;
        let (hq, hkv, d) = (w.heads, w.kv_heads, w.head_dim);
        let elt = self.dtype.size_in_bytes() as u64;
        let io = slice_ptr(&self.io, &self.stream);
        let (seeds, ids, pos) = (io, io + 8 * b as u64, io + 12 * b as u64);
        let params = io + 16 * b as u64;
        let (hidden, inter) = (w.hidden, w.intermediate);
        let eps = w.eps as f32;

        let x = self.empty(b, hidden)?;
        {
            let f = self.kernel(&DECODE, "embed_rows")?;
            let (e, xp, h) = (ptr(&w.embed)?, ptr(&x)?, hidden as i32);
            let mut a = f.builder();
            a.arg(&e);
            a.arg(&ids);
            a.arg(&xp);
            a.arg(&h);
            // SAFETY: matches `embed_rows_*`; ids index rows of `embed`.
            unsafe { a.launch(cfg((b as u32, 1, 1), 256)) }.w()?;
        }
        self.mark("embed")?;
        let (cos, sin) = (ptr(&w.cos)?, ptr(&w.sin)?);
        let qkv_prep = self.kernel(&DECODE, "qkv_prep")?;
        let silu_mul = self.kernel(&DECODE, "silu_mul")?;
        let attention = self.attention.load(&self.dev)?;
        let part = slice_ptr(&self.part, &self.stream);
        let mut h: Option<Tensor> = None;
        for (l, lw) in w.layers.iter().enumerate() {
            let n = self.empty(b, hidden)?;
            self.add_rmsnorm(&x, h.as_ref(), &lw.input_norm, &n, eps)?;
            self.mark("add_rmsnorm")?;
            let qkv = self.products.project(&self.dev, &n, &lw.qkv)?; // (B, (H + 2 H_kv) D)
            self.mark("qkv_gemm")?;
            let q_out = self.empty(b, hq * d)?;
            let qp = ptr(&qkv)?;
            let (kp, vp) = (
                qp + (hq * d) as u64 * elt,
                qp + ((hq + hkv) * d) as u64 * elt,
            );
            let (qn, kn) = match &lw.qk_norm {
                Some((q, k)) => (ptr(q)?, ptr(k)?),
                None => (0u64, 0u64),
            };
            let (kc, vc, qo) = (ptr(&self.k[l])?, ptr(&self.v[l])?, ptr(&q_out)?);
            let width = ((hq + 2 * hkv) * d) as i32;
            let (hq32, hkv32, cap32) = (hq as i32, hkv as i32, self.cap as i32);
            {
                let mut a = qkv_prep.builder();
                a.arg(&qp);
                a.arg(&kp);
                a.arg(&vp);
                a.arg(&width);
                a.arg(&qn);
                a.arg(&kn);
                a.arg(&cos);
                a.arg(&sin);
                a.arg(&pos);
                a.arg(&qo);
                a.arg(&kc);
                a.arg(&vc);
                a.arg(&hq32);
                a.arg(&hkv32);
                a.arg(&cap32);
                a.arg(&eps);
                // SAFETY: matches `qkv_prep_*`; positions are below cap
                // (checked in `step`) and the RoPE tables' length.
                unsafe { a.launch(cfg(((hq + 2 * hkv) as u32, b as u32, 1), d as u32)) }.w()?;
            }
            self.mark("qkv_prep")?;
            let o = self.empty(b, hq * d)?;
            let args = AttentionArgs {
                q: qo,
                k: kc,
                v: vc,
                pos,
                part,
                out: ptr(&o)?,
            };
            // SAFETY: q_out and o hold b rows of H_q heads, the caches b
            // slots of cap columns, `pos` b positions below cap (checked in
            // `step`), `part` was sized for this plan in `new`.
            unsafe { attention.launch(&args, b, hkv, self.cap, &|n| self.mark(n)) }?;
            let attn = self.products.project(&self.dev, &o, &lw.o)?;
            self.mark("o_gemm")?;
            let n2 = self.empty(b, hidden)?;
            self.add_rmsnorm(&x, Some(&attn), &lw.post_norm, &n2, eps)?;
            self.mark("add_rmsnorm")?;
            let gu = self.products.project(&self.dev, &n2, &lw.gate_up)?; // (B, 2 I)
            self.mark("gate_up_gemm")?;
            let act = self.empty(b, inter)?;
            {
                let gp = ptr(&gu)?;
                let up = gp + inter as u64 * elt;
                let (stride, ap, n32) = ((2 * inter) as i32, ptr(&act)?, inter as i32);
                let mut a = silu_mul.builder();
                a.arg(&gp);
                a.arg(&up);
                a.arg(&stride);
                a.arg(&ap);
                a.arg(&n32);
                // Eight values a thread where the kernel takes them so.
                let per = if inter % 8 == 0 { 8 } else { 1 };
                // SAFETY: matches `silu_mul_*`.
                unsafe { a.launch(cfg((inter.div_ceil(256 * per) as u32, b as u32, 1), 256)) }
                    .w()?;
            }
            self.mark("silu_mul")?;
            h = Some(self.products.project(&self.dev, &act, &lw.down)?);
            self.mark("down_gemm")?;
        }
        let n = self.empty(b, hidden)?;
        self.add_rmsnorm(&x, h.as_ref(), &w.norm, &n, eps)?;
        let logits = self.products.project(&self.dev, &n, &w.head)?; // (B, vocab)
        self.mark("head")?;
        let vocab = logits.dim(1)? as i32;
        // SAFETY: the sampling kernel writes both values of every row.
        let out = unsafe { self.dev.alloc::<u32>(2 * b) }?;
        {
            let lp = ptr(&logits)?;
            let op = slice_ptr(&out, &self.stream);
            let dp = slice_ptr(&self.draw_part, &self.stream);
            let f = self.kernel(&SAMPLE, "sample_slices")?;
            let mut a = f.builder();
            a.arg(&lp);
            a.arg(&vocab);
            a.arg(&seeds);
            a.arg(&params);
            a.arg(&dp);
            let grid = (b as u32, self.draw_slices as u32, 1);
            // SAFETY: matches `sample_slices_*` in sample.cu: b rows of
            // `vocab` logits, b seeds, 3 b settings, 4 values a slice.
            unsafe { a.launch(cfg(grid, draw::SLICE_THREADS)) }.w()?;
            self.mark("sample_slices")?;
            let f = self.kernel(&SAMPLE, "sample_rows")?;
            let s32 = self.draw_slices as i32;
            let mut a = f.builder();
            a.arg(&lp);
            a.arg(&vocab);
            a.arg(&seeds);
            a.arg(&params);
            a.arg(&dp);
            a.arg(&s32);
            a.arg(&op);
            // SAFETY: matches `sample_rows_*` in sample.cu: as above, and 2
            // b outputs.
            unsafe { a.launch(cfg((b as u32, 1, 1), draw::ROW_THREADS)) }.w()?;
        }
        self.mark("sample")?;
        Ok(out)
    }

    /// With profiling on, waits for the GPU and adds the time since the
    /// last mark to `name`.
    fn mark(&self, name: &'static str) -> Result<()> {
        if let Some(p) = &self.profile {
            self.stream.synchronize().w()?;
            let mut p = p.borrow_mut();
            let t = p.0.elapsed().as_secs_f64();
            match p.1.iter_mut().find(|(n, _)| *n == name) {
                Some(e) => e.1 += t,
                None => p.1.push((name, t)),
            }
            p.0 = std::time::Instant::now();
        }
        Ok(())
    }

    /// `x += h` (when given), then `out = rmsnorm(x) * w`.
    fn add_rmsnorm(
        &self,
        x: &Tensor,
        h: Option<&Tensor>,
        w: &Tensor,
        out: &Tensor,
        eps: f32,
    ) -> Result<()> {
        let (rows, n) = x.dims2()?;
        let f = self.kernel(&DECODE, "add_rmsnorm")?;
        let (xp, hp, wp, op) = (
            ptr(x)?,
            h.map(ptr).transpose()?.unwrap_or(0),
            ptr(w)?,
            ptr(out)?,
        );
        let n32 = n as i32;
        let mut a = f.builder();
        a.arg(&xp);
        a.arg(&hp);
        a.arg(&wp);
        a.arg(&op);
        a.arg(&n32);
        a.arg(&eps);
        // SAFETY: matches `add_rmsnorm_*`; x, h and out hold rows x n.
        unsafe { a.launch(cfg((rows as u32, 1, 1), norm_threads(n))) }.w()?;
        Ok(())
    }

    /// Kernel `{name}_{dtype}` of `module`, instantiated for the model's
    /// dtype.
    fn kernel(&self, module: &Module, name: &str) -> Result<Kernel> {
        kernels::kernel(&self.dev, module, &format!("{name}_{}", self.suffix))
    }

    /// An uninitialised `(rows, cols)` tensor of the model's dtype (every
    /// use writes it whole first).
    fn empty(&self, rows: usize, cols: usize) -> Result<Tensor> {
        uninit(&self.dev, self.dtype, rows, cols)
    }
}

/// The decode step's products `x W^T` (a few rows of x, all of W) and
/// their scratch: cuBLAS on a folded copy, or the decode kernel
/// (`skinny.cu`) on the bases in place.
pub struct Products {
    stream: Arc<CudaStream>,
    dtype: DType,
    /// Multiprocessors of the device (how finely a product's K is split).
    sms: usize,
    /// Split-K partial sums `(splits, 32, out)` f32, and one counter a
    /// tile (each launch leaves them at zero).
    part: CudaSlice<f32>,
    counters: CudaSlice<u32>,
    /// cuBLASLt plans for the folded bf16 copies at the engine's rows
    /// (`TRACE_TRAIN_DECODE_LT`).
    lt: Option<LtProducts>,
    /// With several adapters side by side (`DecodeLora::blocks` > 1):
    /// for products of 1, 2 and 3 segments, `(rows, segments r)` in the
    /// model's dtype, 1 over each row's adapter's columns of `x A^T` in
    /// every segment; and the adapters' count. Written in place between
    /// steps ([`Engine::set_row_adapters`]), so a captured graph reads
    /// them; whole rows, so the product with `x A^T` is of two contiguous
    /// tensors (a broadcast would copy its layout from the host, which a
    /// graph cannot replay).
    row_mask: Option<(Vec<Tensor>, usize)>,
}

impl Products {
    /// Scratch for every product of `all` with a model of `dtype`, and the
    /// folded copies' products planned for `rows` rows of x.
    pub fn new(dev: &CudaDevice, dtype: DType, all: &[&DecodeProj], rows: usize) -> Result<Self> {
        let stream = dev.cuda_stream();
        let sms = kernels::multiprocessors(dev)?;
        let (mut part_len, mut tiles_max) = (1, 1);
        for p in all {
            let out = p.dims()?.0;
            let tiles = tiles_of(p)?;
            if tiles == 0 {
                continue;
            }
            let plan = split_plan(p, sms)?;
            if plan.splits > 1 {
                part_len = part_len.max(plan.splits * SKINNY_ROWS * out);
            }
            tiles_max = tiles_max.max(tiles);
        }
        let folded: Vec<&Tensor> = all
            .iter()
            .filter_map(|p| match p {
                DecodeProj::Folded(w) if w.dtype() == DType::BF16 => Some(w),
                _ => None,
            })
            .collect();
        let lt = if dtype == DType::BF16 && !folded.is_empty() && lt_products::enabled()? {
            match LtProducts::new(dev, rows, &folded) {
                Ok(lt) => Some(lt),
                Err(e) => {
                    // cuBLAS's path is always there: say why, and take it.
                    tracing::warn!(
                        "decode: cuBLASLt unavailable ({e}); the products run on cuBLAS"
                    );
                    None
                }
            }
        } else {
            None
        };
        // Several adapters: one row mask for every product (they share
        // the bank's width).
        let banked = all.iter().find_map(|p| match p {
            DecodeProj::Parts { lora: Some(l), .. } if l.blocks > 1 => Some((l.rank, l.blocks)),
            _ => None,
        });
        let row_mask = match banked {
            Some((width, blocks)) => {
                let device = Device::Cuda(dev.clone());
                let masks = (1..=3)
                    .map(|segments| Tensor::zeros((rows, segments * width), dtype, &device))
                    .collect::<Result<Vec<_>>>()?;
                Some((masks, blocks))
            }
            None => None,
        };
        Ok(Self {
            part: dev.alloc_zeros::<f32>(part_len)?,
            counters: dev.alloc_zeros::<u32>(tiles_max)?,
            stream,
            dtype,
            sms,
            lt,
            row_mask,
        })
    }

    /// Writes the row masks for row `r` taking adapter `adapters[r]` (0:
    /// the base alone; `k`: the bank's `k`-th), in place.
    fn set_row_adapters(&self, adapters: &[usize]) -> Result<()> {
        let Some((masks, blocks)) = &self.row_mask else {
            bail!("decode: row adapters without several adapters");
        };
        let one = match self.dtype {
            DType::BF16 => half::bf16::ONE.to_bits(),
            DType::F16 => half::f16::ONE.to_bits(),
            other => bail!("decode: a row mask in {other:?}"),
        };
        for (i, mask) in masks.iter().enumerate() {
            let segments = i + 1;
            let (rows, all) = mask.dims2()?;
            if adapters.len() != rows {
                bail!("decode: {} rows' adapters for {rows} rows", adapters.len());
            }
            let width = all / segments;
            let block = width / blocks;
            let mut host = vec![0u16; rows * all];
            for (r, &k) in adapters.iter().enumerate() {
                if k > *blocks {
                    bail!("decode: row {r} asks for adapter {k} of {blocks}");
                }
                if k == 0 {
                    continue;
                }
                for s in 0..segments {
                    let at = r * all + s * width + (k - 1) * block;
                    host[at..at + block].fill(one);
                }
            }
            // SAFETY: `mask` is a contiguous (rows, all) 2-byte tensor on
            // this stream's device; `host` lives until the stream is
            // synchronised below.
            unsafe {
                candle_core::cuda_backend::cudarc::driver::result::memcpy_htod_async(
                    ptr(mask)?,
                    &host,
                    self.stream.cu_stream(),
                )
            }
            .w()?;
            self.stream.synchronize().w()?;
        }
        Ok(())
    }

    /// `x W^T` for `x` `(rows, in)`: for a folded copy cuBLASLt's timed
    /// algorithm where its plan has one, else cuBLAS; otherwise the decode
    /// kernel (`skinny.cu`, 32 rows a launch).
    pub fn project(&self, dev: &CudaDevice, x: &Tensor, p: &DecodeProj) -> Result<Tensor> {
        let (parts, lora) = match p {
            DecodeProj::Folded(w) => {
                if let Some(y) = self
                    .lt
                    .as_ref()
                    .map(|lt| lt.project(x, w))
                    .transpose()?
                    .flatten()
                {
                    return Ok(y);
                }
                return x.matmul(&w.t()?);
            }
            DecodeProj::Parts { parts, lora } => (parts, lora),
        };
        if self.dtype != DType::BF16 {
            bail!("decode: the decode kernel takes a bf16 model");
        }
        let (rows, inp) = x.dims2()?;
        let (out, k) = p.dims()?;
        if k != inp || k % 64 != 0 {
            bail!("decode product: x ({rows}, {inp}) against a weight ({out}, {k})");
        }
        if parts.is_empty() || parts.len() > 3 {
            bail!("decode product: {} segments (1 to 3)", parts.len());
        }
        let format = parts[0].format();
        let mut segs = Vec::with_capacity(parts.len());
        for q in parts {
            if q.format() != format {
                bail!(
                    "decode product: {} and {} segments in one product",
                    format,
                    q.format()
                );
            }
            segs.push(match q {
                DecodeBase::Dense(w) => {
                    if w.dtype() != DType::BF16 {
                        bail!("decode product: a {:?} weight in a bf16 model", w.dtype());
                    }
                    (ptr(w)?, 0, w.dim(0)?)
                }
                DecodeBase::Nf4 { weight, scales } => {
                    (ptr(weight.packed())?, ptr(scales)?, weight.shape().0)
                }
                DecodeBase::Fp8 { codes, scales } => {
                    if scales.dtype() != DType::F32 || scales.dims1()? != codes.dim(0)? {
                        bail!(
                            "decode product: FP8 scales {:?} for {:?} codes",
                            scales.shape(),
                            codes.shape()
                        );
                    }
                    (ptr(codes)?, ptr(scales)?, codes.dim(0)?)
                }
            });
        }
        let seg = |i: usize| segs.get(i).copied().unwrap_or((0, 0, 0));
        // The kernel writes every element of y.
        let y = uninit(dev, DType::BF16, rows, out)?;
        let xa = match lora {
            Some(lora) if lora.blocks > 1 => {
                // Each row keeps its own adapter's columns of every segment.
                let Some((masks, _)) = &self.row_mask else {
                    bail!("decode: several adapters and no row mask");
                };
                let xa = x.matmul(&lora.a.t()?)?;
                let segments = xa.dim(1)? / lora.rank;
                let Some(mask) = masks.get(segments.wrapping_sub(1)) else {
                    bail!("decode: a product of {segments} segments with several adapters");
                };
                Some(((xa * mask.narrow(0, 0, rows)?)?, lora))
            }
            Some(lora) => Some((x.matmul(&lora.a.t()?)?, lora)),
            None => None,
        };
        let tiles = tiles_of(p)?;
        let plan = split_plan(p, self.sms)?;
        let part = slice_ptr(&self.part, &self.stream);
        let counters = slice_ptr(&self.counters, &self.stream);
        let elt = 2u64;
        for first in (0..rows).step_by(SKINNY_ROWS) {
            let m = (rows - first).min(SKINNY_ROWS);
            let name = format!("skinny_{format}_m{}", if m <= 16 { 16 } else { 32 });
            let f = kernels::kernel(dev, &SKINNY, &name)?;
            let xp = ptr(x)? + (first * k) as u64 * elt;
            let yp = ptr(&y)? + (first * out) as u64 * elt;
            let (m32, k32, ldy) = (m as i32, k as i32, out as i32);
            let (s0, s1, s2) = (seg(0), seg(1), seg(2));
            let (r0, r1, r2) = (s0.2 as i32, s1.2 as i32, s2.2 as i32);
            let (sp32, ps32, xs32) = (
                plan.splits as i32,
                plan.per_split as i32,
                i32::from(plan.x_in_shared),
            );
            let (xap, xa_stride, lbp, rank) = match &xa {
                Some((t, lora)) => (
                    ptr(t)? + (first * t.dim(1)?) as u64 * elt,
                    t.dim(1)? as i32,
                    ptr(&lora.b)?,
                    lora.rank as i32,
                ),
                None => (0, 0, 0, 0),
            };
            let mut a = f.builder();
            a.arg(&xp);
            a.arg(&m32);
            a.arg(&k32);
            a.arg(&yp);
            a.arg(&ldy);
            a.arg(&s0.0);
            a.arg(&s1.0);
            a.arg(&s2.0);
            a.arg(&s0.1);
            a.arg(&s1.1);
            a.arg(&s2.1);
            a.arg(&r0);
            a.arg(&r1);
            a.arg(&r2);
            a.arg(&sp32);
            a.arg(&ps32);
            a.arg(&xs32);
            a.arg(&part);
            a.arg(&counters);
            a.arg(&xap);
            a.arg(&xa_stride);
            a.arg(&lbp);
            a.arg(&rank);
            let config = LaunchConfig {
                grid_dim: (tiles as u32, plan.splits as u32, 1),
                block_dim: (SKINNY_THREADS, 1, 1),
                shared_mem_bytes: plan.shared_bytes(),
            };
            // SAFETY: matches `skinny_*` in skinny.cu: x holds m rows of k,
            // y m rows of `out`; every segment's weight its rows of k; the
            // partial sums and counters were sized in `new` for the largest
            // product (`split_plan`), and each launch leaves the counters
            // at zero.
            unsafe { a.launch(config) }.w()?;
        }
        Ok(y)
    }
}

/// Blocks of [`SKINNY_TILE`] weight rows a product takes (a tile never
/// straddles two segments).
fn tiles_of(p: &DecodeProj) -> Result<usize> {
    Ok(match p {
        DecodeProj::Folded(_) => 0,
        DecodeProj::Parts { parts, .. } => {
            let mut tiles = 0;
            for q in parts {
                tiles += q.dims()?.0.div_ceil(SKINNY_TILE);
            }
            tiles
        }
    })
}

/// How a product runs: K split across blocks, and where X's rows are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    splits: usize,
    /// 64-chunks of K a split.
    per_split: usize,
    /// X's rows of a split copied to shared memory first.
    x_in_shared: bool,
}

impl Plan {
    /// Dynamic shared memory a block takes.
    fn shared_bytes(&self) -> u32 {
        if self.x_in_shared {
            (SKINNY_ROWS * (self.per_split * 64 + 8) * 2) as u32
        } else {
            0
        }
    }
}

/// A product's [`Plan`]: enough blocks for about two a multiprocessor;
/// splits short enough for X's rows to sit in shared memory (beside NF4's
/// table: 48 KiB in all) unless that would take over eight blocks a
/// multiprocessor (the head). The partial sums are added four columns at a
/// time: a product whose segments are not whole fours of rows is never
/// split.
fn split_plan(p: &DecodeProj, sms: usize) -> Result<Plan> {
    let (out, k) = p.dims()?;
    let tiles = tiles_of(p)?.max(1);
    let chunks = (k / 64).max(1);
    let (fours, cap) = match p {
        DecodeProj::Folded(_) => (false, 0),
        DecodeProj::Parts { parts, .. } => {
            let mut all = out % 4 == 0;
            for q in parts {
                all &= q.dims()?.0 % 4 == 0;
            }
            let nf4 = matches!(parts.first(), Some(DecodeBase::Nf4 { .. }));
            (all, if nf4 { 9 } else { 11 })
        }
    };
    if !fours {
        return Ok(Plan {
            splits: 1,
            per_split: chunks,
            x_in_shared: chunks <= cap,
        });
    }
    let want = (2 * sms).div_ceil(tiles).clamp(1, chunks);
    let mut per_split = chunks.div_ceil(want);
    if per_split > cap && tiles * chunks.div_ceil(cap) <= 8 * sms {
        per_split = cap;
    }
    Ok(Plan {
        splits: chunks.div_ceil(per_split),
        per_split,
        x_in_shared: per_split <= cap,
    })
}

/// Threads of an `add_rmsnorm` block for rows of `n`: one chunk of 8
/// values a thread (up to `RMS_CHUNKS` = 4 once past 1,024 threads), so
/// every value stays in a register between the sum and the output.
fn norm_threads(n: usize) -> u32 {
    (n.div_ceil(8).next_multiple_of(32)).clamp(32, 1024) as u32
}

fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn slice_ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::layers::decoder::DecodeLora;
    use crate::layers::fp8::Fp8Rows;
    use crate::layers::nf4::Nf4Weight;

    pub(crate) fn gpu() -> Option<CudaDevice> {
        match Device::new_cuda(0) {
            Ok(Device::Cuda(d)) => Some(d),
            _ => {
                eprintln!("SKIPPED: no CUDA device");
                None
            }
        }
    }

    fn randn(rows: usize, cols: usize, std: f64, dev: &Device) -> Tensor {
        Tensor::randn(0f32, std as f32, (rows, cols), dev).unwrap()
    }

    /// A matrix's values as f32 (bf16 converts exactly), to compare bits.
    pub(crate) fn values(t: &Tensor) -> Vec<Vec<f32>> {
        t.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap()
    }

    /// Largest difference over the largest reference value.
    pub(crate) fn rel(got: &Tensor, want: &Tensor) -> f32 {
        let d = (got.to_dtype(DType::F32).unwrap() - want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let m = want
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        d / m
    }

    /// The decode product against f32 matmuls of the same values: bf16
    /// weights of one and of three segments with LoRA, NF4 weights of
    /// three segments against their dequantised f32 copy, with and without
    /// LoRA; every row count up to 40 (two launches), segments that fill
    /// no whole tile, K split across blocks; a second run gives the same
    /// bits (the split sums are added in a fixed order and the counters
    /// are reset). A folded copy goes to cuBLAS.
    #[test]
    fn decode_product_matches_f32_matmuls() {
        let Some(cuda) = gpu() else { return };
        let dev = Device::Cuda(cuda.clone());
        let bf = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
        let f32_of = |t: &Tensor| bf(t).to_dtype(DType::F32).unwrap();
        let k = 2048;
        let seg_rows = [200, 64, 130];
        let dense_w: Vec<Tensor> = seg_rows.iter().map(|&r| randn(r, k, 0.05, &dev)).collect();
        let parts: Vec<Arc<Nf4Weight>> = dense_w
            .iter()
            .map(|w| Arc::new(Nf4Weight::quantize(w).unwrap()))
            .collect();
        let rank = 8;
        let a = randn(3 * rank, k, 0.02, &dev);
        let b = randn(seg_rows.iter().sum(), rank, 0.5, &dev);
        let lora = || {
            Some(DecodeLora {
                a: bf(&a),
                b: bf(&b),
                rank,
                blocks: 1,
            })
        };
        let one = DecodeProj::Parts {
            parts: vec![DecodeBase::Dense(bf(&dense_w[0]))],
            lora: None,
        };
        let dense3 = DecodeProj::Parts {
            parts: dense_w.iter().map(|w| DecodeBase::Dense(bf(w))).collect(),
            lora: lora(),
        };
        let nf4_with = |lora| DecodeProj::Parts {
            parts: parts
                .iter()
                .map(|p| DecodeBase::Nf4 {
                    weight: Arc::clone(p),
                    scales: p.block_scales().unwrap().clone(),
                })
                .collect(),
            lora,
        };
        let (nf4, nf4_lora) = (nf4_with(None), nf4_with(lora()));
        // FP8 rows whose scales differ by a factor of 1,000 from one
        // segment to the next, and a row of zeros (scale 1, zero codes).
        let fp8_w: Vec<Tensor> = dense_w
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let w = (w * 10f64.powi(i as i32 * 3 - 3)).unwrap();
                let zero = Tensor::zeros((1, k), DType::F32, &dev).unwrap();
                Tensor::cat(&[&w.narrow(0, 1, w.dim(0).unwrap() - 1).unwrap(), &zero], 0).unwrap()
            })
            .collect();
        let fp8_rows: Vec<Fp8Rows> = fp8_w
            .iter()
            .map(|w| Fp8Rows::quantize(w).unwrap())
            .collect();
        let fp8_with = |lora| DecodeProj::Parts {
            parts: fp8_rows
                .iter()
                .map(|r| DecodeBase::Fp8 {
                    codes: r.codes.clone(),
                    scales: r.scales.clone(),
                })
                .collect(),
            lora,
        };
        let (fp8, fp8_lora) = (fp8_with(None), fp8_with(lora()));
        let folded = DecodeProj::Folded(bf(&randn(1000, 96, 0.1, &dev)));
        let all = [&one, &dense3, &nf4, &nf4_lora, &fp8, &fp8_lora, &folded];
        let products = Products::new(&cuda, DType::BF16, &all, 32).unwrap();
        assert!(
            split_plan(&one, products.sms).unwrap().splits > 1,
            "the test covers split K"
        );
        let deq: Vec<Tensor> = parts.iter().map(|p| p.to_dense_f32().unwrap()).collect();
        let deq = Tensor::cat(&deq, 0).unwrap();
        let fp8_deq: Vec<Tensor> = fp8_rows
            .iter()
            .map(|r| r.dequantize(DType::F32).unwrap())
            .collect();
        let dense_cat = Tensor::cat(&dense_w.iter().map(f32_of).collect::<Vec<_>>(), 0).unwrap();
        for m in [1, 5, 16, 17, 32, 40] {
            let x = bf(&randn(m, k, 1.0, &dev));
            let xf = x.to_dtype(DType::F32).unwrap();
            let check = |p: &DecodeProj, want: &Tensor, what: &str| {
                let got = products.project(&cuda, &x, p).unwrap();
                let e = rel(&got, want);
                assert!(e < 1e-2, "{what}, {m} rows: {e}");
                got
            };
            let want = xf.matmul(&f32_of(&dense_w[0]).t().unwrap()).unwrap();
            let got = check(&one, &want, "bf16");
            let again = products.project(&cuda, &x, &one).unwrap();
            assert_eq!(
                values(&got),
                values(&again),
                "{m} rows: the same bits twice"
            );
            // LoRA: segment s reads columns s r .. (s + 1) r of x A^T.
            let xa = f32_of(&xf.matmul(&f32_of(&a).t().unwrap()).unwrap());
            let mut delta = Vec::new();
            let mut row = 0;
            for (s, &r) in seg_rows.iter().enumerate() {
                let xs = xa.narrow(1, s * rank, rank).unwrap().contiguous().unwrap();
                let bs = f32_of(&b.narrow(0, row, r).unwrap().contiguous().unwrap());
                delta.push(xs.matmul(&bs.t().unwrap()).unwrap());
                row += r;
            }
            let delta = Tensor::cat(&delta, 1).unwrap();
            let want = (xf.matmul(&dense_cat.t().unwrap()).unwrap() + &delta).unwrap();
            check(&dense3, &want, "bf16, three segments + LoRA");
            let want = xf.matmul(&deq.t().unwrap()).unwrap();
            check(&nf4, &want, "nf4, three segments");
            check(&nf4_lora, &(want + &delta).unwrap(), "nf4 + LoRA");
            // FP8: each segment against its own scale (their outputs are
            // 1,000 times apart), the zero row exactly zero.
            let got = check_each(&products, &x, &fp8, &fp8_deq, None);
            for (s, g) in got.iter().enumerate() {
                let last = g.narrow(1, seg_rows[s] - 1, 1).unwrap();
                let last = last.to_dtype(DType::F32).unwrap().abs().unwrap();
                let last = last.max_all().unwrap().to_scalar::<f32>().unwrap();
                assert_eq!(last, 0.0, "fp8, {m} rows: segment {s}'s zero row");
            }
            check_each(&products, &x, &fp8_lora, &fp8_deq, Some(&delta));
        }
        // A head-sized product: too many blocks to split K, X read
        // through L1.
        let head_w = bf(&randn(400 * SKINNY_TILE, 2304, 0.05, &dev));
        let head = DecodeProj::Parts {
            parts: vec![DecodeBase::Dense(head_w.clone())],
            lora: None,
        };
        let plan = split_plan(&head, products.sms).unwrap();
        assert_eq!((plan.splits, plan.x_in_shared), (1, false), "{plan:?}");
        let heads = Products::new(&cuda, DType::BF16, &[&head], 32).unwrap();
        let x = bf(&randn(5, 2304, 1.0, &dev));
        let want = x
            .to_dtype(DType::F32)
            .unwrap()
            .matmul(&head_w.to_dtype(DType::F32).unwrap().t().unwrap())
            .unwrap();
        let got = heads.project(&cuda, &x, &head).unwrap();
        assert!(rel(&got, &want) < 1e-2, "head: {}", rel(&got, &want));
        let x = bf(&randn(3, 96, 1.0, &dev));
        let DecodeProj::Folded(w) = &folded else {
            unreachable!()
        };
        let want = x
            .to_dtype(DType::F32)
            .unwrap()
            .matmul(&w.to_dtype(DType::F32).unwrap().t().unwrap())
            .unwrap();
        let got = products.project(&cuda, &x, &folded).unwrap();
        assert!(rel(&got, &want) < 1e-2);
    }

    /// Each segment's columns of `x W^T (+ delta)` against `x` times its
    /// own f32 weight, within 1% of the segment's largest value: the
    /// segments' outputs returned.
    fn check_each(
        products: &Products,
        x: &Tensor,
        p: &DecodeProj,
        weights: &[Tensor],
        delta: Option<&Tensor>,
    ) -> Vec<Tensor> {
        let Device::Cuda(cuda) = x.device() else {
            unreachable!()
        };
        let got = products.project(cuda, x, p).unwrap();
        let again = products.project(cuda, x, p).unwrap();
        assert_eq!(values(&got), values(&again), "the same bits twice");
        let xf = x.to_dtype(DType::F32).unwrap();
        let mut col = 0;
        let mut out = Vec::new();
        for (s, w) in weights.iter().enumerate() {
            let n = w.dim(0).unwrap();
            let mut want = xf.matmul(&w.t().unwrap()).unwrap();
            if let Some(d) = delta {
                want = (want + d.narrow(1, col, n).unwrap()).unwrap();
            }
            let g = got.narrow(1, col, n).unwrap();
            let e = rel(&g, &want);
            assert!(e < 1e-2, "segment {s} of {} rows: {e}", x.dim(0).unwrap());
            out.push(g);
            col += n;
        }
        out
    }

    /// The tensor-core attention (`decode_attention_mma`, bf16) against an
    /// f32 reference of the same bf16 values and against the warp kernel,
    /// attention and combine: Qwen3-4B's shape (head dim 128, 4 query heads
    /// a KV head), the tiny models' (32, 2) and (64, 8); rows of 1 key (its
    /// value, exactly), of lengths on both sides of a tile (32) and of a
    /// chunk (128, 256), of 266 and 511 keys, and rows longer than 16
    /// splits of either chunk (4,500 keys: lengthened chunks); both chunks
    /// the engine takes. Within `2e-2 + 2^-8 |want|` of the reference (P
    /// rounded to bf16: at most 2^-8 of each weight; 2^-8: the output's own
    /// rounding), the mean error below 2e-3; the warp kernel within
    /// `2e-3 + 2^-8 |want|`. A second launch gives the same bits. Then the
    /// fallbacks to the warp kernel, and the variable's values.
    #[test]
    fn mma_attention_matches_f32_and_the_warp_kernel() {
        let Some(cuda) = gpu() else { return };
        let dev = Device::Cuda(cuda.clone());
        let stream = cuda.cuda_stream();
        let lens = [
            1usize, 2, 31, 33, 127, 128, 129, 255, 257, 266, 511, 1000, 2100, 4500,
        ];
        let (rows, cap) = (lens.len(), 4500);
        let pos: Vec<u32> = lens.iter().map(|&l| l as u32 - 1).collect();
        let pos = stream.clone_htod(&pos).unwrap();
        for (d, hq, hkv) in [(128, 32, 8), (32, 4, 2), (64, 16, 2)] {
            let g = hq / hkv;
            let bf = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
            let q = bf(Tensor::randn(0f32, 1.5, (rows, hq, d), &dev).unwrap());
            let k = bf(Tensor::randn(0f32, 1.0, (rows, hkv, cap, d), &dev).unwrap());
            let v = bf(Tensor::randn(0f32, 1.0, (rows, hkv, cap, d), &dev).unwrap());
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let (qf, kf, vf) = (f(&q), f(&k), f(&v));
            let scale = 1.0 / (d as f64).sqrt();
            let want: Vec<Tensor> = lens
                .iter()
                .enumerate()
                .map(|(b, &len)| {
                    let qb = qf.get(b).unwrap().reshape((hkv, g, d)).unwrap();
                    let keys = |c: &Tensor| c.get(b).unwrap().narrow(1, 0, len).unwrap();
                    let (kb, vb) = (
                        keys(&kf).contiguous().unwrap(),
                        keys(&vf).contiguous().unwrap(),
                    );
                    let s = (qb.matmul(&kb.t().unwrap()).unwrap() * scale).unwrap();
                    let p = candle_nn::ops::softmax_last_dim(&s).unwrap();
                    p.matmul(&vb).unwrap().reshape((hq, d)).unwrap()
                })
                .collect();
            let want = Tensor::stack(&want, 0).unwrap();
            drop((kf, qf));
            let run = |plan: &AttentionPlan| {
                let part = cuda.alloc_zeros::<f32>(plan.part_len(rows, hkv)).unwrap();
                let out = uninit(&cuda, DType::BF16, rows, hq * d).unwrap();
                let a = AttentionArgs {
                    q: ptr(&q).unwrap(),
                    k: ptr(&k).unwrap(),
                    v: ptr(&v).unwrap(),
                    pos: slice_ptr(&pos, &stream),
                    part: slice_ptr(&part, &stream),
                    out: ptr(&out).unwrap(),
                };
                let loaded = plan.load(&cuda).unwrap();
                // SAFETY: the tensors hold the shapes `AttentionArgs` says,
                // every position is below cap, `part` is the plan's.
                unsafe { loaded.launch(&a, rows, hkv, cap, &|_| Ok(())) }.unwrap();
                f(&out.reshape((rows, hq, d)).unwrap())
            };
            // The largest |got - to| beyond `rel` |to|, and the mean |got - to|.
            let err = |got: &Tensor, to: &Tensor, rel: f64| {
                let diff = (got - to).unwrap().abs().unwrap();
                let e = (&diff - (to.abs().unwrap() * rel).unwrap()).unwrap();
                let scalar = |t: Tensor| t.to_scalar::<f32>().unwrap();
                (
                    scalar(e.max_all().unwrap()),
                    scalar(diff.mean_all().unwrap()),
                )
            };
            let warp = AttentionPlan::with(AttentionKernel::Warp, CHUNK, cap, g, d, "bf16");
            let base = run(&warp);
            let (e, _) = err(&base, &want, 1.0 / 256.0);
            assert!(e < 2e-3, "d {d} g {g}: the warp kernel off by {e}");
            for chunk in [CHUNK, MMA_CHUNK] {
                let mma = AttentionPlan::with(AttentionKernel::Mma, chunk, cap, g, d, "bf16");
                assert!(
                    mma.splits == MAX_SPLITS && cap > MAX_SPLITS * chunk,
                    "the longest row lengthens its chunks"
                );
                let got = run(&mma);
                let (e, mean) = err(&got, &want, 1.0 / 256.0);
                assert!(e < 2e-2, "d {d} g {g} chunk {chunk}: off by {e}");
                assert!(mean < 2e-3, "d {d} g {g} chunk {chunk}: mean error {mean}");
                // Both rounded: 2^-8 |want| each.
                let (e, _) = err(&got, &base, 2.0 / 256.0);
                assert!(
                    e < 2.2e-2,
                    "d {d} g {g} chunk {chunk}: {e} from the warp kernel"
                );
                // The row of one key: that key's value, exactly.
                let one = got.get(0).unwrap().reshape((hkv, g, d)).unwrap();
                let v0 = vf.get(0).unwrap().narrow(1, 0, 1).unwrap();
                let v0 = v0.broadcast_as((hkv, g, d)).unwrap();
                assert_eq!(
                    values(&one.flatten_to(1).unwrap()),
                    values(&v0.contiguous().unwrap().flatten_to(1).unwrap()),
                    "d {d} g {g}: one key"
                );
                let again = run(&mma);
                assert_eq!(
                    values(&got.flatten_to(1).unwrap()),
                    values(&again.flatten_to(1).unwrap()),
                    "d {d} g {g} chunk {chunk}: the same bits twice"
                );
            }
        }
        // The fallbacks: another dtype, head size or group.
        let plan = |dtype, shape, rows, wanted| {
            AttentionPlan::new(&cuda, dtype, shape, rows, 512, wanted).unwrap()
        };
        let (mma, warp) = (AttentionKernel::Mma, AttentionKernel::Warp);
        let qwen = plan(DType::BF16, (32, 8, 128), 32, mma);
        assert_eq!((qwen.kernel, qwen.chunk, qwen.splits), (mma, MMA_CHUNK, 2));
        let few = plan(DType::BF16, (32, 8, 128), 2, mma);
        assert_eq!((few.kernel, few.chunk, few.splits), (mma, CHUNK, 4));
        assert_eq!(plan(DType::BF16, (4, 2, 32), 5, mma).kernel, mma);
        assert_eq!(plan(DType::BF16, (32, 8, 128), 32, warp).kernel, warp);
        for (dtype, shape) in [
            (DType::F32, (32, 8, 128)),
            (DType::F16, (32, 8, 128)),
            (DType::BF16, (32, 8, 96)),
            (DType::BF16, (64, 4, 128)),
        ] {
            let p = plan(dtype, shape, 32, mma);
            assert_eq!((p.kernel, p.chunk), (warp, CHUNK), "{dtype:?} {shape:?}");
        }
        assert_eq!(AttentionKernel::parse(None).unwrap(), mma);
        assert_eq!(AttentionKernel::parse(Some("mma")).unwrap(), mma);
        assert_eq!(AttentionKernel::parse(Some("warp")).unwrap(), warp);
        let e = AttentionKernel::parse(Some("tc")).unwrap_err().to_string();
        assert!(
            e.contains("TRACE_TRAIN_DECODE_ATTENTION=tc") && e.contains("mma or warp"),
            "{e}"
        );
        assert_eq!(
            with_attention_kernel(warp, AttentionKernel::wanted).unwrap(),
            warp
        );
    }
}
