//! DPO's objectives on the summed log-probs of a pair's answers, and the
//! metrics every DPO trainer logs.
//!
//! Notation (Rafailov et al. 2023, "Direct Preference Optimization", arXiv
//! 2305.18290): for a prompt x with chosen answer y+ and rejected answer
//! y-, the policy's implicit reward margin is
//!
//! h = [log πθ(y+|x) − log πref(y+|x)] − [log πθ(y−|x) − log πref(y−|x)],
//!
//! log-probs summed over the answer's tokens. The losses of one pair:
//!
//! - `sigmoid` (DPO, Rafailov et al. 2023 Eq. 7): −log σ(βh);
//! - `ipo` (Azar et al. 2023, "A General Theoretical Paradigm to Understand
//!   Learning from Human Preferences", arXiv 2310.12036, Eq. 17, the
//!   empirical IPO loss): (h̄ − 1/(2β))², with h̄ the margin of the
//!   *per-token mean* log-ratios (each answer's log-ratio divided by its
//!   length), as TRL computes it (its authors confirmed the normalisation
//!   with IPO's); β plays IPO's τ;
//! - `robust` (Chowdhury et al. 2024, "Provably Robust DPO", arXiv
//!   2403.00409, the de-biased loss for labels flipped with probability
//!   ε): [−(1−ε)·log σ(βh) + ε·log σ(−βh)] / (1−2ε), ε in [0, 0.5);
//! - `hinge` (the SLiC calibration loss of Zhao et al. 2023, arXiv
//!   2305.10425, on the reference-normalised margin as RSO, Liu et al.
//!   2023, arXiv 2309.06657, uses it): max(0, 1 − βh).
//!
//! Optionally an NLL term on the chosen answer (RPO: Pang et al. 2024,
//! "Iterative Reasoning Preference Optimization", arXiv 2404.19733, whose
//! loss adds α times the chosen answer's negative log-likelihood divided
//! by its length): α·(−log πθ(y+|x))/|y+|.
//!
//! The batch loss is the mean over pairs. Each pair's loss depends only on
//! its four summed log-probs, so [`Objective::pair`] returns the loss and
//! its derivatives with respect to the policy's two sums: the trainer
//! backpropagates Σ_pairs (dL/dπ+ · Σ_t log πθ(y+_t) + dL/dπ− · Σ_t
//! log πθ(y−_t)) / N, whose gradient is the loss's, and pairs split over
//! micro-batches or ranks add up to the whole batch's gradient.

use serde::{Deserialize, Serialize};

/// Which pair loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossKind {
    Sigmoid,
    Ipo,
    Robust,
    Hinge,
}

impl LossKind {
    /// Parses a config's `loss`, naming the choices on a mistake.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "sigmoid" => Ok(Self::Sigmoid),
            "ipo" => Ok(Self::Ipo),
            "robust" => Ok(Self::Robust),
            "hinge" => Ok(Self::Hinge),
            other => Err(format!(
                "`{other}` is not one of sigmoid, ipo, robust, hinge"
            )),
        }
    }
}

/// The four summed log-probs of one pair, and its answers' token counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairLogps {
    pub chosen: f64,
    pub rejected: f64,
    pub ref_chosen: f64,
    pub ref_rejected: f64,
    pub chosen_len: usize,
    pub rejected_len: usize,
}

impl PairLogps {
    /// h: the margin of the two answers' log-ratios to the reference.
    pub fn margin(&self) -> f64 {
        (self.chosen - self.ref_chosen) - (self.rejected - self.ref_rejected)
    }
}

/// One pair's loss and its derivatives with respect to the policy's summed
/// log-probs of the chosen and the rejected answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairLoss {
    pub loss: f64,
    pub d_chosen: f64,
    pub d_rejected: f64,
}

/// A DPO objective: the pair loss, β, robust's ε and the NLL weight α.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Objective {
    pub kind: LossKind,
    pub beta: f64,
    /// Robust DPO's label-flip rate ε (the other losses ignore it).
    pub epsilon: f64,
    /// Weight of the chosen answer's length-normalised NLL (0: off).
    pub nll_coef: f64,
}

/// log σ(x), without overflow for large |x|.
fn log_sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        -(-x).exp().ln_1p()
    } else {
        x - x.exp().ln_1p()
    }
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

impl Objective {
    /// The loss of one pair and its derivatives (NLL term included).
    pub fn pair(&self, p: &PairLogps) -> PairLoss {
        let b = self.beta;
        let h = p.margin();
        // dL/dh for the losses of h; IPO sets both derivatives itself.
        let (mut loss, dh) = match self.kind {
            LossKind::Sigmoid => (-log_sigmoid(b * h), -b * sigmoid(-b * h)),
            LossKind::Robust => {
                let e = self.epsilon;
                let loss =
                    (-(1.0 - e) * log_sigmoid(b * h) + e * log_sigmoid(-b * h)) / (1.0 - 2.0 * e);
                let dh = -b * ((1.0 - e) * sigmoid(-b * h) + e * sigmoid(b * h)) / (1.0 - 2.0 * e);
                (loss, dh)
            }
            LossKind::Hinge => {
                let m = 1.0 - b * h;
                if m > 0.0 { (m, -b) } else { (0.0, 0.0) }
            }
            LossKind::Ipo => (0.0, 0.0),
        };
        let (mut d_chosen, mut d_rejected) = (dh, -dh);
        if self.kind == LossKind::Ipo {
            let lc = p.chosen_len.max(1) as f64;
            let lr = p.rejected_len.max(1) as f64;
            let hbar = (p.chosen - p.ref_chosen) / lc - (p.rejected - p.ref_rejected) / lr;
            let gap = hbar - 1.0 / (2.0 * b);
            loss = gap * gap;
            d_chosen = 2.0 * gap / lc;
            d_rejected = -2.0 * gap / lr;
        }
        if self.nll_coef > 0.0 {
            let lc = p.chosen_len.max(1) as f64;
            loss += self.nll_coef * (-p.chosen / lc);
            d_chosen += -self.nll_coef / lc;
        }
        PairLoss {
            loss,
            d_chosen,
            d_rejected,
        }
    }

    /// The mean loss over `pairs` and each pair's derivatives of that mean
    /// (its own divided by `n`, the number of pairs in the whole batch,
    /// which may be more than this share holds).
    pub fn batch(&self, pairs: &[PairLogps], n: usize) -> (f64, Vec<PairLoss>) {
        let n = n.max(1) as f64;
        let mut total = 0.0;
        let per: Vec<PairLoss> = pairs
            .iter()
            .map(|p| {
                let l = self.pair(p);
                total += l.loss;
                PairLoss {
                    loss: l.loss,
                    d_chosen: l.d_chosen / n,
                    d_rejected: l.d_rejected / n,
                }
            })
            .collect();
        (total / n, per)
    }
}

/// What a DPO step logs of its pairs, under TRL's names: the implicit
/// rewards β·(log πθ − log πref) of each answer, their margin, the share
/// of pairs whose chosen reward is the larger, and the policy's summed
/// log-probs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RewardStats {
    /// `rewards/chosen`: mean β·(log πθ(y+) − log πref(y+)).
    pub chosen: f64,
    /// `rewards/rejected`: mean β·(log πθ(y−) − log πref(y−)).
    pub rejected: f64,
    /// `rewards/margins`: mean of chosen − rejected reward (= β·mean h).
    pub margins: f64,
    /// `rewards/accuracies`: share of pairs with chosen reward > rejected.
    pub accuracies: f64,
    /// `logps/chosen`, `logps/rejected`: mean summed log-probs.
    pub logps_chosen: f64,
    pub logps_rejected: f64,
}

impl RewardStats {
    /// Sums over `pairs` (for adding shares over ranks): [chosen, rejected,
    /// margins, accurate, logps chosen, logps rejected, pairs].
    pub fn sums(beta: f64, pairs: &[PairLogps]) -> [f64; 7] {
        let mut s = [0.0; 7];
        for p in pairs {
            let c = beta * (p.chosen - p.ref_chosen);
            let r = beta * (p.rejected - p.ref_rejected);
            s[0] += c;
            s[1] += r;
            s[2] += c - r;
            s[3] += f64::from(u8::from(c > r));
            s[4] += p.chosen;
            s[5] += p.rejected;
            s[6] += 1.0;
        }
        s
    }

    /// The means of [`RewardStats::sums`].
    pub fn from_sums(s: &[f64; 7]) -> Self {
        let n = s[6].max(1.0);
        Self {
            chosen: s[0] / n,
            rejected: s[1] / n,
            margins: s[2] / n,
            accuracies: s[3] / n,
            logps_chosen: s[4] / n,
            logps_rejected: s[5] / n,
        }
    }

    /// The means over `pairs`.
    pub fn of(beta: f64, pairs: &[PairLogps]) -> Self {
        Self::from_sums(&Self::sums(beta, pairs))
    }

    /// The scalars under their logged names.
    pub fn scalars(&self) -> [(&'static str, f64); 6] {
        [
            ("rewards/chosen", self.chosen),
            ("rewards/rejected", self.rejected),
            ("rewards/margins", self.margins),
            ("rewards/accuracies", self.accuracies),
            ("logps/chosen", self.logps_chosen),
            ("logps/rejected", self.logps_rejected),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// π+ = −10, π− = −12, ref+ = −11, ref− = −11: h = 1 − (−1) = 2.
    /// Answers of 4 and 8 tokens.
    const P: PairLogps = PairLogps {
        chosen: -10.0,
        rejected: -12.0,
        ref_chosen: -11.0,
        ref_rejected: -11.0,
        chosen_len: 4,
        rejected_len: 8,
    };

    fn obj(kind: LossKind, beta: f64) -> Objective {
        Objective {
            kind,
            beta,
            epsilon: 0.0,
            nll_coef: 0.0,
        }
    }

    fn close(a: f64, b: f64, what: &str) {
        assert!((a - b).abs() < 1e-9, "{what}: {a} vs {b}");
    }

    /// The derivatives against central differences of the loss.
    fn check_derivatives(o: &Objective, p: &PairLogps) {
        let l = o.pair(p);
        let eps = 1e-6;
        let at = |dc: f64, dr: f64| {
            o.pair(&PairLogps {
                chosen: p.chosen + dc,
                rejected: p.rejected + dr,
                ..*p
            })
            .loss
        };
        let nc = (at(eps, 0.0) - at(-eps, 0.0)) / (2.0 * eps);
        let nr = (at(0.0, eps) - at(0.0, -eps)) / (2.0 * eps);
        assert!(
            (nc - l.d_chosen).abs() < 1e-6,
            "{o:?}: d+ {} vs {nc}",
            l.d_chosen
        );
        assert!(
            (nr - l.d_rejected).abs() < 1e-6,
            "{o:?}: d- {} vs {nr}",
            l.d_rejected
        );
    }

    #[test]
    fn sigmoid_is_rafailov_eq_7() {
        // Rafailov et al. 2023 Eq. 7: −log σ(βh), β 0.1, h 2:
        // −log σ(0.2) = log(1 + e^−0.2) = 0.598138869...
        let o = obj(LossKind::Sigmoid, 0.1);
        let l = o.pair(&P);
        close(l.loss, 0.598_138_869_381_7, "loss");
        // dL/dh = −β σ(−βh) = −0.1 × 0.450166... ; d/dπ+ = dL/dh, d/dπ− = −dL/dh.
        close(l.d_chosen, -0.045_016_600_268_752_2, "d+");
        close(l.d_rejected, 0.045_016_600_268_752_2, "d-");
        // At h = 0 the loss is log 2 whatever β (TRL's 0.6931 of a fresh adapter).
        let zero = PairLogps {
            chosen: -11.0,
            rejected: -11.0,
            ..P
        };
        close(
            obj(LossKind::Sigmoid, 0.5).pair(&zero).loss,
            2f64.ln(),
            "h=0",
        );
        check_derivatives(&o, &P);
    }

    #[test]
    fn ipo_is_azar_eq_17_on_per_token_means() {
        // Azar et al. 2023 Eq. 17, (h̄ − 1/(2β))², h̄ of per-token means:
        // (−10 + 11)/4 − (−12 + 11)/8 = 0.25 + 0.125 = 0.375;
        // β 0.1: 1/(2β) = 5; (0.375 − 5)² = 21.390625.
        let o = obj(LossKind::Ipo, 0.1);
        let l = o.pair(&P);
        close(l.loss, 21.390_625, "loss");
        // d/dπ+ = 2(h̄ − 5)/4 = −2.3125; d/dπ− = −2(h̄ − 5)/8 = 1.15625.
        close(l.d_chosen, -2.3125, "d+");
        close(l.d_rejected, 1.156_25, "d-");
        // Unnormalised h (= 2) would give (2 − 5)² = 9: the lengths matter.
        assert!((l.loss - 9.0).abs() > 1.0);
        check_derivatives(&o, &P);
    }

    #[test]
    fn robust_is_chowdhury_debiased_loss() {
        // [−(1−ε) log σ(βh) + ε log σ(−βh)] / (1−2ε), β 0.1, h 2, ε 0.1:
        // log σ(0.2) = −0.598138869, log σ(−0.2) = −0.798138869;
        // (0.538324982 − 0.079813887) / 0.8 = 0.573138869...
        let o = Objective {
            epsilon: 0.1,
            ..obj(LossKind::Robust, 0.1)
        };
        let l = o.pair(&P);
        close(l.loss, 0.573_138_869_381_6, "loss");
        check_derivatives(&o, &P);
        // ε 0 is DPO's Eq. 7.
        let plain = Objective { epsilon: 0.0, ..o };
        close(
            plain.pair(&P).loss,
            obj(LossKind::Sigmoid, 0.1).pair(&P).loss,
            "ε=0",
        );
    }

    #[test]
    fn hinge_is_slic_calibration_on_the_margin() {
        // max(0, 1 − βh): β 0.1, h 2 → 0.8, slope −β on π+ and +β on π−.
        let o = obj(LossKind::Hinge, 0.1);
        let l = o.pair(&P);
        close(l.loss, 0.8, "loss");
        close(l.d_chosen, -0.1, "d+");
        close(l.d_rejected, 0.1, "d-");
        // β 1, h 2: past the margin, no loss and no gradient.
        let past = obj(LossKind::Hinge, 1.0).pair(&P);
        assert_eq!((past.loss, past.d_chosen, past.d_rejected), (0.0, 0.0, 0.0));
        check_derivatives(&o, &P);
    }

    #[test]
    fn rpo_adds_the_chosen_answers_mean_nll() {
        // Pang et al. 2024: + α·(−log π(y+))/|y+|; α 1: 10/4 = 2.5 more,
        // and −α/|y+| = −0.25 more on d/dπ+.
        let base = obj(LossKind::Sigmoid, 0.1);
        let rpo = Objective {
            nll_coef: 1.0,
            ..base
        };
        let (a, b) = (base.pair(&P), rpo.pair(&P));
        close(b.loss - a.loss, 2.5, "nll");
        close(b.d_chosen - a.d_chosen, -0.25, "d+");
        close(b.d_rejected, a.d_rejected, "d-");
        check_derivatives(&rpo, &P);
    }

    #[test]
    fn the_batch_is_the_mean_and_its_derivatives_are_scaled() {
        let o = obj(LossKind::Sigmoid, 0.1);
        let zero = PairLogps {
            chosen: -11.0,
            rejected: -11.0,
            ..P
        };
        let (mean, per) = o.batch(&[P, zero], 2);
        close(mean, (0.598_138_869_381_7 + 2f64.ln()) / 2.0, "mean");
        close(per[0].d_chosen, -0.045_016_600_268_752_2 / 2.0, "d+ / n");
        // A share of a larger batch divides by the whole batch's count.
        let (_, share) = o.batch(&[P], 4);
        close(share[0].d_chosen, -0.045_016_600_268_752_2 / 4.0, "share");
    }

    #[test]
    fn reward_metrics_match_trl_definitions() {
        // β 0.1. Pair P: chosen reward 0.1 × 1 = 0.1, rejected 0.1 × −1 = −0.1.
        // Pair Q: π+ −5, ref+ −4 → −0.1; π− −3, ref− −5 → 0.2 (a miss).
        let q = PairLogps {
            chosen: -5.0,
            rejected: -3.0,
            ref_chosen: -4.0,
            ref_rejected: -5.0,
            chosen_len: 2,
            rejected_len: 2,
        };
        let m = RewardStats::of(0.1, &[P, q]);
        close(m.chosen, (0.1 - 0.1) / 2.0, "rewards/chosen");
        close(m.rejected, (-0.1 + 0.2) / 2.0, "rewards/rejected");
        close(m.margins, (0.2 + -0.3) / 2.0, "rewards/margins");
        close(m.accuracies, 0.5, "rewards/accuracies");
        close(m.logps_chosen, -7.5, "logps/chosen");
        close(m.logps_rejected, -7.5, "logps/rejected");
        // The margin is β × mean h.
        close(m.margins, 0.1 * (P.margin() + q.margin()) / 2.0, "β h");
        // A tie is not counted as accurate.
        let tie = PairLogps {
            chosen: -11.0,
            rejected: -11.0,
            ..P
        };
        assert_eq!(RewardStats::of(0.1, &[tie]).accuracies, 0.0);
    }

    #[test]
    fn unknown_loss_names_the_choices() {
        let e = LossKind::parse("kto").unwrap_err();
        assert!(e.contains("sigmoid, ipo, robust, hinge"), "{e}");
        assert_eq!(LossKind::parse("ipo"), Ok(LossKind::Ipo));
    }
}
