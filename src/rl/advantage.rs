//! Advantages: per-token rewards, GAE for PPO, whitening, and GRPO's
//! group-relative advantages with DAPO's dynamic-sampling test.
//!
//! A completion is a ragged row of per-token values (only its own tokens,
//! no padding), so "masked" statistics are plain statistics over the rows
//! given; masked completions are simply not passed in. Computed in f64 on
//! the host: a batch holds at most a few hundred thousand tokens.

/// Per-token rewards of one completion of `len` tokens (Ziegler et al.
/// 2019, "Fine-Tuning Language Models from Human Preferences", eq. 2, as
/// PPO for LLMs uses it): the environment's `score` on the last token, and
/// `-kl_coef * kl[t]` on every token when a KL penalty to the reference
/// policy is paid in the reward (`kl` per token, e.g. k1 = log p - log
/// p_ref; empty for none).
pub fn token_rewards(len: usize, score: f64, kl: &[f64], kl_coef: f64) -> Vec<f64> {
    let mut r: Vec<f64> = (0..len)
        .map(|t| kl.get(t).map_or(0.0, |k| -kl_coef * k))
        .collect();
    if let Some(last) = r.last_mut() {
        *last += score;
    }
    r
}

/// Generalized advantage estimation (Schulman et al. 2016, "High-Dimensional
/// Continuous Control Using Generalized Advantage Estimation", eq. 11-16):
/// `delta_t = r_t + gamma V(s_{t+1}) - V(s_t)`,
/// `A_t = sum_l (gamma lambda)^l delta_{t+l}`, computed backwards, with the
/// state after the last token terminal (`V = 0`). Returns the advantages
/// and the value targets `A_t + V(s_t)` (the returns the critic regresses
/// on).
pub fn gae(rewards: &[f64], values: &[f64], gamma: f64, lam: f64) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(rewards.len(), values.len(), "one value per reward");
    let n = rewards.len();
    let mut adv = vec![0.0; n];
    let mut running = 0.0;
    for t in (0..n).rev() {
        let next = if t + 1 < n { values[t + 1] } else { 0.0 };
        let delta = rewards[t] + gamma * next - values[t];
        running = delta + gamma * lam * running;
        adv[t] = running;
    }
    let returns = adv.iter().zip(values).map(|(a, v)| a + v).collect();
    (adv, returns)
}

/// Mean and standard deviation (with Bessel's correction, as `torch.std`,
/// which the peers' whitening uses) over every value of every row.
pub fn mean_std(rows: &[Vec<f64>]) -> (f64, f64) {
    let n: usize = rows.iter().map(Vec::len).sum();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mean = rows.iter().flatten().sum::<f64>() / n as f64;
    if n == 1 {
        return (mean, 0.0);
    }
    let var = rows
        .iter()
        .flatten()
        .map(|x| (x - mean).powi(2))
        .sum::<f64>()
        / (n - 1) as f64;
    (mean, var.sqrt())
}

/// Advantage whitening (as in OpenAI's baselines PPO and the RLHF peers):
/// `(x - mean) / (std + 1e-8)` over the valid tokens of the whole batch.
pub fn whiten(rows: &mut [Vec<f64>]) {
    let (mean, std) = mean_std(rows);
    whiten_with(rows, mean, std);
}

/// [`whiten`] with the mean and standard deviation given (over every
/// rank's tokens, when a batch is split over ranks).
pub fn whiten_with(rows: &mut [Vec<f64>], mean: f64, std: f64) {
    for x in rows.iter_mut().flatten() {
        *x = (*x - mean) / (std + 1e-8);
    }
}

/// GRPO's group-relative advantage under outcome supervision (Shao et al.
/// 2024, "DeepSeekMath", sec. 4.1.2): every token of completion `i` gets
/// `(r_i - mean(r)) / std(r)` of its group's rewards; with `scale` false
/// only the mean is subtracted (Liu et al. 2025, "Understanding R1-Zero-Like
/// Training", Dr. GRPO). The standard deviation is Bessel-corrected as
/// `torch.std` in the peers; a group whose rewards are all equal gets zeros.
pub fn group_advantages(rewards: &[f64], scale: bool) -> Vec<f64> {
    let (mean, std) = mean_std(&[rewards.to_vec()]);
    rewards
        .iter()
        .map(|r| {
            let a = r - mean;
            if scale { a / (std + 1e-6) } else { a }
        })
        .collect()
}

/// Whether a group teaches anything: DAPO's dynamic sampling (Yu et al.
/// 2025, "DAPO", sec. 3.2, eq. 11) keeps only groups whose rewards are not
/// all equal, since an all-equal group's advantages are all zero.
pub fn informative(rewards: &[f64]) -> bool {
    rewards.windows(2).any(|w| w[0] != w[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-7, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn rewards_put_the_score_on_the_last_token_and_pay_the_kl_on_each() {
        close(&token_rewards(3, 1.0, &[], 0.1), &[0.0, 0.0, 1.0]);
        close(
            &token_rewards(3, 1.0, &[0.5, -0.2, 1.0], 0.1),
            &[-0.05, 0.02, 0.9],
        );
        assert!(token_rewards(0, 1.0, &[], 0.0).is_empty());
    }

    #[test]
    fn gae_matches_a_hand_computation() {
        // r = [0, 0, 1], V = [0.5, 0.6, 0.7], gamma 0.9, lambda 0.8:
        // delta2 = 1 - 0.7 = 0.3
        // delta1 = 0 + 0.9*0.7 - 0.6 = 0.03
        // delta0 = 0 + 0.9*0.6 - 0.5 = 0.04
        // A2 = 0.3; A1 = 0.03 + 0.72*0.3 = 0.246; A0 = 0.04 + 0.72*0.246 = 0.21712
        let (a, ret) = gae(&[0.0, 0.0, 1.0], &[0.5, 0.6, 0.7], 0.9, 0.8);
        close(&a, &[0.21712, 0.246, 0.3]);
        close(&ret, &[0.71712, 0.846, 1.0]);
        // gamma = lambda = 1: A_t = (sum of later rewards) - V(s_t), the
        // Monte-Carlo return less the baseline.
        let (a, ret) = gae(&[0.0, 0.0, 1.0], &[0.5, 0.6, 0.7], 1.0, 1.0);
        close(&a, &[0.5, 0.4, 0.3]);
        close(&ret, &[1.0, 1.0, 1.0]);
        // lambda = 0: one-step TD errors.
        let (a, _) = gae(&[0.0, 0.0, 1.0], &[0.5, 0.6, 0.7], 1.0, 0.0);
        close(&a, &[0.1, 0.1, 0.3]);
    }

    #[test]
    fn whitening_is_over_all_valid_tokens() {
        // Values 1, 2, 3, 6: mean 3, unbiased variance (4+1+0+9)/3 = 14/3.
        let mut rows = vec![vec![1.0, 2.0], vec![3.0, 6.0]];
        whiten(&mut rows);
        let s = (14.0f64 / 3.0).sqrt();
        close(&rows[0], &[-2.0 / s, -1.0 / s]);
        close(&rows[1], &[0.0, 3.0 / s]);
        let (m, sd) = mean_std(&rows);
        assert!(m.abs() < 1e-12 && (sd - 1.0).abs() < 1e-6);
    }

    #[test]
    fn grpo_advantages_match_a_hand_computation() {
        // Rewards 1, 0, 0, 1: mean 0.5, unbiased std sqrt(1/3).
        let a = group_advantages(&[1.0, 0.0, 0.0, 1.0], true);
        let s = (1.0f64 / 3.0).sqrt() + 1e-6;
        close(&a, &[0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s]);
        close(
            &group_advantages(&[1.0, 0.0, 0.0, 0.0], false),
            &[0.75, -0.25, -0.25, -0.25],
        );
        close(&group_advantages(&[1.0, 1.0, 1.0], true), &[0.0, 0.0, 0.0]);
    }

    #[test]
    fn dynamic_sampling_drops_groups_whose_rewards_are_all_equal() {
        assert!(!informative(&[1.0, 1.0, 1.0]));
        assert!(!informative(&[0.0, 0.0]));
        assert!(!informative(&[0.0]));
        assert!(informative(&[0.0, 0.0, 1.0]));
        assert!(informative(&[0.5, 0.25]));
    }
}
