//! cuDNN's fused causal attention (`model::cuda::sdpa_cudnn`) against plain candle
//! ops in f32, forward and backward, on the GPU. Without a CUDA device (or
//! without libcudnn.so.9 on the library path) each test prints a SKIPPED
//! line and passes.
//!
//! The reference runs in f32 on the same bf16/f16-rounded inputs and the
//! same rounded upstream gradient: `q k^T * scale`, a causal mask, softmax,
//! `@ v`, keys and values repeated over each query group, and candle's
//! autograd for `dq, dk, dv`. Relative errors `|x - ref| / |ref|`
//! (Frobenius norms) must stay under:
//! - 1e-2 for the output (bf16 output rounding is ~4e-3 relative, and the
//!   kernel rounds the probabilities to bf16 before `@ v`);
//! - 2e-2 for the gradients (their chain rounds dO, P and dS to bf16 too).
//!
//! f16 has 3 more mantissa bits; its tolerances are the same.
//!
//! Run on the GPU machine with `--nocapture --test-threads=1` to see the
//! errors and the informative timings in order.

#![cfg(feature = "cudnn")]

use std::io::Write;
use std::sync::Mutex;
use std::time::Instant;

use candle_core::{D, DType, Device, Result, Tensor, Var};
use trace_train::data::batch::Batcher;
use trace_train::data::example::Example;
use trace_train::model::arch::tiny;
use trace_train::model::cuda::sdpa_cudnn::{causal_sdpa, cudnn_version};
use trace_train::model::layers::segments::Segments;
use trace_train::model::{self, LoraConfig};

const OUT_TOL: f32 = 1e-2;
const GRAD_TOL: f32 = 2e-2;

/// One GPU user at a time, so timings mean something.
static GPU: Mutex<()> = Mutex::new(());

fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// CUDA device 0 with cuDNN loadable, or `None` after a SKIPPED line.
fn gpu(test: &str) -> Option<Device> {
    let device = std::panic::catch_unwind(|| Device::new_cuda(0));
    let device = match device {
        Ok(Ok(d)) => d,
        Ok(Err(e)) => {
            let e = e.to_string();
            let e = e.lines().next().unwrap_or_default();
            say(&format!("\n*** SKIPPED {test}: no CUDA device ({e}) ***\n"));
            return None;
        }
        Err(_) => {
            say(&format!(
                "\n*** SKIPPED {test}: no CUDA driver (creating the device panicked) ***\n"
            ));
            return None;
        }
    };
    match cudnn_version() {
        Ok(v) => {
            say(&format!("{test}: cuDNN {v}"));
            Some(device)
        }
        Err(e) => {
            say(&format!("\n*** SKIPPED {test}: {e} ***\n"));
            None
        }
    }
}

/// `|a - b| / |b|` over all elements, in f32.
fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.to_dtype(DType::F32).unwrap();
    let b = b.to_dtype(DType::F32).unwrap();
    let num = (&a - &b)
        .unwrap()
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let den = b
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(den > 0.0, "reference is all zeros");
    (num / den).sqrt()
}

/// Plain attention in f32: `q (B, H, L, D)`, `k, v (B, H_kv, L, D)`.
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
    let (b, h, l, d) = q.dims4()?;
    let h_kv = k.dim(1)?;
    let groups = h / h_kv;
    let repeat = |t: &Tensor| -> Result<Tensor> {
        t.unsqueeze(2)?
            .expand((b, h_kv, groups, l, d))?
            .reshape((b, h, l, d))
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let scores = (q.matmul(&k.t()?)? * scale)?;
    // 0 on and below the diagonal, -1e9 above it.
    let bias = ((Tensor::tril2(l, DType::F32, q.device())? - 1.0)? * 1e9)?;
    let scores = scores.broadcast_add(&bias)?;
    let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
    probs.matmul(&v)
}

/// Standard-normal values rounded to `dtype`, in `shape`.
fn randn(shape: (usize, usize, usize, usize), dtype: DType, dev: &Device) -> Tensor {
    Tensor::randn(0f32, 1f32, shape, dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

struct Case {
    b: usize,
    h: usize,
    h_kv: usize,
    l: usize,
    d: usize,
    dtype: DType,
}

fn check(test: &str, c: &Case) {
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(dev) = gpu(test) else { return };
    let Case {
        b,
        h,
        h_kv,
        l,
        d,
        dtype,
    } = *c;
    let scale = 1.0 / (d as f64).sqrt();
    // Inputs as the projections make them: (B, L, heads, D), seen as
    // (B, heads, L, D) through a transpose.
    let q_blhd = Var::from_tensor(&randn((b, l, h, d), dtype, &dev)).unwrap();
    let k_blhd = Var::from_tensor(&randn((b, l, h_kv, d), dtype, &dev)).unwrap();
    let v_blhd = Var::from_tensor(&randn((b, l, h_kv, d), dtype, &dev)).unwrap();
    let grad = randn((b, h, l, d), dtype, &dev);
    let bhld = |t: &Tensor| t.transpose(1, 2).unwrap();

    // Fused forward and backward through candle's autograd.
    let out = causal_sdpa(&bhld(&q_blhd), &bhld(&k_blhd), &bhld(&v_blhd), scale as f32).unwrap();
    assert_eq!(out.dims(), &[b, h, l, d]);
    assert_eq!(out.dtype(), dtype);
    let loss = (out.to_dtype(DType::F32).unwrap() * grad.to_dtype(DType::F32).unwrap())
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    let fused_grad = |v: &Var| bhld(grads.get(v).expect("a gradient"));
    let (dq, dk, dv) = (
        fused_grad(&q_blhd),
        fused_grad(&k_blhd),
        fused_grad(&v_blhd),
    );

    // Reference on the same rounded values, in f32.
    let f32_var = |v: &Var| Var::from_tensor(&bhld(v).to_dtype(DType::F32).unwrap()).unwrap();
    let (rq, rk, rv) = (f32_var(&q_blhd), f32_var(&k_blhd), f32_var(&v_blhd));
    let ref_out = reference(&rq, &rk, &rv, scale).unwrap();
    let ref_loss = (&ref_out * grad.to_dtype(DType::F32).unwrap())
        .unwrap()
        .sum_all()
        .unwrap();
    let ref_grads = ref_loss.backward().unwrap();
    let ref_grad = |v: &Var| ref_grads.get(v).expect("a gradient").clone();

    let errors = [
        ("out", rel_err(&out, &ref_out), OUT_TOL),
        ("dq", rel_err(&dq, &ref_grad(&rq)), GRAD_TOL),
        ("dk", rel_err(&dk, &ref_grad(&rk)), GRAD_TOL),
        ("dv", rel_err(&dv, &ref_grad(&rv)), GRAD_TOL),
    ];
    let shape = format!("B={b} H={h} H_kv={h_kv} L={l} D={d} {dtype:?}");
    for (name, err, tol) in errors {
        say(&format!(
            "{test}: {shape}: {name} relative error {err:.2e} (tolerance {tol:.0e})"
        ));
    }

    // The same attention from contiguous inputs and without gradient
    // tracking (a forward without softmax stats).
    let plain = |v: &Var| bhld(v.as_tensor()).contiguous().unwrap();
    let out_plain = causal_sdpa(
        &plain(&q_blhd),
        &plain(&k_blhd),
        &plain(&v_blhd),
        scale as f32,
    )
    .unwrap();
    let plain_err = rel_err(&out_plain, &out);
    say(&format!(
        "{test}: {shape}: contiguous-input, no-grad forward vs strided: relative difference {plain_err:.2e}"
    ));

    timing(test, &shape, c, &dev, scale as f32);

    for (name, err, tol) in errors {
        assert!(
            err.is_finite() && err < tol,
            "{shape}: {name} relative error {err} >= {tol}"
        );
    }
    assert!(plain_err < 1e-3, "{shape}: layouts disagree by {plain_err}");
}

/// Informative: forward and forward+backward times over a few iterations.
fn timing(test: &str, shape: &str, c: &Case, dev: &Device, scale: f32) {
    let Case {
        b,
        h,
        h_kv,
        l,
        d,
        dtype,
    } = *c;
    let q = Var::from_tensor(&randn((b, h, l, d), dtype, dev)).unwrap();
    let k = Var::from_tensor(&randn((b, h_kv, l, d), dtype, dev)).unwrap();
    let v = Var::from_tensor(&randn((b, h_kv, l, d), dtype, dev)).unwrap();
    let grad = randn((b, h, l, d), dtype, dev);
    let iters = 10;
    let run = |backward: bool| {
        let out = causal_sdpa(&q, &k, &v, scale).unwrap();
        if backward {
            let loss = (out * &grad).unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            assert!(grads.get(&q).is_some());
        }
    };
    let time = |backward: bool| {
        run(backward); // warm-up: builds the graphs
        dev.synchronize().unwrap();
        let start = Instant::now();
        for _ in 0..iters {
            run(backward);
        }
        dev.synchronize().unwrap();
        start.elapsed().as_secs_f64() * 1e3 / iters as f64
    };
    let fwd_ms = time(false);
    let both_ms = time(true);
    // Causal: half of the 4 B H L^2 D multiply-adds of full attention.
    let fwd_flop = 2.0 * (b * h * l * l * d) as f64;
    say(&format!(
        "{test}: {shape}: forward {fwd_ms:.3} ms ({:.0} TFLOP/s), forward+backward {both_ms:.3} ms \
         (with the loss's own elementwise work; {:.0} TFLOP/s counting backward as 2.5x forward), {iters} iterations",
        fwd_flop / fwd_ms * 1e-9,
        3.5 * fwd_flop / both_ms * 1e-9,
    ));
}

#[test]
fn qwen3_4b_heads_bf16() {
    check(
        "qwen3_4b_heads_bf16",
        &Case {
            b: 2,
            h: 32,
            h_kv: 8,
            l: 1024,
            d: 128,
            dtype: DType::BF16,
        },
    );
}

#[test]
fn small_heads_bf16() {
    check(
        "small_heads_bf16",
        &Case {
            b: 2,
            h: 9,
            h_kv: 3,
            l: 512,
            d: 64,
            dtype: DType::BF16,
        },
    );
}

#[test]
fn small_heads_f16() {
    check(
        "small_heads_f16",
        &Case {
            b: 2,
            h: 9,
            h_kv: 3,
            l: 512,
            d: 64,
            dtype: DType::F16,
        },
    );
}

/// A length that is not a multiple of the kernels' tiles, and one query
/// group (plain multi-head attention).
#[test]
fn ragged_length_mha_bf16() {
    check(
        "ragged_length_mha_bf16",
        &Case {
            b: 1,
            h: 4,
            h_kv: 4,
            l: 200,
            d: 128,
            dtype: DType::BF16,
        },
    );
}

// Attention over packed rows (`model::layers::segments`) through cuDNN.
/// On the GPU in bf16, with cuDNN's fused attention: a packed row's
/// loss and LoRA gradients against the same examples right-padded,
/// within bf16 rounding: through the hand-written layer backward (cuDNN's
/// packed sequences), plain and checkpointed, and through autograd (the
/// gathered layout).
#[test]
fn packed_rows_match_padded_rows_with_fused_attention() {
    let dev = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED: no CUDA device ({e})");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    tiny::write_tiny_qwen3(tmp.path(), 5).unwrap();
    let lora = LoraConfig {
        r: 8,
        alpha: 16.0,
        dropout: 0.0,
        target_modules: model::TargetModule::ALL.to_vec(),
        seed: 3,
    };
    let mut m = model::load(tmp.path(), Some(&lora), DType::BF16, &dev).unwrap();
    assert!(
        m.model.decoder().fused_attention(),
        "the cudnn build on a GPU"
    );
    for (name, var) in m.named_trainable_vars() {
        if name.contains("lora_B") {
            let t = (var.as_tensor().ones_like().unwrap() * 0.02).unwrap();
            var.set(&t).unwrap();
        }
    }
    let lens = [(70usize, 20usize), (130, 60), (33, 10), (130, 100), (9, 4)];
    let examples: Vec<Example> = lens
        .iter()
        .enumerate()
        .map(|(k, &(n, prompt))| Example {
            input_ids: (0..n as u32)
                .map(|t| (t * 53 + 97 * k as u32 + 5) % 511 + 1)
                .collect(),
            prompt_len: prompt,
            line: k as u64 + 1,
        })
        .collect();
    let batcher = Batcher::new(&examples, 5, 0, 0)
        .unwrap()
        .with_length_buckets(true);
    let rows = [2usize, 0, 4, 3, 1];
    let (padded, packed) = (batcher.batch(&rows), batcher.pack(&rows));
    let run = |m: &model::LoadedModel, pack: bool| {
        let (hidden, labels) = if pack {
            let shape = (1, packed.len);
            let ids = Tensor::from_slice(&packed.input_ids, shape, &dev).unwrap();
            let pos = Tensor::from_slice(&packed.positions, shape, &dev).unwrap();
            let segs = Segments::new(
                &packed.gather,
                &packed.scatter,
                packed.seq_len,
                &packed.lens,
                &dev,
            )
            .unwrap();
            let labels = Tensor::from_slice(&packed.labels, shape, &dev).unwrap();
            let h = m.model.forward_hidden_packed(&ids, &pos, &segs, true);
            (h.unwrap(), labels)
        } else {
            let shape = (padded.batch, padded.seq_len);
            let ids = Tensor::from_slice(&padded.input_ids, shape, &dev).unwrap();
            let mask = Tensor::from_slice(&padded.attention_mask, shape, &dev).unwrap();
            let labels = Tensor::from_slice(&padded.labels, shape, &dev).unwrap();
            let h = m.model.forward_hidden(&ids, Some(&mask), true);
            (h.unwrap(), labels)
        };
        let head = m.model.lm_head().weight().unwrap();
        let (sum, _) =
            trace_train::train::loss::lm_head_cross_entropy(&hidden, &head, &labels).unwrap();
        let loss = (sum / packed.answer_tokens as f64).unwrap();
        let grads = m.model.backward(&loss).unwrap();
        let g: Vec<Tensor> = m
            .named_trainable_vars()
            .iter()
            .map(|(_, v)| {
                grads
                    .get(v.as_tensor())
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
            })
            .collect();
        (
            loss.to_dtype(DType::F32)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            g,
        )
    };
    let (want_loss, want) = run(&m, false);
    // Manual backward on cuDNN's packed sequences (plain, checkpointed)
    // and on the gathered layout; autograd.
    for (ckpt, manual, packed) in [
        (false, true, true),
        (true, true, true),
        (false, true, false),
        (false, false, true),
    ] {
        m.model.set_gradient_checkpointing(ckpt);
        m.model.decoder_mut().set_manual_backward(manual);
        trace_train::model::layers::segments::set_packed_attention(packed);
        let (loss, got) = run(&m, true);
        trace_train::model::layers::segments::set_packed_attention(true);
        m.model.set_gradient_checkpointing(false);
        m.model.decoder_mut().set_manual_backward(true);
        assert!(
            (loss - want_loss).abs() <= 1e-2 * want_loss.abs(),
            "checkpointing {ckpt}, manual {manual}, packed {packed}: loss {loss} vs {want_loss}"
        );
        let norm = |t: &Tensor| {
            t.sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
                .sqrt()
        };
        for ((name, _), (g, r)) in m.named_trainable_vars().iter().zip(got.iter().zip(&want)) {
            let err = norm(&(g - r).unwrap()) / norm(r).max(1e-12);
            assert!(
                err < 3e-2,
                "checkpointing {ckpt}, manual {manual}, packed {packed}: {name}: relative error {err}"
            );
        }
        eprintln!(
            "checkpointing {ckpt}, manual {manual}, packed {packed}: loss {loss}, padded {want_loss}"
        );
    }
}
