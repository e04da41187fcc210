//! The RL algorithm as one typed seam: how a batch's rewards become
//! advantages, how the policy loss takes its importance ratio, and how
//! per-token terms add up (the methods below), beside what the setting
//! itself says (a critic or groups, defaults: `config::Algorithm`, where
//! the type lives so that settings can name it). The recipe
//! (`recipes::ppo`) asks the algorithm each of these and never branches on
//! its name; a new algorithm is a variant of `config::Algorithm` with its
//! name, and its answers here.
//!
//! - [`Algorithm::Ppo`]: Schulman et al. 2017, "Proximal Policy
//!   Optimization Algorithms", eq. 7, with a value head and GAE
//!   ([`super::advantage::gae`]); its KL penalty is paid in the reward.
//! - [`Algorithm::Grpo`]: Shao et al. 2024, "DeepSeekMath", sec. 4.1: no
//!   critic; each completion's advantage is its reward's z-score within
//!   its prompt's group (eq. 3, outcome supervision), the KL term in the
//!   loss.
//! - [`Algorithm::DrGrpo`]: Liu et al. 2025, "Understanding R1-Zero-Like
//!   Training", sec. 3.1 (Dr. GRPO): GRPO without its two normalisations,
//!   the group's standard deviation in the advantage and each completion's
//!   length in the loss; the advantage is `r_i - mean(r)` and the loss a sum
//!   over tokens divided by a constant (completions x the token budget).
//! - [`Algorithm::Gspo`]: Zheng et al. 2025, "Group Sequence Policy
//!   Optimization", eq. 5-7: GRPO's advantages with a sequence-level
//!   importance ratio `s_i = (pi(y_i|x) / pi_old(y_i|x))^(1/|y_i|)`,
//!   clipped and averaged over the group's completions. Its paper clips
//!   far tighter than token-level methods (`clip_low` 3e-4, `clip_high`
//!   4e-4); the settings say so, they are not changed here.

use candle_core::{Result, Tensor};

use super::advantage::group_advantages;
use super::loss::{Aggregation, clipped_policy_loss};
use crate::config::Algorithm;

/// How each algorithm updates the policy: the seam the recipe calls.
impl Algorithm {
    /// One group's advantages from its rewards; `scale_rewards` is the
    /// setting, which Dr. GRPO overrides (it never divides by the std).
    pub fn group_advantages(self, rewards: &[f64], scale_rewards: bool) -> Vec<f64> {
        group_advantages(rewards, scale_rewards && self != Self::DrGrpo)
    }

    /// How per-token terms add up: the setting's aggregation, except for
    /// Dr. GRPO (the constant `completions x max_len`) and GSPO (the mean
    /// over completions of each completion's term, eq. 5).
    pub fn aggregation(self, setting: Aggregation, max_len: usize) -> Aggregation {
        match self {
            Self::DrGrpo => Aggregation::DrGrpo { max_len },
            Self::Gspo => Aggregation::SeqMean,
            _ => setting,
        }
    }

    /// The clipped policy loss over a micro-batch's tokens laid end to end
    /// (`logp`, `old_logp`, `advantages` and the weights `w` all `(R,)`;
    /// `lens` each completion's tokens): token-level ratios for PPO, GRPO
    /// and Dr. GRPO ([`clipped_policy_loss`]), the completion's
    /// length-normalised ratio on each of its tokens for GSPO
    /// ([`sequence_log_ratio`]). Returns the loss and the share of tokens
    /// the clip bound.
    #[allow(clippy::too_many_arguments)]
    pub fn policy_loss(
        self,
        logp: &Tensor,
        old_logp: &Tensor,
        advantages: &Tensor,
        w: &Tensor,
        lens: &[usize],
        clip_low: f64,
        clip_high: f64,
    ) -> Result<(Tensor, f64)> {
        let log_ratio = (logp - old_logp)?;
        let log_ratio = match self {
            Self::Gspo => sequence_log_ratio(&log_ratio, lens)?,
            _ => log_ratio,
        };
        clipped_policy_loss(&log_ratio, advantages, w, clip_low, clip_high)
    }
}

/// GSPO's sequence-level log ratio (Zheng et al. 2025, eq. 7): each token
/// of completion `i` gets `(1/|y_i|) sum_t log(pi(y_i,t) / pi_old(y_i,t))`,
/// the mean of its completion's token log ratios, so that its ratio is
/// `s_i` and its gradient flows to every token of the completion.
/// `log_ratio` is `(R,)`, completions of `lens` tokens end to end.
pub fn sequence_log_ratio(log_ratio: &Tensor, lens: &[usize]) -> Result<Tensor> {
    let mut parts = Vec::with_capacity(lens.len());
    let mut start = 0;
    for &len in lens.iter().filter(|&&l| l > 0) {
        let mean = log_ratio.narrow(0, start, len)?.mean_keepdim(0)?;
        parts.push(mean.broadcast_as(len)?);
        start += len;
    }
    if parts.is_empty() {
        return log_ratio.zeros_like();
    }
    Tensor::cat(&parts, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rl::loss::weights;
    use candle_core::{Device, Var};

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_slice(v, v.len(), &Device::Cpu).unwrap()
    }

    #[test]
    fn names_round_trip_and_each_answers_the_seam() {
        for name in Algorithm::NAMES {
            assert_eq!(Algorithm::parse(name).unwrap().name(), name);
        }
        assert_eq!(Algorithm::parse("a2c"), None);
        assert!(Algorithm::Ppo.has_critic() && !Algorithm::Ppo.group_relative());
        for a in [Algorithm::Grpo, Algorithm::DrGrpo, Algorithm::Gspo] {
            assert!(a.group_relative() && !a.has_critic());
            assert_eq!((a.default_group_size(), a.default_kl_coef()), (8, 0.001));
        }
        assert_eq!(Algorithm::Ppo.default_group_size(), 1);
        assert_eq!(Algorithm::Ppo.default_kl_coef(), 0.05);
    }

    /// Dr. GRPO (Liu et al. 2025): advantages `r - mean(r)`, unscaled
    /// whatever `scale_rewards` says; GRPO's are z-scores. Rewards 1, 0, 0,
    /// 1: mean 0.5, Bessel std 1/sqrt(3).
    #[test]
    fn dr_grpo_subtracts_the_group_mean_and_divides_by_a_constant() {
        let r = [1.0, 0.0, 0.0, 1.0];
        assert_eq!(
            Algorithm::DrGrpo.group_advantages(&r, true),
            vec![0.5, -0.5, -0.5, 0.5]
        );
        let z = Algorithm::Grpo.group_advantages(&r, true);
        let want = 0.5 * 3f64.sqrt();
        assert!(
            (z[0] - want).abs() < 1e-5 && (z[1] + want).abs() < 1e-5,
            "{z:?}"
        );
        // Its aggregation: each token weighs 1 / (completions x max_len),
        // here 1 / (2 x 4), whatever the completions' lengths.
        let agg = Algorithm::DrGrpo.aggregation(Aggregation::TokenMean, 4);
        assert_eq!(weights(agg, &[1, 3]), vec![0.125; 4]);
        assert_eq!(
            Algorithm::Grpo.aggregation(Aggregation::TokenMean, 4),
            Aggregation::TokenMean
        );
    }

    /// GSPO (Zheng et al. 2025, eq. 5-7) on two completions of 2 and 1
    /// tokens with token log ratios (0.1, 0.3) and (-0.2), advantages +1
    /// and -1, each completion weighing 1/2 (its aggregation, the mean
    /// over completions): s_1 = exp(0.2), s_2 = exp(-0.2).
    #[test]
    fn gspo_clips_the_length_normalised_sequence_ratio() {
        let lens = [2, 1];
        let agg = Algorithm::Gspo.aggregation(Aggregation::TokenMean, 0);
        let w = t(&weights(agg, &lens));
        let adv = t(&[1.0, 1.0, -1.0]);
        let old = t(&[0.0, 0.0, 0.0]);
        let logp = Var::from_tensor(&t(&[0.1, 0.3, -0.2])).unwrap();
        let (s1, s2) = (0.2f64.exp(), (-0.2f64).exp());

        // Wide clip (0.2, 0.28): neither ratio leaves it; the loss is
        // -(1/2)(s_1 - s_2).
        let (loss, clipped) = Algorithm::Gspo
            .policy_loss(logp.as_tensor(), &old, &adv, &w, &lens, 0.2, 0.28)
            .unwrap();
        let l = loss.to_scalar::<f32>().unwrap() as f64;
        assert!((l + 0.5 * (s1 - s2)).abs() < 1e-6, "{l}");
        assert_eq!(clipped, 0.0);
        // d loss / d logp_t = -(1/2) A_i s_i / |y_i| on each token of i.
        let g = loss.backward().unwrap();
        let g = g.get(logp.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
        let want = [-0.25 * s1, -0.25 * s1, 0.5 * s2];
        for (a, b) in g.iter().zip(want) {
            assert!((*a as f64 - b).abs() < 1e-6, "{g:?} vs {want:?}");
        }

        // Tight clip (0.1, 0.1): s_1 is cut to 1.1 (A > 0), s_2 to 0.9
        // (A < 0): the loss is -(1/2)(1.1 - 0.9), and no gradient flows.
        let (loss, clipped) = Algorithm::Gspo
            .policy_loss(logp.as_tensor(), &old, &adv, &w, &lens, 0.1, 0.1)
            .unwrap();
        let l = loss.to_scalar::<f32>().unwrap() as f64;
        assert!((l + 0.1).abs() < 1e-6, "{l}");
        assert_eq!(clipped, 1.0, "every token's term is the clipped one");

        // GRPO on the same tokens takes each token's own ratio instead,
        // and the second token's, exp(0.3), is clipped at 1.28 where GSPO
        // saw only its completion's exp(0.2).
        let (grpo, clipped) = Algorithm::Grpo
            .policy_loss(logp.as_tensor(), &old, &adv, &w, &lens, 0.2, 0.28)
            .unwrap();
        assert!((clipped - 1.0 / 3.0).abs() < 1e-9, "{clipped}");
        let want = -(0.25 * 0.1f64.exp() + 0.25 * 1.28 - 0.5 * (-0.2f64).exp());
        let l = grpo.to_scalar::<f32>().unwrap() as f64;
        assert!((l - want).abs() < 1e-6, "{l} vs {want}");
    }

    #[test]
    fn the_sequence_ratio_is_each_completions_mean() {
        let r = sequence_log_ratio(&t(&[1.0, 3.0, 5.0, -1.0, 0.0, 1.0]), &[2, 1, 3]).unwrap();
        assert_eq!(
            r.to_vec1::<f32>().unwrap(),
            vec![2.0, 2.0, 5.0, 0.0, 0.0, 0.0]
        );
    }
}
