//! Retrying transient engine failures inside a deadline.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use backon::{BackoffBuilder, ExponentialBuilder, Retryable};
use tokio::time::Instant;

use crate::engine::EngineError;

/// Backoff between attempts: jittered exponential from `min_delay` to
/// `max_delay`, without a limit on the attempts. The one backoff of both
/// components: engine calls here, and every retry loop of the sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub min_delay: Duration,
    pub max_delay: Duration,
}

/// Between the attempts of one engine call, inside its deadline.
pub const ENGINE_CALL_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_secs(2));

impl Backoff {
    pub const fn new(min_delay: Duration, max_delay: Duration) -> Self {
        Backoff {
            min_delay,
            max_delay,
        }
    }

    /// As a `backon` builder, for `Retryable::retry`.
    pub fn builder(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_jitter()
            .without_max_times()
    }

    /// An endless iterator of jittered, exponentially growing delays.
    pub fn delays(&self) -> impl Iterator<Item = Duration> + Send + use<> {
        let max = self.max_delay;
        self.builder().build().chain(std::iter::repeat(max))
    }
}

/// The delay a `Retry-After` header asks for: delay-seconds or an HTTP-date
/// (RFC 9110 10.2.3); a date in the past means "now".
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Run `attempt` until it succeeds, fails permanently, or the next try would not
/// fit before `deadline`. Transient failures back off with jitter; a server's
/// `Retry-After` replaces the computed delay. Each attempt is itself cut off at the
/// deadline. Giving up on a transient failure yields
/// [`EngineError::DeadlineExceeded`] carrying the attempt count and last error.
pub async fn retry_until<T, F, Fut>(
    backoff: Backoff,
    deadline: Instant,
    endpoint: &str,
    mut attempt: F,
) -> Result<T, EngineError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, EngineError>>,
{
    let started = Instant::now();
    let attempts = AtomicU32::new(0);
    let run = || {
        attempts.fetch_add(1, Ordering::Relaxed);
        let fut = attempt();
        async move {
            match tokio::time::timeout_at(deadline, fut).await {
                Ok(result) => result,
                Err(_) => Err(EngineError::Timeout {
                    endpoint: endpoint.to_owned(),
                    timeout: deadline.saturating_duration_since(started),
                }),
            }
        }
    };
    let result = run
        .retry(backoff.builder())
        .sleep(tokio::time::sleep)
        .when(|e: &EngineError| e.is_transient())
        .adjust(|e: &EngineError, computed: Option<Duration>| {
            let next = e.retry_after().or(computed)?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            // Only sleep when there is time left for the sleep and an attempt.
            (next < remaining).then_some(next)
        })
        .notify(|e: &EngineError, delay: Duration| {
            tracing::debug!(error = %e, ?delay, "retrying policy engine call");
        })
        .await;
    match result {
        Err(e) if e.is_transient() => Err(EngineError::DeadlineExceeded {
            attempts: attempts.load(Ordering::Relaxed),
            deadline: deadline.saturating_duration_since(started),
            last: Box::new(e),
        }),
        other => other,
    }
}

#[cfg(test)]
mod tests;
