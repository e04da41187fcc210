//! `bench train` and `bench gen` ([`train`], [`sample`]): trace-train's LoRA SFT step and batched
//! sampling on random weights of a real model's shape, measured the way the
//! peer script (transformers + PEFT) measures them, so the two can run in
//! one call on one card and be compared as a ratio.
//!
//! Random weights measure speed and memory, not quality: every matrix drawn
//! with standard deviation 0.02 (normal, by the device's generator, on a
//! GPU; uniform, by the seeded host generator, on the CPU, so CPU runs are
//! reproducible) and ones for the norms, built without touching the disk.

use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::VarBuilder;
use candle_nn::var_builder::SimpleBackend;
use serde::Serialize;

use crate::kit::load;
use crate::model::decode::generate;
use crate::model::layers::init::Rng;
use crate::model::{self, BasePrecision, LoadedModel, LoraConfig, TargetModule};
use crate::train::{loss, optim::AdamW};

/// Model shapes, by the peer scripts' names; and `tiny` (the shape of
/// `trace-train model tiny`: 2 layers, hidden 64, vocab 512), which runs in
/// seconds on a CPU, for tests (`benches/trl_rl_peer.py` knows it too).
pub const SHAPES: [&str; 5] = [
    "smollm2-135m",
    "qwen3-0.6b",
    "qwen3-1.7b",
    "qwen3-4b",
    "tiny",
];

/// `config.json` of a shape: the same hyper-parameters as the peer's.
pub fn shape_config(name: &str) -> anyhow::Result<serde_json::Value> {
    // (hidden, intermediate, layers, heads, kv heads, head dim, vocab)
    let (h, i, l, a, kv, hd, v) = match name {
        "qwen3-0.6b" => (1024, 3072, 28, 16, 8, 128, 151_936),
        "qwen3-1.7b" => (2048, 6144, 28, 16, 8, 128, 151_936),
        "qwen3-4b" => (2560, 9728, 36, 32, 8, 128, 151_936),
        "smollm2-135m" => (576, 1536, 30, 9, 3, 64, 49_152),
        "tiny" => (64, 128, 2, 4, 2, 32, 512),
        other => anyhow::bail!(
            "unknown model shape `{other}` (and no such model folder)\nhint: one of {}, or a folder holding `config.json` and safetensors weights",
            SHAPES.join(", ")
        ),
    };
    let qwen = name.starts_with("qwen3") || name == "tiny";
    Ok(serde_json::json!({
        "model_type": if qwen { "qwen3" } else { "llama" },
        "hidden_size": h,
        "intermediate_size": i,
        "num_hidden_layers": l,
        "num_attention_heads": a,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "vocab_size": v,
        "tie_word_embeddings": true,
        "rope_theta": if qwen { 1e6 } else { 1e5 },
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": if qwen { 40960 } else { 8192 },
        "hidden_act": "silu",
    }))
}

/// Random weights: matrices with standard deviation 0.02, unit norms.
struct RandomWeights;

impl SimpleBackend for RandomWeights {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        if name.ends_with("norm.weight") {
            Tensor::ones(s, dtype, dev)
        } else if dev.is_cpu() {
            let bound = 0.02 * 3f32.sqrt(); // uniform(-b, b) has std b / sqrt(3)
            let values = Rng::for_tensor(0, name).uniform(s.elem_count(), -bound, bound);
            Tensor::from_vec(values, s, dev)?.to_dtype(dtype)
        } else {
            Tensor::randn(0f32, 0.02, s, dev)?.to_dtype(dtype)
        }
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("random weights have no shape for `{name}`")
    }

    fn contains_tensor(&self, _: &str) -> bool {
        true
    }
}

/// A model of `shape` with random weights and, with `rank`, LoRA on all
/// seven projections (alpha = 2 rank, no dropout: the peer's settings).
pub fn random_model(
    shape: &str,
    rank: Option<usize>,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<LoadedModel> {
    random_model_with(shape, rank.map(peer_lora).as_ref(), dtype, device)
}

/// [`random_model`] with the adapter `lora`, if any.
pub fn random_model_with(
    shape: &str,
    lora: Option<&LoraConfig>,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<LoadedModel> {
    let config = shape_config(shape)?;
    if !device.is_cpu() {
        device.set_seed(0)?;
    }
    let vb = VarBuilder::from_backend(Box::new(RandomWeights), dtype, device.clone());
    model::build(config, vb, lora, dtype, device, std::path::Path::new(shape))
        .with_context(|| format!("cannot build a random `{shape}`"))
}

/// The peer's LoRA: rank `r` on all seven projections, alpha 2r, no
/// dropout.
fn peer_lora(r: usize) -> LoraConfig {
    LoraConfig {
        r,
        alpha: 2.0 * r as f64,
        dropout: 0.0,
        target_modules: TargetModule::ALL.to_vec(),
        seed: 0,
    }
}

/// What `bench train` measures.
#[derive(Debug, Clone)]
pub struct TrainBench {
    /// A shape of [`SHAPES`] (random weights), or a model folder.
    pub model: String,
    pub batch: usize,
    pub seq: usize,
    pub rank: usize,
    pub steps: usize,
    /// Micro-batches of `batch` rows an optimizer step: the global batch is
    /// `batch x accum` rows whatever the number of GPUs, which share them
    /// (`dist::shard`).
    pub accum: usize,
    /// Per-layer gradient checkpointing.
    pub gradient_checkpointing: bool,
    /// How the frozen projections are held.
    pub base: BasePrecision,
    /// Each step trims its rows to a length of its own (`seq`, `seq - 8`,
    /// ..., 32 lengths in turn), as batches padded to their longest row
    /// are: every step meets a row count the ones before it did not.
    pub vary_seq: bool,
}

/// What `bench train` measured.
#[derive(Debug, Serialize)]
pub struct TrainResult {
    pub ours: &'static str,
    pub job: &'static str,
    pub model: String,
    pub batch: usize,
    pub seq: usize,
    pub rank: usize,
    pub grad_ckpt: bool,
    /// Rows trimmed to a new length each step (`--vary_seq`).
    pub vary_seq: bool,
    #[serde(rename = "4bit")]
    pub four_bit: bool,
    /// `bf16`, `nf4` or `fp8`.
    pub base_precision: &'static str,
    /// Causal attention through the fused kernel.
    pub fused_attention: bool,
    pub steps: usize,
    pub accum: usize,
    /// Ranks (GPUs) the step ran on; tokens/s is the whole job's.
    pub num_gpus: usize,
    pub tokens_per_s: f64,
    pub step_ms: f64,
    /// Peak device memory in use during the steps (weights included), from
    /// the device's memory pool; absent on the CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_mem_gib: Option<f64>,
    /// cuDNN attention graphs built during the timed steps (once a new
    /// shape and direction) and the seconds they took, inside `step_ms`.
    pub attention_graph_builds: u64,
    pub attention_graph_build_s: f64,
    pub loss: f64,
}

/// LoRA SFT steps on `batch x seq` tokens (loss on every token, as the
/// peer): two untimed warm-up steps, then `steps` timed ones. A shape name
/// gets random weights; a folder is loaded as a real model.
pub fn train(b: &TrainBench, device: &Device) -> anyhow::Result<TrainResult> {
    train_with(b, device, &crate::dist::Single)
}

/// [`train`] as one rank of `comm`: each rank computes its share of the
/// `batch x accum` rows of a step, gradients are summed over ranks before
/// AdamW, and tokens/s counts every rank's tokens (rank 0's clock, from a
/// barrier to a barrier).
pub fn train_with(
    b: &TrainBench,
    device: &Device,
    comm: &dyn crate::dist::Communicator,
) -> anyhow::Result<TrainResult> {
    let TrainBench {
        model: shape,
        batch,
        seq,
        rank,
        steps,
        accum,
        gradient_checkpointing,
        base,
        vary_seq,
    } = b.clone();
    anyhow::ensure!(
        accum >= 1 && batch >= 1 && seq >= 2,
        "batch, accum >= 1 and seq >= 2"
    );
    let dtype = load::train_dtype("bf16", device);
    let mut m = if std::path::Path::new(&shape).is_dir() {
        model::load(
            std::path::Path::new(&shape),
            Some(&peer_lora(rank)),
            dtype,
            device,
        )?
    } else {
        random_model(&shape, Some(rank), dtype, device)?
    };
    m.model.set_gradient_checkpointing(gradient_checkpointing);
    m.model.hold_base(base)?;
    crate::gpu::reset_peak_memory(device)?;
    let vocab = m.model.vocab_size() as u32;
    // Rows of the global batch, numbered as one GPU sees them; this rank's
    // share of them.
    let micro: Vec<Vec<usize>> = (0..accum)
        .map(|k| (k * batch..(k + 1) * batch).collect())
        .collect();
    let parts = crate::dist::shard::split_step(&micro, comm.world(), comm.rank())
        .into_iter()
        .map(|p| -> anyhow::Result<(Tensor, Tensor, usize)> {
            let ids: Vec<u32> = p
                .rows
                .iter()
                .flat_map(|&r| {
                    (r * seq..(r + 1) * seq)
                        .map(|i| ((i as u64 * 2_654_435_761) % vocab as u64) as u32)
                })
                .collect();
            let ids = Tensor::from_vec(ids, (p.rows.len(), seq), device)?;
            let labels = ids.to_dtype(DType::I64)?;
            Ok((ids, labels, p.rows.len()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Step `k`'s row length.
    let seq_of = |k: usize| match vary_seq {
        true => seq.saturating_sub(8 * (k % 32)).max(2),
        false => seq,
    };
    let mut opt = AdamW::new(m.named_trainable_vars(), 0.0)?;
    if comm.world() > 1 {
        let ts: Vec<Tensor> = opt
            .vars()
            .iter()
            .map(|(_, v)| v.as_tensor().clone())
            .collect();
        for ((_, v), t) in opt.vars().iter().zip(crate::dist::broadcast(comm, &ts, 0)?) {
            v.set(&t)?;
        }
    }
    let mut last_loss = f64::NAN;
    // TRACE_TRAIN_PROFILE=1 prints the time of each phase of each step
    // (synchronising the device between phases, so the total grows).
    let profile = std::env::var_os("TRACE_TRAIN_PROFILE").is_some();
    let phase = |t: &mut Instant, name: &str| -> anyhow::Result<()> {
        if profile {
            device.synchronize()?;
            eprintln!("  {name}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
            *t = Instant::now();
        }
        Ok(())
    };
    let step = |opt: &mut AdamW, seq: usize| -> anyhow::Result<f64> {
        let mut t = Instant::now();
        let mut grads: Option<Vec<Tensor>> = None;
        let mut loss_sum: Option<Tensor> = None;
        // Every position but each row's last predicts the next token.
        let global_n = (batch * accum * (seq - 1)) as f64;
        for (ids, labels, rows) in &parts {
            let (ids, labels) = (ids.narrow(1, 0, seq)?, labels.narrow(1, 0, seq)?);
            let hidden = m.model.forward_hidden(&ids, None, true)?;
            phase(&mut t, "forward")?;
            let (sum, n) =
                loss::lm_head_cross_entropy(&hidden, &m.model.lm_head().weight()?, &labels)?;
            anyhow::ensure!(
                n == rows * (seq - 1),
                "{n} learned positions in {rows} rows"
            );
            let loss = (sum / global_n)?;
            phase(&mut t, "loss")?;
            let g = opt.gradients(&m.model.backward(&loss)?)?;
            phase(&mut t, "backward")?;
            loss_sum = Some(match loss_sum {
                None => loss.detach(),
                Some(l) => (l + loss.detach())?,
            });
            crate::train::optim::accumulate(&mut grads, g)?;
        }
        let grads = crate::kit::summed_over_ranks(comm, grads, opt)?;
        phase(&mut t, "all-reduce")?;
        opt.step(&grads, 1e-4, 1.0)?;
        phase(&mut t, "optimizer")?;
        let local = match loss_sum {
            Some(l) => l.to_scalar::<f32>()? as f64,
            None => 0.0,
        };
        Ok(comm.sum_f64(&[local])?[0])
    };
    for k in 0..2 {
        last_loss = step(&mut opt, seq_of(k))?;
    }
    device.synchronize()?;
    comm.barrier()?;
    let graphs_before = crate::model::attention_graph_builds();
    let t = Instant::now();
    let mut tokens = 0;
    // TRACE_TRAIN_NCU_STEP=N: only the Nth timed step (from 1) runs inside
    // the profiler's range (`ncu --profile-from-start off`).
    let ncu_step: Option<usize> = std::env::var("TRACE_TRAIN_NCU_STEP")
        .ok()
        .and_then(|v| v.parse().ok());
    for k in 2..2 + steps {
        let range = match ncu_step == Some(k - 1) {
            true => crate::gpu::profiler_range(device)?,
            false => None,
        };
        last_loss = step(&mut opt, seq_of(k))?;
        if range.is_some() {
            device.synchronize()?;
        }
        drop(range);
        tokens += batch * accum * seq_of(k);
    }
    device.synchronize()?;
    comm.barrier()?;
    let s = t.elapsed().as_secs_f64();
    let graphs = crate::model::attention_graph_builds();
    crate::dist::check_in_sync(
        comm,
        &opt.vars()
            .iter()
            .map(|(_, v)| v.as_tensor().clone())
            .collect::<Vec<_>>(),
    )?;
    anyhow::ensure!(last_loss.is_finite(), "the loss is not finite: {last_loss}");
    let peak = crate::gpu::peak_memory_gib(device)?;
    Ok(TrainResult {
        ours: "trace-train",
        job: "lora_sft",
        model: shape,
        batch,
        seq,
        rank,
        grad_ckpt: gradient_checkpointing,
        vary_seq,
        four_bit: base == BasePrecision::Nf4,
        base_precision: base.as_str(),
        fused_attention: m.model.decoder().fused_attention(),
        steps,
        accum,
        num_gpus: comm.world(),
        peak_mem_gib: peak,
        tokens_per_s: tokens as f64 / s,
        attention_graph_builds: graphs.0 - graphs_before.0,
        attention_graph_build_s: graphs.1 - graphs_before.1,
        step_ms: 1e3 * s / steps as f64,
        loss: last_loss,
    })
}

/// What `bench gen` measured.
#[derive(Debug, Serialize)]
pub struct GenResult {
    pub ours: &'static str,
    pub job: &'static str,
    pub model: String,
    pub batch: usize,
    pub prompt: usize,
    pub new: usize,
    /// LoRA rank of the sampled policy, if any.
    pub rank: Option<usize>,
    /// NF4 base weights.
    pub four_bit: bool,
    /// `bf16`, `nf4` or `fp8`.
    pub base_precision: &'static str,
    /// The decoding path the timed run took (`graph`, `eager`, `ops`).
    pub path: String,
    pub new_tokens_per_s: f64,
    pub seconds: f64,
    /// Largest difference between a sampled token's log-prob and the
    /// trainer's full forward over the same tokens (first prompt).
    pub logprob_mismatch: f64,
    /// The memory pool's high-water mark while sampling.
    pub peak_mem_gib: Option<f64>,
    /// What bounds the timed run on CUDA: the bytes a decode step must
    /// read at the least (the weights as held, the head, the norms; the
    /// rows' keys and values at their mean length), the rate this device
    /// copies memory (a 1 GiB copy, reads and writes counted), and the new
    /// tokens a second one would decode at that rate (the prefill left
    /// out): `new_tokens_per_s` against it is the share of the limit.
    pub step_weight_bytes: usize,
    pub step_kv_bytes: usize,
    pub copy_gb_per_s: Option<f64>,
    pub limit_new_tokens_per_s: Option<f64>,
    pub share_of_limit: Option<f64>,
}

/// The rate `device` copies memory, in GB/s (reads and writes counted):
/// the best of five copies of 1 GiB after one untimed; `None` off CUDA.
fn copy_rate(device: &Device) -> anyhow::Result<Option<f64>> {
    if !device.is_cuda() {
        return Ok(None);
    }
    let bytes = 1usize << 30;
    let src = Tensor::zeros(bytes / 4, DType::F32, device)?;
    let mut best = f64::INFINITY;
    for rep in 0..6 {
        device.synchronize()?;
        let t = Instant::now();
        let copy = src.copy()?;
        device.synchronize()?;
        drop(copy);
        if rep > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    Ok(Some(2.0 * bytes as f64 / best / 1e9))
}

/// Bytes as GiB, two decimals.
fn gib(bytes: u64) -> f64 {
    (bytes as f64 / (1u64 << 30) as f64 * 100.0).round() / 100.0
}

/// What `bench gen` runs.
#[derive(Debug, Clone)]
pub struct GenBench {
    /// A shape name (random weights) or a model folder.
    pub model: String,
    pub batch: usize,
    pub prompt: usize,
    pub new: usize,
    /// A LoRA adapter of this rank, if any.
    pub rank: Option<usize>,
    /// How the frozen projections are held.
    pub base: BasePrecision,
    /// `graph`, `eager` or `ops` (see [`generate::DecodePath`]).
    pub path: String,
}

/// Sampling at temperature 0.7 with the KV cache: `batch` random prompts of
/// `prompt` tokens, `new` tokens each (no stop token), after an untimed
/// 8-token warm-up; with a LoRA adapter of rank `rank` when given.
pub fn sample(bench: &GenBench, device: &Device) -> anyhow::Result<GenResult> {
    let GenBench {
        model: ref shape,
        batch,
        prompt,
        new,
        rank,
        base,
        ref path,
    } = *bench;
    let shape = shape.as_str();
    let path = match path.as_str() {
        "graph" => generate::DecodePath::Graph,
        "eager" => generate::DecodePath::Eager,
        "ops" => generate::DecodePath::Ops,
        other => anyhow::bail!("--path {other}: expected graph, eager or ops"),
    };
    let dtype = load::train_dtype("bf16", device);
    let mut m = random_model(shape, rank, dtype, device)?;
    m.model.hold_base(base)?;
    for (name, var) in m.named_trainable_vars() {
        // B starts at zero; a policy being trained has moved it.
        if name.contains("lora_B") {
            var.set(&(Tensor::ones_like(var.as_tensor())? * 1e-3)?)?;
        }
    }
    let vocab = m.model.vocab_size() as u32;
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|b| {
            (0..prompt)
                .map(|i| {
                    (((b * prompt + i) as u64 * 2_654_435_761) % (vocab as u64 - 1)) as u32 + 1
                })
                .collect()
        })
        .collect();
    let sampling = generate::Sampling {
        temperature: 0.7,
        ..generate::Sampling::default()
    };
    let run = |n: usize| {
        generate::with_decode_path(path, || {
            generate::sample(&m.model, &prompts, n, &[], 0, 0, &sampling, device)
        })
    };
    run(8)?;
    device.synchronize()?;
    crate::gpu::reset_peak_memory(device)?;
    let t = Instant::now();
    let out = run(new)?;
    device.synchronize()?;
    let s = t.elapsed().as_secs_f64();
    let peak = crate::gpu::peak_memory(device)?;
    let produced: usize = out.iter().map(|g| g.tokens.len()).sum();
    anyhow::ensure!(
        produced == batch * new,
        "expected {} new tokens, got {produced}",
        batch * new
    );
    // What an RL step logs: the sampler's log-probs against a full forward
    // over prompt + answer, on the first prompt.
    let seq: Vec<u32> = prompts[0].iter().chain(&out[0].tokens).copied().collect();
    let ids = Tensor::new(seq.as_slice(), device)?.unsqueeze(0)?;
    let logits =
        (m.model.forward(&ids, None, false)?.to_dtype(DType::F32)? / sampling.temperature)?;
    let trainer: Vec<f32> = crate::model::layers::ops::next_token_logprobs(&logits, &ids)?
        .squeeze(0)?
        .to_vec1()?;
    let logprob_mismatch = out[0]
        .logprobs
        .iter()
        .zip(&trainer[prompt - 1..])
        .map(|(a, b)| f64::from((a - b).abs()))
        .fold(0.0, f64::max);
    let dec = m.model.decoder();
    let step_weight_bytes = dec.step_weight_bytes();
    // Keys and values of every row at the run's mean length.
    let step_kv_bytes = dec.kv_bytes_per_token() * batch * (prompt + new / 2);
    drop(out);
    let copy_gb_per_s = copy_rate(device)?;
    let limit = copy_gb_per_s
        .map(|rate| batch as f64 * rate * 1e9 / (step_weight_bytes + step_kv_bytes) as f64);
    let new_tokens_per_s = produced as f64 / s;
    Ok(GenResult {
        ours: "trace-train",
        job: "sample",
        model: shape.to_owned(),
        batch,
        prompt,
        new,
        rank,
        four_bit: base == BasePrecision::Nf4,
        base_precision: base.as_str(),
        path: match generate::last_path() {
            Some(generate::DecodePath::Graph) => "graph",
            Some(generate::DecodePath::Eager) => "eager",
            _ => "ops",
        }
        .to_owned(),
        new_tokens_per_s,
        seconds: s,
        logprob_mismatch,
        peak_mem_gib: peak.map(gib),
        step_weight_bytes,
        step_kv_bytes,
        copy_gb_per_s,
        limit_new_tokens_per_s: limit,
        share_of_limit: limit.map(|l| new_tokens_per_s / l),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A LoRA step's factor gradients with FP8 base weights against the
    /// same step with the weights as they are (f32 on the CPU; the CPU
    /// multiplies the same FP8 codes as CUDA after dequantising them), on a
    /// random model of SmolLM2-135M's shape, and NF4's beside it, printed.
    #[test]
    fn lora_gradients_from_fp8_weights_stay_near_the_16_bit_ones() {
        let cpu = Device::Cpu;
        let grads = |base: BasePrecision| -> Vec<Tensor> {
            let mut m = random_model("smollm2-135m", Some(4), DType::F32, &cpu).unwrap();
            m.model.hold_base(base).unwrap();
            for (name, var) in m.named_trainable_vars() {
                // Non-zero B, so that A's gradient is not zero too.
                if name.contains("lora_B") {
                    var.set(&(Tensor::ones_like(var.as_tensor()).unwrap() * 1e-2).unwrap())
                        .unwrap();
                }
            }
            let ids: Vec<u32> = (0..32u32).map(|i| (i * 7919) % 49_152).collect();
            let ids = Tensor::from_vec(ids, (1, 32), &cpu).unwrap();
            let labels = ids.to_dtype(DType::I64).unwrap();
            let hidden = m.model.forward_hidden(&ids, None, true).unwrap();
            let (sum, _) =
                loss::lm_head_cross_entropy(&hidden, &m.model.lm_head().weight().unwrap(), &labels)
                    .unwrap();
            let opt = AdamW::new(m.named_trainable_vars(), 0.0).unwrap();
            opt.gradients(&m.model.backward(&sum).unwrap()).unwrap()
        };
        let flat = |g: &[Tensor]| {
            Tensor::cat(
                &g.iter()
                    .map(|t| t.flatten_all().unwrap())
                    .collect::<Vec<_>>(),
                0,
            )
            .unwrap()
        };
        let exact = flat(&grads(BasePrecision::Bf16));
        let rel = |base| {
            let g = flat(&grads(base));
            let d = (&g - &exact).unwrap().sqr().unwrap().sum_all().unwrap();
            let n = exact.sqr().unwrap().sum_all().unwrap();
            (d.to_scalar::<f32>().unwrap() / n.to_scalar::<f32>().unwrap()).sqrt()
        };
        let (fp8, nf4) = (rel(BasePrecision::Fp8), rel(BasePrecision::Nf4));
        println!("LoRA gradients against f32's: relative error fp8 {fp8:.4}, nf4 {nf4:.4}");
        // Thirty random layers carry each product's few percent onwards;
        // NF4's 16 levels move them further.
        assert!(fp8 > 1e-4 && fp8 < 0.3, "fp8: relative error {fp8}");
        assert!(fp8 < nf4, "fp8 {fp8} against nf4 {nf4}");
    }

    #[test]
    fn a_random_model_trains_and_samples_on_the_cpu() {
        let cpu = Device::Cpu;
        let bench = TrainBench {
            model: "smollm2-135m".into(),
            batch: 1,
            seq: 16,
            rank: 4,
            steps: 1,
            accum: 1,
            gradient_checkpointing: false,
            base: BasePrecision::Bf16,
            vary_seq: false,
        };
        let r = train(&bench, &cpu).unwrap();
        // Small random logits (the final norm gives the hidden state unit
        // scale, so each logit has standard deviation about
        // 0.02 * sqrt(576) = 0.5): the loss is ln(vocab) give or take a
        // few tenths; a broken forward or loss lands far from it.
        let uniform = (49_152f64).ln();
        assert!((r.loss - uniform).abs() < 0.3, "{} vs {uniform}", r.loss);
        let again = train(&bench, &cpu).unwrap();
        assert_eq!(r.loss, again.loss, "CPU runs repeat exactly");
        let checkpointed = TrainBench {
            gradient_checkpointing: true,
            ..bench.clone()
        };
        assert_eq!(train(&checkpointed, &cpu).unwrap().loss, r.loss);
        let quantized = TrainBench {
            base: BasePrecision::Nf4,
            ..bench.clone()
        };
        let q = train(&quantized, &cpu).unwrap();
        // 4-bit weights change the numbers (each weight moves by about 9%
        // of its block's scale), not the regime.
        assert!(q.loss != r.loss, "NF4 weights left the loss unchanged");
        assert!((q.loss - uniform).abs() < 0.3, "{} vs {uniform}", q.loss);
        // FP8 weights and products likewise, closer to the 16-bit loss than
        // NF4 (3 mantissa bits against a 16-value code book).
        let fp8 = train(
            &TrainBench {
                base: BasePrecision::Fp8,
                ..bench.clone()
            },
            &cpu,
        )
        .unwrap();
        assert_eq!(fp8.base_precision, "fp8");
        assert!(fp8.loss != r.loss, "FP8 weights left the loss unchanged");
        assert!(
            (fp8.loss - r.loss).abs() < (q.loss - r.loss).abs(),
            "fp8 {} nf4 {} bf16 {}",
            fp8.loss,
            q.loss,
            r.loss
        );
        assert!(r.tokens_per_s > 0.0);
        // Rows trimmed a step at a time (40, 32, then timed 24 and 16
        // tokens): the loss stays in the regime.
        let varied = train(
            &TrainBench {
                seq: 40,
                steps: 2,
                vary_seq: true,
                ..bench.clone()
            },
            &cpu,
        )
        .unwrap();
        assert!(varied.vary_seq);
        assert!((varied.loss - uniform).abs() < 0.3, "{}", varied.loss);
        // The same global batch on 2 ranks (threads): the same losses after
        // three updates, so the same gradients and weights.
        let global = TrainBench {
            batch: 2,
            seq: 8,
            accum: 2,
            ..bench.clone()
        };
        let one = train(&global, &cpu).unwrap();
        let two = crate::dist::inprocess::run_ranks(2, |c| train_with(&global, &cpu, &c)).unwrap();
        for r in &two {
            assert!(
                (r.loss - one.loss).abs() < 1e-5 * one.loss,
                "{} vs {}",
                r.loss,
                one.loss
            );
            assert_eq!(r.num_gpus, 2);
        }
        let gen_bench = GenBench {
            model: "smollm2-135m".into(),
            batch: 2,
            prompt: 4,
            new: 3,
            rank: Some(4),
            base: BasePrecision::Bf16,
            path: "graph".into(),
        };
        let g = sample(&gen_bench, &cpu).unwrap();
        assert_eq!((g.batch, g.new), (2, 3));
        // The CPU runs f32, where sampler and trainer agree closely.
        assert!(g.logprob_mismatch < 1e-3, "{}", g.logprob_mismatch);
        assert!(shape_config("gpt2").is_err());
    }
}
