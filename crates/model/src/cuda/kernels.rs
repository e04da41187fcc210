//! The project's own CUDA kernels: `build.rs` compiles each
//! `kernels/*.cu` with nvcc into a fat binary holding machine code
//! (SASS) for the build's GPU architecture and PTX for newer ones. A module
//! is loaded once a CUDA context ([`kernel`]) and launched with cudarc.
//!
//! Why not candle's `CudaDevice::get_or_load_custom_func`: it takes PTX
//! text only, which the driver compiles on first use. For the decode
//! kernels that took 27 s on an H100 (a fresh machine's first Stage 3
//! step; the driver's cache in `~/.nv/ComputeCache` hides it afterwards),
//! and a fat binary with SASS loads in milliseconds.

use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::DevicePtr;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, CudaView, CudaViewMut, DeviceRepr, LaunchArgs,
    LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{CudaStorage, CudaStorageSlice};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, DType, Result, Storage, Tensor, bail};
use half::{bf16, f16};

/// One compiled `kernels/*.cu`: its fat binary.
pub struct Module {
    name: &'static str,
    image: &'static [u8],
}

macro_rules! module {
    ($stem:literal) => {
        Module {
            name: $stem,
            image: include_bytes!(concat!(env!("OUT_DIR"), "/", $stem, ".fatbin")),
        }
    };
}

/// `kernels/nf4.cu`.
pub const NF4: Module = module!("nf4");
/// `kernels/decode.cu`: the fused decode step's kernels.
pub const DECODE: Module = module!("decode");
/// `kernels/skinny.cu`: the decode products against weights in place.
pub const SKINNY: Module = module!("skinny");
/// `kernels/sample.cu`: drawing a token a row.
pub const SAMPLE: Module = module!("sample");
/// `kernels/attention.cu`.
pub const ATTENTION: Module = module!("attention");
/// `kernels/train.cu`: the training step's fused kernels.
pub const TRAIN: Module = module!("train");
/// `kernels/fp8.cu`: FP8 base weights' quantisation and rescaling.
pub const FP8: Module = module!("fp8");

/// A kernel of a loaded module and the device stream it launches on.
pub struct Kernel {
    func: CudaFunction,
    stream: Arc<CudaStream>,
}

impl Kernel {
    /// A launch of this kernel on the device's stream.
    pub fn builder(&self) -> LaunchArgs<'_> {
        self.stream.launch_builder(&self.func)
    }

    /// Lets launches of this kernel ask for up to `bytes` of dynamic
    /// shared memory (past the 48 KiB a block gets without asking, up to
    /// [`shared_memory_optin`]). The setting is the function's, in its
    /// loaded module: every later launch keeps it.
    pub fn allow_dynamic_shared(&self, bytes: u32) -> Result<()> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
        self.func
            .set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .w()
    }
}

/// Modules loaded so far, by CUDA context and module name. Candle's
/// devices on one GPU share its primary context, so they share modules.
static LOADED: Mutex<Vec<(usize, &'static str, Arc<CudaModule>)>> = Mutex::new(Vec::new());

/// Kernel `name` of `module` on `dev`, loading the module on first use.
pub fn kernel(dev: &CudaDevice, module: &Module, name: &str) -> Result<Kernel> {
    let stream = dev.cuda_stream();
    let ctx = stream.context();
    let key = ctx.cu_ctx() as usize;
    let loaded = {
        let mut all = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        match all.iter().find(|(c, n, _)| *c == key && *n == module.name) {
            Some((_, _, m)) => Arc::clone(m),
            None => {
                let m = ctx
                    .load_module(Ptx::from_binary(module.image.to_vec()))
                    .map_err(|e| {
                        candle_core::Error::Msg(format!(
                            "cannot load the `{}` kernels on this GPU: {e}\nhint: the binary \
                             was built for compute capability {}; rebuild with \
                             CUDA_COMPUTE_CAP set to this GPU's (nvidia-smi \
                             --query-gpu=compute_cap --format=csv)",
                            module.name,
                            env!("TRACE_TRAIN_CUDA_CAP"),
                        ))
                    })?;
                all.push((key, module.name, Arc::clone(&m)));
                m
            }
        }
    };
    let func = loaded.load_function(name).w()?;
    Ok(Kernel { func, stream })
}

/// Multiprocessors of `dev`'s GPU: how many blocks keep it busy.
pub fn multiprocessors(dev: &CudaDevice) -> Result<usize> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
    let n = dev
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .w()?;
    Ok(n.max(1) as usize)
}

/// Most shared memory one block of a kernel on `dev`'s GPU can ask for
/// ([`Kernel::allow_dynamic_shared`]).
pub fn shared_memory_optin(dev: &CudaDevice) -> Result<usize> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
    let n = dev
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .w()?;
    Ok(n.max(0) as usize)
}

/// NF4 dequantisation kernels, one an output dtype.
pub const NF4_F32: &str = "nf4_dequantize_f32";
pub const NF4_BF16: &str = "nf4_dequantize_bf16";
pub const NF4_F16: &str = "nf4_dequantize_f16";

/// Values one thread of the NF4 kernel dequantises (8 packed bytes in,
/// 16 values out as 16-byte stores).
const NF4_VALUES_PER_THREAD: usize = 16;
const NF4_THREADS_PER_BLOCK: u32 = 256;

/// The inputs of an NF4 dequantisation (see `model::layers::nf4` for the format).
pub struct Nf4Args<'a, 'b> {
    /// `numel / 2` bytes, 8-byte aligned.
    pub packed: &'a CudaView<'b, u8>,
    /// `numel / 64` indices into the dynamic map.
    pub absmax_codes: &'a CudaView<'b, u8>,
    /// `ceil(numel / 16384)` f32.
    pub nested_absmax: &'a CudaView<'b, f32>,
    /// The 256 dynamic-map values, then the 16 NF4 codes.
    pub lut: &'a CudaView<'b, f32>,
    pub offset: f32,
    /// Values to write, a multiple of 64.
    pub numel: usize,
}

/// Dequantises `args` into `out` (`numel` values of the kernel's dtype,
/// 16-byte aligned) with kernel `kernel` (one of [`NF4_F32`], [`NF4_BF16`],
/// [`NF4_F16`], matching `T`).
pub fn nf4_dequantize<T: DeviceRepr>(
    dev: &CudaDevice,
    kernel: &str,
    args: &Nf4Args,
    out: &mut CudaViewMut<'_, T>,
) -> Result<()> {
    let numel = args.numel;
    if !numel.is_multiple_of(64)
        || args.packed.len() != numel / 2
        || args.absmax_codes.len() != numel / 64
        || args.nested_absmax.len() != (numel / 64).div_ceil(256)
        || args.lut.len() != 256 + 16
        || out.len() != numel
    {
        bail!(
            "nf4 kernel: inconsistent sizes (numel {numel}, packed {}, absmax codes {}, nested {}, \
             lut {}, out {})",
            args.packed.len(),
            args.absmax_codes.len(),
            args.nested_absmax.len(),
            args.lut.len(),
            out.len()
        );
    }
    let groups = (numel / NF4_VALUES_PER_THREAD) as u64;
    let blocks = groups
        .div_ceil(u64::from(NF4_THREADS_PER_BLOCK))
        .min(1 << 30) as u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks.max(1), 1, 1),
        block_dim: (NF4_THREADS_PER_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let func = self::kernel(dev, &NF4, kernel)?;
    let mut builder = func.builder();
    builder.arg(args.packed);
    builder.arg(args.absmax_codes);
    builder.arg(args.nested_absmax);
    builder.arg(args.lut);
    builder.arg(&args.offset);
    builder.arg(&groups);
    builder.arg(out);
    // SAFETY: the argument list matches the kernel's signature in
    // `kernels/nf4.cu`, and the sizes were checked above.
    unsafe { builder.launch(cfg) }.w()?;
    Ok(())
}

/// An uninitialised `(rows, cols)` tensor of `dtype` (bf16, f16, else f32)
/// on `dev`: every caller's kernel writes it whole before any read.
pub fn uninit(dev: &CudaDevice, dtype: DType, rows: usize, cols: usize) -> Result<Tensor> {
    let n = rows * cols;
    // SAFETY: each caller's kernel writes every element before a read.
    let storage = unsafe {
        match dtype {
            DType::BF16 => CudaStorage::wrap_cuda_slice(dev.alloc::<bf16>(n)?, dev.clone()),
            DType::F16 => CudaStorage::wrap_cuda_slice(dev.alloc::<f16>(n)?, dev.clone()),
            _ => CudaStorage::wrap_cuda_slice(dev.alloc::<f32>(n)?, dev.clone()),
        }
    };
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        (rows, cols),
        BackpropOp::none(),
        false,
    ))
}

/// The device address of a contiguous CUDA tensor's first element. The
/// tensor must outlive every launch that reads the address (frees are
/// stream-ordered, so dropping it after the launch call is enough).
pub fn ptr(t: &Tensor) -> Result<u64> {
    let (s, l) = t.storage_and_layout();
    let Storage::Cuda(c) = &*s else {
        bail!("decode step: expected a CUDA tensor");
    };
    if !l.is_contiguous() {
        bail!(
            "decode step: expected a contiguous tensor, got strides {:?}",
            l.stride()
        );
    }
    let stream = c.device.cuda_stream();
    let (base, size) = match &c.slice {
        CudaStorageSlice::BF16(x) => (x.device_ptr(&stream).0, 2),
        CudaStorageSlice::F16(x) => (x.device_ptr(&stream).0, 2),
        CudaStorageSlice::F32(x) => (x.device_ptr(&stream).0, 4),
        CudaStorageSlice::U32(x) => (x.device_ptr(&stream).0, 4),
        CudaStorageSlice::U8(x) => (x.device_ptr(&stream).0, 1),
        CudaStorageSlice::F8E4M3(x) => (x.device_ptr(&stream).0, 1),
        _ => bail!("decode step: unexpected dtype {:?}", t.dtype()),
    };
    Ok(base + (l.start_offset() * size) as u64)
}
