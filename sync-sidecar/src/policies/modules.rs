//! The engine side of the policy loader: which modules are loaded and how.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;

use policy_client::engine::{CompileError, EngineError, PolicyEngine};

use crate::policies::owners::PackageOwners;
use crate::policies::rego_refs::{self};
use crate::policies::status::{ModuleSync, PolicyStatus};

/// What the loader knows about one module.
#[derive(Debug, Clone)]
struct ModuleRecord {
    /// The source most recently attempted (the ConfigMap's current value).
    source: String,
    outcome: Result<(), Vec<CompileError>>,
    /// The last source the engine accepted.
    last_good: Option<String>,
}

/// The engine side of the policy loader: which modules are loaded and how.
/// Independent of Kubernetes, so it is tested against the embedded engine.
#[derive(Debug)]
pub(super) struct ModuleSet {
    /// Namespaces whose modules no ConfigMap holds are ours to remove (the
    /// policy namespace and listed namespaces; never "every namespace").
    owned_namespaces: Vec<String>,
    engine: Arc<dyn PolicyEngine>,
    /// Top-level `data` names that hold replicated data, not packages.
    data_roots: Vec<String>,
    /// The decision's package (dotted): a set that still has modules keeps it.
    decision: String,
    /// Who may write which packages.
    owners: PackageOwners,
    records: Mutex<BTreeMap<String, ModuleRecord>>,
}

impl ModuleSet {
    /// `decision`: the decision path (`io/k8s/federation/admission`).
    pub(super) fn new(
        owned_namespaces: Vec<String>,
        engine: Arc<dyn PolicyEngine>,
        data_roots: Vec<String>,
        decision: &str,
        owners: PackageOwners,
    ) -> Self {
        ModuleSet {
            owned_namespaces,
            engine,
            data_roots,
            decision: decision.trim_matches('/').replace('/', "."),
            owners,
            records: Mutex::new(BTreeMap::new()),
        }
    }

    /// Take `modules` (id -> source) as the last good set, before anything
    /// is loaded (a restarted sidecar, from the set kept in the cluster):
    /// each ConfigMap's current source is tried first, and where it fails or
    /// would leave the set incomplete, these stay in force.
    /// A kept module that writes a package its namespace does not own (kept
    /// before the owners were configured so) is left out.
    pub(super) fn restore_last_good(&self, modules: BTreeMap<String, String>) {
        let mut records = self.records.lock();
        for (id, source) in modules {
            if let Err(trespass) = self.owners.check(&id, &source) {
                tracing::warn!(module = %id, package = %trespass.owned, "the last good policy set kept a module that writes a package its namespace does not own; it is left out");
                continue;
            }
            records.entry(id).or_insert_with(|| ModuleRecord {
                source: source.clone(),
                outcome: Ok(()),
                last_good: Some(source),
            });
        }
    }

    /// The modules in force, each one's accepted source (what the set kept in
    /// the cluster holds).
    pub(super) fn last_good(&self) -> BTreeMap<String, String> {
        self.in_force()
    }

    /// Module ids of ConfigMap `key` (`namespace/name`) start with this.
    fn prefix(&self, key: &str) -> String {
        format!("{key}/")
    }

    /// `(loaded, failed)`: modules in force, and modules whose current source fails.
    pub(super) fn counts(&self) -> (usize, usize) {
        let records = self.records.lock();
        let failed = records.values().filter(|r| r.outcome.is_err()).count();
        let loaded = records
            .values()
            .filter(|r| r.outcome.is_ok() || r.last_good.is_some())
            .count();
        (loaded, failed)
    }

    /// The revision of the modules in force: a digest of their ids and
    /// sources.
    pub(super) fn revision(&self) -> String {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        for (id, source) in self.in_force() {
            for part in [id.as_bytes(), source.as_bytes()] {
                context.update(&(part.len() as u64).to_be_bytes());
                context.update(part);
            }
        }
        crate::hex::hex(context.finish().as_ref(), 8)
    }

    /// The modules in force: each one's accepted source.
    fn in_force(&self) -> BTreeMap<String, String> {
        self.records
            .lock()
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
    /// `desired`, if it may not: a module writes a package its namespace does
    /// not own ([`PackageOwners`]), a module would need a package that no
    /// module defines (and none needs now), or the change removes the decision while
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
        let mut errors: Vec<CompileError> = desired
            .iter()
            .filter_map(|(id, source)| {
                let trespass = self.owners.check(id, source).err()?;
                Some(self.owners.refusal(id, &trespass))
            })
            .collect();
        errors.extend(rego_refs::missing_packages(&after, &self.data_roots)
            .into_iter()
            .filter(|m| !before.contains(&m.package))
            .map(|m| refused(m.module, "missing_package", format!(
                "needs package {} (data.{}), which no loaded module defines; the last good policy set stays in force",
                m.package, m.package
            ))));
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
    pub(super) fn configmap_order(
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
    pub(super) fn configmaps(&self) -> BTreeSet<String> {
        self.records
            .lock()
            .keys()
            .filter_map(|id| id.rsplit_once('/').map(|(key, _)| key.to_owned()))
            .collect()
    }

    /// Bring the engine's modules of ConfigMap `name` to `data` (`None`: the
    /// ConfigMap is gone). With `reload`, every module is put again, because the
    /// engine may have lost them; a module that fails then gets its last good
    /// version back. Transient engine errors abort with `Err` (retry later); the
    /// modules done so far stay recorded.
    pub(super) async fn sync(
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
            changed |= self.put(id, source, reload).await?;
        }
        changed |= self.remove_gone(&prefix, &desired).await?;
        let status = data.map(|_| {
            let records = self.records.lock();
            PolicyStatus::from_outcomes(
                desired
                    .keys()
                    .filter_map(|id| records.get(id).map(|r| &r.outcome)),
            )
        });
        Ok(ModuleSync { changed, status })
    }

    /// Put module `id` as `source`, unless it is in force already (`reload`:
    /// put it anyway). A source that does not compile is recorded as failing;
    /// on a reload its last good version goes back in. Whether the engine's
    /// modules changed.
    async fn put(&self, id: &String, source: &String, reload: bool) -> Result<bool, EngineError> {
        let previous = self.records.lock().get(id).cloned();
        if !reload
            && previous
                .as_ref()
                .is_some_and(|p| &p.source == source && p.outcome.is_ok())
        {
            return Ok(false);
        }
        let last_good = previous.and_then(|p| p.last_good);
        let mut changed = false;
        let record = match self.engine.put_policy(id, source).await {
            Ok(()) => {
                changed = true;
                tracing::info!(module = %id, "policy module loaded");
                ModuleRecord {
                    source: source.clone(),
                    outcome: Ok(()),
                    last_good: Some(source.clone()),
                }
            }
            Err(EngineError::Compile(errors)) => {
                tracing::warn!(module = %id, errors = %errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "), "policy module does not compile; the previous version stays in force");
                if reload && let Some(good) = last_good.as_ref().filter(|g| *g != source) {
                    match self.engine.put_policy(id, good).await {
                        Ok(()) => changed = true,
                        Err(EngineError::Compile(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                ModuleRecord {
                    source: source.clone(),
                    outcome: Err(errors),
                    last_good,
                }
            }
            Err(e) => return Err(e),
        };
        self.records.lock().insert(id.clone(), record);
        Ok(changed)
    }

    /// Delete the modules of the ConfigMap of `prefix` that `desired` no
    /// longer holds. Whether there were any.
    async fn remove_gone(
        &self,
        prefix: &str,
        desired: &BTreeMap<String, &String>,
    ) -> Result<bool, EngineError> {
        let removed: Vec<String> = self
            .records
            .lock()
            .keys()
            .filter(|id| id.starts_with(prefix) && !desired.contains_key(*id))
            .cloned()
            .collect();
        for id in &removed {
            self.engine.delete_policy(id).await?;
            self.records.lock().remove(id);
            tracing::info!(module = %id, "policy module removed");
        }
        Ok(!removed.is_empty())
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
        tracing::warn!(configmap = %name, errors = %errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "), "policy change refused; the last good set stays in force");
        let mut changed = false;
        let prefix = self.prefix(name);
        let kept: Vec<(String, ModuleRecord)> = self
            .records
            .lock()
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
            self.records.lock().insert(
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
            self.records.lock().insert(
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
    /// (ConfigMaps deleted while the sidecar was not running), and modules
    /// of ConfigMaps (`namespace/configmap/key`) that write a package their
    /// namespace does not own: none is ever in force, but an earlier sidecar
    /// (before the owners were configured so) may have loaded one.
    pub(super) async fn remove_orphans(&self) -> Result<bool, EngineError> {
        let modules = self.engine.policies().await?;
        let mut changed = false;
        for (id, source) in modules {
            let from_configmap = id.matches('/').count() == 2;
            let ours = from_configmap
                && self
                    .owned_namespaces
                    .iter()
                    .any(|ns| id.starts_with(&format!("{ns}/")));
            if ours && !self.records.lock().contains_key(&id) {
                self.engine.delete_policy(&id).await?;
                tracing::info!(module = %id, "removed a policy module no ConfigMap holds");
                changed = true;
            } else if from_configmap && let Err(trespass) = self.owners.check(&id, &source) {
                self.engine.delete_policy(&id).await?;
                tracing::warn!(module = %id, package = %trespass.owned, "removed a policy module that writes a package its namespace does not own");
                changed = true;
            }
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests;
