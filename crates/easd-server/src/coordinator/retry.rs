//! Capped exponential backoff with full jitter, as a plain value type (tested with the jitter fixed).

use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
    /// Attempts in all, the first included.
    pub max_attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { base: Duration::from_millis(100), cap: Duration::from_secs(2), max_attempts: 6 }
    }
}

impl Backoff {
    /// Delay before retry number `retry` (1 = the first retry), scaled by `jitter` in [0, 1):
    /// uniformly spread in [0, min(cap, base * 2^(retry-1))] ("full jitter"), so retrying clients do not stampede.
    pub fn delay(&self, retry: u32, jitter: f64) -> Duration {
        let exp = self.base.saturating_mul(1u32 << retry.saturating_sub(1).min(20));
        exp.min(self.cap).mul_f64(jitter.clamp(0.0, 1.0))
    }

    /// Whether another attempt may follow attempt number `attempt` (1-based).
    pub fn allows_retry_after(&self, attempt: u32) -> bool {
        attempt < self.max_attempts
    }

    /// Sleeps before retry `retry` with a random jitter.
    pub async fn wait(&self, retry: u32) {
        tokio::time::sleep(self.delay(retry, rand::random::<f64>())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_until_the_cap() {
        let b = Backoff { base: Duration::from_millis(100), cap: Duration::from_millis(500), max_attempts: 5 };
        let full: Vec<u128> = (1..=5).map(|r| b.delay(r, 1.0).as_millis()).collect();
        assert_eq!(full, vec![100, 200, 400, 500, 500]);
    }

    #[test]
    fn jitter_scales_the_delay_down_to_zero() {
        let b = Backoff::default();
        assert_eq!(b.delay(3, 0.0), Duration::ZERO);
        assert_eq!(b.delay(3, 0.5), Duration::from_millis(200));
    }

    #[test]
    fn the_attempt_budget_is_respected() {
        let b = Backoff { max_attempts: 3, ..Backoff::default() };
        assert!(b.allows_retry_after(1));
        assert!(b.allows_retry_after(2));
        assert!(!b.allows_retry_after(3));
    }
}
