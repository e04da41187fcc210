//! The RL objectives on the tokens of a minibatch: the clipped policy
//! surrogate with separate low and high clip, the clipped value loss, the
//! KL estimators, and how per-token terms are summed into one loss (token
//! mean, sequence mean, or Dr. GRPO's constant). The log-probabilities and
//! entropies they take come from `train::loss::lm_head_logprobs`.
//!
//! Every per-token tensor here is flat, `(R,)` for the `R` completion
//! tokens of the minibatch laid end to end; an aggregation is a weight per
//! token ([`weights`]) so that every loss is `sum(w * term)`.

use candle_core::{DType, Result, Tensor};

/// How per-token terms become one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregation {
    /// Mean over every token of the minibatch (DAPO, Yu et al. 2025, sec.
    /// 3.3, eq. 12; the peers' default): long completions weigh more.
    TokenMean,
    /// Mean over completions of each completion's token mean (the original
    /// GRPO, Shao et al. 2024, eq. 3): biased towards short completions.
    SeqMean,
    /// Sum over tokens divided by `completions * max_len`, a constant
    /// (Liu et al. 2025, "Understanding R1-Zero-Like Training", Dr. GRPO).
    DrGrpo { max_len: usize },
}

impl Aggregation {
    /// `token_mean`, `seq_mean` or `dr_grpo` (with the token budget).
    pub fn parse(name: &str, max_len: usize) -> Option<Self> {
        match name {
            "token_mean" => Some(Self::TokenMean),
            "seq_mean" => Some(Self::SeqMean),
            "dr_grpo" => Some(Self::DrGrpo { max_len }),
            _ => None,
        }
    }
}

/// The weight of each token (completions of `lens` tokens, end to end) so
/// that `sum(w * x)` is the aggregate of `x`.
pub fn weights(agg: Aggregation, lens: &[usize]) -> Vec<f32> {
    let each = completion_weights(agg, lens);
    lens.iter()
        .zip(each)
        .flat_map(|(&len, w)| std::iter::repeat_n(w as f32, len))
        .collect()
}

/// The weight every token of each completion gets in [`weights`]: the
/// same for all tokens of one completion under every aggregation, so a
/// minibatch split over ranks weighs its tokens as the whole would.
pub fn completion_weights(agg: Aggregation, lens: &[usize]) -> Vec<f64> {
    let total: usize = lens.iter().sum();
    let n = lens.iter().filter(|&&l| l > 0).count().max(1) as f64;
    lens.iter()
        .map(|&len| match agg {
            Aggregation::TokenMean => 1.0 / total.max(1) as f64,
            Aggregation::SeqMean => 1.0 / (n * len.max(1) as f64),
            Aggregation::DrGrpo { max_len } => 1.0 / (n * max_len.max(1) as f64),
        })
        .collect()
}

/// A KL estimator of KL(p || p_ref) from one sample `x ~ p` (Schulman 2020,
/// "Approximating KL Divergence"), with `log r = log p_ref(x) - log p(x)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KlEstimator {
    /// `k1 = -log r`: unbiased, high variance, can be negative.
    K1,
    /// `k2 = (log r)^2 / 2`: biased, low variance, >= 0.
    K2,
    /// `k3 = (r - 1) - log r`: unbiased, low variance, >= 0.
    K3,
}

impl KlEstimator {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "k1" => Some(Self::K1),
            "k2" => Some(Self::K2),
            "k3" => Some(Self::K3),
            _ => None,
        }
    }

    /// The estimate for one token.
    pub fn value(self, logp: f64, ref_logp: f64) -> f64 {
        let log_r = ref_logp - logp;
        match self {
            Self::K1 => -log_r,
            Self::K2 => 0.5 * log_r * log_r,
            Self::K3 => log_r.exp() - 1.0 - log_r,
        }
    }

    /// The estimate for every token, differentiable in `logp`.
    pub fn tensor(self, logp: &Tensor, ref_logp: &Tensor) -> Result<Tensor> {
        let log_r = (ref_logp - logp)?;
        match self {
            Self::K1 => log_r.neg(),
            Self::K2 => log_r.sqr()? * 0.5,
            Self::K3 => (log_r.exp()? - 1.0)? - &log_r,
        }
    }
}

/// PPO's clipped surrogate (Schulman et al. 2017, "Proximal Policy
/// Optimization Algorithms", eq. 7) with DAPO's decoupled clip (Yu et al.
/// 2025, sec. 3.1, "clip-higher", eq. 10): with `ratio = exp(log_ratio)`
/// (each token's `logp - old_logp`, or its completion's mean for GSPO:
/// `rl::algorithm`), the loss is `-sum(w * min(ratio A, clip(ratio, 1 -
/// low, 1 + high) A))`. Also the clip fraction: the share of tokens whose
/// clipped term is the smaller (their gradient is zero).
pub fn clipped_policy_loss(
    log_ratio: &Tensor,
    advantages: &Tensor,
    w: &Tensor,
    clip_low: f64,
    clip_high: f64,
) -> Result<(Tensor, f64)> {
    let ratio = log_ratio.exp()?;
    let unclipped = (&ratio * advantages)?;
    let clipped = (ratio.clamp(1.0 - clip_low, 1.0 + clip_high)? * advantages)?;
    let objective = unclipped.minimum(&clipped)?;
    let loss = (objective * w)?.sum_all()?.neg()?;
    // The share among the tokens that train (a weight above 0).
    let live = w.gt(0.0)?.to_dtype(DType::F32)?;
    let n = live.sum_all()?.to_scalar::<f32>()?.max(1.0) as f64;
    let hits = (clipped.lt(&unclipped)?.to_dtype(DType::F32)? * live)?
        .sum_all()?
        .to_scalar::<f32>()? as f64;
    Ok((loss, hits / n))
}

/// Truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient
/// RL Framework Secretly Brings You Off-Policy RL Training"): each
/// token's weight `min(exp(old - sampler), cap)`, the trainer's old
/// log-prob over the sampler's, so that tokens the sampler drew more often
/// than the trainer's policy would (its kernels, batching and dtype
/// differ, or it sampled with older weights) count for less, and none
/// counts more than `cap`. 1 where the sampler kept no log-probs; an error
/// where it kept another number than the answer has tokens (with the stop
/// token, which a trainer scores too): weighing by misaligned ratios, or
/// quietly by none, would train on the wrong tokens' weights.
pub fn tis_weights(old: &[f64], sampler: &[f32], cap: f64) -> anyhow::Result<Vec<f64>> {
    if sampler.is_empty() {
        return Ok(vec![1.0; old.len()]);
    }
    anyhow::ensure!(
        sampler.len() == old.len(),
        "TIS: the sampler kept {} log-probs for an answer of {} tokens (the stop token's missing?)",
        sampler.len(),
        old.len()
    );
    Ok(old
        .iter()
        .zip(sampler)
        .map(|(&o, &s)| (o - f64::from(s)).exp().min(cap))
        .collect())
}

/// The effective sample size of importance weights as a share of their
/// count, `(sum w)^2 / (n sum w^2)` (Kong 1992): 1 when every weight is the
/// same, near `1/n` when one weight carries the batch. `sum`, `sum_sq` and
/// `n` are the weights' sum, sum of squares and count; 1 with none.
pub fn effective_sample_share(sum: f64, sum_sq: f64, n: f64) -> f64 {
    if n <= 0.0 || sum_sq <= 0.0 {
        return 1.0;
    }
    sum * sum / (n * sum_sq)
}

/// PPO's clipped value loss (as in OpenAI baselines' ppo2 and the RLHF
/// peers): `0.5 sum(w * max((V - R)^2, (V_old + clip(V - V_old, -c, c) -
/// R)^2))`, so one update cannot move a value far from the one the
/// advantages were computed with.
pub fn clipped_value_loss(
    values: &Tensor,
    old_values: &Tensor,
    returns: &Tensor,
    w: &Tensor,
    clip: f64,
) -> Result<Tensor> {
    let clipped = (old_values + (values - old_values)?.clamp(-clip, clip)?)?;
    let a = (values - returns)?.sqr()?;
    let b = (clipped - returns)?.sqr()?;
    (a.maximum(&b)? * w)?.sum_all()? * 0.5
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn t(v: &[f32]) -> Tensor {
        Tensor::new(v, &Device::Cpu).unwrap()
    }

    fn scalar(x: &Tensor) -> f64 {
        x.to_scalar::<f32>().unwrap() as f64
    }

    /// The effective sample share: 1 for equal weights, 1/n for one weight
    /// alone, and (1 + 2)^2 / (2 (1 + 4)) = 0.9 for the weights 1 and 2.
    #[test]
    fn effective_sample_share_of_known_weights() {
        assert!((effective_sample_share(4.0 * 0.7, 4.0 * 0.49, 4.0) - 1.0).abs() < 1e-12);
        assert!((effective_sample_share(3.0, 9.0, 5.0) - 0.2).abs() < 1e-12);
        assert!((effective_sample_share(3.0, 5.0, 2.0) - 0.9).abs() < 1e-12);
        assert_eq!(effective_sample_share(0.0, 0.0, 0.0), 1.0);
    }

    /// TIS weights: exp(old - sampler), truncated at the cap; 1 without
    /// the sampler's log-probs.
    #[test]
    fn tis_weights_are_truncated_ratios() {
        let old = [-1.0, -2.0, -0.5, -3.0];
        let sampler = [-1.0f32, -1.5, -1.5, -4.0];
        let w = tis_weights(&old, &sampler, 2.0).unwrap();
        let want = [1.0, (-0.5f64).exp(), 2.0, 1f64.exp().min(2.0)];
        for (a, b) in w.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{w:?}");
        }
        assert_eq!(tis_weights(&old, &[], 2.0).unwrap(), vec![1.0; 4]);
        let err = tis_weights(&old, &sampler[..3], 2.0).unwrap_err();
        assert!(
            err.to_string().contains("3 log-probs for an answer of 4"),
            "{err}"
        );
    }

    #[test]
    fn aggregation_weights() {
        let lens = [1, 3];
        assert_eq!(weights(Aggregation::TokenMean, &lens), vec![0.25; 4]);
        assert_eq!(
            weights(Aggregation::SeqMean, &lens),
            vec![0.5, 1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0]
        );
        assert_eq!(
            weights(Aggregation::DrGrpo { max_len: 5 }, &lens),
            vec![0.1; 4]
        );
    }

    #[test]
    fn kl_estimators_match_their_formulas() {
        // log p = ln 0.5, log p_ref = ln 0.25: log r = -ln 2, r = 0.5.
        let (lp, rp) = (0.5f64.ln(), 0.25f64.ln());
        let ln2 = 2f64.ln();
        assert!((KlEstimator::K1.value(lp, rp) - ln2).abs() < 1e-12);
        assert!((KlEstimator::K2.value(lp, rp) - 0.5 * ln2 * ln2).abs() < 1e-12);
        assert!((KlEstimator::K3.value(lp, rp) - (0.5 - 1.0 + ln2)).abs() < 1e-12);
        // k3 is never negative and zero at equality.
        assert_eq!(KlEstimator::K3.value(-1.0, -1.0), 0.0);
        assert!(KlEstimator::K3.value(-3.0, -0.1) > 0.0);
        let k3 = KlEstimator::K3
            .tensor(&t(&[lp as f32, -1.0]), &t(&[rp as f32, -1.0]))
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert!(
            (k3[0] as f64 - (ln2 - 0.5)).abs() < 1e-6 && k3[1] == 0.0,
            "{k3:?}"
        );
    }

    #[test]
    fn clipped_policy_loss_matches_a_hand_computation() {
        // Four tokens, old log-prob 0 (ratio = exp(logp)); low 0.2, high 0.28.
        // ratio 1.5, A = +1: clipped at 1.28 -> objective 1.28 (clipped)
        // ratio 0.5, A = +1: min(0.5, 0.8) = 0.5 (not clipped)
        // ratio 0.5, A = -1: min(-0.5, -0.8) = -0.8 (clipped)
        // ratio 1.1, A = -2: min(-2.2, -2.2) = -2.2 (inside the range)
        let logp = Var::new(
            &[1.5f32.ln(), 0.5f32.ln(), 0.5f32.ln(), 1.1f32.ln()],
            &Device::Cpu,
        )
        .unwrap();
        let old = t(&[0.0; 4]);
        let adv = t(&[1.0, 1.0, -1.0, -2.0]);
        let w = t(&[0.25; 4]);
        let (loss, frac) =
            clipped_policy_loss(&(logp.as_tensor() - &old).unwrap(), &adv, &w, 0.2, 0.28).unwrap();
        let want = -(1.28 + 0.5 - 0.8 - 2.2) / 4.0;
        assert!(
            (scalar(&loss) - want).abs() < 1e-6,
            "{} vs {want}",
            scalar(&loss)
        );
        assert_eq!(frac, 0.5);
        // Clipped tokens get no gradient; the others -w A ratio.
        let g = loss.backward().unwrap();
        let g = g.get(logp.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
        let want = [0.0, -0.25 * 0.5, 0.0, 0.25 * 2.0 * 1.1];
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{g:?}");
        }
    }

    #[test]
    fn clipped_value_loss_matches_a_hand_computation() {
        // old 0, clip 0.2, returns 1:
        // V = 0.5: clipped 0.2 -> max(0.25, 0.64) = 0.64
        // V = 0.1: inside -> max(0.81, 0.81) = 0.81
        // V = 1.5 (R = 1): clipped 0.2 -> max(0.25, 0.64) = 0.64
        let v = t(&[0.5, 0.1, 1.5]);
        let loss =
            clipped_value_loss(&v, &t(&[0.0; 3]), &t(&[1.0; 3]), &t(&[1.0 / 3.0; 3]), 0.2).unwrap();
        let want = 0.5 * (0.64 + 0.81 + 0.64) / 3.0;
        assert!((scalar(&loss) - want).abs() < 1e-6, "{}", scalar(&loss));
    }
}
