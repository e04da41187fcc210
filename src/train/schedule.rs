//! Learning-rate schedule: linear warmup, then cosine decay to a floor.
//!
//! `lr(step) = peak * step / warmup` for `step < warmup`, then
//! `peak * (min_ratio + (1 - min_ratio) * (1 + cos(pi * progress)) / 2)`
//! with `progress` going from 0 to 1 over the remaining steps.

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cosine {
    pub peak: f64,
    pub warmup_steps: usize,
    pub total_steps: usize,
    pub min_ratio: f64,
}

impl Cosine {
    pub fn new(peak: f64, total_steps: usize, warmup_ratio: f64, min_ratio: f64) -> Self {
        let warmup_steps = (total_steps as f64 * warmup_ratio).ceil() as usize;
        Cosine {
            peak,
            warmup_steps: warmup_steps.min(total_steps),
            total_steps: total_steps.max(1),
            min_ratio,
        }
    }

    /// The rate for optimizer step `step` (0-based).
    pub fn lr(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let decay = (self.total_steps - self.warmup_steps).max(1) as f64;
        let progress = ((step - self.warmup_steps) as f64 / decay).min(1.0);
        let cos = (1.0 + (std::f64::consts::PI * progress).cos()) / 2.0;
        self.peak * (self.min_ratio + (1.0 - self.min_ratio) * cos)
    }
}

#[cfg(test)]
mod tests {
    use super::Cosine;

    #[test]
    fn warms_up_then_decays_to_the_floor() {
        let s = Cosine::new(1e-3, 100, 0.1, 0.1);
        assert_eq!(s.warmup_steps, 10);
        assert!((s.lr(0) - 1e-4).abs() < 1e-12);
        assert!((s.lr(9) - 1e-3).abs() < 1e-12);
        assert!((s.lr(10) - 1e-3).abs() < 1e-12);
        assert!(s.lr(50) < s.lr(20));
        assert!((s.lr(100) - 1e-4).abs() < 1e-12);
        assert!((s.lr(1000) - 1e-4).abs() < 1e-12);
    }
}
