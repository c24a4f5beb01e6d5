//! Decisions remembered by the embedded engine: the answer to a query is a
//! function of the modules, the data and the input paths the modules read
//! ([`InputReads`]), so a review that agrees with an earlier one at those
//! paths under the same policy generation gets the earlier answer.
//!
//! Bounded by bytes in two halves: new entries go to the recent half; when it
//! is full it becomes the older half (the previous older half is dropped), and
//! a hit in the older half moves the entry back. Every change of modules or
//! data starts a new generation, which empties it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::engine::{DecisionCacheStats, QueryOutcome};

/// Bookkeeping per entry beyond its key and answer (map slots, allocations).
const ENTRY_OVERHEAD: usize = 96;

#[derive(Debug)]
pub(crate) struct DecisionMemo {
    budget: usize,
    halves: Mutex<Halves>,
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Debug, Default)]
struct Halves {
    generation: u64,
    recent: HashMap<Box<[u8]>, Entry>,
    recent_bytes: usize,
    older: HashMap<Box<[u8]>, Entry>,
    older_bytes: usize,
}

#[derive(Debug)]
struct Entry {
    outcome: QueryOutcome,
    bytes: usize,
}

impl Halves {
    fn reset(&mut self, generation: u64) {
        *self = Halves {
            generation,
            ..Halves::default()
        };
    }

    fn insert(&mut self, key: Box<[u8]>, entry: Entry, half: usize) {
        if self.recent_bytes + entry.bytes > half {
            self.older = std::mem::take(&mut self.recent);
            self.older_bytes = std::mem::take(&mut self.recent_bytes);
        }
        self.recent_bytes += entry.bytes;
        if let Some(old) = self.recent.insert(key, entry) {
            self.recent_bytes -= old.bytes;
        }
    }
}

impl DecisionMemo {
    /// A cache holding at most about `budget` bytes (0: off).
    pub(crate) fn new(budget: usize) -> Self {
        DecisionMemo {
            budget,
            halves: Mutex::new(Halves::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// Forget everything before `generation` now.
    pub(crate) fn advance(&self, generation: u64) {
        let mut halves = self.halves.lock();
        if generation > halves.generation {
            halves.reset(generation);
        }
    }

    /// The answer remembered for `key` under `generation`.
    pub(crate) fn get(&self, generation: u64, key: &[u8]) -> Option<QueryOutcome> {
        let mut halves = self.halves.lock();
        if halves.generation != generation {
            if generation > halves.generation {
                halves.reset(generation);
            }
            drop(halves);
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if let Some(entry) = halves.recent.get(key) {
            let outcome = entry.outcome.clone();
            drop(halves);
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(outcome);
        }
        let found = halves.older.remove_entry(key);
        let outcome = found.map(|(key, entry)| {
            halves.older_bytes -= entry.bytes;
            let outcome = entry.outcome.clone();
            let half = self.budget / 2;
            halves.insert(key, entry, half);
            outcome
        });
        drop(halves);
        let counter = if outcome.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        outcome
    }

    /// Remember `outcome` for `key`, computed under `generation`.
    pub(crate) fn put(&self, generation: u64, key: &[u8], outcome: &QueryOutcome) {
        let answer_bytes = match outcome {
            QueryOutcome::Defined(value) => serde_json::to_vec(value).map_or(0, |v| v.len()),
            QueryOutcome::Undefined => 0,
        };
        let bytes = key.len() + answer_bytes + ENTRY_OVERHEAD;
        let half = self.budget / 2;
        if bytes > half {
            return;
        }
        let mut halves = self.halves.lock();
        if halves.generation != generation {
            if generation < halves.generation {
                // Computed under policies or data since replaced.
                return;
            }
            halves.reset(generation);
        }
        halves.insert(
            key.into(),
            Entry {
                outcome: outcome.clone(),
                bytes,
            },
            half,
        );
    }

    pub(crate) fn stats(&self, refused: Option<String>) -> DecisionCacheStats {
        let halves = self.halves.lock();
        DecisionCacheStats {
            refused,
            budget_bytes: self.budget as u64,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: (halves.recent.len() + halves.older.len()) as u64,
            bytes: (halves.recent_bytes + halves.older_bytes) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(n: u64) -> QueryOutcome {
        QueryOutcome::Defined(json!({ "annotations": { "n": n } }))
    }

    #[test]
    fn remembers_within_a_generation_only() {
        let memo = DecisionMemo::new(1 << 20);
        assert_eq!(memo.get(1, b"k"), None);
        memo.put(1, b"k", &answer(1));
        assert_eq!(memo.get(1, b"k"), Some(answer(1)));
        assert_eq!(memo.get(1, b"other"), None);
        // A new generation forgets everything, and an answer computed under
        // the old one is not kept.
        assert_eq!(memo.get(2, b"k"), None);
        memo.put(1, b"k", &answer(1));
        assert_eq!(memo.get(2, b"k"), None);
        let stats = memo.stats(None);
        assert_eq!((stats.hits, stats.misses, stats.entries), (1, 4, 0));
    }

    #[test]
    fn stays_within_its_budget_and_keeps_what_is_used() {
        let memo = DecisionMemo::new(64 * 1024);
        memo.put(1, b"hot", &answer(0));
        for n in 0..10_000u64 {
            memo.put(1, n.to_string().as_bytes(), &answer(n));
            // The hot entry is used all along, so it survives every turnover.
            assert_eq!(memo.get(1, b"hot"), Some(answer(0)), "lost at {n}");
        }
        let stats = memo.stats(None);
        assert!(stats.bytes <= 64 * 1024, "{stats:?}");
        assert!(stats.entries > 100, "{stats:?}");
        assert_eq!(memo.get(1, b"0"), None, "the oldest entries are gone");
        assert_eq!(memo.get(1, b"9999"), Some(answer(9999)));
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let memo = DecisionMemo::new(0);
        assert!(!memo.enabled());
        memo.put(1, b"k", &answer(1));
        assert_eq!(memo.get(1, b"k"), None);
    }
}
