//! One pass of the reconciler, the driver every kind of target shares:
//! every target object in scope (or a few due ones) is evaluated,
//! concurrently. A pass over everything that the blast-radius guard may hold
//! (an edit among its causes, or a partition) is weighed as one change
//! before anything is written (an outage's moves apart from an edit's), then
//! each object let through is acted on; any other pass writes each move as
//! soon as it is evaluated. Then the pass's Events are published.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::DynamicObject;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::bindings::{BindingEvaluation, BindingItem, Bindings};
use super::changes::ItemKey;
use super::common::Common;
use super::per_target::{TargetReconciler, Weighed};
use super::placements::{PlacementEvaluation, Placements};
use super::step::Step;
use super::target::{Kind, describe};
use super::workloads::{WorkloadEvaluation, Workloads};
use crate::cause::Causes;
use crate::config::writers::RemediationMode;
use crate::hex::hex;
use crate::reconcile::blast::{self, Hold};
use crate::reconcile::karmada::binding::Mode;
use crate::reconcile::ocm::item::PlacementItem;

/// Objects evaluated at once in a pass, and objects written at once (a pass
/// that writes as it evaluates does both together).
const PASS_CONCURRENCY: usize = 16;

/// Moves written at once while a pass still evaluates (a failover's): each
/// waits on a round trip through an API server that its other clients keep
/// busy; the rate limit still spaces them.
const MOVE_CONCURRENCY: usize = 64;

/// Writes of one object in a pass when each meets a newer version of it
/// (another writer's): evaluated again on that version at once, not after
/// the pass (a failover's pass is thousands of writes long, and Karmada's
/// taint manager writes the same bindings meanwhile).
const CONFLICT_ATTEMPTS: usize = 3;

/// How long such a retry waits for the watch to show the newer version.
const CATCH_UP: Duration = Duration::from_secs(5);

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

impl PassReport {
    /// Count what happened to `key`; `false` when the pass must stop.
    fn tally(&mut self, key: Option<ItemKey>, step: Step) -> bool {
        if let (Step::Overdue(at), Some(key)) = (&step, &key) {
            self.due.insert(key.clone(), *at);
        }
        if matches!(
            step,
            Step::Failed | Step::Stale { failed: true, .. } | Step::Conflicted
        ) && let Some(key) = key
        {
            self.failed_objects.insert(key);
        }
        if !matches!(step, Step::Aborted | Step::InFlight) {
            self.evaluated += 1;
        }
        match step {
            Step::Aborted => {
                self.aborted = true;
                return false;
            }
            Step::InFlight | Step::Placed => {}
            Step::Failed => self.failed += 1,
            Step::Undefined => self.undefined += 1,
            Step::Unplaceable => self.unplaceable += 1,
            Step::Stale { patched, failed } => {
                self.stale += 1;
                self.patched += usize::from(patched);
                self.failed += usize::from(failed);
            }
            Step::Overdue(_) => self.stale += 1,
            Step::Conflicted => {
                self.stale += 1;
                self.failed += 1;
            }
        }
        true
    }
}

/// The reconcilers of every kind of target, over what they share.
pub(crate) struct Pass {
    pub(crate) common: Common,
    pub(crate) workloads: Workloads,
    pub(crate) bindings: Bindings,
    /// The OCM decider, when it is on.
    pub(crate) placements: Option<Placements>,
}

/// One object a pass evaluates.
enum Item {
    Workload(usize, Arc<DynamicObject>),
    Binding(usize, Arc<BindingItem>),
    Placement(usize, Arc<PlacementItem>),
}

/// One object's evaluation.
enum Evaluation {
    Workload(WorkloadEvaluation),
    Binding(BindingEvaluation),
    Placement(PlacementEvaluation),
}

impl Evaluation {
    fn weighed(&self) -> &dyn Weighed {
        match self {
            Evaluation::Workload(e) => e,
            Evaluation::Binding(e) => e,
            Evaluation::Placement(e) => e,
        }
    }

    /// The object's name, for the report of a held change.
    fn describe(&self, common: &Common) -> String {
        let e = self.weighed();
        describe(common.targets[e.target()].resource(), e.object().as_ref())
    }

    /// The move this write makes: the object and a digest of what it writes.
    fn fingerprint(&self, common: &Common) -> String {
        let written = self.weighed().written().unwrap_or_default();
        let digest = ring::digest::digest(&ring::digest::SHA256, &written);
        format!("{}={}", self.describe(common), hex(digest.as_ref(), 8))
    }

    fn key(&self) -> Option<ItemKey> {
        let e = self.weighed();
        e.object().map(|key| (e.target(), key))
    }
}

impl Pass {
    /// Evaluate every target object in scope (or, for a retry or a change,
    /// only those of `only`) and act on the stale ones.
    pub(crate) async fn pass(
        &self,
        cancel: &CancellationToken,
        only: Option<&BTreeSet<ItemKey>>,
        causes: &mut Causes,
        revision: &str,
    ) -> PassReport {
        let mut report = PassReport::default();
        let mut items = self.items(only);
        // What an unhealthy member delivers is evaluated first: its moves,
        // when nothing holds them, are then the first writes.
        let unhealthy = self.common.ctx.guard.health.unhealthy();
        if !unhealthy.is_empty() {
            items.sort_by_cached_key(|item| failover_rank(item, &unhealthy));
        }
        // The blast radius is weighed against every placed object in scope
        // (a pass over everything only).
        let placed_in_scope = items.iter().filter(|item| self.is_placed(item)).count();
        self.common.writer.forget_caught_up(&self.common.targets);
        let weighed = only.is_none() && self.guards();
        if !weighed || self.common.ctx.guard.holds_nothing(causes, Instant::now()) {
            // Nothing of this pass can be held (no edit among its causes, no
            // partition): each move is written once evaluated, a failover's
            // first while the rest of its thousands are still evaluated.
            self.evaluate_and_act(items, cancel, &mut report).await;
            if weighed && !report.aborted {
                // As a pass the guard weighs: a partition seen meanwhile is
                // recorded for the next pass, and nothing stays reported held.
                self.held(&mut Vec::new(), placed_in_scope, causes, revision)
                    .await;
            }
            return self.finish(only, report, cancel).await;
        }
        // First every object is evaluated (concurrently), then the pass's
        // writes are weighed as one change before any is sent.
        let evaluations: Vec<Option<Evaluation>> = futures::stream::iter(items)
            .map(|item| self.evaluate(item, cancel))
            .buffer_unordered(PASS_CONCURRENCY)
            .collect()
            .await;
        let Some(mut evaluations) = evaluations.into_iter().collect::<Option<Vec<_>>>() else {
            report.aborted = true;
            return report;
        };
        // The guard weighs a policy or data change (a pass over everything);
        // a few created, edited or failed objects are no such change, and
        // the webhook applies the policy in force to them anyway.
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
        // Writes that change where replicas run (a failed member's moves,
        // repairs) go first: the pass's other writes (re-admissions,
        // refreshed records) would otherwise keep workloads on a dead member
        // for as long as they take through the API server.
        evaluations.sort_by_cached_key(|e| !e.weighed().moves_replicas());
        self.act_all(evaluations, cancel, &mut report).await;
        self.finish(only, report, cancel).await
    }

    /// What every pass ends with: the deferred status writes, the Events,
    /// the gauges.
    async fn finish(
        &self,
        only: Option<&BTreeSet<ItemKey>>,
        report: PassReport,
        cancel: &CancellationToken,
    ) -> PassReport {
        (self.bindings)
            .write_deferred(&self.common, PASS_CONCURRENCY, cancel)
            .await;
        self.common.writer.publish(cancel).await;
        // A retry saw a few objects: the gauges keep the last full pass's view.
        if !report.aborted && only.is_none() {
            self.set_gauges(&report);
        }
        report
    }

    /// Evaluate `items` and act on each, a move (see
    /// [`Weighed::moves_replicas`]) as soon as it is evaluated, the other
    /// writes once every object is, so that moves still go first. What
    /// writes nothing is tallied at once: only the writes that wait are kept.
    async fn evaluate_and_act(
        &self,
        items: Vec<Item>,
        cancel: &CancellationToken,
        report: &mut PassReport,
    ) {
        let evaluations = futures::stream::iter(items)
            .map(|item| self.evaluate(item, cancel))
            .buffer_unordered(PASS_CONCURRENCY);
        let mut evaluations = std::pin::pin!(evaluations);
        let mut acting = futures::stream::FuturesUnordered::new();
        let mut moves = VecDeque::new();
        let mut rest = Vec::new();
        let mut evaluating = true;
        loop {
            while acting.len() < MOVE_CONCURRENCY
                && let Some(evaluation) = moves.pop_front()
            {
                acting.push(self.act(evaluation, cancel));
            }
            tokio::select! {
                evaluation = evaluations.next(), if evaluating => match evaluation {
                    Some(Some(e)) if e.weighed().moves_replicas() => moves.push_back(e),
                    Some(Some(e)) if !e.weighed().writes() => acting.push(self.act(e, cancel)),
                    Some(Some(e)) => rest.push(e),
                    Some(None) => {
                        report.aborted = true;
                        return;
                    }
                    None => evaluating = false,
                },
                Some((key, step)) = acting.next(), if !acting.is_empty() => {
                    if !report.tally(key, step) {
                        return;
                    }
                }
                else => break,
            }
        }
        self.act_all(rest, cancel, report).await;
    }

    /// Act on each evaluation, into `report`. Write round trips (which also
    /// pass through the admission webhook) dominate a pass: concurrent, the
    /// rate limiter still spacing them.
    async fn act_all(
        &self,
        evaluations: Vec<Evaluation>,
        cancel: &CancellationToken,
        report: &mut PassReport,
    ) {
        let steps = futures::stream::iter(evaluations)
            .map(|evaluation| self.act(evaluation, cancel))
            .buffer_unordered(PASS_CONCURRENCY);
        let mut steps = std::pin::pin!(steps);
        while let Some((key, step)) = steps.next().await {
            if !report.tally(key, step) {
                break;
            }
        }
    }

    fn set_gauges(&self, report: &PassReport) {
        let ctx = &self.common.ctx;
        let unresolved = match ctx.mode {
            RemediationMode::Auto => report.stale.saturating_sub(report.patched),
            _ => report.stale,
        };
        ctx.metrics.remediation_stale.set(unresolved as i64);
        ctx.metrics
            .remediation_unplaceable
            .set(report.unplaceable as i64);
    }

    /// Whether passes over everything are weighed by the guard: they write
    /// (remediation in `auto` mode, the scheduler, or the OCM decider).
    pub(crate) fn guards(&self) -> bool {
        self.common.ctx.mode == RemediationMode::Auto
            || self
                .common
                .targets
                .iter()
                .any(|t| matches!(t.kind, Kind::Bindings | Kind::Placements))
    }

    /// The objects of `only` (or every one in scope) of every target.
    fn items(&self, only: Option<&BTreeSet<ItemKey>>) -> Vec<Item> {
        let c = &self.common;
        let mut items: Vec<Item> = (self.workloads.items(c, only).into_iter())
            .map(|(i, item)| Item::Workload(i, item))
            .collect();
        items.extend(
            (self.bindings.items(c, only).into_iter()).map(|(i, item)| Item::Binding(i, item)),
        );
        if let Some(placements) = &self.placements {
            items.extend(
                (placements.items(c, only).into_iter()).map(|(i, item)| Item::Placement(i, item)),
            );
        }
        items
    }

    fn is_placed(&self, item: &Item) -> bool {
        match item {
            Item::Workload(_, item) => self.workloads.is_placed(item),
            Item::Binding(_, item) => self.bindings.is_placed(item),
            Item::Placement(_, item) => self.placements.as_ref().is_some_and(|p| p.is_placed(item)),
        }
    }

    /// Ask the decision for one object and compare; `None` when the pass must
    /// stop (leadership or the engine's sync lost, or stopping).
    async fn evaluate(&self, item: Item, cancel: &CancellationToken) -> Option<Evaluation> {
        let c = &self.common;
        if cancel.is_cancelled() || !c.writer.may_act() {
            return None;
        }
        let evaluation = match item {
            Item::Workload(i, item) => {
                Evaluation::Workload(self.workloads.evaluate(c, i, item).await)
            }
            Item::Binding(i, item) => Evaluation::Binding(self.bindings.evaluate(c, i, item).await),
            Item::Placement(i, item) => {
                let placements = self.placements.as_ref()?;
                Evaluation::Placement(placements.evaluate(c, i, item).await)
            }
        };
        if cancel.is_cancelled() || !c.writer.may_act() {
            return None;
        }
        Some(evaluation)
    }

    /// Act on one evaluation: what happened to which object. A write that
    /// met a newer version of the object is evaluated again on it, up to
    /// [`CONFLICT_ATTEMPTS`] writes.
    async fn act(
        &self,
        evaluation: Evaluation,
        cancel: &CancellationToken,
    ) -> (Option<ItemKey>, Step) {
        let key = evaluation.key();
        let mut planned_from = evaluation.weighed().planned_from();
        let mut step = self.act_once(evaluation, cancel).await;
        for _ in 1..CONFLICT_ATTEMPTS {
            let (Step::Conflicted, Some(key)) = (&step, &key) else {
                break;
            };
            let Some(item) = self.caught_up(key, planned_from.as_deref(), cancel).await else {
                break;
            };
            let Some(evaluation) = self.evaluate(item, cancel).await else {
                return (Some(key.clone()), Step::Aborted);
            };
            planned_from = evaluation.weighed().planned_from();
            step = self.act_once(evaluation, cancel).await;
        }
        if matches!(step, Step::Conflicted) {
            let name = key
                .as_ref()
                .map(|(i, object)| describe(self.common.targets[*i].resource(), Some(object)));
            tracing::warn!(object = ?name, "the object changed under its writes and was not written within the pass; evaluated again after it");
        }
        (key, step)
    }

    /// The object of `key` as one pass item once the watch shows a version
    /// other than `planned_from` (within [`CATCH_UP`]); `None` if it does
    /// not, or the object left the scope.
    async fn caught_up(
        &self,
        key: &ItemKey,
        planned_from: Option<&str>,
        cancel: &CancellationToken,
    ) -> Option<Item> {
        let (i, object) = key;
        let deadline = Instant::now() + CATCH_UP;
        while self.common.targets[*i].resource_version(object).as_deref() == planned_from {
            if Instant::now() >= deadline || cancel.is_cancelled() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.items(Some(&BTreeSet::from([key.clone()]))).pop()
    }

    /// Act on one evaluation once.
    async fn act_once(&self, evaluation: Evaluation, cancel: &CancellationToken) -> Step {
        let c = &self.common;
        match (evaluation, &self.placements) {
            (Evaluation::Workload(e), _) => self.workloads.act(c, e, cancel).await,
            (Evaluation::Binding(e), _) => self.bindings.act(c, e, cancel).await,
            (Evaluation::Placement(e), Some(placements)) => placements.act(c, e, cancel).await,
            (Evaluation::Placement(_), None) => Step::Aborted,
        }
    }
}

/// Where `item` goes in a pass while `members` are unhealthy: first the
/// bindings we schedule that deliver to one of them (their moves are ours to
/// write), then the guarded ones that do (karmada-scheduler moves those),
/// then the rest (the other kinds are not told apart).
fn failover_rank(item: &Item, members: &BTreeSet<String>) -> u8 {
    match item {
        Item::Binding(_, item) if item.binding.touches(members) => match item.mode {
            Mode::Schedule => 0,
            Mode::Guard => 1,
        },
        Item::Binding(..) | Item::Workload(..) | Item::Placement(..) => 2,
    }
}

/// Each write: whether it moves a placement, and whether an outage does
/// (it takes one of the `unhealthy` clusters out of the placement).
fn moves(evaluations: &[Evaluation], unhealthy: &BTreeSet<String>) -> Vec<(bool, bool)> {
    evaluations
        .iter()
        .map(|e| {
            let e = e.weighed();
            let moves = e.replaces_a_placement();
            (
                moves,
                moves && !e.clusters_taken_out().is_disjoint(unhealthy),
            )
        })
        .collect()
}

impl Pass {
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
        let ctx = &self.common.ctx;
        let guard = &ctx.guard;
        let moves = moves(evaluations, &guard.health.unhealthy());
        let outages = moves.iter().filter(|(_, outage)| *outage).count();
        let edits = moves
            .iter()
            .filter(|(moves, outage)| *moves && !outage)
            .count();
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
            self.release().await;
            return None;
        }
        let id = guard.occurrence(
            affected
                .iter()
                .map(|e| e.fingerprint(&self.common))
                .collect(),
        );
        let cause = causes.describe(revision);
        if ctx.policy_configmaps.take_confirmation(&id).await {
            tracing::warn!(%id, %cause, affected = affected.len(), placed, "applying a confirmed change beyond the blast radius");
            self.release().await;
            return None;
        }
        tracing::warn!(%id, %cause, affected = affected.len(), placed, outage_moves_applied = outages, "remediation held: beyond the blast radius; confirm it on a policy ConfigMap");
        ctx.metrics.remediation_held.set(affected.len() as i64);
        let held_count = affected.len();
        self.report_held(&id, &cause, &affected, placed).await;
        // What goes through: the outage's moves (beside a held edit).
        let mut through = moves
            .iter()
            .map(|&(_, outage)| outage && hold == Hold::Edits);
        evaluations.retain(|_| through.next().unwrap_or(false));
        Some(held_count)
    }

    /// Nothing is held (any more): the gauge, the report and the guard say so.
    async fn release(&self) {
        let ctx = &self.common.ctx;
        ctx.metrics.remediation_held.set(0);
        ctx.policy_configmaps.clear().await;
        ctx.guard.release();
    }

    /// Report the held change `id` (of `cause`) on the policy ConfigMaps.
    async fn report_held(&self, id: &str, cause: &str, affected: &[&Evaluation], placed: usize) {
        let configmaps = &self.common.ctx.policy_configmaps;
        let objects: Vec<String> = affected.iter().map(|e| e.describe(&self.common)).collect();
        // What each listed object would lose: the clusters taken off it.
        let off: Vec<BTreeSet<String>> = affected
            .iter()
            .take(blast::LISTED)
            .map(|e| e.weighed().clusters_taken_out())
            .collect();
        configmaps
            .report(&blast::report(
                id,
                cause,
                &objects,
                &off,
                placed,
                &configmaps.namespace(),
            ))
            .await;
    }
}

#[cfg(test)]
mod tests;
