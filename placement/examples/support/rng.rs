//! The deterministic random numbers of the placement examples: a seed gives the same day
//! everywhere.

/// SplitMix64: a small deterministic generator, so a seed gives the same day everywhere.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next 64 random bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    pub(crate) fn unit(&mut self) -> f64 {
        #[allow(clippy::cast_precision_loss)] // 53 bits are exact in an f64
        let x = (self.next() >> 11) as f64;
        (x + 1.0) / 9_007_199_254_740_992.0
    }

    /// Exponentially distributed with mean `mean`.
    pub(crate) fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
    }
}
