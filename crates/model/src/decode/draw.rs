//! The sampling rule every fast path draws with, one row at a time with its
//! own settings: on the device (`kernels/sample.cu`, [`sample_rows`])
//! and, step for step, on the host ([`device_rule`]), so that a seed means
//! the same token on either.
//!
//! Per row, with `z = (x - max) * inv_temp`: top-k and top-p become one
//! threshold on the logits (the k-th largest logit; then the smallest logit
//! of the fewest most likely tokens holding `top_p` of what top-k kept,
//! ties kept together), and the token is the argmax over kept tokens of
//! `z + G` (compared as `x * inv_temp + G`, the same argmax), `G` standard
//! Gumbel noise hashed from `(seed, token id)`; its
//! log-probability is `z[t] - log(sum(exp(z)))` over the whole vocabulary.
//! `inv_temp` 0 picks the most likely token (the lowest id among ties) with
//! the raw logits' log-probability.

use candle_core::Result;
#[cfg(feature = "cuda")]
use candle_core::cuda_backend::cudarc::driver::DeviceRepr;

/// How one row draws its token: the sampling kernel's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    /// `1 / temperature`; 0 picks the most likely token.
    pub inv_temp: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: i32,
    /// Keep the fewest most likely tokens holding `top_p` of the mass.
    pub top_p: f32,
}

impl Draw {
    /// The most likely token.
    pub const GREEDY: Self = Self {
        inv_temp: 0.0,
        top_k: 0,
        top_p: 1.0,
    };

    /// The settings for a temperature (0: greedy), top-k (0: off) and top-p.
    pub fn new(temperature: f64, top_k: usize, top_p: f64) -> Self {
        Self {
            inv_temp: if temperature == 0.0 {
                0.0
            } else {
                (1.0 / temperature) as f32
            },
            top_k: top_k.min(i32::MAX as usize) as i32,
            top_p: top_p as f32,
        }
    }

    /// The kernel's `params` words for `draws`: `[inv_temp bits a row |
    /// top_k a row | top_p bits a row]`.
    pub fn words(draws: &[Draw]) -> Vec<u32> {
        let mut w = Vec::with_capacity(3 * draws.len());
        w.extend(draws.iter().map(|d| d.inv_temp.to_bits()));
        w.extend(draws.iter().map(|d| d.top_k.max(0) as u32));
        w.extend(draws.iter().map(|d| d.top_p.to_bits()));
        w
    }
}

/// Order-preserving image of a float: `a < b` iff `key(a) < key(b)`.
fn key_of(f: f32) -> u32 {
    let b = f.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// SplitMix64's finaliser.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Standard Gumbel noise of token `i` under `seed`, as the kernel makes it:
/// `-ln(E)`, `E = -ln(u)`, `u = (k + 1/2) / 2^32` from the hash's top 32
/// bits, `ln(u)` above one half taken as `ln_1p(-(1 - u))` with `1 - u`
/// formed from the complement of `k`.
fn gumbel(seed: u64, i: u32) -> f32 {
    let h = mix64(seed.wrapping_add(u64::from(i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let k = (h >> 32) as u32;
    let two_m32 = 1.0 / 4_294_967_296.0f32;
    let e = if k < 0x8000_0000 {
        -((k as f32 + 0.5) * two_m32).ln()
    } else {
        -(-(((0xffff_ffff - k) as f32 + 0.5) * two_m32)).ln_1p()
    };
    -e.ln()
}

/// The kernel's draw for one row of logits, on the host: the token and its
/// log-probability. What `sample_rows` picks for the same logits, seed and
/// settings, up to the order of float sums (a token at the very edge of
/// the top-p mass) and ties of the noisy scores.
pub fn device_rule(logits: &[f32], seed: u64, d: Draw) -> (u32, f32) {
    let v = logits.len();
    if v == 0 {
        return (0, 0.0);
    }
    let greedy = d.inv_temp == 0.0;
    let scale = if greedy { 1.0 } else { d.inv_temp };
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e = |x: f32| f64::from(((x - m) * scale).exp());
    let lse = logits.iter().map(|&x| e(x)).sum::<f64>().ln() as f32;
    let mut thr = 0u32;
    if !greedy && d.top_k > 0 && (d.top_k as usize) < v {
        let mut keys: Vec<u32> = logits.iter().map(|&x| key_of(x)).collect();
        let k = d.top_k as usize;
        keys.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
        thr = keys[k - 1];
    }
    if !greedy && d.top_p < 1.0 {
        // Kept tokens, most likely first; the cut is the key of the group
        // of ties at which the running mass first reaches the target.
        let mut kept: Vec<(u32, f64)> = logits
            .iter()
            .filter(|&&x| key_of(x) >= thr)
            .map(|&x| (key_of(x), e(x)))
            .collect();
        kept.sort_unstable_by_key(|k| std::cmp::Reverse(k.0));
        let target = f64::from(d.top_p) * kept.iter().map(|k| k.1).sum::<f64>();
        let mut mass = 0.0;
        let mut cut = 0u32;
        let mut i = 0;
        while i < kept.len() {
            let key = kept[i].0;
            while i < kept.len() && kept[i].0 == key {
                mass += kept[i].1;
                i += 1;
            }
            if mass >= target {
                cut = key;
                break;
            }
        }
        thr = thr.max(cut);
    }
    let mut best = f32::NEG_INFINITY;
    let mut arg = u32::MAX;
    for (i, &x) in logits.iter().enumerate() {
        if key_of(x) < thr {
            continue;
        }
        let score = if greedy {
            x
        } else {
            // The kernel's score: `x * scale + g` in one fma (the shift by
            // `m` changes no argmax).
            x.mul_add(scale, gumbel(seed, i as u32))
        };
        if score > best || (score == best && (i as u32) < arg) {
            best = score;
            arg = i as u32;
        }
    }
    if arg as usize >= v {
        arg = 0; // a row of NaN
    }
    (arg, (logits[arg as usize] - m) * scale - lse)
}

/// Threads of a `sample_rows` block (a row with top-k or top-p) and of a
/// `sample_slices` block.
#[cfg(feature = "cuda")]
pub(crate) const ROW_THREADS: u32 = 1024;
#[cfg(feature = "cuda")]
pub(crate) const SLICE_THREADS: u32 = 256;

/// Slices each of `b` rows of `v` logits is drawn in on a GPU of `sms`
/// multiprocessors: about four blocks a multiprocessor in all, none
/// shorter than 2,048 logits.
#[cfg(feature = "cuda")]
pub(crate) fn slices(b: usize, v: usize, sms: usize) -> usize {
    (4 * sms).div_ceil(b.max(1)).clamp(1, (v / 2048).max(1))
}

/// Each row's token and log-probability from `logits: (B, V)` on the
/// device, row `r` with `seeds[r]` and `draws[r]`; on the host elsewhere
/// ([`device_rule`] on the f32 logits).
pub fn pick_rows(
    logits: &candle_core::Tensor,
    seeds: &[u64],
    draws: &[Draw],
) -> Result<Vec<(u32, f32)>> {
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() {
        return sample_rows(logits, seeds, draws);
    }
    let rows = logits.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>()?;
    if seeds.len() != rows.len() || draws.len() != rows.len() {
        candle_core::bail!(
            "sampling: {} rows but {} seeds and {} settings",
            rows.len(),
            seeds.len(),
            draws.len()
        );
    }
    Ok(rows
        .iter()
        .zip(seeds.iter().zip(draws))
        .map(|(row, (&s, &d))| device_rule(row, s, d))
        .collect())
}

/// The sampling kernel: row `r` of `logits: (B, V)` drawn with `seeds[r]`
/// and `draws[r]`; two numbers a row reach the host instead of the row.
#[cfg(feature = "cuda")]
pub fn sample_rows(
    logits: &candle_core::Tensor,
    seeds: &[u64],
    draws: &[Draw],
) -> Result<Vec<(u32, f32)>> {
    use candle_core::DType;
    use half::{bf16, f16};
    let logits = logits.contiguous()?;
    match logits.dtype() {
        DType::F32 => launch::<f32>(&logits, seeds, draws, "f32"),
        DType::BF16 => launch::<bf16>(&logits, seeds, draws, "bf16"),
        DType::F16 => launch::<f16>(&logits, seeds, draws, "f16"),
        other => candle_core::bail!("sampling takes f32, bf16 or f16 logits, not {other:?}"),
    }
}

#[cfg(feature = "cuda")]
fn launch<T: candle_core::cuda_backend::CudaDType + DeviceRepr>(
    logits: &candle_core::Tensor,
    seeds: &[u64],
    draws: &[Draw],
    suffix: &str,
) -> Result<Vec<(u32, f32)>> {
    use candle_core::cuda_backend::WrapErr;
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::{Storage, bail};
    let (b, v) = logits.dims2()?;
    if seeds.len() != b || draws.len() != b {
        bail!(
            "sampling: {b} rows but {} seeds and {} settings",
            seeds.len(),
            draws.len()
        );
    }
    let (storage, layout) = logits.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        bail!("sampling kernel: expected a CUDA tensor");
    };
    let dev = cuda.device.clone();
    let start = layout.start_offset();
    let x = cuda.as_cuda_slice::<T>()?.slice(start..start + b * v);
    let seeds = dev.clone_htod(seeds)?;
    let params = dev.clone_htod(&Draw::words(draws))?;
    let slices = slices(b, v, crate::cuda::kernels::multiprocessors(&dev)?);
    // SAFETY: every slice of a row that is merged writes its four values.
    let mut part = unsafe { dev.alloc::<f32>(4 * b * slices) }?;
    // SAFETY: the kernel writes both values of every row.
    let mut out = unsafe { dev.alloc::<u32>(2 * b) }?;
    let kernel = |name: &str| {
        crate::cuda::kernels::kernel(
            &dev,
            &crate::cuda::kernels::SAMPLE,
            &format!("{name}_{suffix}"),
        )
    };
    let (v32, s32) = (v as i32, slices as i32);
    let config = |grid: (u32, u32, u32), threads: u32| LaunchConfig {
        grid_dim: grid,
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let func = kernel("sample_slices")?;
    let mut builder = func.builder();
    builder.arg(&x);
    builder.arg(&v32);
    builder.arg(&seeds);
    builder.arg(&params);
    builder.arg(&mut part);
    // SAFETY: the arguments match `sample_slices_*` in sample.cu; `part`
    // holds 4 values for each of the b x slices blocks.
    unsafe { builder.launch(config((b as u32, slices as u32, 1), SLICE_THREADS)) }.w()?;
    let func = kernel("sample_rows")?;
    let mut builder = func.builder();
    builder.arg(&x);
    builder.arg(&v32);
    builder.arg(&seeds);
    builder.arg(&params);
    builder.arg(&part);
    builder.arg(&s32);
    builder.arg(&mut out);
    // SAFETY: the arguments match `sample_rows_*` in sample.cu; `x` holds
    // b rows of v values, `seeds` b, `params` 3 b, `part` the slices' and
    // `out` 2 b.
    unsafe { builder.launch(config((b as u32, 1, 1), ROW_THREADS)) }.w()?;
    drop(storage);
    let host = dev.clone_dtoh(&out)?;
    Ok(host
        .chunks_exact(2)
        .map(|pair| (pair[0], f32::from_bits(pair[1])))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(picks: &[u32], t: u32) -> f64 {
        picks.iter().filter(|&&p| p == t).count() as f64 / picks.len() as f64
    }

    fn draws(logits: &[f32], d: Draw, n: u64) -> Vec<u32> {
        (0..n)
            .map(|s| device_rule(logits, s * 7919 + 1, d).0)
            .collect()
    }

    #[test]
    fn the_host_rule_draws_from_the_truncated_distribution() {
        let row = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln(), -100.0];
        let all = draws(&row, Draw::new(1.0, 0, 1.0), 4000);
        for (t, p) in [(0, 0.5), (1, 0.3), (2, 0.2)] {
            assert!((share(&all, t) - p).abs() < 0.03, "token {t}");
        }
        for (k, p) in [(2, 1.0), (0, 0.75), (3, 0.75)] {
            let cut = draws(&row, Draw::new(1.0, k, p), 4000);
            assert!(cut.iter().all(|&t| t < 2), "top_k {k} top_p {p}");
            assert!((share(&cut, 0) - 0.625).abs() < 0.03, "top_k {k} top_p {p}");
        }
        // Greedy: the lowest id among ties, the raw log-probability.
        let tied = [0.1f32, 2.0, -1.0, 2.0];
        let (t, lp) = device_rule(&tied, 5, Draw::GREEDY);
        assert_eq!(t, 1);
        let z: f64 = tied.iter().map(|&x| f64::from(x).exp()).sum();
        assert!((f64::from(lp) - (2.0 - z.ln())).abs() < 1e-6);
        // The log-probability is the untruncated one at the temperature.
        let (t, lp) = device_rule(&row, 9, Draw::new(2.0, 1, 1.0));
        assert_eq!(t, 0, "top_k 1 keeps the most likely");
        let z: f64 = row.iter().map(|&x| (f64::from(x) / 2.0).exp()).sum();
        assert!((f64::from(lp) - (f64::from(row[0]) / 2.0 - z.ln())).abs() < 1e-6);
        // A seed repeats its draw; another seed may not.
        let d = Draw::new(1.0, 0, 1.0);
        assert_eq!(device_rule(&row, 3, d), device_rule(&row, 3, d));
        let flat = vec![0.0f32; 1000];
        let picks: std::collections::BTreeSet<u32> = draws(&flat, d, 200).into_iter().collect();
        assert!(picks.len() > 150, "{}", picks.len());
    }

    #[test]
    fn the_params_words_hold_each_rows_settings() {
        let w = Draw::words(&[Draw::new(0.5, 7, 0.9), Draw::GREEDY]);
        assert_eq!(w.len(), 6);
        assert_eq!(f32::from_bits(w[0]), 2.0);
        assert_eq!(f32::from_bits(w[1]), 0.0);
        assert_eq!((w[2], w[3]), (7, 0));
        assert_eq!(f32::from_bits(w[4]), 0.9);
        assert_eq!(f32::from_bits(w[5]), 1.0);
    }
}

/// The kernel against the host rule: the same seeds and per-row settings
/// draw the same tokens. Run with a GPU (`cargo test --features cuda`).
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use candle_core::{DType, Device, Tensor};

    #[test]
    fn the_kernel_draws_what_the_host_rule_draws_row_by_row() {
        let dev = match Device::new_cuda(0) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("SKIPPED: no CUDA device ({e})");
                return;
            }
        };
        let (b, v) = (64, 32_000);
        // Logits with a long tail and a few strong tokens, different a row.
        let logits = Tensor::randn(0f32, 3.0, (b, v), &dev).unwrap();
        let settings = [
            Draw::GREEDY,
            Draw::new(1.0, 0, 1.0),
            Draw::new(0.7, 0, 0.95),
            Draw::new(1.3, 50, 1.0),
            Draw::new(0.6, 40, 0.8),
            Draw::new(1.0, 1, 1.0),
            Draw::new(2.0, 0, 0.5),
            Draw::new(0.2, 0, 0.99),
        ];
        let draws: Vec<Draw> = (0..b).map(|r| settings[r % settings.len()]).collect();
        let seeds: Vec<u64> = (0..b as u64).map(|r| 0x5eed ^ (r * 1_000_003)).collect();
        for dtype in [DType::F32, DType::BF16] {
            let x = logits.to_dtype(dtype).unwrap();
            let host = x.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
            let device = sample_rows(&x, &seeds, &draws).unwrap();
            for r in 0..b {
                let (t, lp) = device_rule(&host[r], seeds[r], draws[r]);
                assert_eq!(device[r].0, t, "{dtype:?} row {r} {:?}", draws[r]);
                assert!(
                    (device[r].1 - lp).abs() < 1e-3,
                    "{dtype:?} row {r}: {} vs {lp}",
                    device[r].1
                );
            }
        }
    }
}
