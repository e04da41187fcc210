//! Seeded, device-independent random numbers for weight initialisation and
//! sampling.
//!
//! candle cannot seed its CPU generator, so the tiny test models, the LoRA
//! `A` factors and `decode::generate::sample` draw from this small
//! generator instead (SplitMix64,
//! Steele et al. 2014) on the host and move the result to the device. Each
//! tensor gets its own stream, derived from the run's seed and the tensor's
//! name, so a value does not depend on the order in which layers are built.

use trace_train_base::rng::SplitMix64;

/// A SplitMix64 generator ([`trace_train_base::rng`]) seeded from a tensor's name.
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator for the tensor `name` under the run's `seed`.
    pub fn for_tensor(seed: u64, name: &str) -> Self {
        // FNV-1a over the name, mixed with the seed.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in name.bytes() {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Self(SplitMix64::new(
            h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        ))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A value uniform in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        self.0.next_f64()
    }

    /// A value uniform in `[0, 1)`.
    fn next_unit(&mut self) -> f32 {
        // The top 24 bits fill an f32 mantissa exactly.
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// `n` values uniform in `[lo, hi)`.
    pub fn uniform(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * self.next_unit()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_and_name_give_same_stream() {
        let a = Rng::for_tensor(7, "x").uniform(16, -1.0, 1.0);
        let b = Rng::for_tensor(7, "x").uniform(16, -1.0, 1.0);
        let c = Rng::for_tensor(7, "y").uniform(16, -1.0, 1.0);
        let d = Rng::for_tensor(8, "x").uniform(16, -1.0, 1.0);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    #[test]
    fn uniform_stays_in_range_and_spreads() {
        let v = Rng::for_tensor(0, "r").uniform(10_000, -0.5, 0.5);
        assert!(v.iter().all(|x| (-0.5..0.5).contains(x)));
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.02, "mean {mean}");
    }
}
