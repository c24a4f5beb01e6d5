//! Policy ConfigMaps: every data key of a ConfigMap in the policy namespace is
//! one Rego module, loaded under the id `{namespace}/{name}/{key}`, hot-reloaded
//! on change and deleted with its key or ConfigMap. The outcome is written back
//! onto the ConfigMap as the [`STATUS_ANNOTATION`].
//!
//! A module whose new source does not compile keeps its last good version in the
//! engine (OPA rejects the PUT and keeps what it had); after an engine restart
//! the loader puts that last good version back, so a restart does not change
//! which policy is in force.
//!
//! A policy set is whole or not in force: a change after which some module
//! would need a package that no module defines (a module removed, or one
//! added before what it imports), or that removes the decision's module while
//! others stay, or one of several files of a package while leaving the others
//! as they are, is refused the same way, with an error saying why, and the
//! last good set stays. That set is kept in the cluster ([`last_good`]) and
//! read back before the first load, so a restart while a ConfigMap is in
//! error loads it, not nothing. The modules of one change are put
//! dependencies first (the decision last), and so are all modules on a
//! reload after an engine restart, so that no query sees a module before the
//! modules it needs ([`rego_refs`]).
//!
//! Packages have owners ([`owners`]): a change with a module from a
//! namespace that does not own a package the module declares or extends is
//! refused the same way.
//!
//! This module watches the ConfigMaps and writes the outcome back; the
//! engine side of modules is [`modules`], that of data documents [`data`],
//! and both report in the terms of [`status`].

mod data;
pub(crate) mod demand;
pub(crate) mod last_good;
mod modules;
pub(crate) mod owners;
pub(crate) mod rego_refs;
mod rego_writes;
mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use policy_client::configmaps::{ConfigMapKind, ConfigMapSelection};
use policy_client::engine::{EngineError, PolicyEngine};
use serde_json::json;
use tokio::sync::{Notify, Semaphore};

use crate::cause::{Cause, Trigger};
use crate::kube_writes::patch_params;
use tokio_util::sync::CancellationToken;

use crate::engine_sync::SyncState;
use crate::engine_sync::component::{Gate, full_sync_loop};
use crate::error::SyncError;
use crate::metrics::Metrics;
use crate::policies::demand::Demand;
use crate::queue::{KEY_BACKOFF, KeyedQueue};
use data::DataSet;
use last_good::LastGood;
use modules::ModuleSet;
use rego_refs::{DataReads, PolicyReads, data_reads};
use status::{
    KUBE_MGMT_RETRIES_ANNOTATION, KUBE_MGMT_STATUS_ANNOTATION, ModuleSync, PolicyStatus,
    STATUS_ANNOTATION,
};

/// Sync-state component name of the policy loader.
pub(crate) const COMPONENT: &str = "policies";

/// The ConfigMaps watched: one reflector per namespace of the selection, or
/// one over every namespace.
struct Watched {
    stores: Stores,
}

/// A reflector's store per watched namespace (`None`: every namespace).
type Stores = Vec<(Option<String>, Store<ConfigMap>)>;

impl Watched {
    /// The ConfigMap `namespace/name`, if any reflector holds it.
    fn get(&self, key: &str) -> Option<Arc<ConfigMap>> {
        let (namespace, name) = key.split_once('/')?;
        self.stores
            .iter()
            .filter(|(ns, _)| ns.as_deref().is_none_or(|ns| ns == namespace))
            .find_map(|(_, store)| store.get(&ObjectRef::new(name).within(namespace)))
    }

    fn all(&self) -> Vec<Arc<ConfigMap>> {
        self.stores.iter().flat_map(|(_, s)| s.state()).collect()
    }
}

fn key_of(cm: &ConfigMap) -> String {
    format!(
        "{}/{}",
        cm.metadata.namespace.as_deref().unwrap_or_default(),
        cm.name_any()
    )
}

/// The Kubernetes side: ConfigMap watches, status annotations.
struct ConfigMapLoader {
    client: Client,
    selection: ConfigMapSelection,
    watched: Watched,
    modules: ModuleSet,
    data: DataSet,
    /// What each ConfigMap was last loaded as.
    kinds: Mutex<BTreeMap<String, ConfigMapKind>>,
    gate: Gate,
    state: Arc<SyncState>,
    metrics: Arc<Metrics>,
    trigger: Arc<Trigger>,
    engine: Arc<dyn PolicyEngine>,
    reads: PolicyReads,
    /// `--replicate-path` as segments: where the policies read replicated data.
    replicate_root: Vec<String>,
    /// With `--replicate-only-read-types`: the replicated types to write.
    demand: Option<Arc<Demand>>,
    /// Policy changes one at a time: the types one asks for must not be let
    /// go by another before its modules are in.
    serial: tokio::sync::Mutex<()>,
    /// A full sync is loading the policies one ConfigMap after another:
    /// types are let go only once all are in.
    full_syncing: std::sync::atomic::AtomicBool,
    /// Where the last good set is kept in the cluster.
    last_good: Option<LastGood>,
    /// The revision kept there (as last read or written).
    kept_revision: Mutex<Option<String>>,
    /// The kept set was read (once, before the first load).
    last_good_restored: std::sync::atomic::AtomicBool,
}

impl ConfigMapLoader {
    /// Before the first load: take the last good set kept in the cluster as
    /// the one in force, so that a ConfigMap in error (or a refused change)
    /// leaves it, not nothing. Fails (to be retried) when it cannot be read.
    async fn restore_last_good(&self) -> Result<(), SyncError> {
        use std::sync::atomic::Ordering;
        let Some(store) = &self.last_good else {
            return Ok(());
        };
        if self.last_good_restored.load(Ordering::Acquire) {
            return Ok(());
        }
        match store.load().await {
            Ok(Some(kept)) => {
                tracing::info!(modules = kept.modules.len(), revision = %kept.revision, "read the last good policy set kept in the cluster");
                *self.kept_revision.lock() = Some(kept.revision);
                self.modules.restore_last_good(kept.modules);
            }
            Ok(None) => {}
            Err(e @ last_good::LastGoodError::Format(..)) => {
                tracing::error!(error = %e, "the last good policy set kept in the cluster does not load; starting without it");
            }
            Err(e) => return Err(SyncError::Config(e.to_string())),
        }
        self.last_good_restored.store(true, Ordering::Release);
        Ok(())
    }

    /// Keep the set in force in the cluster, when it changed (unless another
    /// sidecar keeps it).
    async fn keep_last_good(&self) {
        let Some(store) = self.last_good.as_ref().filter(|store| !store.read_only) else {
            return;
        };
        let revision = self.modules.revision();
        if self.kept_revision.lock().as_deref() == Some(revision.as_str()) {
            return;
        }
        match store.save(&revision, self.modules.last_good()).await {
            Ok(()) => *self.kept_revision.lock() = Some(revision),
            Err(e) => {
                tracing::warn!(error = %e, "cannot keep the last good policy set in the cluster; a restart while a policy is in error would load the previous one")
            }
        }
    }

    /// ConfigMaps deleted while their removal was refused (it would have
    /// left the set without its decision, or a package in part): tried again
    /// after every change, which may have made them removable.
    async fn retry_removed(&self) -> Result<bool, EngineError> {
        let mut changed = false;
        for key in self.modules.configmaps() {
            if self.watched.get(&key).is_none() {
                changed |= self.modules.sync(&key, None, false).await?.changed;
            }
        }
        Ok(changed)
    }

    /// The engine's policies or data changed: find what the policies now
    /// read of the replicated data, then ask for a remediation pass.
    async fn policy_set_changed(&self) {
        // Every module in the engine counts, also those loaded by someone
        // else (an authorization policy given to OPA as a file, another
        // tool's rules): the decision may import them. When the engine cannot
        // list them, nothing can be ruled out.
        let reads = self.reads_of(&[]).await;
        self.reads.set(reads.clone());
        if let Some(demand) = &self.demand
            && !self.full_syncing.load(std::sync::atomic::Ordering::Acquire)
        {
            demand.settle(reads);
        }
        self.trigger.fire(Cause::Policy(self.revision()));
        self.keep_last_good().await;
    }

    /// The revision of the policy set in force: its modules and data.
    fn revision(&self) -> String {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        context.update(self.modules.revision().as_bytes());
        context.update(&[0]);
        context.update(self.data.revision().as_bytes());
        crate::hex::hex(context.finish().as_ref(), 8)
    }

    /// What the engine's modules and `more` sources read of the replicated
    /// data.
    async fn reads_of(&self, more: &[&str]) -> DataReads {
        let root: Vec<&str> = self.replicate_root.iter().map(String::as_str).collect();
        match self.engine.policies().await {
            Ok(sources) => data_reads(
                sources
                    .values()
                    .map(String::as_str)
                    .chain(more.iter().copied()),
                &root,
            ),
            Err(_) => DataReads::All,
        }
    }

    /// With `--replicate-only-read-types`: before modules with `sources` go
    /// in, have every type they may read written.
    async fn require_data_of(&self, sources: &[&str]) -> Result<(), SyncError> {
        let Some(demand) = &self.demand else {
            return Ok(());
        };
        let reads = self.reads_of(sources).await;
        demand.require(&reads, &self.state).await
    }

    fn data_of(cm: &ConfigMap) -> BTreeMap<String, String> {
        cm.data.clone().unwrap_or_default().into_iter().collect()
    }

    fn kind_of(&self, cm: &ConfigMap) -> Option<ConfigMapKind> {
        if cm.metadata.deletion_timestamp.is_some() {
            return None;
        }
        self.selection.classify(
            cm.metadata.namespace.as_deref().unwrap_or_default(),
            &cm.name_any(),
            cm.metadata.labels.as_ref(),
        )
    }

    /// Bring the engine to ConfigMap `key` (`namespace/name`) as it is now:
    /// loaded as policy or data, unloaded when gone or no longer selected
    /// (a ConfigMap that lost its label), moved when its kind changed.
    async fn sync_configmap(&self, key: &str, reload: bool) -> Result<(), SyncError> {
        let _serial = self.serial.lock().await;
        let cm = self.watched.get(key);
        let kind = cm.as_deref().and_then(|cm| self.kind_of(cm));
        let data = cm.as_deref().map(Self::data_of);
        if kind == Some(ConfigMapKind::Policy)
            && let Some(data) = &data
        {
            let sources: Vec<&str> = data.values().map(String::as_str).collect();
            self.require_data_of(&sources).await?;
        }
        let previous = self.kinds.lock().get(key).copied();
        let mut changed = false;
        let mut fail = |e: EngineError| {
            self.metrics.write_error(COMPONENT, e.kind());
            SyncError::from(e)
        };
        if previous == Some(ConfigMapKind::Policy) && kind != Some(ConfigMapKind::Policy) {
            changed |= self
                .modules
                .sync(key, None, false)
                .await
                .map_err(&mut fail)?
                .changed;
        }
        if previous == Some(ConfigMapKind::Data) && kind != Some(ConfigMapKind::Data) {
            changed |= self
                .data
                .sync(key, None, false)
                .await
                .map_err(&mut fail)?
                .changed;
        }
        let outcome = match kind {
            Some(ConfigMapKind::Policy) => Some(
                self.modules
                    .sync(key, data.as_ref(), reload)
                    .await
                    .map_err(&mut fail)?,
            ),
            Some(ConfigMapKind::Data) => Some(
                self.data
                    .sync(key, data.as_ref(), reload)
                    .await
                    .map_err(&mut fail)?,
            ),
            None => None,
        };
        {
            let mut kinds = self.kinds.lock();
            match kind {
                Some(kind) => kinds.insert(key.to_owned(), kind),
                None => kinds.remove(key),
            };
        }
        self.update_gauges();
        if let Some(outcome) = &outcome {
            changed |= outcome.changed;
        }
        if changed {
            self.retry_removed().await.map_err(&mut fail)?;
            self.update_gauges();
            self.metrics.write_ok(COMPONENT, "put_policy");
            self.policy_set_changed().await;
        }
        if let (
            Some(cm),
            Some(ModuleSync {
                status: Some(status),
                ..
            }),
        ) = (cm, outcome)
        {
            self.write_status(&cm, &status).await?;
        }
        Ok(())
    }

    /// Ours and kube-mgmt's status annotations, when they differ from what the
    /// ConfigMap says already.
    async fn write_status(&self, cm: &ConfigMap, status: &PolicyStatus) -> Result<(), SyncError> {
        let ours = status.to_annotation();
        let kube_mgmt = status.to_kube_mgmt_annotation();
        let current = cm.annotations();
        if current.get(STATUS_ANNOTATION) == Some(&ours)
            && current.get(KUBE_MGMT_STATUS_ANNOTATION) == Some(&kube_mgmt)
            && current
                .get(KUBE_MGMT_RETRIES_ANNOTATION)
                .map(String::as_str)
                == Some("0")
        {
            return Ok(());
        }
        let patch = json!({"metadata": {"annotations": {
            STATUS_ANNOTATION: ours,
            KUBE_MGMT_STATUS_ANNOTATION: kube_mgmt,
            KUBE_MGMT_RETRIES_ANNOTATION: "0",
        }}});
        let api: Api<ConfigMap> = Api::namespaced(
            self.client.clone(),
            cm.metadata.namespace.as_deref().unwrap_or_default(),
        );
        match api
            .patch(&cm.name_any(), &patch_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn update_gauges(&self) {
        let (loaded, failed) = self.modules.counts();
        self.metrics.policies_loaded.set(loaded as i64);
        self.metrics.policies_failed.set(failed as i64);
    }

    async fn sync_single(&self, key: String) -> Result<(), SyncError> {
        let Some(_single) = self.gate.single(self.state.epoch()).await else {
            return Ok(());
        };
        self.sync_configmap(&key, false).await
    }

    async fn full_sync(&self, epoch: u64) -> Result<(), SyncError> {
        use std::sync::atomic::Ordering;
        let _full = self.gate.full().await;
        self.restore_last_good().await?;
        self.full_syncing.store(true, Ordering::Release);
        let result = self.load_everything(epoch).await;
        self.full_syncing.store(false, Ordering::Release);
        // After a failure, what was asked for stays asked for: modules that
        // went in may read it.
        if result.is_ok()
            && let Some(demand) = &self.demand
        {
            demand.settle(self.reads.get());
        }
        result
    }

    async fn load_everything(&self, epoch: u64) -> Result<(), SyncError> {
        let current = self.watched.all();
        // Data first, then policies in dependency order: OPA lost everything,
        // and queries go on while it is filled again.
        let mut data = BTreeSet::new();
        let mut policies: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for cm in &current {
            match self.kind_of(cm) {
                Some(ConfigMapKind::Data) => {
                    data.insert(key_of(cm));
                }
                Some(ConfigMapKind::Policy) => {
                    policies.insert(key_of(cm), Self::data_of(cm));
                }
                None => {}
            }
        }
        // Every type any of them reads, written at once (not one
        // ConfigMap's types after another).
        let sources: Vec<&str> = policies
            .values()
            .flat_map(|modules| modules.values().map(String::as_str))
            .collect();
        self.require_data_of(&sources).await?;
        let mut keys: Vec<String> = data.into_iter().collect();
        keys.extend(self.modules.configmap_order(&policies));
        // What is on record but no longer selected or there: unload.
        let known: BTreeSet<String> = self
            .kinds
            .lock()
            .keys()
            .cloned()
            .chain(self.modules.configmaps())
            .chain(self.data.configmaps())
            .collect();
        let listed: BTreeSet<String> = keys.iter().cloned().collect();
        keys.extend(known.into_iter().filter(|k| !listed.contains(k)));
        for key in &keys {
            self.sync_configmap(key, true).await?;
        }
        if self.modules.remove_orphans().await? {
            self.policy_set_changed().await;
        }
        self.gate.set_loaded(epoch);
        tracing::info!(configmaps = keys.len(), "policies and data loaded");
        Ok(())
    }
}

/// Everything the ConfigMap loader needs.
#[derive(Clone)]
pub(crate) struct PolicyLoaderContext {
    pub(crate) client: Client,
    pub(crate) engine: Arc<dyn PolicyEngine>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) state: Arc<SyncState>,
    pub(crate) selection: ConfigMapSelection,
    /// Top-level `data` names of replicated data (not packages).
    pub(crate) data_roots: Vec<String>,
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) trigger: Arc<Trigger>,
    pub(crate) reads: PolicyReads,
    pub(crate) replicate_root: Vec<String>,
    pub(crate) demand: Option<Arc<Demand>>,
    /// The decision path (its package is never removed alone).
    pub(crate) decision: String,
    /// Where the last good set is kept (`namespace`, `name`).
    pub(crate) last_good: Option<(String, String)>,
    /// The last good set is only read here (another sidecar writes it).
    pub(crate) last_good_read_only: bool,
    /// Who may write which packages.
    pub(crate) owners: owners::PackageOwners,
}

/// Watch the policy and data ConfigMaps and keep the engine equal to them
/// until `cancel`.
pub(crate) async fn run(
    ctx: PolicyLoaderContext,
    cancel: CancellationToken,
) -> Result<(), SyncError> {
    let namespaces: Vec<Option<String>> = match ctx.selection.watched_namespaces() {
        Some(namespaces) => namespaces.into_iter().map(Some).collect(),
        None => vec![None],
    };
    let (stores, streams) = watch(&ctx.client, &namespaces);
    if ctx.owners.namespaces().is_empty() {
        tracing::warn!(packages = ?ctx.owners.packages(), "no namespace may write the owned packages (no --policy-namespace, no --package-owner-namespaces): a module declaring or extending one is refused");
    }
    let loader = Arc::new(ConfigMapLoader::new(&ctx, &namespaces, stores.clone()));
    let queue = {
        let loader = loader.clone();
        KeyedQueue::new(
            COMPONENT,
            move |key: String| {
                let loader = loader.clone();
                async move { loader.sync_single(key).await }
            },
            ctx.permits.clone(),
            KEY_BACKOFF,
            cancel.clone(),
        )
    };
    let relist = Arc::new(Notify::new());
    let full = spawn_full_sync(&ctx, loader, &stores, relist.clone(), &cancel);
    follow(
        streams,
        |key| queue.push(key),
        &relist,
        &ctx.metrics,
        &cancel,
    )
    .await;
    let _ = full.await;
    Ok(())
}

type ConfigMapEvents =
    futures::stream::BoxStream<'static, watcher::Result<watcher::Event<ConfigMap>>>;

/// A reflector per namespace (`None`: every namespace) and its event stream.
fn watch(client: &Client, namespaces: &[Option<String>]) -> (Stores, Vec<ConfigMapEvents>) {
    let mut stores = Vec::new();
    let mut streams = Vec::new();
    for namespace in namespaces {
        let api: Api<ConfigMap> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let (store, writer) = reflector::store::<ConfigMap>();
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(|cm: &mut ConfigMap| cm.metadata.managed_fields = None)
            .reflect(writer);
        stores.push((namespace.clone(), store));
        streams.push(stream.boxed());
    }
    (stores, streams)
}

impl ConfigMapLoader {
    /// The loader of `ctx`, over the ConfigMaps of `namespaces` that `stores`
    /// hold.
    fn new(ctx: &PolicyLoaderContext, namespaces: &[Option<String>], stores: Stores) -> Self {
        // Data ConfigMaps land at data.<namespace>: data, not packages.
        let mut data_roots = ctx.data_roots.clone();
        data_roots.extend(namespaces.iter().flatten().cloned());
        ConfigMapLoader {
            client: ctx.client.clone(),
            modules: ModuleSet::new(
                namespaces.iter().flatten().cloned().collect(),
                ctx.engine.clone(),
                data_roots,
                &ctx.decision,
                ctx.owners.clone(),
            ),
            data: DataSet::new(ctx.engine.clone(), ctx.owners.clone()),
            selection: ctx.selection.clone(),
            watched: Watched { stores },
            kinds: Mutex::new(BTreeMap::new()),
            gate: Gate::default(),
            state: ctx.state.clone(),
            metrics: ctx.metrics.clone(),
            trigger: ctx.trigger.clone(),
            engine: ctx.engine.clone(),
            reads: ctx.reads.clone(),
            replicate_root: ctx.replicate_root.clone(),
            demand: ctx.demand.clone(),
            serial: tokio::sync::Mutex::new(()),
            full_syncing: std::sync::atomic::AtomicBool::new(false),
            last_good: ctx.last_good.as_ref().map(|(namespace, name)| LastGood {
                api: Api::namespaced(ctx.client.clone(), namespace),
                namespace: namespace.clone(),
                name: name.clone(),
                read_only: ctx.last_good_read_only,
            }),
            kept_revision: Mutex::new(None),
            last_good_restored: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

/// The full syncs of `loader`: once every store has listed, and again on
/// every relist, after the replicated data is in.
fn spawn_full_sync(
    ctx: &PolicyLoaderContext,
    loader: Arc<ConfigMapLoader>,
    stores: &Stores,
    relist: Arc<Notify>,
    cancel: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let state = ctx.state.clone();
    let ready: Vec<Store<ConfigMap>> = stores.iter().map(|(_, s)| s.clone()).collect();
    tokio::spawn(full_sync_loop(
        COMPONENT.to_owned(),
        ctx.state.clone(),
        async move {
            for store in ready {
                let _ = store.wait_until_ready().await;
            }
        },
        relist,
        move |epoch| {
            let (loader, state) = (loader.clone(), state.clone());
            async move {
                // Replicated data first, policies last: until the policies
                // are in, a restarted engine answers "undefined" rather
                // than deciding on partial data.
                state.wait_loaded_except(COMPONENT, epoch).await;
                loader.full_sync(epoch).await
            }
        },
        cancel.clone(),
    ))
}

/// Follow the watches until `cancel` or their end: each changed ConfigMap's
/// key to `push`, a relist (a list after the first of every watch) to
/// `relist`.
async fn follow(
    streams: Vec<ConfigMapEvents>,
    push: impl Fn(String),
    relist: &Notify,
    metrics: &Metrics,
    cancel: &CancellationToken,
) {
    let watches = streams.len();
    let mut stream = futures::stream::select_all(streams);
    let mut listed = 0usize;
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = cancel.cancelled() => break,
        };
        match event {
            Some(Ok(watcher::Event::Apply(cm) | watcher::Event::Delete(cm))) => push(key_of(&cm)),
            Some(Ok(watcher::Event::InitDone)) => {
                // Every watch lists once at start; a later list is a relist.
                listed += 1;
                if listed > watches {
                    relist.notify_one();
                }
            }
            Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
            Some(Err(e)) => {
                metrics.watch_error(COMPONENT);
                tracing::warn!(error = %e, "ConfigMap watch error; the watch recovers by itself");
            }
            None => break,
        }
    }
}
