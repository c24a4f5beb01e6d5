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
//! last good set stays. That set is kept in the cluster ([`crate::policies::last_good`])
//! and read back before the first load, so a restart while a ConfigMap is in
//! error loads it, not nothing. The modules of one change
//! are put dependencies first (the decision last), and so are all modules on a
//! reload after an engine restart, so that no query sees a module before the
//! modules it needs ([`crate::policies::rego_refs`]).

pub mod data;
pub(crate) mod last_good;
pub mod rego_refs;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use policy_client::{CompileError, EngineError, PolicyEngine};
use serde::Serialize;
use serde_json::json;
use tokio::sync::{Notify, Semaphore};

use crate::reconcile::cause::{Cause, Trigger};
use tokio_util::sync::CancellationToken;

use crate::engine_sync::SyncState;
use crate::engine_sync::component::{Gate, full_sync_loop};
use crate::error::SyncError;
use crate::metrics::Metrics;
use crate::policies::data::DataSet;
use crate::policies::last_good::LastGood;
use crate::queue::{Backoff, KeyedQueue};
use crate::replication::demand::Demand;
use policy_client::configmaps::{ConfigMapKind, ConfigMapSelection};
use rego_refs::{DataReads, PolicyReads, data_reads};

/// Annotation on a policy ConfigMap with the load outcome of its modules.
pub const STATUS_ANNOTATION: &str = "placement-policy.io/policy-status";

/// Sync-state component name of the policy loader.
pub const COMPONENT: &str = "policies";

/// Field manager used for the status annotation.
const FIELD_MANAGER: &str = "placement-sync";

/// Engine id of the module in data key `key` of ConfigMap `namespace/name`.
pub fn module_id(namespace: &str, name: &str, key: &str) -> String {
    format!("{namespace}/{name}/{key}")
}

/// The value of the [`STATUS_ANNOTATION`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum PolicyStatus {
    /// Every module of the ConfigMap compiled and is loaded.
    Ok,
    /// At least one module did not compile; `errors` locate each problem
    /// (`file` is the module id).
    Error { errors: Vec<CompileError> },
}

impl PolicyStatus {
    /// kube-mgmt's form: `{"status":"ok"}`, or `{"status":"error","error":E}`
    /// where `E` is the error itself when there is one and a list otherwise
    /// (kube-mgmt's own shape, kept for the tools that parse it).
    pub fn to_kube_mgmt_annotation(&self) -> String {
        match self {
            PolicyStatus::Ok => r#"{"status":"ok"}"#.to_owned(),
            PolicyStatus::Error { errors } => match errors.as_slice() {
                [one] => json!({"status": "error", "error": one}).to_string(),
                many => json!({"status": "error", "error": many}).to_string(),
            },
        }
    }

    /// The annotation text: compact JSON, stable for equal content so an
    /// unchanged outcome is never written again.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| r#"{"status":"error"}"#.to_owned())
    }

    /// The status of a ConfigMap from the outcome of each of its modules.
    pub fn from_outcomes<'a>(
        outcomes: impl IntoIterator<Item = &'a Result<(), Vec<CompileError>>>,
    ) -> Self {
        let errors: Vec<CompileError> = outcomes
            .into_iter()
            .filter_map(|o| o.as_ref().err())
            .flatten()
            .cloned()
            .collect();
        if errors.is_empty() {
            PolicyStatus::Ok
        } else {
            PolicyStatus::Error { errors }
        }
    }
}

/// What the loader knows about one module.
#[derive(Debug, Clone)]
struct ModuleRecord {
    /// The source most recently attempted (the ConfigMap's current value).
    source: String,
    outcome: Result<(), Vec<CompileError>>,
    /// The last source the engine accepted.
    last_good: Option<String>,
}

/// Result of syncing the modules of one ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleSync {
    /// Whether the engine's policy set changed (a module was put or deleted).
    pub changed: bool,
    /// Outcome for the ConfigMap (`None` when it is gone).
    pub status: Option<PolicyStatus>,
}

/// The engine side of the policy loader: which modules are loaded and how.
/// Independent of Kubernetes, so it is tested against the embedded engine.
#[derive(Debug)]
pub struct ModuleSet {
    /// Namespaces whose modules no ConfigMap holds are ours to remove (the
    /// policy namespace and listed namespaces; never "every namespace").
    owned_namespaces: Vec<String>,
    engine: Arc<dyn PolicyEngine>,
    /// Top-level `data` names that hold replicated data, not packages.
    data_roots: Vec<String>,
    /// The decision's package (dotted): a set that still has modules keeps it.
    decision: String,
    records: Mutex<BTreeMap<String, ModuleRecord>>,
}

impl ModuleSet {
    /// `decision`: the decision path (`io/k8s/federation/admission`).
    pub fn new(
        owned_namespaces: Vec<String>,
        engine: Arc<dyn PolicyEngine>,
        data_roots: Vec<String>,
        decision: &str,
    ) -> Self {
        ModuleSet {
            owned_namespaces,
            engine,
            data_roots,
            decision: decision.trim_matches('/').replace('/', "."),
            records: Mutex::new(BTreeMap::new()),
        }
    }

    /// Take `modules` (id -> source) as the last good set, before anything
    /// is loaded (a restarted sidecar, from the set kept in the cluster):
    /// each ConfigMap's current source is tried first, and where it fails or
    /// would leave the set incomplete, these stay in force.
    pub fn seed(&self, modules: BTreeMap<String, String>) {
        let mut records = self.records();
        for (id, source) in modules {
            records.entry(id).or_insert_with(|| ModuleRecord {
                source: source.clone(),
                outcome: Ok(()),
                last_good: Some(source),
            });
        }
    }

    /// The modules in force, each one's accepted source (what the set kept in
    /// the cluster holds).
    pub fn last_good(&self) -> BTreeMap<String, String> {
        self.in_force()
    }

    fn records(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ModuleRecord>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Module ids of ConfigMap `key` (`namespace/name`) start with this.
    fn prefix(&self, key: &str) -> String {
        format!("{key}/")
    }

    /// `(loaded, failed)`: modules in force, and modules whose current source fails.
    pub fn counts(&self) -> (usize, usize) {
        let records = self.records();
        let failed = records.values().filter(|r| r.outcome.is_err()).count();
        let loaded = records
            .values()
            .filter(|r| r.outcome.is_ok() || r.last_good.is_some())
            .count();
        (loaded, failed)
    }

    /// The revision of the modules in force: a digest of their ids and
    /// sources.
    pub fn revision(&self) -> String {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        for (id, source) in self.in_force() {
            for part in [id.as_bytes(), source.as_bytes()] {
                context.update(&(part.len() as u64).to_be_bytes());
                context.update(part);
            }
        }
        crate::reconcile::cause::hex(context.finish().as_ref(), 8)
    }

    /// The modules in force: each one's accepted source.
    fn in_force(&self) -> BTreeMap<String, String> {
        self.records()
            .iter()
            .filter_map(|(id, r)| {
                let source = match &r.outcome {
                    Ok(()) => Some(&r.source),
                    Err(_) => r.last_good.as_ref(),
                };
                source.map(|s| (id.clone(), s.clone()))
            })
            .collect()
    }

    /// Why the set may not become what it is after ConfigMap `name` becomes
    /// `desired`, if it may not: a module would need a package that no module
    /// defines (and none needs now), or the change removes the decision while
    /// other modules stay, or one file of a package whose other files it
    /// leaves as they are.
    fn refusals(
        &self,
        name: &str,
        desired: &BTreeMap<String, &String>,
    ) -> (BTreeMap<String, String>, Vec<CompileError>) {
        let now = self.in_force();
        let prefix = self.prefix(name);
        let mut after: BTreeMap<String, String> = now
            .iter()
            .filter(|(id, _)| !id.starts_with(&prefix))
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect();
        after.extend(desired.iter().map(|(id, s)| (id.clone(), (*s).clone())));
        let before: Vec<String> = rego_refs::missing_packages(&now, &self.data_roots)
            .into_iter()
            .map(|m| m.package)
            .collect();
        let refused = |module: String, code: &str, message: String| CompileError {
            file: Some(module),
            row: None,
            col: None,
            code: Some(code.to_owned()),
            message,
        };
        let mut errors: Vec<CompileError> = rego_refs::missing_packages(&after, &self.data_roots)
            .into_iter()
            .filter(|m| !before.contains(&m.package))
            .map(|m| refused(m.module, "missing_package", format!(
                "needs package {} (data.{}), which no loaded module defines; the last good policy set stays in force",
                m.package, m.package
            )))
            .collect();
        for removal in rego_refs::refused_removals(&now, &after, &self.decision) {
            errors.push(match removal.reason {
                rego_refs::RemovalReason::Decision { remaining } => refused(
                    removal.module,
                    "removes_decision",
                    format!(
                        "removing it removes the decision package {} while {remaining} other module(s) stay, so no query would find a decision; the last good policy set stays in force (remove every module to remove the policy)",
                        removal.package
                    ),
                ),
                rego_refs::RemovalReason::PartOfPackage { remaining } => refused(
                    removal.module,
                    "removes_part_of_package",
                    format!(
                        "removing it leaves package {} with {remaining} other file(s) this change does not touch; the last good policy set stays in force (remove the package whole, or change its other files in the same edit)",
                        removal.package
                    ),
                ),
            });
        }
        (after, errors)
    }

    /// The order to load ConfigMaps `names` in so that no module arrives
    /// before the modules it needs (by their current data `sources`).
    pub fn configmap_order(
        &self,
        sources: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> Vec<String> {
        let all: BTreeMap<String, String> = sources
            .iter()
            .flat_map(|(cm, data)| {
                data.iter()
                    .map(move |(key, source)| (format!("{cm}/{key}"), source.clone()))
            })
            .collect();
        let order = rego_refs::load_order(&all);
        let mut names: Vec<String> = sources.keys().cloned().collect();
        let position = |name: &String| {
            let prefix = self.prefix(name);
            order
                .iter()
                .position(|id| id.starts_with(&prefix))
                .unwrap_or(usize::MAX)
        };
        names.sort_by_key(position);
        names
    }

    /// ConfigMaps (`namespace/name`) that have modules on record.
    pub fn configmaps(&self) -> BTreeSet<String> {
        self.records()
            .keys()
            .filter_map(|id| id.rsplit_once('/').map(|(key, _)| key.to_owned()))
            .collect()
    }

    /// Bring the engine's modules of ConfigMap `name` to `data` (`None`: the
    /// ConfigMap is gone). With `reload`, every module is put again, because the
    /// engine may have lost them; a module that fails then gets its last good
    /// version back. Transient engine errors abort with `Err` (retry later); the
    /// modules done so far stay recorded.
    pub async fn sync(
        &self,
        name: &str,
        data: Option<&BTreeMap<String, String>>,
        reload: bool,
    ) -> Result<ModuleSync, EngineError> {
        let prefix = self.prefix(name);
        let mut changed = false;
        let desired: BTreeMap<String, &String> = data
            .into_iter()
            .flatten()
            .map(|(key, source)| (format!("{prefix}{key}"), source))
            .collect();
        let (after, refused) = self.refusals(name, &desired);
        if !refused.is_empty() {
            return self.refuse(name, data, &desired, refused, reload).await;
        }
        // Dependencies first, so that no query sees a module before what it needs.
        let order = rego_refs::load_order(&after);
        let mut puts: Vec<(&String, &&String)> = desired.iter().collect();
        puts.sort_by_key(|(id, _)| order.iter().position(|o| o == *id));
        for (id, source) in puts {
            let previous = self.records().get(id).cloned();
            if !reload
                && previous
                    .as_ref()
                    .is_some_and(|p| &&p.source == source && p.outcome.is_ok())
            {
                continue;
            }
            let last_good = previous.and_then(|p| p.last_good);
            let record = match self.engine.put_policy(id, source).await {
                Ok(()) => {
                    changed = true;
                    tracing::info!(module = %id, "policy module loaded");
                    ModuleRecord {
                        source: (*source).clone(),
                        outcome: Ok(()),
                        last_good: Some((*source).clone()),
                    }
                }
                Err(EngineError::Compile(errors)) => {
                    tracing::warn!(module = %id, errors = %errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "), "policy module does not compile; the previous version stays in force");
                    if reload && let Some(good) = last_good.as_ref().filter(|g| g != source) {
                        match self.engine.put_policy(id, good).await {
                            Ok(()) => changed = true,
                            Err(EngineError::Compile(_)) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    ModuleRecord {
                        source: (*source).clone(),
                        outcome: Err(errors),
                        last_good,
                    }
                }
                Err(e) => return Err(e),
            };
            self.records().insert(id.clone(), record);
        }
        let removed: Vec<String> = self
            .records()
            .keys()
            .filter(|id| id.starts_with(&prefix) && !desired.contains_key(*id))
            .cloned()
            .collect();
        for id in removed {
            self.engine.delete_policy(&id).await?;
            self.records().remove(&id);
            changed = true;
            tracing::info!(module = %id, "policy module removed");
        }
        let status = data.map(|_| {
            let records = self.records();
            PolicyStatus::from_outcomes(
                desired
                    .keys()
                    .filter_map(|id| records.get(id).map(|r| &r.outcome)),
            )
        });
        Ok(ModuleSync { changed, status })
    }

    /// Keep the set in force when a change would leave it incomplete: nothing
    /// of the change reaches the engine (after an engine restart, the last good
    /// modules are put back), and the ConfigMap's status names why.
    async fn refuse(
        &self,
        name: &str,
        data: Option<&BTreeMap<String, String>>,
        desired: &BTreeMap<String, &String>,
        errors: Vec<CompileError>,
        reload: bool,
    ) -> Result<ModuleSync, EngineError> {
        tracing::warn!(configmap = %name, errors = %errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "), "policy set would be incomplete; the last good set stays in force");
        let mut changed = false;
        let prefix = self.prefix(name);
        let kept: Vec<(String, ModuleRecord)> = self
            .records()
            .iter()
            .filter(|(id, _)| id.starts_with(&prefix))
            .map(|(id, r)| (id.clone(), r.clone()))
            .collect();
        if reload {
            for (id, record) in &kept {
                if let Some(good) = &record.last_good {
                    self.engine.put_policy(id, good).await?;
                    changed = true;
                }
            }
        }
        // The change is recorded as failing; what was good stays good.
        for (id, source) in desired {
            let last_good = kept
                .iter()
                .find(|(k, _)| k == id)
                .and_then(|(_, r)| r.last_good.clone());
            let own: Vec<CompileError> = errors
                .iter()
                .filter(|e| e.file.as_deref() == Some(id.as_str()))
                .cloned()
                .collect();
            let outcome = if own.is_empty() && last_good.as_deref() == Some(source.as_str()) {
                Ok(())
            } else if own.is_empty() {
                Err(errors.clone())
            } else {
                Err(own)
            };
            self.records().insert(
                id.clone(),
                ModuleRecord {
                    source: (*source).clone(),
                    outcome,
                    last_good,
                },
            );
        }
        // A module the change would remove stays in force, failing.
        for (id, record) in kept {
            if desired.contains_key(&id) {
                continue;
            }
            let own: Vec<CompileError> = errors
                .iter()
                .filter(|e| e.file.as_deref() == Some(id.as_str()))
                .cloned()
                .collect();
            self.records().insert(
                id,
                ModuleRecord {
                    outcome: Err(if own.is_empty() { errors.clone() } else { own }),
                    ..record
                },
            );
        }
        let status = data.map(|_| PolicyStatus::Error { errors });
        Ok(ModuleSync { changed, status })
    }

    /// Delete engine modules in our namespace that no ConfigMap holds any more
    /// (ConfigMaps deleted while the sidecar was not running).
    pub async fn remove_orphans(&self) -> Result<bool, EngineError> {
        let ids = self.engine.policies().await?.into_keys();
        let mut changed = false;
        for id in ids {
            let ours = self
                .owned_namespaces
                .iter()
                .any(|ns| id.starts_with(&format!("{ns}/")) && id.matches('/').count() == 2);
            if ours && !self.records().contains_key(&id) {
                self.engine.delete_policy(&id).await?;
                tracing::info!(module = %id, "removed a policy module no ConfigMap holds");
                changed = true;
            }
        }
        Ok(changed)
    }
}

/// kube-mgmt's status annotation, written beside ours so that kube-mgmt users'
/// tooling keeps working.
pub const KUBE_MGMT_STATUS_ANNOTATION: &str = "openpolicyagent.org/kube-mgmt-status";
/// kube-mgmt's retry counter; placement-sync retries by itself, so always "0".
pub const KUBE_MGMT_RETRIES_ANNOTATION: &str = "openpolicyagent.org/kube-mgmt-retries";

/// The ConfigMaps watched: one reflector per namespace of the selection, or
/// one over every namespace.
struct Watched {
    stores: Vec<(Option<String>, Store<ConfigMap>)>,
}

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
    seeded: std::sync::atomic::AtomicBool,
}

impl ConfigMapLoader {
    /// Before the first load: take the last good set kept in the cluster as
    /// the one in force, so that a ConfigMap in error (or a refused change)
    /// leaves it, not nothing. Fails (to be retried) when it cannot be read.
    async fn seed(&self) -> Result<(), SyncError> {
        use std::sync::atomic::Ordering;
        let Some(store) = &self.last_good else {
            return Ok(());
        };
        if self.seeded.load(Ordering::Acquire) {
            return Ok(());
        }
        match store.load().await {
            Ok(Some(kept)) => {
                tracing::info!(modules = kept.modules.len(), revision = %kept.revision, "read the last good policy set kept in the cluster");
                *self.lock_kept() = Some(kept.revision);
                self.modules.seed(kept.modules);
            }
            Ok(None) => {}
            Err(e @ crate::policies::last_good::LastGoodError::Format(..)) => {
                tracing::error!(error = %e, "the last good policy set kept in the cluster does not load; starting without it");
            }
            Err(e) => return Err(SyncError::Config(e.to_string())),
        }
        self.seeded.store(true, Ordering::Release);
        Ok(())
    }

    fn lock_kept(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.kept_revision.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep the set in force in the cluster, when it changed.
    async fn keep_last_good(&self) {
        let Some(store) = &self.last_good else {
            return;
        };
        let revision = self.modules.revision();
        if self.lock_kept().as_deref() == Some(revision.as_str()) {
            return;
        }
        match store.save(&revision, self.modules.last_good()).await {
            Ok(()) => *self.lock_kept() = Some(revision),
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
        crate::reconcile::cause::hex(context.finish().as_ref(), 8)
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
        let previous = self.lock_kinds().get(key).copied();
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
            let mut kinds = self.lock_kinds();
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

    fn lock_kinds(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ConfigMapKind>> {
        self.kinds.lock().unwrap_or_else(|e| e.into_inner())
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
            .patch(
                &cm.name_any(),
                &PatchParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                },
                &Patch::Merge(&patch),
            )
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
        self.seed().await?;
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
            .lock_kinds()
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
    let mut stores = Vec::new();
    let mut streams = Vec::new();
    for namespace in &namespaces {
        let api: Api<ConfigMap> = match namespace {
            Some(ns) => Api::namespaced(ctx.client.clone(), ns),
            None => Api::all(ctx.client.clone()),
        };
        let (store, writer) = reflector::store::<ConfigMap>();
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(|cm: &mut ConfigMap| cm.metadata.managed_fields = None)
            .reflect(writer);
        stores.push((namespace.clone(), store));
        streams.push(stream.boxed());
    }
    // Data ConfigMaps land at data.<namespace>: data, not packages.
    let mut data_roots = ctx.data_roots.clone();
    data_roots.extend(namespaces.iter().flatten().cloned());
    let loader = Arc::new(ConfigMapLoader {
        client: ctx.client.clone(),
        modules: ModuleSet::new(
            namespaces.iter().flatten().cloned().collect(),
            ctx.engine.clone(),
            data_roots,
            &ctx.decision,
        ),
        data: DataSet::new(ctx.engine.clone()),
        selection: ctx.selection.clone(),
        watched: Watched {
            stores: stores.clone(),
        },
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
        }),
        kept_revision: Mutex::new(None),
        seeded: std::sync::atomic::AtomicBool::new(false),
    });
    let queue = {
        let loader = loader.clone();
        KeyedQueue::new(
            COMPONENT,
            move |key: String| {
                let loader = loader.clone();
                async move { loader.sync_single(key).await }
            },
            ctx.permits.clone(),
            Backoff::default(),
            cancel.clone(),
        )
    };
    let relist = Arc::new(Notify::new());
    let full = {
        let loader = loader.clone();
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
            relist.clone(),
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
    };
    let watches = streams.len();
    let mut stream = futures::stream::select_all(streams);
    let mut listed = 0usize;
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = cancel.cancelled() => break,
        };
        match event {
            Some(Ok(watcher::Event::Apply(cm) | watcher::Event::Delete(cm))) => {
                queue.push(key_of(&cm));
            }
            Some(Ok(watcher::Event::InitDone)) => {
                // Every watch lists once at start; a later list is a relist.
                listed += 1;
                if listed > watches {
                    relist.notify_one();
                }
            }
            Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
            Some(Err(e)) => {
                ctx.metrics.watch_error(COMPONENT);
                tracing::warn!(error = %e, "ConfigMap watch error; the watch recovers by itself");
            }
            None => break,
        }
    }
    let _ = full.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy_client::{Embedded, QueryOutcome};
    use serde_json::Value;
    use std::time::Duration;

    const GOOD: &str = "package io.k8s.federation.admission\n\nannotations[\"a\"] := \"1\"\n";
    const BETTER: &str = "package io.k8s.federation.admission\n\nannotations[\"a\"] := \"2\"\n";
    const BROKEN: &str = "package io.k8s.federation.admission\n\nannotations[\"a\"] := \n";
    const NS: &str = "kube-federation-scheduling-policy";
    const PLACEMENT: &str = "kube-federation-scheduling-policy/placement";
    const A: &str = "kube-federation-scheduling-policy/a";

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    async fn decision(engine: &dyn PolicyEngine) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        match engine
            .query("io/k8s/federation/admission", &json!({}), deadline)
            .await
            .unwrap()
        {
            QueryOutcome::Defined(v) => Some(v["annotations"]["a"].clone()),
            QueryOutcome::Undefined => None,
        }
    }

    #[test]
    fn module_ids_and_status_annotation() {
        assert_eq!(
            module_id(NS, "placement", "main.rego"),
            "kube-federation-scheduling-policy/placement/main.rego"
        );
        assert_eq!(PolicyStatus::Ok.to_annotation(), r#"{"status":"ok"}"#);
        let error = PolicyStatus::Error {
            errors: vec![CompileError {
                file: Some("ns/cm/key".into()),
                row: Some(3),
                col: Some(22),
                code: Some("rego_parse_error".into()),
                message: "unexpected eof token".into(),
            }],
        };
        assert_eq!(
            error.to_annotation(),
            r#"{"status":"error","errors":[{"file":"ns/cm/key","row":3,"col":22,"code":"rego_parse_error","message":"unexpected eof token"}]}"#
        );
        // kube-mgmt's shape: one error as itself, several as a list.
        let kube_mgmt: Value = serde_json::from_str(&error.to_kube_mgmt_annotation()).unwrap();
        assert_eq!(kube_mgmt["status"], "error");
        assert_eq!(kube_mgmt["error"]["code"], "rego_parse_error");
        let PolicyStatus::Error { errors } = &error else {
            unreachable!()
        };
        let two = PolicyStatus::Error {
            errors: vec![errors[0].clone(), errors[0].clone()],
        };
        let kube_mgmt: Value = serde_json::from_str(&two.to_kube_mgmt_annotation()).unwrap();
        assert_eq!(kube_mgmt["error"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            PolicyStatus::Ok.to_kube_mgmt_annotation(),
            r#"{"status":"ok"}"#
        );
        let ok: Result<(), Vec<CompileError>> = Ok(());
        assert_eq!(PolicyStatus::from_outcomes([&ok, &ok]), PolicyStatus::Ok);
        let bad: Result<(), Vec<CompileError>> = Err(vec![CompileError {
            file: None,
            row: None,
            col: None,
            code: None,
            message: "m".into(),
        }]);
        assert!(matches!(
            PolicyStatus::from_outcomes([&ok, &bad]),
            PolicyStatus::Error { errors } if errors.len() == 1
        ));
    }

    #[tokio::test]
    async fn broken_update_keeps_the_last_good_module_and_reports_the_error() {
        let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
        let set = ModuleSet::new(
            vec![NS.into()],
            engine.clone(),
            vec!["kubernetes".into()],
            "io/k8s/federation/admission",
        );

        let out = set
            .sync(PLACEMENT, Some(&data(&[("main.rego", GOOD)])), false)
            .await
            .unwrap();
        assert_eq!(
            out,
            ModuleSync {
                changed: true,
                status: Some(PolicyStatus::Ok)
            }
        );
        assert_eq!(decision(engine.as_ref()).await, Some(json!("1")));

        // Unchanged source: nothing to do.
        let out = set
            .sync(PLACEMENT, Some(&data(&[("main.rego", GOOD)])), false)
            .await
            .unwrap();
        assert!(!out.changed);

        let out = set
            .sync(PLACEMENT, Some(&data(&[("main.rego", BROKEN)])), false)
            .await
            .unwrap();
        assert!(!out.changed);
        match out.status {
            Some(PolicyStatus::Error { errors }) => {
                assert!(!errors.is_empty());
                assert!(errors[0].row.is_some(), "{errors:?}");
            }
            other => panic!("expected an error status, got {other:?}"),
        }
        assert_eq!(
            decision(engine.as_ref()).await,
            Some(json!("1")),
            "last good version in force"
        );
        assert_eq!(set.counts(), (1, 1));

        let out = set
            .sync(PLACEMENT, Some(&data(&[("main.rego", BETTER)])), false)
            .await
            .unwrap();
        assert_eq!(
            out,
            ModuleSync {
                changed: true,
                status: Some(PolicyStatus::Ok)
            }
        );
        assert_eq!(decision(engine.as_ref()).await, Some(json!("2")));
        assert_eq!(set.counts(), (1, 0));
    }

    #[tokio::test]
    async fn reload_into_a_fresh_engine_restores_the_last_good_version() {
        let first: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
        let set = ModuleSet::new(
            vec![NS.into()],
            first.clone(),
            vec!["kubernetes".into()],
            "io/k8s/federation/admission",
        );
        set.sync(PLACEMENT, Some(&data(&[("main.rego", GOOD)])), false)
            .await
            .unwrap();
        set.sync(PLACEMENT, Some(&data(&[("main.rego", BROKEN)])), false)
            .await
            .unwrap();

        // Same records, new engine: what an engine restart looks like to the loader.
        let fresh: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
        let reloaded = ModuleSet {
            owned_namespaces: vec![NS.into()],
            engine: fresh.clone(),
            data_roots: vec!["kubernetes".into()],
            decision: "io.k8s.federation.admission".into(),
            records: Mutex::new(set.records().clone()),
        };
        let out = reloaded
            .sync(PLACEMENT, Some(&data(&[("main.rego", BROKEN)])), true)
            .await
            .unwrap();
        assert!(matches!(out.status, Some(PolicyStatus::Error { .. })));
        assert_eq!(decision(fresh.as_ref()).await, Some(json!("1")));
    }

    fn module_set(engine: &Arc<dyn PolicyEngine>) -> ModuleSet {
        ModuleSet::new(
            vec![NS.into()],
            engine.clone(),
            vec!["kubernetes".into()],
            "io/k8s/federation/admission",
        )
    }

    fn codes(status: &Option<PolicyStatus>) -> Vec<String> {
        match status {
            Some(PolicyStatus::Error { errors }) => {
                errors.iter().filter_map(|e| e.code.clone()).collect()
            }
            other => panic!("expected an error status, got {other:?}"),
        }
    }

    /// The decision removed while its rules stay, or one of two files of a
    /// package removed: refused whole, the last good set in force.
    #[tokio::test]
    async fn removing_the_decision_or_part_of_a_package_is_refused_whole() {
        let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
        let set = module_set(&engine);
        let decision_rego = "package io.k8s.federation.admission\n\nimport data.rules\n\nannotations[\"a\"] := rules.v\n";
        let v = "package rules\n\nv := \"1\"\n";
        let w = "package rules\n\nw := \"2\"\n";
        let whole = data(&[
            ("decision.rego", decision_rego),
            ("v.rego", v),
            ("w.rego", w),
        ]);
        let out = set.sync(PLACEMENT, Some(&whole), false).await.unwrap();
        assert_eq!(out.status, Some(PolicyStatus::Ok));
        assert_eq!(decision(engine.as_ref()).await, Some(json!("1")));

        let out = set
            .sync(
                PLACEMENT,
                Some(&data(&[("v.rego", v), ("w.rego", w)])),
                false,
            )
            .await
            .unwrap();
        assert_eq!(codes(&out.status), ["removes_decision"]);
        assert_eq!(decision(engine.as_ref()).await, Some(json!("1")));
        assert_eq!(set.counts(), (3, 1), "the decision is in force, failing");

        let out = set
            .sync(
                PLACEMENT,
                Some(&data(&[("decision.rego", decision_rego), ("v.rego", v)])),
                false,
            )
            .await
            .unwrap();
        assert_eq!(codes(&out.status), ["removes_part_of_package"]);
        assert_eq!(engine.policies().await.unwrap().len(), 3, "w.rego stays");

        // Back to the whole set: ok; then the whole policy removed: accepted.
        let out = set.sync(PLACEMENT, Some(&whole), false).await.unwrap();
        assert_eq!(out.status, Some(PolicyStatus::Ok));
        let out = set.sync(PLACEMENT, None, false).await.unwrap();
        assert!(out.changed);
        assert!(engine.policies().await.unwrap().is_empty());
    }

    /// A restarted sidecar takes the set kept in the cluster as the last good
    /// one: a ConfigMap in error leaves it in force, not nothing.
    #[tokio::test]
    async fn a_seeded_last_good_set_stays_in_force_when_the_configmap_is_in_error() {
        let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
        let set = module_set(&engine);
        set.seed([(format!("{PLACEMENT}/main.rego"), GOOD.to_owned())].into());
        let out = set
            .sync(PLACEMENT, Some(&data(&[("main.rego", BROKEN)])), true)
            .await
            .unwrap();
        assert!(matches!(out.status, Some(PolicyStatus::Error { .. })));
        assert_eq!(decision(engine.as_ref()).await, Some(json!("1")));
        assert_eq!(
            set.last_good(),
            [(format!("{PLACEMENT}/main.rego"), GOOD.to_owned())].into()
        );
    }

    #[tokio::test]
    async fn removed_keys_configmaps_and_orphans_are_deleted() {
        let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
        engine
            .put_policy(&format!("{NS}/old/gone.rego"), "package old\n")
            .await
            .unwrap();
        engine
            .put_policy("elsewhere/keep.rego", "package keep\n")
            .await
            .unwrap();
        let set = ModuleSet::new(
            vec![NS.into()],
            engine.clone(),
            vec!["kubernetes".into()],
            "io/k8s/federation/admission",
        );
        set.sync(
            A,
            Some(&data(&[
                ("one.rego", "package one\n"),
                ("two.rego", "package two\n"),
            ])),
            false,
        )
        .await
        .unwrap();
        let out = set
            .sync(A, Some(&data(&[("one.rego", "package one\n")])), false)
            .await
            .unwrap();
        assert!(out.changed);
        let ids: Vec<String> = engine.policies().await.unwrap().into_keys().collect();
        assert_eq!(
            ids,
            [
                "elsewhere/keep.rego".to_owned(),
                format!("{NS}/a/one.rego"),
                format!("{NS}/old/gone.rego")
            ]
        );

        assert!(set.remove_orphans().await.unwrap());
        let out = set.sync(A, None, false).await.unwrap();
        assert_eq!(
            out,
            ModuleSync {
                changed: true,
                status: None
            }
        );
        assert_eq!(
            engine
                .policies()
                .await
                .unwrap()
                .into_keys()
                .collect::<Vec<_>>(),
            ["elsewhere/keep.rego"]
        );
        assert!(set.configmaps().is_empty());
    }
}
