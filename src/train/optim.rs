//! AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization",
//! ICLR 2019, Algorithm 2) over the trainable variables only, with its state
//! exposed so a checkpoint can restore it exactly, and global-norm gradient
//! clipping.
//!
//! Per variable, at step t (1-based), with gradient g:
//!   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
//!   p = p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) - lr * wd * p
//! The state is kept in f32 whatever the model's dtype.

use std::collections::BTreeMap;

use candle_core::{DType, Result, Tensor, Var};

/// Adds one micro-batch's gradients `g` to the running sums `acc`
/// (tensor by tensor, in the optimizer's order; the first call takes `g`).
pub fn accumulate(acc: &mut Option<Vec<Tensor>>, g: Vec<Tensor>) -> Result<()> {
    *acc = Some(match acc.take() {
        None => g,
        Some(sum) => sum
            .iter()
            .zip(&g)
            .map(|(a, b)| a + b)
            .collect::<Result<_>>()?,
    });
    Ok(())
}

pub struct AdamW {
    /// (name, variable), in a fixed order.
    vars: Vec<(String, Var)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    pub step: u64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamW {
    pub fn new(vars: Vec<(String, Var)>, weight_decay: f64) -> Result<Self> {
        let zeros = |v: &Var| v.as_tensor().zeros_like()?.to_dtype(DType::F32);
        let m = vars.iter().map(|(_, v)| zeros(v)).collect::<Result<_>>()?;
        let v = vars.iter().map(|(_, v)| zeros(v)).collect::<Result<_>>()?;
        Ok(AdamW {
            vars,
            m,
            v,
            step: 0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        })
    }

    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// Each variable's gradient in `grads`, in `vars` order; an error names
    /// a variable the loss does not reach.
    pub fn gradients(&self, grads: &candle_core::backprop::GradStore) -> Result<Vec<Tensor>> {
        self.vars
            .iter()
            .map(|(name, v)| {
                grads.get(v.as_tensor()).cloned().ok_or_else(|| {
                    candle_core::Error::Msg(format!(
                        "no gradient reached `{name}`: the loss does not depend on it"
                    ))
                })
            })
            .collect()
    }

    /// The L2 norm of all gradients together; `grads` are in `vars` order.
    pub fn grad_norm(grads: &[Tensor]) -> Result<f64> {
        // Each tensor's sum of squares on the device, then one copy to the
        // host (not one synchronisation a tensor), summed there in f64.
        let sums = grads
            .iter()
            .map(|g| g.to_dtype(DType::F32)?.sqr()?.sum_all())
            .collect::<Result<Vec<_>>>()?;
        if sums.is_empty() {
            return Ok(0.0);
        }
        let sums = Tensor::stack(&sums, 0)?.to_vec1::<f32>()?;
        Ok(sums.iter().map(|&s| s as f64).sum::<f64>().sqrt())
    }

    /// One update with learning rate `lr`; `grads` (in `vars` order) are
    /// multiplied by `grad_scale` first (clipping).
    pub fn step(&mut self, grads: &[Tensor], lr: f64, grad_scale: f64) -> Result<()> {
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(t);
        let c2 = 1.0 - b2.powi(t);
        if grads.len() != self.vars.len() {
            candle_core::bail!(
                "{} gradients for {} variables",
                grads.len(),
                self.vars.len()
            );
        }
        let fused = crate::model::layers::fused::AdamWStep {
            lr,
            beta1: b1,
            beta2: b2,
            c1,
            c2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            grad_scale,
        };
        for (i, (_, var)) in self.vars.iter().enumerate() {
            if var.dtype() == DType::F32
                && let Some((p, m, v)) = crate::model::layers::fused::adamw_step(
                    var.as_tensor(),
                    &grads[i],
                    &self.m[i],
                    &self.v[i],
                    &fused,
                )?
            {
                var.set(&p)?;
                self.m[i] = m;
                self.v[i] = v;
                continue;
            }
            let g = (grads[i].to_dtype(DType::F32)? * grad_scale)?;
            let m = ((&self.m[i] * b1)? + (&g * (1.0 - b1))?)?;
            let v = ((&self.v[i] * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let update = ((&m / c1)? / ((&v / c2)?.sqrt()? + self.eps)?)?;
            let p = var.as_tensor().to_dtype(DType::F32)?;
            let p = ((&p - (update * lr)?)? - (&p * (lr * self.weight_decay))?)?;
            var.set(&p.to_dtype(var.dtype())?)?;
            self.m[i] = m;
            self.v[i] = v;
        }
        Ok(())
    }

    /// The moments by variable name, for a checkpoint.
    pub fn state(&self) -> BTreeMap<String, Tensor> {
        let mut out = BTreeMap::new();
        for (i, (name, _)) in self.vars.iter().enumerate() {
            out.insert(format!("{name}.exp_avg"), self.m[i].clone());
            out.insert(format!("{name}.exp_avg_sq"), self.v[i].clone());
        }
        out
    }

    /// Restores moments saved by [`AdamW::state`]; every variable must be there.
    pub fn load_state(&mut self, state: &BTreeMap<String, Tensor>, step: u64) -> Result<()> {
        for (i, (name, var)) in self.vars.iter().enumerate() {
            let get = |k: String| {
                state
                    .get(&k)
                    .cloned()
                    .ok_or_else(|| candle_core::Error::Msg(format!("optimizer state lacks `{k}`")))
            };
            self.m[i] = get(format!("{name}.exp_avg"))?.to_device(var.device())?;
            self.v[i] = get(format!("{name}.exp_avg_sq"))?.to_device(var.device())?;
        }
        self.step = step;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn minimises_a_quadratic_and_restores_exactly() {
        let dev = Device::Cpu;
        let run = |steps: usize, restore: Option<(BTreeMap<String, Tensor>, u64, Tensor)>| {
            let init = match &restore {
                Some((_, _, p)) => p.clone(),
                None => Tensor::new(&[3.0f32, -2.0], &dev).unwrap(),
            };
            let x = Var::from_tensor(&init).unwrap();
            let mut opt = AdamW::new(vec![("x".into(), x.clone())], 0.0).unwrap();
            if let Some((s, step, _)) = &restore {
                opt.load_state(s, *step).unwrap();
            }
            for _ in 0..steps {
                let loss = x.as_tensor().sqr().unwrap().sum_all().unwrap();
                let g = loss.backward().unwrap();
                let g = vec![g.get(x.as_tensor()).unwrap().clone()];
                opt.step(&g, 0.1, 1.0).unwrap();
            }
            (x.as_tensor().clone(), opt.state(), opt.step)
        };
        let (full, _, _) = run(20, None);
        let (half, state, step) = run(10, None);
        let (resumed, _, _) = run(10, Some((state, step, half)));
        assert_eq!(
            full.to_vec1::<f32>().unwrap(),
            resumed.to_vec1::<f32>().unwrap(),
            "resume must be exact"
        );
        let v = full.to_vec1::<f32>().unwrap();
        assert!(v[0].abs() < 1.5 && v[1].abs() < 1.5, "{v:?}");
    }
}
