use super::*;

#[tokio::test(start_paused = true)]
async fn rate_limiter_spaces_calls() {
    let limiter = RateLimiter::new(10.0);
    let start = Instant::now();
    for _ in 0..5 {
        limiter.acquire().await;
    }
    assert!(start.elapsed() >= Duration::from_millis(400));
    assert!(start.elapsed() < Duration::from_millis(500));
    let unlimited = RateLimiter::new(0.0);
    let start = Instant::now();
    for _ in 0..100 {
        unlimited.acquire().await;
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
}
