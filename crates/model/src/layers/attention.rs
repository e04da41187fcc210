//! Causal scaled dot-product attention with grouped-query heads (Ainslie et
//! al. 2023, "GQA"), its additive masks, and the KV cache for decoding.
//!
//! Shared by the Qwen3 and Llama decoders: both project, normalise and
//! rotate in their own files, then call [`attend`]. Scores are softmaxed in
//! f32, as HF's eager attention does.

use candle_core::{D, DType, Device, Result, Tensor};

use crate::layers::rope::Positions;

/// Added to the score of a key a query must not see. Finite, so a row with
/// no visible key (a padding query) gives a uniform row rather than NaN.
const MASKED: f32 = -1e30;

/// Keys and values of earlier positions, one entry a layer, for one
/// sequence or a batch of left-padded ones.
///
/// Each layer's keys and values live in a buffer `(B, H_kv, capacity, D)`
/// written in place ([`Tensor::slice_set`]); attention reads the filled
/// prefix as a strided view, which both CPU gemm and cuBLAS take without a
/// copy. A decoding step thus copies only its own `L` new positions. When
/// the buffer is full it grows to twice the needed length (one copy of the
/// cache, amortised O(1) a position, at most 2x the memory in use); callers
/// that know the final length set it with [`Cache::with_capacity`] and
/// allocate once.
///
/// Rows of different prompt lengths decode together when left-padded
/// ([`Cache::with_left_padding`]): the cache then carries each row's number
/// of leading padding columns, hides those keys from every query, and gives
/// a row's column `j` the position `j - pads[row]`, so a padded row sees the
/// same keys at the same positions as it would alone.
#[derive(Debug)]
pub struct Cache {
    /// Per layer: `k, v: (B, H_kv, capacity, D)`; `None` until the first step.
    layers: Vec<Option<(Tensor, Tensor)>>,
    /// Filled columns.
    len: usize,
    /// Columns to allocate at the first step, if more than it needs.
    capacity: usize,
    /// Leading padding columns of each row; empty when no row is padded.
    pads: Vec<usize>,
    /// `(B, 1, 1, W)` f32: `MASKED` on padding columns, 0 elsewhere, `W` at
    /// least the filled length; built on first use.
    pad_mask: Option<Tensor>,
}

/// What one cached forward pass needs besides the cache: where its queries
/// sit and what they must not see.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) positions: Positions,
    /// Additive, `(1 or B, 1, L, T)`; `None` when nothing is hidden.
    pub(crate) mask: Option<Tensor>,
}

impl Clone for Cache {
    /// A deep copy: the buffers are written in place, so a clone that shared
    /// them would see (and overwrite) the other's later positions.
    fn clone(&self) -> Self {
        let copy = |l: &Option<(Tensor, Tensor)>| {
            l.as_ref()
                .map(|(k, v)| (k.copy().expect("copy k"), v.copy().expect("copy v")))
        };
        Self {
            layers: self.layers.iter().map(copy).collect(),
            len: self.len,
            capacity: self.capacity,
            pads: self.pads.clone(),
            pad_mask: self.pad_mask.clone(),
        }
    }
}

impl Cache {
    /// An empty cache for a model of `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![None; num_layers],
            len: 0,
            capacity: 0,
            pads: Vec::new(),
            pad_mask: None,
        }
    }

    /// Allocates room for `positions` columns at the first step, so that a
    /// generation of known length never grows the buffers.
    pub fn with_capacity(mut self, positions: usize) -> Self {
        self.capacity = positions;
        self
    }

    /// Row `b` starts with `pads[b]` padding columns (left padding).
    pub fn with_left_padding(mut self, pads: Vec<usize>) -> Self {
        self.pads = pads;
        self.pad_mask = None;
        self
    }

    /// Whether some row starts with padding columns.
    pub fn is_padded(&self) -> bool {
        self.pads.iter().any(|&p| p > 0)
    }

    /// Number of cached positions (columns, padding included).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Columns the buffers hold before they must grow (0 before the first step).
    pub fn capacity(&self) -> usize {
        match self.layers.first() {
            Some(Some((k, _))) => k.dim(2).unwrap_or(0),
            _ => 0,
        }
    }

    /// Layer `layer`'s key and value buffers, `(B, H_kv, capacity, D)`
    /// (columns from [`Self::len`] on are not written yet).
    #[cfg(feature = "cuda")]
    pub(crate) fn layer(&self, layer: usize) -> Option<(&Tensor, &Tensor)> {
        self.layers.get(layer)?.as_ref().map(|(k, v)| (k, v))
    }

    /// Leading padding columns of each row; empty when none is padded.
    pub fn pads(&self) -> &[usize] {
        &self.pads
    }

    /// Forgets every position and the padding.
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| *l = None);
        self.len = 0;
        self.pads.clear();
        self.pad_mask = None;
    }

    /// Keeps only the batch rows `rows` (in that order): finished rows leave
    /// the batch so that later steps stop computing them. Copies the cache
    /// once.
    pub fn retain_rows(&mut self, rows: &[usize]) -> Result<()> {
        let Some(Some((k, _))) = self.layers.first() else {
            self.pads = rows
                .iter()
                .map(|&r| self.pads.get(r).copied().unwrap_or(0))
                .collect();
            return Ok(());
        };
        let index = Tensor::from_vec(
            rows.iter().map(|&r| r as u32).collect::<Vec<_>>(),
            rows.len(),
            k.device(),
        )?;
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = k.index_select(&index, 0)?;
            *v = v.index_select(&index, 0)?;
        }
        if !self.pads.is_empty() {
            self.pads = rows.iter().map(|&r| self.pads[r]).collect();
        }
        self.pad_mask = None;
        Ok(())
    }

    /// Starts the cache at column `start`: the first step writes there, and
    /// every column before it counts as padding (each row's padding, set
    /// with [`Cache::with_left_padding`], must be at least `start`). A
    /// prompt joining a batch mid-decoding is prefilled this way so that its
    /// last token lands on the batch's last filled column
    /// ([`Cache::set_rows`]) without computing the columns before it.
    pub fn starting_at(mut self, start: usize) -> Self {
        self.len = start;
        self
    }

    /// Puts row `j` of `src` into batch row `rows[j]` of this cache: keys,
    /// values and padding. `src` must hold as many columns as this cache,
    /// in buffers of the same capacity (make it with
    /// `with_capacity(self.capacity())`). Copies the new rows only.
    pub fn set_rows(&mut self, rows: &[usize], src: &Cache) -> Result<()> {
        if src.len != self.len || src.layers.len() != self.layers.len() {
            candle_core::bail!(
                "set_rows: a cache of {} columns and {} layers into one of {} and {}",
                src.len,
                src.layers.len(),
                self.len,
                self.layers.len()
            );
        }
        let b = match self.layers.first() {
            Some(Some((k, _))) => k.dim(0)?,
            _ => candle_core::bail!("set_rows: the cache has no rows yet"),
        };
        if rows.iter().any(|&r| r >= b) || src.pads.len() < rows.len() {
            candle_core::bail!("set_rows: rows {rows:?} of a batch of {b}");
        }
        for (dst, from) in self.layers.iter().zip(&src.layers) {
            let (Some((dk, dv)), Some((sk, sv))) = (dst, from) else {
                candle_core::bail!("set_rows: a layer was never written");
            };
            for (j, &r) in rows.iter().enumerate() {
                dk.slice_set(&sk.narrow(0, j, 1)?, 0, r)?;
                dv.slice_set(&sv.narrow(0, j, 1)?, 0, r)?;
            }
        }
        if self.pads.is_empty() {
            self.pads = vec![0; b];
        }
        for (j, &r) in rows.iter().enumerate() {
            self.pads[r] = src.pads[j];
        }
        self.pad_mask = None;
        Ok(())
    }

    /// Adds `src`'s rows after this cache's (keys, values and padding):
    /// prompts joining a batch that has no free row. `src` must hold as
    /// many columns as this cache, in buffers of the same capacity. Copies
    /// the cache once.
    pub fn append_rows(&mut self, src: &Cache) -> Result<()> {
        if src.len != self.len || src.layers.len() != self.layers.len() {
            candle_core::bail!(
                "append_rows: a cache of {} columns and {} layers onto one of {} and {}",
                src.len,
                src.layers.len(),
                self.len,
                self.layers.len()
            );
        }
        let mut b = 0;
        let mut added = 0;
        for (dst, from) in self.layers.iter_mut().zip(&src.layers) {
            let (Some((dk, dv)), Some((sk, sv))) = (dst.as_mut(), from) else {
                candle_core::bail!("append_rows: a layer was never written");
            };
            if sk.dim(2)? != dk.dim(2)? {
                candle_core::bail!(
                    "append_rows: buffers of {} and {} columns",
                    sk.dim(2)?,
                    dk.dim(2)?
                );
            }
            b = dk.dim(0)?;
            added = sk.dim(0)?;
            *dk = Tensor::cat(&[&*dk, sk], 0)?;
            *dv = Tensor::cat(&[&*dv, sv], 0)?;
        }
        if self.pads.is_empty() {
            self.pads = vec![0; b];
        }
        let src_pads = if src.pads.is_empty() {
            vec![0; added]
        } else {
            src.pads.clone()
        };
        self.pads.extend(src_pads);
        self.pad_mask = None;
        Ok(())
    }

    /// Grows the buffers, if need be, to hold `columns` columns (one copy).
    pub fn reserve(&mut self, columns: usize) -> Result<()> {
        self.capacity = self.capacity.max(columns);
        for (k, v) in self.layers.iter_mut().flatten() {
            let (b, h, cap, d) = k.dims4()?;
            if cap < columns {
                let zeros = Tensor::zeros((b, h, columns - cap, d), k.dtype(), k.device())?;
                *k = Tensor::cat(&[&*k, &zeros], 2)?;
                *v = Tensor::cat(&[&*v, &zeros], 2)?;
            }
        }
        Ok(())
    }

    /// Prepends `c` padding columns to every row: room for a joining prompt
    /// longer than the filled length. Copies the cache once.
    pub fn grow_front(&mut self, c: usize) -> Result<()> {
        if c == 0 {
            return Ok(());
        }
        let mut b = self.pads.len();
        for (k, v) in self.layers.iter_mut().flatten() {
            let (rows, h, _, d) = k.dims4()?;
            b = rows;
            let zeros = Tensor::zeros((rows, h, c, d), k.dtype(), k.device())?;
            *k = Tensor::cat(&[&zeros, &*k], 2)?;
            *v = Tensor::cat(&[&zeros, &*v], 2)?;
        }
        if self.pads.is_empty() {
            self.pads = vec![0; b];
        }
        self.pads.iter_mut().for_each(|p| *p += c);
        self.len += c;
        self.capacity += c;
        self.pad_mask = None;
        Ok(())
    }

    /// Drops the first `c` columns, padding in every row of `live` (rows
    /// not listed hold nothing anyone reads; their padding is cut to what
    /// is left). Positions do not change: a row's column and its padding
    /// both move by `c`. Copies the cache once.
    pub fn trim_front(&mut self, c: usize, live: &[usize]) -> Result<()> {
        if c == 0 {
            return Ok(());
        }
        if c >= self.len
            || live
                .iter()
                .any(|&r| self.pads.get(r).copied().unwrap_or(0) < c)
        {
            candle_core::bail!(
                "trim_front: {c} of {} columns are not padding in every live row",
                self.len
            );
        }
        for (k, v) in self.layers.iter_mut().flatten() {
            let cap = k.dim(2)?;
            *k = k.narrow(2, c, cap - c)?.contiguous()?;
            *v = v.narrow(2, c, cap - c)?.contiguous()?;
        }
        self.pads.iter_mut().for_each(|p| *p = p.saturating_sub(c));
        self.len -= c;
        self.capacity = self.capacity.saturating_sub(c);
        self.pad_mask = None;
        Ok(())
    }

    /// Checks a step of `(B, L)` ids at `offset` against the cache and
    /// returns its positions and mask.
    pub(crate) fn frame(
        &mut self,
        b: usize,
        l: usize,
        offset: usize,
        device: &Device,
    ) -> Result<Frame> {
        if l == 0 {
            candle_core::bail!("forward_with_cache needs at least one token");
        }
        if self.len != offset {
            candle_core::bail!("cache holds {} positions but offset is {offset}", self.len);
        }
        if !self.pads.is_empty() && self.pads.len() != b {
            candle_core::bail!(
                "the cache is padded for {} rows but the step has {b}",
                self.pads.len()
            );
        }
        let causal = causal(l, offset, device)?;
        if !self.pads.iter().any(|&p| p > 0) {
            return Ok(Frame {
                positions: Positions::Offset(offset),
                mask: causal,
            });
        }
        let total = offset + l;
        let positions: Vec<u32> = self
            .pads
            .iter()
            .flat_map(|&p| (offset..total).map(move |j| j.saturating_sub(p) as u32))
            .collect();
        let positions = Tensor::from_vec(positions, (b, l), device)?;
        let hidden = self.pad_mask(total, device)?.narrow(3, 0, total)?; // (B, 1, 1, T)
        let mask = match causal {
            Some(causal) => causal.broadcast_add(&hidden)?, // (B, 1, L, T)
            None => hidden,
        };
        Ok(Frame {
            positions: Positions::PerRow(positions),
            mask: Some(mask),
        })
    }

    /// The padding mask, at least `width` columns wide.
    fn pad_mask(&mut self, width: usize, device: &Device) -> Result<&Tensor> {
        let stale = match &self.pad_mask {
            Some(m) => m.dim(3)? < width,
            None => true,
        };
        if stale {
            let width = width.max(self.capacity).max(self.capacity());
            let values: Vec<f32> = self
                .pads
                .iter()
                .flat_map(|&p| (0..width).map(move |j| if j < p { MASKED } else { 0.0 }))
                .collect();
            self.pad_mask = Some(Tensor::from_vec(
                values,
                (self.pads.len(), 1, 1, width),
                device,
            )?);
        }
        Ok(self.pad_mask.as_ref().expect("just built"))
    }

    /// Writes `k, v: (B, H_kv, L, D)` into layer `layer` at the filled
    /// length and returns all of that layer's keys and values,
    /// `(B, H_kv, T + L, D)` views of the buffers. [`Cache::advance`] moves
    /// the filled length once every layer has written.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let (b, h, l, d) = k.dims4()?;
        let needed = self.len + l;
        let slot = &mut self.layers[layer];
        match slot {
            None => {
                let cap = needed.max(self.capacity);
                let zeros = || Tensor::zeros((b, h, cap, d), k.dtype(), k.device());
                *slot = Some((zeros()?, zeros()?));
            }
            Some((pk, pv)) if pk.dim(2)? < needed => {
                // Doubling keeps the copies amortised O(1) a position.
                let extra = (2 * needed).max(64) - pk.dim(2)?;
                let grow = |t: &Tensor| -> Result<Tensor> {
                    let zeros = Tensor::zeros((b, h, extra, d), t.dtype(), t.device())?;
                    Tensor::cat(&[t, &zeros], 2)
                };
                *pk = grow(pk)?;
                *pv = grow(pv)?;
            }
            Some(_) => {}
        }
        let (pk, pv) = slot.as_ref().expect("allocated above");
        pk.slice_set(&k.contiguous()?, 2, self.len)?;
        pv.slice_set(&v.contiguous()?, 2, self.len)?;
        Ok((pk.narrow(2, 0, needed)?, pv.narrow(2, 0, needed)?))
    }

    /// Marks `l` more columns filled, after every layer appended them.
    pub(crate) fn advance(&mut self, l: usize) {
        self.len += l;
    }
}

/// The additive causal mask `(1, 1, L, T)` of `len` queries at positions
/// `offset..` over keys `0..offset + len`; `None` for one query.
fn causal(len: usize, offset: usize, device: &Device) -> Result<Option<Tensor>> {
    if len <= 1 {
        return Ok(None);
    }
    let total = offset + len;
    let values: Vec<f32> = (0..len)
        .flat_map(|i| (0..total).map(move |j| if j <= offset + i { 0.0 } else { MASKED }))
        .collect();
    Ok(Some(Tensor::from_vec(values, (1, 1, len, total), device)?))
}

/// The additive mask for `len` queries at positions `offset..offset + len`
/// over keys `0..offset + len`: `(1, 1, L, T)`, or `(B, 1, L, T)` when
/// `padding: (B, T)` (1 = token, 0 = padding, any dtype) hides keys too.
/// `None` when nothing needs hiding (one query, no padding).
pub fn mask(
    len: usize,
    offset: usize,
    padding: Option<&Tensor>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let total = offset + len;
    let causal = causal(len, offset, device)?;
    let Some(padding) = padding else {
        return Ok(causal);
    };
    let (b, t) = padding.dims2()?;
    if t != total {
        candle_core::bail!("attention mask covers {t} positions, expected {total}");
    }
    // (B, T) of 1/0 -> (B, 1, 1, T) of 0/MASKED
    let hidden =
        ((padding.to_dtype(DType::F32)? - 1.0)? * (-MASKED as f64))?.reshape((b, 1, 1, t))?;
    match causal {
        Some(causal) => Ok(Some(causal.broadcast_add(&hidden)?)),
        None => Ok(Some(hidden)),
    }
}

/// `softmax(q k^T / sqrt(D) + mask) v` with `q: (B, H, L, D)`,
/// `k, v: (B, H_kv, T, D)`, `mask: (B or 1, 1, L, T)`; returns `(B, H, L, D)`.
///
/// Query head `h` reads key head `h / (H / H_kv)`, as HF's `repeat_kv`,
/// without materialising the repeated keys: the `H / H_kv` query heads of a
/// group are stacked along the length instead.
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    let (b, h, l, d) = q.dims4()?;
    let (_, h_kv, t, _) = k.dims4()?;
    let groups = h / h_kv;
    let q = q.contiguous()?.reshape((b, h_kv, groups * l, d))?; // (B, H_kv, G*L, D)
    let scores = q.matmul(&gemm_ready(k)?.t()?)?; // (B, H_kv, G*L, T)
    #[cfg(feature = "cuda")]
    if scores.device().is_cuda() && !scores.track_op() {
        // Inference on CUDA: one kernel for the five element-wise ops below.
        let scale = (1.0 / (d as f64).sqrt()) as f32;
        let probs = cuda::scaled_masked_softmax(&scores, mask, h * l, l, scale)?;
        return probs.matmul(&gemm_ready(v)?)?.reshape((b, h, l, d));
    }
    let scores =
        (scores.to_dtype(DType::F32)? * (1.0 / (d as f64).sqrt()))?.reshape((b, h, l, t))?;
    let scores = match mask {
        Some(mask) => scores.broadcast_add(mask)?,
        None => scores,
    };
    let probs = if scores.track_op() {
        candle_nn::ops::softmax(&scores, D::Minus1)?
    } else {
        candle_nn::ops::softmax_last_dim(&scores)?
    };
    let probs = probs
        .to_dtype(v.dtype())?
        .reshape((b, h_kv, groups * l, t))?;
    // The cache's value prefix is read in place, as its keys are: no copy
    // of every cached value each step.
    probs.matmul(&gemm_ready(v)?)?.reshape((b, h, l, d)) // (B, H_kv, G*L, D) -> (B, H, L, D)
}

/// The softmax of inference attention on CUDA (`kernels/attention.cu`).
#[cfg(feature = "cuda")]
mod cuda {
    use crate::cuda::kernels;
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
    use candle_core::op::BackpropOp;
    use candle_core::{DType, Result, Storage, Tensor, bail};
    use half::{bf16, f16};

    /// A contiguous copy of the 4-d view `t` when its last dimension is
    /// contiguous and its rows 16-byte aligned (`copy_rows_16`: 16 bytes a
    /// thread, where candle's strided copy computes an index an element);
    /// any other layout through [`Tensor::contiguous`].
    pub fn contiguous_rows(t: &Tensor) -> Result<Tensor> {
        match t.dtype() {
            DType::BF16 => rows::<bf16>(t),
            DType::F16 => rows::<f16>(t),
            DType::F32 => rows::<f32>(t),
            _ => t.contiguous(),
        }
    }

    fn rows<T: CudaDType + DeviceRepr>(t: &Tensor) -> Result<Tensor> {
        let Ok((_, x, y, r)) = t.dims4() else {
            return t.contiguous();
        };
        let unit = 16 / t.dtype().size_in_bytes(); // elements in 16 bytes
        let st = t.stride();
        let aligned = |v: usize| v.is_multiple_of(unit);
        if t.is_contiguous()
            || !t.device().is_cuda()
            || t.elem_count() == 0
            || st[3] != 1
            || !aligned(r)
            || !st[..3].iter().all(|&s| aligned(s))
            || !aligned(t.layout().start_offset())
        {
            return t.contiguous();
        }
        let (ss, sl) = t.storage_and_layout();
        let Storage::Cuda(cs) = &*ss else {
            bail!("contiguous_rows: expected a CUDA tensor");
        };
        let dev = cs.device.clone();
        let src = cs.as_cuda_slice::<T>()?.slice(sl.start_offset()..);
        // SAFETY: the kernel writes every element.
        let mut out = unsafe { dev.alloc::<T>(t.elem_count()) }?;
        let func = kernels::kernel(&dev, &kernels::ATTENTION, "copy_rows_16")?;
        let n = (t.elem_count() / unit) as i64;
        let (x32, y32, v32) = (x as i32, y as i32, (r / unit) as i32);
        let (s0, s1, s2) = (
            (st[0] / unit) as i64,
            (st[1] / unit) as i64,
            (st[2] / unit) as i64,
        );
        let config = LaunchConfig {
            grid_dim: ((n as u64).div_ceil(256).min(132 * 16) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = func.builder();
        builder.arg(&src);
        builder.arg(&mut out);
        builder.arg(&n);
        builder.arg(&x32);
        builder.arg(&y32);
        builder.arg(&v32);
        builder.arg(&s0);
        builder.arg(&s1);
        builder.arg(&s2);
        // SAFETY: the view's rows are 16-byte aligned and its strides are
        // whole 16-byte units (checked above); `out` holds every element.
        unsafe { builder.launch(config) }.w()?;
        drop(ss);
        let storage = CudaStorage::wrap_cuda_slice(out, dev);
        Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            t.shape().clone(),
            BackpropOp::none(),
            false,
        ))
    }

    /// `softmax(scores * scale + mask)` over the last dimension of the
    /// contiguous `scores: (B, .., T)` whose rows are (batch, head, query),
    /// `per_batch` rows a batch and `queries` a head; `mask: (B or 1, 1,
    /// L or 1, T)` f32. In `scores`' dtype, f32 inside.
    pub fn scaled_masked_softmax(
        scores: &Tensor,
        mask: Option<&Tensor>,
        per_batch: usize,
        queries: usize,
        scale: f32,
    ) -> Result<Tensor> {
        let scores = scores.contiguous()?;
        match scores.dtype() {
            DType::F32 => launch::<f32>(&scores, mask, per_batch, queries, scale, "f32"),
            DType::BF16 => launch::<bf16>(&scores, mask, per_batch, queries, scale, "bf16"),
            DType::F16 => launch::<f16>(&scores, mask, per_batch, queries, scale, "f16"),
            other => bail!("attention softmax takes f32, bf16 or f16, not {other:?}"),
        }
    }

    fn launch<T: CudaDType + DeviceRepr>(
        scores: &Tensor,
        mask: Option<&Tensor>,
        per_batch: usize,
        queries: usize,
        scale: f32,
        suffix: &str,
    ) -> Result<Tensor> {
        let t = scores.dim(candle_core::D::Minus1)?;
        let rows = scores.elem_count() / t;
        let mask = match mask {
            Some(m) => {
                let m = m.to_dtype(DType::F32)?;
                let (mb, _, ml, mt) = m.dims4()?;
                let st = m.stride();
                if mt != t || st[3] != 1 || (ml != 1 && ml != queries) {
                    bail!(
                        "attention mask {:?} for {t} keys, {queries} queries",
                        m.dims()
                    );
                }
                let b = if mb == 1 { 0 } else { st[0] as i64 };
                let i = if ml == 1 { 0 } else { st[2] as i64 };
                Some((m, b, i))
            }
            None => None,
        };
        let (ss, sl) = scores.storage_and_layout();
        let Storage::Cuda(cs) = &*ss else {
            bail!("attention softmax: expected a CUDA tensor");
        };
        let dev = cs.device.clone();
        let s = cs
            .as_cuda_slice::<T>()?
            .slice(sl.start_offset()..sl.start_offset() + rows * t);
        // SAFETY: every element is written by the kernel.
        let mut p = unsafe { dev.alloc::<T>(rows * t) }?;
        let func = kernels::kernel(
            &dev,
            &kernels::ATTENTION,
            &format!("scaled_masked_softmax_{suffix}"),
        )?;
        let (t32, pb32, q32) = (t as i32, per_batch as i32, queries as i32);
        let config = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        match &mask {
            Some((m, mask_b, mask_i)) => {
                let (ms, ml) = m.storage_and_layout();
                let Storage::Cuda(mc) = &*ms else {
                    bail!("attention mask: expected a CUDA tensor");
                };
                let mv = mc.as_cuda_slice::<f32>()?.slice(ml.start_offset()..);
                let mut builder = func.builder();
                builder.arg(&s);
                builder.arg(&mv);
                builder.arg(&mut p);
                builder.arg(&t32);
                builder.arg(&pb32);
                builder.arg(&q32);
                builder.arg(mask_b);
                builder.arg(mask_i);
                builder.arg(&scale);
                // SAFETY: the arguments match `scaled_masked_softmax_*`;
                // the mask's strides were read from its layout and checked.
                unsafe { builder.launch(config) }.w()?;
            }
            None => {
                let (none, zero): (u64, i64) = (0, 0); // a null mask pointer
                let mut builder = func.builder();
                builder.arg(&s);
                builder.arg(&none);
                builder.arg(&mut p);
                builder.arg(&t32);
                builder.arg(&pb32);
                builder.arg(&q32);
                builder.arg(&zero);
                builder.arg(&zero);
                builder.arg(&scale);
                // SAFETY: as above, with no mask (the kernel checks null).
                unsafe { builder.launch(config) }.w()?;
            }
        }
        drop(ss);
        let storage = CudaStorage::wrap_cuda_slice(p, dev);
        Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            scores.shape().clone(),
            BackpropOp::none(),
            false,
        ))
    }
}

/// A contiguous copy of `t`; on CUDA a 4-d view whose rows (last
/// dimension) are contiguous and 16-byte aligned, such as a head-transposed
/// `(B, L, H, D)`, moves 16 bytes a thread.
pub fn contiguous_rows(t: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    {
        cuda::contiguous_rows(t)
    }
    #[cfg(not(feature = "cuda"))]
    {
        t.contiguous()
    }
}

/// Whether [`attend_causal_fused`] serves inputs of this dtype, device and
/// head size: the `cudnn` build on a CUDA device, bf16 or f16, `D` a
/// multiple of 8 up to 128.
pub fn fused_available(dtype: DType, device: &Device, head_dim: usize) -> bool {
    cfg!(feature = "cudnn")
        && device.is_cuda()
        && matches!(dtype, DType::BF16 | DType::F16)
        && head_dim.is_multiple_of(8)
        && head_dim <= 128
}

/// Causal attention without a score matrix, forward and backward (cuDNN's
/// fused SDPA): `q: (B, H, L, D)`, `k, v: (B, H_kv, L, D)` -> `(B, H, L,
/// D)`. Query `i` sees keys `0..=i`; no padding mask, which right padding
/// does not need (a real token never sees a later column).
pub fn attend_causal_fused(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let d = q.dim(3)?;
    #[cfg(feature = "cudnn")]
    {
        crate::cuda::sdpa_cudnn::causal_sdpa(q, k, v, (1.0 / (d as f64).sqrt()) as f32)
    }
    #[cfg(not(feature = "cudnn"))]
    {
        let _ = (k, v);
        candle_core::bail!("fused attention (head size {d}) needs the `cudnn` build")
    }
}

/// `(dq, dk, dv)` of [`attend`] for the output gradient `d_o: (B, H, L,
/// D)`, written by hand: with `P` the softmax recomputed once, `dV = P^T
/// dO`, `dP = dO V^T`, `dS = P (dP - rowsum(dP P))`, `dQ = dS K / sqrt(D)`,
/// `dK = dS^T Q / sqrt(D)`. A query group's heads are stacked along the
/// length as in [`attend`], so `dK` and `dV` come out summed over each
/// group. About four score-sized tensors live at once (autograd kept a
/// dozen).
pub fn attend_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    d_o: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, h, l, d) = q.dims4()?;
    let (_, h_kv, t, _) = k.dims4()?;
    let groups = h / h_kv;
    let scale = 1.0 / (d as f64).sqrt();
    let dtype = q.dtype();
    let qg = q.contiguous()?.reshape((b, h_kv, groups * l, d))?; // (B, H_kv, G*L, D)
    let (k, v) = (k.contiguous()?, v.contiguous()?);
    let scores = (qg.matmul(&k.t()?)?.to_dtype(DType::F32)? * scale)?.reshape((b, h, l, t))?;
    let scores = match mask {
        Some(mask) => scores.broadcast_add(mask)?,
        None => scores,
    };
    let p = candle_nn::ops::softmax_last_dim(&scores)?.reshape((b, h_kv, groups * l, t))?;
    drop(scores);
    let dog = d_o.contiguous()?.reshape((b, h_kv, groups * l, d))?;
    let dv = p.to_dtype(dtype)?.t()?.matmul(&dog)?; // (B, H_kv, T, D)
    let dp = dog.matmul(&v.t()?)?.to_dtype(DType::F32)?; // (B, H_kv, G*L, T)
    let rowsum = (&dp * &p)?.sum_keepdim(D::Minus1)?;
    let ds = (dp.broadcast_sub(&rowsum)? * p)?.to_dtype(dtype)?;
    let dq = (ds.matmul(&k)? * scale)?.reshape((b, h, l, d))?;
    let dk = (ds.t()?.matmul(&qg)? * scale)?;
    Ok((dq, dk, dv))
}

/// `x: (B, H, T, D)` as a batched matmul can read it in place: rows of `D`
/// contiguous, `T` rows a stride `D` apart, and `(B, H)` one batch stride.
/// A prefix view of the cache's buffers is such a tensor; anything else is
/// copied.
fn gemm_ready(x: &Tensor) -> Result<Tensor> {
    let (_, h, _, d) = x.dims4()?;
    let s = x.stride();
    if s[3] == 1 && s[2] == d && s[0] == s[1] * h {
        Ok(x.clone())
    } else {
        x.contiguous()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(m: &Tensor) -> Vec<f32> {
        m.flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn causal_mask_with_offset_hides_the_future_only() {
        let m = mask(2, 1, None, &Device::Cpu).unwrap().unwrap();
        assert_eq!(m.dims(), &[1, 1, 2, 3]);
        assert_eq!(values(&m), [0.0, 0.0, MASKED, 0.0, 0.0, 0.0]);
        assert!(mask(1, 5, None, &Device::Cpu).unwrap().is_none());
    }

    #[test]
    fn padding_hides_keys() {
        let pad = Tensor::new(&[[1u32, 1, 0]], &Device::Cpu).unwrap();
        let m = mask(3, 0, Some(&pad), &Device::Cpu).unwrap().unwrap();
        assert_eq!(m.dims(), &[1, 1, 3, 3]);
        let v = values(&m);
        let hidden: Vec<bool> = v.iter().map(|x| *x < -1e29).collect();
        // Row i sees keys j <= i that are tokens: key 2 (padding) never.
        assert_eq!(
            hidden,
            [false, true, true, false, false, true, false, false, true]
        );
    }

    #[test]
    fn left_padding_gives_rows_their_own_positions_and_hides_pads() {
        let dev = Device::Cpu;
        let per_row = |f: &Frame| match &f.positions {
            Positions::PerRow(p) => p.to_vec2::<u32>().unwrap(),
            Positions::Offset(o) => panic!("offset {o}"),
        };
        let hidden = |f: &Frame| -> Vec<bool> {
            values(f.mask.as_ref().unwrap())
                .iter()
                .map(|x| *x < -1e29)
                .collect()
        };
        let mut cache = Cache::new(1).with_left_padding(vec![2, 0]);
        let prefill = cache.frame(2, 3, 0, &dev).unwrap();
        assert_eq!(per_row(&prefill), [[0, 0, 0], [0, 1, 2]]);
        assert_eq!(prefill.mask.as_ref().unwrap().dims(), &[2, 1, 3, 3]);
        #[rustfmt::skip]
        let expected = [
            true, true, true,  true, true, true,  true, true, false, // row 0: keys 0, 1 are padding
            false, true, true,  false, false, true,  false, false, false, // row 1: causal only
        ];
        assert_eq!(hidden(&prefill), expected);
        cache.advance(3);
        let step = cache.frame(2, 1, 3, &dev).unwrap();
        assert_eq!(per_row(&step), [[1], [3]]);
        assert_eq!(
            hidden(&step),
            [true, true, false, false, false, false, false, false]
        );
        assert!(cache.frame(2, 1, 2, &dev).is_err(), "wrong offset");
        assert!(cache.frame(3, 1, 3, &dev).is_err(), "wrong batch");
        // Unpadded rows keep the plain offset and need no mask for one query.
        let mut plain = Cache::new(1).with_left_padding(vec![0, 0]);
        let f = plain.frame(2, 1, 0, &dev).unwrap();
        assert!(matches!(f.positions, Positions::Offset(0)) && f.mask.is_none());
    }

    #[test]
    fn buffers_grow_keep_their_contents_and_clones_are_deep() {
        let dev = Device::Cpu;
        let col = |x: f32| Tensor::full(x, (1, 1, 1, 2), &dev).unwrap();
        let mut cache = Cache::new(1);
        let mut seen = Vec::new();
        for t in 0..70 {
            let (k, _) = cache.append(0, &col(t as f32), &col(-(t as f32))).unwrap();
            cache.advance(1);
            seen.push(t as f32);
            assert_eq!(k.dims(), &[1, 1, t + 1, 2]);
            let keys: Vec<f32> = k.flatten_all().unwrap().to_vec1().unwrap();
            assert_eq!(keys.iter().step_by(2).copied().collect::<Vec<_>>(), seen);
        }
        // 1 column, then 64, then 2 * 65.
        assert_eq!(cache.capacity(), 130);
        let mut copy = cache.clone();
        copy.append(0, &col(100.0), &col(0.0)).unwrap();
        let (k, _) = cache.append(0, &col(7.0), &col(0.0)).unwrap();
        let last: Vec<f32> = k
            .narrow(2, 70, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(last, [7.0, 7.0]);
        // A preallocated cache never grows.
        let mut sized = Cache::new(1).with_capacity(10);
        sized.append(0, &col(1.0), &col(1.0)).unwrap();
        assert_eq!(sized.capacity(), 10);
    }

    #[test]
    fn retained_rows_keep_their_keys_and_padding() {
        let dev = Device::Cpu;
        let k = Tensor::arange(0f32, 3. * 2., &dev)
            .unwrap()
            .reshape((3, 1, 1, 2))
            .unwrap();
        let mut cache = Cache::new(1).with_left_padding(vec![0, 1, 0]);
        cache.append(0, &k, &k).unwrap();
        cache.advance(1);
        cache.retain_rows(&[2, 1]).unwrap();
        assert_eq!(cache.pads(), [0, 1]);
        let (k, _) = cache
            .append(0, &k.narrow(0, 0, 2).unwrap(), &k.narrow(0, 0, 2).unwrap())
            .unwrap();
        let first: Vec<f32> = k
            .narrow(2, 0, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(first, [4.0, 5.0, 2.0, 3.0]);
    }

    #[test]
    fn rows_join_trim_and_grow_keeping_keys_and_positions() {
        let dev = Device::Cpu;
        let keys = |c: &mut Cache, b: usize| -> Vec<Vec<f32>> {
            let z = Tensor::zeros((b, 1, 1, 1), DType::F32, &dev).unwrap();
            let (k, _) = c.append(0, &z, &z).unwrap();
            (0..b)
                .map(|r| {
                    k.narrow(0, r, 1)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1()
                        .unwrap()
                })
                .collect()
        };
        // Two rows, three columns: row 0 padded by 1.
        let mut cache = Cache::new(1).with_capacity(6).with_left_padding(vec![1, 0]);
        let k = Tensor::new(&[[[[1f32], [2.], [3.]]], [[[4.], [5.], [6.]]]], &dev).unwrap();
        cache.append(0, &k, &k).unwrap();
        cache.advance(3);
        // A one-token prompt joins row 1 at column 2.
        let mut fresh = Cache::new(1)
            .with_capacity(cache.capacity())
            .with_left_padding(vec![2])
            .starting_at(2);
        let f = fresh.frame(1, 1, 2, &dev).unwrap();
        assert!(
            matches!(&f.positions, Positions::PerRow(p) if p.to_vec2::<u32>().unwrap() == [[0]])
        );
        fresh
            .append(
                0,
                &Tensor::new(&[[[[9f32]]]], &dev).unwrap(),
                &k.narrow(0, 0, 1).unwrap().narrow(2, 0, 1).unwrap(),
            )
            .unwrap();
        fresh.advance(1);
        assert!(
            cache.set_rows(&[1], &Cache::new(1)).is_err(),
            "other length"
        );
        cache.set_rows(&[1], &fresh).unwrap();
        assert_eq!(cache.pads(), [1, 2]);
        assert_eq!(
            keys(&mut cache, 2),
            [vec![1., 2., 3., 0.], vec![0., 0., 9., 0.]]
        );
        // Column 0 is padding in both rows: it can go, positions stay.
        assert!(
            cache.trim_front(2, &[0, 1]).is_err(),
            "row 0's column 1 is a token"
        );
        cache.trim_front(1, &[0, 1]).unwrap();
        assert_eq!((cache.len(), cache.pads()), (2, &[0usize, 1][..]));
        assert_eq!(keys(&mut cache, 2), [vec![2., 3., 0.], vec![0., 9., 0.]]);
        let f = cache.frame(2, 1, 2, &dev).unwrap();
        assert!(
            matches!(&f.positions, Positions::PerRow(p) if p.to_vec2::<u32>().unwrap() == [[2], [1]])
        );
        cache.grow_front(2).unwrap();
        assert_eq!((cache.len(), cache.pads()), (4, &[2usize, 3][..]));
        assert_eq!(
            keys(&mut cache, 2),
            [vec![0., 0., 2., 3., 0.], vec![0., 0., 0., 9., 0.]]
        );
        let f = cache.frame(2, 1, 4, &dev).unwrap();
        assert!(
            matches!(&f.positions, Positions::PerRow(p) if p.to_vec2::<u32>().unwrap() == [[2], [1]])
        );
    }

    /// The CUDA softmax kernel against the op-by-op CPU path, with a
    /// per-row padding mask read through a narrowed view and a causal one.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_inference_attention_matches_the_cpu() {
        use crate::layers::init::Rng;
        let Ok(gpu) = Device::new_cuda(0) else {
            eprintln!("SKIPPED: no CUDA device");
            return;
        };
        let cpu = Device::Cpu;
        let rand = |shape: (usize, usize, usize, usize), name: &str| {
            let n = shape.0 * shape.1 * shape.2 * shape.3;
            Tensor::from_vec(Rng::for_tensor(4, name).uniform(n, -2.0, 2.0), shape, &cpu).unwrap()
        };
        for (l, t) in [(1, 9), (4, 9)] {
            let (q, k, v) = (
                rand((2, 4, l, 8), "q"),
                rand((2, 2, t, 8), "k"),
                rand((2, 2, t, 8), "v"),
            );
            let mut cache = Cache::new(1)
                .with_capacity(16)
                .with_left_padding(vec![3, 0]);
            cache.len = t - l;
            let frame = cache.frame(2, l, t - l, &cpu).unwrap();
            let mask = frame.mask.unwrap();
            let want = attend(&q, &k, &v, Some(&mask)).unwrap();
            let on = |x: &Tensor| x.to_device(&gpu).unwrap();
            let got = attend(&on(&q), &on(&k), &on(&v), Some(&on(&mask))).unwrap();
            let diff = crate::common::max_abs_diff(&got.to_device(&cpu).unwrap(), &want);
            assert!(diff < 1e-5, "L {l}: {diff}");
            let plain = attend(&q, &k, &v, None).unwrap();
            let got = attend(&on(&q), &on(&k), &on(&v), None).unwrap();
            let diff = crate::common::max_abs_diff(&got.to_device(&cpu).unwrap(), &plain);
            assert!(diff < 1e-5, "L {l}, no mask: {diff}");
        }
    }

    #[test]
    fn hand_written_backward_matches_autograd() {
        use crate::layers::init::Rng;
        let dev = Device::Cpu;
        let rand = |shape: (usize, usize, usize, usize), name: &str| {
            let n = shape.0 * shape.1 * shape.2 * shape.3;
            Tensor::from_vec(Rng::for_tensor(9, name).uniform(n, -1.0, 1.0), shape, &dev).unwrap()
        };
        let (q, k, v) = (
            rand((2, 4, 5, 8), "q"),
            rand((2, 2, 5, 8), "k"),
            rand((2, 2, 5, 8), "v"),
        );
        let d_o = rand((2, 4, 5, 8), "do");
        let pad = Tensor::new(&[[1u32, 1, 1, 1, 1], [1, 1, 1, 0, 0]], &dev).unwrap();
        let m = mask(5, 0, Some(&pad), &dev).unwrap();
        let vars: Vec<candle_core::Var> = [&q, &k, &v]
            .iter()
            .map(|t| candle_core::Var::from_tensor(t).unwrap())
            .collect();
        let out = attend(
            vars[0].as_tensor(),
            vars[1].as_tensor(),
            vars[2].as_tensor(),
            m.as_ref(),
        )
        .unwrap();
        let g = (out * &d_o).unwrap().sum_all().unwrap().backward().unwrap();
        let (dq, dk, dv) = attend_backward(&q, &k, &v, m.as_ref(), &d_o).unwrap();
        for (mine, var) in [dq, dk, dv].iter().zip(&vars) {
            let want = g.get(var.as_tensor()).unwrap();
            let diff = crate::common::max_abs_diff(mine, want);
            assert!(diff < 1e-5, "{diff}");
        }
    }

    #[test]
    fn grouped_heads_match_repeated_keys() {
        let dev = Device::Cpu;
        let q = Tensor::arange(0f32, 2. * 4. * 3. * 2., &dev)
            .unwrap()
            .reshape((2, 4, 3, 2))
            .unwrap()
            .affine(0.05, -0.5)
            .unwrap();
        let k = Tensor::arange(0f32, 2. * 2. * 3. * 2., &dev)
            .unwrap()
            .reshape((2, 2, 3, 2))
            .unwrap()
            .affine(-0.07, 0.4)
            .unwrap();
        let v = k.affine(1.3, 0.1).unwrap();
        let m = mask(3, 0, None, &dev).unwrap();
        let out = attend(&q, &k, &v, m.as_ref()).unwrap();
        // Reference: repeat each kv head twice, plain attention per head.
        let rep = |x: &Tensor| {
            let (b, hk, t, d) = x.dims4().unwrap();
            x.unsqueeze(2)
                .unwrap()
                .expand((b, hk, 2, t, d))
                .unwrap()
                .reshape((b, hk * 2, t, d))
                .unwrap()
        };
        let (k2, v2) = (rep(&k), rep(&v));
        let s = (q.matmul(&k2.t().unwrap()).unwrap() / 2f64.sqrt())
            .unwrap()
            .broadcast_add(m.as_ref().unwrap())
            .unwrap();
        let expected = candle_nn::ops::softmax(&s, D::Minus1)
            .unwrap()
            .matmul(&v2)
            .unwrap();
        let diff: f32 = crate::common::max_abs_diff(&out, &expected);
        assert!(diff < 1e-6, "{diff}");
    }
}

#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use candle_core::{DType, Device, IndexOp, Tensor};

    /// `contiguous_rows` gives candle's contiguous copy bit for bit: head
    /// transposes of `(B, L, H, D)` and `(B, H, L, D)`, a narrowed view, and
    /// layouts it hands back to candle (rows not 16-byte aligned, a strided
    /// last dimension).
    #[test]
    fn contiguous_rows_copies_as_candle_does() {
        let dev = match Device::new_cuda(0) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("SKIPPED: no CUDA device ({e})");
                return;
            }
        };
        for dtype in [DType::BF16, DType::F32] {
            let x = Tensor::arange(0f32, (3 * 37 * 5 * 64) as f32, &dev)
                .unwrap()
                .reshape((3, 37, 5, 64))
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let odd = x.narrow(3, 0, 12).unwrap();
            let views = [
                x.transpose(1, 2).unwrap(),
                x.transpose(1, 2)
                    .unwrap()
                    .contiguous()
                    .unwrap()
                    .transpose(1, 2)
                    .unwrap(),
                x.narrow(1, 3, 30).unwrap().transpose(1, 2).unwrap(),
                x.i((.., .., .., 8..40)).unwrap().transpose(1, 2).unwrap(),
                odd.narrow(3, 1, 4).unwrap(),
                x.transpose(2, 3).unwrap(),
                x.clone(),
            ];
            for (i, v) in views.iter().enumerate() {
                let got = super::contiguous_rows(v).unwrap();
                assert!(got.is_contiguous(), "view {i}");
                assert_eq!(got.dims(), v.dims(), "view {i}");
                let want = v.contiguous().unwrap();
                let (g, w) = (
                    got.to_dtype(DType::F32)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap(),
                    want.to_dtype(DType::F32)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap(),
                );
                assert_eq!(g, w, "{dtype:?} view {i}");
            }
        }
    }
}
