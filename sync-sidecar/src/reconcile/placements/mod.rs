//! Open Cluster Management Placements as a target of the reconciler: a
//! Placement that opts out of OCM's scheduler and names ours is decided by
//! the policy over the clusters it selects, with the answers for the
//! workloads its ManifestWorkReplicaSets deliver and for the Placement itself
//! (each the webhook's answer for that object, plus `input._placement`), and
//! gets exactly the PlacementDecisions and status OCM's scheduler writes
//! ([`crate::reconcile::ocm`]).
//!
//! Its watches are in [`watch`], the per-pass view of the hub it decides
//! from in [`hub`].

mod evaluation;
mod hub;
mod watch;

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, Patch};
use policy_client::delivery::manifest_input;
use policy_client::input::PLACEMENT_INPUT_KEY;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(crate) use self::evaluation::PlacementEvaluation;
use self::evaluation::{Planned, Verdict};
use self::hub::delivered;
pub(crate) use self::watch::{
    OcmState, OcmSubscriptions, OcmWatches, placement_fingerprint, start,
};
use self::watch::{decision_fingerprint, replica_set_refs};
use crate::error::SyncError;
use crate::kube_writes::{apply_params, patch_params, post_params};
use crate::reconcile::changes::ItemKey;
use crate::reconcile::common::Common;
use crate::reconcile::events::reference;
use crate::reconcile::ocm::clusters::{Candidates, Inventory, candidates};
use crate::reconcile::ocm::decisions::{Outcome, PlacementWrite, choose, decided, plan};
use crate::reconcile::ocm::item::{PlacementItem, Workload};
use crate::reconcile::ocm::placement::Placement;
use crate::reconcile::ocm::policy::{Allowed, Subject, combine, read};
use crate::reconcile::ocm::sig::{self, SliceWrite};
use crate::reconcile::per_target::TargetReconciler;
use crate::reconcile::step::Step;
use crate::reconcile::target::Kind;
use crate::reconcile::writer::{Sent, now_rfc3339, tolerate};
use crate::replication::document::ObjectKey;

/// The OCM Placements' reconciler (the decider).
pub(crate) struct Placements {
    /// What the decider reads besides its Placements.
    pub(crate) ocm: OcmState,
}

impl TargetReconciler for Placements {
    type Item = Arc<PlacementItem>;
    type Evaluation = PlacementEvaluation;

    /// The Placements of `only` (or every one of ours), with what deciding
    /// them reads.
    fn items(&self, c: &Common, only: Option<&BTreeSet<ItemKey>>) -> Vec<(usize, Self::Item)> {
        let ocm = &self.ocm;
        let namespaces: Option<BTreeSet<String>> = only.map(|keys| {
            keys.iter()
                .filter(|(i, _)| {
                    c.targets
                        .get(*i)
                        .is_some_and(|t| t.kind == Kind::Placements)
                })
                .filter_map(|(_, key)| key.namespace.clone())
                .collect()
        });
        if namespaces.as_ref().is_some_and(BTreeSet::is_empty) {
            return Vec::new();
        }
        let hub = ocm.hub(namespaces.as_ref());
        let empty = Arc::new(Inventory::default());
        c.cached_items(
            only,
            |t| t.kind == Kind::Placements,
            |_| true,
            |i, key, json| {
                let placement = Placement::parse(json).ok()?;
                if placement.skip(&c.ctx.karmada.scheduler_name).is_some() {
                    return None;
                }
                let raw: Value = serde_json::from_slice(json).ok()?;
                let inventory = hub
                    .inventories
                    .get(&placement.metadata.namespace)
                    .cloned()
                    .unwrap_or_else(|| empty.clone());
                let item = PlacementItem {
                    existing: hub.decisions.get(&key).cloned().unwrap_or_default(),
                    workloads: hub.workloads.get(&key).cloned().unwrap_or_default(),
                    sig: hub.sig.get(&key).cloned().unwrap_or_default(),
                    inventory,
                    key,
                    raw,
                    placement,
                };
                Some((i, Arc::new(item)))
            },
        )
    }

    fn is_placed(&self, item: &Self::Item) -> bool {
        item.is_placed()
    }

    /// Ask the decision for each subject of a Placement and plan its writes.
    async fn evaluate(&self, c: &Common, i: usize, item: Self::Item) -> PlacementEvaluation {
        let verdict = self.placement_verdict(c, i, &item).await;
        PlacementEvaluation { i, item, verdict }
    }

    /// Act on one Placement's evaluation: write its decisions and status.
    async fn act(
        &self,
        c: &Common,
        evaluation: PlacementEvaluation,
        cancel: &CancellationToken,
    ) -> Step {
        let PlacementEvaluation { i, item, verdict } = evaluation;
        let Planned {
            write,
            sig,
            failed,
            recheck,
        } = match verdict {
            Verdict::Failed => return Step::Failed,
            Verdict::Nothing => return Step::Undefined,
            Verdict::Planned(planned) => *planned,
        };
        let key = (i, item.key.clone());
        if let Some(at) = recheck {
            self.recheck(c, key.clone(), at);
        }
        if write.is_empty() && sig.is_empty() {
            return Step::unwritten(failed);
        }
        let name = item.placement.describe();
        let sent = c.writer.send(
            Some(&key),
            item.placement.metadata.resource_version.as_deref(),
            cancel,
            self.write_placement(c, i, &item, &write, &sig),
        );
        match sent.await {
            Sent::Skipped(step) => step,
            Sent::Done(()) => {
                c.ctx
                    .metrics
                    .placement_decision(if failed { "failed" } else { "decided" });
                tracing::info!(placement = %name, clusters = ?write.clusters, interim = write.interim, "decided placement");
                for (normal, reason, note) in &write.events {
                    c.writer.event(
                        reference(&item.raw),
                        *normal,
                        reason,
                        "Decide",
                        note.clone(),
                    );
                }
                Step::written(failed)
            }
            Sent::Failed(e) => Step::write_failed(&e, || {
                c.ctx.metrics.placement_decision("error");
                tracing::warn!(placement = %name, error = %e, "writing the Placement's decisions failed; will retry");
            }),
        }
    }
}

impl Placements {
    async fn placement_verdict(&self, c: &Common, i: usize, item: &PlacementItem) -> Verdict {
        let placement = &item.placement;
        let now = Timestamp::now();
        let current = decided(&item.existing);
        let found = candidates(placement, &item.inventory, &current, now);
        let recheck = found.as_ref().ok().and_then(|(_, at)| *at);
        let found = found.map(|(c, _)| c);
        // The policy is asked only when there are clusters to decide.
        let allowed = match &found {
            Ok(Candidates::Clusters(_)) => match self.allowed(c, i, item, &current).await {
                Some(allowed) => allowed,
                None => return Verdict::Failed,
            },
            _ => Allowed::clusters(None),
        };
        if allowed == Allowed::Undefined {
            return Verdict::Nothing;
        }
        let outcome = choose(placement, found, &allowed, &current);
        let failed = matches!(outcome, Outcome::Denied(_) | Outcome::Misconfigured(_));
        let write = plan(
            placement,
            &outcome,
            &item.existing,
            &item.inventory.clusters,
            &now_rfc3339(),
        );
        let sig = match &write.decided {
            Some(decided) if self.ocm.sig.is_some() => {
                sig::plan(placement, decided, &c.ctx.karmada.scheduler_name, &item.sig)
            }
            _ => SliceWrite::default(),
        };
        Verdict::Planned(Box::new(Planned {
            write,
            sig,
            failed,
            recheck,
        }))
    }

    /// The workloads the ManifestWorkReplicaSets of `placement` deliver, read
    /// from the API server, not the watch: OCM delivers to a Placement's first
    /// decisions at once, so they must not precede a ManifestWorkReplicaSet
    /// created before or with the Placement whose watch event is still on the
    /// way. `None` when the read failed.
    async fn workloads_read(&self, c: &Common, placement: &ObjectKey) -> Option<Vec<Workload>> {
        let ocm = &self.ocm;
        let namespace = placement.namespace.as_deref()?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(c.ctx.client.clone(), namespace, &ocm.replica_sets.resource);
        let list = match api.list(&Default::default()).await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(placement = %placement, error = %e, "reading the ManifestWorkReplicaSets failed");
                return None;
            }
        };
        let mut workloads = Vec::new();
        for replica_set in list.items {
            let (Some(name), Ok(object)) = (
                replica_set.metadata.name.as_deref(),
                serde_json::to_value(&replica_set),
            ) else {
                continue;
            };
            let key = ObjectKey::new(Some(namespace), name);
            if replica_set_refs(&key, &object).0.contains(placement) {
                workloads.extend(delivered(&object));
            }
        }
        Some(workloads)
    }

    /// The policy's answers for the Placement's workloads and the Placement
    /// itself, read together; `None` when a query failed. Before its first
    /// decision (`current` empty) the workloads are read from the API server.
    async fn allowed(
        &self,
        c: &Common,
        i: usize,
        item: &PlacementItem,
        current: &BTreeSet<String>,
    ) -> Option<Allowed> {
        let read_now;
        let workloads = if current.is_empty() {
            read_now = self.workloads_read(c, &item.key).await?;
            &read_now
        } else {
            &item.workloads
        };
        let view = Placement::policy_view(&item.raw);
        let with_placement = |mut input: Value| {
            if let Value::Object(map) = &mut input {
                map.insert(PLACEMENT_INPUT_KEY.to_owned(), view.clone());
            }
            input
        };
        let keys = c.keys.current();
        // Each workload as the delivery guard asks about it: the manifest
        // as the template (one question wherever a manifest is delivered).
        let mut inputs: Vec<(Subject, &Value, Value)> = workloads
            .iter()
            .map(|w| {
                let input = manifest_input(&w.manifest, &keys);
                (w.subject.clone(), &w.manifest, with_placement(input))
            })
            .collect();
        let own = c.update_input(&item.raw, c.targets[i].resource());
        inputs.push((
            Subject::placement(format!("Placement {}", item.placement.describe())),
            &item.raw,
            with_placement(own),
        ));
        let mut answers = Vec::with_capacity(inputs.len());
        for (subject, object, input) in inputs {
            let deadline = Instant::now() + c.ctx.query_timeout;
            c.ctx.metrics.remediation_queries.inc();
            match c.ctx.engine.query(&c.ctx.decision, &input, deadline).await {
                Ok(outcome) => answers.push((subject, read(object, &outcome, &keys))),
                Err(e) => {
                    tracing::warn!(placement = %item.placement.describe(), subject = %subject.name, error = %e, "placement query failed");
                    return None;
                }
            }
        }
        Some(combine(&answers))
    }

    /// Decide `key` again at `at` (a toleration runs out then), once.
    fn recheck(&self, c: &Common, key: ItemKey, at: Timestamp) {
        let ocm = &self.ocm;
        {
            let mut rechecks = ocm.rechecks.lock();
            if rechecks.get(&key).is_some_and(|t| *t <= at) {
                return;
            }
            rechecks.insert(key.clone(), at);
        }
        let wait = at
            .duration_since(Timestamp::now())
            .try_into()
            .unwrap_or(std::time::Duration::ZERO)
            + std::time::Duration::from_secs(1);
        let changes = c.changes.clone();
        let cancel = ocm.cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(wait) => changes.due(key),
                _ = cancel.cancelled() => {}
            }
        });
    }

    /// The writes: PlacementDecisions that add clusters first (created, then
    /// their status), then those that remove, labels, deletions; then the
    /// Placement's status (from the resourceVersion it was planned from) and
    /// the SIG-Multicluster decisions.
    async fn write_placement(
        &self,
        c: &Common,
        i: usize,
        item: &PlacementItem,
        write: &PlacementWrite,
        sig: &SliceWrite,
    ) -> Result<(), SyncError> {
        let namespace = item.placement.metadata.namespace.as_str();
        let client = c.targets[i].api.clone().into_client();
        let decisions: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &self.ocm.decisions.resource);
        self.write_decisions(&decisions, item, write).await?;
        if let Some(status) = &write.placement_status {
            let placements: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, c.targets[i].resource());
            let mut patch = status.clone();
            let planned_from = item.placement.metadata.resource_version.clone();
            patch["metadata"] = json!({"resourceVersion": planned_from});
            placements
                .patch_status(
                    &item.placement.metadata.name,
                    &patch_params(),
                    &Patch::Merge(&patch),
                )
                .await?;
            c.writer.mark_in_flight((i, item.key.clone()), planned_from);
        }
        if !sig.is_empty()
            && let Some(store) = &self.ocm.sig
        {
            let slices: Api<DynamicObject> =
                Api::namespaced_with(client, namespace, &store.resource);
            for (name, object) in &sig.apply {
                slices
                    .patch(name, &apply_params(), &Patch::Apply(object))
                    .await?;
            }
            for name in &sig.delete {
                tolerate(404, slices.delete(name, &DeleteParams::default()).await)?;
            }
        }
        Ok(())
    }

    /// The PlacementDecisions of `write`: created, then their status, then
    /// labels, then deletions; each write's result noted beforehand as
    /// ours, so its watch event makes nothing due.
    async fn write_decisions(
        &self,
        decisions: &Api<DynamicObject>,
        item: &PlacementItem,
        write: &PlacementWrite,
    ) -> Result<(), SyncError> {
        let namespace = item.placement.metadata.namespace.as_str();
        let expect = |name: &str, print: u64| {
            // An interim step is followed by the watch of its result.
            if !write.interim {
                self.ocm
                    .written
                    .lock()
                    .entry(ObjectKey::new(Some(namespace), name))
                    .or_default()
                    .extend(std::iter::once(print));
            }
        };
        for object in &write.create {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            expect(
                name,
                decision_fingerprint(&object["metadata"]["labels"], &Value::Null),
            );
            let object: DynamicObject = serde_json::from_value(object.clone())?;
            tolerate(409, decisions.create(&post_params(), &object).await)?;
        }
        for (name, patch) in &write.status {
            let labels = labels_of(item, write, name);
            expect(
                name,
                decision_fingerprint(&labels, &patch["status"]["decisions"]),
            );
            decisions
                .patch_status(name, &patch_params(), &Patch::Merge(patch))
                .await?;
        }
        for (name, patch) in &write.labels {
            decisions
                .patch(name, &patch_params(), &Patch::Merge(patch))
                .await?;
        }
        for name in &write.delete {
            tolerate(404, decisions.delete(name, &DeleteParams::default()).await)?;
        }
        Ok(())
    }
}

/// The labels PlacementDecision `name` has once `write` is done.
fn labels_of(item: &PlacementItem, write: &PlacementWrite, name: &str) -> Value {
    write
        .create
        .iter()
        .find(|c| c["metadata"]["name"] == name)
        .map(|c| c["metadata"]["labels"].clone())
        .or_else(|| {
            item.existing
                .iter()
                .find(|e| e.name == name)
                .map(|e| json!(e.labels))
        })
        .unwrap_or(Value::Null)
}
