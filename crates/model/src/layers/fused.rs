//! Fused element-wise steps of the hand-written layer backward and of the
//! chunked loss: RMSNorm's backward, SwiGLU forward and backward, and the
//! cross-entropy of a chunk of logits with its gradient.
//!
//! Profiled on an H200 (Qwen3-4B shape, batch 4 x 1024), the same steps
//! written as candle ops in f32 took about three quarters of the GPU time of
//! a training step (f32 broadcast multiplies, casts, subtractions: one pass
//! over memory each). On CUDA each is one kernel of our own
//! (`kernels/train.cu`): one read of the inputs and one write of the
//! outputs in the model's dtype, f32 arithmetic in registers. On the CPU the
//! same formulas run as candle ops (the reference the GPU tests compare to).

use candle_core::{D, DType, Result, Tensor};

/// `dL/dx` of `y = x / sqrt(mean(x^2) + eps) * w` over the last dimension,
/// for `dL/dy = dy`: with `r = 1 / sqrt(mean(x^2) + eps)`, `x^ = x r` and
/// `t = dy w`, `dx = r (t - x^ mean(t x^))`. In `x`'s dtype.
pub fn rmsnorm_backward(x: &Tensor, w: &Tensor, dy: &Tensor, eps: f64) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return cuda::rmsnorm_backward(x, w, dy, eps);
    }
    let dtype = x.dtype();
    let x = x.detach().to_dtype(DType::F32)?;
    let t = dy
        .to_dtype(DType::F32)?
        .broadcast_mul(&w.to_dtype(DType::F32)?)?;
    let r = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?; // (.., 1)
    let xhat = x.broadcast_mul(&r)?;
    let dot = (&t * &xhat)?.mean_keepdim(D::Minus1)?; // (.., 1)
    (t - xhat.broadcast_mul(&dot)?)?
        .broadcast_mul(&r)?
        .to_dtype(dtype)
}

/// `silu(gate) * up`.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if gate.device().is_cuda() {
        return cuda::swiglu(gate, up);
    }
    gate.detach().silu()? * up.detach()
}

/// `(dL/dgate, dL/dup)` of `h = silu(gate) * up` for `dL/dh = dh`: with `s
/// = sigmoid(gate)`, `dup = dh silu(gate)` and `dgate = dh up s (1 + gate
/// (1 - s))`. f32 arithmetic, results in `gate`'s dtype.
pub fn swiglu_backward(gate: &Tensor, up: &Tensor, dh: &Tensor) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if gate.device().is_cuda() {
        return cuda::swiglu_backward(gate, up, dh);
    }
    let dtype = gate.dtype();
    let g = gate.to_dtype(DType::F32)?;
    let u = up.to_dtype(DType::F32)?;
    let dh = dh.to_dtype(DType::F32)?;
    let s = candle_nn::ops::sigmoid(&g)?;
    let du = (&dh * (&g * &s)?)?;
    let dsilu = (&s * ((&g * (1.0 - &s)?)? + 1.0)?)?;
    let dg = ((dh * u)? * dsilu)?;
    Ok((dg.to_dtype(dtype)?, du.to_dtype(dtype)?))
}

/// Cross-entropy of each row of `logits: (c, V)` against `targets: (c,)`
/// u32: the per-row losses `(c,)` f32 (`logsumexp(z) - z[target]`) and the
/// gradient `softmax(z) - onehot(target)` in the logits' dtype (f32 when
/// `logits` is f32).
///
/// `logits` is consumed: on CUDA the gradient is written over a contiguous
/// `logits` in place (a chunk of Qwen3's vocabulary is 134 MB in bf16), so
/// no other tensor may share its storage; a fresh product, as the chunked
/// loss passes, shares nothing.
pub fn cross_entropy_rows(logits: Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() {
        return cuda::cross_entropy_rows(logits, targets);
    }
    let dtype = logits.dtype();
    let z = logits.to_dtype(DType::F32)?;
    let tgt = targets.unsqueeze(1)?; // (c, 1)
    let max = z.max_keepdim(1)?;
    let shifted = z.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(1)?.log()?; // (c, 1), less max
    let loss = (&lse - shifted.gather(&tgt, 1)?)?.squeeze(1)?;
    let p = shifted.broadcast_sub(&lse)?.exp()?;
    let minus_one = Tensor::full(-1f32, tgt.shape(), z.device())?;
    p.scatter_add_set(&tgt, &minus_one, 1)?;
    Ok((loss, p.to_dtype(dtype)?))
}

/// RMSNorm over the last dimension, `T(x r w)` with `r = 1 /
/// sqrt(mean(x^2) + eps)`, rounded once as candle's kernel and the decode
/// step round: on CUDA one warp a row (`rmsnorm_rows`, rows of up to 4,096
/// values, a multiple of 8), elsewhere candle's kernel. Builds no graph.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda()
        && let Some(y) = cuda::rms_norm(x, w, eps)?
    {
        return Ok(y);
    }
    candle_nn::ops::rms_norm(&x.contiguous()?, w, eps)
}

/// Hyper-parameters of one AdamW step ([`adamw_step`]).
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    /// `1 - beta1^t` and `1 - beta2^t`.
    pub c1: f64,
    pub c2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Gradient multiplier (clipping).
    pub grad_scale: f64,
}

/// Inverted dropout's mask of `shape` in `dtype` on a CUDA `device`: each
/// value 0 with probability `p`, else `1 / (1 - p)`, drawn from `seed` and
/// the value's index in one kernel; `None` on other devices. Training
/// never stores it: [`dropout_apply`] multiplies by the same values where
/// they are used. This stored form defines them (the tests hold
/// `dropout_apply` to it).
pub fn dropout_mask(
    shape: &candle_core::Shape,
    dtype: candle_core::DType,
    device: &candle_core::Device,
    seed: u64,
    p: f32,
) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(dev) = device {
        return cuda::dropout_mask(shape, dtype, dev, seed, p).map(Some);
    }
    let _ = (shape, dtype, device, seed, p);
    Ok(None)
}

/// `x` times the mask [`dropout_mask`] draws for the same `seed` and `p`
/// (same bits as multiplying by that mask), in one kernel that writes no
/// mask, on CUDA; `None` on other devices.
pub fn dropout_apply(x: &Tensor, seed: u64, p: f32) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return cuda::dropout_apply(x, seed, p).map(Some);
    }
    let _ = (x, seed, p);
    Ok(None)
}

/// One AdamW step on f32 `param`, `grad`, `m`, `v` of one shape: the new
/// `(param, m, v)`, in one kernel on CUDA; `None` on other devices (the
/// caller runs the same formula as tensor ops).
pub fn adamw_step(
    param: &Tensor,
    grad: &Tensor,
    m: &Tensor,
    v: &Tensor,
    h: &AdamWStep,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    #[cfg(feature = "cuda")]
    if param.device().is_cuda() {
        return cuda::adamw_step(param, grad, m, v, h).map(Some);
    }
    let _ = (param, grad, m, v, h);
    Ok(None)
}

#[cfg(feature = "cuda")]
mod cuda {
    use crate::cuda::kernels;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::{CudaDType, CudaStorage};
    use candle_core::op::BackpropOp;
    use candle_core::{CudaDevice, DType, Layout, Result, Shape, Storage, Tensor, bail};
    use half::{bf16, f16};

    const THREADS: u32 = 256;

    /// The suffix of a kernel instantiated for `dtype`.
    fn suffix(dtype: DType) -> Result<&'static str> {
        Ok(match dtype {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            other => bail!("fused kernels take f32, bf16 or f16, not {other:?}"),
        })
    }

    fn cuda(s: &Storage) -> Result<&CudaStorage> {
        match s {
            Storage::Cuda(c) => Ok(c),
            _ => bail!("fused kernel: expected a CUDA tensor"),
        }
    }

    /// The `n` values of a contiguous tensor's storage `s` at `l`.
    fn view<'a, T: CudaDType>(s: &'a Storage, l: &Layout, n: usize) -> Result<CudaView<'a, T>> {
        let start = l.start_offset();
        Ok(cuda(s)?.as_cuda_slice::<T>()?.slice(start..start + n))
    }

    /// A fresh tensor of `shape` backed by `slice`.
    fn tensor<T: CudaDType>(
        slice: CudaSlice<T>,
        dev: &CudaDevice,
        shape: impl Into<Shape>,
    ) -> Tensor {
        let storage = CudaStorage::wrap_cuda_slice(slice, dev.clone());
        Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
    }

    fn grid(numel: usize) -> LaunchConfig {
        let blocks = numel.div_ceil(THREADS as usize).clamp(1, 132 * 32) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn rows(rows: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Runs `$f::<T>` for the dtype `$dtype`.
    macro_rules! dispatch {
        ($dtype:expr, $f:ident, $($arg:expr),*) => {
            match $dtype {
                DType::F32 => $f::<f32>($($arg),*),
                DType::BF16 => $f::<bf16>($($arg),*),
                DType::F16 => $f::<f16>($($arg),*),
                other => bail!("fused kernels take f32, bf16 or f16, not {other:?}"),
            }
        };
    }

    pub fn rmsnorm_backward(x: &Tensor, w: &Tensor, dy: &Tensor, eps: f64) -> Result<Tensor> {
        let dtype = x.dtype();
        let (x, w, dy) = (
            x.contiguous()?,
            w.to_dtype(dtype)?.contiguous()?,
            dy.to_dtype(dtype)?.contiguous()?,
        );
        dispatch!(dtype, rmsnorm_backward_t, &x, &w, &dy, eps)
    }

    fn rmsnorm_backward_t<T: CudaDType + DeviceRepr>(
        x: &Tensor,
        w: &Tensor,
        dy: &Tensor,
        eps: f64,
    ) -> Result<Tensor> {
        let n = x.dim(candle_core::D::Minus1)?;
        let count = x.elem_count() / n;
        if w.elem_count() != n || dy.dims() != x.dims() {
            bail!(
                "rmsnorm backward: x {:?}, w {:?}, dy {:?}",
                x.dims(),
                w.dims(),
                dy.dims()
            );
        }
        let (xs, xl) = x.storage_and_layout();
        let (ws, wl) = w.storage_and_layout();
        let (ds, dl) = dy.storage_and_layout();
        let dev = cuda(&xs)?.device.clone();
        let (xv, wv, dv) = (
            view::<T>(&xs, xl, count * n)?,
            view::<T>(&ws, wl, n)?,
            view::<T>(&ds, dl, count * n)?,
        );
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { dev.alloc::<T>(count * n) }?;
        let func = kernels::kernel(
            &dev,
            &kernels::TRAIN,
            &format!("rmsnorm_bwd_{}", suffix(x.dtype())?),
        )?;
        let (n32, eps32) = (n as i32, eps as f32);
        let mut b = func.builder();
        b.arg(&xv);
        b.arg(&wv);
        b.arg(&dv);
        b.arg(&mut out);
        b.arg(&n32);
        b.arg(&eps32);
        // SAFETY: the arguments match `rmsnorm_bwd_*` in train.cu and the
        // sizes were checked above.
        unsafe { b.launch(rows(count)) }.w()?;
        tensor(out, &dev, (count, n)).reshape(x.shape())
    }

    pub fn dropout_mask(
        shape: &Shape,
        dtype: DType,
        dev: &CudaDevice,
        seed: u64,
        p: f32,
    ) -> Result<Tensor> {
        dispatch!(dtype, dropout_mask_t, shape, dtype, dev, seed, p)
    }

    fn dropout_mask_t<T: CudaDType + DeviceRepr>(
        shape: &Shape,
        dtype: DType,
        dev: &CudaDevice,
        seed: u64,
        p: f32,
    ) -> Result<Tensor> {
        let numel = shape.elem_count();
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { dev.alloc::<T>(numel) }?;
        let func = kernels::kernel(
            dev,
            &kernels::TRAIN,
            &format!("dropout_mask_{}", suffix(dtype)?),
        )?;
        let keep = 1.0 / (1.0 - p);
        let mut b = func.builder();
        b.arg(&mut out);
        b.arg(&numel);
        b.arg(&seed);
        b.arg(&p);
        b.arg(&keep);
        // SAFETY: the arguments match `dropout_mask_*` in train.cu.
        unsafe { b.launch(grid(numel)) }.w()?;
        Ok(tensor(out, dev, shape.clone()))
    }

    pub fn dropout_apply(x: &Tensor, seed: u64, p: f32) -> Result<Tensor> {
        let x = x.contiguous()?;
        dispatch!(x.dtype(), dropout_apply_t, &x, seed, p)
    }

    fn dropout_apply_t<T: CudaDType + DeviceRepr>(x: &Tensor, seed: u64, p: f32) -> Result<Tensor> {
        let numel = x.elem_count();
        let (xs, xl) = x.storage_and_layout();
        let dev = cuda(&xs)?.device.clone();
        let xv = view::<T>(&xs, xl, numel)?;
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { dev.alloc::<T>(numel) }?;
        let func = kernels::kernel(
            &dev,
            &kernels::TRAIN,
            &format!("dropout_apply_{}", suffix(x.dtype())?),
        )?;
        let keep = 1.0 / (1.0 - p);
        let mut b = func.builder();
        b.arg(&xv);
        b.arg(&mut out);
        b.arg(&numel);
        b.arg(&seed);
        b.arg(&p);
        b.arg(&keep);
        // SAFETY: the arguments match `dropout_apply_*` in train.cu.
        unsafe { b.launch(grid(numel)) }.w()?;
        Ok(tensor(out, &dev, x.shape().clone()))
    }

    /// [`super::rms_norm`] on the GPU; `None` where `rmsnorm_rows` does not
    /// serve the shape (the caller takes candle's kernel).
    pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Option<Tensor>> {
        let n = x.dim(candle_core::D::Minus1)?;
        if n == 0 || !n.is_multiple_of(8) || n > 32 * 8 * 16 || w.dims() != [n] {
            return Ok(None);
        }
        let dtype = x.dtype();
        let (x, w) = (x.contiguous()?, w.to_dtype(dtype)?.contiguous()?);
        // The kernel loads 8 values at once: both must start on 8.
        if !(x.layout().start_offset() % 8 == 0 && w.layout().start_offset() % 8 == 0) {
            return Ok(None);
        }
        dispatch!(dtype, rms_norm_t, &x, &w, eps).map(Some)
    }

    fn rms_norm_t<T: CudaDType + DeviceRepr>(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
        let n = x.dim(candle_core::D::Minus1)?;
        let count = x.elem_count() / n;
        let (xs, xl) = x.storage_and_layout();
        let (ws, wl) = w.storage_and_layout();
        let dev = cuda(&xs)?.device.clone();
        let (xv, wv) = (view::<T>(&xs, xl, count * n)?, view::<T>(&ws, wl, n)?);
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { dev.alloc::<T>(count * n) }?;
        let chunks = if n <= 32 * 8 * 4 { 4 } else { 16 };
        let func = kernels::kernel(
            &dev,
            &kernels::TRAIN,
            &format!("rmsnorm_rows{chunks}_{}", suffix(x.dtype())?),
        )?;
        let (rows32, n32) = (count as i32, n as i32);
        let warps = THREADS as usize / 32;
        let config = LaunchConfig {
            grid_dim: (count.div_ceil(warps).max(1) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = func.builder();
        b.arg(&xv);
        b.arg(&wv);
        b.arg(&mut out);
        b.arg(&rows32);
        b.arg(&n32);
        b.arg(&eps);
        // SAFETY: the arguments match `rmsnorm_rows*_*`: `count` rows of `n`
        // values (a multiple of 8 within the instance's chunks), contiguous
        // buffers from the allocator (16-byte aligned).
        unsafe { b.launch(config) }.w()?;
        Ok(tensor(out, &dev, x.shape().clone()))
    }

    pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        let dtype = gate.dtype();
        let (g, u) = (gate.contiguous()?, up.to_dtype(dtype)?.contiguous()?);
        dispatch!(dtype, swiglu_t, &g, &u)
    }

    fn swiglu_t<T: CudaDType + DeviceRepr>(g: &Tensor, u: &Tensor) -> Result<Tensor> {
        let numel = g.elem_count();
        if u.dims() != g.dims() {
            bail!("swiglu: gate {:?}, up {:?}", g.dims(), u.dims());
        }
        let (gs, gl) = g.storage_and_layout();
        let (us, ul) = u.storage_and_layout();
        let dev = cuda(&gs)?.device.clone();
        let (gv, uv) = (view::<T>(&gs, gl, numel)?, view::<T>(&us, ul, numel)?);
        // SAFETY: every element is written by the kernel.
        let mut h = unsafe { dev.alloc::<T>(numel) }?;
        let func = kernels::kernel(
            &dev,
            &kernels::TRAIN,
            &format!("swiglu_fwd_{}", suffix(g.dtype())?),
        )?;
        let mut b = func.builder();
        b.arg(&gv);
        b.arg(&uv);
        b.arg(&mut h);
        b.arg(&numel);
        // SAFETY: the arguments match `swiglu_fwd_*`; `numel` values each.
        unsafe { b.launch(grid(numel.div_ceil(8))) }.w()?;
        Ok(tensor(h, &dev, g.shape().clone()))
    }

    pub fn swiglu_backward(gate: &Tensor, up: &Tensor, dh: &Tensor) -> Result<(Tensor, Tensor)> {
        let dtype = gate.dtype();
        let (g, u, d) = (
            gate.contiguous()?,
            up.to_dtype(dtype)?.contiguous()?,
            dh.to_dtype(dtype)?.contiguous()?,
        );
        dispatch!(dtype, swiglu_backward_t, &g, &u, &d)
    }

    fn swiglu_backward_t<T: CudaDType + DeviceRepr>(
        g: &Tensor,
        u: &Tensor,
        d: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let numel = g.elem_count();
        if u.dims() != g.dims() || d.dims() != g.dims() {
            bail!(
                "swiglu backward: gate {:?}, up {:?}, dh {:?}",
                g.dims(),
                u.dims(),
                d.dims()
            );
        }
        let (gs, gl) = g.storage_and_layout();
        let (us, ul) = u.storage_and_layout();
        let (ds, dl) = d.storage_and_layout();
        let dev = cuda(&gs)?.device.clone();
        let (gv, uv, dv) = (
            view::<T>(&gs, gl, numel)?,
            view::<T>(&us, ul, numel)?,
            view::<T>(&ds, dl, numel)?,
        );
        // SAFETY: every element is written by the kernel.
        let mut dg = unsafe { dev.alloc::<T>(numel) }?;
        let mut du = unsafe { dev.alloc::<T>(numel) }?;
        let func = kernels::kernel(
            &dev,
            &kernels::TRAIN,
            &format!("swiglu_bwd_{}", suffix(g.dtype())?),
        )?;
        let mut b = func.builder();
        b.arg(&gv);
        b.arg(&uv);
        b.arg(&dv);
        b.arg(&mut dg);
        b.arg(&mut du);
        b.arg(&numel);
        // SAFETY: the arguments match `swiglu_bwd_*`; `numel` values each.
        unsafe { b.launch(grid(numel)) }.w()?;
        let shape = g.shape().clone();
        Ok((tensor(dg, &dev, shape.clone()), tensor(du, &dev, shape)))
    }

    pub fn adamw_step(
        param: &Tensor,
        grad: &Tensor,
        m: &Tensor,
        v: &Tensor,
        h: &super::AdamWStep,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let n = param.elem_count();
        let f = |t: &Tensor| -> Result<Tensor> { t.to_dtype(DType::F32)?.contiguous() };
        let (p, g, m, v) = (f(param)?, f(grad)?, f(m)?, f(v)?);
        for (name, t) in [("grad", &g), ("m", &m), ("v", &v)] {
            if t.elem_count() != n {
                bail!(
                    "adamw: {name} has {} values, the parameter {n}",
                    t.elem_count()
                );
            }
        }
        let (ps, pl) = p.storage_and_layout();
        let (gs, gl) = g.storage_and_layout();
        let (ms, ml) = m.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let dev = cuda(&ps)?.device.clone();
        let (pv, gv, mv, vv) = (
            view::<f32>(&ps, pl, n)?,
            view::<f32>(&gs, gl, n)?,
            view::<f32>(&ms, ml, n)?,
            view::<f32>(&vs, vl, n)?,
        );
        // SAFETY: every element of the three outputs is written.
        let (mut po, mut mo, mut vo) = unsafe {
            (
                dev.alloc::<f32>(n)?,
                dev.alloc::<f32>(n)?,
                dev.alloc::<f32>(n)?,
            )
        };
        let func = kernels::kernel(&dev, &kernels::TRAIN, "adamw_f32")?;
        let scalars = [
            h.grad_scale,
            h.beta1,
            h.beta2,
            h.c1,
            h.c2,
            h.eps,
            h.lr,
            h.weight_decay,
        ]
        .map(|x| x as f32);
        let mut b = func.builder();
        b.arg(&pv);
        b.arg(&gv);
        b.arg(&mv);
        b.arg(&vv);
        b.arg(&mut po);
        b.arg(&mut mo);
        b.arg(&mut vo);
        b.arg(&n);
        for s in &scalars {
            b.arg(s);
        }
        // SAFETY: the arguments match `adamw_f32` in train.cu; n values each.
        unsafe { b.launch(grid(n)) }.w()?;
        let shape = param.shape().clone();
        Ok((
            tensor(po, &dev, shape.clone()),
            tensor(mo, &dev, shape.clone()),
            tensor(vo, &dev, shape),
        ))
    }

    pub fn cross_entropy_rows(logits: Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
        let targets = targets.to_dtype(DType::U32)?.contiguous()?;
        let dtype = logits.dtype();
        dispatch!(dtype, cross_entropy_rows_t, logits, &targets)
    }

    fn cross_entropy_rows_t<T: CudaDType + DeviceRepr>(
        logits: Tensor,
        targets: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let (c, v) = logits.dims2()?;
        if targets.dims() != [c] {
            bail!("cross-entropy: {c} rows but targets {:?}", targets.dims());
        }
        // The kernel overwrites its input with the gradient: the logits
        // themselves when they are contiguous (the caller's contract: no
        // other tensor shares them), else a contiguous copy.
        let grad = if logits.is_contiguous() {
            logits
        } else {
            logits.copy()?
        };
        let (zs, zl) = grad.storage_and_layout();
        let (ts, tl) = targets.storage_and_layout();
        let dev = cuda(&zs)?.device.clone();
        let (zv, tv) = (view::<T>(&zs, zl, c * v)?, view::<u32>(&ts, tl, c)?);
        // SAFETY: every element is written by the kernel.
        let mut loss = unsafe { dev.alloc::<f32>(c) }?;
        let func = kernels::kernel(
            &dev,
            &kernels::TRAIN,
            &format!("xent_fwd_bwd_{}", suffix(grad.dtype())?),
        )?;
        let v32 = v as i32;
        let mut b = func.builder();
        b.arg(&zv);
        b.arg(&tv);
        b.arg(&mut loss);
        b.arg(&v32);
        // SAFETY: the arguments match `xent_fwd_bwd_*`; `grad` is a
        // contiguous (c, v) buffer nothing else reads, and every
        // target is below v (the loss builds them from labels checked
        // against the vocabulary).
        unsafe { b.launch(rows(c)) }.w()?;
        drop(zs);
        Ok((tensor(loss, &dev, c), grad))
    }
}

#[cfg(test)]
mod tests {
    /// The CUDA dropout mask: values 0 or 1 / (1 - p), about a share p of
    /// zeros, the same mask for the same seed, another for another seed.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_dropout_masks_drop_a_share_p_and_repeat_by_seed() {
        use candle_core::{DType, Device, Shape};
        let Ok(gpu) = Device::new_cuda(0) else {
            eprintln!("SKIPPED: no CUDA device");
            return;
        };
        let shape = Shape::from((300, 1001));
        for (dtype, p) in [(DType::F32, 0.05f32), (DType::BF16, 0.3)] {
            let draw = |seed: u64| -> Vec<f32> {
                super::dropout_mask(&shape, dtype, &gpu, seed, p)
                    .unwrap()
                    .expect("a CUDA mask")
                    .to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            };
            let (a, b, c) = (draw(7), draw(7), draw(8));
            assert_eq!(a, b, "{dtype:?}: same seed, same mask");
            assert_ne!(a, c, "{dtype:?}: another seed, another mask");
            let keep = 1.0 / (1.0 - p);
            let keep = candle_core::Tensor::new(&[keep], &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()[0];
            assert!(a.iter().all(|&v| v == 0.0 || v == keep), "{dtype:?}");
            let zeros = a.iter().filter(|&&v| v == 0.0).count() as f64 / a.len() as f64;
            // 300,300 draws: a standard deviation under 0.001.
            assert!(
                (zeros - p as f64).abs() < 0.005,
                "{dtype:?}: {zeros} zeros for p {p}"
            );
        }
        assert!(
            super::dropout_mask(&shape, DType::F32, &Device::Cpu, 7, 0.1)
                .unwrap()
                .is_none()
        );
    }

    /// Dropout drawn where it is applied gives the bits of multiplying by
    /// the stored mask, f32 and bf16, on a tensor of an odd size.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_drawn_dropout_equals_the_stored_mask() {
        use candle_core::{DType, Device, Tensor};
        let Ok(gpu) = Device::new_cuda(0) else {
            eprintln!("SKIPPED: no CUDA device");
            return;
        };
        for (dtype, p) in [(DType::F32, 0.05f32), (DType::BF16, 0.1)] {
            let x = Tensor::randn(0f32, 1.0, (257, 1003), &gpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let mask = super::dropout_mask(x.shape(), dtype, &gpu, 11, p)
                .unwrap()
                .unwrap();
            let want = (&x * &mask).unwrap();
            let got = super::dropout_apply(&x, 11, p).unwrap().unwrap();
            let bits = |t: &Tensor| -> Vec<f32> {
                t.to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            };
            assert_eq!(bits(&got), bits(&want), "{dtype:?}");
            let other = super::dropout_apply(&x, 12, p).unwrap().unwrap();
            assert_ne!(bits(&other), bits(&want), "{dtype:?}: another stream");
        }
    }

    /// On the GPU: the warp-a-row RMSNorm against candle's kernel (the same
    /// rounding; only the order of the sum of squares differs, so in bf16
    /// nearly every value is the same bits) at rows of
    /// 4,096, 2,560 (a hidden state), 128 (a head's q/k norm) and 64 values,
    /// and at sizes it leaves to candle (12, 4,104); SwiGLU, 8 values a
    /// thread, against the formula on the CPU in f32, at a size with a
    /// scalar tail.
    #[cfg(feature = "cuda")]
    #[test]
    fn gpu_rms_norm_and_swiglu_match_candle_and_the_formula() {
        use candle_core::{DType, Device, Tensor};
        let Ok(gpu) = Device::new_cuda(0) else {
            eprintln!("SKIPPED: no CUDA device");
            return;
        };
        let flat = |t: &Tensor| -> Vec<f32> {
            t.to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        for dtype in [DType::BF16, DType::F32] {
            for (rows, n) in [
                (5, 4096),
                (300, 2560),
                (1000, 128),
                (77, 64),
                (9, 12),
                (3, 4104),
            ] {
                let x = Tensor::randn(0f32, 1.0, (rows, n), &gpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let w = (Tensor::randn(0f32, 0.1, n, &gpu).unwrap() + 1.0)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let got = flat(&super::rms_norm(&x, &w, 1e-6).unwrap());
                let want = flat(&candle_nn::ops::rms_norm(&x, &w, 1e-6).unwrap());
                let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                let (mut same, mut worst) = (0usize, 0f32);
                for (g, w) in got.iter().zip(&want) {
                    same += usize::from(g == w);
                    worst = worst.max((g - w).abs());
                }
                let tol = if dtype == DType::F32 { 1e-5 } else { 8e-3 };
                assert!(
                    worst <= tol * scale,
                    "{dtype:?} {rows} x {n}: off by {worst} of {scale}"
                );
                assert!(
                    dtype == DType::F32 || same * 100 >= got.len() * 98,
                    "{dtype:?} {rows} x {n}: {same} of {} the same",
                    got.len()
                );
            }
            for (rows, n) in [(100, 9728), (7, 13)] {
                let g = Tensor::randn(0f32, 2.0, (rows, n), &gpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let u = Tensor::randn(0f32, 1.0, (rows, n), &gpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let got = flat(&super::swiglu(&g, &u).unwrap());
                let cpu = |t: &Tensor| {
                    t.to_dtype(DType::F32)
                        .unwrap()
                        .to_device(&Device::Cpu)
                        .unwrap()
                };
                let want = flat(&super::swiglu(&cpu(&g), &cpu(&u)).unwrap());
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    let tol = if dtype == DType::F32 { 1e-5 } else { 8e-3 };
                    assert!(
                        (a - b).abs() <= tol * b.abs().max(1e-3),
                        "{dtype:?} {rows} x {n} at {i}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
