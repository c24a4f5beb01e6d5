//! The reconciler: keeps every target placed by the current policy, on the
//! elected replica. Two kinds of target share everything here (triggers,
//! leadership, the rate limit, the blast-radius guard, Events):
//!
//! - **workloads** ([`workloads`]): the placement annotations of the objects
//!   the webhook evaluates (remediation);
//! - **Karmada bindings** ([`bindings`]): the `spec.clusters` of the
//!   ResourceBindings and ClusterResourceBindings whose `spec.schedulerName`
//!   is ours (the scheduler), and with the guardrail the `spec.placement` of
//!   every other binding, kept within the clusters the policy allows;
//! - **OCM Placements** ([`placements`]): the PlacementDecisions of the
//!   Open Cluster Management Placements that opt in (the decider).
//!
//! When a policy module or replicated data the policies read changes
//! (coalesced over a short quiet time), the leader re-evaluates every target
//! object; when one object's own content changes (a workload's developer view,
//! a binding's spec; never a status), it re-evaluates that object alone. Both
//! use the policy input the webhook gets ([`policy_input`]: an UPDATE by this
//! reconciler, the stored object as `oldObject`), so both get its answer.
//!
//! Why not kube-runtime's `Controller`: the guard weighs a pass over
//! everything as one change before any of it is written, which a
//! per-object reconcile cannot do; a `Controller` with a generation predicate
//! would miss label and annotation edits the policy reads, and without one it
//! reconciles every status update.
//!
//! Beside the reconciler live what only it uses: the blast-radius guard
//! ([`blast`]), leader election ([`leader`]), the loop's decisions
//! ([`schedule`]) and the Karmada binding model ([`karmada`]). What it weighs
//! comes from below: the causes ([`crate::cause`]), cluster health and the
//! configured revision ([`crate::replication::health`],
//! [`crate::replication::revision`]) and the workloads in scope
//! ([`crate::scope`]).

mod bindings;
pub(crate) mod blast;
mod changes;
mod events;
pub(crate) mod karmada;
pub(crate) mod leader;
pub(crate) mod ocm;
mod pass;
mod placements;
mod rate;
mod schedule;
mod step;
mod target;
mod workloads;
mod writer;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Client;
use kube::api::{Api, ApiResource, PostParams};
use kube::runtime::events::Recorder;
use policy_client::engine::PolicyEngine;
use policy_client::input::stored_input;
use policy_client::karmada::Templates;
use policy_client::ownership_keys::{OwnershipKeys, SharedKeys};
use policy_client::ownership_secret::KeySecret;
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(crate) use bindings::{BINDING_TYPES, KARMADA_CLUSTERS, PROPAGATION_POLICY_TYPES};
use changes::{Changes, follow};
pub(crate) use placements::OcmSubscriptions;
use schedule::{Observed, Plan, Schedule, Wake};
use target::{Kind, Target};
use writer::Writer;

use crate::cause::Trigger;
use crate::config::writers::{KarmadaSettings, OwnershipKeySource, RemediationMode};
use crate::engine_sync::SyncState;
use crate::error::SyncError;
use crate::metrics::Metrics;
use crate::policies::rego_refs::PolicyReads;
use crate::reconcile::blast::{Guard, PolicyConfigMaps};
use crate::reconcile::leader::AppliedRecord;
use crate::replication::revision::{ReplicatedTypes, configured_revision};
use crate::replication::watched::{Need, Subscription, WatchedType};
use crate::scope::{Scope, ScopeFilter, parse_label_selector};

/// Now, as Kubernetes writes times in conditions (RFC 3339, seconds, UTC).
pub(crate) fn now_rfc3339() -> String {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .ok()
    .and_then(|v| v.as_str().map(str::to_owned))
    .unwrap_or_default()
}

/// What the reconciler needs of the watch of a workload type.
pub(crate) fn workload_need(scope: &Scope) -> Need {
    workloads::need(scope)
}

/// What the scheduler needs of the watch of a binding type.
pub(crate) fn binding_need() -> Need {
    bindings::need()
}

/// Everything the reconciler needs.
#[derive(Clone)]
pub(crate) struct ReconcilerContext {
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
    /// Which Karmada bindings are scheduled and which guarded; unused
    /// without binding subscriptions.
    pub(crate) karmada: KarmadaSettings,
}

/// The watches of the reconciler's targets.
pub(crate) struct Subscriptions {
    /// Workload types (remediated when remediation is on; the templates of
    /// bindings either way).
    pub(crate) workloads: Vec<Subscription>,
    /// Binding types (empty when the Karmada scheduler is off).
    pub(crate) bindings: Vec<Subscription>,
    /// Karmada's replicated Clusters, when they are replicated.
    pub(crate) karmada_clusters: Option<Subscription>,
    /// Karmada's PropagationPolicies and ClusterPropagationPolicies, for the
    /// guardrail.
    pub(crate) propagation_policies: Option<[Subscription; 2]>,
    /// OCM's types, when the decider is on.
    pub(crate) ocm: Option<OcmSubscriptions>,
}

pub(crate) struct Reconciler {
    ctx: ReconcilerContext,
    targets: Vec<Target>,
    scope: ScopeFilter,
    /// Who this reconciler's writes come from, as the API server tells the
    /// webhook (`userInfo` of the policy input).
    user_info: Value,
    /// Sign and verify the ownership record.
    keys: SharedKeys,
    /// The one write step (in flight, rate limit, leadership, Events).
    writer: Writer,
    /// Objects created or changed since they were last evaluated.
    changes: Arc<Changes>,
    /// Bindings' templates that are not among the watched workload types,
    /// read from the API server.
    templates: Templates,
    karmada_clusters: Option<Arc<WatchedType>>,
    propagation_policies: Option<bindings::PropagationPolicies>,
    /// What the OCM decider reads besides its Placements.
    ocm: Option<placements::OcmState>,
    /// Since when guarded bindings deliver outside their record.
    overdue: parking_lot::Mutex<karmada::guard::Overdue>,
}

/// The ownership keys of the reconciler's source; `None` when stopping first.
async fn ownership_keys(
    ctx: &ReconcilerContext,
    cancel: &CancellationToken,
) -> Result<Option<SharedKeys>, SyncError> {
    Ok(Some(match &ctx.ownership_keys {
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
                _ = cancel.cancelled() => return Ok(None),
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
    }))
}

/// What decides a target object's placement, as a fingerprint.
struct Fingerprinter {
    kind: Kind,
    selector: Option<kube::core::Selector>,
    karmada: KarmadaSettings,
    keys: SharedKeys,
}

impl Fingerprinter {
    /// `None` for an object the reconciler does not keep placed.
    fn print(&self, object: &Value) -> Option<u64> {
        match self.kind {
            Kind::Workloads { .. } => workloads::selected(self.selector.as_ref(), object)
                .then(|| workloads::developer_fingerprint(object, &self.keys.current())),
            Kind::Bindings => {
                let binding =
                    <karmada::binding::Binding as serde::Deserialize>::deserialize(object).ok()?;
                match binding.mode(&self.karmada)? {
                    karmada::binding::Mode::Schedule => Some(bindings::binding_fingerprint(object)),
                    karmada::binding::Mode::Guard => Some(bindings::guarded_fingerprint(object)),
                }
            }
            // One scheduler name for both (`--scheduler-name`).
            Kind::Placements => {
                placements::placement_fingerprint(object, &self.karmada.scheduler_name)
            }
        }
    }
}

/// Feed a target's watch into `changes`: an object is due when what decides
/// its placement changed. The first list is covered by the first pass;
/// later lists (after a disconnect) may carry objects changed meanwhile.
fn watch_changes(
    watch: Subscription,
    i: usize,
    fingerprinter: Fingerprinter,
    changes: Arc<Changes>,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    follow(watch, cancel, move |key, object, news| {
        let key = (i, key.clone());
        match object.and_then(|object| fingerprinter.print(object)) {
            Some(print) => changes.observe(key, print, news),
            None => changes.forget(&key),
        }
    })
}

/// Watch the targets and keep them placed until `cancel`.
pub(crate) async fn run(
    ctx: ReconcilerContext,
    subscriptions: Subscriptions,
    cancel: CancellationToken,
) -> Result<(), SyncError> {
    let Some(keys) = ownership_keys(&ctx, &cancel).await? else {
        return Ok(());
    };
    let changes = Arc::new(Changes::default());
    let act = ctx.mode != RemediationMode::Off;
    let mut targets = Vec::new();
    let mut watchers = Vec::new();
    let (placement_watch, ocm_watches) = match subscriptions.ocm {
        Some(ocm) => (Some(ocm.placements), Some(ocm.others)),
        None => (None, None),
    };
    let kinds = subscriptions
        .workloads
        .into_iter()
        .map(|s| (Kind::Workloads { act }, s))
        .chain(
            subscriptions
                .bindings
                .into_iter()
                .map(|s| (Kind::Bindings, s)),
        )
        .chain(placement_watch.map(|s| (Kind::Placements, s)));
    for (kind, mut watch) in kinds {
        let watched = tokio::select! {
            found = watch.found() => found,
            _ = cancel.cancelled() => None,
        };
        let Some(watched) = watched else {
            return Ok(());
        };
        let selector = match (&ctx.scope.object_selector, kind) {
            (Some(own), Kind::Workloads { .. }) if watched.labels.as_ref() != Some(own) => {
                Some(parse_label_selector(own).map_err(SyncError::Config)?)
            }
            _ => None,
        };
        let target = Target {
            kind,
            api: Api::all_with(ctx.client.clone(), &watched.resource),
            watched,
            selector: selector.clone(),
        };
        if kind == (Kind::Workloads { act: false }) {
            // Templates of bindings only, read from the store: their edits
            // reach the scheduler as changes of the bindings' spec, and a
            // pass for each would evaluate nothing.
            drop(watch.changes);
        } else {
            let fingerprinter = Fingerprinter {
                kind,
                selector,
                karmada: ctx.karmada.clone(),
                keys: keys.clone(),
            };
            watchers.push(watch_changes(
                watch,
                targets.len(),
                fingerprinter,
                changes.clone(),
                cancel.clone(),
            ));
        }
        targets.push(target);
    }
    let karmada_clusters = match subscriptions.karmada_clusters {
        Some(watch) => match store_only(watch, &cancel).await {
            Some(found) => Some(found),
            None => return Ok(()),
        },
        None => None,
    };
    let propagation_policies = match subscriptions.propagation_policies {
        Some([namespaced, cluster]) => {
            let (Some(namespaced), Some(cluster)) = (
                store_only(namespaced, &cancel).await,
                store_only(cluster, &cancel).await,
            ) else {
                return Ok(());
            };
            Some(bindings::PropagationPolicies {
                namespaced,
                cluster,
            })
        }
        None => None,
    };
    for target in &targets {
        tokio::select! {
            _ = target.watched.objects.wait_until_listed() => {}
            _ = cancel.cancelled() => return Ok(()),
        }
    }
    let ocm = match ocm_watches {
        Some(others) => {
            let placements = targets
                .iter()
                .position(|t| t.kind == Kind::Placements)
                .expect("the Placements are a target when the decider is on");
            let started = placements::start(
                others,
                placements,
                changes.clone(),
                ctx.trigger.clone(),
                &cancel,
            )
            .await;
            let Some((state, tasks)) = started else {
                return Ok(());
            };
            watchers.extend(tasks);
            Some(state)
        }
        None => None,
    };
    let scope = ScopeFilter::start(&ctx.client, &ctx.scope, &cancel).await;
    let user_info = own_user_info(&ctx.client).await;
    let templates = Templates::new(ctx.client.clone());
    let reconciler = Reconciler {
        writer: Writer::new(
            ctx.rate,
            ctx.recorder.clone(),
            ctx.leader.clone(),
            ctx.state.clone(),
        ),
        ctx,
        targets,
        scope,
        user_info,
        keys,
        changes,
        templates,
        karmada_clusters,
        propagation_policies,
        ocm,
        overdue: Default::default(),
    };
    reconciler.run(cancel).await;
    for w in watchers {
        let _ = w.await;
    }
    Ok(())
}

/// A watched type whose store alone is read (its changes reach a replicator,
/// or nobody); `None` when stopping first.
async fn store_only(
    mut watch: Subscription,
    cancel: &CancellationToken,
) -> Option<Arc<WatchedType>> {
    let found = tokio::select! {
        found = watch.found() => found,
        _ = cancel.cancelled() => None,
    };
    drop(watch.changes);
    found
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

impl Reconciler {
    /// The policy input: what the webhook will be asked when this object is
    /// written (an UPDATE by this reconciler, the stored object as
    /// `oldObject`), so both get the same answer.
    fn update_input(&self, value: &Value, resource: &ApiResource) -> Value {
        stored_input(value, resource, &self.user_info, &self.keys.current())
    }

    /// The configured revision now: the policy set (`policy_revision`) and
    /// the configured part of the data it reads.
    fn configured_revision(&self, policy_revision: &str) -> String {
        configured_revision(
            policy_revision,
            &self.ctx.replicated.revision(&self.ctx.reads),
        )
    }

    /// Keep the targets placed until `cancel`: wait for work, let it
    /// settle, and pass over it when this replica may act.
    async fn run(&self, cancel: CancellationToken) {
        let mut signals = Signals {
            leader: self.ctx.leader.clone(),
            synced: self.ctx.state.subscribe_synced(),
        };
        let mut schedule = Schedule::default();
        loop {
            if schedule.is_idle() {
                match self.wake(&mut signals, schedule.retry_at(), &cancel).await {
                    Some(wake) => schedule.wake(wake),
                    None => return,
                }
                continue;
            }
            if !sleep_or_cancel(schedule.quiet(self.ctx.debounce), &cancel).await {
                return;
            }
            if !self.writer.may_act() {
                if !wait_to_act(&mut signals, &cancel).await {
                    return;
                }
                schedule.cannot_act();
                continue;
            }
            let (seen, revision) = self.observe(&mut signals);
            let Some(plan) = schedule.begin(seen) else {
                continue;
            };
            self.pass_and_record(&mut schedule, plan, &revision, &cancel)
                .await;
        }
    }

    /// What wakes the idle loop; `None` when it must stop.
    async fn wake(
        &self,
        signals: &mut Signals,
        retry_at: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Option<Wake> {
        let retry_due = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        Some(tokio::select! {
            _ = self.ctx.trigger.fired() => Wake::Fired,
            _ = self.changes.notify.notified() => Wake::Changed(self.changes.take()),
            r = signals.leader.changed() => {
                r.ok()?;
                Wake::Leader(*signals.leader.borrow_and_update())
            }
            r = signals.synced.changed() => {
                r.ok()?;
                Wake::Synced(*signals.synced.borrow_and_update())
            }
            _ = retry_due => Wake::RetryDue,
            _ = cancel.cancelled() => return None,
        })
    }

    /// What happened up to now, consumed, and the revision of the policy
    /// set in force: the pass reads the engine and the leadership as they
    /// are now, so it covers what was signalled before it starts.
    fn observe(&self, signals: &mut Signals) -> (Observed, String) {
        let fired = self.ctx.trigger.take();
        let revision = self.ctx.trigger.policy_revision();
        let leader_changed = signals.leader.has_changed().unwrap_or(false);
        let synced_changed = signals.synced.has_changed().unwrap_or(false);
        let leader = *signals.leader.borrow_and_update();
        signals.synced.borrow_and_update();
        let seen = Observed {
            fired,
            leader_changed,
            leader,
            synced_changed,
            changed: self.changes.take(),
        };
        (seen, revision)
    }

    /// Run the pass of `plan` under policy revision `revision`, after a
    /// takeover's look at what the last leader applied, and record the
    /// revision it applied.
    async fn pass_and_record(
        &self,
        schedule: &mut Schedule,
        plan: Plan,
        revision: &str,
        cancel: &CancellationToken,
    ) {
        let Plan {
            work,
            needs_revision,
            takeover,
        } = plan;
        let configured = match needs_revision {
            true => self.configured_revision(revision),
            false => String::new(),
        };
        if let Some(fired) = takeover {
            let recorded = match &self.ctx.applied {
                Some(record) => record.get().await,
                None => schedule.applied().map(str::to_owned),
            };
            if schedule.take_over(fired, recorded.as_deref(), &configured)
                && self.ctx.policy_configmaps.held().await
            {
                schedule.last_leader_held();
            }
        }
        let only = work.only();
        let started = Instant::now();
        let report = self.pass(cancel, only, schedule.owed_mut(), revision).await;
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
            cause = only.is_none().then(|| schedule.owed().describe(revision)),
            took_ms = started.elapsed().as_millis() as u64,
            "remediation pass"
        );
        if report.aborted {
            schedule.aborted(work);
            return;
        }
        if let Some(configured) = schedule.completed(&work, report.held, self.guards(), configured)
        {
            let recorded = match &self.ctx.applied {
                Some(record) => record.set(&configured).await,
                None => true,
            };
            if recorded {
                schedule.recorded(configured);
            }
        }
        schedule.retry_after(
            &work,
            report.held,
            report.failed_objects,
            report.due,
            Instant::now(),
        );
    }
}

/// The leadership and the engine's sync, as the loop watches them.
struct Signals {
    leader: watch::Receiver<bool>,
    synced: watch::Receiver<bool>,
}

/// Sleep for `quiet`; `false` when cancelled first.
async fn sleep_or_cancel(quiet: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(quiet) => true,
        _ = cancel.cancelled() => false,
    }
}

/// Wait a while for leadership or sync; `false` when cancelled first.
async fn wait_to_act(signals: &mut Signals, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = signals.leader.changed() => true,
        _ = signals.synced.changed() => true,
        _ = tokio::time::sleep(Duration::from_secs(1)) => true,
        _ = cancel.cancelled() => false,
    }
}
