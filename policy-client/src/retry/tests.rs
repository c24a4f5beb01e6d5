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
