//! `placement-sync`: the sidecar that runs beside the policy engine (OPA). One
//! folder per job:
//!
//! - `replication`: replicates Kubernetes objects of configured types into
//!   the engine, from one shared watch per type;
//! - `policies`: loads Rego modules (and data documents) from the ConfigMaps
//!   of the policy namespace, with hot reload and a status annotation;
//! - `engine_sync`: notices engine restarts and has every component reload,
//!   tracking whether the engine is in sync;
//! - `reconcile`: on one elected replica, keeps existing workloads placed by
//!   the current policy (remediation, behind the blast-radius guard),
//!   schedules Karmada bindings that name it as their scheduler and decides
//!   the OCM Placements that opt in;
//! - `server`: serves `/metrics`, `/healthz` and `/readyz`.
//!
//! The binary parses [`Args`], builds [`Settings`] and calls [`run`]; nothing
//! else is public.

#![deny(unreachable_pub)]

mod cause;
mod config;
mod engine_sync;
mod error;
mod gvr;
mod hex;
mod metrics;
mod policies;
mod queue;
mod reconcile;
mod replication;
mod scope;
mod server;

use std::sync::Arc;

use kube::runtime::events::{Recorder, Reporter};
use policy_client::{AnnouncedWrites, Opa, OpaConfig, PolicyEngine, RevisionBoard};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use config::{Args, Settings};
pub use error::SyncError;

use config::RemediationMode;
use engine_sync::SyncState;
use gvr::Gvr;
use metrics::Metrics;
use policies::demand;
use reconcile::{blast, leader};
use replication::{health, revision, watched};

/// Build the Kubernetes client: `--kubeconfig` when given, else in-cluster config
/// or `KUBECONFIG`/`~/.kube/config`.
async fn kube_client(settings: &Settings) -> Result<kube::Client, SyncError> {
    use policy_client::kube_client::{KubeClientError, client};
    client(settings.kubeconfig.as_deref())
        .await
        .map_err(|e| match e {
            KubeClientError::Client(e) => SyncError::Kube(e),
            e => SyncError::KubeConfig(e.to_string()),
        })
}

/// Build the OPA client from the settings.
fn opa_engine(settings: &Settings) -> Result<Opa, SyncError> {
    let mut config = OpaConfig::new(settings.opa_url.clone());
    config.token = settings.opa_token.clone();
    config.ca_pem = settings.opa_ca_pem.clone();
    config.insecure = settings.opa_allow_insecure;
    config.request_timeout = settings.opa_timeout;
    Ok(Opa::new(config)?)
}

/// Bind the HTTP listener of `--listen`.
async fn bind(settings: &Settings) -> Result<TcpListener, SyncError> {
    TcpListener::bind(settings.listen)
        .await
        .map_err(|source| SyncError::Listen {
            addr: settings.listen,
            source,
        })
}

/// Build everything from the settings and run until `cancel`.
pub async fn run(settings: Settings, cancel: CancellationToken) -> Result<(), SyncError> {
    let client = kube_client(&settings).await?;
    let engine: Arc<dyn PolicyEngine> = Arc::new(opa_engine(&settings)?);
    let listener = bind(&settings).await?;
    Sidecar::new(settings, client, engine)
        .run(listener, cancel)
        .await
}

/// One sidecar instance: its settings, clients and shared state.
struct Sidecar {
    settings: Settings,
    client: kube::Client,
    /// Every write to `engine` is announced here first.
    revisions: Arc<RevisionBoard>,
    engine: Arc<dyn PolicyEngine>,
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
        let metrics = Arc::new(Metrics::new());
        let state = SyncState::new(metrics.clone());
        let revisions = Arc::new(RevisionBoard::new());
        let engine = Arc::new(AnnouncedWrites::new(engine, Arc::clone(&revisions)));
        Sidecar {
            settings,
            client,
            revisions,
            engine,
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
        let Sidecar {
            settings,
            client,
            revisions,
            engine,
            metrics,
            state,
        } = self;
        let cancel = cancel.child_token();
        let permits = Arc::new(Semaphore::new(settings.workers));
        let trigger = Arc::new(cause::Trigger::default());
        let health = Arc::new(health::ClusterHealth::default());
        let replicated = Arc::new(revision::ReplicatedTypes::default());
        let reads = policies::rego_refs::PolicyReads::default();
        let demand = settings
            .replicate_only_read_types
            .then(|| Arc::new(demand::Demand::default()));
        for spec in &settings.replicate {
            state.register(&replication::component_name(spec));
        }
        state.register(policies::COMPONENT);

        let mut tasks: JoinSet<Result<(), SyncError>> = JoinSet::new();
        {
            let (metrics, state, cancel) = (metrics.clone(), state.clone(), cancel.clone());
            tasks.spawn(async move {
                let addr = listener.local_addr().ok();
                server::serve(listener, metrics, state, revisions, cancel)
                    .await
                    .map_err(|source| SyncError::Listen {
                        addr: addr.unwrap_or_else(|| std::net::SocketAddr::from(([0, 0, 0, 0], 0))),
                        source,
                    })
            });
        }
        {
            let monitor = engine_sync::monitor_engine(
                engine.clone(),
                state.clone(),
                settings.sentinel_path.clone(),
                settings.engine_check_interval,
                cancel.clone(),
            );
            tasks.spawn(async move {
                monitor.await;
                Ok(())
            });
        }

        // One watch per type, shared by its replicator and the remediator.
        let watches = watched::TypeWatches::default();
        let replicator_ctx = replication::ReplicatorContext {
            engine: engine.clone(),
            metrics: metrics.clone(),
            state: state.clone(),
            prefix: settings.replicate_path.clone(),
            ignore_namespaces: settings.ignore_namespaces.clone(),
            permits: permits.clone(),
            trigger: trigger.clone(),
            health: health.clone(),
            replicated: replicated.clone(),
            reads: reads.clone(),
            demand: demand.clone(),
        };
        for spec in settings.replicate.clone() {
            let watch = watches.subscribe(
                &spec.gvr,
                replication::need(&spec, &settings.ignore_namespaces),
            );
            tasks.spawn(replication::run_type(
                replicator_ctx.clone(),
                spec,
                watch,
                cancel.clone(),
            ));
        }
        tasks.spawn(policies::run(
            policies::PolicyLoaderContext {
                client: client.clone(),
                engine: engine.clone(),
                metrics: metrics.clone(),
                state: state.clone(),
                selection: settings.configmaps.clone(),
                data_roots: settings
                    .replicate_path
                    .split('/')
                    .next()
                    .map(str::to_owned)
                    .into_iter()
                    .collect(),
                permits: permits.clone(),
                trigger: trigger.clone(),
                reads: reads.clone(),
                replicate_root: settings
                    .replicate_path
                    .split('/')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
                demand,
                decision: settings.decision.clone(),
                last_good: settings.last_good_policies.clone(),
                last_good_read_only: settings.last_good_policies_read_only,
            },
            cancel.clone(),
        ));

        let mut leader_task = None;
        if settings.remediation != RemediationMode::Off
            || settings.karmada.any()
            || settings.ocm_decider.is_some()
        {
            let (leader, task) = leader::elect(
                client.clone(),
                settings.leader.clone(),
                metrics.clone(),
                cancel.clone(),
            );
            leader_task = Some(task);
            let instance = settings
                .leader
                .as_ref()
                .map(|l| l.identity.clone())
                .or_else(|| std::env::var("POD_NAME").ok());
            let recorder = Recorder::new(
                client.clone(),
                Reporter {
                    controller: "placement-sync".to_owned(),
                    instance,
                },
            );
            let gvr =
                |(group, version, resource): (&str, &str, &str)| Gvr::new(group, version, resource);
            let subscriptions = reconcile::Subscriptions {
                workloads: settings
                    .remediate
                    .iter()
                    .map(|gvr| watches.subscribe(gvr, reconcile::workload_need(&settings.scope)))
                    .collect(),
                bindings: match settings.karmada.any() {
                    true => reconcile::BINDING_TYPES
                        .into_iter()
                        .map(|t| watches.subscribe(&gvr(t), reconcile::binding_need()))
                        .collect(),
                    false => Vec::new(),
                },
                karmada_clusters: (settings.karmada.any()
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
                    reconcile::OcmSubscriptions::subscribe(
                        &watches,
                        decider.sig_placement_decisions,
                    )
                }),
            };
            tasks.spawn(reconcile::run(
                reconcile::ReconcilerContext {
                    client: client.clone(),
                    engine: engine.clone(),
                    metrics: metrics.clone(),
                    state: state.clone(),
                    mode: settings.remediation,
                    decision: settings.decision.clone(),
                    rate: settings.remediation_rate,
                    debounce: settings.remediation_debounce,
                    scope: settings.scope.clone(),
                    guard: blast::Guard {
                        radius: settings.blast_radius,
                        partition: settings.partition,
                        health: health.clone(),
                        held: Default::default(),
                    },
                    ownership_keys: settings.ownership_keys.clone(),
                    policy_configmaps: blast::PolicyConfigMaps {
                        client: client.clone(),
                        selection: settings.configmaps.clone(),
                        recorder: recorder.clone(),
                    },
                    query_timeout: settings.opa_timeout,
                    trigger: trigger.clone(),
                    reads: reads.clone(),
                    replicated: replicated.clone(),
                    applied: leader::AppliedRecord::new(&client, settings.leader.as_ref()),
                    leader,
                    recorder,
                    // Its scheduler name is the OCM decider's too
                    // (`--scheduler-name`).
                    karmada: settings.karmada.clone(),
                },
                subscriptions,
                cancel.clone(),
            ));
        }
        watches.spawn(&mut tasks, &client, &metrics, &cancel);
        tracing::info!(
            replicate = settings.replicate.len(),
            policies = %settings.configmaps.describe(),
            remediation = ?settings.remediation,
            karmada_scheduler = settings.karmada.schedule.then_some(settings.karmada.scheduler_name.as_str()),
            karmada_guardrail = settings.karmada.guard,
            ocm_decider = settings.ocm_decider.as_ref().map(|d| d.scheduler_name.as_str()),
            "placement-sync started"
        );

        let mut result = Ok(());
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "placement-sync stopping");
                    if result.is_ok() {
                        result = Err(e);
                    }
                    cancel.cancel();
                }
                Err(e) if e.is_panic() => {
                    tracing::error!(error = %e, "a placement-sync task panicked; stopping");
                    if result.is_ok() {
                        result = Err(SyncError::Config(format!("internal task panicked: {e}")));
                    }
                    cancel.cancel();
                }
                Err(_) => {}
            }
        }
        if let Some(task) = leader_task {
            let _ = task.await;
        }
        result
    }
}
