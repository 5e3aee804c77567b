//! The one source of randomness for every DP mechanism.
//!
//! [`DpRng`] is ChaCha20 keyed from the operating system's entropy source. A
//! seeded instance exists for tests and reproducible benchmarks only: it is
//! marked as such ([`DpRng::is_seeded`]) and release paths refuse it unless the
//! caller passed `--unsafe-seed` explicitly (see [`DpRng::require_secure`]).

use std::convert::Infallible;

use rand::rngs::ChaCha20Rng;
use rand::{SeedableRng, TryCryptoRng, TryRng};

/// A cryptographically secure RNG for noise, with an explicit "unsafe seed" mode.
pub struct DpRng {
    inner: ChaCha20Rng,
    seed: Option<u64>,
}

impl std::fmt::Debug for DpRng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the state of a CSPRNG.
        match self.seed {
            Some(s) => write!(f, "DpRng(UNSAFE seed {s})"),
            None => f.write_str("DpRng(os-seeded)"),
        }
    }
}

/// Returned when a seeded RNG is used where only a secure one is allowed.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to release with a seeded RNG (seed {0}): seeds are for tests and benchmarks; pass --unsafe-seed to accept a non-private release"
)]
pub struct SeededRngRefused(pub u64);

impl DpRng {
    /// ChaCha20 keyed with 256 bits from the operating system.
    pub fn from_os() -> Result<Self, getrandom_error::Error> {
        let mut key = [0u8; 32];
        rand::rngs::SysRng.try_fill_bytes(&mut key).map_err(|e| getrandom_error::Error(e.to_string()))?;
        Ok(Self { inner: ChaCha20Rng::from_seed(key), seed: None })
    }

    /// A deterministic RNG for tests and reproducible benchmarks. **Not private**:
    /// anyone who knows the seed can subtract the noise.
    pub fn unsafe_seeded(seed: u64) -> Self {
        Self { inner: ChaCha20Rng::seed_from_u64(seed), seed: Some(seed) }
    }

    /// Secure RNG unless `unsafe_seed` is given.
    pub fn new(unsafe_seed: Option<u64>) -> Result<Self, getrandom_error::Error> {
        match unsafe_seed {
            Some(s) => Ok(Self::unsafe_seeded(s)),
            None => Self::from_os(),
        }
    }

    /// Whether this RNG was seeded (and is therefore unsafe for real releases).
    pub fn is_seeded(&self) -> bool {
        self.seed.is_some()
    }

    /// The seed, if this RNG is the unsafe seeded kind.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }

    /// Errors unless the RNG is OS-seeded or the caller explicitly allowed a seed.
    pub fn require_secure(&self, allow_unsafe_seed: bool) -> Result<(), SeededRngRefused> {
        match self.seed {
            Some(s) if !allow_unsafe_seed => Err(SeededRngRefused(s)),
            _ => Ok(()),
        }
    }

    /// An independent child RNG (for a partition or a worker thread), derived
    /// from this one's output so a seeded parent gives reproducible children.
    pub fn fork(&mut self) -> Self {
        let mut key = [0u8; 32];
        self.inner.fill_bytes_infallible(&mut key);
        Self { inner: ChaCha20Rng::from_seed(key), seed: self.seed }
    }
}

trait FillInfallible {
    fn fill_bytes_infallible(&mut self, dst: &mut [u8]);
}

impl FillInfallible for ChaCha20Rng {
    fn fill_bytes_infallible(&mut self, dst: &mut [u8]) {
        match self.try_fill_bytes(dst) {
            Ok(()) => {}
        }
    }
}

impl TryRng for DpRng {
    type Error = Infallible;

    #[inline]
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        self.inner.try_next_u32()
    }

    #[inline]
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        self.inner.try_next_u64()
    }

    #[inline]
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.inner.try_fill_bytes(dst)
    }
}

impl TryCryptoRng for DpRng {}

/// Error type for OS entropy failures.
pub mod getrandom_error {
    /// The operating system could not provide entropy.
    #[derive(Debug, thiserror::Error)]
    #[error("the operating system's entropy source failed: {0}")]
    pub struct Error(pub String);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn seeded_is_reproducible_and_flagged() {
        let mut a = DpRng::unsafe_seeded(7);
        let mut b = DpRng::unsafe_seeded(7);
        assert_eq!(a.next_u64(), b.next_u64());
        assert!(a.is_seeded());
        assert!(a.require_secure(false).is_err());
        assert!(a.require_secure(true).is_ok());
    }

    #[test]
    fn os_rng_is_secure_and_differs() {
        let mut a = DpRng::from_os().unwrap();
        let mut b = DpRng::from_os().unwrap();
        assert!(!a.is_seeded());
        assert!(a.require_secure(false).is_ok());
        assert_ne!(a.next_u64(), b.next_u64());
    }

    #[test]
    fn fork_is_deterministic_for_seeded_parent() {
        let mut a = DpRng::unsafe_seeded(1);
        let mut b = DpRng::unsafe_seeded(1);
        assert_eq!(a.fork().next_u64(), b.fork().next_u64());
    }
}
