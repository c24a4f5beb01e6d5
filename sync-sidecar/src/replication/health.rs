//! Cluster health, in one place keyed by the cluster type: which replicated
//! types are cluster registries, when one of their objects is healthy (takes
//! workloads), and which of its fields say so. Adding a kind of cluster is one
//! entry of [`CLUSTER_KINDS`].
//!
//! The remediator re-places workloads without confirmation when cluster health
//! changes ([`crate::cause`]), unless a large share of the clusters turned
//! unhealthy within a short window ([`ClusterHealth::partition`]): that looks
//! like the control plane cut off from its clusters rather than an outage
//! (kube-controller-manager's `--unhealthy-zone-threshold`, below).

use std::collections::{BTreeMap, BTreeSet};

use parking_lot::Mutex;

use serde_json::Value;
use tokio::time::Instant;

use crate::config::guard::PartitionRule;
use crate::replication::document::ObjectKey;

/// A replicated type that is a cluster registry.
#[derive(Debug)]
pub(crate) struct ClusterKind {
    /// API group and plural resource name.
    pub(crate) group: &'static str,
    pub(crate) resource: &'static str,
    /// Whether a cluster object of this kind takes workloads.
    pub(crate) healthy: fn(&Value) -> bool,
    /// JSON pointers of fields outside `status` that are health (a
    /// controller's taints), not an administrator's configuration.
    pub(crate) health_fields: &'static [&'static str],
}

/// Every kind of cluster the sidecar knows.
pub(crate) const CLUSTER_KINDS: &[ClusterKind] = &[
    // The chart's CRD: `status.phase` (`running`, or pending, offline,
    // terminated), as the shipped policy reads it.
    ClusterKind {
        group: "placement-policy.io",
        resource: "clusters",
        healthy: phase_running,
        health_fields: &[],
    },
    // Karmada's member clusters: the `Ready` condition, and the taints its
    // cluster controllers put on a cluster that is not ready or unreachable.
    ClusterKind {
        group: "cluster.karmada.io",
        resource: "clusters",
        healthy: karmada_ready,
        health_fields: &["/spec/taints"],
    },
];

/// The cluster kind of a replicated type, if it is one.
pub(crate) fn cluster_kind(group: &str, resource: &str) -> Option<&'static ClusterKind> {
    CLUSTER_KINDS
        .iter()
        .find(|kind| kind.group == group && kind.resource == resource)
}

fn phase_running(cluster: &Value) -> bool {
    cluster.pointer("/status/phase").and_then(Value::as_str) == Some("running")
}

/// `Ready=True` and no taint that keeps workloads off (`NoSchedule`,
/// `NoExecute`).
fn karmada_ready(cluster: &Value) -> bool {
    let ready = cluster
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    let tainted = cluster
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|t| matches!(t["effect"].as_str(), Some("NoSchedule" | "NoExecute")));
    ready && !tainted
}

#[derive(Debug, Clone, Copy)]
struct Health {
    healthy: bool,
    /// When it last turned (un)healthy; `None` when it was first seen so.
    since: Option<Instant>,
}

/// The health of every replicated cluster, kept by the replicators.
#[derive(Debug, Default)]
pub(crate) struct ClusterHealth {
    clusters: Mutex<BTreeMap<(String, ObjectKey), Health>>,
}

impl ClusterHealth {
    /// A cluster of type `resource` as watched now (one first seen did not
    /// turn (un)healthy: it is as it was).
    pub(crate) fn observe(&self, resource: &str, key: ObjectKey, healthy: bool, now: Instant) {
        let mut clusters = self.clusters.lock();
        let entry = clusters
            .entry((resource.to_owned(), key))
            .or_insert(Health {
                healthy,
                since: None,
            });
        if entry.healthy != healthy {
            *entry = Health {
                healthy,
                since: Some(now),
            };
        }
    }

    pub(crate) fn forget(&self, resource: &str, key: &ObjectKey) {
        self.clusters
            .lock()
            .remove(&(resource.to_owned(), key.clone()));
    }

    /// Keep only the clusters of type `resource` that `keep` accepts (a
    /// relist: the others are gone).
    pub(crate) fn retain(&self, resource: &str, keep: impl Fn(&ObjectKey) -> bool) {
        self.clusters
            .lock()
            .retain(|(r, key), _| r != resource || keep(key));
    }

    /// The names of the clusters unhealthy now.
    pub(crate) fn unhealthy(&self) -> BTreeSet<String> {
        self.clusters
            .lock()
            .iter()
            .filter(|(_, h)| !h.healthy)
            .map(|((_, key), _)| key.name.clone())
            .collect()
    }

    /// The clusters that turned unhealthy within the rule's window (and still
    /// are), when they look like a partition under `rule`.
    pub(crate) fn partition(&self, rule: &PartitionRule, now: Instant) -> Option<Vec<String>> {
        let clusters = self.clusters.lock();
        let recent: Vec<String> = clusters
            .iter()
            .filter(|(_, h)| {
                !h.healthy
                    && h.since
                        .is_some_and(|t| now.saturating_duration_since(t) <= rule.window)
            })
            .map(|((resource, key), _)| format!("{resource}/{key}"))
            .collect();
        rule.applies(recent.len(), clusters.len()).then_some(recent)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use serde_json::json;

    #[test]
    fn health_is_read_per_cluster_kind() {
        let ours = cluster_kind("placement-policy.io", "clusters").unwrap();
        assert!((ours.healthy)(&json!({"status": {"phase": "running"}})));
        assert!(!(ours.healthy)(&json!({"status": {"phase": "offline"}})));
        assert!(!(ours.healthy)(&json!({})));
        let karmada = cluster_kind("cluster.karmada.io", "clusters").unwrap();
        let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert!((karmada.healthy)(&ready));
        let mut tainted = ready.clone();
        tainted["spec"] =
            json!({"taints": [{"key": "cluster.karmada.io/not-ready", "effect": "NoSchedule"}]});
        assert!(!(karmada.healthy)(&tainted));
        tainted["spec"]["taints"][0]["effect"] = json!("PreferNoSchedule");
        assert!((karmada.healthy)(&tainted), "a soft taint keeps it healthy");
        assert!(!(karmada.healthy)(
            &json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
        ));
        assert!(cluster_kind("apps", "replicasets").is_none());
    }

    #[test]
    fn a_large_share_turning_unhealthy_within_the_window_is_a_partition() {
        let rule = PartitionRule {
            threshold: 0.55,
            window: Duration::from_secs(60),
        };
        assert!(
            !rule.applies(2, 2),
            "more than two, as kube-controller-manager"
        );
        assert!(!rule.applies(3, 6));
        assert!(rule.applies(3, 5));
        let health = ClusterHealth::default();
        let start = Instant::now();
        let key = |n: &str| ObjectKey::new(None, n);
        for n in ["a", "b", "c", "d"] {
            health.observe("clusters", key(n), true, start);
        }
        // One cluster went down long ago, two recently: no partition.
        health.observe("clusters", key("a"), false, start);
        let later = start + Duration::from_secs(120);
        health.observe("clusters", key("b"), false, later);
        health.observe("clusters", key("c"), false, later);
        assert_eq!(health.partition(&rule, later), None);
        // A third within the window: 3 of 4.
        health.observe("clusters", key("d"), false, later + Duration::from_secs(1));
        assert_eq!(
            health.partition(&rule, later + Duration::from_secs(2)),
            Some(vec![
                "clusters/b".to_owned(),
                "clusters/c".to_owned(),
                "clusters/d".to_owned()
            ])
        );
        // Once the window has passed they are outages, not a partition.
        assert_eq!(
            health.partition(&rule, later + Duration::from_secs(62)),
            None
        );
        // A cluster first seen unhealthy did not turn so.
        health.observe("clusters", key("e"), false, later);
        health.forget("clusters", &key("d"));
        assert_eq!(
            health.partition(&rule, later + Duration::from_secs(2)),
            None
        );
    }
}
