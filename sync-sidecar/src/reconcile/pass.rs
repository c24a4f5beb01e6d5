//! One pass of the reconciler: every target object in scope (or a few due
//! ones) is evaluated first, concurrently; a pass over everything is then
//! weighed as one change by the blast-radius guard before anything is
//! written (an outage's moves apart from an edit's); then each object let
//! through is acted on, and the pass's Events published.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::Resource;
use kube::api::{Api, DynamicObject};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Reconciler;
use super::bindings::BindingEvaluation;
use super::changes::ItemKey;
use super::placements::PlacementEvaluation;
use super::step::Step;
use super::target::{Item, Kind, Target, describe};
use super::workloads::{Assessment, assess, is_placed};
use super::writer::{Sent, Writer, is_gone};
use crate::cause::Causes;
use crate::config::writers::RemediationMode;
use crate::hex::hex;
use crate::reconcile::blast::{self, Hold};
use crate::replication::document::{ObjectKey, object_value};

/// Objects evaluated and written at once in a pass.
const PASS_CONCURRENCY: usize = 16;

/// Tally of one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PassReport {
    pub(crate) evaluated: usize,
    pub(crate) stale: usize,
    pub(crate) patched: usize,
    pub(crate) failed: usize,
    pub(crate) unplaceable: usize,
    pub(crate) undefined: usize,
    /// Placements this pass would have rewritten or removed, held back by the
    /// blast-radius guard until an administrator confirms (0: nothing held).
    pub(crate) held: usize,
    /// Aborted because leadership or the engine's sync was lost.
    pub(crate) aborted: bool,
    /// The objects that failed (query, write or unusable decision): the only
    /// ones a retry evaluates again.
    pub(crate) failed_objects: BTreeSet<ItemKey>,
    /// Objects to evaluate again at a time of their own (overdue ones).
    pub(crate) due: BTreeMap<ItemKey, Instant>,
}

/// One workload's evaluation, before anything is patched.
pub(crate) struct WorkloadEvaluation {
    i: usize,
    object: Arc<DynamicObject>,
    /// The object carries a placement the policy wrote (its ownership record).
    placed: bool,
    /// `None` when the query failed.
    assessment: Option<Assessment>,
}

/// One object's evaluation.
pub(crate) enum Evaluation {
    Workload(WorkloadEvaluation),
    Binding(BindingEvaluation),
    Placement(PlacementEvaluation),
}

impl Evaluation {
    /// Would this change rewrite or remove a placement the object has?
    pub(crate) fn replaces_a_placement(&self) -> bool {
        match self {
            // A new signature of the ownership record that changes no
            // annotation (after a key rotation) replaces nothing.
            Evaluation::Workload(e) => {
                e.placed
                    && matches!(&e.assessment, Some(Assessment::Stale { changed, .. }) if !changed.is_empty())
            }
            Evaluation::Binding(e) => e.replaces_a_placement(),
            Evaluation::Placement(e) => e.replaces_a_placement(),
        }
    }

    /// The object's name, for the report of a held change.
    pub(crate) fn describe(&self, reconciler: &Reconciler) -> String {
        match self {
            Evaluation::Workload(e) => describe(
                reconciler.targets[e.i].resource(),
                ObjectKey::of(&e.object).as_ref(),
            ),
            Evaluation::Binding(e) => {
                describe(reconciler.targets[e.i].resource(), Some(&e.item.key))
            }
            Evaluation::Placement(e) => {
                describe(reconciler.targets[e.i].resource(), Some(&e.item.key))
            }
        }
    }

    /// The clusters this write takes out of the placement the object has:
    /// for a workload, the names in the old values of the annotations it
    /// changes that its new values lack (names as a placement annotation
    /// writes them, e.g. the keys of `{"clusters": {"eu-1": {...}}}`); for a
    /// binding, the clusters of `spec.clusters` it drops.
    fn clusters_taken_out(&self) -> BTreeSet<String> {
        match self {
            Evaluation::Workload(e) => {
                let Some(Assessment::Stale { patch, changed }) = &e.assessment else {
                    return BTreeSet::new();
                };
                let before = serde_json::json!({"metadata": {"annotations": e.object.metadata.annotations.clone().unwrap_or_default()}});
                let mut after = before.clone();
                if json_patch::patch(&mut after, patch).is_err() {
                    return BTreeSet::new();
                }
                let names = |doc: &Value| -> BTreeSet<String> {
                    changed
                        .iter()
                        .filter_map(|key| doc["metadata"]["annotations"][key].as_str())
                        .flat_map(placement_names)
                        .collect()
                };
                names(&before).difference(&names(&after)).cloned().collect()
            }
            Evaluation::Binding(e) => {
                if let Some(members) = e.repaired_members() {
                    return members.clone();
                }
                let super::bindings::Verdict::Planned { write, .. } = &e.verdict else {
                    return BTreeSet::new();
                };
                let Some(clusters) = write
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.pointer("/spec/clusters"))
                    .and_then(Value::as_array)
                else {
                    return BTreeSet::new();
                };
                let kept: BTreeSet<&str> =
                    clusters.iter().filter_map(|c| c["name"].as_str()).collect();
                e.item
                    .binding
                    .clusters()
                    .iter()
                    .filter(|c| !kept.contains(c.name.as_str()))
                    .map(|c| c.name.clone())
                    .collect()
            }
            Evaluation::Placement(e) => e.clusters_taken_out(),
        }
    }

    /// The move this write makes: the object and a digest of what it writes.
    fn fingerprint(&self, reconciler: &Reconciler) -> String {
        let written = match self {
            Evaluation::Workload(e) => match &e.assessment {
                Some(Assessment::Stale { patch, .. }) => serde_json::to_vec(patch),
                _ => Ok(Vec::new()),
            },
            Evaluation::Binding(e) => match &e.verdict {
                super::bindings::Verdict::Planned { write, .. } => serde_json::to_vec(&write.spec),
                super::bindings::Verdict::Repair(members) => serde_json::to_vec(members),
                _ => Ok(Vec::new()),
            },
            Evaluation::Placement(e) => e.moved(),
        }
        .unwrap_or_default();
        let digest = ring::digest::digest(&ring::digest::SHA256, &written);
        format!("{}={}", self.describe(reconciler), hex(digest.as_ref(), 8))
    }

    fn key(&self) -> Option<ItemKey> {
        match self {
            Evaluation::Workload(e) => ObjectKey::of(&e.object).map(|k| (e.i, k)),
            Evaluation::Binding(e) => Some((e.i, e.item.key.clone())),
            Evaluation::Placement(e) => Some((e.i, e.item.key.clone())),
        }
    }
}

impl Reconciler {
    /// Evaluate every target object in scope (or, for a retry or a change,
    /// only those of `only`) and act on the stale ones.
    pub(super) async fn pass(
        &self,
        cancel: &CancellationToken,
        only: Option<&BTreeSet<ItemKey>>,
        causes: &mut Causes,
        revision: &str,
    ) -> PassReport {
        let mut report = PassReport::default();
        let mut items = self.workloads(only);
        items.extend(self.bindings(only));
        items.extend(self.placements(only));
        // The blast radius is weighed against every placed object in scope
        // (a pass over everything only).
        let placed_in_scope = items.iter().filter(|item| self.is_placed(item)).count();
        self.writer.forget_caught_up(&self.targets);
        // First every object is evaluated (concurrently), then the pass's
        // writes are weighed as one change before any is sent.
        let evaluations: Vec<Option<Evaluation>> = futures::stream::iter(items)
            .map(|item| self.evaluate(item, cancel))
            .buffer_unordered(PASS_CONCURRENCY)
            .collect()
            .await;
        let Some(evaluations) = evaluations.into_iter().collect::<Option<Vec<_>>>() else {
            report.aborted = true;
            return report;
        };
        // The guard weighs a policy or data change (a pass over everything);
        // a few created, edited or failed objects are no such change, and
        // the webhook applies the policy in force to them anyway.
        let mut evaluations = evaluations;
        if only.is_none() && self.guards() {
            let total = evaluations.len();
            if let Some(held) = self
                .held(&mut evaluations, placed_in_scope, causes, revision)
                .await
            {
                report.held = held;
                if evaluations.is_empty() {
                    report.evaluated = total;
                    return report;
                }
            }
        }
        // Write round trips (which also pass through the admission webhook)
        // dominate a pass: concurrent, the rate limiter still spacing them.
        let steps = futures::stream::iter(evaluations)
            .map(|evaluation| async move {
                let key = evaluation.key();
                let step = match evaluation {
                    Evaluation::Workload(e) => self.act_workload(e, cancel).await,
                    Evaluation::Binding(e) => self.act_binding(e, cancel).await,
                    Evaluation::Placement(e) => self.act_placement(e, cancel).await,
                };
                (key, step)
            })
            .buffer_unordered(PASS_CONCURRENCY);
        let mut steps = std::pin::pin!(steps);
        while let Some((key, step)) = steps.next().await {
            if let (Step::Overdue(at), Some(key)) = (&step, &key) {
                report.due.insert(key.clone(), *at);
            }
            if matches!(step, Step::Failed | Step::Stale { failed: true, .. })
                && let Some(key) = key
            {
                report.failed_objects.insert(key);
            }
            match step {
                Step::Aborted => {
                    report.aborted = true;
                    break;
                }
                Step::InFlight => {}
                Step::Failed => {
                    report.evaluated += 1;
                    report.failed += 1;
                }
                Step::Placed => report.evaluated += 1,
                Step::Undefined => {
                    report.evaluated += 1;
                    report.undefined += 1;
                }
                Step::Unplaceable => {
                    report.evaluated += 1;
                    report.unplaceable += 1;
                }
                Step::Stale { patched, failed } => {
                    report.evaluated += 1;
                    report.stale += 1;
                    report.patched += usize::from(patched);
                    report.failed += usize::from(failed);
                }
                Step::Overdue(_) => {
                    report.evaluated += 1;
                    report.stale += 1;
                }
            }
        }
        self.writer.publish(cancel).await;
        // A retry saw a few objects: the gauges keep the last full pass's view.
        if !report.aborted && only.is_none() {
            let unresolved = match self.ctx.mode {
                RemediationMode::Auto => report.stale.saturating_sub(report.patched),
                _ => report.stale,
            };
            self.ctx.metrics.remediation_stale.set(unresolved as i64);
            self.ctx
                .metrics
                .remediation_unplaceable
                .set(report.unplaceable as i64);
        }
        report
    }

    /// Whether passes over everything are weighed by the guard: they write
    /// (remediation in `auto` mode, the scheduler, or the OCM decider).
    pub(super) fn guards(&self) -> bool {
        self.ctx.mode == RemediationMode::Auto
            || self
                .targets
                .iter()
                .any(|t| matches!(t.kind, Kind::Bindings | Kind::Placements))
    }

    fn is_placed(&self, item: &Item) -> bool {
        match item {
            Item::Workload(_, object) => is_placed(object),
            Item::Binding(_, item) => !item.binding.clusters().is_empty(),
            Item::Placement(_, item) => item.is_placed(),
        }
    }

    /// The blast-radius guard: which of this pass's writes, as one change of
    /// `causes` (under policy revision `revision`), must be held (reported,
    /// not applied) until an administrator confirms them. `None`: nothing;
    /// else how many placements are held, and `evaluations` keeps only what
    /// goes through (an outage's moves, beside a held edit).
    async fn held(
        &self,
        evaluations: &mut Vec<Evaluation>,
        placed: usize,
        causes: &mut Causes,
        revision: &str,
    ) -> Option<usize> {
        let unhealthy = self.ctx.guard.health.unhealthy();
        // Each write: whether it moves a placement, and whether an outage
        // does (it takes an unhealthy cluster out of the placement).
        let moves: Vec<(bool, bool)> = evaluations
            .iter()
            .map(|e| {
                let moves = e.replaces_a_placement();
                (
                    moves,
                    moves && !e.clusters_taken_out().is_disjoint(&unhealthy),
                )
            })
            .collect();
        let outages = moves.iter().filter(|(_, outage)| *outage).count();
        let edits = moves
            .iter()
            .filter(|(moves, outage)| *moves && !outage)
            .count();
        let configmaps = &self.ctx.policy_configmaps;
        let guard = &self.ctx.guard;
        let hold = guard.weigh(causes, outages, edits, placed, Instant::now());
        let held = |(moves, outage): (bool, bool)| match hold {
            Hold::Nothing => false,
            Hold::Edits => moves && !outage,
            Hold::Everything => moves,
        };
        let affected: Vec<&Evaluation> = evaluations
            .iter()
            .zip(&moves)
            .filter(|(_, m)| held(**m))
            .map(|(e, _)| e)
            .collect();
        if affected.is_empty() {
            self.ctx.metrics.remediation_held.set(0);
            configmaps.clear().await;
            guard.release();
            return None;
        }
        let id = guard.occurrence(affected.iter().map(|e| e.fingerprint(self)).collect());
        let cause = causes.describe(revision);
        if configmaps.take_confirmation(&id).await {
            tracing::warn!(%id, %cause, affected = affected.len(), placed, "applying a confirmed change beyond the blast radius");
            self.ctx.metrics.remediation_held.set(0);
            configmaps.clear().await;
            guard.release();
            return None;
        }
        tracing::warn!(%id, %cause, affected = affected.len(), placed, outage_moves_applied = outages, "remediation held: beyond the blast radius; confirm it on a policy ConfigMap");
        self.ctx.metrics.remediation_held.set(affected.len() as i64);
        let held_count = affected.len();
        let objects: Vec<String> = affected.iter().map(|e| e.describe(self)).collect();
        // What each listed object would lose: the clusters taken off it.
        let off: Vec<BTreeSet<String>> = affected
            .iter()
            .take(blast::LISTED)
            .map(|e| e.clusters_taken_out())
            .collect();
        configmaps
            .report(&blast::report(
                &id,
                &cause,
                &objects,
                &off,
                placed,
                &configmaps.namespace(),
            ))
            .await;
        // What goes through: the outage's moves (beside a held edit).
        let mut through = moves
            .iter()
            .map(|&(_, outage)| outage && hold == Hold::Edits);
        evaluations.retain(|_| through.next().unwrap_or(false));
        Some(held_count)
    }

    /// The workloads in scope, decoded from the watch caches: every one, or
    /// only those of `only` (a few created, edited or failed workloads must
    /// not cost decoding every workload). None when remediation is off.
    pub(super) fn workloads(&self, only: Option<&BTreeSet<ItemKey>>) -> Vec<Item> {
        self.cached_items(
            only,
            |t| t.kind == Kind::Workloads { act: true },
            |key| self.scope.admits(key.namespace.as_deref()),
            |i, _, json| {
                let value: Value = serde_json::from_slice(json).ok()?;
                if !super::workloads::selected(self.targets[i].selector.as_ref(), &value) {
                    return None;
                }
                Some(Item::Workload(
                    i,
                    Arc::new(serde_json::from_value(value).ok()?),
                ))
            },
        )
    }

    /// The cached objects of the targets `takes` picks, `admitted` by key:
    /// every one, or only those of `only`; each as `decode` makes it an item
    /// (`None`: left out).
    pub(super) fn cached_items(
        &self,
        only: Option<&BTreeSet<ItemKey>>,
        takes: impl Fn(&Target) -> bool,
        admitted: impl Fn(&ObjectKey) -> bool,
        decode: impl Fn(usize, ObjectKey, &[u8]) -> Option<Item>,
    ) -> Vec<Item> {
        let takes = |i: usize| self.targets.get(i).is_some_and(&takes);
        let decode = &decode;
        match only {
            None => self
                .targets
                .iter()
                .enumerate()
                .filter(|(i, _)| takes(*i))
                .flat_map(|(i, t)| {
                    t.watched
                        .objects
                        .snapshot(&admitted)
                        .into_iter()
                        .filter_map(move |(key, json)| decode(i, key, &json))
                })
                .collect(),
            Some(keys) => keys
                .iter()
                .filter(|(i, key)| takes(*i) && admitted(key))
                .filter_map(|(i, key)| {
                    let json = self.targets[*i].watched.objects.get(key)?;
                    decode(*i, key.clone(), &json)
                })
                .collect(),
        }
    }

    /// Ask the decision for one object and compare; `None` when the pass must
    /// stop (leadership or the engine's sync lost, or stopping).
    async fn evaluate(&self, item: Item, cancel: &CancellationToken) -> Option<Evaluation> {
        if cancel.is_cancelled() || !self.writer.may_act() {
            return None;
        }
        let evaluation = match item {
            Item::Workload(i, object) => {
                Evaluation::Workload(self.evaluate_workload(i, object).await)
            }
            Item::Binding(i, item) => Evaluation::Binding(self.evaluate_binding(i, item).await),
            Item::Placement(i, item) => {
                Evaluation::Placement(self.evaluate_placement(i, item).await)
            }
        };
        if cancel.is_cancelled() || !self.writer.may_act() {
            return None;
        }
        Some(evaluation)
    }

    async fn evaluate_workload(&self, i: usize, object: Arc<DynamicObject>) -> WorkloadEvaluation {
        let resource = self.targets[i].resource();
        let value = object_value(&object, resource);
        let input = self.update_input(&value, resource);
        let deadline = Instant::now() + self.ctx.query_timeout;
        self.ctx.metrics.remediation_queries.inc();
        let assessment = match self
            .ctx
            .engine
            .query(&self.ctx.decision, &input, deadline)
            .await
        {
            Ok(outcome) => Some(assess(&value, &outcome, &self.keys.current())),
            Err(e) => {
                tracing::warn!(object = %describe(resource, ObjectKey::of(&object).as_ref()), error = %e, "placement query failed");
                None
            }
        };
        WorkloadEvaluation {
            i,
            placed: is_placed(&object),
            object,
            assessment,
        }
    }

    /// Act on one workload's evaluation: patch, report or note it.
    async fn act_workload(
        &self,
        evaluation: WorkloadEvaluation,
        cancel: &CancellationToken,
    ) -> Step {
        let WorkloadEvaluation {
            i,
            object,
            assessment,
            ..
        } = evaluation;
        let resource = self.targets[i].resource();
        let name = describe(resource, ObjectKey::of(&object).as_ref());
        let Some(assessment) = assessment else {
            return Step::Failed;
        };
        match assessment {
            Assessment::Placed => Step::Placed,
            Assessment::Undefined => Step::Undefined,
            Assessment::Invalid(reason) => {
                tracing::warn!(object = %name, %reason, "cannot remediate");
                Step::Failed
            }
            Assessment::Unplaceable(errors) => {
                let note = format!(
                    "the placement policy reports errors for this object, so it keeps its current placement until the policy gives a valid one; fix: {}",
                    errors.join("; ")
                );
                self.workload_event(i, &object, false, "PlacementRejected", note);
                Step::Unplaceable
            }
            Assessment::Stale { patch, changed } => match self.ctx.mode {
                RemediationMode::Report => {
                    let note = format!(
                        "{} {name}: placement is stale; policy-owned annotations differ from the current decision: {}",
                        resource.kind,
                        changed.join(", ")
                    );
                    self.workload_event(i, &object, false, "PlacementStale", note);
                    Step::LEFT_STALE
                }
                RemediationMode::Auto => {
                    self.patch_workload(i, &object, &patch, &changed, cancel)
                        .await
                }
                RemediationMode::Off => Step::LEFT_STALE,
            },
        }
    }

    /// PATCH one workload's placement annotations (`changed`) through the
    /// write step.
    async fn patch_workload(
        &self,
        i: usize,
        object: &DynamicObject,
        patch: &json_patch::Patch,
        changed: &[String],
        cancel: &CancellationToken,
    ) -> Step {
        let target = &self.targets[i];
        let name = describe(target.resource(), ObjectKey::of(object).as_ref());
        let api = match &object.metadata.namespace {
            Some(ns) => {
                Api::namespaced_with(target.api.clone().into_client(), ns, target.resource())
            }
            None => target.api.clone(),
        };
        let key = ObjectKey::of(object).map(|k| (i, k));
        let rv = object.metadata.resource_version.as_deref();
        let object_name = object.metadata.name.clone().unwrap_or_default();
        let write = Writer::json_patch(&api, &object_name, patch, rv);
        match self.writer.send(key.as_ref(), rv, cancel, write).await {
            Sent::Skipped(step) => step,
            Sent::Done(_) => {
                self.ctx.metrics.patch(true);
                if let Some(key) = key {
                    self.writer.mark_in_flight(key, rv.map(str::to_owned));
                }
                tracing::info!(object = %name, "remediated placement");
                let note = format!("updated placement annotations: {}", changed.join(", "));
                self.workload_event(i, object, true, "PlacementRemediated", note);
                Step::written(false)
            }
            // Gone: nothing to remediate.
            Sent::Failed(e) if is_gone(&e) => Step::LEFT_STALE,
            Sent::Failed(e) => {
                self.ctx.metrics.patch(false);
                tracing::warn!(object = %name, error = %e, "remediation patch failed; will retry");
                Step::WRITE_FAILED
            }
        }
    }

    fn workload_event(
        &self,
        i: usize,
        object: &DynamicObject,
        normal: bool,
        reason: &str,
        note: String,
    ) {
        let reference = object.object_ref(self.targets[i].resource());
        self.writer
            .event(reference, normal, reason, "Remediate", note);
    }
}

/// The names a placement annotation's value holds: runs of the characters
/// of a cluster name (letters, digits, `.`, `-`, `_`), whatever the format
/// around them (JSON keys or strings, a list).
fn placement_names(value: &str) -> impl Iterator<Item = String> + '_ {
    value
        .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_of_a_placement_are_read_whatever_its_format() {
        let names: Vec<String> =
            placement_names(r#"{"clusters":{"eu-1":{"weight":1},"gce-europe_west.2":{}}}"#)
                .collect();
        assert_eq!(
            names,
            ["clusters", "eu-1", "weight", "1", "gce-europe_west.2"]
        );
        assert_eq!(placement_names("eu-1, eu-2").count(), 2);
    }
}
