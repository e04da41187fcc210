//! Fused causal grouped-query attention on CUDA through cuDNN's SDPA
//! kernels, forward and backward (feature `cudnn`).
//!
//! [`causal_sdpa`] computes `softmax(q k^T * scale + causal mask) v` without
//! materialising the `(B, H, L, L)` score matrix, in the forward or in the
//! backward: cuDNN's flash-attention graphs keep scores on chip and save
//! only the softmax statistics (one f32 log-sum-exp per query row) for the
//! backward, which recomputes the probabilities tile by tile.
//!
//! # Route
//! candle's flash-attention crates are forward-only, and the FlashAttention-2
//! backward kernels would mean vendoring and compiling large CUDA sources
//! with nvcc for every build. cuDNN already ships tuned Hopper kernels for
//! both directions (the ones PyTorch's SDPA uses there), and the GPU
//! machines carry cuDNN 9 inside their PyTorch install. Its graph API is
//! reached through NVIDIA's cudnn-frontend, a header-only C++ library (MIT),
//! so a small C++ shim (`csrc/sdpa_cudnn.cpp`, compiled by `build.rs` with
//! the `cc` crate) builds and runs the graphs and exposes a C ABI to this
//! file. The frontend is compiled for dynamic loading: the shim `dlopen`s
//! `libcudnn.so.9` the first time attention runs, so the binary links, and
//! runs on CPU, without cuDNN installed. Headers come from
//! `scripts/fetch-cudnn-headers.sh`.
//!
//! # Contract
//! - `q: (B, H, L, D)`, `k, v: (B, H_kv, L, D)`, all bf16 or all f16, on one
//!   CUDA device; `H` a multiple of `H_kv` (query head `h` reads key/value
//!   head `h / (H / H_kv)`, as HF's `repeat_kv`); `D` a multiple of 8, at
//!   most 128 (64 and 128 are tested).
//! - Causal mask aligned top-left: query `i` sees keys `0..=i`.
//! - Inputs may be contiguous or the `(1, 2)` transpose of a contiguous
//!   `(B, L, H, D)` tensor (what the projections produce); any other layout
//!   is copied to contiguous first.
//! - The output is a contiguous `(B, H, L, D)` tensor of the input dtype.
//! - Backward returns `dq, dk, dv`, with `dk, dv` summed over each query
//!   group by cuDNN. The softmax statistics (`(B, H, L, 1)` f32) live in the
//!   op object until the graph is dropped; a forward whose inputs track no
//!   gradient skips them.
//!
//! Everything runs on candle's own stream (so no extra synchronisation),
//! device memory (output, stats, workspace) is allocated through candle,
//! and each (shape, layout, dtype, scale, direction) builds its cuDNN graph
//! once per process (building costs milliseconds).

use std::ffi::{c_char, c_int, c_void};
use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{
    CpuStorage, CustomOp3, DType, Error, Layout, Result, Shape, Storage, Tensor, bail,
};
use half::{bf16, f16};

/// Shapes and layouts of one call; mirrors `TtSdpaDims` in the C++ shim.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
struct SdpaDims {
    b: i64,
    h: i64,
    h_kv: i64,
    l: i64,
    d: i64,
    /// 0 = bf16, 1 = f16.
    dtype: i32,
    /// Forward only: also write the softmax stats.
    with_stats: i32,
    /// 1: packed sequences ([`RaggedLayout`]).
    ragged: i32,
    scale: f32,
    q_stride: [i64; 4],
    k_stride: [i64; 4],
    v_stride: [i64; 4],
    /// Packed only: a bound on the row's tokens, which sizes the
    /// backward's workspace by tokens rather than by sequences x length.
    max_tokens: i64,
}

/// The packed layout's device vectors; mirrors `TtSdpaRagged`.
#[repr(C)]
struct SdpaRagged {
    offsets_q: *const c_void,
    offsets_kv: *const c_void,
    offsets_stats: *const c_void,
    seq_len: *const c_void,
}

unsafe extern "C" {
    fn tt_sdpa_cudnn_version(version: *mut i64, err: *mut c_char, err_len: usize) -> c_int;
    fn tt_sdpa_graph_builds(count: *mut i64, seconds: *mut f64);
    fn tt_sdpa_fwd_workspace(
        dims: *const SdpaDims,
        device: c_int,
        size: *mut i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn tt_sdpa_fwd(
        dims: *const SdpaDims,
        device: c_int,
        stream: *mut c_void,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *mut c_void,
        stats: *mut c_void,
        ragged: *const SdpaRagged,
        workspace: *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn tt_sdpa_bwd_workspace(
        dims: *const SdpaDims,
        device: c_int,
        size: *mut i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn tt_sdpa_bwd(
        dims: *const SdpaDims,
        device: c_int,
        stream: *mut c_void,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *const c_void,
        d_o: *const c_void,
        stats: *const c_void,
        dq: *mut c_void,
        dk: *mut c_void,
        dv: *mut c_void,
        ragged: *const SdpaRagged,
        workspace: *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

const ERR_LEN: usize = 4096;

/// Runs one shim call with an error buffer; a non-zero status becomes an
/// error carrying the shim's message.
fn shim(what: &str, call: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<()> {
    let mut err = vec![0u8; ERR_LEN];
    let status = call(err.as_mut_ptr().cast(), ERR_LEN);
    if status == 0 {
        return Ok(());
    }
    let end = err.iter().position(|&c| c == 0).unwrap_or(ERR_LEN);
    let message = String::from_utf8_lossy(&err[..end]);
    Err(Error::Msg(format!("cuDNN attention: {what}: {message}")))
}

/// The version of the cuDNN library the fused attention loads (e.g. 91900
/// for 9.19.0); loads it if needed. Fails with a hint when `libcudnn.so.9`
/// is not on the library path.
pub fn cudnn_version() -> Result<i64> {
    let mut version = 0i64;
    // SAFETY: the shim writes one i64 and at most `len` bytes of message.
    shim("loading libcudnn.so.9", |err, len| unsafe {
        tt_sdpa_cudnn_version(&mut version, err, len)
    })?;
    Ok(version)
}

/// Attention graphs built so far in this process (one a shape and
/// direction, cached after) and the seconds their builds took: the cost a
/// new shape brings.
pub fn graph_builds() -> (u64, f64) {
    let (mut count, mut seconds) = (0i64, 0f64);
    // SAFETY: the shim writes one i64 and one f64.
    unsafe { tt_sdpa_graph_builds(&mut count, &mut seconds) };
    (count.max(0) as u64, seconds)
}

/// `softmax(q k^T * scale + causal mask) v` for `q: (B, H, L, D)` and
/// `k, v: (B, H_kv, L, D)` (bf16 or f16, CUDA), fused by cuDNN, with a
/// backward; see the module docs for the exact contract. Returns a
/// contiguous `(B, H, L, D)` tensor. On CPU it fails: fused attention needs
/// a CUDA device.
pub fn causal_sdpa(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
    check_shapes(q.dims(), k.dims(), v.dims())?;
    for (name, t) in [("k", k), ("v", v)] {
        if t.dtype() != q.dtype() {
            bail!(
                "cuDNN attention: {name} is {:?} but q is {:?}",
                t.dtype(),
                q.dtype()
            );
        }
    }
    if !matches!(q.dtype(), DType::BF16 | DType::F16) {
        bail!(
            "cuDNN attention: dtype {:?} is not supported; use bf16 or f16",
            q.dtype()
        );
    }
    if !scale.is_finite() {
        bail!("cuDNN attention: scale {scale} is not finite");
    }
    let q = cudnn_layout(q)?;
    let k = cudnn_layout(k)?;
    let v = cudnn_layout(v)?;
    let op = CausalSdpa {
        scale,
        with_stats: q.track_op() || k.track_op() || v.track_op(),
        stats: Mutex::new(None),
        ragged: None,
    };
    q.apply_op3(&k, &v, op)
}

/// The forward's softmax statistics, for [`causal_sdpa_backward`].
pub struct SdpaSaved {
    op: CausalSdpa,
    /// The layouts the forward read (the backward must read the same).
    q: Tensor,
    k: Tensor,
    v: Tensor,
}

/// [`causal_sdpa`] outside any graph, keeping what the backward needs: for
/// a layer whose backward is written by hand.
pub fn causal_sdpa_saving(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
) -> Result<(Tensor, SdpaSaved)> {
    check_shapes(q.dims(), k.dims(), v.dims())?;
    let q = cudnn_layout(&q.detach())?;
    let k = cudnn_layout(&k.detach())?;
    let v = cudnn_layout(&v.detach())?;
    let op = CausalSdpa {
        scale,
        with_stats: true,
        stats: Mutex::new(None),
        ragged: None,
    };
    let out = q.apply_op3_no_bwd(&k, &v, &op)?;
    Ok((out, SdpaSaved { op, q, k, v }))
}

/// Several sequences end to end in one packed row of `T` tokens, as cuDNN's
/// packed (THD) attention reads them: each sequence's start and length, as
/// int32 device vectors (u32 tensors: the offsets are far below 2^31).
#[derive(Debug, Clone)]
pub struct RaggedLayout {
    /// Sequences (some may be empty) and the longest one's bound.
    seqs: usize,
    max_len: usize,
    /// Tokens of the packed row (positions outside every sequence
    /// included: attention leaves them zero).
    tokens: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    offsets_q: Tensor,
    offsets_kv: Tensor,
    offsets_stats: Tensor,
    seq_len: Tensor,
}

impl RaggedLayout {
    /// Sequences of `lens` tokens each, one after the other from position
    /// 0 of a row of `tokens`, none longer than `max_len`, for attention
    /// with these head counts and size.
    pub fn new(
        lens: &[usize],
        max_len: usize,
        tokens: usize,
        (heads, kv_heads, head_dim): (usize, usize, usize),
        device: &candle_core::Device,
    ) -> Result<Self> {
        let total: usize = lens.iter().sum();
        if lens.is_empty() || total > tokens || lens.iter().any(|&n| n > max_len) || max_len == 0 {
            bail!(
                "cuDNN attention: {} packed sequences of {total} tokens (longest bound {max_len}) in a row of {tokens}",
                lens.len()
            );
        }
        if tokens * heads.max(kv_heads) * head_dim >= i32::MAX as usize {
            bail!("cuDNN attention: a packed row of {tokens} tokens is too long for int32 offsets");
        }
        let mut starts = Vec::with_capacity(lens.len() + 1);
        let mut at = 0usize;
        starts.push(0usize);
        for &n in lens {
            at += n;
            starts.push(at);
        }
        let scaled = |m: usize| -> Result<Tensor> {
            let v: Vec<u32> = starts.iter().map(|&s| (s * m) as u32).collect();
            Tensor::new(v.as_slice(), device)
        };
        let len: Vec<u32> = lens.iter().map(|&n| n as u32).collect();
        Ok(Self {
            seqs: lens.len(),
            max_len,
            tokens,
            heads,
            kv_heads,
            head_dim,
            offsets_q: scaled(heads * head_dim)?,
            offsets_kv: scaled(kv_heads * head_dim)?,
            offsets_stats: scaled(heads)?,
            seq_len: Tensor::new(len.as_slice(), device)?,
        })
    }

    /// The dims and strides cuDNN is given for `q: (1, T, H, D)` and `k, v:
    /// (1, T, H_kv, D)`, contiguous.
    fn dims(&self, q: &Layout, k: &Layout, v: &Layout) -> Result<([usize; 4], usize)> {
        let want_q = [1, self.tokens, self.heads, self.head_dim];
        let want_kv = [1, self.tokens, self.kv_heads, self.head_dim];
        for (name, l, want) in [("q", q, want_q), ("k", k, want_kv), ("v", v, want_kv)] {
            if l.dims() != want || !l.is_contiguous() {
                bail!(
                    "cuDNN attention: packed {name} must be contiguous {want:?}, got {:?}",
                    l.dims()
                );
            }
        }
        Ok((
            [self.seqs, self.heads, self.max_len, self.head_dim],
            self.kv_heads,
        ))
    }
}

/// [`causal_sdpa_saving`] over the sequences of a packed row: `q: (1, T, H,
/// D)`, `k, v: (1, T, H_kv, D)` contiguous, each sequence of `layout`
/// attending causally to itself only; returns `(1, T, H, D)` (zero outside
/// every sequence).
pub fn ragged_causal_sdpa_saving(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    layout: &RaggedLayout,
    scale: f32,
) -> Result<(Tensor, SdpaSaved)> {
    let (q, k, v) = (
        q.detach().contiguous()?,
        k.detach().contiguous()?,
        v.detach().contiguous()?,
    );
    layout.dims(q.layout(), k.layout(), v.layout())?;
    let op = CausalSdpa {
        scale,
        with_stats: true,
        stats: Mutex::new(None),
        ragged: Some(layout.clone()),
    };
    let out = q.apply_op3_no_bwd(&k, &v, &op)?;
    Ok((out, SdpaSaved { op, q, k, v }))
}

/// `(dq, dk, dv)` of [`causal_sdpa_saving`]'s output `out` for the output
/// gradient `grad_out`.
pub fn causal_sdpa_backward(
    saved: &SdpaSaved,
    out: &Tensor,
    grad_out: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (dq, dk, dv) = saved.op.bwd(&saved.q, &saved.k, &saved.v, out, grad_out)?;
    match (dq, dk, dv) {
        (Some(dq), Some(dk), Some(dv)) => Ok((dq, dk, dv)),
        _ => bail!("cuDNN attention: the backward returned no gradient"),
    }
}

fn check_shapes(q: &[usize], k: &[usize], v: &[usize]) -> Result<()> {
    let &[b, h, l, d] = q else {
        bail!("cuDNN attention: q must be (B, H, L, D), got {q:?}");
    };
    if k != v {
        bail!("cuDNN attention: k {k:?} and v {v:?} differ in shape");
    }
    let &[bk, h_kv, lk, dk] = k else {
        bail!("cuDNN attention: k must be (B, H_kv, L, D), got {k:?}");
    };
    if bk != b || lk != l || dk != d {
        bail!("cuDNN attention: q {q:?} and k {k:?} must agree in B, L and D");
    }
    if b == 0 || h == 0 || l == 0 || h_kv == 0 || !h.is_multiple_of(h_kv) {
        bail!(
            "cuDNN attention: {h} query heads must be a positive multiple of {h_kv} key/value heads"
        );
    }
    if d == 0 || !d.is_multiple_of(8) || d > 128 {
        bail!("cuDNN attention: head dimension {d} must be a multiple of 8, at most 128");
    }
    Ok(())
}

/// The strides cuDNN is given for a `(B, X, L, D)` tensor with this layout,
/// or `None` when the layout is neither contiguous nor the `(1, 2)`
/// transpose of a contiguous `(B, L, X, D)` (or is misaligned). A dimension
/// of size 1 is never stepped over, so its stride does not matter.
fn strides_for(layout: &Layout, dtype: DType) -> Option<[i64; 4]> {
    let &[b, x, l, d] = layout.dims() else {
        return None;
    };
    if !(layout.start_offset() * dtype.size_in_bytes()).is_multiple_of(16) {
        return None;
    }
    let dims = [b, x, l, d];
    let stride = layout.stride();
    let contiguous = [x * l * d, l * d, d, 1];
    let transposed = [l * x * d, d, x * d, 1];
    [contiguous, transposed]
        .into_iter()
        .find(|want| (0..4).all(|i| dims[i] == 1 || stride[i] == want[i]))
        .map(|s| s.map(|v| v as i64))
}

/// `t` itself when cuDNN can read its layout, else a contiguous copy.
fn cudnn_layout(t: &Tensor) -> Result<Tensor> {
    if strides_for(t.layout(), t.dtype()).is_some() {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

fn dims_of(
    q: &Layout,
    k: &Layout,
    v: &Layout,
    dtype: DType,
    scale: f32,
    with_stats: bool,
    ragged: Option<&RaggedLayout>,
) -> Result<SdpaDims> {
    let dtype_code = match dtype {
        DType::BF16 => 0,
        DType::F16 => 1,
        other => bail!("cuDNN attention: dtype {other:?} is not supported; use bf16 or f16"),
    };
    if let Some(r) = ragged {
        let ([b, h, l, d], h_kv) = r.dims(q, k, v)?;
        check_shapes(&[b, h, l, d], &[b, h_kv, l, d], &[b, h_kv, l, d])?;
        let thd = |heads: usize| [(l * heads * d) as i64, d as i64, (heads * d) as i64, 1];
        return Ok(SdpaDims {
            b: b as i64,
            h: h as i64,
            h_kv: h_kv as i64,
            l: l as i64,
            d: d as i64,
            dtype: dtype_code,
            with_stats: with_stats as i32,
            ragged: 1,
            scale,
            q_stride: thd(h),
            k_stride: thd(h_kv),
            v_stride: thd(h_kv),
            max_tokens: r.tokens.next_power_of_two() as i64,
        });
    }
    check_shapes(q.dims(), k.dims(), v.dims())?;
    let stride = |name: &str, l: &Layout| {
        strides_for(l, dtype).ok_or_else(|| {
            Error::Msg(format!(
                "cuDNN attention: {name} has layout {l:?}; pass it through `causal_sdpa`, which copies unsupported layouts"
            ))
        })
    };
    let [b, h, l, d] = [0, 1, 2, 3].map(|i| q.dims()[i] as i64);
    Ok(SdpaDims {
        b,
        h,
        h_kv: k.dims()[1] as i64,
        l,
        d,
        dtype: dtype_code,
        with_stats: with_stats as i32,
        ragged: 0,
        scale,
        q_stride: stride("q", q)?,
        k_stride: stride("k", k)?,
        v_stride: stride("v", v)?,
        max_tokens: 0,
    })
}

/// The op object: the scale, and the forward's softmax statistics for the
/// backward.
struct CausalSdpa {
    scale: f32,
    with_stats: bool,
    stats: Mutex<Option<CudaSlice<f32>>>,
    /// Packed sequences, when the op attends over them.
    ragged: Option<RaggedLayout>,
}

/// A u32 tensor's device address.
fn index_ptr(t: &Tensor, stream: &CudaStream) -> Result<*const c_void> {
    let (s, l) = t.storage_and_layout();
    let s = cuda_storage(&s, "a packed-layout vector")?;
    let (p, _sync) = s.as_cuda_slice::<u32>()?.device_ptr(stream);
    Ok(at(p, l, 4))
}

impl CausalSdpa {
    /// The packed layout's pointers for the shim (null when not packed).
    /// The tensors live in `self`, past every enqueue on the stream.
    fn ragged_ptrs(&self, stream: &CudaStream) -> Result<Option<SdpaRagged>> {
        let Some(r) = &self.ragged else {
            return Ok(None);
        };
        Ok(Some(SdpaRagged {
            offsets_q: index_ptr(&r.offsets_q, stream)?,
            offsets_kv: index_ptr(&r.offsets_kv, stream)?,
            offsets_stats: index_ptr(&r.offsets_stats, stream)?,
            seq_len: index_ptr(&r.seq_len, stream)?,
        }))
    }
}

/// candle's stream for `dev`, with its context current on this thread (the
/// shim calls the CUDA runtime, which uses the current context).
fn stream_of(dev: &CudaDevice) -> Result<std::sync::Arc<CudaStream>> {
    let stream = dev.cuda_stream();
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Error::Msg(format!("cuDNN attention: binding the CUDA context: {e}")))?;
    Ok(stream)
}

/// A device buffer of `bytes` bytes for the shim's workspace; `None` for 0.
fn workspace(dev: &CudaDevice, bytes: i64) -> Result<Option<CudaSlice<u8>>> {
    match usize::try_from(bytes) {
        Ok(0) => Ok(None),
        // SAFETY: workspace contents are scratch; cuDNN initialises what it reads.
        Ok(n) => Ok(Some(unsafe { dev.alloc::<u8>(n) }?)),
        Err(_) => bail!("cuDNN attention: negative workspace size {bytes}"),
    }
}

/// Address of the element at `layout`'s start offset.
fn at(base: u64, layout: &Layout, elem: usize) -> *const c_void {
    (base + (layout.start_offset() * elem) as u64) as *const c_void
}

impl CausalSdpa {
    fn fwd<T: CudaDType + DeviceRepr + ValidAsZeroBits>(
        &self,
        dims: &SdpaDims,
        (q, ql): (&CudaStorage, &Layout),
        (k, kl): (&CudaStorage, &Layout),
        (v, vl): (&CudaStorage, &Layout),
    ) -> Result<(CudaStorage, Shape)> {
        let dev = q.device.clone();
        let stream = stream_of(&dev)?;
        let ordinal = stream.context().ordinal() as c_int;
        let elem = std::mem::size_of::<T>();
        let (b, h, l, d) = (
            dims.b as usize,
            dims.h as usize,
            dims.l as usize,
            dims.d as usize,
        );

        let mut ws_bytes = 0i64;
        // SAFETY: the shim reads `dims` and writes one i64 and the message.
        shim("forward workspace", |err, len| unsafe {
            tt_sdpa_fwd_workspace(dims, ordinal, &mut ws_bytes, err, len)
        })?;
        let mut ws = workspace(&dev, ws_bytes)?;
        let ragged = self.ragged_ptrs(&stream)?;
        let (mut out, mut stats, shape) = match &self.ragged {
            // Positions outside every sequence stay zero (cuDNN writes only
            // the sequences' rows).
            Some(r) => (
                dev.alloc_zeros::<T>(r.tokens * h * d)?,
                self.with_stats
                    .then(|| dev.alloc_zeros::<f32>(r.tokens * h))
                    .transpose()?,
                Shape::from((1, r.tokens, h, d)),
            ),
            // SAFETY: cuDNN writes every element of the output and the stats.
            None => (
                unsafe { dev.alloc::<T>(b * h * l * d) }?,
                self.with_stats
                    .then(|| unsafe { dev.alloc::<f32>(b * h * l) })
                    .transpose()?,
                Shape::from((b, h, l, d)),
            ),
        };
        {
            let (q_ptr, _q_sync) = q.as_cuda_slice::<T>()?.device_ptr(&stream);
            let (k_ptr, _k_sync) = k.as_cuda_slice::<T>()?.device_ptr(&stream);
            let (v_ptr, _v_sync) = v.as_cuda_slice::<T>()?.device_ptr(&stream);
            let (o_ptr, _o_sync) = out.device_ptr_mut(&stream);
            let (stats_ptr, _stats_sync) = match stats.as_mut() {
                Some(s) => {
                    let (p, sync) = s.device_ptr_mut(&stream);
                    (p, Some(sync))
                }
                None => (0, None),
            };
            let (ws_ptr, _ws_sync) = match ws.as_mut() {
                Some(w) => {
                    let (p, sync) = w.device_ptr_mut(&stream);
                    (p, Some(sync))
                }
                None => (0, None),
            };
            // SAFETY: every pointer addresses a live buffer of the size the
            // graph for `dims` reads or writes (shapes and strides checked in
            // `dims_of`), on candle's stream; the sync guards outlive the
            // enqueue.
            shim("forward", |err, len| unsafe {
                tt_sdpa_fwd(
                    dims,
                    ordinal,
                    stream.cu_stream() as *mut c_void,
                    at(q_ptr, ql, elem),
                    at(k_ptr, kl, elem),
                    at(v_ptr, vl, elem),
                    o_ptr as *mut c_void,
                    stats_ptr as *mut c_void,
                    ragged
                        .as_ref()
                        .map_or(std::ptr::null(), |r| r as *const SdpaRagged),
                    ws_ptr as *mut c_void,
                    err,
                    len,
                )
            })?;
        }
        drop(ws);
        *self.stats.lock().expect("stats lock poisoned") = stats;
        Ok((CudaStorage::wrap_cuda_slice(out, dev), shape))
    }

    #[allow(clippy::too_many_arguments)]
    fn bwd_typed<T: CudaDType + DeviceRepr + ValidAsZeroBits>(
        &self,
        dims: &SdpaDims,
        dev: &CudaDevice,
        (q, ql): (&CudaStorage, &Layout),
        (k, kl): (&CudaStorage, &Layout),
        (v, vl): (&CudaStorage, &Layout),
        (o, ol): (&CudaStorage, &Layout),
        (d_o, dol): (&CudaStorage, &Layout),
        stats: &CudaSlice<f32>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let stream = stream_of(dev)?;
        let ordinal = stream.context().ordinal() as c_int;
        let elem = std::mem::size_of::<T>();
        let (b, h, h_kv, l, d) = (
            dims.b as usize,
            dims.h as usize,
            dims.h_kv as usize,
            dims.l as usize,
            dims.d as usize,
        );
        let mut ws_bytes = 0i64;
        // SAFETY: as in the forward.
        shim("backward workspace", |err, len| unsafe {
            tt_sdpa_bwd_workspace(dims, ordinal, &mut ws_bytes, err, len)
        })?;
        let mut ws = workspace(dev, ws_bytes)?;
        let ragged = self.ragged_ptrs(&stream)?;
        let (q_shape, kv_shape) = match &self.ragged {
            Some(r) => ((1, r.tokens, h, d), (1, r.tokens, h_kv, d)),
            None => ((b, h, l, d), (b, h_kv, l, d)),
        };
        let count = |s: (usize, usize, usize, usize)| s.0 * s.1 * s.2 * s.3;
        let (mut dq, mut dk, mut dv) = if self.ragged.is_some() {
            // Positions outside every sequence get a zero gradient.
            (
                dev.alloc_zeros::<T>(count(q_shape))?,
                dev.alloc_zeros::<T>(count(kv_shape))?,
                dev.alloc_zeros::<T>(count(kv_shape))?,
            )
        } else {
            // SAFETY: cuDNN writes every element of the three gradients.
            unsafe {
                (
                    dev.alloc::<T>(count(q_shape))?,
                    dev.alloc::<T>(count(kv_shape))?,
                    dev.alloc::<T>(count(kv_shape))?,
                )
            }
        };
        {
            let (q_ptr, _q) = q.as_cuda_slice::<T>()?.device_ptr(&stream);
            let (k_ptr, _k) = k.as_cuda_slice::<T>()?.device_ptr(&stream);
            let (v_ptr, _v) = v.as_cuda_slice::<T>()?.device_ptr(&stream);
            let (o_ptr, _o) = o.as_cuda_slice::<T>()?.device_ptr(&stream);
            let (do_ptr, _do) = d_o.as_cuda_slice::<T>()?.device_ptr(&stream);
            let (stats_ptr, _stats) = stats.device_ptr(&stream);
            let (dq_ptr, _dq) = dq.device_ptr_mut(&stream);
            let (dk_ptr, _dk) = dk.device_ptr_mut(&stream);
            let (dv_ptr, _dv) = dv.device_ptr_mut(&stream);
            let (ws_ptr, _ws) = match ws.as_mut() {
                Some(w) => {
                    let (p, sync) = w.device_ptr_mut(&stream);
                    (p, Some(sync))
                }
                None => (0, None),
            };
            // SAFETY: as in the forward; `o` and `d_o` are contiguous
            // (B, H, L, D), checked by the caller.
            shim("backward", |err, len| unsafe {
                tt_sdpa_bwd(
                    dims,
                    ordinal,
                    stream.cu_stream() as *mut c_void,
                    at(q_ptr, ql, elem),
                    at(k_ptr, kl, elem),
                    at(v_ptr, vl, elem),
                    at(o_ptr, ol, elem),
                    at(do_ptr, dol, elem),
                    stats_ptr as *const c_void,
                    dq_ptr as *mut c_void,
                    dk_ptr as *mut c_void,
                    dv_ptr as *mut c_void,
                    ragged
                        .as_ref()
                        .map_or(std::ptr::null(), |r| r as *const SdpaRagged),
                    ws_ptr as *mut c_void,
                    err,
                    len,
                )
            })?;
        }
        drop(ws);
        let wrap = |s: CudaSlice<T>, shape: (usize, usize, usize, usize)| {
            Tensor::from_storage(
                Storage::Cuda(CudaStorage::wrap_cuda_slice(s, dev.clone())),
                shape,
                BackpropOp::none(),
                false,
            )
        };
        Ok((wrap(dq, q_shape), wrap(dk, kv_shape), wrap(dv, kv_shape)))
    }
}

fn cuda_storage<'a>(storage: &'a Storage, name: &str) -> Result<&'a CudaStorage> {
    match storage {
        Storage::Cuda(s) => Ok(s),
        _ => bail!("cuDNN attention: {name} is not on a CUDA device"),
    }
}

impl CustomOp3 for CausalSdpa {
    fn name(&self) -> &'static str {
        "cudnn-causal-sdpa"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!(
            "fused cuDNN attention runs only on a CUDA device (a build with the `cudnn` feature); use the plain attention path on CPU"
        )
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        ql: &Layout,
        k: &CudaStorage,
        kl: &Layout,
        v: &CudaStorage,
        vl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dtype = q.dtype();
        if k.dtype() != dtype || v.dtype() != dtype {
            bail!("cuDNN attention: q, k and v must share one dtype");
        }
        let dims = dims_of(
            ql,
            kl,
            vl,
            dtype,
            self.scale,
            self.with_stats,
            self.ragged.as_ref(),
        )?;
        match dtype {
            DType::BF16 => self.fwd::<bf16>(&dims, (q, ql), (k, kl), (v, vl)),
            DType::F16 => self.fwd::<f16>(&dims, (q, ql), (k, kl), (v, vl)),
            other => bail!("cuDNN attention: dtype {other:?} is not supported; use bf16 or f16"),
        }
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let stats_guard = self.stats.lock().expect("stats lock poisoned");
        let Some(stats) = stats_guard.as_ref() else {
            bail!(
                "cuDNN attention: backward without saved softmax statistics (the forward ran on inputs that tracked no gradient)"
            );
        };
        // cuDNN's backward reads O and dO with one layout: both contiguous.
        let out = out.contiguous()?;
        let grad_out = grad_out.to_dtype(out.dtype())?.contiguous()?;
        if grad_out.dims() != out.dims() {
            bail!(
                "cuDNN attention: gradient {:?} does not match the output {:?}",
                grad_out.dims(),
                out.dims()
            );
        }
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let (os, ol) = out.storage_and_layout();
        let (gs, gl) = grad_out.storage_and_layout();
        let qs = cuda_storage(&qs, "q")?;
        let ks = cuda_storage(&ks, "k")?;
        let vs = cuda_storage(&vs, "v")?;
        let os = cuda_storage(&os, "the output")?;
        let gs = cuda_storage(&gs, "the output gradient")?;
        let dtype = q.dtype();
        let dims = dims_of(ql, kl, vl, dtype, self.scale, false, self.ragged.as_ref())?;
        let (dq, dk, dv) = match dtype {
            DType::BF16 => self.bwd_typed::<bf16>(
                &dims,
                &qs.device,
                (qs, ql),
                (ks, kl),
                (vs, vl),
                (os, ol),
                (gs, gl),
                stats,
            )?,
            DType::F16 => self.bwd_typed::<f16>(
                &dims,
                &qs.device,
                (qs, ql),
                (ks, kl),
                (vs, vl),
                (os, ol),
                (gs, gl),
                stats,
            )?,
            other => bail!("cuDNN attention: dtype {other:?} is not supported; use bf16 or f16"),
        };
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    #[test]
    fn layouts_cudnn_reads_without_a_copy() {
        let dev = Device::Cpu;
        let blhd = Tensor::zeros((2, 16, 4, 64), DType::BF16, &dev).unwrap();
        let t = blhd.transpose(1, 2).unwrap(); // (B, H, L, D) view
        assert_eq!(
            strides_for(t.layout(), DType::BF16),
            Some([16 * 4 * 64, 64, 4 * 64, 1])
        );
        let c = t.contiguous().unwrap();
        assert_eq!(
            strides_for(c.layout(), DType::BF16),
            Some([4 * 16 * 64, 16 * 64, 64, 1])
        );
        // Head dimension not innermost: needs a copy.
        let bad = Tensor::zeros((2, 4, 64, 16), DType::BF16, &dev)
            .unwrap()
            .transpose(2, 3)
            .unwrap();
        assert_eq!(strides_for(bad.layout(), DType::BF16), None);
        // Size-1 batch: its stride is irrelevant.
        let one = Tensor::zeros((1, 16, 4, 64), DType::BF16, &dev)
            .unwrap()
            .transpose(1, 2)
            .unwrap();
        assert!(strides_for(one.layout(), DType::BF16).is_some());
        // A start offset that breaks 16-byte alignment.
        let shifted = Tensor::zeros((2, 4, 16, 72), DType::BF16, &dev)
            .unwrap()
            .narrow(3, 4, 64)
            .unwrap();
        assert_eq!(strides_for(shifted.layout(), DType::BF16), None);
    }

    #[test]
    fn shapes_are_checked() {
        assert!(check_shapes(&[2, 32, 128, 128], &[2, 8, 128, 128], &[2, 8, 128, 128]).is_ok());
        assert!(check_shapes(&[2, 9, 64, 64], &[2, 3, 64, 64], &[2, 3, 64, 64]).is_ok());
        assert!(check_shapes(&[2, 32, 128, 128], &[2, 5, 128, 128], &[2, 5, 128, 128]).is_err());
        assert!(check_shapes(&[2, 8, 128, 100], &[2, 8, 128, 100], &[2, 8, 128, 100]).is_err());
        assert!(check_shapes(&[2, 8, 128, 64], &[2, 8, 64, 64], &[2, 8, 64, 64]).is_err());
    }

    #[test]
    fn cpu_tensors_are_refused() {
        let dev = Device::Cpu;
        let q = Tensor::zeros((1, 2, 8, 64), DType::BF16, &dev).unwrap();
        let k = Tensor::zeros((1, 1, 8, 64), DType::BF16, &dev).unwrap();
        let err = causal_sdpa(&q, &k, &k, 0.125).unwrap_err().to_string();
        assert!(err.contains("CUDA device"), "{err}");
    }
}
