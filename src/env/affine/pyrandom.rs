//! CPython's `random.Random` as far as SAT's formula needs it: MT19937
//! seeded from an int by `init_by_array`, `getrandbits(k <= 32)`,
//! `_randbelow` (rejection on `k = n.bit_length()` bits), `choice`, and
//! `sample` by the pool algorithm (populations at most `setsize`). The
//! draws are CPython's bit for bit (`Random(0).getrandbits(32) ==
//! 3626764237`).

const N: usize = 624;
const M: usize = 397;

/// CPython's `random.Random(seed)` for a non-negative int seed.
pub struct PyRandom {
    mt: [u32; N],
    index: usize,
}

impl PyRandom {
    /// `Random(seed)`: `init_by_array` over the 32-bit little-endian words
    /// of the seed (`[0]` for 0).
    pub fn new(seed: u64) -> Self {
        let mut key = vec![seed as u32];
        if seed >> 32 != 0 {
            key.push((seed >> 32) as u32);
        }
        let mut r = Self::init_genrand(19_650_218);
        let mt = &mut r.mt;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        r
    }

    fn init_genrand(s: u32) -> Self {
        let mut mt = [0u32; N];
        mt[0] = s;
        for i in 1..N {
            mt[i] = 1_812_433_253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        Self { mt, index: N }
    }

    /// The next 32-bit output of MT19937.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            for k in 0..N {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % N] & 0x7fff_ffff);
                let mag = if y & 1 == 1 { 0x9908_b0df } else { 0 };
                self.mt[k] = self.mt[(k + M) % N] ^ (y >> 1) ^ mag;
            }
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `getrandbits(k)` for `1 <= k <= 32`.
    pub fn getrandbits(&mut self, k: u32) -> u32 {
        assert!(
            (1..=32).contains(&k),
            "getrandbits({k}) is out of this port's range"
        );
        self.next_u32() >> (32 - k)
    }

    /// `_randbelow(n)` for `1 <= n < 2^32`.
    pub fn randbelow(&mut self, n: u32) -> u32 {
        assert!(n > 0, "randbelow(0)");
        let k = 32 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }

    /// `choice(seq)`.
    pub fn choice<T: Copy>(&mut self, seq: &[T]) -> T {
        seq[self.randbelow(seq.len() as u32) as usize]
    }

    /// `sample(population, k)` where the population fits CPython's pool
    /// branch (`len <= 21 + 4 ** ceil(log(3k, 4))` for k > 5, else 21).
    pub fn sample<T: Copy>(&mut self, population: &[T], k: usize) -> Vec<T> {
        let n = population.len();
        assert!(k <= n, "sample larger than population");
        let mut setsize = 21usize;
        if k > 5 {
            setsize += 4usize.pow(((k * 3) as f64).log(4.0).ceil() as u32);
        }
        assert!(
            n <= setsize,
            "this port has only CPython's pool branch of sample"
        );
        let mut pool = population.to_vec();
        (0..k)
            .map(|i| {
                let j = self.randbelow((n - i) as u32) as usize;
                let x = pool[j];
                pool[j] = pool[n - i - 1];
                x
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_cpython() {
        // python3 -c "import random; print(random.Random(0).getrandbits(32))"
        assert_eq!(PyRandom::new(0).getrandbits(32), 3_626_764_237);
        // [random.Random(42).getrandbits(32) for _ in range(3)]
        let mut r = PyRandom::new(42);
        let got: Vec<u32> = (0..3).map(|_| r.getrandbits(32)).collect();
        assert_eq!(got, [2_746_317_213, 478_163_327, 107_420_369]);
        // random.Random(2**40 + 5).getrandbits(32): a two-word key
        assert_eq!(PyRandom::new((1 << 40) + 5).getrandbits(32), 2_166_296_868);
        // r = random.Random(7); [r.randrange(10) for _ in range(5)], r.sample(range(15), 10)
        let mut r = PyRandom::new(7);
        let got: Vec<u32> = (0..5).map(|_| r.randbelow(10)).collect();
        assert_eq!(got, [5, 2, 6, 0, 1]);
        let pop: Vec<u32> = (0..15).collect();
        assert_eq!(r.sample(&pop, 10), [13, 8, 1, 5, 9, 0, 14, 3, 10, 6]);
    }
}
