//! The reconciler: keeps every target placed by the current policy, on the
//! elected replica. Three kinds of target, each with a reconciler of its own
//! ([`per_target::TargetReconciler`]), share everything else: the triggers
//! and the loop ([`driver`]), one pass driver weighed by the blast-radius
//! guard ([`pass`]), and one write step ([`writer`]: in flight, rate limit,
//! leadership, the field manager, Events):
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
//! This module wires them: it starts the watches ([`start`]), builds what
//! the targets share ([`common`]) and each target's reconciler, and runs the
//! loop; nothing below reaches back up here.
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
mod common;
mod context;
mod driver;
mod events;
pub(crate) mod karmada;
pub(crate) mod leader;
pub(crate) mod ocm;
mod pass;
mod per_target;
mod placements;
mod rate;
mod schedule;
mod start;
mod step;
mod target;
mod workloads;
mod writer;

use std::sync::Arc;

use policy_client::karmada::Templates;
use tokio_util::sync::CancellationToken;

pub(crate) use bindings::{BINDING_TYPES, KARMADA_CLUSTERS, PROPAGATION_POLICY_TYPES};
use bindings::{Bindings, KnownClusters};
use changes::Changes;
use common::Common;
pub(crate) use context::ReconcilerContext;
use driver::Driver;
use pass::Pass;
pub(crate) use placements::OcmSubscriptions;
use placements::Placements;
use start::Watched;
use target::Kind;
use workloads::Workloads;

use crate::config::writers::RemediationMode;
use crate::error::SyncError;
use crate::replication::watched::{Need, Subscription};
use crate::scope::{Scope, ScopeFilter};

/// What the reconciler needs of the watch of a workload type.
pub(crate) fn workload_need(scope: &Scope) -> Need {
    workloads::need(scope)
}

/// What the scheduler needs of the watch of a binding type.
pub(crate) fn binding_need() -> Need {
    bindings::need()
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

/// Watch the targets and keep them placed until `cancel`.
pub(crate) async fn run(
    ctx: ReconcilerContext,
    subscriptions: Subscriptions,
    cancel: CancellationToken,
) -> Result<(), SyncError> {
    let Some(keys) = start::ownership_keys(&ctx, &cancel).await? else {
        return Ok(());
    };
    let changes = Arc::new(Changes::default());
    let act = ctx.mode != RemediationMode::Off;
    let (placement_watch, ocm_watches) = match subscriptions.ocm {
        Some(ocm) => (Some(ocm.placements), Some(ocm.others)),
        None => (None, None),
    };
    let kinds = (subscriptions.workloads.into_iter())
        .map(|s| (Kind::Workloads { act }, s))
        .chain((subscriptions.bindings.into_iter()).map(|s| (Kind::Bindings, s)))
        .chain(placement_watch.map(|s| (Kind::Placements, s)));
    let watched = start::watch_targets(&ctx, kinds, &keys, &changes, &cancel).await?;
    let Some(Watched {
        targets,
        mut watchers,
    }) = watched
    else {
        return Ok(());
    };
    let stores = start::binding_stores(
        subscriptions.karmada_clusters,
        subscriptions.propagation_policies,
        &cancel,
    );
    let Some((karmada_clusters, propagation_policies)) = stores.await else {
        return Ok(());
    };
    if !start::listed(&targets, &cancel).await {
        return Ok(());
    }
    let placements = match ocm_watches {
        Some(others) => match start::ocm(others, &targets, &changes, &ctx, &cancel).await {
            Some((ocm, tasks)) => {
                watchers.extend(tasks);
                Some(Placements { ocm })
            }
            None => return Ok(()),
        },
        None => None,
    };
    let bindings = Bindings {
        templates: Templates::new(ctx.client.clone()),
        karmada_clusters: karmada_clusters.map(KnownClusters::new),
        propagation_policies,
        overdue: Default::default(),
        deferred: Default::default(),
    };
    let scope = ScopeFilter::start(&ctx.client, &ctx.scope, &cancel).await;
    let user_info = start::own_user_info(&ctx.client).await;
    let common = Common::new(ctx, targets, scope, user_info, keys, changes);
    let pass = Pass {
        common,
        workloads: Workloads,
        bindings,
        placements,
    };
    Driver { pass }.run(cancel).await;
    for w in watchers {
        let _ = w.await;
    }
    Ok(())
}
