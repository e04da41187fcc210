//! The project's own CUDA kernels: PTX that `build.rs` compiles from
//! `src/kernels/*.cu` with nvcc, loaded once a device through candle's
//! `CudaDevice::get_or_load_custom_func` and launched with cudarc.

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{
    CudaView, CudaViewMut, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::{CudaDevice, Result, bail};

/// `src/kernels/nf4.cu`.
pub const NF4_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/nf4.ptx"));
/// The module name the NF4 kernels are cached under on a device.
const NF4_MODULE: &str = "trace_train_nf4";

/// NF4 dequantisation kernels, one an output dtype.
pub const NF4_F32: &str = "nf4_dequantize_f32";
pub const NF4_BF16: &str = "nf4_dequantize_bf16";
pub const NF4_F16: &str = "nf4_dequantize_f16";

/// Values one thread of the NF4 kernel dequantises (8 packed bytes in,
/// 16 values out as 16-byte stores).
const NF4_VALUES_PER_THREAD: usize = 16;
const NF4_THREADS_PER_BLOCK: u32 = 256;

/// The inputs of an NF4 dequantisation (see `model::nf4` for the format).
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
    let func = dev.get_or_load_custom_func(kernel, NF4_MODULE, NF4_PTX)?;
    let mut builder = func.builder();
    builder.arg(args.packed);
    builder.arg(args.absmax_codes);
    builder.arg(args.nested_absmax);
    builder.arg(args.lut);
    builder.arg(&args.offset);
    builder.arg(&groups);
    builder.arg(out);
    // SAFETY: the argument list matches the kernel's signature in
    // `src/kernels/nf4.cu`, and the sizes were checked above.
    unsafe { builder.launch(cfg) }.w()?;
    Ok(())
}
