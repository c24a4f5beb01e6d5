//! One sidecar instance: its parts wired together, run until cancelled or
//! until one fails for good.

use std::sync::Arc;

use kube::runtime::events::{Recorder, Reporter};
use policy_client::engine::PolicyEngine;
use policy_client::revision_board::AnnouncedWrites;
use policy_client::revision_board::RevisionBoard;
use policy_client::revision_feed::RememberingEngine;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::engine_sync::{self, SyncState};
use crate::error::SyncError;
use crate::gvr::Gvr;
use crate::metrics::Metrics;
use crate::policies::{self, demand};
use crate::reconcile::{self, blast, leader};
use crate::replication::{self, health, revision, watched};
use crate::{cause, server};

/// One sidecar instance: its settings, clients and shared state.
pub(crate) struct Sidecar {
    settings: Settings,
    client: kube::Client,
    /// Every write to `engine` is announced here first.
    revisions: Arc<RevisionBoard>,
    engine: Arc<dyn PolicyEngine>,
    /// `engine` with its decisions remembered (`--decision-cache-memory`)
    /// while it follows `revisions`, for the reconcilers' questions only: the
    /// engine monitor's sentinel must reach the engine every time.
    deciding: Arc<RememberingEngine>,
    metrics: Arc<Metrics>,
    state: Arc<SyncState>,
}

impl std::fmt::Debug for Sidecar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sidecar")
            .field("engine", &self.engine)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Sidecar {
    pub(crate) fn new(
        settings: Settings,
        client: kube::Client,
        engine: Arc<dyn PolicyEngine>,
    ) -> Self {
        let mut metrics = Metrics::new();
        let revisions = Arc::new(RevisionBoard::new());
        let engine: Arc<dyn PolicyEngine> =
            Arc::new(AnnouncedWrites::new(engine, Arc::clone(&revisions)));
        let deciding = Arc::new(RememberingEngine::beside_writer(
            Arc::clone(&engine),
            settings.decision_cache_memory,
            Arc::clone(&revisions),
        ));
        metrics.watch_decision_cache(deciding.clone());
        let metrics = Arc::new(metrics);
        let state = SyncState::new(metrics.clone());
        Sidecar {
            settings,
            client,
            revisions,
            engine,
            deciding,
            metrics,
            state,
        }
    }

    /// Run every part until `cancel` (or until one fails for good, e.g. a resource
    /// type whose scope contradicts its flag). Serves HTTP on `listener`.
    pub(crate) async fn run(
        self,
        listener: TcpListener,
        cancel: CancellationToken,
    ) -> Result<(), SyncError> {
        let cancel = cancel.child_token();
        let shared = self.shared();
        let mut tasks = JoinSet::new();
        self.spawn_server(&mut tasks, listener, &cancel);
        self.spawn_engine_monitor(&mut tasks, &cancel);
        self.spawn_revision_follower(&mut tasks, &cancel);
        // One watch per type, shared by its replicator and the reconciler.
        let watches = watched::TypeWatches::default();
        self.spawn_replicators(&mut tasks, &watches, &shared, &cancel);
        self.spawn_policy_loader(&mut tasks, &shared, &cancel);
        let leader_task = self.spawn_reconciler(&mut tasks, &watches, &shared, &cancel);
        watches.spawn(&mut tasks, &self.client, &self.metrics, &cancel);
        self.log_started();
        let result = supervise(tasks, &cancel).await;
        if let Some(task) = leader_task {
            let _ = task.await;
        }
        result
    }

    /// What the parts share, with every component registered as not yet
    /// in sync.
    fn shared(&self) -> Shared {
        let settings = &self.settings;
        for spec in &settings.replicate {
            self.state.register(&replication::component_name(spec));
        }
        self.state.register(policies::COMPONENT);
        Shared {
            permits: Arc::new(Semaphore::new(settings.workers)),
            trigger: Arc::new(cause::Trigger::default()),
            health: Arc::new(health::ClusterHealth::default()),
            replicated: Arc::new(revision::ReplicatedTypes::default()),
            reads: policies::rego_refs::PolicyReads::default(),
            demand: settings
                .replicate_only_read_types
                .then(|| Arc::new(demand::Demand::default())),
        }
    }

    /// `/metrics`, `/healthz` and `/readyz` on `listener`.
    fn spawn_server(&self, tasks: &mut Tasks, listener: TcpListener, cancel: &CancellationToken) {
        let (metrics, state, revisions, cancel) = (
            self.metrics.clone(),
            self.state.clone(),
            self.revisions.clone(),
            cancel.clone(),
        );
        let peers = self.settings.peers;
        tasks.spawn(async move {
            let addr = listener.local_addr().ok();
            server::serve(listener, metrics, state, revisions, peers, cancel)
                .await
                .map_err(|source| SyncError::Listen {
                    addr: addr.unwrap_or_else(|| std::net::SocketAddr::from(([0, 0, 0, 0], 0))),
                    source,
                })
        });
    }

    /// The watch for engine restarts.
    fn spawn_engine_monitor(&self, tasks: &mut Tasks, cancel: &CancellationToken) {
        let monitor = engine_sync::monitor_engine(
            self.engine.clone(),
            self.state.clone(),
            self.settings.sentinel_path.clone(),
            self.settings.engine_check_interval,
            cancel.clone(),
        );
        tasks.spawn(async move {
            monitor.await;
            Ok(())
        });
    }

    /// Following this process's own revisions, for the remembered decisions.
    fn spawn_revision_follower(&self, tasks: &mut Tasks, cancel: &CancellationToken) {
        let (deciding, cancel) = (self.deciding.clone(), cancel.clone());
        tasks.spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = deciding.follow() => {}
            }
            Ok(())
        });
    }

    /// One replicator per `--replicate` type.
    fn spawn_replicators(
        &self,
        tasks: &mut Tasks,
        watches: &watched::TypeWatches,
        shared: &Shared,
        cancel: &CancellationToken,
    ) {
        let settings = &self.settings;
        let ctx = replication::ReplicatorContext {
            engine: self.engine.clone(),
            metrics: self.metrics.clone(),
            state: self.state.clone(),
            prefix: settings.replicate_path.clone(),
            ignore_namespaces: settings.ignore_namespaces.clone(),
            permits: shared.permits.clone(),
            trigger: shared.trigger.clone(),
            health: shared.health.clone(),
            replicated: shared.replicated.clone(),
            reads: shared.reads.clone(),
            demand: shared.demand.clone(),
        };
        for spec in settings.replicate.clone() {
            let watch = watches.subscribe(
                &spec.gvr,
                replication::need(&spec, &settings.ignore_namespaces),
            );
            tasks.spawn(replication::run_type(
                ctx.clone(),
                spec,
                watch,
                cancel.clone(),
            ));
        }
    }

    /// The loader of the policy and data ConfigMaps.
    fn spawn_policy_loader(&self, tasks: &mut Tasks, shared: &Shared, cancel: &CancellationToken) {
        let settings = &self.settings;
        tasks.spawn(policies::run(
            policies::PolicyLoaderContext {
                client: self.client.clone(),
                engine: self.engine.clone(),
                metrics: self.metrics.clone(),
                state: self.state.clone(),
                selection: settings.configmaps.clone(),
                data_roots: settings.data_roots(),
                permits: shared.permits.clone(),
                trigger: shared.trigger.clone(),
                reads: shared.reads.clone(),
                replicate_root: settings.replicate_root(),
                demand: shared.demand.clone(),
                decision: settings.decision.clone(),
                last_good: settings.last_good_policies.clone(),
                last_good_read_only: settings.last_good_policies_read_only,
                owners: settings.package_owners.clone(),
            },
            cancel.clone(),
        ));
    }

    /// The reconciler, and the leader election it runs under, when this
    /// sidecar writes placements (remediation, the Karmada scheduler or
    /// guardrail, the OCM decider); the election's task, to wait for at
    /// the end.
    fn spawn_reconciler(
        &self,
        tasks: &mut Tasks,
        watches: &watched::TypeWatches,
        shared: &Shared,
        cancel: &CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let settings = &self.settings;
        if !settings.writes_placements() {
            return None;
        }
        let client = &self.client;
        let (leader, leader_task) = leader::elect(
            client.clone(),
            settings.leader.clone(),
            self.metrics.clone(),
            cancel.clone(),
        );
        let recorder = self.recorder();
        let subscriptions = self.subscriptions(watches);
        tasks.spawn(reconcile::run(
            reconcile::ReconcilerContext {
                client: client.clone(),
                engine: self.deciding.clone(),
                metrics: self.metrics.clone(),
                state: self.state.clone(),
                mode: settings.remediation,
                decision: settings.decision.clone(),
                rate: settings.remediation_rate,
                debounce: settings.remediation_debounce,
                scope: settings.scope.clone(),
                guard: blast::Guard {
                    radius: settings.blast_radius,
                    partition: settings.partition,
                    health: shared.health.clone(),
                    held: Default::default(),
                },
                ownership_keys: settings.ownership_keys.clone(),
                policy_configmaps: blast::PolicyConfigMaps {
                    client: client.clone(),
                    selection: settings.configmaps.clone(),
                    recorder: recorder.clone(),
                },
                query_timeout: settings.opa_timeout,
                trigger: shared.trigger.clone(),
                reads: shared.reads.clone(),
                replicated: shared.replicated.clone(),
                applied: leader::AppliedRecord::new(client, settings.leader.as_ref()),
                leader,
                recorder,
                // Its scheduler name is the OCM decider's too
                // (`--scheduler-name`).
                karmada: settings.karmada.clone(),
            },
            subscriptions,
            cancel.clone(),
        ));
        Some(leader_task)
    }

    /// Who the reconciler's Events come from.
    fn recorder(&self) -> Recorder {
        let instance = self
            .settings
            .leader
            .as_ref()
            .map(|l| l.identity.clone())
            .or_else(|| std::env::var("POD_NAME").ok());
        Recorder::new(
            self.client.clone(),
            Reporter {
                controller: "placement-sync".to_owned(),
                instance,
            },
        )
    }

    /// The watches of the reconciler's targets, and of what it reads besides.
    fn subscriptions(&self, watches: &watched::TypeWatches) -> reconcile::Subscriptions {
        let settings = &self.settings;
        let gvr =
            |(group, version, resource): (&str, &str, &str)| Gvr::new(group, version, resource);
        let karmada = settings.karmada.any();
        reconcile::Subscriptions {
            workloads: settings
                .remediate
                .iter()
                .map(|gvr| watches.subscribe(gvr, reconcile::workload_need(&settings.scope)))
                .collect(),
            bindings: match karmada {
                true => reconcile::BINDING_TYPES
                    .into_iter()
                    .map(|t| watches.subscribe(&gvr(t), reconcile::binding_need()))
                    .collect(),
                false => Vec::new(),
            },
            karmada_clusters: (karmada
                && settings
                    .replicate
                    .iter()
                    .any(|spec| spec.gvr == gvr(reconcile::KARMADA_CLUSTERS)))
            .then(|| watches.subscribe(&gvr(reconcile::KARMADA_CLUSTERS), Default::default())),
            propagation_policies: settings.karmada.guard.then(|| {
                reconcile::PROPAGATION_POLICY_TYPES
                    .map(|t| watches.subscribe(&gvr(t), Default::default()))
            }),
            ocm: settings.ocm_decider.as_ref().map(|decider| {
                reconcile::OcmSubscriptions::subscribe(watches, decider.sig_placement_decisions)
            }),
        }
    }

    fn log_started(&self) {
        let settings = &self.settings;
        tracing::info!(
            replicate = settings.replicate.len(),
            policies = %settings.configmaps.describe(),
            remediation = ?settings.remediation,
            karmada_scheduler = settings.karmada.schedule.then_some(settings.karmada.scheduler_name.as_str()),
            karmada_guardrail = settings.karmada.guard,
            ocm_decider = settings.ocm_decider.as_ref().map(|d| d.scheduler_name.as_str()),
            "placement-sync started"
        );
    }
}

/// The sidecar's tasks.
type Tasks = JoinSet<Result<(), SyncError>>;

/// What the parts of one sidecar share.
struct Shared {
    /// Writes to the engine at once (`--workers`).
    permits: Arc<Semaphore>,
    /// Fired, with why, when a policy or the data it reads changed.
    trigger: Arc<cause::Trigger>,
    health: Arc<health::ClusterHealth>,
    replicated: Arc<revision::ReplicatedTypes>,
    /// What the loaded policies read.
    reads: policies::rego_refs::PolicyReads,
    /// With `--replicate-only-read-types`: which types are written.
    demand: Option<Arc<demand::Demand>>,
}

/// Wait for every task; the first to fail (or panic) stops the others, and
/// its error is the result.
async fn supervise(mut tasks: Tasks, cancel: &CancellationToken) -> Result<(), SyncError> {
    let mut result = Ok(());
    while let Some(joined) = tasks.join_next().await {
        let error = match joined {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "placement-sync stopping");
                e
            }
            Err(e) if e.is_panic() => {
                tracing::error!(error = %e, "a placement-sync task panicked; stopping");
                SyncError::TaskPanicked(e.to_string())
            }
            Err(_) => continue,
        };
        if result.is_ok() {
            result = Err(error);
        }
        cancel.cancel();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_task_is_reported_as_a_panic_and_stops_the_others() {
        let cancel = CancellationToken::new();
        let mut tasks = Tasks::new();
        let stopped = cancel.clone();
        tasks.spawn(async move {
            stopped.cancelled().await;
            Ok(())
        });
        tasks.spawn(async { panic!("boom") });
        let result = supervise(tasks, &cancel).await;
        assert!(
            matches!(&result, Err(SyncError::TaskPanicked(message)) if message.contains("panicked")),
            "{result:?}"
        );
        assert!(cancel.is_cancelled());
    }
}
