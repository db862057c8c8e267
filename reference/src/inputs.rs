//! Seeded inputs for checks and measurements: uniform values from the project's one generator.

/// Seeded inputs, uniform in [−1, 1) (the project's one generator, `datasets::SplitMix64`).
pub struct Rng(datasets::SplitMix64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(datasets::SplitMix64::new(seed))
    }

    /// The next value, uniform in [−1, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.0.uniform() * 2.0 - 1.0) as f32
    }

    /// `len` values, uniform in [−amplitude, amplitude).
    pub fn vec(&mut self, len: usize, amplitude: f32) -> Vec<f32> {
        (0..len).map(|_| self.next_f32() * amplitude).collect()
    }
}
