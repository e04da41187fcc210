//! FP8 base weights: a frozen projection held as E4M3 codes with one f32
//! scale an output channel (its largest magnitude over 448, E4M3's largest
//! finite value), half the bytes of bf16.
//!
//! The forward product `x W^T` quantises `x` on the fly, one scale a row
//! (a token), and multiplies the codes in FP8 on CUDA (cuBLASLt, see
//! `crate::cuda::fp8`): `y[i, j] = sx[i] sw[j] (qx[i] . qw[j])`, summed in
//! f32. The input gradient `g W` multiplies by the weight dequantised to
//! bf16, as NF4's backward does. On the CPU (the tests' reference) the
//! same codes are made with candle's E4M3 conversion and multiplied after
//! dequantising, so the CPU and CUDA results differ only in the order of
//! the sums.

use candle_core::{D, DType, Device, Result, Tensor};

/// E4M3's largest finite magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// Rows as E4M3 codes and one f32 scale each.
#[derive(Debug, Clone)]
pub struct Fp8Rows {
    /// `(rows, cols)`, dtype `F8E4M3`.
    pub codes: Tensor,
    /// `(rows,)` f32: row `r`'s values are `codes[r] * scales[r]`.
    pub scales: Tensor,
}

impl Fp8Rows {
    /// `x: (rows, cols)` quantised a row at a time.
    pub fn quantize(x: &Tensor) -> Result<Self> {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            // Other dtypes through bf16 (an f32 of a bf16 weight is exact in
            // it); rows of a multiple of 8 values, as every model's are.
            let (codes, scales) = crate::cuda::fp8::quantize_rows(&x.to_dtype(DType::BF16)?)?;
            return Ok(Self { codes, scales });
        }
        let x = x.to_dtype(DType::F32)?;
        let absmax = x.abs()?.max_keepdim(D::Minus1)?; // (rows, 1)
        // An all-zero row gets scale 1 (its codes are zeros either way).
        let zero = absmax.eq(0f32)?.to_dtype(DType::F32)?;
        let scales = ((absmax / f64::from(E4M3_MAX))? + zero)?;
        let codes = x
            .broadcast_div(&scales)?
            .clamp(-E4M3_MAX, E4M3_MAX)?
            .to_dtype(DType::F8E4M3)?;
        Ok(Self {
            codes,
            scales: scales.squeeze(1)?,
        })
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> Result<(usize, usize)> {
        self.codes.dims2()
    }

    /// The values the codes stand for, in `dtype`.
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if self.codes.device().is_cuda() {
            // candle's own E4M3 casts are not in its CUDA kernels for every
            // architecture: ours, through f32 for other dtypes.
            return match dtype {
                DType::BF16 | DType::F32 => {
                    crate::cuda::fp8::dequantize_rows(&self.codes, &self.scales, dtype)
                }
                _ => crate::cuda::fp8::dequantize_rows(&self.codes, &self.scales, DType::F32)?
                    .to_dtype(dtype),
            };
        }
        self.codes
            .to_dtype(DType::F32)?
            .broadcast_mul(&self.scales.unsqueeze(1)?)?
            .to_dtype(dtype)
    }

    /// Bytes the codes and scales take.
    pub fn storage_bytes(&self) -> usize {
        self.codes.elem_count() + 4 * self.scales.elem_count()
    }
}

/// A frozen projection's `(out, in)` weight in FP8, used as `dtype`.
#[derive(Debug, Clone)]
pub struct Fp8Weight {
    rows: Fp8Rows,
    dtype: DType,
}

impl Fp8Weight {
    /// `w: (out, in)` quantised an output channel at a time.
    pub fn quantize(w: &Tensor) -> Result<Self> {
        Ok(Self {
            rows: Fp8Rows::quantize(&w.contiguous()?)?,
            dtype: w.dtype(),
        })
    }

    /// `(out, in)`.
    pub fn shape(&self) -> Result<(usize, usize)> {
        self.rows.shape()
    }

    /// The dtype the weight was loaded in and is used as.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        self.rows.codes.device()
    }

    /// The codes and their per-channel scales.
    pub fn rows(&self) -> &Fp8Rows {
        &self.rows
    }

    /// The weight as a dense `(out, in)` tensor in `dtype`.
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        self.rows.dequantize(dtype)
    }

    /// Bytes the weight occupies.
    pub fn storage_bytes(&self) -> usize {
        self.rows.storage_bytes()
    }

    /// `x (N, in) -> (N, out)` in `x`'s dtype: `x` quantised a row at a
    /// time and multiplied by the codes (FP8 products on CUDA where
    /// cuBLASLt has them for the shape; else the dequantised values of
    /// both).
    pub fn product(&self, x: &Tensor) -> Result<Tensor> {
        let qx = Fp8Rows::quantize(x)?;
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() && x.dtype() == DType::BF16 {
            for &scaling in scalings() {
                if let Some(y) = crate::cuda::fp8::product(
                    &qx.codes,
                    &qx.scales,
                    &self.rows.codes,
                    &self.rows.scales,
                    scaling,
                )? {
                    return Ok(y);
                }
            }
            // No FP8 product for this shape: the dequantised values of
            // both, in bf16.
            let xd = qx.dequantize(DType::BF16)?;
            let wd = self.rows.dequantize(DType::BF16)?;
            return xd.matmul(&wd.t()?);
        }
        let xd = qx.dequantize(DType::F32)?;
        let wd = self.rows.dequantize(DType::F32)?;
        xd.matmul(&wd.t()?)?.to_dtype(x.dtype())
    }
}

/// The product's scalings to try on CUDA, in order: cuBLASLt's
/// outer-vector scales, then unit scales and a rescaling kernel;
/// `TRACE_TRAIN_FP8_SCALING=outer|unit|unit_fast` keeps one.
/// Read once a process: every projection of every step asks.
#[cfg(feature = "cuda")]
fn scalings() -> &'static [crate::cuda::fp8::Scaling] {
    use crate::cuda::fp8::Scaling::{Outer, Unit, UnitFast};
    static CHOSEN: std::sync::OnceLock<&'static [crate::cuda::fp8::Scaling]> =
        std::sync::OnceLock::new();
    CHOSEN.get_or_init(
        || match std::env::var("TRACE_TRAIN_FP8_SCALING").as_deref() {
            Ok("unit") => &[Unit],
            Ok("unit_fast") => &[UnitFast],
            Ok("outer") => &[Outer],
            _ => &[Outer, Unit],
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::init::Rng;

    fn rand(rows: usize, cols: usize, seed: u64) -> Tensor {
        let v = Rng::for_tensor(seed, "fp8").uniform(rows * cols, -1.0, 1.0);
        Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
    }

    fn rel(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).unwrap().sqr().unwrap().sum_all().unwrap();
        let n = b.sqr().unwrap().sum_all().unwrap();
        (d.to_scalar::<f32>().unwrap() / n.to_scalar::<f32>().unwrap()).sqrt()
    }

    #[test]
    fn rows_quantise_to_their_largest_value_and_back_within_e4m3s_step() {
        // Row 1 ten times row 0, row 2 all zeros: scales follow each row.
        let x = rand(3, 64, 1);
        let x = Tensor::cat(
            &[
                x.narrow(0, 0, 1).unwrap(),
                (x.narrow(0, 0, 1).unwrap() * 10.0).unwrap(),
                x.narrow(0, 2, 1).unwrap().zeros_like().unwrap(),
            ],
            0,
        )
        .unwrap();
        let q = Fp8Rows::quantize(&x).unwrap();
        assert_eq!(q.codes.dtype(), DType::F8E4M3);
        let s: Vec<f32> = q.scales.to_vec1().unwrap();
        let m = x.abs().unwrap().max(1).unwrap().to_vec1::<f32>().unwrap();
        assert!((s[0] - m[0] / E4M3_MAX).abs() < 1e-7);
        assert!((s[1] / s[0] - 10.0).abs() < 1e-4, "{s:?}");
        assert_eq!(s[2], 1.0, "an all-zero row");
        // The largest value of each row is exact (448 is a code); every
        // value is within E4M3's half step (3 mantissa bits: 1/16 of its
        // magnitude) or, near zero, the smallest subnormal's half.
        let back = q.dequantize(DType::F32).unwrap();
        let xs: Vec<Vec<f32>> = x.to_vec2().unwrap();
        let bs: Vec<Vec<f32>> = back.to_vec2().unwrap();
        for r in 0..3 {
            for c in 0..64 {
                let (v, b) = (xs[r][c], bs[r][c]);
                let tol = v.abs() / 16.0 + s[r] * 2f32.powi(-10);
                assert!((v - b).abs() <= tol, "row {r} col {c}: {v} -> {b}");
            }
            let at = m[r];
            if at > 0.0 {
                assert!(bs[r].iter().any(|b| (b.abs() - at).abs() < at * 1e-6));
            }
        }
        assert!(bs[2].iter().all(|b| *b == 0.0));
    }

    #[test]
    fn the_fp8_product_is_close_to_the_exact_one() {
        let x = rand(17, 128, 2);
        let w = Fp8Weight::quantize(&rand(48, 128, 3)).unwrap();
        assert_eq!(w.shape().unwrap(), (48, 128));
        assert_eq!(w.storage_bytes(), 48 * 128 + 48 * 4);
        let exact = x.matmul(&rand(48, 128, 3).t().unwrap()).unwrap();
        let y = w.product(&x).unwrap();
        assert_eq!(y.dims2().unwrap(), (17, 48));
        // E4M3 keeps 3 mantissa bits: each factor is off by up to 1/16, a
        // few percent on a sum of 128 products of random signs.
        let e = rel(&y, &exact);
        assert!(e > 1e-4 && e < 0.05, "relative error {e}");
        // The product of the dequantised factors, exactly what it computes.
        let xd = Fp8Rows::quantize(&x)
            .unwrap()
            .dequantize(DType::F32)
            .unwrap();
        let wd = w.dequantize(DType::F32).unwrap();
        let same = xd.matmul(&wd.t().unwrap()).unwrap();
        assert!(rel(&y, &same) < 1e-6);
    }
}
