//! Remediation: keep existing workloads placed by the current policy.
//!
//! When a policy module or replicated data the policies read changes (coalesced
//! over a short quiet time), the leader re-evaluates the decision for every
//! object of the `--remediate` types; when one workload is created or its
//! developer view changes (not its status, not the policy's own annotations), it
//! re-evaluates that workload alone. Both use the policy input the webhook will get for the PATCH
//! ([`policy_input`]: the developer's view of the object, restored from the
//! ownership record, never the policy's own earlier output; an UPDATE by this
//! remediator), and computes the minimal patch with [`plan_patch`]. In `auto` mode it
//! PATCHes the objects whose policy-owned annotations differ (rate-limited; the
//! patch carries a `test` of the resourceVersion it was computed from, so it never
//! overwrites a change it has not seen); in `report` mode it emits an Event per
//! stale object and sets a gauge. The webhook runs on the PATCH too and, reading
//! the same developer view, returns the same decision: no further change, no loop.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::PostParams;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource};
use policy_client::ownership_secret::KeySecret;
use policy_client::placement::{
    OWNERSHIP_ANNOTATION, annotations, desired_annotations, developer_view,
};
use policy_client::verdict::{Plan, plan};
use policy_client::{
    Decision, OwnershipKeys, PolicyEngine, QueryOutcome, RequestMeta, SharedKeys, policy_input,
};
use serde_json::{Value, json};
use tokio::sync::{Mutex, Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::blast::{self, Guard, PolicyConfigMaps};
use crate::cause::{Cause, Causes, Trigger};
use crate::config::{OwnershipKeySource, RemediationMode};
use crate::document::{ObjectKey, object_value};
use crate::error::SyncError;
use crate::leader::AppliedRecord;
use crate::metrics::Metrics;
use crate::queue::Backoff;
use crate::rego_refs::PolicyReads;
use crate::revision::{ReplicatedTypes, configured_revision};
use crate::scope::{Scope, ScopeFilter, parse_label_selector};
use crate::state::SyncState;
use crate::watched::{Need, Subscription, WatchChange, WatchedType};

/// Field manager of remediation patches.
pub const FIELD_MANAGER: &str = "placement-sync-remediator";

/// How an object's placement compares with the current decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Assessment {
    /// The object carries what the decision asks for.
    Placed,
    /// The annotations differ; `patch` fixes them, `changed` names the annotation
    /// keys whose values change (the ownership record left out; empty when
    /// only the record's signature changes, e.g. after a key rotation).
    Stale {
        patch: json_patch::Patch,
        changed: Vec<String>,
    },
    /// The policy reports errors (none of the allowed clusters is running, or
    /// the developer's request conflicts with the policy): the object keeps
    /// its placement, since a decision with errors never removes or replaces
    /// one ([`policy_client::verdict`]), and the developer is told what the
    /// policy reports.
    Unplaceable(Vec<String>),
    /// No decision (the engine has no policy at the decision path).
    Undefined,
    /// The decision or the object cannot be used.
    Invalid(String),
}

/// Compare `object` (as stored, not the developer view) with the decision the
/// engine returned for its developer view.
pub fn assess(object: &Value, outcome: &QueryOutcome, keys: &OwnershipKeys) -> Assessment {
    let result = match outcome {
        QueryOutcome::Undefined => return Assessment::Undefined,
        QueryOutcome::Defined(result) => result,
    };
    let decision = match Decision::from_result(result) {
        Ok(d) => d,
        Err(e) => return Assessment::Invalid(e.to_string()),
    };
    let patch = match plan(object, Some(object), &decision, keys) {
        Ok(Plan::Keep { errors, .. }) => return Assessment::Unplaceable(errors),
        Ok(Plan::Place(None)) => return Assessment::Placed,
        Ok(Plan::Place(Some(patch))) => patch,
        Err(e) => return Assessment::Invalid(e.to_string()),
    };
    let current = annotations(object).ok().flatten().unwrap_or_default();
    let changed = match desired_annotations(object, &decision, keys) {
        Ok(desired) => current
            .keys()
            .chain(desired.keys())
            .filter(|k| k.as_str() != OWNERSHIP_ANNOTATION && current.get(*k) != desired.get(*k))
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        Err(e) => return Assessment::Invalid(e.to_string()),
    };
    Assessment::Stale { patch, changed }
}

/// `patch` preceded by a test that the object is still at `resource_version`.
pub fn guarded_patch(
    patch: &json_patch::Patch,
    resource_version: Option<&str>,
) -> json_patch::Patch {
    let mut ops = Vec::with_capacity(patch.0.len() + 1);
    if let Some(rv) = resource_version {
        // A test op built from JSON cannot fail to parse.
        if let Ok(test) = serde_json::from_value::<json_patch::PatchOperation>(json!({
            "op": "test", "path": "/metadata/resourceVersion", "value": rv
        })) {
            ops.push(test);
        }
    }
    ops.extend(patch.0.iter().cloned());
    json_patch::Patch(ops)
}

/// Spaces calls `1/rate` seconds apart (no limit when the rate is 0).
#[derive(Debug)]
pub struct RateLimiter {
    interval: Option<Duration>,
    next: Mutex<Instant>,
}

impl RateLimiter {
    pub fn new(per_second: f64) -> Self {
        RateLimiter {
            interval: (per_second > 0.0).then(|| Duration::from_secs_f64(1.0 / per_second)),
            next: Mutex::new(Instant::now()),
        }
    }

    pub async fn acquire(&self) {
        let Some(interval) = self.interval else {
            return;
        };
        let at = {
            let mut next = self.next.lock().await;
            let at = (*next).max(Instant::now());
            *next = at + interval;
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

/// Tally of one remediation pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    pub evaluated: usize,
    pub stale: usize,
    pub patched: usize,
    pub failed: usize,
    pub unplaceable: usize,
    pub undefined: usize,
    /// Placements this pass would have rewritten or removed, held back by the
    /// blast-radius guard until an administrator confirms (0: nothing held).
    pub held: usize,
    /// Aborted because leadership or the engine's sync was lost.
    pub aborted: bool,
    /// The objects that failed (query, PATCH or unusable decision): the only
    /// ones a retry evaluates again.
    pub failed_objects: BTreeSet<WorkloadKey>,
}

/// A workload of the pass: its type (index into the remediated types) and
/// its namespace and name.
pub type WorkloadKey = (usize, ObjectKey);

/// The object carries a placement the policy wrote (its ownership record).
fn is_placed(object: &DynamicObject) -> bool {
    object
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(OWNERSHIP_ANNOTATION))
}

/// How often a held change looks for its confirmation.
const HELD_RECHECK: Duration = Duration::from_secs(5);

/// Objects evaluated and patched at once in a pass.
const PASS_CONCURRENCY: usize = 16;

/// Events published at once at the end of a pass.
const EVENT_CONCURRENCY: usize = 8;

/// What happened to one object in a pass.
enum Step {
    /// Leadership or the engine's sync was lost, or the sidecar is stopping.
    Aborted,
    /// Patched already; the watch cache has not caught up.
    InFlight,
    Failed,
    Placed,
    Undefined,
    Unplaceable,
    Stale {
        patched: bool,
        failed: bool,
    },
}

/// One object's evaluation in a pass, before anything is patched.
struct Evaluation {
    i: usize,
    object: Arc<DynamicObject>,
    /// The object carries a placement the policy wrote (its ownership record).
    placed: bool,
    /// `None` when the query failed.
    assessment: Option<Assessment>,
}

impl Evaluation {
    /// Would this change rewrite or remove a placement the object has? A
    /// new signature of the ownership record that changes no annotation
    /// (after a key rotation) does not.
    fn replaces_a_placement(&self) -> bool {
        self.placed
            && matches!(&self.assessment, Some(Assessment::Stale { changed, .. }) if !changed.is_empty())
    }
}

/// Whether `object` matches `selector` (no selector: every object).
fn selected(selector: Option<&Selector>, object: &Value) -> bool {
    selector.is_none_or(|selector| {
        let labels: BTreeMap<String, String> = object
            .pointer("/metadata/labels")
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default();
        selector.matches(&labels)
    })
}

/// What the remediator needs of the watch of a workload type.
pub(crate) fn need(scope: &Scope) -> Need {
    Need {
        scope: None,
        fields: None,
        labels: scope.object_selector.clone(),
        listed: true,
    }
}

struct Target {
    api: Api<DynamicObject>,
    watched: Arc<WatchedType>,
    /// The object selector, when the watch (shared with a replicator) could
    /// not apply it.
    selector: Option<Selector>,
}

impl Target {
    fn resource(&self) -> &ApiResource {
        &self.watched.resource
    }

    fn selects(&self, object: &Value) -> bool {
        selected(self.selector.as_ref(), object)
    }

    /// The resourceVersion the watch holds of `key`.
    fn resource_version(&self, key: &ObjectKey) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Meta {
            #[serde(rename = "resourceVersion")]
            resource_version: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Object {
            metadata: Meta,
        }
        let json = self.watched.objects.get(key)?;
        serde_json::from_slice::<Object>(&json)
            .ok()?
            .metadata
            .resource_version
    }
}

/// Everything the remediator needs.
#[derive(Clone)]
pub(crate) struct RemediatorContext {
    pub(crate) client: Client,
    pub(crate) engine: Arc<dyn PolicyEngine>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) state: Arc<SyncState>,
    pub(crate) mode: RemediationMode,
    pub(crate) decision: String,
    pub(crate) rate: f64,
    pub(crate) debounce: Duration,
    pub(crate) scope: Scope,
    /// The blast-radius guard and its partition rule.
    pub(crate) guard: Guard,
    /// Where the keys of the ownership record come from (shared with the webhook).
    pub(crate) ownership_keys: OwnershipKeySource,
    /// Where held changes are reported and confirmed.
    pub(crate) policy_configmaps: PolicyConfigMaps,
    pub(crate) query_timeout: Duration,
    /// Fired, with why, when a policy or the data it reads changed.
    pub(crate) trigger: Arc<Trigger>,
    /// What the policies read, and the replicated types: the configured
    /// revision a pass applies.
    pub(crate) reads: PolicyReads,
    pub(crate) replicated: Arc<ReplicatedTypes>,
    /// Where the leader records the revision it applied.
    pub(crate) applied: Option<AppliedRecord>,
    pub(crate) leader: watch::Receiver<bool>,
    pub(crate) recorder: Recorder,
}

struct Remediator {
    ctx: RemediatorContext,
    targets: Vec<Target>,
    scope: ScopeFilter,
    /// Who this remediator's PATCHes come from, as the API server tells the
    /// webhook (`userInfo` of the policy input).
    user_info: Value,
    /// Sign and verify the ownership record.
    keys: SharedKeys,
    limiter: RateLimiter,
    /// Objects patched from a resourceVersion the cache still shows: skipped until
    /// the cache catches up, so the same patch is not sent twice.
    in_flight: std::sync::Mutex<HashMap<(usize, ObjectKey), String>>,
    /// Events of the running pass, published once its PATCHes are done.
    pass_events: std::sync::Mutex<Vec<(ObjectReference, Event)>>,
    /// Workloads created or edited since they were last evaluated.
    changes: Arc<ChangedWorkloads>,
}

/// What a pass evaluates.
#[derive(Debug, Clone, PartialEq)]
enum Work {
    /// Every workload in scope (a policy or data change, a new leader).
    All,
    /// These workloads only (created or edited, or failed before).
    Only(BTreeSet<WorkloadKey>),
}

impl Work {
    fn merge(pending: Option<Work>, more: Work) -> Option<Work> {
        Some(match (pending, more) {
            (Some(Work::Only(mut a)), Work::Only(b)) => {
                a.extend(b);
                Work::Only(a)
            }
            (None, more) => more,
            _ => Work::All,
        })
    }
}

/// A fingerprint of what the policy sees of a workload that its own status
/// and the policy's own annotations cannot change: the developer view (see
/// [`developer_view`]) without `status`, `resourceVersion` and an empty
/// annotation map.
fn developer_fingerprint(object: &Value, keys: &OwnershipKeys) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut view = developer_view(object, keys);
    if let Value::Object(map) = &mut view {
        map.remove("status");
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            meta.remove("resourceVersion");
            meta.remove("managedFields");
            // The view of a placed object that had no annotations has an
            // empty map: the same request.
            if meta
                .get("annotations")
                .and_then(Value::as_object)
                .is_some_and(|a| a.is_empty())
            {
                meta.remove("annotations");
            }
        }
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    view.to_string().hash(&mut hasher);
    hasher.finish()
}

/// The workloads whose developer view changed since the remediator last saw
/// them, fed by the workload watches: each is evaluated on its own, so a
/// create or an edit never costs a pass over everything.
#[derive(Default)]
struct ChangedWorkloads {
    seen: std::sync::Mutex<HashMap<WorkloadKey, u64>>,
    due: std::sync::Mutex<BTreeSet<WorkloadKey>>,
    notify: Notify,
}

impl ChangedWorkloads {
    /// A workload as watched; `announce`: a new or changed view is due.
    fn observe(&self, key: WorkloadKey, fingerprint: u64, announce: bool) {
        let before = self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), fingerprint);
        if announce && before != Some(fingerprint) {
            self.due
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key);
            self.notify.notify_one();
        }
    }

    fn forget(&self, key: &WorkloadKey) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        self.due
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    fn take(&self) -> BTreeSet<WorkloadKey> {
        std::mem::take(&mut *self.due.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Watch the workload types and remediate until `cancel`.
pub(crate) async fn run(
    ctx: RemediatorContext,
    watches: Vec<Subscription>,
    cancel: CancellationToken,
) -> Result<(), SyncError> {
    let keys = match &ctx.ownership_keys {
        OwnershipKeySource::Secret { namespace, name } => {
            let secret = KeySecret {
                api: Api::namespaced(ctx.client.clone(), namespace),
                namespace: namespace.clone(),
                name: name.clone(),
                create: false,
            };
            // Waits until the webhook created the key; a shutdown meanwhile
            // must not wait with it.
            tokio::select! {
                keys = secret.keys() => keys,
                _ = cancel.cancelled() => return Ok(()),
            }
        }
        OwnershipKeySource::Fixed(keys) => SharedKeys::new(keys.clone()),
        OwnershipKeySource::Ephemeral => {
            tracing::warn!(
                "no --ownership-secret or --ownership-key-file: the ownership records this remediator writes verify nowhere else; give it the webhook's keys"
            );
            SharedKeys::new(
                OwnershipKeys::ephemeral().map_err(|e| SyncError::Config(e.to_string()))?,
            )
        }
    };
    let changes = Arc::new(ChangedWorkloads::default());
    let mut targets = Vec::new();
    let mut watchers = Vec::new();
    for mut watch in watches {
        let watched = tokio::select! {
            found = watch.found() => found,
            _ = cancel.cancelled() => None,
        };
        let Some(watched) = watched else {
            return Ok(());
        };
        let selector = match &ctx.scope.object_selector {
            Some(own) if watched.labels.as_ref() != Some(own) => {
                Some(parse_label_selector(own).map_err(SyncError::Config)?)
            }
            _ => None,
        };
        let target = Target {
            api: Api::all_with(ctx.client.clone(), &watched.resource),
            watched,
            selector,
        };
        let cancel = cancel.clone();
        let (changes, keys, i) = (changes.clone(), keys.clone(), targets.len());
        let selector = target.selector.clone();
        watchers.push(tokio::spawn(async move {
            // The first list is covered by the first pass; later lists (after
            // a disconnect) may carry objects created or edited meanwhile.
            let mut listed_once = false;
            loop {
                let change = tokio::select! {
                    c = watch.changes.recv() => c,
                    _ = cancel.cancelled() => break,
                };
                match change {
                    Some(WatchChange::Applied {
                        key, json, listed, ..
                    }) => {
                        let Ok(object) = serde_json::from_slice::<Value>(&json) else {
                            continue;
                        };
                        if selected(selector.as_ref(), &object) {
                            let view = developer_fingerprint(&object, &keys.current());
                            changes.observe((i, key), view, !listed || listed_once);
                        } else {
                            changes.forget(&(i, key));
                        }
                    }
                    Some(WatchChange::Deleted { key, .. }) => changes.forget(&(i, key)),
                    Some(WatchChange::ListDone { .. }) => listed_once = true,
                    None => break,
                }
            }
        }));
        targets.push(target);
    }
    for target in &targets {
        tokio::select! {
            _ = target.watched.objects.wait_until_listed() => {}
            _ = cancel.cancelled() => return Ok(()),
        }
    }
    let scope = ScopeFilter::start(&ctx.client, &ctx.scope, &cancel).await;
    let user_info = own_user_info(&ctx.client).await;
    let remediator = Remediator {
        limiter: RateLimiter::new(ctx.rate),
        ctx,
        targets,
        scope,
        user_info,
        keys,
        changes,
        in_flight: std::sync::Mutex::new(HashMap::new()),
        pass_events: std::sync::Mutex::new(Vec::new()),
    };
    remediator.run(cancel).await;
    for w in watchers {
        let _ = w.await;
    }
    Ok(())
}

/// The identity of this process as the API server sees it (a
/// SelfSubjectReview), or nothing when it cannot be asked.
async fn own_user_info(client: &Client) -> Value {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await;
    match review.map(|r| r.status.and_then(|s| s.user_info)) {
        Ok(Some(user)) => serde_json::to_value(user).unwrap_or_default(),
        Ok(None) => Value::Object(Default::default()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot learn the remediator's own identity; policies see an empty userInfo during remediation");
            Value::Object(Default::default())
        }
    }
}

impl Remediator {
    /// The policy input: what the webhook will be asked when this object is
    /// PATCHed (an UPDATE by the remediator, the stored object as
    /// `oldObject`), so both get the same answer.
    fn input(&self, i: usize, value: &Value) -> Value {
        let resource = self.targets[i].resource();
        let kind =
            json!({"group": resource.group, "version": resource.version, "kind": resource.kind});
        let gvr = json!({"group": resource.group, "version": resource.version, "resource": resource.plural});
        policy_input(
            value,
            &RequestMeta {
                uid: "",
                operation: "UPDATE",
                kind: &kind,
                resource: &gvr,
                namespace: value.pointer("/metadata/namespace").and_then(Value::as_str),
                name: value.pointer("/metadata/name").and_then(Value::as_str),
                user_info: &self.user_info,
                dry_run: false,
                old_object: Some(value),
                keys: &self.keys.current(),
            },
        )
    }

    /// The blast-radius guard: whether this pass, as one change of `causes`
    /// (under policy revision `revision`), must be held (reported, not
    /// applied) until an administrator confirms it.
    async fn held(
        &self,
        evaluations: &[Evaluation],
        placed: usize,
        causes: &mut Causes,
        revision: &str,
    ) -> bool {
        let affected: Vec<&Evaluation> = evaluations
            .iter()
            .filter(|e| e.replaces_a_placement())
            .collect();
        let configmaps = &self.ctx.policy_configmaps;
        if !self
            .ctx
            .guard
            .holds(causes, affected.len(), placed, Instant::now())
        {
            self.ctx.metrics.remediation_held.set(0);
            configmaps.clear().await;
            return false;
        }
        let id = causes.change_id(revision);
        let cause = causes.describe(revision);
        if configmaps.take_confirmation(&id).await {
            tracing::warn!(%id, %cause, affected = affected.len(), placed, "applying a confirmed remediation beyond the blast radius");
            self.ctx.metrics.remediation_held.set(0);
            configmaps.clear().await;
            return false;
        }
        tracing::warn!(%id, %cause, affected = affected.len(), placed, "remediation held: beyond the blast radius; confirm it on a policy ConfigMap");
        self.ctx.metrics.remediation_held.set(affected.len() as i64);
        let objects: Vec<String> = affected
            .iter()
            .map(|e| describe(&e.object, self.targets[e.i].resource()))
            .collect();
        configmaps
            .report(&blast::report(
                &id,
                &cause,
                &objects,
                placed,
                &configmaps.namespace(),
            ))
            .await;
        true
    }

    /// The configured revision now: the policy set (`policy_revision`) and
    /// the configured part of the data it reads.
    fn configured_revision(&self, policy_revision: &str) -> String {
        configured_revision(
            policy_revision,
            &self.ctx.replicated.revision(&self.ctx.reads),
        )
    }

    fn may_act(&self) -> bool {
        *self.ctx.leader.borrow() && self.ctx.state.is_ready()
    }

    async fn run(&self, cancel: CancellationToken) {
        let mut leader = self.ctx.leader.clone();
        let mut synced = self.ctx.state.subscribe_synced();
        let fresh_delays = || {
            Backoff {
                min_delay: Duration::from_secs(1),
                max_delay: Duration::from_secs(60),
            }
            .delays()
        };
        let mut retry_delays = fresh_delays();
        // Work to do later: a held change looks for its confirmation, failed
        // objects are retried alone (one failing object must not cost a pass
        // over every workload).
        let mut retry: Option<(Instant, Work)> = None;
        let mut pending = Some(Work::All);
        // Why the workloads may need re-placing, since the last pass over
        // everything that was applied (a held change keeps its causes).
        let mut owed = Causes::default();
        // This replica starts, or takes the lease over: what changed before
        // is known from the revision the last leader recorded.
        let mut takeover = true;
        // The configured revision of the last pass this replica applied.
        let mut applied: Option<String> = None;
        loop {
            if pending.is_none() {
                let retry_due = async {
                    match &retry {
                        Some((at, _)) => tokio::time::sleep_until(*at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = self.ctx.trigger.fired() => {
                        pending = Some(Work::All);
                        retry = None;
                    }
                    _ = self.changes.notify.notified() => {
                        pending = Some(Work::Only(self.changes.take()));
                    }
                    r = leader.changed() => {
                        if r.is_err() { return }
                        if *leader.borrow_and_update() {
                            pending = Some(Work::All);
                            retry = None;
                        }
                    }
                    r = synced.changed() => {
                        if r.is_err() { return }
                        if *synced.borrow_and_update() {
                            pending = Some(Work::All);
                            retry = None;
                        }
                    }
                    _ = retry_due => pending = retry.take().map(|(_, work)| work),
                    _ = cancel.cancelled() => return,
                }
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.ctx.debounce) => {}
                _ = cancel.cancelled() => return,
            }
            if !self.may_act() {
                // Wait for leadership / sync; a new leader or a fresh sync
                // starts over with every workload.
                tokio::select! {
                    _ = leader.changed() => {}
                    _ = synced.changed() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = cancel.cancelled() => return,
                }
                pending = Some(Work::All);
                continue;
            }
            // The pass reads the engine and the leadership as they are now, so
            // it covers the triggers, leadership and sync changes signalled
            // before it starts: they make it a pass over everything, and are
            // consumed. Left pending, each cost one more pass over everything
            // once this one ended (a fresh remediator passed three times).
            let fired = self.ctx.trigger.take();
            let revision = self.ctx.trigger.policy_revision();
            let triggered = !fired.is_empty();
            let leader_changed = leader.has_changed().unwrap_or(false);
            let synced_changed = synced.has_changed().unwrap_or(false);
            leader.borrow_and_update();
            synced.borrow_and_update();
            if leader_changed && *leader.borrow() {
                takeover = true;
            }
            let mut work = pending.take();
            if triggered || leader_changed || synced_changed {
                work = Work::merge(work, Work::All);
            }
            // Changes seen during the debounce join this pass.
            let changed = self.changes.take();
            if !changed.is_empty() {
                work = Work::merge(work, Work::Only(changed));
            }
            let work = work.unwrap_or(Work::All);
            let only = match &work {
                Work::All => None,
                Work::Only(keys) if keys.is_empty() => continue,
                Work::Only(keys) => Some(keys),
            };
            // The revision a pass over everything applies (work for one
            // only at a takeover or before such a pass).
            let configured = if takeover || only.is_none() {
                self.configured_revision(&revision)
            } else {
                String::new()
            };
            if takeover {
                // The edits seen while another replica led (or before this one
                // started) were that leader's to apply: it did, unless the
                // revision it recorded differs from now or it held a change.
                owed = owed.without_edits();
                owed.merge(fired.without_edits());
                let recorded = match &self.ctx.applied {
                    Some(record) => record.get().await,
                    None => applied.clone(),
                };
                if recorded.as_deref() != Some(configured.as_str())
                    || self.ctx.policy_configmaps.held().await
                {
                    owed.add(Cause::Resync);
                }
                takeover = false;
            } else {
                owed.merge(fired);
            }
            let started = Instant::now();
            let report = self.pass(&cancel, only, &mut owed, &revision).await;
            self.ctx.metrics.remediation_passes.inc();
            tracing::info!(
                mode = ?self.ctx.mode,
                only = only.map(BTreeSet::len),
                evaluated = report.evaluated,
                stale = report.stale,
                patched = report.patched,
                failed = report.failed,
                unplaceable = report.unplaceable,
                undefined = report.undefined,
                held = report.held,
                aborted = report.aborted,
                cause = only.is_none().then(|| owed.describe(&revision)),
                took_ms = started.elapsed().as_millis() as u64,
                "remediation pass"
            );
            if report.aborted {
                pending = Work::merge(pending, work);
                continue;
            }
            if work == Work::All && report.held == 0 {
                // Applied: what caused it is done with.
                owed = Causes::default();
                if self.ctx.mode == RemediationMode::Auto
                    && applied.as_deref() != Some(configured.as_str())
                {
                    let recorded = match &self.ctx.applied {
                        Some(record) => record.set(&configured).await,
                        None => true,
                    };
                    if recorded {
                        applied = Some(configured);
                    }
                }
            }
            if report.held > 0 {
                // Look for a confirmation again soon.
                retry = Some((Instant::now() + HELD_RECHECK, Work::All));
            } else if !report.failed_objects.is_empty() {
                let delay = retry_delays.next().unwrap_or(Duration::from_secs(60));
                let failed = Work::Only(report.failed_objects);
                // A later full pass still owes its retry to the failed ones.
                let merged = match retry.take() {
                    Some((_, Work::All)) => Work::All,
                    _ => failed,
                };
                retry = Some((Instant::now() + delay, merged));
            } else if work == Work::All {
                retry_delays = fresh_delays();
            }
        }
    }

    /// Evaluate every workload in scope (or, for a retry, only those of
    /// `only`) and act on the stale ones.
    async fn pass(
        &self,
        cancel: &CancellationToken,
        only: Option<&BTreeSet<WorkloadKey>>,
        causes: &mut Causes,
        revision: &str,
    ) -> PassReport {
        let mut report = PassReport::default();
        let objects = self.workloads(only);
        // The blast radius is weighed against every placed workload in scope
        // (a pass over everything only).
        let placed_in_scope = objects.iter().filter(|(_, o)| is_placed(o)).count();
        self.forget_caught_up();
        // First every object is evaluated (concurrently), then the pass's
        // PATCHes are weighed as one change before any is sent.
        let evaluations: Vec<Option<Evaluation>> = futures::stream::iter(objects)
            .map(|(i, object)| self.evaluate(i, object, cancel))
            .buffer_unordered(PASS_CONCURRENCY)
            .collect()
            .await;
        let Some(evaluations) = evaluations.into_iter().collect::<Option<Vec<_>>>() else {
            report.aborted = true;
            return report;
        };
        // The guard weighs a policy or data change (a pass over everything);
        // a few created, edited or failed workloads are no such change, and
        // the webhook applies the policy in force to them anyway.
        if self.ctx.mode == RemediationMode::Auto
            && only.is_none()
            && self
                .held(&evaluations, placed_in_scope, causes, revision)
                .await
        {
            report.evaluated = evaluations.len();
            report.held = evaluations
                .iter()
                .filter(|e| e.replaces_a_placement())
                .count();
            return report;
        }
        // PATCH round trips (which also pass through the admission webhook)
        // dominate a pass: concurrent, the rate limiter still spacing them.
        let steps = futures::stream::iter(evaluations)
            .map(|evaluation| async move {
                let key = ObjectKey::of(&evaluation.object).map(|k| (evaluation.i, k));
                (key, self.act(evaluation, cancel).await)
            })
            .buffer_unordered(PASS_CONCURRENCY);
        let mut steps = std::pin::pin!(steps);
        while let Some((key, step)) = steps.next().await {
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
            }
        }
        self.publish_pass_events(cancel).await;
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

    /// The workloads in scope, decoded from the watch caches: every one, or
    /// only those of `only` (a few created, edited or failed workloads must
    /// not cost decoding every workload).
    fn workloads(&self, only: Option<&BTreeSet<WorkloadKey>>) -> Vec<(usize, Arc<DynamicObject>)> {
        let decode = |i: usize, json: &[u8]| -> Option<(usize, Arc<DynamicObject>)> {
            let value: Value = serde_json::from_slice(json).ok()?;
            if !self.targets[i].selects(&value) {
                return None;
            }
            Some((i, Arc::new(serde_json::from_value(value).ok()?)))
        };
        let decode = &decode;
        let admitted = |key: &ObjectKey| self.scope.admits(key.namespace.as_deref());
        match only {
            None => self
                .targets
                .iter()
                .enumerate()
                .flat_map(|(i, t)| {
                    t.watched
                        .objects
                        .snapshot(admitted)
                        .into_iter()
                        .filter_map(move |(_, json)| decode(i, &json))
                })
                .collect(),
            Some(keys) => keys
                .iter()
                .filter(|(_, key)| admitted(key))
                .filter_map(|(i, key)| {
                    let json = self.targets.get(*i)?.watched.objects.get(key)?;
                    decode(*i, &json)
                })
                .collect(),
        }
    }

    /// Ask the decision for one object and compare; `None` when the pass must
    /// stop (leadership or the engine's sync lost, or stopping).
    async fn evaluate(
        &self,
        i: usize,
        object: Arc<DynamicObject>,
        cancel: &CancellationToken,
    ) -> Option<Evaluation> {
        if cancel.is_cancelled() || !self.may_act() {
            return None;
        }
        let value = object_value(&object, self.targets[i].resource());
        let input = self.input(i, &value);
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
                tracing::warn!(object = %describe(&object, self.targets[i].resource()), error = %e, "placement query failed");
                None
            }
        };
        if cancel.is_cancelled() || !self.may_act() {
            return None;
        }
        Some(Evaluation {
            i,
            placed: is_placed(&object),
            object,
            assessment,
        })
    }

    /// Act on one evaluation: patch, report or note it.
    async fn act(&self, evaluation: Evaluation, cancel: &CancellationToken) -> Step {
        let Evaluation {
            i,
            object,
            assessment,
            ..
        } = evaluation;
        let Some(assessment) = assessment else {
            return Step::Failed;
        };
        match assessment {
            Assessment::Placed => Step::Placed,
            Assessment::Undefined => Step::Undefined,
            Assessment::Invalid(reason) => {
                tracing::warn!(object = %describe(&object, self.targets[i].resource()), %reason, "cannot remediate");
                Step::Failed
            }
            Assessment::Unplaceable(errors) => {
                let note = format!(
                    "the placement policy reports errors for this object, so it keeps its current placement until the policy gives a valid one; fix: {}",
                    errors.join("; ")
                );
                self.event(i, &object, EventType::Warning, "PlacementRejected", note);
                Step::Unplaceable
            }
            Assessment::Stale { patch, changed } => match self.ctx.mode {
                RemediationMode::Auto if self.is_in_flight(i, &object) => {
                    // Patched already; the cache has not seen the result yet.
                    Step::InFlight
                }
                RemediationMode::Report => {
                    let note = format!(
                        "{} {}: placement is stale; policy-owned annotations differ from the current decision: {}",
                        self.targets[i].resource().kind,
                        describe(&object, self.targets[i].resource()),
                        changed.join(", ")
                    );
                    self.event(i, &object, EventType::Warning, "PlacementStale", note);
                    Step::Stale {
                        patched: false,
                        failed: false,
                    }
                }
                RemediationMode::Auto => {
                    self.limiter.acquire().await;
                    if cancel.is_cancelled() || !self.may_act() {
                        return Step::Aborted;
                    }
                    match self.patch(i, &object, &patch).await {
                        Ok(true) => {
                            let note =
                                format!("updated placement annotations: {}", changed.join(", "));
                            self.event(i, &object, EventType::Normal, "PlacementRemediated", note);
                            Step::Stale {
                                patched: true,
                                failed: false,
                            }
                        }
                        Ok(false) => Step::Stale {
                            patched: false,
                            failed: false,
                        },
                        Err(e) => {
                            tracing::warn!(object = %describe(&object, self.targets[i].resource()), error = %e, "remediation patch failed; will retry");
                            Step::Stale {
                                patched: false,
                                failed: true,
                            }
                        }
                    }
                }
                RemediationMode::Off => Step::Stale {
                    patched: false,
                    failed: false,
                },
            },
        }
    }

    /// PATCH one object; `Ok(false)` when it is gone.
    async fn patch(
        &self,
        i: usize,
        object: &DynamicObject,
        patch: &json_patch::Patch,
    ) -> Result<bool, SyncError> {
        let target = &self.targets[i];
        let name = object.metadata.name.clone().unwrap_or_default();
        let api = match &object.metadata.namespace {
            Some(ns) => {
                Api::namespaced_with(target.api.clone().into_client(), ns, target.resource())
            }
            None => target.api.clone(),
        };
        let rv = object.metadata.resource_version.clone();
        let guarded = guarded_patch(patch, rv.as_deref());
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        match api.patch(&name, &params, &Patch::<()>::Json(guarded)).await {
            Ok(_) => {
                self.ctx.metrics.patch(true);
                if let (Some(key), Some(rv)) = (ObjectKey::of(object), rv) {
                    self.in_flight
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert((i, key), rv);
                }
                tracing::info!(object = %describe(object, target.resource()), "remediated placement");
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => {
                self.ctx.metrics.patch(false);
                Err(e.into())
            }
        }
    }

    fn is_in_flight(&self, i: usize, object: &DynamicObject) -> bool {
        let Some(key) = ObjectKey::of(object) else {
            return false;
        };
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(i, key))
            .is_some_and(|rv| object.metadata.resource_version.as_ref() == Some(rv))
    }

    fn forget_caught_up(&self) {
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(i, key), rv| self.targets[*i].resource_version(key).as_ref() == Some(rv));
    }

    /// Queue an Event about `object` for the end of the pass: each Event is a
    /// write to the API server, and the PATCHes that re-place workloads go first.
    fn event(
        &self,
        i: usize,
        object: &DynamicObject,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let reference: ObjectReference = object.object_ref(self.targets[i].resource());
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, 1000)),
            action: "Remediate".to_owned(),
            secondary: None,
        };
        self.pass_events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((reference, event));
    }

    async fn publish_pass_events(&self, cancel: &CancellationToken) {
        let events =
            std::mem::take(&mut *self.pass_events.lock().unwrap_or_else(|e| e.into_inner()));
        let publish = futures::stream::iter(events).for_each_concurrent(
            EVENT_CONCURRENCY,
            |(reference, event)| async move {
                if let Err(e) = self.ctx.recorder.publish(&event, &reference).await {
                    let name = reference.name.as_deref().unwrap_or_default();
                    let namespace = reference.namespace.as_deref().unwrap_or_default();
                    tracing::warn!(%namespace, object = %name, reason = %event.reason, error = %e, "cannot publish event");
                }
            },
        );
        tokio::select! {
            _ = publish => {}
            _ = cancel.cancelled() => {}
        }
    }
}

fn describe(object: &DynamicObject, resource: &ApiResource) -> String {
    match ObjectKey::of(object) {
        Some(key) => format!("{}/{key}", resource.plural),
        None => resource.plural.clone(),
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max.saturating_sub(3);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> &'static OwnershipKeys {
        static KEYS: std::sync::OnceLock<OwnershipKeys> = std::sync::OnceLock::new();
        KEYS.get_or_init(|| OwnershipKeys::ephemeral().unwrap())
    }
    use policy_client::placement::OWNERSHIP_ANNOTATION;
    use policy_client::placement::developer_view;

    const PREFS: &str = "federation.kubernetes.io/replica-set-preferences";

    fn decision(prefs: &str) -> QueryOutcome {
        QueryOutcome::Defined(json!({"annotations": {PREFS: prefs}, "errors": []}))
    }

    fn apply(object: &Value, patch: &json_patch::Patch) -> Value {
        let mut doc = object.clone();
        json_patch::patch(&mut doc, patch).unwrap();
        doc
    }

    #[test]
    fn unannotated_object_is_stale_and_the_patch_converges() {
        let object =
            json!({"metadata": {"name": "rs", "namespace": "default", "resourceVersion": "7"}});
        let outcome = decision(r#"{"clusters":{"eu-1":{"weight":1}}}"#);
        let Assessment::Stale { patch, changed, .. } = assess(&object, &outcome, keys()) else {
            panic!("expected stale");
        };
        assert_eq!(changed, [PREFS]);
        let patched = apply(&object, &patch);
        assert_eq!(
            patched["metadata"]["annotations"][PREFS],
            r#"{"clusters":{"eu-1":{"weight":1}}}"#
        );
        assert!(patched["metadata"]["annotations"][OWNERSHIP_ANNOTATION].is_string());
        // Evaluating the patched object again (the webhook on the PATCH, or the next
        // pass) finds it placed: no loop.
        let view = developer_view(&patched, keys());
        assert!(
            view["metadata"]["annotations"].get(PREFS).is_none(),
            "developer asked for nothing"
        );
        assert_eq!(assess(&patched, &outcome, keys()), Assessment::Placed);
    }

    #[test]
    fn policy_change_makes_the_policy_value_stale_but_not_the_developer_request() {
        let developer_prefs = r#"{"clusters":{"eu-1":{"weight":1},"eu-2":{"weight":1}}}"#;
        let object = json!({"metadata": {"name": "rs", "annotations": {PREFS: developer_prefs}}});
        // The policy narrows to eu-1.
        let first = decision(r#"{"clusters":{"eu-1":{"weight":1}}}"#);
        let Assessment::Stale { patch, .. } = assess(&object, &first, keys()) else {
            panic!()
        };
        let placed = apply(&object, &patch);
        // The developer's request survives in the developer view.
        assert_eq!(
            developer_view(&placed, keys())["metadata"]["annotations"][PREFS],
            developer_prefs
        );
        // The policy now allows both: the object goes back to the developer's request.
        let second = decision(developer_prefs);
        let Assessment::Stale { patch, changed, .. } = assess(&placed, &second, keys()) else {
            panic!("expected stale")
        };
        assert_eq!(changed, [PREFS]);
        let replaced = apply(&placed, &patch);
        assert_eq!(replaced["metadata"]["annotations"][PREFS], developer_prefs);
        assert!(
            replaced["metadata"]["annotations"]
                .get(OWNERSHIP_ANNOTATION)
                .is_none()
        );
        assert_eq!(assess(&replaced, &second, keys()), Assessment::Placed);
    }

    #[test]
    fn errors_undefined_and_bad_shapes() {
        let object = json!({"metadata": {"name": "rs"}});
        assert_eq!(
            assess(
                &object,
                &QueryOutcome::Defined(
                    json!({"annotations": {}, "errors": ["no cluster allowed"]})
                ),
                keys()
            ),
            Assessment::Unplaceable(vec!["no cluster allowed".into()])
        );
        assert_eq!(
            assess(&object, &QueryOutcome::Undefined, keys()),
            Assessment::Undefined
        );
        assert!(matches!(
            assess(&object, &QueryOutcome::Defined(json!("x")), keys()),
            Assessment::Invalid(_)
        ));
        assert!(matches!(
            assess(
                &object,
                &QueryOutcome::Defined(json!({"annotations": {"bad key!": "v"}, "errors": []})),
                keys()
            ),
            Assessment::Invalid(_)
        ));
        // A decision without `errors` (or `annotations`) is an incomplete policy.
        assert!(matches!(
            assess(
                &object,
                &QueryOutcome::Defined(json!({"annotations": {}})),
                keys()
            ),
            Assessment::Invalid(_)
        ));
        assert_eq!(
            assess(
                &object,
                &QueryOutcome::Defined(json!({"annotations": {}, "errors": []})),
                keys()
            ),
            Assessment::Placed
        );
    }

    /// The seed's conflict: errors and the intersection. A decision with
    /// errors never removes or replaces a placement: the object keeps what it
    /// has (here the developer's own request of a and b) and the errors are
    /// named for the developer; so does one the policy placed, when the
    /// policy can place it nowhere any more.
    #[test]
    fn a_conflict_keeps_the_placement_and_names_the_errors() {
        let object = json!({"metadata": {"name": "rs", "namespace": "default", "resourceVersion": "3",
            "annotations": {PREFS: r#"{"clusters":{"a":{"weight":1},"b":{"weight":1}}}"#}}});
        let conflict = QueryOutcome::Defined(json!({
            "annotations": {PREFS: {"clusters": {"a": {"weight": 1}}, "rebalance": true}},
            "errors": ["requested replica-set-preferences includes invalid clusters: b"]
        }));
        assert_eq!(
            assess(&object, &conflict, keys()),
            Assessment::Unplaceable(vec![
                "requested replica-set-preferences includes invalid clusters: b".into()
            ])
        );
        let unplaced = json!({"metadata": {"name": "rs", "namespace": "default"}});
        let Assessment::Stale { patch, .. } =
            assess(&unplaced, &decision(r#"{"clusters":{"a":{}}}"#), keys())
        else {
            panic!("placed by the policy")
        };
        let placed = apply(&unplaced, &patch);
        let nowhere = QueryOutcome::Defined(json!({
            "annotations": {}, "errors": ["no cluster satisfies the placement requirements"]
        }));
        assert_eq!(
            assess(&placed, &nowhere, keys()),
            Assessment::Unplaceable(vec![
                "no cluster satisfies the placement requirements".into()
            ])
        );
    }

    #[test]
    fn guarded_patch_tests_the_resource_version_first() {
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}
        ]))
        .unwrap();
        let guarded = serde_json::to_value(guarded_patch(&patch, Some("42"))).unwrap();
        assert_eq!(
            guarded[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"})
        );
        assert_eq!(guarded[1]["op"], "add");
        let mut doc = json!({"metadata": {"resourceVersion": "41"}});
        assert!(json_patch::patch(&mut doc, &guarded_patch(&patch, Some("42"))).is_err());
        assert_eq!(
            serde_json::to_value(guarded_patch(&patch, None))
                .unwrap()
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }

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

    #[test]
    fn the_fingerprint_ignores_status_and_the_policys_own_placement() {
        let object = json!({
            "metadata": {"name": "rs", "namespace": "default", "resourceVersion": "7", "labels": {"app": "a"}},
            "spec": {"replicas": 1},
            "status": {"replicas": 0}
        });
        let outcome = decision(r#"{"clusters":{"eu-1":{"weight":1}}}"#);
        let Assessment::Stale { patch, .. } = assess(&object, &outcome, keys()) else {
            panic!("expected stale");
        };
        let placed = apply(&object, &patch);
        let print = |o: &Value| developer_fingerprint(o, keys());
        assert_eq!(print(&object), print(&placed), "the policy's own PATCH");
        let mut status = placed.clone();
        status["status"]["replicas"] = json!(3);
        status["metadata"]["resourceVersion"] = json!("8");
        assert_eq!(print(&placed), print(&status), "a status update");
        let mut labelled = placed.clone();
        labelled["metadata"]["labels"]["tier"] = json!("web");
        assert_ne!(print(&placed), print(&labelled), "a label edit");
        let mut requested = placed.clone();
        requested["metadata"]["annotations"][PREFS] = json!(r#"{"clusters":{"eu-2":{}}}"#);
        assert_ne!(print(&placed), print(&requested), "a new request");
    }

    #[test]
    fn changed_workloads_are_due_once_per_change() {
        let changes = ChangedWorkloads::default();
        let key = |name: &str| (0, ObjectKey::new(Some("team-a"), name));
        changes.observe(key("listed"), 1, false);
        assert!(
            changes.take().is_empty(),
            "the first list is the first pass's"
        );
        changes.observe(key("listed"), 1, true);
        changes.observe(key("created"), 5, true);
        assert_eq!(changes.take(), [key("created")].into());
        changes.observe(key("listed"), 2, true);
        changes.observe(key("created"), 6, true);
        changes.forget(&key("created"));
        assert_eq!(changes.take(), [key("listed")].into());
        assert!(changes.take().is_empty());
    }

    #[test]
    fn work_merges_toward_everything() {
        let only =
            |ids: &[&str]| Work::Only(ids.iter().map(|id| (0, ObjectKey::new(None, id))).collect());
        assert_eq!(Work::merge(None, only(&["a"])), Some(only(&["a"])));
        assert_eq!(
            Work::merge(Some(only(&["a"])), only(&["b"])),
            Some(only(&["a", "b"]))
        );
        assert_eq!(Work::merge(Some(only(&["a"])), Work::All), Some(Work::All));
        assert_eq!(Work::merge(Some(Work::All), only(&["a"])), Some(Work::All));
    }

    #[test]
    fn notes_are_truncated_on_char_boundaries() {
        assert_eq!(truncate("short".into(), 10), "short");
        let long = "é".repeat(600);
        let t = truncate(long, 1000);
        assert!(t.len() <= 1000 && t.ends_with("..."));
    }
}
