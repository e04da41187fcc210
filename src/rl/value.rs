//! PPO's critic: a two-layer MLP on the policy's final hidden state, in
//! f32, `V(s_t) = w2 . tanh(W1 h_t + b1) + b2`, where `h_t` is the hidden
//! state at the position that predicts token `t` (Ziegler et al. 2019 and
//! the RLHF peers put a value head on the final hidden state of a shared
//! trunk).
//!
//! The head reads the hidden states detached: the value loss trains the
//! head alone and never reaches the LoRA factors, so the critic cannot pull
//! the policy's features towards predicting returns (with a trunk shared
//! through LoRA the two objectives would compete for the same rank-r
//! update). Its variables are named `value_head.*` and saved with the
//! checkpoint; its own AdamW runs at its own learning rate.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Result, Tensor, Var};

use crate::model::layers::init::Rng;

pub struct ValueHead {
    w1: Var,
    b1: Var,
    w2: Var,
    b2: Var,
}

impl ValueHead {
    /// A fresh head for `hidden`-wide states with `width` units:
    /// `W1` uniform in `±1/sqrt(hidden)`, `w2` zero (so every value starts
    /// at 0), biases zero; seeded.
    pub fn new(hidden: usize, width: usize, seed: u64, device: &Device) -> Result<Self> {
        let bound = 1.0 / (hidden as f32).sqrt();
        let w1 = Rng::for_tensor(seed, "value_head.w1").uniform(width * hidden, -bound, bound);
        Ok(Self {
            w1: Var::from_tensor(&Tensor::from_vec(w1, (width, hidden), device)?)?,
            b1: Var::zeros(width, DType::F32, device)?,
            w2: Var::zeros((1, width), DType::F32, device)?,
            b2: Var::zeros(1, DType::F32, device)?,
        })
    }

    /// The variables by name, sorted: what its optimizer trains and a
    /// checkpoint holds.
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        vec![
            ("value_head.b1".into(), self.b1.clone()),
            ("value_head.b2".into(), self.b2.clone()),
            ("value_head.w1".into(), self.w1.clone()),
            ("value_head.w2".into(), self.w2.clone()),
        ]
    }

    /// Sets every variable from `tensors` (a checkpoint's).
    pub fn load(&self, tensors: &BTreeMap<String, Tensor>) -> Result<()> {
        for (name, var) in self.named_vars() {
            let t = tensors
                .get(&name)
                .ok_or_else(|| candle_core::Error::Msg(format!("the checkpoint lacks `{name}`")))?;
            var.set(&t.to_dtype(DType::F32)?.to_device(var.device())?)?;
        }
        Ok(())
    }

    /// `(R, hidden)` states (any float dtype, detached here) -> `(R,)`
    /// values, differentiable in the head's variables.
    pub fn forward(&self, hidden: &Tensor) -> Result<Tensor> {
        let x = hidden.detach().to_dtype(DType::F32)?;
        let h = x
            .matmul(&self.w1.as_tensor().t()?)?
            .broadcast_add(self.b1.as_tensor())?
            .tanh()?;
        h.matmul(&self.w2.as_tensor().t()?)?
            .broadcast_add(self.b2.as_tensor())?
            .squeeze(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_zero_learns_and_round_trips() {
        let dev = Device::Cpu;
        let head = ValueHead::new(4, 8, 1, &dev).unwrap();
        let x = Tensor::new(&[[1f32, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]], &dev).unwrap();
        assert_eq!(
            head.forward(&x).unwrap().to_vec1::<f32>().unwrap(),
            [0.0, 0.0]
        );
        let target = Tensor::new(&[1f32, -1.0], &dev).unwrap();
        let mut opt = crate::train::optim::AdamW::new(head.named_vars(), 0.0).unwrap();
        for _ in 0..300 {
            let loss = (head.forward(&x).unwrap() - &target)
                .unwrap()
                .sqr()
                .unwrap()
                .mean_all()
                .unwrap();
            let g = opt.gradients(&loss.backward().unwrap()).unwrap();
            opt.step(&g, 0.02, 1.0).unwrap();
        }
        let v = head.forward(&x).unwrap().to_vec1::<f32>().unwrap();
        assert!(
            (v[0] - 1.0).abs() < 0.05 && (v[1] + 1.0).abs() < 0.05,
            "{v:?}"
        );
        let saved: BTreeMap<String, Tensor> = head
            .named_vars()
            .into_iter()
            .map(|(k, v)| (k, v.as_tensor().copy().unwrap()))
            .collect();
        let fresh = ValueHead::new(4, 8, 2, &dev).unwrap();
        fresh.load(&saved).unwrap();
        assert_eq!(fresh.forward(&x).unwrap().to_vec1::<f32>().unwrap(), v);
    }
}
