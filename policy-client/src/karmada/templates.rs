//! The resource templates bindings propagate, read from the API server and
//! kept by version.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::{Scope, pinned_kind};
use serde::Deserialize;
use serde_json::{Value, json};

/// The resource template a binding propagates (`spec.resource`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRef {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub resource_version: String,
}

impl TemplateRef {
    /// The template of `binding`; `None` when it names none.
    pub fn of(binding: &Value) -> Option<TemplateRef> {
        serde_json::from_value(binding.pointer("/spec/resource")?.clone()).ok()
    }
}

/// A binding's template cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("cannot find the API of {api_version} {kind}: {reason}")]
    Discovery {
        api_version: String,
        kind: String,
        reason: String,
    },
    #[error("cannot read {kind} {name}: {source}")]
    Read {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Reads bindings' resource templates from the API server, their resource
/// types found by discovery once each (a type discovery could not find is
/// not asked about again for [`FAILED_DISCOVERY_TTL`]: whoever writes
/// bindings names the type, so every review naming a type that does not
/// exist would otherwise cost the API server a discovery). A template read is kept by its UID and
/// resourceVersion: a binding names the version of its template it was built
/// from (`spec.resource.resourceVersion`), and Karmada's detector rewrites a
/// binding from the same version on every reconcile, so those writes need no
/// read ([`Templates::get_version`]; a version's content never changes).
pub struct Templates {
    client: kube::Client,
    /// `(apiVersion, kind)` -> the type and whether it is namespaced.
    types: Mutex<HashMap<(String, String), (ApiResource, bool)>>,
    /// Types whose discovery failed lately, and why.
    failed: Mutex<FailedDiscoveries>,
    versions: Mutex<Versions>,
}

/// How long a failed discovery is answered from memory: short, so that a
/// type installed a moment later (a CRD) or an API server that recovers is
/// found again soon.
const FAILED_DISCOVERY_TTL: Duration = Duration::from_secs(10);

/// Failed discoveries remembered at once; beyond, the oldest is forgotten.
const FAILED_DISCOVERIES: usize = 1024;

/// Types whose discovery failed, with when and why, for
/// [`FAILED_DISCOVERY_TTL`]; at most [`FAILED_DISCOVERIES`] of them.
struct FailedDiscoveries {
    failed: HashMap<(String, String), (Instant, String)>,
    ttl: Duration,
    capacity: usize,
}

impl FailedDiscoveries {
    fn new(ttl: Duration, capacity: usize) -> FailedDiscoveries {
        FailedDiscoveries {
            failed: HashMap::new(),
            ttl,
            capacity: capacity.max(1),
        }
    }

    /// Why the discovery of `id` failed, if it did within the TTL of `now`.
    fn get(&self, id: &(String, String), now: Instant) -> Option<&str> {
        self.failed
            .get(id)
            .filter(|(at, _)| now.saturating_duration_since(*at) < self.ttl)
            .map(|(_, reason)| reason.as_str())
    }

    fn remember(&mut self, id: (String, String), reason: String, now: Instant) {
        if !self.failed.contains_key(&id) && self.failed.len() >= self.capacity {
            let ttl = self.ttl;
            self.failed
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            if self.failed.len() >= self.capacity {
                let oldest = self
                    .failed
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(id, _)| id.clone());
                if let Some(oldest) = oldest {
                    self.failed.remove(&oldest);
                }
            }
        }
        self.failed.insert(id, (now, reason));
    }
}

/// How much the templates kept by version may take (their JSON, in bytes).
const KEPT_VERSIONS_BYTES: usize = 8 * 1024 * 1024;

/// Templates by `(uid, resourceVersion)`, the oldest dropped first beyond a
/// byte budget.
struct Versions {
    kept: HashMap<(String, String), (Value, ApiResource, usize)>,
    order: VecDeque<(String, String)>,
    bytes: usize,
    budget: usize,
}

impl Versions {
    fn new(budget: usize) -> Versions {
        Versions {
            kept: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            budget,
        }
    }

    fn get(&self, uid: &str, version: &str) -> Option<(Value, ApiResource)> {
        self.kept
            .get(&(uid.to_owned(), version.to_owned()))
            .map(|(value, resource, _)| (value.clone(), resource.clone()))
    }

    /// Keep `value` (of `size` bytes) unless it alone is over the budget.
    fn keep(
        &mut self,
        uid: String,
        version: String,
        value: Value,
        resource: ApiResource,
        size: usize,
    ) {
        if size > self.budget || uid.is_empty() || version.is_empty() {
            return;
        }
        let key = (uid, version);
        if self.kept.contains_key(&key) {
            return;
        }
        while self.bytes + size > self.budget {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((_, _, freed)) = self.kept.remove(&oldest) {
                self.bytes -= freed;
            }
        }
        self.bytes += size;
        self.order.push_back(key.clone());
        self.kept.insert(key, (value, resource, size));
    }
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Templates").finish_non_exhaustive()
    }
}

impl Templates {
    pub fn new(client: kube::Client) -> Templates {
        Templates {
            client,
            types: Mutex::default(),
            failed: Mutex::new(FailedDiscoveries::new(
                FAILED_DISCOVERY_TTL,
                FAILED_DISCOVERIES,
            )),
            versions: Mutex::new(Versions::new(KEPT_VERSIONS_BYTES)),
        }
    }

    /// The resource type of `api_version`/`kind`, and whether it is namespaced.
    pub async fn resource(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, bool), TemplateError> {
        let id = (api_version.to_owned(), kind.to_owned());
        if let Some(found) = self.types.lock().get(&id) {
            return Ok(found.clone());
        }
        let discovery_error = |reason: String| TemplateError::Discovery {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            reason,
        };
        let failed = || self.failed.lock();
        if let Some(reason) = failed().get(&id, Instant::now()) {
            return Err(discovery_error(format!(
                "{reason} (a discovery of the last {} seconds)",
                FAILED_DISCOVERY_TTL.as_secs()
            )));
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) = match pinned_kind(&self.client, &gvk).await {
            Ok(found) => found,
            Err(e) => {
                let reason = e.to_string();
                failed().remember(id, reason.clone(), Instant::now());
                return Err(discovery_error(reason));
            }
        };
        let found = (resource, capabilities.scope == Scope::Namespaced);
        self.types.lock().insert(id, found.clone());
        Ok(found)
    }

    /// The version of the template `template` names, when it was read
    /// before, else [`Templates::get`]. Only for a reference the writer of
    /// the binding cannot choose (a stored binding's, or one a write leaves as
    /// stored): an old version may allow what the current one does not.
    pub async fn get_version(
        &self,
        template: &TemplateRef,
    ) -> Result<Option<(Value, ApiResource)>, TemplateError> {
        let kept = self
            .versions
            .lock()
            .get(&template.uid, &template.resource_version);
        match kept {
            Some(kept) => Ok(Some(kept)),
            None => self.get(template).await,
        }
    }

    /// The template as stored now (without `managedFields`), with its type;
    /// `None` when it is gone.
    pub async fn get(
        &self,
        template: &TemplateRef,
    ) -> Result<Option<(Value, ApiResource)>, TemplateError> {
        let versions = || self.versions.lock();
        let (resource, namespaced) = self.resource(&template.api_version, &template.kind).await?;
        let api: Api<DynamicObject> = match (&template.namespace, namespaced) {
            (Some(ns), true) => Api::namespaced_with(self.client.clone(), ns, &resource),
            _ => Api::all_with(self.client.clone(), &resource),
        };
        let Some(mut object) =
            api.get_opt(&template.name)
                .await
                .map_err(|source| TemplateError::Read {
                    kind: template.kind.clone(),
                    name: template.name.clone(),
                    source,
                })?
        else {
            return Ok(None);
        };
        object.metadata.managed_fields = None;
        let mut value = serde_json::to_value(&object).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.insert("apiVersion".to_owned(), json!(resource.api_version));
            map.insert("kind".to_owned(), json!(resource.kind));
        }
        let uid = object.metadata.uid.clone().unwrap_or_default();
        let version = object.metadata.resource_version.clone().unwrap_or_default();
        let size = serde_json::to_vec(&value).map_or(usize::MAX, |v| v.len());
        versions().keep(uid, version, value.clone(), resource.clone(), size);
        Ok(Some((value, resource)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed discovery is answered from memory for the TTL, then asked
    /// again; a flood of types that do not exist is remembered within the
    /// capacity, the oldest forgotten first.
    #[test]
    fn failed_discoveries_are_remembered_for_a_short_time() {
        let id = |kind: &str| ("example.com/v1".to_owned(), kind.to_owned());
        let start = Instant::now();
        let mut failed = FailedDiscoveries::new(Duration::from_secs(10), 3);
        failed.remember(id("Missing"), "404 Not Found".into(), start);
        let later = |secs: u64| start + Duration::from_secs(secs);
        assert_eq!(failed.get(&id("Missing"), later(9)), Some("404 Not Found"));
        assert_eq!(failed.get(&id("Other"), later(9)), None);
        assert_eq!(
            failed.get(&id("Missing"), later(10)),
            None,
            "asked again after the TTL"
        );
        // Capacity: the oldest goes first; expired ones before any.
        failed.remember(id("A"), "a".into(), later(1));
        failed.remember(id("B"), "b".into(), later(2));
        failed.remember(id("C"), "c".into(), later(3));
        assert_eq!(
            failed.get(&id("Missing"), later(3)),
            None,
            "the oldest forgotten for room"
        );
        assert_eq!(failed.failed.len(), 3);
        assert_eq!(failed.get(&id("A"), later(3)), Some("a"));
        failed.remember(id("D"), "d".into(), later(4));
        assert_eq!(failed.failed.len(), 3);
        assert_eq!(failed.get(&id("A"), later(4)), None, "the oldest forgotten");
        assert_eq!(failed.get(&id("D"), later(4)), Some("d"));
        // Remembering one again refreshes it, taking no other's place.
        failed.remember(id("B"), "b again".into(), later(5));
        assert_eq!(failed.get(&id("B"), later(14)), Some("b again"));
        assert_eq!(failed.get(&id("C"), later(5)), Some("c"));
    }

    #[test]
    fn template_versions_are_kept_within_their_budget() {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("apps", "v1", "Deployment"));
        let mut versions = Versions::new(100);
        let value = |n: u32| json!({"metadata": {"resourceVersion": n.to_string()}});
        versions.keep("u1".into(), "1".into(), value(1), resource.clone(), 40);
        versions.keep("u1".into(), "2".into(), value(2), resource.clone(), 40);
        assert_eq!(versions.get("u1", "1").unwrap().0, value(1));
        assert!(
            versions.get("u1", "3").is_none(),
            "another version is no hit"
        );
        versions.keep("u2".into(), "7".into(), value(7), resource.clone(), 40);
        assert!(
            versions.get("u1", "1").is_none(),
            "the oldest dropped for the budget"
        );
        assert!(versions.get("u1", "2").is_some() && versions.get("u2", "7").is_some());
        assert!(versions.bytes <= 100);
        versions.keep("u3".into(), "1".into(), value(1), resource.clone(), 101);
        assert!(
            versions.get("u3", "1").is_none(),
            "larger than the budget: not kept"
        );
        versions.keep(String::new(), "1".into(), value(1), resource, 1);
        assert!(versions.get("", "1").is_none(), "no UID: not kept");
    }
}
