//! `--replicate-only-read-types`: which replicated types must be in the
//! engine, shared by the policy loader and the replicators.
//!
//! The loader decides: before it puts modules, it asks for every type they
//! (and the modules already in the engine) read, and waits until those types
//! are written for the engine's current epoch ([`Demand::require`]): a policy
//! never sees a type it reads missing (it would decide on nothing, and fail
//! open). Once the modules are in force, types no policy reads any more are
//! let go ([`Demand::settle`]), and their replicators delete them from the
//! engine. The replicators keep watching every type, so a type read again is
//! written from memory at once.

use std::collections::{BTreeMap, BTreeSet};

use parking_lot::Mutex;

use tokio::sync::watch;

use crate::engine_sync::SyncState;
use crate::error::SyncError;
use crate::policies::rego_refs::DataReads;

/// How long a policy change waits for its data before saying so.
const SLOW_WRITE: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) struct Demand {
    /// Types that must be in the engine: what the modules in force read, and
    /// what modules about to be put read.
    wanted: watch::Sender<DataReads>,
    /// Type → the engine epoch it was last written for.
    written: watch::Sender<BTreeMap<String, u64>>,
    /// Types whose replicator found them (the others have nothing to write).
    replicated: Mutex<BTreeSet<String>>,
}

impl Default for Demand {
    fn default() -> Self {
        Demand {
            // Nothing until the loader has read the policies.
            wanted: watch::Sender::new(DataReads::Types(BTreeSet::new())),
            written: watch::Sender::new(BTreeMap::new()),
            replicated: Mutex::default(),
        }
    }
}

impl Demand {
    pub(crate) fn wants(&self, resource: &str) -> bool {
        self.wanted.borrow().includes(resource)
    }

    /// Notified whenever what is wanted changes.
    pub(crate) fn subscribe(&self) -> watch::Receiver<DataReads> {
        self.wanted.subscribe()
    }

    /// A replicator found its type.
    pub(crate) fn register(&self, resource: &str) {
        self.replicated.lock().insert(resource.to_owned());
    }

    /// A replicator wrote its whole type for `epoch` (`None`: removed it).
    pub(crate) fn set_written(&self, resource: &str, epoch: Option<u64>) {
        self.written.send_modify(|written| match epoch {
            Some(epoch) => {
                written.insert(resource.to_owned(), epoch);
            }
            None => {
                written.remove(resource);
            }
        });
    }

    /// Ask for the types of `reads` too, and wait until every one that is
    /// replicated is in the engine for its current epoch. Fails when the
    /// engine restarts meanwhile (the caller retries, and reloads anyway).
    pub(crate) async fn require(
        &self,
        reads: &DataReads,
        state: &SyncState,
    ) -> Result<(), SyncError> {
        self.wanted.send_if_modified(|wanted| {
            let widened = union(wanted, reads);
            let changed = widened != *wanted;
            *wanted = widened;
            changed
        });
        let epoch = state.epoch();
        let mut epochs = state.subscribe_epoch();
        let mut written = self.written.subscribe();
        // Blocking is the safe side (the policy would decide on nothing),
        // but it must show.
        let mut warn_at = Some(tokio::time::Instant::now() + SLOW_WRITE);
        loop {
            let missing: Vec<String> = {
                let replicated = self.replicated.lock();
                let written = written.borrow_and_update();
                replicated
                    .iter()
                    .filter(|t| reads.includes(t) && written.get(*t).is_none_or(|e| *e < epoch))
                    .cloned()
                    .collect()
            };
            if missing.is_empty() {
                return Ok(());
            }
            tracing::debug!(
                ?missing,
                "waiting for replicated types the policies will read"
            );
            let warn = async {
                match warn_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = warn => {
                    warn_at = None;
                    tracing::warn!(?missing, "policies that read these replicated types wait for them to be written to the engine; see the replicators' errors");
                }
                r = written.changed() => if r.is_err() { return Ok(()) },
                r = epochs.changed() => if r.is_err() || state.epoch() != epoch {
                    return Err(SyncError::EngineRestarted);
                },
            }
        }
    }

    /// The modules in force read `reads`: nothing else is needed any more.
    pub(crate) fn settle(&self, reads: DataReads) {
        self.wanted.send_if_modified(|wanted| {
            let changed = *wanted != reads;
            *wanted = reads;
            changed
        });
    }
}

fn union(a: &DataReads, b: &DataReads) -> DataReads {
    match (a, b) {
        (DataReads::Types(a), DataReads::Types(b)) => {
            DataReads::Types(a.iter().chain(b).cloned().collect())
        }
        _ => DataReads::All,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use std::sync::Arc;

    fn types(names: &[&str]) -> DataReads {
        DataReads::Types(names.iter().map(|n| (*n).to_owned()).collect())
    }

    #[tokio::test]
    async fn a_required_type_is_waited_for_until_written_for_this_epoch() {
        let state = SyncState::new(Arc::new(Metrics::new()));
        state.register("replicate:clusters");
        state.begin_epoch_for_test();
        let demand = Arc::new(Demand::default());
        demand.register("clusters");
        demand.register("configmaps");
        assert!(
            !demand.wants("clusters"),
            "nothing before the policies are read"
        );
        demand.set_written("clusters", Some(0));
        let waiting = {
            let (demand, state) = (demand.clone(), state.clone());
            tokio::spawn(
                async move { demand.require(&types(&["clusters", "nodes"]), &state).await },
            )
        };
        tokio::task::yield_now().await;
        assert!(demand.wants("clusters") && demand.wants("nodes"));
        assert!(!demand.wants("configmaps"));
        assert!(!waiting.is_finished(), "written for an older epoch only");
        demand.set_written("clusters", Some(state.epoch()));
        // `nodes` has no replicator: nothing to wait for.
        waiting.await.unwrap().unwrap();

        demand.settle(types(&["configmaps"]));
        assert!(!demand.wants("clusters") && demand.wants("configmaps"));
        let restarted = {
            let (demand, state) = (demand.clone(), state.clone());
            tokio::spawn(async move { demand.require(&types(&["configmaps"]), &state).await })
        };
        tokio::task::yield_now().await;
        state.begin_epoch_for_test();
        assert!(matches!(
            restarted.await.unwrap(),
            Err(SyncError::EngineRestarted)
        ));
        demand.settle(DataReads::All);
        assert!(demand.wants("anything"));
    }
}
