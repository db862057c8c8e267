//! SplitMix64: a tiny seeded generator whose stream never changes with a dependency upgrade.

/// Steele, Lea and Flood's SplitMix64 (2014): 64 bits of state, a Weyl sequence and a mixer.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The generator's increment, 2^64 / φ: also what spreads stream numbers apart in [`Self::stream`].
    pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    /// The stream that starts at `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The `index`-th of a family of streams drawn from one seed (episodes, rows, ...).
    pub fn stream(seed: u64, index: u64) -> Self {
        Self(seed ^ index.wrapping_mul(Self::GAMMA))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(Self::GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by rejection so that there is no modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

impl SplitMix64 {
    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform_in(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Standard normal (Box–Muller; one draw per call, the partner discarded for simplicity).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}
