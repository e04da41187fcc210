//! FP8 (E4M3) on CUDA: rows quantised with a scale each and the codes
//! back to bf16 (`kernels/fp8.cu`), and `x W^T` from the codes of both
//! through cuBLASLt's FP8 product.
//!
//! The product takes a scale for each row of `x` (a token) and for each
//! row of `W` (an output channel), so that `y[i, j] = sx[i] sw[j] (qx[i] .
//! qw[j])`. cuBLASLt applies both vectors itself where it offers its
//! outer-vector scaling for the shape ([`Scaling::Outer`]); otherwise the
//! product runs with unit scales and one kernel rescales its output
//! ([`Scaling::Unit`]). Both are timed by `bench fp8`.

use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::CudaStorage;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::cublaslt::{result, sys};
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, DType, Device, Result, Storage, Tensor, bail};

use super::kernels::{FP8, kernel, ptr, uninit};
use super::lt::{lt, proposals};

/// How a product applies the row and column scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scaling {
    /// cuBLASLt's outer-vector scale modes (one scale a row of each operand).
    Outer,
    /// Unit scales in the product, then `fp8_rescale_bf16`.
    Unit,
    /// [`Self::Unit`] with cuBLASLt's fast accumulation (the tensor cores'
    /// own accumulator throughout, never promoted to f32 on the way).
    UnitFast,
}

/// Workspace for the product's algorithms.
const WORKSPACE: usize = 32 << 20;
const THREADS: u32 = 256;

fn cuda_dev(t: &Tensor) -> Result<CudaDevice> {
    match t.device() {
        Device::Cuda(d) => Ok(d.clone()),
        _ => bail!("fp8: expected a CUDA tensor"),
    }
}

/// An uninitialised `(rows, cols)` E4M3 tensor on `dev` (the caller's kernel
/// writes all of it).
fn uninit_e4m3(dev: &CudaDevice, rows: usize, cols: usize) -> Result<Tensor> {
    // SAFETY: every caller writes each element before a read.
    let slice: CudaSlice<float8::F8E4M3> = unsafe { dev.alloc(rows * cols)? };
    let storage = CudaStorage::wrap_cuda_slice(slice, dev.clone());
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        (rows, cols),
        BackpropOp::none(),
        false,
    ))
}

/// `x: (rows, cols)` bf16 (cols a multiple of 8) as E4M3 codes `(rows,
/// cols)` and f32 scales `(rows,)`, a row's scale its largest magnitude
/// over 448.
pub fn quantize_rows(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let (rows, cols) = x.dims2()?;
    if x.dtype() != DType::BF16 || !cols.is_multiple_of(8) {
        bail!(
            "fp8 quantisation on CUDA takes bf16 rows of a multiple of 8 values, got {:?} {rows} x {cols}",
            x.dtype()
        );
    }
    let dev = cuda_dev(x)?;
    let x = x.contiguous()?;
    let codes = uninit_e4m3(&dev, rows, cols)?;
    let scales = uninit(&dev, DType::F32, rows, 1)?.reshape(rows)?;
    if rows == 0 {
        return Ok((codes, scales));
    }
    let (xp, cp, sp) = (ptr(&x)?, ptr(&codes)?, ptr(&scales)?);
    if xp % 16 != 0 {
        bail!("fp8 quantisation: the rows must start 16-byte aligned");
    }
    let f = kernel(&dev, &FP8, "fp8_quantize_rows_bf16")?;
    let (r, c) = (rows as u32, cols as u32);
    let mut b = f.builder();
    b.arg(&xp).arg(&cp).arg(&sp).arg(&r).arg(&c);
    let cfg = LaunchConfig {
        grid_dim: (r, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `fp8_quantize_rows_bf16` in
    // kernels/fp8.cu; x holds rows * cols bf16, codes rows * cols bytes,
    // scales rows f32.
    unsafe { b.launch(cfg) }.w()?;
    Ok((codes, scales))
}

/// The `(rows, cols)` values of `codes` scaled by `scales` (a row each),
/// in bf16 or f32.
pub fn dequantize_rows(codes: &Tensor, scales: &Tensor, dtype: DType) -> Result<Tensor> {
    let (rows, cols) = codes.dims2()?;
    if codes.dtype() != DType::F8E4M3 || scales.dims1()? != rows || !cols.is_multiple_of(8) {
        bail!(
            "fp8 dequantisation: codes {:?} {rows} x {cols}",
            codes.dtype()
        );
    }
    let name = match dtype {
        DType::BF16 => "fp8_dequantize_rows_bf16",
        DType::F32 => "fp8_dequantize_rows_f32",
        other => bail!("fp8 dequantisation on CUDA gives bf16 or f32, not {other:?}"),
    };
    let dev = cuda_dev(codes)?;
    let out = uninit(&dev, dtype, rows, cols)?;
    let groups = (rows * cols / 8) as u64;
    if groups == 0 {
        return Ok(out);
    }
    let (cp, sp, op) = (ptr(codes)?, ptr(scales)?, ptr(&out)?);
    let f = kernel(&dev, &FP8, name)?;
    let c = cols as u32;
    let mut b = f.builder();
    b.arg(&cp).arg(&sp).arg(&op).arg(&c).arg(&groups);
    let cfg = LaunchConfig {
        grid_dim: (groups.div_ceil(u64::from(THREADS)) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `fp8_dequantize_rows_bf16` and `_f32`;
    // codes and out hold groups * 8 values, scales one a row.
    unsafe { b.launch(cfg) }.w()?;
    Ok(out)
}

/// One product shape's descriptors and algorithm.
struct Plan {
    key: (usize, usize, usize, Scaling),
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    /// `Err`: what cuBLASLt answered when it offered nothing.
    algo: std::result::Result<sys::cublasLtMatmulAlgo_t, String>,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each was made by `Plan::new` (or is null, where it stopped
        // early) and is destroyed once here.
        unsafe {
            for l in [self.a, self.b, self.d] {
                if !l.is_null() {
                    let _ = result::destroy_matrix_layout(l);
                }
            }
            if !self.desc.is_null() {
                let _ = result::destroy_matmul_desc(self.desc);
            }
        }
    }
}

/// cuBLASLt's handle, workspace and plans for one CUDA context.
struct Products {
    ctx: usize,
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    plans: Vec<Plan>,
}

// SAFETY: used under the `PRODUCTS` lock only, one call at a time; cuBLASLt
// handles and descriptors may move between threads.
unsafe impl Send for Products {}

static PRODUCTS: Mutex<Vec<Products>> = Mutex::new(Vec::new());

impl Products {
    fn new(dev: &CudaDevice) -> Result<Self> {
        let stream = dev.cuda_stream();
        stream.context().bind_to_thread().w()?;
        Ok(Self {
            ctx: stream.context().cu_ctx() as usize,
            handle: lt("FP8 handle", result::create_handle())?,
            workspace: dev.alloc_zeros::<u8>(WORKSPACE)?,
            stream,
            plans: Vec::new(),
        })
    }

    fn plan(&mut self, rows: usize, out: usize, inp: usize, scaling: Scaling) -> Result<&Plan> {
        let key = (rows, out, inp, scaling);
        if let Some(i) = self.plans.iter().position(|p| p.key == key) {
            return Ok(&self.plans[i]);
        }
        let mut plan = Plan {
            key,
            desc: std::ptr::null_mut(),
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            algo: Err(String::new()),
        };
        plan.desc = lt(
            "descriptor",
            result::create_matmul_desc(
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType::CUDA_R_32F,
            ),
        )?;
        let desc = plan.desc;
        let set = |attr: sys::cublasLtMatmulDescAttributes_t, value: i32| {
            // SAFETY: desc is live; each attribute set here is an int32.
            lt("FP8 attribute", unsafe {
                result::set_matmul_desc_attribute(
                    desc,
                    attr,
                    (&value) as *const i32 as *const _,
                    std::mem::size_of::<i32>(),
                )
            })
        };
        use sys::cublasLtMatmulDescAttributes_t as A;
        // W (out, in) row-major is (in, out) column-major: transposed, it is
        // op(A) (out, in); x (rows, in) is B (in, rows); y is D (out, rows)
        // column-major, (rows, out) row-major. FP8 on Hopper is "TN" only.
        set(A::CUBLASLT_MATMUL_DESC_TRANSA, 1)?;
        if scaling == Scaling::UnitFast {
            let fast: i8 = 1;
            // SAFETY: desc is live; this attribute is an int8.
            lt("FP8 fast accumulation", unsafe {
                result::set_matmul_desc_attribute(
                    desc,
                    A::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                    (&fast) as *const i8 as *const _,
                    std::mem::size_of::<i8>(),
                )
            })?;
        }
        if scaling == Scaling::Outer {
            let outer =
                sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F as i32;
            set(A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, outer)?;
            set(A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, outer)?;
        }
        let layout = |t: sys::cudaDataType, r: usize, c: usize| {
            lt(
                "layout",
                result::create_matrix_layout(t, r as u64, c as u64, r as i64),
            )
        };
        use sys::cudaDataType::{CUDA_R_8F_E4M3, CUDA_R_16BF};
        plan.a = layout(CUDA_R_8F_E4M3, inp, out)?;
        plan.b = layout(CUDA_R_8F_E4M3, inp, rows)?;
        plan.d = layout(CUDA_R_16BF, out, rows)?;
        plan.algo = self.heuristic(&plan)?;
        self.plans.push(plan);
        Ok(self.plans.last().expect("just pushed"))
    }

    /// cuBLASLt's first proposal for `plan`, or what it answered instead.
    fn heuristic(
        &self,
        plan: &Plan,
    ) -> Result<std::result::Result<sys::cublasLtMatmulAlgo_t, String>> {
        // SAFETY: the handle and the plan's descriptors are live.
        let proposed = unsafe {
            proposals(
                self.handle,
                plan.desc,
                [plan.a, plan.b, plan.d, plan.d],
                WORKSPACE,
                1,
            )
        }?;
        Ok(proposed.map(|algos| algos[0]))
    }
}

/// Whether cuBLASLt has an algorithm for this product shape and scaling
/// on `dev`: `Err` says what it answered instead.
pub fn supported(
    dev: &CudaDevice,
    rows: usize,
    out: usize,
    inp: usize,
    scaling: Scaling,
) -> Result<std::result::Result<(), String>> {
    with_products(dev, |p| {
        Ok(p.plan(rows, out, inp, scaling)?
            .algo
            .as_ref()
            .map(|_| ())
            .map_err(Clone::clone))
    })
}

fn with_products<R>(dev: &CudaDevice, f: impl FnOnce(&mut Products) -> Result<R>) -> Result<R> {
    let ctx = dev.cuda_stream().context().cu_ctx() as usize;
    let mut all = PRODUCTS.lock().unwrap_or_else(|e| e.into_inner());
    let i = match all.iter().position(|p| p.ctx == ctx) {
        Some(i) => i,
        None => {
            all.push(Products::new(dev)?);
            all.len() - 1
        }
    };
    f(&mut all[i])
}

/// `y (rows, out)` bf16 `= (sx ⊗ sw) ⊙ (qx qw^T)` for the codes `qx (rows,
/// in)` and `qw (out, in)` (E4M3) and their scales; `None` where cuBLASLt
/// has no algorithm for the shape (the caller multiplies otherwise).
pub fn product(
    qx: &Tensor,
    sx: &Tensor,
    qw: &Tensor,
    sw: &Tensor,
    scaling: Scaling,
) -> Result<Option<Tensor>> {
    let (rows, inp) = qx.dims2()?;
    let (out, k) = qw.dims2()?;
    if k != inp || qx.dtype() != DType::F8E4M3 || qw.dtype() != DType::F8E4M3 {
        bail!(
            "fp8 product: x {:?} ({rows}, {inp}) against w {:?} ({out}, {k})",
            qx.dtype(),
            qw.dtype()
        );
    }
    if !inp.is_multiple_of(16) || !out.is_multiple_of(16) || rows == 0 {
        return Ok(None);
    }
    let dev = cuda_dev(qx)?;
    let (xp, wp) = (ptr(qx)?, ptr(qw)?);
    let (sxp, swp) = (ptr(sx)?, ptr(sw)?);
    if xp % 16 != 0 || wp % 16 != 0 {
        return Ok(None);
    }
    let y = uninit(&dev, DType::BF16, rows, out)?;
    let yp = ptr(&y)?;
    let ran = with_products(&dev, |p| {
        p.stream.context().bind_to_thread().w()?;
        let handle = p.handle;
        let stream = Arc::clone(&p.stream);
        let ws = p.workspace.device_ptr(&stream).0;
        let plan = p.plan(rows, out, inp, scaling)?;
        let Ok(algo) = plan.algo else {
            return Ok(false);
        };
        if scaling == Scaling::Outer {
            use sys::cublasLtMatmulDescAttributes_t as A;
            for (attr, at) in [
                (A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, swp),
                (A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sxp),
            ] {
                let at = at as *const std::ffi::c_void;
                // SAFETY: the descriptor is live (under the lock); the
                // attribute is a device pointer to the scale vector.
                lt("FP8 scale pointer", unsafe {
                    result::set_matmul_desc_attribute(
                        plan.desc,
                        attr,
                        (&at) as *const *const std::ffi::c_void as *const _,
                        std::mem::size_of::<*const std::ffi::c_void>(),
                    )
                })?;
            }
        }
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: the layouts describe qw (out, in), qx (rows, in) and y
        // (rows, out), all contiguous, 16-byte aligned and alive until the
        // stream reaches the product; the workspace is WORKSPACE bytes.
        lt("FP8 product", unsafe {
            result::matmul(
                handle,
                plan.desc,
                (&alpha) as *const f32 as *const _,
                (&beta) as *const f32 as *const _,
                wp as *const _,
                plan.a,
                xp as *const _,
                plan.b,
                yp as *const _,
                plan.d,
                yp as *mut _,
                plan.d,
                &algo,
                ws as *mut _,
                WORKSPACE,
                stream.cu_stream() as sys::cudaStream_t,
            )
        })?;
        Ok(true)
    })?;
    if !ran {
        return Ok(None);
    }
    if scaling != Scaling::Outer {
        let f = kernel(&dev, &FP8, "fp8_rescale_bf16")?;
        let c = out as u32;
        let mut b = f.builder();
        b.arg(&yp).arg(&sxp).arg(&swp).arg(&c);
        let cfg = LaunchConfig {
            grid_dim: ((out / 8).div_ceil(THREADS as usize) as u32, rows as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match `fp8_rescale_bf16`; y holds rows *
        // out bf16 (out a multiple of 16, y and sw 16-byte aligned), sx
        // rows and sw out f32.
        unsafe { b.launch(cfg) }.w()?;
    }
    Ok(Some(y))
}
