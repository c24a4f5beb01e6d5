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
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn unavailable(retry_after: Option<Duration>) -> EngineError {
        EngineError::Http {
            endpoint: "test".into(),
            status: 503,
            message: "busy".into(),
            retry_after,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_transient_until_success() {
        let calls = AtomicU32::new(0);
        let deadline = Instant::now() + Duration::from_secs(5);
        let out = retry_until(ENGINE_CALL_BACKOFF, deadline, "test", || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(unavailable(None))
            } else {
                Ok(7)
            }
        })
        .await
        .unwrap();
        assert_eq!(out, 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_are_not_retried() {
        let calls = AtomicU32::new(0);
        let deadline = Instant::now() + Duration::from_secs(5);
        let err = retry_until::<(), _, _>(ENGINE_CALL_BACKOFF, deadline, "test", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(EngineError::Unauthorized { status: 401 })
        })
        .await
        .unwrap_err();
        assert!(matches!(err, EngineError::Unauthorized { .. }));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_at_the_deadline_with_attempt_count() {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(2);
        let err = retry_until::<(), _, _>(ENGINE_CALL_BACKOFF, deadline, "test", || async {
            Err(unavailable(None))
        })
        .await
        .unwrap_err();
        assert!(Instant::now() <= deadline);
        match err {
            EngineError::DeadlineExceeded { attempts, last, .. } => {
                assert!(attempts > 2, "attempts {attempts}");
                assert!(matches!(*last, EngineError::Http { status: 503, .. }));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn honours_retry_after() {
        let calls = AtomicU32::new(0);
        let start = Instant::now();
        let deadline = start + Duration::from_secs(10);
        retry_until(ENGINE_CALL_BACKOFF, deadline, "test", || async {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(unavailable(Some(Duration::from_secs(3))))
            } else {
                Ok(())
            }
        })
        .await
        .unwrap();
        assert!(Instant::now() - start >= Duration::from_secs(3));
    }

    #[test]
    fn retry_after_takes_seconds_and_http_dates() {
        let now = httpdate::parse_http_date("Sun, 22 Nov 2026 10:00:00 GMT").unwrap();
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Sun, 22 Nov 2026 10:00:03 GMT", now),
            Some(Duration::from_secs(3))
        );
        // The obsolete forms HTTP still requires recipients to accept.
        assert_eq!(
            parse_retry_after("Sunday, 22-Nov-26 10:00:02 GMT", now),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            parse_retry_after("Sun, 22 Nov 2026 09:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_beyond_deadline_gives_up_at_once() {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(1);
        let err = retry_until::<(), _, _>(ENGINE_CALL_BACKOFF, deadline, "test", || async {
            Err(unavailable(Some(Duration::from_secs(30))))
        })
        .await
        .unwrap_err();
        assert!(matches!(
            err,
            EngineError::DeadlineExceeded { attempts: 1, .. }
        ));
        assert_eq!(Instant::now(), start);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_attempt_is_cut_at_the_deadline() {
        let start = Instant::now();
        let deadline = start + Duration::from_millis(500);
        let err = retry_until::<(), _, _>(ENGINE_CALL_BACKOFF, deadline, "test", || async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(())
        })
        .await
        .unwrap_err();
        assert!(
            matches!(err, EngineError::DeadlineExceeded { .. }),
            "{err:?}"
        );
        assert!(Instant::now() - start <= Duration::from_millis(600));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let b = Backoff {
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(100),
        };
        let delays: Vec<Duration> = b.delays().take(50).collect();
        assert_eq!(delays.len(), 50);
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(200)));
        assert!(delays[40] >= Duration::from_millis(100));
    }
}
