//! The reconciler's write rate limit, shared by every kind of target.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// Spaces calls `1/rate` seconds apart (no limit when the rate is 0).
#[derive(Debug)]
pub(crate) struct RateLimiter {
    interval: Option<Duration>,
    next: Mutex<Instant>,
}

impl RateLimiter {
    pub(crate) fn new(per_second: f64) -> Self {
        RateLimiter {
            interval: (per_second > 0.0).then(|| Duration::from_secs_f64(1.0 / per_second)),
            next: Mutex::new(Instant::now()),
        }
    }

    pub(crate) async fn acquire(&self) {
        let Some(interval) = self.interval else {
            return;
        };
        let at = {
            let mut next = self.next.lock().await;
            let at = (*next).max(Instant::now());
            *next = at + interval;
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests;
