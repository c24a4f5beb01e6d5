use super::*;
use std::sync::atomic::{AtomicU32, Ordering};
use tokio::sync::Barrier;

type Log = Arc<Mutex<Vec<String>>>;

fn permits(n: usize) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(n))
}

#[tokio::test]
async fn one_key_never_runs_twice_at_once_and_a_push_during_a_run_reruns_once() {
    let log: Log = Arc::default();
    let running = Arc::new(AtomicU32::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (l, r, g) = (log.clone(), running.clone(), gate.clone());
    let queue = KeyedQueue::new(
        "test",
        move |key: String| {
            let (l, r, g) = (l.clone(), r.clone(), g.clone());
            async move {
                assert_eq!(r.fetch_add(1, Ordering::SeqCst), 0, "overlapping runs");
                l.lock().push(format!("start {key}"));
                g.acquire().await.unwrap().forget();
                l.lock().push(format!("end {key}"));
                r.fetch_sub(1, Ordering::SeqCst);
                Ok::<(), String>(())
            }
        },
        permits(4),
        KEY_BACKOFF,
        CancellationToken::new(),
    );
    queue.push("a".to_owned());
    tokio::task::yield_now().await;
    while log.lock().is_empty() {
        tokio::task::yield_now().await;
    }
    // Three pushes while the first run is in flight coalesce into one more run.
    queue.push("a".to_owned());
    queue.push("a".to_owned());
    queue.push("a".to_owned());
    gate.add_permits(2);
    queue.wait_idle().await;
    assert_eq!(*log.lock(), ["start a", "end a", "start a", "end a"]);
}

#[tokio::test]
async fn different_keys_run_concurrently() {
    // Both handlers must be inside at once to pass the barrier.
    let barrier = Arc::new(Barrier::new(2));
    let b = barrier.clone();
    let queue = KeyedQueue::new(
        "test",
        move |_key: String| {
            let b = b.clone();
            async move {
                b.wait().await;
                Ok::<(), String>(())
            }
        },
        permits(2),
        KEY_BACKOFF,
        CancellationToken::new(),
    );
    queue.push("a".to_owned());
    queue.push("b".to_owned());
    tokio::time::timeout(Duration::from_secs(5), queue.wait_idle())
        .await
        .expect("keys ran concurrently");
}

#[tokio::test(start_paused = true)]
async fn failures_retry_with_backoff_without_blocking_other_keys() {
    let attempts = Arc::new(AtomicU32::new(0));
    let log: Log = Arc::default();
    let (a, l) = (attempts.clone(), log.clone());
    let queue = KeyedQueue::new(
        "test",
        move |key: String| {
            let (a, l) = (a.clone(), l.clone());
            async move {
                if key == "bad" && a.fetch_add(1, Ordering::SeqCst) < 3 {
                    return Err("engine unavailable".to_owned());
                }
                l.lock().push(key);
                Ok(())
            }
        },
        permits(1),
        Backoff {
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        },
        CancellationToken::new(),
    );
    let started = tokio::time::Instant::now();
    queue.push("bad".to_owned());
    queue.push("good".to_owned());
    tokio::time::sleep(Duration::from_millis(1)).await;
    // The good key ran while the bad one was backing off.
    assert_eq!(*log.lock(), ["good"]);
    queue.wait_idle().await;
    assert_eq!(*log.lock(), ["good", "bad"]);
    assert_eq!(attempts.load(Ordering::SeqCst), 4);
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn cancel_stops_retrying() {
    let cancel = CancellationToken::new();
    let queue = KeyedQueue::new(
        "test",
        |_key: String| async { Err::<(), _>("down") },
        permits(1),
        KEY_BACKOFF,
        cancel.clone(),
    );
    queue.push("k".to_owned());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(queue.len(), 1);
    cancel.cancel();
    queue.wait_idle().await;
    assert!(queue.is_empty());
}
