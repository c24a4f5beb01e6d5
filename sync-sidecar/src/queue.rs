//! A per-key work queue, as Kubernetes controllers' work queues are: work for
//! one key runs one at a time and in order, different keys run concurrently, and a failure is retried with
//! jittered exponential backoff for that key alone, without holding up the others.
//!
//! Work is level-triggered: a key is pushed when its object changed, and the
//! handler reads the object's *current* state (from a reflector store) when it
//! runs. Pushes that arrive while the key waits to run coalesce into one run; a
//! push that arrives while the handler runs schedules exactly one more run after
//! it. So the last state of every object is always written, never an older state
//! after a newer one, and nothing is dropped: a failing key retries until it
//! succeeds or the queue is shut down.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use policy_client::retry::Backoff;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Backoff between retries of one key.
pub(crate) const KEY_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(30));

struct Slot {
    /// Pushed again since the current run started.
    dirty: bool,
}

struct Inner<K, H> {
    name: String,
    slots: Mutex<HashMap<K, Slot>>,
    permits: Arc<Semaphore>,
    handler: H,
    backoff: Backoff,
    cancel: CancellationToken,
    idle: tokio::sync::Notify,
}

/// See the module documentation.
pub(crate) struct KeyedQueue<K, H> {
    inner: Arc<Inner<K, H>>,
}

impl<K, H> Clone for KeyedQueue<K, H> {
    fn clone(&self) -> Self {
        KeyedQueue {
            inner: self.inner.clone(),
        }
    }
}

impl<K, H> fmt::Debug for KeyedQueue<K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedQueue")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

impl<K, H, Fut, E> KeyedQueue<K, H>
where
    K: Clone + Eq + Hash + fmt::Display + Send + Sync + 'static,
    H: Fn(K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    /// A queue whose handlers share `permits` (the number of runs in flight across
    /// every queue built with the same semaphore). Workers stop at `cancel`.
    pub(crate) fn new(
        name: impl Into<String>,
        handler: H,
        permits: Arc<Semaphore>,
        backoff: Backoff,
        cancel: CancellationToken,
    ) -> Self {
        KeyedQueue {
            inner: Arc::new(Inner {
                name: name.into(),
                slots: Mutex::new(HashMap::new()),
                permits,
                handler,
                backoff,
                cancel,
                idle: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Schedule `key`. Must be called from within a Tokio runtime.
    pub(crate) fn push(&self, key: K) {
        let mut slots = self.inner.slots.lock();
        if let Some(slot) = slots.get_mut(&key) {
            slot.dirty = true;
            return;
        }
        slots.insert(key.clone(), Slot { dirty: false });
        drop(slots);
        let inner = self.inner.clone();
        tokio::spawn(async move { inner.work(key).await });
    }

    /// Keys waiting, running or backing off.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.slots.lock().len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wait until no key is waiting, running or backing off.
    #[cfg(test)]
    pub(crate) async fn wait_idle(&self) {
        loop {
            let notified = self.inner.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_empty() {
                return;
            }
            notified.await;
        }
    }
}

impl<K, H, Fut, E> Inner<K, H>
where
    K: Clone + Eq + Hash + fmt::Display + Send + Sync + 'static,
    H: Fn(K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    async fn work(self: Arc<Self>, key: K) {
        let mut delays = self.backoff.delays();
        let mut failures = 0u32;
        loop {
            self.set_dirty(&key, false);
            let result = {
                let permit = tokio::select! {
                    p = self.permits.acquire() => p,
                    _ = self.cancel.cancelled() => break,
                };
                let Ok(_permit) = permit else { break };
                tokio::select! {
                    r = (self.handler)(key.clone()) => r,
                    _ = self.cancel.cancelled() => break,
                }
            };
            match result {
                Ok(()) => {
                    if failures > 0 {
                        tracing::info!(queue = %self.name, %key, failures, "succeeded after retries");
                    }
                    failures = 0;
                    delays = self.backoff.delays();
                    let mut slots = self.slots.lock();
                    if slots.get(&key).is_some_and(|s| s.dirty) {
                        continue;
                    }
                    slots.remove(&key);
                    let empty = slots.is_empty();
                    drop(slots);
                    if empty {
                        self.idle.notify_waiters();
                    }
                    return;
                }
                Err(e) => {
                    failures += 1;
                    let delay = delays.next().unwrap_or(self.backoff.max_delay);
                    tracing::warn!(queue = %self.name, %key, error = %e, attempt = failures, ?delay, "failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = self.cancel.cancelled() => break,
                    }
                }
            }
        }
        // Shut down: forget the key.
        let mut slots = self.slots.lock();
        slots.remove(&key);
        let empty = slots.is_empty();
        drop(slots);
        if empty {
            self.idle.notify_waiters();
        }
    }

    fn set_dirty(&self, key: &K, dirty: bool) {
        if let Some(slot) = self.slots.lock().get_mut(key) {
            slot.dirty = dirty;
        }
    }
}

#[cfg(test)]
mod tests;
