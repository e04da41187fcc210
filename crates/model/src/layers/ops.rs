//! Linear layers with hand-written backward passes.
//!
//! candle's autograd differentiates a matmul with respect to both operands,
//! whatever they are: for a frozen base weight that is one full extra GEMM
//! in every backward pass and a weight-sized gradient kept until the step
//! ends (about 45% more FLOPs and 7.5 GiB of dead gradients for a 4B model).
//! The two custom ops here compute exactly what LoRA training needs:
//!
//! - [`frozen_matmul`]: `x W^T` whose backward returns `dL/dx = g W` only;
//! - [`lora_matmul`]: `x W^T + s (m ⊙ x) A^T B^T` (frozen `W`, trainable
//!   `A`, `B`, LoRA dropout mask `m`) as one node of the graph, whose
//!   backward computes `dx`, `dA`, `dB` with six GEMMs, four of them of
//!   rank `r`, and no weight gradient for `W`.
//!
//! The forwards run at the storage level (cuBLAS on a GPU, gemm on the CPU),
//! so no extra full-size temporaries exist beyond the output and one
//! low-rank product; the backwards are written with ordinary tensor ops on
//! detached tensors (no graph is built inside them).

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, CustomOp3, D, DType, Layout, Result, Shape, Storage, Tensor,
};

/// The dense frozen weight `(out, in)` an op multiplies by: a tensor as
/// loaded, or one materialised on demand (4-bit weights dequantised into a
/// fresh buffer for the forward and again for the backward).
pub trait FrozenWeight: Send + Sync {
    fn dense(&self) -> Result<Tensor>;

    /// `x (N, in) W^T` computed from the weight as it is held, where that
    /// is its own product (FP8's); `None`: multiply by [`Self::dense`].
    fn product(&self, _x: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

impl FrozenWeight for Tensor {
    fn dense(&self) -> Result<Tensor> {
        Ok(self.clone())
    }
}

/// `x (N, in) · w^T` at the storage level, `w: (out, in)`.
fn matmul_t<S: BackendStorage>(x: &S, xl: &Layout, w: &S, wl: &Layout) -> Result<(S, Shape)> {
    let (n, k) = xl.shape().dims2()?;
    let (m, k2) = wl.shape().dims2()?;
    if k != k2 {
        candle_core::bail!("matmul: input has {k} features, weight expects {k2}");
    }
    let wt = wl.transpose(0, 1)?; // (in, out)
    Ok((x.matmul(w, (1, n, m, k), xl, &wt)?, Shape::from((n, m))))
}

/// Runs `f` on the CPU storage of `t`, or errors.
fn with_cpu<R>(t: &Tensor, f: impl FnOnce(&CpuStorage, &Layout) -> Result<R>) -> Result<R> {
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Cpu(s) => f(s, l),
        _ => candle_core::bail!("expected a CPU tensor"),
    }
}

/// Runs `f` on the CUDA storage of `t`, or errors.
fn with_cuda<R>(t: &Tensor, f: impl FnOnce(&CudaStorage, &Layout) -> Result<R>) -> Result<R> {
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Cuda(s) => f(s, l),
        _ => candle_core::bail!("expected a CUDA tensor"),
    }
}

/// Log-probabilities of the given next tokens: (B, L-1) from logits (B, L, V)
/// and ids (B, L). The RL objectives and the sampler's
/// log-probabilities build on this.
pub fn next_token_logprobs(logits: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (b, l, v) = logits.dims3()?;
    let logp = candle_nn::ops::log_softmax(
        &logits.narrow(1, 0, l - 1)?.to_dtype(DType::F32)?,
        D::Minus1,
    )?;
    let next = ids.narrow(1, 1, l - 1)?.to_dtype(DType::U32)?;
    logp.reshape((b * (l - 1), v))?
        .gather(&next.reshape((b * (l - 1), 1))?, 1)?
        .reshape((b, l - 1))
}

/// A copy of the CPU storage of `t` and its shape: the forward of a custom
/// op whose result was computed beforehand with ordinary tensor ops.
pub fn cpu_storage_copy(t: &Tensor) -> Result<(CpuStorage, Shape)> {
    with_cpu(t, |s, l| Ok((s.try_clone(l)?, t.shape().clone())))
}

/// [`cpu_storage_copy`] on CUDA.
pub fn cuda_storage_copy(t: &Tensor) -> Result<(CudaStorage, Shape)> {
    with_cuda(t, |s, l| Ok((s.try_clone(l)?, t.shape().clone())))
}

/// `x (N, in) -> (N, out)`: `x W^T`, differentiable with respect to `x`
/// only.
pub fn frozen_matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.apply_op1(Frozen { w: w.clone() })
}

struct Frozen {
    w: Tensor,
}

impl CustomOp1 for Frozen {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        with_cpu(&self.w, |w, wl| matmul_t(s, l, w, wl))
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        with_cuda(&self.w, |w, wl| matmul_t(s, l, w, wl))
    }

    fn bwd(&self, _x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(g.contiguous()?.matmul(&self.w)?)) // (N, out) (out, in)
    }
}

/// `x (N, in) -> (N, out)`: `x W^T` by `base`'s own product, differentiable
/// with respect to `x` only (`dL/dx = g W`, `W` dense).
pub fn frozen_product(x: &Tensor, base: std::sync::Arc<dyn FrozenWeight>) -> Result<Tensor> {
    let Some(y) = base.product(&x.detach())? else {
        return frozen_matmul(x, &base.dense()?);
    };
    if !x.track_op() {
        return Ok(y);
    }
    x.apply_op1(Product { y, base })
}

/// A product computed beforehand (by the weight's own product), with the
/// input gradient through the dense weight.
struct Product {
    y: Tensor,
    base: std::sync::Arc<dyn FrozenWeight>,
}

impl CustomOp1 for Product {
    fn name(&self) -> &'static str {
        "frozen-product"
    }

    fn cpu_fwd(&self, _s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_storage_copy(&self.y)
    }

    fn cuda_fwd(&self, _s: &CudaStorage, _l: &Layout) -> Result<(CudaStorage, Shape)> {
        cuda_storage_copy(&self.y)
    }

    fn bwd(&self, _x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(g.contiguous()?.matmul(&self.base.dense()?)?))
    }
}

/// LoRA dropout on the `(N, in)` input of the LoRA path: one inverted-
/// dropout mask `m` applied to the input and, in the backward, to the
/// input's gradient.
#[derive(Debug, Clone)]
pub enum Dropout {
    /// The mask itself, shaped like the input.
    Mask(Tensor),
    /// The mask drawn where it is applied (CUDA, [`crate::layers::fused::dropout_apply`]):
    /// element `i` of any tensor shaped like the input is multiplied by the
    /// value `(stream, i)` draws, so no mask is written or read.
    Drawn { stream: u64, p: f32 },
}

impl Dropout {
    /// `m ⊙ x` for `x` shaped like the input.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Dropout::Mask(m) => x * m,
            Dropout::Drawn { stream, p } => {
                match crate::layers::fused::dropout_apply(x, *stream, *p)? {
                    Some(y) => Ok(y),
                    None => candle_core::bail!("a drawn dropout mask needs a CUDA device"),
                }
            }
        }
    }
}

/// `x (N, in) -> (N, out)`: `x W^T + scale (m ⊙ x) A^T B^T` with `a:
/// (r, in)` and `b: (out, r)` in `x`'s dtype (casts of the trainable f32
/// factors, so gradients reach them through the cast) and `dropout`, when
/// given, LoRA dropout's mask `m`.
pub fn lora_matmul(
    x: &Tensor,
    a: &Tensor,
    b: &Tensor,
    base: std::sync::Arc<dyn FrozenWeight>,
    scale: f64,
    dropout: Option<Dropout>,
) -> Result<Tensor> {
    let dropout = match dropout {
        Some(Dropout::Mask(m)) => Some(Dropout::Mask(m.contiguous()?)),
        other => other,
    };
    let dropped = match &dropout {
        Some(d) => Some(d.apply(&x.detach())?.contiguous()?),
        None => None,
    };
    let base_out = base.product(&x.detach())?;
    x.apply_op3(
        a,
        b,
        Lora {
            base,
            scale,
            dropout,
            dropped,
            base_out,
        },
    )
}

/// The base's part of a LoRA product at the storage level: its dense
/// weight to multiply by, or its product computed beforehand.
enum BaseIn<'a, S> {
    Weight(&'a S, &'a Layout),
    Product(&'a S, &'a Layout),
}

impl<S> Clone for BaseIn<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for BaseIn<'_, S> {}

struct Lora {
    base: std::sync::Arc<dyn FrozenWeight>,
    scale: f64,
    dropout: Option<Dropout>,
    /// `m ⊙ x`, what the LoRA path reads in the forward.
    dropped: Option<Tensor>,
    /// `x W^T` by the base's own product ([`FrozenWeight::product`]).
    base_out: Option<Tensor>,
}

impl Lora {
    /// The forward on either backend's storage.
    #[allow(clippy::too_many_arguments)]
    fn fwd<S: BackendStorage>(
        &self,
        x: &S,
        xl: &Layout,
        a: &S,
        al: &Layout,
        b: &S,
        bl: &Layout,
        base: BaseIn<'_, S>,
        dropped: Option<(&S, &Layout)>,
    ) -> Result<(S, Shape)> {
        let (n, _) = xl.shape().dims2()?;
        let (out, _) = bl.shape().dims2()?;
        let shape = Shape::from((n, out));
        let d = self.delta(x, xl, a, al, b, bl, dropped)?; // (N, out)
        let dl = Layout::contiguous(&shape);
        let y = match base {
            BaseIn::Weight(w, wl) => {
                let (y, _) = matmul_t(x, xl, w, wl)?;
                y.binary_impl::<candle_core::op::Add>(&d, &dl, &dl)?
            }
            BaseIn::Product(y, yl) => y.binary_impl::<candle_core::op::Add>(&d, yl, &dl)?,
        };
        Ok((y, shape))
    }

    /// `s (m ⊙ x) A^T B^T`, `(N, out)` contiguous.
    #[allow(clippy::too_many_arguments)]
    fn delta<S: BackendStorage>(
        &self,
        x: &S,
        xl: &Layout,
        a: &S,
        al: &Layout,
        b: &S,
        bl: &Layout,
        dropped: Option<(&S, &Layout)>,
    ) -> Result<S> {
        let (xd, xdl) = match dropped {
            Some((d, dl)) => (d, dl.clone()),
            None => (x, xl.clone()),
        };
        let (h, hs) = matmul_t(xd, &xdl, a, al)?; // (N, r)
        let hl = Layout::contiguous(&hs);
        let h = h.affine(&hl, self.scale, 0.0)?;
        let (d, _) = matmul_t(&h, &hl, b, bl)?; // (N, out)
        Ok(d)
    }

    /// [`Self::fwd`] with the base and the dropped input found on the
    /// backend `with` reads tensors on.
    #[allow(clippy::too_many_arguments)]
    fn fwd_on<S: BackendStorage>(
        &self,
        with: impl Fn(&Tensor, &mut dyn FnMut(&S, &Layout) -> Result<(S, Shape)>) -> Result<(S, Shape)>,
        x: &S,
        xl: &Layout,
        a: &S,
        al: &Layout,
        b: &S,
        bl: &Layout,
    ) -> Result<(S, Shape)> {
        let dense;
        let (base, is_product) = match &self.base_out {
            Some(y) => (y, true),
            None => {
                dense = self.base.dense()?;
                (&dense, false)
            }
        };
        with(base, &mut |w, wl| {
            let base = if is_product {
                BaseIn::Product(w, wl)
            } else {
                BaseIn::Weight(w, wl)
            };
            match &self.dropped {
                Some(m) => with(m, &mut |m, ml| {
                    self.fwd(x, xl, a, al, b, bl, base, Some((m, ml)))
                }),
                None => self.fwd(x, xl, a, al, b, bl, base, None),
            }
        })
    }
}

impl CustomOp3 for Lora {
    fn name(&self) -> &'static str {
        "lora-matmul"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        a: &CpuStorage,
        al: &Layout,
        b: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.fwd_on(|t, f| with_cpu(t, |s, l| f(s, l)), x, xl, a, al, b, bl)
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        a: &CudaStorage,
        al: &Layout,
        b: &CudaStorage,
        bl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.fwd_on(|t, f| with_cuda(t, |s, l| f(s, l)), x, xl, a, al, b, bl)
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, da, db) = lora_backward(
            x,
            a,
            b,
            self.base.as_ref(),
            self.scale,
            self.dropout.as_ref(),
            g,
            x.track_op(),
        )?;
        Ok((dx, Some(da), Some(db)))
    }
}

/// The gradients of `y = x W^T + s (m ⊙ x) A^T B^T` given `g = dL/dy (N,
/// out)`: `(dx, dA, dB)`, `dx` only when `need_dx`. Six GEMMs, four of rank
/// `r`; nothing with respect to `W`.
#[allow(clippy::too_many_arguments)]
pub fn lora_backward(
    x: &Tensor,
    a: &Tensor,
    b: &Tensor,
    base: &dyn FrozenWeight,
    scale: f64,
    dropout: Option<&Dropout>,
    g: &Tensor,
    need_dx: bool,
) -> Result<(Option<Tensor>, Tensor, Tensor)> {
    let g = g.contiguous()?; // (N, out)
    let xd = match dropout {
        Some(d) => d.apply(&x.contiguous()?)?,
        None => x.clone(),
    };
    let hs = (xd.matmul(&a.t()?)? * scale)?; // (N, r)
    let gbs = (g.matmul(b)? * scale)?; // (N, r)
    let da = gbs.t()?.matmul(&xd)?; // (r, in)
    let db = g.t()?.matmul(&hs)?; // (out, r)
    let dx = if need_dx {
        let lora = gbs.matmul(a)?; // (N, in)
        let lora = match dropout {
            Some(d) => d.apply(&lora)?,
            None => lora,
        };
        Some((g.matmul(&base.dense()?)? + lora)?)
    } else {
        None
    };
    Ok((dx, da, db))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use candle_core::{DType, Device, Var};

    use super::*;
    use crate::layers::init::Rng;

    fn rand(shape: (usize, usize), name: &str) -> Tensor {
        let v = Rng::for_tensor(7, name).uniform(shape.0 * shape.1, -1.0, 1.0);
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn rel(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).unwrap().sqr().unwrap().sum_all().unwrap();
        let n = b.sqr().unwrap().sum_all().unwrap();
        (d.to_scalar::<f32>().unwrap() / n.to_scalar::<f32>().unwrap()).sqrt()
    }

    /// Forward and every gradient of the fused op against plain candle ops
    /// (which differentiate `W` too; its gradient is simply not asked for).
    #[test]
    fn lora_matmul_matches_plain_ops_forward_and_backward() {
        let (n, i, o, r) = (37, 48, 40, 8);
        for dropout in [false, true] {
            let x = Var::from_tensor(&rand((n, i), "x")).unwrap();
            let a = Var::from_tensor(&rand((r, i), "a")).unwrap();
            let b = Var::from_tensor(&rand((o, r), "b")).unwrap();
            let w = rand((o, i), "w");
            let up = rand((n, o), "g");
            let mask = dropout.then(|| {
                let keep: Vec<f32> = Rng::for_tensor(3, "m")
                    .uniform(n * i, 0.0, 1.0)
                    .into_iter()
                    .map(|u| if u < 0.3 { 0.0 } else { 1.0 / 0.7 })
                    .collect();
                Tensor::from_vec(keep, (n, i), &Device::Cpu).unwrap()
            });
            let scale = 1.7;
            let fused = lora_matmul(
                x.as_tensor(),
                a.as_tensor(),
                b.as_tensor(),
                Arc::new(w.clone()),
                scale,
                mask.clone().map(Dropout::Mask),
            )
            .unwrap();
            let xd = match &mask {
                Some(m) => (x.as_tensor() * m).unwrap(),
                None => x.as_tensor().clone(),
            };
            let plain = (x.as_tensor().matmul(&w.t().unwrap()).unwrap()
                + (xd
                    .matmul(&a.as_tensor().t().unwrap())
                    .unwrap()
                    .matmul(&b.as_tensor().t().unwrap())
                    .unwrap()
                    * scale)
                    .unwrap())
            .unwrap();
            assert!(rel(&fused, &plain) < 1e-6, "forward");
            let gf = (fused * &up)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let gp = (plain * &up)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            for (name, v) in [("x", &x), ("a", &a), ("b", &b)] {
                let (f, p) = (
                    gf.get(v.as_tensor()).unwrap(),
                    gp.get(v.as_tensor()).unwrap(),
                );
                let e = rel(f, p);
                assert!(e < 1e-6, "d{name}: relative error {e}, dropout {dropout}");
            }
        }
    }

    #[test]
    fn frozen_matmul_gives_the_input_gradient_only() {
        let x = Var::from_tensor(&rand((5, 6), "x")).unwrap();
        let w = rand((4, 6), "w");
        let y = frozen_matmul(x.as_tensor(), &w).unwrap();
        let plain = x.as_tensor().matmul(&w.t().unwrap()).unwrap();
        assert!(rel(&y, &plain) < 1e-7);
        let g = y.sum_all().unwrap().backward().unwrap();
        let gp = plain.sum_all().unwrap().backward().unwrap();
        assert!(
            rel(
                g.get(x.as_tensor()).unwrap(),
                gp.get(x.as_tensor()).unwrap()
            ) < 1e-7
        );
        assert!(g.get(&w).is_none());
        // Without a tracked input nothing is recorded.
        let y = frozen_matmul(&rand((5, 6), "x"), &w).unwrap();
        assert!(!y.track_op());
        assert_eq!(y.dtype(), DType::F32);
    }
}
