//! `bench fp8`: FP8 base projections against bf16 at a model's projection
//! shapes, on random inputs: each product's error against the f32 product
//! of the unquantised operands, and its time.
//!
//! For each `(out, in)` shape of the model's layer (q, k, v, o, gate, up,
//! down; k and v share one):
//! - forward `x W^T`, `x: (tokens, in)`: bf16 (cuBLAS), FP8 with a scale
//!   an output channel and a token (cuBLASLt's outer-vector scales, and
//!   the unit-scale product rescaled by a kernel), the quantisation of `x`
//!   included in the FP8 time;
//! - the errors, against the f32 product, of the scalings one could pick:
//!   one scale for the whole weight, one a channel, one a 128 x 128 block
//!   (the activations a scale a token in each); measured from the
//!   dequantised operands, so they do not depend on the product's kernel;
//! - the input gradient `g W`, `g: (tokens, out)`: bf16 from the weight
//!   dequantised from FP8 (what training does now), and FP8 (g a scale a
//!   token, `W^T` quantised a scale an input channel), error and time.
//!
//! The layer's totals weight each shape by its count in a layer.

#[cfg(feature = "cuda")]
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use serde::Serialize;

use crate::model::layers::fp8::{Fp8Rows, Fp8Weight};
use crate::model::layers::init::Rng;

/// What `bench fp8` runs.
#[derive(Debug, Clone)]
pub struct Fp8Bench {
    /// A shape of `bench train`'s list.
    pub model: String,
    /// Rows of x (tokens of a step).
    pub tokens: usize,
    /// Timed repetitions of each product.
    pub reps: usize,
}

/// One projection shape's measurements.
#[derive(Debug, Serialize)]
pub struct ShapeResult {
    pub names: Vec<&'static str>,
    pub out: usize,
    pub inp: usize,
    /// Relative errors (Frobenius) against the f32 product.
    pub err_bf16: f64,
    pub err_fp8_channel: f64,
    pub err_fp8_tensor: f64,
    /// `None` where `out` or `in` is not a multiple of 128.
    pub err_fp8_block128: Option<f64>,
    /// The CUDA product's error (channel scales), to check the kernel
    /// against the dequantised emulation above.
    pub err_fp8_product: Option<f64>,
    pub ms_bf16: Option<f64>,
    pub ms_fp8_outer: Option<f64>,
    pub ms_fp8_unit: Option<f64>,
    /// Unit scales with fast accumulation, and its error.
    pub ms_fp8_unit_fast: Option<f64>,
    pub err_fp8_unit_fast: Option<f64>,
    /// The products alone (x quantised beforehand).
    pub ms_gemm_unit: Option<f64>,
    pub ms_gemm_unit_fast: Option<f64>,
    /// Of `ms_fp8_outer`, the quantisation of x.
    pub ms_quantize_x: Option<f64>,
    /// Input gradient `g W`: bf16 from the dequantised weight, and FP8.
    pub err_grad_bf16_from_fp8: f64,
    pub err_grad_fp8: f64,
    pub ms_grad_bf16: Option<f64>,
    pub ms_grad_fp8: Option<f64>,
    /// Whether cuBLASLt offered an algorithm with outer-vector scales,
    /// and with unit scales (`Err`: what it answered instead).
    pub outer_supported: Option<Result<(), String>>,
    pub unit_supported: Option<Result<(), String>>,
}

/// What `bench fp8` measured.
#[derive(Debug, Serialize)]
pub struct Fp8Result {
    pub ours: &'static str,
    pub job: &'static str,
    pub model: String,
    pub tokens: usize,
    pub shapes: Vec<ShapeResult>,
    /// A layer's forward products, each shape times its count.
    pub layer_ms_bf16: Option<f64>,
    pub layer_ms_fp8: Option<f64>,
    pub layer_ms_grad_bf16: Option<f64>,
    pub layer_ms_grad_fp8: Option<f64>,
}

fn rel(a: &Tensor, b: &Tensor) -> anyhow::Result<f64> {
    let a = a.to_dtype(DType::F32)?;
    let b = b.to_dtype(DType::F32)?;
    let d = (&a - &b)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    let n = b.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    Ok((d / n).sqrt())
}

/// Random values of unit-free spread `std` (uniform), f32, on `device`.
fn random(
    rows: usize,
    cols: usize,
    std: f32,
    seed: u64,
    device: &Device,
) -> anyhow::Result<Tensor> {
    let half = std * 3f32.sqrt();
    let v = Rng::for_tensor(seed, "bench_fp8").uniform(rows * cols, -half, half);
    Ok(Tensor::from_vec(v, (rows, cols), &Device::Cpu)?.to_device(device)?)
}

/// `w` quantised with one scale for all of it, back as f32.
fn per_tensor(w: &Tensor) -> anyhow::Result<Tensor> {
    let (o, i) = w.dims2()?;
    let flat = w.reshape((1, o * i))?;
    Ok(Fp8Rows::quantize(&flat)?
        .dequantize(DType::F32)?
        .reshape((o, i))?)
}

/// `w` quantised with a scale a 128 x 128 block, back as f32 (`out` and
/// `in` multiples of 128).
fn per_block(w: &Tensor) -> anyhow::Result<Tensor> {
    let (o, i) = w.dims2()?;
    anyhow::ensure!(
        o % 128 == 0 && i % 128 == 0,
        "128-blocks need sizes in 128s"
    );
    let blocks = w
        .reshape((o / 128, 128, i / 128, 128))?
        .permute((0, 2, 1, 3))?
        .contiguous()?
        .reshape((o * i / 16384, 16384))?;
    let back = Fp8Rows::quantize(&blocks)?.dequantize(DType::F32)?;
    Ok(back
        .reshape((o / 128, i / 128, 128, 128))?
        .permute((0, 2, 1, 3))?
        .contiguous()?
        .reshape((o, i))?)
}

/// Milliseconds a call of `f` takes, the median of `reps` after two.
#[cfg(feature = "cuda")]
fn time(device: &Device, reps: usize, f: &dyn Fn() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    for _ in 0..2 {
        f()?;
    }
    device.synchronize()?;
    let mut ms = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        device.synchronize()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

/// A projection shape: the projections of that shape, `out`, `in`, and how
/// many a layer has.
type ProjShape = (Vec<&'static str>, usize, usize, usize);

/// The projection shapes of `model`.
fn shapes(model: &str) -> anyhow::Result<Vec<ProjShape>> {
    let c = super::train::shape_config(model)?;
    let n = |key: &str| -> anyhow::Result<usize> {
        c[key]
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| anyhow::anyhow!("shape {model}: no `{key}`"))
    };
    let (h, i, hd) = (n("hidden_size")?, n("intermediate_size")?, n("head_dim")?);
    let q = n("num_attention_heads")? * hd;
    let kv = n("num_key_value_heads")? * hd;
    Ok(vec![
        (vec!["q_proj"], q, h, 1),
        (vec!["k_proj", "v_proj"], kv, h, 2),
        (vec!["o_proj"], h, q, 1),
        (vec!["gate_proj", "up_proj"], i, h, 2),
        (vec!["down_proj"], h, i, 1),
    ])
}

/// Runs the measurements on `device` (timings only on CUDA).
pub fn run(b: &Fp8Bench, device: &Device) -> anyhow::Result<Fp8Result> {
    let cuda = device.is_cuda();
    let dtype = if cuda { DType::BF16 } else { DType::F32 };
    let mut out = Vec::new();
    let (mut lb, mut lf, mut gb, mut gf) = (0.0, 0.0, 0.0, 0.0);
    for (k, (names, o, i, count)) in shapes(&b.model)?.into_iter().enumerate() {
        let seed = 10 * k as u64;
        // Weights of a trained model's spread; activations after a norm.
        let w32 = random(o, i, 0.02, seed, device)?;
        let x32 = random(b.tokens, i, 1.0, seed + 1, device)?;
        let g32 = random(b.tokens, o, 1e-3, seed + 2, device)?;
        let (w, x, g) = (
            w32.to_dtype(dtype)?,
            x32.to_dtype(dtype)?,
            g32.to_dtype(dtype)?,
        );
        // References in f32 from the operands as the products see them
        // (the bf16 inputs), so the errors are the products' own.
        let (wr, xr, gr) = (
            w.to_dtype(DType::F32)?,
            x.to_dtype(DType::F32)?,
            g.to_dtype(DType::F32)?,
        );
        let exact = xr.matmul(&wr.t()?)?;
        let exact_grad = gr.matmul(&wr)?;
        let xq = Fp8Rows::quantize(&x)?.dequantize(DType::F32)?;
        let fp8 = Fp8Weight::quantize(&w)?;
        let wq = fp8.dequantize(DType::F32)?;
        let bf16 = x.matmul(&w.t()?)?;
        let err_fp8_channel = rel(&xq.matmul(&wq.t()?)?, &exact)?;
        let err_fp8_tensor = rel(&xq.matmul(&per_tensor(&w)?.t()?)?, &exact)?;
        let err_fp8_block128 = match o % 128 == 0 && i % 128 == 0 {
            true => Some(rel(&xq.matmul(&per_block(&w)?.t()?)?, &exact)?),
            false => None,
        };
        let product = fp8.product(&x)?;
        let wd = fp8.dequantize(dtype)?;
        let grad_bf16 = g.matmul(&wd)?;
        let wt = Fp8Weight::quantize(&w.t()?.contiguous()?)?;
        let grad_fp8 = wt.product(&g)?;
        #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
        let mut r = ShapeResult {
            names,
            out: o,
            inp: i,
            err_bf16: rel(&bf16, &exact)?,
            err_fp8_channel,
            err_fp8_tensor,
            err_fp8_block128,
            err_fp8_product: Some(rel(&product, &exact)?),
            ms_bf16: None,
            ms_fp8_outer: None,
            ms_fp8_unit: None,
            ms_fp8_unit_fast: None,
            err_fp8_unit_fast: None,
            ms_gemm_unit: None,
            ms_gemm_unit_fast: None,
            ms_quantize_x: None,
            err_grad_bf16_from_fp8: rel(&grad_bf16, &exact_grad)?,
            err_grad_fp8: rel(&grad_fp8, &exact_grad)?,
            ms_grad_bf16: None,
            ms_grad_fp8: None,
            outer_supported: None,
            unit_supported: None,
        };
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = device {
            use crate::model::cuda::fp8::{Scaling, supported};
            let reps = b.reps;
            let wt16 = w.t()?.contiguous()?;
            r.outer_supported = Some(supported(dev, b.tokens, o, i, Scaling::Outer)?);
            r.unit_supported = Some(supported(dev, b.tokens, o, i, Scaling::Unit)?);
            r.ms_bf16 = Some(time(device, reps, &|| {
                x.matmul(&wt16)?;
                Ok(())
            })?);
            r.ms_quantize_x = Some(time(device, reps, &|| {
                Fp8Rows::quantize(&x)?;
                Ok(())
            })?);
            let qw = fp8.rows();
            let qx = Fp8Rows::quantize(&x)?;
            let gemm = |scaling| {
                crate::model::cuda::fp8::product(
                    &qx.codes, &qx.scales, &qw.codes, &qw.scales, scaling,
                )
            };
            if let Some(y) = gemm(Scaling::UnitFast)? {
                r.err_fp8_unit_fast = Some(rel(&y, &exact)?);
            }
            r.ms_gemm_unit = Some(time(device, reps, &|| {
                gemm(Scaling::Unit)?;
                Ok(())
            })?);
            r.ms_gemm_unit_fast = Some(time(device, reps, &|| {
                gemm(Scaling::UnitFast)?;
                Ok(())
            })?);
            for (scaling, slot) in [
                (Scaling::Outer, &mut r.ms_fp8_outer),
                (Scaling::Unit, &mut r.ms_fp8_unit),
                (Scaling::UnitFast, &mut r.ms_fp8_unit_fast),
            ] {
                if supported(dev, b.tokens, o, i, scaling)?.is_err() {
                    continue;
                }
                *slot = Some(time(device, reps, &|| {
                    let qx = Fp8Rows::quantize(&x)?;
                    crate::model::cuda::fp8::product(
                        &qx.codes, &qx.scales, &qw.codes, &qw.scales, scaling,
                    )?;
                    Ok(())
                })?);
            }
            r.ms_grad_bf16 = Some(time(device, reps, &|| {
                g.matmul(&fp8.dequantize(dtype)?)?;
                Ok(())
            })?);
            r.ms_grad_fp8 = Some(time(device, reps, &|| {
                wt.product(&g)?;
                Ok(())
            })?);
        }
        let n = count as f64;
        if let (Some(a), Some(f)) = (r.ms_bf16, r.ms_fp8_outer.or(r.ms_fp8_unit)) {
            lb += n * a;
            lf += n * f;
        }
        if let (Some(a), Some(f)) = (r.ms_grad_bf16, r.ms_grad_fp8) {
            gb += n * a;
            gf += n * f;
        }
        out.push(r);
    }
    let some = |v: f64| cuda.then_some(v);
    Ok(Fp8Result {
        ours: "trace-train",
        job: "fp8_products",
        model: b.model.clone(),
        tokens: b.tokens,
        shapes: out,
        layer_ms_bf16: some(lb),
        layer_ms_fp8: some(lf),
        layer_ms_grad_bf16: some(gb),
        layer_ms_grad_fp8: some(gf),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the CPU the errors are measured (no timings): FP8's are a few
    /// percent, per-tensor scales no better than per-channel ones, and the
    /// product equals its dequantised emulation.
    #[test]
    fn the_cpu_measures_the_errors_of_each_scaling() {
        let r = run(
            &Fp8Bench {
                model: "qwen3-0.6b".into(),
                tokens: 16,
                reps: 1,
            },
            &Device::Cpu,
        )
        .unwrap();
        assert_eq!(r.shapes.len(), 5);
        for s in &r.shapes {
            assert!(s.err_bf16 < 1e-5, "f32 on the CPU: {}", s.err_bf16);
            let block = s.err_fp8_block128.expect("qwen3-0.6b's sizes are in 128s");
            for e in [s.err_fp8_channel, block, s.err_grad_fp8] {
                assert!(e > 1e-3 && e < 0.08, "{:?}: {e}", s.names);
            }
            assert!(s.err_fp8_tensor >= s.err_fp8_channel * 0.95, "{s:?}");
            assert!(
                (s.err_fp8_product.unwrap() - s.err_fp8_channel).abs() < 1e-4,
                "{s:?}"
            );
            assert!(s.ms_bf16.is_none());
        }
        assert!(r.layer_ms_fp8.is_none());
    }
}
