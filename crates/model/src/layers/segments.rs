//! Attention over packed rows: several examples end to end in one row
//! ([`crate::data::batch::Packed`]) must each attend only to themselves.
//!
//! Everything in a layer but attention works token by token, so it runs on
//! the packed row as it is. Attention runs on the same tokens laid out as
//! right-padded rows, one example each, and comes back: two gathers
//! (`index_select`), so the fused causal kernel (cuDNN) and the plain path
//! serve packed rows unchanged, and no block-diagonal mask is built. The
//! index lists are total (every slot names a position and every position a
//! slot; see `Packed`), so the manual backward moves gradients with the
//! same two gathers: padding carries a zero gradient in both layouts.
//!
//! With cuDNN (the `cudnn` build on a GPU) the hand-written layer backward
//! skips the gathers: cuDNN's packed (THD) attention reads the examples
//! where they are, each its own sequence ([`Segments::ragged`]), and
//! computes nothing on padding.

use std::sync::atomic::{AtomicU8, Ordering};

use candle_core::{Device, Result, Tensor};

/// Whether cuDNN's packed sequences serve packed passes in this process:
/// not tried yet, worked, or refused (then the gathered layout serves them).
static PACKED_ATTENTION: AtomicU8 = AtomicU8::new(UNTRIED);
const UNTRIED: u8 = 0;
const WORKED: u8 = 1;
const REFUSED: u8 = 2;

/// Packed passes may use cuDNN's packed sequences (not refused so far, and
/// not turned off with `TRACE_TRAIN_PACKED_ATTENTION=gather`).
pub fn packed_attention_usable() -> bool {
    static GATHER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let gather = *GATHER
        .get_or_init(|| std::env::var("TRACE_TRAIN_PACKED_ATTENTION").as_deref() == Ok("gather"));
    !gather && PACKED_ATTENTION.load(Ordering::Relaxed) != REFUSED
}

/// cuDNN's packed sequences ran once: a later failure is an error, not a
/// reason to switch layouts.
pub fn packed_attention_worked() {
    let _ =
        PACKED_ATTENTION.compare_exchange(UNTRIED, WORKED, Ordering::Relaxed, Ordering::Relaxed);
}

/// Whether cuDNN's packed sequences have run in this process.
pub fn packed_attention_proven() -> bool {
    PACKED_ATTENTION.load(Ordering::Relaxed) == WORKED
}

/// The first packed attention failed: packed passes take the gathered
/// layout from now on (said once).
pub fn refuse_packed_attention(why: &dyn std::fmt::Display) {
    if PACKED_ATTENTION.swap(REFUSED, Ordering::Relaxed) != REFUSED {
        tracing::warn!(
            "packing: cuDNN's packed attention is not available here ({why}); packed passes gather each example into a padded row for attention instead"
        );
    }
}

/// Sets whether packed passes may use cuDNN's packed sequences (the GPU
/// tests).
#[cfg(feature = "cudnn")]
pub fn set_packed_attention(on: bool) {
    PACKED_ATTENTION.store(if on { UNTRIED } else { REFUSED }, Ordering::Relaxed);
}

/// A packed pass's attention layout, on the device.
#[derive(Debug, Clone)]
pub struct Segments {
    /// `lens.len() * seq_len`: the packed position each slot reads.
    gather: Tensor,
    /// `len`: the slot each packed position reads.
    scatter: Tensor,
    seq_len: usize,
    /// Each attention row's example length, the examples end to end.
    lens: Vec<usize>,
    #[cfg(feature = "cudnn")]
    ragged: std::sync::OnceLock<crate::cuda::sdpa_cudnn::RaggedLayout>,
}

impl Segments {
    pub fn new(
        gather: &[u32],
        scatter: &[u32],
        seq_len: usize,
        lens: &[usize],
        device: &Device,
    ) -> Result<Self> {
        let seqs = lens.len();
        if let Some(n) = lens.iter().find(|&&n| n > seq_len) {
            candle_core::bail!("packed attention: an example of {n} tokens in rows of {seq_len}");
        }
        if gather.len() != seqs * seq_len {
            candle_core::bail!(
                "packed attention: {} slots for {seqs} rows of {seq_len}",
                gather.len()
            );
        }
        let len = scatter.len() as u32;
        if let Some(t) = gather.iter().find(|&&t| t >= len) {
            candle_core::bail!("packed attention: slot reads position {t} of a row of {len}");
        }
        if let Some(s) = scatter.iter().find(|&&s| s as usize >= gather.len()) {
            candle_core::bail!(
                "packed attention: position reads slot {s} of {}",
                gather.len()
            );
        }
        Ok(Self {
            gather: Tensor::new(gather, device)?,
            scatter: Tensor::new(scatter, device)?,
            seq_len,
            lens: lens.to_vec(),
            #[cfg(feature = "cudnn")]
            ragged: std::sync::OnceLock::new(),
        })
    }

    /// The packed row's examples as cuDNN's packed sequences, for attention
    /// with these head counts and size (made once a pass).
    #[cfg(feature = "cudnn")]
    pub fn ragged(
        &self,
        heads: (usize, usize, usize),
        device: &Device,
    ) -> Result<&crate::cuda::sdpa_cudnn::RaggedLayout> {
        if let Some(r) = self.ragged.get() {
            return Ok(r);
        }
        let tokens = self.scatter.dim(0)?;
        // The packed row's own bounds (a multiple of 8 sequences, a length
        // bucket): bounds of powers of two would build fewer graphs, but
        // cost about 2% a step and 2 GiB at the Qwen3-4B shape on an H100,
        // and a run builds each graph once.
        let r = crate::cuda::sdpa_cudnn::RaggedLayout::new(
            &self.lens,
            self.seq_len,
            tokens,
            heads,
            device,
        )?;
        Ok(self.ragged.get_or_init(|| r))
    }

    /// Slots a row of the attention layout.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// `x: (1, T, H, D)` packed -> `(N, H, S, D)` (a transposed view of
    /// contiguous `(N, S, H, D)`, the layout projections give attention).
    pub fn to_attention(&self, x: &Tensor) -> Result<Tensor> {
        let (_, t, h, d) = x.dims4()?;
        x.reshape((t, h * d))?
            .index_select(&self.gather, 0)?
            .reshape((self.lens.len(), self.seq_len, h, d))?
            .transpose(1, 2)
    }

    /// `y: (N, H, S, D)` -> `(1, T, H, D)` packed, contiguous.
    pub fn from_attention(&self, y: &Tensor) -> Result<Tensor> {
        let (n, h, s, d) = y.dims4()?;
        if (n, s) != (self.lens.len(), self.seq_len) {
            candle_core::bail!(
                "packed attention: output of {n} rows of {s}, expected {} of {}",
                self.lens.len(),
                self.seq_len
            );
        }
        let t = self.scatter.dim(0)?;
        y.transpose(1, 2)?
            .reshape((n * s, h * d))?
            .index_select(&self.scatter, 0)?
            .reshape((1, t, h, d))
    }
}
