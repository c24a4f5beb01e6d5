//! Data ConfigMaps, as kube-mgmt loads them: every data key of a ConfigMap
//! labelled as data is a JSON (or YAML) document, written to the engine at
//! `{namespace}/{name}/{key}`; a key or ConfigMap that goes is removed, and on
//! a reload after an engine restart everything is written again. A document
//! of a namespace that does not own where it would land (an owned package, the
//! replicated objects: [`PackageOwners::check_data`]) is reported and not
//! written.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use policy_client::engine::{CompileError, EngineError, PolicyEngine};
use serde_json::Value;

use crate::policies::owners::PackageOwners;
use crate::policies::status::{ModuleSync, PolicyStatus};

/// The engine side of data ConfigMaps: what is written where.
#[derive(Debug)]
pub(super) struct DataSet {
    engine: Arc<dyn PolicyEngine>,
    owners: PackageOwners,
    /// ConfigMap (`namespace/name`) -> key -> the document written.
    written: Mutex<BTreeMap<String, BTreeMap<String, Value>>>,
}

/// A data key's text as a document: JSON, else YAML.
pub(super) fn parse_document(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).or_else(|json_error| {
        yaml_serde::from_str::<Value>(text)
            .map_err(|_| format!("neither JSON nor YAML: {json_error}"))
    })
}

impl DataSet {
    pub(super) fn new(engine: Arc<dyn PolicyEngine>, owners: PackageOwners) -> DataSet {
        DataSet {
            engine,
            owners,
            written: Mutex::new(BTreeMap::new()),
        }
    }

    /// A digest of every document written.
    pub(super) fn revision(&self) -> String {
        let written = serde_json::to_vec(&*self.written.lock()).unwrap_or_default();
        let digest = ring::digest::digest(&ring::digest::SHA256, &written);
        crate::hex::hex(digest.as_ref(), 8)
    }

    /// ConfigMaps (`namespace/name`) with data written.
    pub(super) fn configmaps(&self) -> Vec<String> {
        self.written.lock().keys().cloned().collect()
    }

    /// Bring the engine's documents of ConfigMap `key` (`namespace/name`) to
    /// `data` (`None`: gone, or no longer data). With `reload`, every document
    /// is written again. A key that does not parse is reported and not written.
    pub(super) async fn sync(
        &self,
        key: &str,
        data: Option<&BTreeMap<String, String>>,
        reload: bool,
    ) -> Result<ModuleSync, EngineError> {
        let Some(data) = data else {
            let had = self.written.lock().remove(key).is_some();
            if had {
                self.engine.delete_data(key).await?;
                tracing::info!(configmap = %key, "data removed");
            }
            return Ok(ModuleSync {
                changed: had,
                status: None,
            });
        };
        let mut changed = false;
        let mut errors = Vec::new();
        let previous = self.written.lock().get(key).cloned().unwrap_or_default();
        let mut now = BTreeMap::new();
        for (name, text) in data {
            let path = format!("{key}/{name}");
            if let Err(trespass) = self.owners.check_data(&path) {
                tracing::warn!(document = %path, owned = %trespass.owned, "a data document would land where its namespace does not own; not written");
                errors.push(self.owners.refusal(&path, &trespass));
                continue;
            }
            match parse_document(text) {
                Ok(document) => {
                    if reload || previous.get(name) != Some(&document) {
                        self.engine.put_data(&path, &document).await?;
                        changed = true;
                        tracing::info!(document = %path, "data loaded");
                    }
                    now.insert(name.clone(), document);
                }
                Err(message) => {
                    errors.push(CompileError {
                        file: Some(path),
                        row: None,
                        col: None,
                        code: Some("invalid_data".to_owned()),
                        message,
                    });
                    // The last document written stays.
                    if let Some(old) = previous.get(name) {
                        now.insert(name.clone(), old.clone());
                    }
                }
            }
        }
        for name in previous.keys().filter(|n| !data.contains_key(*n)) {
            self.engine.delete_data(&format!("{key}/{name}")).await?;
            changed = true;
        }
        self.written.lock().insert(key.to_owned(), now);
        let status = if errors.is_empty() {
            PolicyStatus::Ok
        } else {
            PolicyStatus::Error { errors }
        };
        Ok(ModuleSync {
            changed,
            status: Some(status),
        })
    }
}

#[cfg(test)]
mod tests;
