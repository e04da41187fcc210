//! Numerics of the GPU training path, run on a CUDA device (`cargo test
//! --features cuda --test gpu`; without a device each test prints SKIPPED).
//!
//! Each fused op is compared with plain candle ops in f32 on the same
//! (bf16-rounded) random inputs of realistic shapes, forward and backward,
//! by relative error `|out - ref| / |ref|` (Frobenius norms): bf16 operands
//! land between 1e-3 and 1e-2. One LoRA step on the GPU is compared with the
//! same step on the CPU in f32.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use trace_train::model::{self, LoadedModel, LoraConfig, TargetModule, arch::tiny, layers::ops};
use trace_train::train::loss;

fn cuda() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIPPED: no CUDA device ({e})");
            None
        }
    }
}

/// `‖a − b‖ / ‖b‖`, in f32 on b's device.
fn rel(a: &Tensor, b: &Tensor) -> f32 {
    let a = a
        .to_dtype(DType::F32)
        .unwrap()
        .to_device(b.device())
        .unwrap();
    let b = b.to_dtype(DType::F32).unwrap();
    let d = (a - &b).unwrap().sqr().unwrap().sum_all().unwrap();
    let n = b.sqr().unwrap().sum_all().unwrap();
    (d.to_scalar::<f32>().unwrap() / n.to_scalar::<f32>().unwrap()).sqrt()
}

/// Normal values with standard deviation `std`, rounded to bf16.
fn randn(shape: (usize, usize), std: f64, dev: &Device) -> Tensor {
    Tensor::randn(0f32, std as f32, shape, dev)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap()
}

#[test]
fn lora_matmul_matches_plain_ops() {
    let Some(dev) = cuda() else { return };
    // (tokens, in, out): Qwen3-4B's gate/up and down projections, SmolLM2's MLP.
    for (n, i, o) in [(4096, 2560, 9728), (4096, 9728, 2560), (8192, 576, 1536)] {
        let r = 16;
        let x = Var::from_tensor(&randn((n, i), 1.0, &dev)).unwrap();
        let a = Var::from_tensor(&randn((r, i), 0.02, &dev)).unwrap();
        let b = Var::from_tensor(&randn((o, r), 0.02, &dev)).unwrap();
        let w = randn((o, i), 0.02, &dev);
        let up = randn((n, o), 1.0, &dev);
        let scale = 2.0;
        let fused = ops::lora_matmul(
            x.as_tensor(),
            a.as_tensor(),
            b.as_tensor(),
            Arc::new(w.clone()),
            scale,
            None,
        )
        .unwrap();
        let g = (fused.clone() * &up)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        // Reference: f32 copies through candle's own ops and autograd.
        let f = |t: &Tensor| Var::from_tensor(&t.to_dtype(DType::F32).unwrap()).unwrap();
        let (xf, af, bf) = (f(x.as_tensor()), f(a.as_tensor()), f(b.as_tensor()));
        let wf = w.to_dtype(DType::F32).unwrap();
        let plain = (xf.as_tensor().matmul(&wf.t().unwrap()).unwrap()
            + (xf
                .as_tensor()
                .matmul(&af.as_tensor().t().unwrap())
                .unwrap()
                .matmul(&bf.as_tensor().t().unwrap())
                .unwrap()
                * scale)
                .unwrap())
        .unwrap();
        let upf = up.to_dtype(DType::F32).unwrap();
        let gp = (plain.clone() * upf)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let errs = [
            rel(&fused, &plain),
            rel(
                g.get(x.as_tensor()).unwrap(),
                gp.get(xf.as_tensor()).unwrap(),
            ),
            rel(
                g.get(a.as_tensor()).unwrap(),
                gp.get(af.as_tensor()).unwrap(),
            ),
            rel(
                g.get(b.as_tensor()).unwrap(),
                gp.get(bf.as_tensor()).unwrap(),
            ),
        ];
        println!(
            "lora_matmul n {n} in {i} out {o}: relative error y {:.2e}, dx {:.2e}, dA {:.2e}, dB {:.2e}",
            errs[0], errs[1], errs[2], errs[3]
        );
        for e in errs {
            assert!(e < 1e-2, "relative error {e} over bf16 tolerance 1e-2");
        }
    }
}

#[test]
fn chunked_lm_head_loss_matches_full_logits() {
    let Some(dev) = cuda() else { return };
    let (b, l, h, v) = (4, 512, 2560, 151_936);
    let hidden = Var::from_tensor(
        &Tensor::randn(0f32, 1.0, (b, l, h), &dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap(),
    )
    .unwrap();
    let head = randn((v, h), 0.02, &dev);
    // Labels: a prompt of 100 tokens (ignored) then answer tokens.
    let labels: Vec<i64> = (0..b * l)
        .map(|i| {
            if i % l < 100 {
                -100
            } else {
                ((i as u64 * 2_654_435_761) % v as u64) as i64
            }
        })
        .collect();
    let labels = Tensor::from_vec(labels, (b, l), &dev).unwrap();
    let (sum, n) = loss::lm_head_cross_entropy(hidden.as_tensor(), &head, &labels).unwrap();
    let g = sum.backward().unwrap();
    let hf = Var::from_tensor(&hidden.as_tensor().to_dtype(DType::F32).unwrap()).unwrap();
    let logits = hf
        .as_tensor()
        .broadcast_matmul(&head.to_dtype(DType::F32).unwrap().t().unwrap())
        .unwrap();
    let (full, n_full) = loss::cross_entropy_sum(&logits, &labels).unwrap();
    let gf = full.backward().unwrap();
    assert_eq!(n, n_full);
    let (a, e) = (
        sum.to_scalar::<f32>().unwrap(),
        full.to_scalar::<f32>().unwrap(),
    );
    let loss_err = ((a - e) / e).abs();
    let grad_err = rel(
        g.get(hidden.as_tensor()).unwrap(),
        gf.get(hf.as_tensor()).unwrap(),
    );
    println!(
        "lm_head cross-entropy ({n} tokens, vocab {v}): relative error loss {loss_err:.2e}, dhidden {grad_err:.2e}"
    );
    assert!(loss_err < 1e-3, "loss {a} vs {e}");
    assert!(grad_err < 1e-2, "dhidden relative error {grad_err}");
}

fn lora() -> LoraConfig {
    LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: TargetModule::ALL.to_vec(),
        seed: 1,
    }
}

/// Loss and every adapter gradient of one step on `ids`.
fn step(m: &LoadedModel, ids: &[u32], checkpoint: bool) -> (f32, Vec<(String, Tensor)>) {
    let mut m = clone_loaded(m);
    m.model.set_gradient_checkpointing(checkpoint);
    let ids = Tensor::from_slice(ids, (2, ids.len() / 2), &m.device).unwrap();
    let labels = ids.to_dtype(DType::I64).unwrap();
    let hidden = m.model.forward_hidden(&ids, None, true).unwrap();
    let (sum, n) =
        loss::lm_head_cross_entropy(&hidden, &m.model.lm_head().weight().unwrap(), &labels)
            .unwrap();
    let loss = (sum / n as f64).unwrap();
    let grads = m.model.backward(&loss).unwrap();
    let named = m
        .named_trainable_vars()
        .into_iter()
        .map(|(name, v)| {
            let g = grads.get(v.as_tensor()).expect("a gradient").clone();
            (name, g)
        })
        .collect();
    (loss.to_scalar::<f32>().unwrap(), named)
}

fn clone_loaded(m: &LoadedModel) -> LoadedModel {
    LoadedModel {
        model: m.model.clone(),
        architecture: m.architecture,
        varmap: m.varmap.clone(),
        lora: m.lora.clone(),
        dir: m.dir.clone(),
        dtype: m.dtype,
        device: m.device.clone(),
    }
}

/// Gives every `lora_B` the same non-zero values on any device.
fn set_b(m: &LoadedModel) {
    for (name, var) in m.named_trainable_vars() {
        if name.ends_with("lora_B.weight") {
            let n = var.elem_count();
            let t = Tensor::arange(0f32, n as f32, &Device::Cpu)
                .unwrap()
                .affine(0.37, 1.0)
                .unwrap()
                .sin()
                .unwrap()
                .affine(0.05, 0.0)
                .unwrap()
                .reshape(var.shape())
                .unwrap()
                .to_device(var.device())
                .unwrap();
            var.set(&t).unwrap();
        }
    }
}

#[test]
fn one_lora_step_on_the_gpu_matches_the_cpu_f32_step() {
    let Some(dev) = cuda() else { return };
    let tmp = tempfile::tempdir().unwrap();
    for (arch, write) in [
        (
            "qwen3",
            tiny::write_tiny_qwen3 as fn(&std::path::Path, u64) -> model::Result<()>,
        ),
        ("llama", tiny::write_tiny_llama),
    ] {
        let dir = tmp.path().join(arch);
        write(&dir, 3).unwrap();
        let ids: Vec<u32> = (0..2 * 64u32).map(|i| (i * 37 + 11) % 512).collect();
        let cpu = model::load(&dir, Some(&lora()), DType::F32, &Device::Cpu).unwrap();
        set_b(&cpu);
        let (cpu_loss, cpu_grads) = step(&cpu, &ids, false);
        for (dtype, tol) in [(DType::F32, 1e-3f32), (DType::BF16, 5e-2)] {
            let gpu = model::load(&dir, Some(&lora()), dtype, &dev).unwrap();
            set_b(&gpu);
            for checkpoint in [false, true] {
                let (loss, grads) = step(&gpu, &ids, checkpoint);
                let loss_err = ((loss - cpu_loss) / cpu_loss).abs();
                let worst = grads
                    .iter()
                    .zip(&cpu_grads)
                    .map(|((name, g), (_, c))| (rel(g, c), name.clone()))
                    .fold((0f32, String::new()), |a, b| if b.0 > a.0 { b } else { a });
                println!(
                    "{arch} {dtype:?} checkpointing {checkpoint}: loss {loss} vs CPU f32 {cpu_loss} (relative error {loss_err:.2e}); worst adapter gradient relative error {:.2e} ({})",
                    worst.0, worst.1
                );
                assert!(loss_err < tol, "loss relative error {loss_err}");
                assert!(worst.0 < tol, "gradient relative error {}", worst.0);
            }
        }
    }
}

#[test]
fn fused_adamw_matches_the_cpu_step() {
    use trace_train::train::optim::AdamW;
    let Some(dev) = cuda() else { return };
    let init = Tensor::randn(0f32, 1.0, (64, 2560), &Device::Cpu).unwrap();
    let grads: Vec<Tensor> = (0..3)
        .map(|_| Tensor::randn(0f32, 0.1, (64, 2560), &Device::Cpu).unwrap())
        .collect();
    let run = |device: &Device| {
        let var = Var::from_tensor(&init.to_device(device).unwrap()).unwrap();
        let mut opt = AdamW::new(vec![("p".into(), var.clone())], 0.01).unwrap();
        for g in &grads {
            opt.step(&[g.to_device(device).unwrap()], 1e-3, 0.7)
                .unwrap();
        }
        var.as_tensor().to_device(&Device::Cpu).unwrap()
    };
    let (gpu, cpu) = (run(&dev), run(&Device::Cpu));
    let moved = rel(&cpu, &init);
    let err = rel(&gpu, &cpu);
    println!(
        "fused AdamW, 3 steps: relative error against the CPU ops {err:.2e} (parameters moved by {moved:.2e})"
    );
    assert!(moved > 1e-4, "the steps moved nothing");
    assert!(err < 1e-6, "relative error {err}");
}

/// The fused RMSNorm-backward and SwiGLU kernels against the same formulas
/// as candle ops on the CPU in f32, at Qwen3-4B's sizes (hidden 2560,
/// intermediate 9728, 4 x 1024 tokens).
#[test]
fn fused_norm_and_swiglu_kernels_match_the_cpu_formulas() {
    use trace_train::model::layers::fused;
    let Some(dev) = cuda() else { return };
    let cpu = |t: &Tensor| {
        t.to_dtype(DType::F32)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap()
    };
    let (x, w, dy) = (
        randn((4096, 2560), 1.0, &dev),
        (randn((1, 2560), 0.1, &dev) + 1.0)
            .unwrap()
            .squeeze(0)
            .unwrap(),
        randn((4096, 2560), 1.0, &dev),
    );
    let got = fused::rmsnorm_backward(&x, &w, &dy, 1e-6).unwrap();
    let want = fused::rmsnorm_backward(&cpu(&x), &cpu(&w), &cpu(&dy), 1e-6).unwrap();
    let e_norm = rel(&got, &want);
    let (g, u, dh) = (
        randn((4096, 9728), 2.0, &dev),
        randn((4096, 9728), 1.0, &dev),
        randn((4096, 9728), 1.0, &dev),
    );
    let h = fused::swiglu(&g, &u).unwrap();
    let h_want = fused::swiglu(&cpu(&g), &cpu(&u)).unwrap();
    let (dg, du) = fused::swiglu_backward(&g, &u, &dh).unwrap();
    let (dg_want, du_want) = fused::swiglu_backward(&cpu(&g), &cpu(&u), &cpu(&dh)).unwrap();
    let errs = [rel(&h, &h_want), rel(&dg, &dg_want), rel(&du, &du_want)];
    println!(
        "rmsnorm backward {e_norm:.2e}; swiglu forward {:.2e}, dgate {:.2e}, dup {:.2e} (bf16 kernels vs f32 CPU ops)",
        errs[0], errs[1], errs[2]
    );
    for e in [e_norm, errs[0], errs[1], errs[2]] {
        assert!(e < 1e-2, "relative error {e} over bf16 tolerance 1e-2");
    }
}
