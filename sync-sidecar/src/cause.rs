//! Why the remediator passes over every workload, carried with its trigger
//! from whatever saw the change (the policy loader; a replicator, which sees an
//! object's old and new state: [`crate::replication::classify`]) to the
//! remediator. The blast-radius guard
//! ([`crate::reconcile::blast`]) decides by cause:
//!
//! - a person's edit (the policy set, or replicated data the policies read:
//!   an object added or deleted, its spec, labels or annotations) is
//!   *guarded*: held when it would re-place too many workloads, until an
//!   administrator confirms that change;
//! - a change of cluster health (a cluster's phase, `Ready` condition, taints:
//!   [`crate::replication::health`]) or of other status (the world's report, not anyone's
//!   edit) is not, unless a large share of the clusters turned unhealthy
//!   together (a partition);
//! - a pass whose causes are unknown (a relist; a replica that takes over
//!   while the policy or the data differ from what the last leader applied:
//!   [`crate::replication::revision`]) is guarded.

use std::collections::{BTreeMap, BTreeSet};

use futures::FutureExt;
use tokio::sync::Notify;

/// One cause of remediation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The policy set changed (its modules or data ConfigMaps); the revision
    /// of the set now in force.
    Policy(String),
    /// An edit of replicated data the policies read: the object
    /// (`resource/key`) and the revision it changed to (`deleted` when gone).
    Data { object: String, revision: String },
    /// A cluster's health changed, and nothing an administrator configures.
    Health,
    /// Only status that is not health changed (or nothing the policy reads).
    Status,
    /// Whatever changed while nobody watched (a relist; the policy or the
    /// data changed since the last leader applied them): unknown, so guarded.
    Resync,
}

/// The causes of one pass (or of a held change, until it is applied).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Causes {
    /// The policy set changed.
    pub(crate) policy: bool,
    /// Edited objects and the revision each changed to.
    pub(crate) data: BTreeMap<String, String>,
    pub(crate) health: bool,
    pub(crate) status: bool,
    pub(crate) resync: bool,
    /// Clusters found to have turned unhealthy together (a partition).
    pub(crate) partition: BTreeSet<String>,
}

impl Causes {
    pub(crate) fn add(&mut self, cause: Cause) {
        match cause {
            Cause::Policy(_) => self.policy = true,
            Cause::Data { object, revision } => {
                self.data.insert(object, revision);
            }
            Cause::Health => self.health = true,
            Cause::Status => self.status = true,
            Cause::Resync => self.resync = true,
        }
    }

    pub(crate) fn merge(&mut self, other: Causes) {
        self.policy |= other.policy;
        self.data.extend(other.data);
        self.health |= other.health;
        self.status |= other.status;
        self.resync |= other.resync;
        self.partition.extend(other.partition);
    }

    pub(crate) fn is_empty(&self) -> bool {
        *self == Causes::default()
    }

    /// These causes without the edits and unknown causes: what a replica
    /// that takes over keeps of what it saw while another one led (that
    /// leader applied the edits, unless the revision it recorded says
    /// otherwise: [`crate::replication::revision`]).
    pub(crate) fn without_edits(&self) -> Causes {
        Causes {
            health: self.health,
            status: self.status,
            ..Causes::default()
        }
    }

    /// Whether the blast-radius guard weighs a pass of these causes: a
    /// person's edit, an unknown cause or a partition.
    pub(crate) fn guarded(&self) -> bool {
        self.policy || !self.data.is_empty() || self.resync || !self.partition.is_empty()
    }

    /// What changed, for the report and the log.
    pub(crate) fn describe(&self, policy_revision: &str) -> String {
        let mut parts = Vec::new();
        if self.policy {
            parts.push(format!("the policy set (revision {policy_revision})"));
        }
        if !self.data.is_empty() {
            let objects: Vec<String> = self
                .data
                .iter()
                .map(|(object, revision)| format!("{object}@{revision}"))
                .collect();
            parts.push(format!("replicated data: {}", objects.join(", ")));
        }
        if self.resync {
            parts.push(
                "unknown (a relist, or the policy or data changed since the last leader applied them)"
                    .to_owned(),
            );
        }
        if !self.partition.is_empty() {
            let clusters: Vec<&str> = self.partition.iter().map(String::as_str).collect();
            parts.push(format!(
                "a partition: {} turned unhealthy together",
                clusters.join(", ")
            ));
        }
        if parts.is_empty() {
            parts.push("cluster health or status".to_owned());
        }
        parts.join("; ")
    }
}

/// The remediation trigger: causes accumulated until the remediator takes
/// them.
#[derive(Debug, Default)]
pub(crate) struct Trigger {
    causes: parking_lot::Mutex<Causes>,
    notify: Notify,
    /// The revision of the policy set in force.
    policy_revision: parking_lot::Mutex<String>,
}

impl Trigger {
    pub(crate) fn fire(&self, cause: Cause) {
        let cause = match cause {
            Cause::Policy(revision) => {
                let mut current = self.policy_revision.lock();
                if *current == revision {
                    // The same set in force again (an engine filled again):
                    // a pass, but no edit.
                    Cause::Status
                } else {
                    current.clone_from(&revision);
                    Cause::Policy(revision)
                }
            }
            other => other,
        };
        self.causes.lock().add(cause);
        self.notify.notify_one();
    }

    /// Resolves when causes were fired since the last [`Trigger::take`].
    pub(crate) async fn fired(&self) {
        self.notify.notified().await;
    }

    /// The causes fired so far, consumed.
    pub(crate) fn take(&self) -> Causes {
        // The wake-up they left is consumed with them.
        let _ = self.notify.notified().now_or_never();
        std::mem::take(&mut *self.causes.lock())
    }

    pub(crate) fn policy_revision(&self) -> String {
        self.policy_revision.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_edits_unknown_causes_and_partitions_are_guarded() {
        let mut causes = Causes::default();
        causes.add(Cause::Health);
        causes.add(Cause::Status);
        assert!(!causes.guarded());
        let mut policy = causes.clone();
        policy.add(Cause::Policy("r1".into()));
        assert!(policy.guarded());
        let mut edited = causes.clone();
        edited.add(Cause::Data {
            object: "clusters/a".into(),
            revision: "abc".into(),
        });
        assert!(edited.guarded());
        let mut partition = causes.clone();
        partition.partition.insert("clusters/a".into());
        assert!(partition.guarded());
        let mut resync = causes;
        resync.add(Cause::Resync);
        assert!(resync.guarded());
    }

    #[test]
    fn the_same_policy_set_again_is_no_edit() {
        let trigger = Trigger::default();
        trigger.fire(Cause::Policy("r1".into()));
        assert!(trigger.take().policy);
        trigger.fire(Cause::Policy("r1".into()));
        let again = trigger.take();
        assert!(!again.guarded() && again.status, "{again:?}");
        let mut seen = Causes::default();
        seen.add(Cause::Policy("r2".into()));
        seen.add(Cause::Health);
        assert_eq!(
            seen.without_edits(),
            Causes {
                health: true,
                ..Causes::default()
            }
        );
    }

    #[tokio::test]
    async fn the_trigger_carries_its_causes_once() {
        let trigger = Trigger::default();
        trigger.fire(Cause::Health);
        trigger.fire(Cause::Policy("r7".into()));
        tokio::time::timeout(std::time::Duration::from_secs(1), trigger.fired())
            .await
            .expect("fired");
        trigger.fire(Cause::Status);
        let causes = trigger.take();
        assert!(causes.health && causes.policy && causes.status);
        assert_eq!(trigger.policy_revision(), "r7");
        assert!(trigger.take().is_empty());
        assert!(
            trigger.notify.notified().now_or_never().is_none(),
            "no wake-up left behind"
        );
    }
}
