//! Letting a repeated warning through at most once per interval, so a flood
//! (of refused connections, failed accepts, dropped Events) is visible in the
//! log without becoming the flood itself.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    pub fn new(every: Duration) -> Self {
        Throttle {
            every,
            state: Mutex::new(State {
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// `Some(n)` when this occurrence may be logged, `n` being how many were
    /// held back since the last one logged.
    pub fn admit(&self) -> Option<u64> {
        let mut state = self.state.lock();
        let now = Instant::now();
        if state.last.is_some_and(|last| now < last + self.every) {
            state.suppressed += 1;
            return None;
        }
        state.last = Some(now);
        Some(std::mem::take(&mut state.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_once_per_interval_and_counts_the_rest() {
        let throttle = Throttle::new(Duration::from_secs(3600));
        assert_eq!(throttle.admit(), Some(0));
        assert_eq!(throttle.admit(), None);
        assert_eq!(throttle.admit(), None);
        let throttle = Throttle::new(Duration::ZERO);
        assert_eq!(throttle.admit(), Some(0));
        assert_eq!(throttle.admit(), Some(0));
    }
}
