//! 4-bit NormalFloat (NF4) base weights with double quantisation, in the
//! layout bitsandbytes writes and QLoRA trains on (Dettmers et al. 2023,
//! "QLoRA: Efficient Finetuning of Quantized LLMs").
//!
//! A weight `(out, in)` is flattened row-major and cut into blocks of
//! [`BLOCK`] values. Each block is divided by its absolute maximum and each
//! value stored as the index of the nearest of the 16 [`NF4_CODE`] values,
//! two to a byte with the first value in the high nibble. The f32 block
//! maxima are quantised again ("double quantisation"): their mean is
//! subtracted (`offset`), and the rest is stored in blocks of
//! [`NESTED_BLOCK`] as u8 indices into bitsandbytes' signed 8-bit dynamic
//! map ([`dynamic_map`]) times one f32 maximum a block (`nested_absmax`).
//! A value is then
//!
//! ```text
//! NF4_CODE[nibble] * (dynamic_map[absmax_code] * nested_absmax[block / 256] + offset)
//! ```
//!
//! every product and sum rounded to f32 separately, so the CPU path and the
//! CUDA kernel (`kernels/nf4.cu`) give the same bits. Quantisation runs on
//! the CPU (rayon over blocks) and matches bitsandbytes' own CPU
//! `quantize_4bit(..., compress_statistics=True, quant_type="nf4")` byte for
//! byte (tested against `tests/fixtures/nf4_reference`).

use std::sync::{Mutex, OnceLock};

use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Result, Storage, Tensor, bail};
use half::{bf16, f16};
use rayon::prelude::*;

/// Values a block shares one absmax.
pub const BLOCK: usize = 64;
/// Block maxima a second-level block shares one nested absmax.
pub const NESTED_BLOCK: usize = 256;

/// The NF4 data type: quantiles of N(0, 1) rescaled to [-1, 1], with an
/// exact zero (QLoRA, appendix E; bitsandbytes' `get_4bit_type("nf4")`).
/// Written as bitsandbytes writes them; each rounds to the same f32.
#[allow(clippy::excessive_precision)]
pub const NF4_CODE: [f32; 16] = [
    -1.0,
    -0.696_192_800_998_687_7,
    -0.525_073_051_452_636_7,
    -0.394_917_488_098_144_53,
    -0.284_441_381_692_886_35,
    -0.184_773_430_228_233_34,
    -0.091_050_036_251_544_95,
    0.0,
    0.079_580_299_556_255_34,
    0.160_930_201_411_247_25,
    0.246_112_301_945_686_34,
    0.337_915_241_718_292_24,
    0.440_709_829_330_444_34,
    0.562_617_003_917_694_1,
    0.722_956_836_223_602_3,
    1.0,
];

/// Entries of the 8-bit dynamic map.
const MAP_LEN: usize = 256;
/// The lookup table the CUDA kernel reads: the dynamic map, then the NF4
/// codes.
const LUT_LEN: usize = MAP_LEN + NF4_CODE.len();

/// `n` evenly spaced f32 values from `start` to `end`, rounded as
/// PyTorch's `torch.linspace(start, end, n, dtype=torch.float32)` rounds
/// them on x86 CPUs with AVX2 or AVX-512 (where bitsandbytes builds its
/// map): the step in f32, the first half `start + step * i` and the second
/// half `end - step * (n - 1 - i)`, each a fused multiply-add.
fn linspace_f32(start: f32, end: f32, n: usize) -> Vec<f32> {
    if n == 1 {
        return vec![start];
    }
    let step = (end - start) / (n - 1) as f32;
    (0..n)
        .map(|i| {
            if i < n / 2 {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((n - 1 - i) as f32, end)
            }
        })
        .collect()
}

/// bitsandbytes' signed 8-bit dynamic quantisation map
/// (`create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)`),
/// sorted ascending: for each decade `10^(e - 6)`, `e` in 0..7, the
/// midpoints of `2^e + 1` points evenly spaced on [0.1, 1] scaled by the
/// decade, with both signs, then 0 and 1. 127 negative values (the lowest
/// -0.99297), 0 at index 127, 128 positive values (the highest 1.0).
pub fn dynamic_map() -> &'static [f32; MAP_LEN] {
    static MAP: OnceLock<[f32; MAP_LEN]> = OnceLock::new();
    MAP.get_or_init(|| {
        const EXPONENT_BITS: i32 = 7;
        let mut values = Vec::with_capacity(MAP_LEN);
        for e in 0..EXPONENT_BITS {
            let bounds = linspace_f32(0.1, 1.0, (1usize << e) + 1);
            // The decade as f32, as PyTorch casts a Python scalar factor.
            let decade = 10f64.powi(e - (EXPONENT_BITS - 1)) as f32;
            for pair in bounds.windows(2) {
                let mean = (pair[0] + pair[1]) / 2.0;
                values.push(decade * mean);
                values.push(-decade * mean);
            }
        }
        values.push(0.0);
        values.push(1.0);
        assert_eq!(values.len(), MAP_LEN, "the dynamic map has 256 entries");
        values.sort_by(f32::total_cmp);
        values.try_into().expect("256 entries")
    })
}

/// The decision boundaries of NF4: midpoints of neighbouring codes in f32.
fn nf4_bounds() -> [f32; 15] {
    std::array::from_fn(|i| (NF4_CODE[i] + NF4_CODE[i + 1]) / 2.0)
}

/// Index of the NF4 code nearest `x` (in [-1, 1]); a value on a midpoint
/// takes the lower code, as `torch.bucketize(x, midpoints)` does.
#[inline]
fn nf4_index(x: f32, bounds: &[f32; 15]) -> u8 {
    bounds.iter().filter(|&&b| b < x).count() as u8
}

/// Index of the dynamic-map entry nearest `x`; ties take the lower index.
fn map_index(x: f32, map: &[f32; MAP_LEN]) -> u8 {
    // The last entry not above `x` (or the first, below the map).
    let left = map.partition_point(|&m| m <= x).saturating_sub(1);
    let right = (left + 1).min(MAP_LEN - 1);
    if (x - map[right]).abs() < (x - map[left]).abs() {
        right as u8
    } else {
        left as u8
    }
}

/// A frozen `(out, in)` weight in NF4 with double-quantised block maxima.
/// The tensors live on the device the weight was quantised for.
#[derive(Debug, Clone)]
pub struct Nf4Weight {
    /// `(out * in / 2,)` u8, two values a byte, the first in the high nibble.
    packed: Tensor,
    /// `(out * in / 64,)` u8, indices into [`dynamic_map`].
    absmax_codes: Tensor,
    /// `(ceil(out * in / 64 / 256),)` f32.
    nested_absmax: Tensor,
    /// The mean of the block maxima, subtracted before their quantisation.
    offset: f32,
    /// `(out, in)`.
    shape: (usize, usize),
    /// [`dynamic_map`] then [`NF4_CODE`] as an f32 tensor on the weight's
    /// device (for the CUDA kernel), shared by every weight of the device.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    lut: Tensor,
    /// [`Self::block_scales`], made on first use.
    scales: OnceLock<Tensor>,
}

/// The quantised parts of a weight as host slices.
struct HostParts<'a> {
    packed: &'a [u8],
    absmax_codes: &'a [u8],
    nested_absmax: &'a [f32],
    offset: f32,
}

impl HostParts<'_> {
    /// The f32 absmax of 64-block `block`.
    #[inline]
    fn absmax(&self, block: usize, map: &[f32; MAP_LEN]) -> f32 {
        let code = map[self.absmax_codes[block] as usize];
        code * self.nested_absmax[block / NESTED_BLOCK] + self.offset
    }

    /// Writes the dense weight into `out` (row-major, `2 * packed.len()`
    /// values), in parallel over blocks.
    fn dequantize_into<T: Send>(&self, out: &mut [T], convert: impl Fn(f32) -> T + Sync) {
        let map = dynamic_map();
        out.par_chunks_mut(BLOCK)
            .zip(self.packed.par_chunks(BLOCK / 2))
            .enumerate()
            .for_each(|(block, (values, bytes))| {
                let absmax = self.absmax(block, map);
                for (pair, &byte) in values.chunks_exact_mut(2).zip(bytes) {
                    pair[0] = convert(NF4_CODE[(byte >> 4) as usize] * absmax);
                    pair[1] = convert(NF4_CODE[(byte & 0x0f) as usize] * absmax);
                }
            });
    }
}

/// A contiguous CPU slice of `t` in its own dtype.
fn cpu_slice<'a, T: candle_core::WithDType>(
    storage: &'a Storage,
    layout: &Layout,
) -> Result<&'a [T]> {
    let Storage::Cpu(cpu) = storage else {
        bail!("nf4: expected a CPU tensor")
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("nf4: expected a contiguous tensor")
    };
    Ok(&cpu.as_slice::<T>()?[start..end])
}

/// One f32 tensor of the lookup table a device, made once and shared.
fn device_lut(device: &Device) -> Result<Tensor> {
    static LUTS: Mutex<Vec<(Device, Tensor)>> = Mutex::new(Vec::new());
    let mut luts = LUTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, lut)) = luts.iter().find(|(d, _)| d.same_device(device)) {
        return Ok(lut.clone());
    }
    let mut values = Vec::with_capacity(LUT_LEN);
    values.extend_from_slice(dynamic_map());
    values.extend_from_slice(&NF4_CODE);
    let lut = Tensor::from_vec(values, LUT_LEN, device)?;
    luts.push((device.clone(), lut.clone()));
    Ok(lut)
}

impl Nf4Weight {
    /// Quantises a 2-D float weight (f32, bf16 or f16, on any device) on
    /// the CPU, as bitsandbytes' `quantize_4bit(w, blocksize=64,
    /// compress_statistics=True, quant_type="nf4")` does, and puts the
    /// result on the weight's device. Its element count must be a multiple
    /// of 64, and its values finite.
    pub fn quantize(w: &Tensor) -> Result<Self> {
        let (rows, cols) = w.dims2()?;
        let numel = rows * cols;
        if numel == 0 || !numel.is_multiple_of(BLOCK) {
            bail!(
                "nf4: cannot quantise a ({rows}, {cols}) weight: its {numel} values are not a \
                 positive multiple of the block size {BLOCK}"
            );
        }
        let device = w.device().clone();
        let host = w.to_device(&Device::Cpu)?.contiguous()?;
        let (storage, layout) = host.storage_and_layout();
        let (packed, absmax) = match host.dtype() {
            DType::F32 => quantize_blocks(cpu_slice::<f32>(&storage, layout)?, |x| x),
            DType::BF16 => quantize_blocks(cpu_slice::<bf16>(&storage, layout)?, bf16::to_f32),
            DType::F16 => quantize_blocks(cpu_slice::<f16>(&storage, layout)?, f16::to_f32),
            dtype => bail!("nf4: cannot quantise a {dtype:?} weight; expected f32, bf16 or f16"),
        }
        .map_err(|index| {
            candle_core::Error::Msg(format!(
                "nf4: cannot quantise a ({rows}, {cols}) weight: value {index} (row {}, column \
                 {}) is not finite",
                index / cols,
                index % cols
            ))
        })?;
        drop(storage);
        let (absmax_codes, nested_absmax, offset) = quantize_absmax(&absmax);
        Ok(Self {
            packed: Tensor::from_vec(packed, numel / 2, &device)?,
            absmax_codes: Tensor::from_vec(absmax_codes, numel / BLOCK, &device)?,
            nested_absmax: Tensor::from_vec(
                nested_absmax,
                absmax.len().div_ceil(NESTED_BLOCK),
                &device,
            )?,
            offset,
            shape: (rows, cols),
            lut: device_lut(&device)?,
            scales: OnceLock::new(),
        })
    }

    /// A weight from parts quantised elsewhere, e.g. a bitsandbytes
    /// checkpoint's `weight` (packed), `absmax` (codes), `nested_absmax` and
    /// `offset`: 1-D tensors of `out * in / 2` u8, `out * in / 64` u8 and
    /// `ceil(out * in / 16384)` f32 on one device.
    pub fn from_parts(
        packed: Tensor,
        absmax_codes: Tensor,
        nested_absmax: Tensor,
        offset: f32,
        shape: (usize, usize),
    ) -> Result<Self> {
        let numel = shape.0 * shape.1;
        if numel == 0 || !numel.is_multiple_of(BLOCK) {
            bail!(
                "nf4: a {shape:?} weight's {numel} values are not a positive multiple of {BLOCK}"
            );
        }
        let expect = [
            ("packed", &packed, DType::U8, numel / 2),
            ("absmax_codes", &absmax_codes, DType::U8, numel / BLOCK),
            (
                "nested_absmax",
                &nested_absmax,
                DType::F32,
                (numel / BLOCK).div_ceil(NESTED_BLOCK),
            ),
        ];
        for (name, t, dtype, len) in expect {
            if t.dtype() != dtype || t.dims() != [len] {
                bail!(
                    "nf4: `{name}` of a {shape:?} weight must be ({len},) {dtype:?}, got {:?} {:?}",
                    t.shape(),
                    t.dtype()
                );
            }
            if !t.device().same_device(packed.device()) {
                bail!("nf4: `{name}` is not on the device of `packed`");
            }
        }
        let lut = device_lut(packed.device())?;
        Ok(Self {
            packed: packed.contiguous()?,
            absmax_codes: absmax_codes.contiguous()?,
            nested_absmax: nested_absmax.contiguous()?,
            offset,
            shape,
            lut,
            scales: OnceLock::new(),
        })
    }

    /// `(out, in)`.
    pub fn shape(&self) -> (usize, usize) {
        self.shape
    }

    pub fn device(&self) -> &Device {
        self.packed.device()
    }

    /// The packed 4-bit codes, `(out * in / 2,)` u8, first value in the high
    /// nibble.
    pub fn packed(&self) -> &Tensor {
        &self.packed
    }

    /// The block maxima as u8 indices into [`dynamic_map`], `(out * in / 64,)`.
    pub fn absmax_codes(&self) -> &Tensor {
        &self.absmax_codes
    }

    /// One f32 scale a 256 block maxima, `(ceil(out * in / 16384),)`.
    pub fn nested_absmax(&self) -> &Tensor {
        &self.nested_absmax
    }

    /// The mean of the block maxima.
    pub fn offset(&self) -> f32 {
        self.offset
    }

    /// Every block's absmax as f16, chunk-major: `(in / 64, out)`, entry
    /// `(c, n)` the scale of row `n`'s block `c` (the decode kernel reads
    /// two rows' scales with one load). Made once, on the host, from the
    /// double-quantised maxima (each product and sum rounded to f32 as in
    /// dequantisation), and kept on the weight's device: about 3% of the
    /// packed codes' bytes. Needs `in` to be whole blocks.
    pub fn block_scales(&self) -> Result<&Tensor> {
        if let Some(t) = self.scales.get() {
            return Ok(t);
        }
        let (rows, cols) = self.shape;
        if cols % BLOCK != 0 {
            bail!("nf4: block scales need rows of whole {BLOCK}-blocks, not {cols} values");
        }
        let chunks = cols / BLOCK;
        let codes = self.absmax_codes.to_device(&Device::Cpu)?.to_vec1::<u8>()?;
        let nested = self
            .nested_absmax
            .to_device(&Device::Cpu)?
            .to_vec1::<f32>()?;
        let parts = HostParts {
            packed: &[],
            absmax_codes: &codes,
            nested_absmax: &nested,
            offset: self.offset,
        };
        let map = dynamic_map();
        let mut out = vec![f16::ZERO; rows * chunks];
        out.par_chunks_mut(rows).enumerate().for_each(|(c, line)| {
            for (n, v) in line.iter_mut().enumerate() {
                *v = f16::from_f32(parts.absmax(n * chunks + c, map));
            }
        });
        let t = Tensor::from_vec(out, (chunks, rows), self.device())?;
        Ok(self.scales.get_or_init(|| t))
    }

    /// Bytes this weight keeps on its device: packed codes, absmax codes,
    /// nested maxima and the offset (the 1 KiB lookup table is shared by
    /// every weight of a device and not counted). About 0.516 bytes a value.
    pub fn storage_bytes(&self) -> usize {
        self.packed.elem_count()
            + self.absmax_codes.elem_count()
            + 4 * self.nested_absmax.elem_count()
            + 4
    }

    /// The dense `(out, in)` weight in `dtype` (f32, bf16 or f16) on the
    /// weight's device: on CUDA by the kernel in `kernels/nf4.cu`, on
    /// the CPU in parallel over blocks. Both give the same bits.
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        check_out_dtype(dtype)?;
        match self.device() {
            Device::Cpu => self.dequantize_on_cpu(dtype),
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => cuda::dequantize(self, dev, dtype),
            device => bail!("nf4: dequantisation is not implemented on {device:?}"),
        }
    }

    /// [`Self::dequantize`] to f32, e.g. to merge an adapter into the
    /// weight before writing the model in its own dtype.
    pub fn to_dense_f32(&self) -> Result<Tensor> {
        self.dequantize(DType::F32)
    }

    /// Writes the dense weight into `out`, a contiguous `(out, in)` f32,
    /// bf16 or f16 tensor on the weight's device, without allocating: for a
    /// buffer reused across layers.
    pub fn dequantize_into(&self, out: &Tensor) -> Result<()> {
        if out.dims() != [self.shape.0, self.shape.1] {
            bail!(
                "nf4: dequantize_into needs a {:?} tensor, got {:?}",
                self.shape,
                out.shape()
            );
        }
        check_out_dtype(out.dtype())?;
        if !out.device().same_device(self.device()) {
            bail!(
                "nf4: dequantize_into needs a tensor on the weight's device {:?}, got one on {:?}",
                self.device(),
                out.device()
            );
        }
        out.inplace_op1(&DequantizeInto { weight: self })
    }

    /// The dense weight computed on the CPU whatever device the weight is
    /// on, returned on the CPU (the reference for the CUDA kernel).
    pub fn dequantize_on_cpu(&self, dtype: DType) -> Result<Tensor> {
        check_out_dtype(dtype)?;
        let numel = self.shape.0 * self.shape.1;
        self.with_host_parts(|parts| match dtype {
            DType::F32 => {
                let mut out = vec![0f32; numel];
                parts.dequantize_into(&mut out, |x| x);
                Tensor::from_vec(out, self.shape, &Device::Cpu)
            }
            DType::BF16 => {
                let mut out = vec![bf16::ZERO; numel];
                parts.dequantize_into(&mut out, bf16::from_f32);
                Tensor::from_vec(out, self.shape, &Device::Cpu)
            }
            DType::F16 => {
                let mut out = vec![f16::ZERO; numel];
                parts.dequantize_into(&mut out, f16::from_f32);
                Tensor::from_vec(out, self.shape, &Device::Cpu)
            }
            _ => unreachable!("checked above"),
        })?
    }

    /// Runs `f` on host slices of the quantised parts: borrowed when the
    /// weight is on the CPU, copied from the device otherwise.
    fn with_host_parts<R>(&self, f: impl FnOnce(&HostParts) -> R) -> Result<R> {
        if self.device().is_cpu() {
            let (packed, packed_layout) = self.packed.storage_and_layout();
            let (codes, codes_layout) = self.absmax_codes.storage_and_layout();
            let (nested, nested_layout) = self.nested_absmax.storage_and_layout();
            let parts = HostParts {
                packed: cpu_slice(&packed, packed_layout)?,
                absmax_codes: cpu_slice(&codes, codes_layout)?,
                nested_absmax: cpu_slice(&nested, nested_layout)?,
                offset: self.offset,
            };
            Ok(f(&parts))
        } else {
            let packed = self.packed.to_vec1::<u8>()?;
            let codes = self.absmax_codes.to_vec1::<u8>()?;
            let nested = self.nested_absmax.to_vec1::<f32>()?;
            let parts = HostParts {
                packed: &packed,
                absmax_codes: &codes,
                nested_absmax: &nested,
                offset: self.offset,
            };
            Ok(f(&parts))
        }
    }
}

fn check_out_dtype(dtype: DType) -> Result<()> {
    if matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
        Ok(())
    } else {
        bail!("nf4: cannot dequantise to {dtype:?}; expected f32, bf16 or f16")
    }
}

/// The first pass: per 64-block, the absmax and the packed NF4 codes of the
/// values scaled by its reciprocal, as bitsandbytes computes them (`x *
/// (1 / max(absmax, 1e-38))`, clamped to [-1, 1]). Returns the index of a
/// non-finite value instead.
fn quantize_blocks<T: Copy + Sync>(
    values: &[T],
    to_f32: impl Fn(T) -> f32 + Sync,
) -> std::result::Result<(Vec<u8>, Vec<f32>), usize> {
    let bounds = nf4_bounds();
    let mut packed = vec![0u8; values.len() / 2];
    let mut absmax = vec![0f32; values.len() / BLOCK];
    packed
        .par_chunks_mut(BLOCK / 2)
        .zip(absmax.par_iter_mut())
        .zip(values.par_chunks(BLOCK))
        .enumerate()
        .try_for_each(|(block, ((bytes, max), chunk))| {
            let mut floats = [0f32; BLOCK];
            for (i, (f, &v)) in floats.iter_mut().zip(chunk).enumerate() {
                *f = to_f32(v);
                if !f.is_finite() {
                    return Err(block * BLOCK + i);
                }
            }
            *max = floats.iter().fold(0f32, |m, x| m.max(x.abs()));
            let scale = 1.0 / max.max(1e-38);
            let index = |x: f32| nf4_index((x * scale).clamp(-1.0, 1.0), &bounds);
            for (byte, pair) in bytes.iter_mut().zip(floats.chunks_exact(2)) {
                *byte = (index(pair[0]) << 4) | index(pair[1]);
            }
            Ok(())
        })?;
    Ok((packed, absmax))
}

/// The second quantisation, of the block maxima: subtract their mean, then
/// per 256 of them divide by their largest magnitude and store the nearest
/// dynamic-map entry (bitsandbytes' `quantize_blockwise(absmax - offset,
/// blocksize=256)`). Returns the codes, the nested maxima and the offset.
fn quantize_absmax(absmax: &[f32]) -> (Vec<u8>, Vec<f32>, f32) {
    let map = dynamic_map();
    let offset = (absmax.iter().map(|&a| f64::from(a)).sum::<f64>() / absmax.len() as f64) as f32;
    let mut codes = vec![0u8; absmax.len()];
    let nested: Vec<f32> = codes
        .par_chunks_mut(NESTED_BLOCK)
        .zip(absmax.par_chunks(NESTED_BLOCK))
        .map(|(codes, maxima)| {
            let centred = maxima.iter().map(|&a| a - offset);
            let nested = centred.clone().fold(0f32, |m, d| m.max(d.abs()));
            for (code, d) in codes.iter_mut().zip(centred) {
                let normed = if nested > 0.0 { d / nested } else { 0.0 };
                *code = map_index(normed, map);
            }
            nested
        })
        .collect();
    (codes, nested, offset)
}

/// [`Nf4Weight::dequantize_into`]'s in-place op.
struct DequantizeInto<'a> {
    weight: &'a Nf4Weight,
}

impl InplaceOp1 for DequantizeInto<'_> {
    fn name(&self) -> &'static str {
        "nf4-dequantize"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("nf4: dequantize_into needs a contiguous tensor")
        };
        self.weight.with_host_parts(|parts| match storage {
            CpuStorage::F32(out) => parts.dequantize_into(&mut out[start..end], |x| x),
            CpuStorage::BF16(out) => parts.dequantize_into(&mut out[start..end], bf16::from_f32),
            CpuStorage::F16(out) => parts.dequantize_into(&mut out[start..end], f16::from_f32),
            _ => unreachable!("dtype checked by the caller"),
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &mut candle_core::CudaStorage, layout: &Layout) -> Result<()> {
        cuda::dequantize_into(self.weight, storage, layout)
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DeviceRepr};
    use candle_core::cuda_backend::{CudaDType, CudaStorageSlice};
    use candle_core::op::BackpropOp;
    use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Storage, Tensor, bail};

    use super::Nf4Weight;
    use crate::cuda::kernels;

    /// A contiguous view of a CUDA tensor's data.
    fn view<'a, T: CudaDType>(storage: &'a Storage, layout: &Layout) -> Result<CudaView<'a, T>> {
        let Storage::Cuda(cuda) = storage else {
            bail!("nf4: expected a CUDA tensor")
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("nf4: expected a contiguous tensor")
        };
        Ok(cuda.as_cuda_slice::<T>()?.slice(start..end))
    }

    /// Launches the kernel writing into `out` (the weight's element count,
    /// 16-byte aligned).
    fn launch<T: DeviceRepr>(
        weight: &Nf4Weight,
        dev: &CudaDevice,
        kernel: &str,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        let (packed, packed_layout) = weight.packed.storage_and_layout();
        let (codes, codes_layout) = weight.absmax_codes.storage_and_layout();
        let (nested, nested_layout) = weight.nested_absmax.storage_and_layout();
        let (lut, lut_layout) = weight.lut.storage_and_layout();
        kernels::nf4_dequantize(
            dev,
            kernel,
            &kernels::Nf4Args {
                packed: &view::<u8>(&packed, packed_layout)?,
                absmax_codes: &view::<u8>(&codes, codes_layout)?,
                nested_absmax: &view::<f32>(&nested, nested_layout)?,
                lut: &view::<f32>(&lut, lut_layout)?,
                offset: weight.offset,
                numel: weight.shape.0 * weight.shape.1,
            },
            out,
        )
    }

    /// A freshly allocated dense weight.
    fn fresh<T: DeviceRepr + CudaDType>(
        weight: &Nf4Weight,
        dev: &CudaDevice,
        kernel: &str,
    ) -> Result<CudaStorage> {
        // SAFETY: the kernel writes every element before anything reads one.
        let mut out: CudaSlice<T> = unsafe { dev.alloc::<T>(weight.shape.0 * weight.shape.1)? };
        launch(weight, dev, kernel, &mut out.as_view_mut())?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }

    pub(super) fn dequantize(weight: &Nf4Weight, dev: &CudaDevice, dtype: DType) -> Result<Tensor> {
        let storage = match dtype {
            DType::F32 => fresh::<f32>(weight, dev, kernels::NF4_F32)?,
            DType::BF16 => fresh::<half::bf16>(weight, dev, kernels::NF4_BF16)?,
            DType::F16 => fresh::<half::f16>(weight, dev, kernels::NF4_F16)?,
            _ => unreachable!("dtype checked by the caller"),
        };
        Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            weight.shape,
            BackpropOp::none(),
            false,
        ))
    }

    pub(super) fn dequantize_into(
        weight: &Nf4Weight,
        storage: &mut CudaStorage,
        layout: &Layout,
    ) -> Result<()> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("nf4: dequantize_into needs a contiguous tensor")
        };
        let dev = storage.device().clone();
        if !(start * storage.dtype().size_in_bytes()).is_multiple_of(16) {
            bail!("nf4: dequantize_into needs a tensor starting on a 16-byte boundary")
        }
        match &mut storage.slice {
            CudaStorageSlice::F32(s) => {
                launch(weight, &dev, kernels::NF4_F32, &mut s.slice_mut(start..end))
            }
            CudaStorageSlice::BF16(s) => launch(
                weight,
                &dev,
                kernels::NF4_BF16,
                &mut s.slice_mut(start..end),
            ),
            CudaStorageSlice::F16(s) => {
                launch(weight, &dev, kernels::NF4_F16, &mut s.slice_mut(start..end))
            }
            _ => unreachable!("dtype checked by the caller"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::init::Rng;

    /// `n` standard normal values (Box-Muller on a seeded stream).
    fn normal(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::for_tensor(seed, "nf4");
        (0..n)
            .map(|_| {
                let u = 1.0 - rng.next_f64();
                let v = rng.next_f64();
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            })
            .collect()
    }

    fn weight(values: Vec<f32>, rows: usize, cols: usize) -> Tensor {
        Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap()
    }

    /// The f32 absmax of every 64-block, as the dequantisation rebuilds it.
    fn rebuilt_absmax(w: &Nf4Weight) -> Vec<f32> {
        let blocks = w.absmax_codes.elem_count();
        w.with_host_parts(|p| (0..blocks).map(|b| p.absmax(b, dynamic_map())).collect())
            .unwrap()
    }

    #[test]
    fn dynamic_map_has_bitsandbytes_shape() {
        let map = dynamic_map();
        assert_eq!(map.len(), 256);
        assert!(map.windows(2).all(|w| w[0] < w[1]), "strictly ascending");
        assert_eq!(map[127], 0.0);
        assert_eq!(map[255], 1.0);
        // The most negative value is -(0.9859375 + 1) / 2, not -1: the
        // negative half has no counterpart of 1.0.
        assert_eq!(map[0], -0.992_968_75);
        for i in 0..127 {
            assert_eq!(map[i], -map[254 - i], "entry {i} mirrors entry {}", 254 - i);
        }
        // The smallest magnitude: 1e-6 times the midpoint of [0.1, 1].
        assert_eq!(map[128], 1e-6f32 * 0.55);
        assert_eq!(map.iter().filter(|&&x| x == 1.0 || x == -1.0).count(), 1);
    }

    #[test]
    fn packs_a_hand_made_block_high_nibble_first() {
        let mut values = vec![0f32; 64];
        values[0] = -2.0; // code 0
        values[1] = 0.0; // code 7
        values[2] = 2.0; // code 15
        values[3] = 0.0;
        values[4] = 1.0; // 0.5: between 0.4407 and 0.5626, nearer the lower: code 12
        values[5] = -0.2; // -0.1: between -0.1848 and -0.0911, nearer the upper: code 6
        let w = Nf4Weight::quantize(&weight(values.clone(), 1, 64)).unwrap();
        let packed = w.packed().to_vec1::<u8>().unwrap();
        assert_eq!(packed.len(), 32);
        assert_eq!(&packed[..3], &[0x07, 0xf7, 0xc6]);
        assert!(packed[3..].iter().all(|&b| b == 0x77), "zeros are code 7");
        // One block: the offset is its absmax and the centred value 0 is
        // stored exactly, so the block's extremes and zeros come back exactly.
        assert_eq!(w.offset(), 2.0);
        assert_eq!(w.absmax_codes().to_vec1::<u8>().unwrap(), vec![127]);
        let dense = w.dequantize(DType::F32).unwrap().flatten_all().unwrap();
        let dense = dense.to_vec1::<f32>().unwrap();
        assert_eq!(&dense[..3], &[-2.0, 0.0, 2.0]);
        assert_eq!(dense[4], NF4_CODE[12] * 2.0);
        assert_eq!(dense[5], NF4_CODE[6] * 2.0);
    }

    #[test]
    fn round_trip_error_of_normal_weights_is_nf4s() {
        let (rows, cols) = (256, 1024);
        let values = normal(rows * cols, 7);
        let w = Nf4Weight::quantize(&weight(values.clone(), rows, cols)).unwrap();
        let dense = w.dequantize(DType::F32).unwrap();
        assert_eq!(dense.dims(), &[rows, cols]);
        let dense = dense.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let abs_err: f64 = values
            .iter()
            .zip(&dense)
            .map(|(a, b)| f64::from((a - b).abs()))
            .sum();
        let abs_w: f64 = values.iter().map(|a| f64::from(a.abs())).sum();
        let relative = abs_err / abs_w;
        println!("NF4 round trip: mean abs error / mean abs weight = {relative:.4}");
        // Measured 0.0913 here; bitsandbytes 0.50.2 gave 0.091 on a (128, 64)
        // N(0, 1) weight. A packing or scale bug gives far more.
        assert!(
            (0.08..0.10).contains(&relative),
            "relative error {relative}"
        );
    }

    /// Largest gap between neighbouring dynamic-map entries (near +-1).
    fn max_map_gap() -> f32 {
        dynamic_map()
            .windows(2)
            .map(|w| w[1] - w[0])
            .fold(0f32, f32::max)
    }

    #[test]
    fn double_quantised_absmax_comes_back_within_a_percent() {
        let (rows, cols) = (512, 512);
        let values = normal(rows * cols, 11);
        let w = Nf4Weight::quantize(&weight(values.clone(), rows, cols)).unwrap();
        assert_eq!(w.nested_absmax().elem_count(), 16);
        let rebuilt = rebuilt_absmax(&w);
        let mut worst = 0f32;
        for (block, chunk) in values.chunks(64).enumerate() {
            let truth = chunk.iter().fold(0f32, |m, x| m.max(x.abs()));
            worst = worst.max((rebuilt[block] - truth).abs() / truth);
        }
        println!("double-quantised absmax: worst relative error {worst:.4}");
        // Measured 0.0072 here: the map steps are under 1.5% of the largest
        // deviation from the mean absmax, which is small on N(0, 1) weights.
        assert!(worst < 0.01, "worst relative absmax error {worst}");
        assert!(worst > 0.0, "the absmax is quantised, so not exact");
    }

    #[test]
    fn double_quantised_absmax_error_is_half_a_map_step() {
        // Rows of scales 1 to 13: small blocks lose relative precision (the
        // map's steps are relative to the largest deviation from the mean),
        // but never more than half a step of the map.
        let (rows, cols) = (512, 512);
        let mut values = normal(rows * cols, 11);
        for (i, v) in values.iter_mut().enumerate() {
            *v *= 0.01 * (1 + (i / cols) % 13) as f32;
        }
        let w = Nf4Weight::quantize(&weight(values.clone(), rows, cols)).unwrap();
        let rebuilt = rebuilt_absmax(&w);
        let nested = w.nested_absmax().to_vec1::<f32>().unwrap();
        let half_step = max_map_gap() / 2.0;
        for (block, chunk) in values.chunks(64).enumerate() {
            let truth = chunk.iter().fold(0f32, |m, x| m.max(x.abs()));
            let bound = nested[block / NESTED_BLOCK] * half_step * 1.001 + 1e-7;
            assert!(
                (rebuilt[block] - truth).abs() <= bound,
                "block {block}: {} vs {truth}",
                rebuilt[block]
            );
        }
    }

    #[test]
    fn rejects_bad_shapes_and_values() {
        let err = Nf4Weight::quantize(&weight(vec![0.5; 15], 3, 5)).unwrap_err();
        assert!(
            err.to_string().contains(
                "cannot quantise a (3, 5) weight: its 15 values are not a positive multiple of \
                 the block size 64"
            ),
            "{err}"
        );
        let cube = Tensor::zeros((2, 4, 64), DType::F32, &Device::Cpu).unwrap();
        assert!(Nf4Weight::quantize(&cube).is_err());
        let mut values = vec![0.5; 128];
        values[70] = f32::NAN;
        let err = Nf4Weight::quantize(&weight(values, 2, 64)).unwrap_err();
        assert!(
            err.to_string()
                .contains("value 70 (row 1, column 6) is not finite"),
            "{err}"
        );
        let ints = Tensor::zeros((1, 64), DType::U32, &Device::Cpu).unwrap();
        assert!(Nf4Weight::quantize(&ints).is_err());
    }

    #[test]
    fn dtypes_and_dequantize_into_agree() {
        let (rows, cols) = (64, 192);
        let values = normal(rows * cols, 3);
        let f32_weight = weight(values, rows, cols);
        let bf16_weight = f32_weight.to_dtype(DType::BF16).unwrap();
        let from_bf16 = Nf4Weight::quantize(&bf16_weight).unwrap();
        let from_f32 = Nf4Weight::quantize(&bf16_weight.to_dtype(DType::F32).unwrap()).unwrap();
        let from_f16 = Nf4Weight::quantize(&f32_weight.to_dtype(DType::F16).unwrap()).unwrap();
        assert_eq!(
            from_bf16.packed().to_vec1::<u8>().unwrap(),
            from_f32.packed().to_vec1::<u8>().unwrap()
        );
        assert_eq!(from_bf16.offset(), from_f32.offset());
        assert_eq!(from_f16.shape(), (rows, cols));
        assert_eq!(
            from_bf16.storage_bytes(),
            rows * cols / 2 + rows * cols / 64 + 4 + 4
        );

        let dense_f32 = from_bf16.to_dense_f32().unwrap();
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let dense = from_bf16.dequantize(dtype).unwrap();
            assert_eq!(dense.dtype(), dtype);
            // Each value is rounded once, from the same f32.
            let expected = dense_f32.to_dtype(dtype).unwrap();
            assert_eq!(
                crate::common::max_abs_diff(&dense, &expected),
                0.0,
                "{dtype:?}"
            );
            let out = Tensor::ones((rows, cols), dtype, &Device::Cpu).unwrap();
            from_bf16.dequantize_into(&out).unwrap();
            assert_eq!(
                crate::common::max_abs_diff(&out, &expected),
                0.0,
                "{dtype:?} into"
            );
        }
        let wrong = Tensor::zeros((cols, rows), DType::F32, &Device::Cpu).unwrap();
        assert!(from_bf16.dequantize_into(&wrong).is_err());
        assert!(from_bf16.dequantize(DType::U8).is_err());
    }

    #[test]
    fn quantises_like_bitsandbytes() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/nf4_reference/reference.safetensors"
        );
        let r = candle_core::safetensors::load(path, &Device::Cpu).unwrap();
        let get = |name: &str| {
            r.get(name)
                .unwrap_or_else(|| panic!("{name} in the fixture"))
        };
        assert_eq!(
            get("dynamic_map").to_vec1::<f32>().unwrap(),
            dynamic_map().to_vec(),
            "create_dynamic_map(signed=True)"
        );
        let w = Nf4Weight::quantize(get("weight")).unwrap();
        assert_eq!(
            w.packed().to_vec1::<u8>().unwrap(),
            get("packed").to_vec1::<u8>().unwrap(),
            "NF4 codes, high nibble first"
        );
        assert_eq!(w.offset(), get("offset").to_vec1::<f32>().unwrap()[0]);
        assert_eq!(
            w.nested_absmax().to_vec1::<f32>().unwrap(),
            get("nested_absmax").to_vec1::<f32>().unwrap()
        );
        // bitsandbytes' CPU search for the absmax codes is approximate: for a
        // few blocks it keeps a neighbour of the nearest map entry. Ours is
        // the nearest; everywhere else the codes are the same.
        let map = dynamic_map();
        let ours = w.absmax_codes().to_vec1::<u8>().unwrap();
        let theirs = get("absmax_codes").to_vec1::<u8>().unwrap();
        let rebuilt = rebuilt_absmax(&w);
        let nested = w.nested_absmax().to_vec1::<f32>().unwrap();
        let mut differing = 0;
        for (block, (&a, &b)) in ours.iter().zip(&theirs).enumerate() {
            if a != b {
                differing += 1;
                let normed = (rebuilt[block] - w.offset()) / nested[block / NESTED_BLOCK];
                let x = (rebuilt_true_absmax(get("weight"), block) - w.offset())
                    / nested[block / NESTED_BLOCK];
                assert!(
                    (x - map[a as usize]).abs() < (x - map[b as usize]).abs(),
                    "block {block}: ours {a} is not nearer {x} than bitsandbytes' {b} ({normed})"
                );
            }
        }
        assert!(differing <= 4, "{differing} absmax codes differ");
        // Dequantising bitsandbytes' own parts gives its values exactly.
        let parts = Nf4Weight::from_parts(
            get("packed").clone(),
            get("absmax_codes").clone(),
            get("nested_absmax").clone(),
            get("offset").to_vec1::<f32>().unwrap()[0],
            (80, 256),
        )
        .unwrap();
        let dense = parts.dequantize(DType::F32).unwrap();
        assert_eq!(
            crate::common::max_abs_diff(&dense, get("dequantized_f32")),
            0.0
        );
    }

    /// The exact absmax of 64-block `block` of `w`.
    fn rebuilt_true_absmax(w: &Tensor, block: usize) -> f32 {
        let values = w.to_dtype(DType::F32).unwrap().flatten_all().unwrap();
        let values = values.to_vec1::<f32>().unwrap();
        values[block * BLOCK..(block + 1) * BLOCK]
            .iter()
            .fold(0f32, |m, x| m.max(x.abs()))
    }

    /// The CUDA kernel against the CPU path, bit for bit, on a Qwen3-4B MLP
    /// shape, for each output dtype, fresh and into a reused buffer.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_dequantize_matches_cpu_bit_for_bit() {
        let Ok(cuda) = Device::new_cuda(0) else {
            println!("SKIPPED: no CUDA device");
            return;
        };
        let (rows, cols) = (2560, 9728);
        let mut values = normal(rows * cols, 5);
        for (i, v) in values.iter_mut().enumerate() {
            *v *= 0.02 * (1 + (i / cols) % 7) as f32;
        }
        let host = weight(values, rows, cols).to_dtype(DType::BF16).unwrap();
        let on_gpu = Nf4Weight::quantize(&host.to_device(&cuda).unwrap()).unwrap();
        assert!(on_gpu.device().is_cuda());
        let on_cpu = Nf4Weight::quantize(&host).unwrap();
        assert_eq!(on_gpu.offset(), on_cpu.offset());
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let expected = on_cpu.dequantize(dtype).unwrap();
            let bytes = |t: &Tensor| -> Vec<u32> {
                t.to_device(&Device::Cpu)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect()
            };
            let gpu = on_gpu.dequantize(dtype).unwrap();
            assert!(gpu.device().is_cuda());
            assert_eq!(gpu.dtype(), dtype);
            assert!(
                bytes(&gpu) == bytes(&expected),
                "{dtype:?}: GPU and CPU differ"
            );
            let cpu_of_gpu = on_gpu.dequantize_on_cpu(dtype).unwrap();
            assert!(
                bytes(&cpu_of_gpu) == bytes(&expected),
                "{dtype:?}: host copy"
            );
            let buffer = Tensor::zeros((rows, cols), dtype, &cuda).unwrap();
            on_gpu.dequantize_into(&buffer).unwrap();
            assert!(
                bytes(&buffer) == bytes(&expected),
                "{dtype:?}: into a buffer"
            );
        }
    }
}
