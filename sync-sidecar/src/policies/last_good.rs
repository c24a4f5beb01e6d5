//! The last good policy set, kept in the cluster: a ConfigMap of the release
//! (`--last-good-policies NAMESPACE/NAME`, data key [`DATA_KEY`]) holding the
//! modules in force and their revision, as JSON:
//!
//! ```json
//! {"version": 1, "revision": "3f2a...", "modules": {"<namespace>/<configmap>/<key>": "<Rego>"}}
//! ```
//!
//! Its writer (the remediator's sidecar, or every sidecar when none is
//! read-only: they load the same ConfigMaps, so they write the same set)
//! writes it when the set in force changes; every sidecar reads it once,
//! before it loads
//! the policy ConfigMaps: a sidecar that restarts (or is upgraded) while a
//! ConfigMap is in error, or holds a change that is refused, puts this set in
//! force instead of nothing. Upgrades read every earlier version of the
//! format.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::kube_writes::patch_params;

/// Data key of the kept set.
pub(crate) const DATA_KEY: &str = "policy-set.json";
/// The format written.
const VERSION: u32 = 1;
/// A ConfigMap holds 1 MiB at most; a set near it is not kept whole.
const LIMIT: usize = 1000 * 1024;

/// The kept set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KeptSet {
    pub(crate) version: u32,
    pub(crate) revision: String,
    pub(crate) modules: BTreeMap<String, String>,
}

/// Where the set is kept.
#[derive(Clone)]
pub(crate) struct LastGood {
    pub(crate) api: Api<ConfigMap>,
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// Only read: another sidecar (the remediator's) writes it.
    pub(crate) read_only: bool,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum LastGoodError {
    #[error("cannot read or write ConfigMap {0}: {1}")]
    Api(String, #[source] kube::Error),
    #[error("ConfigMap {0} holds no policy set this version reads: {1}")]
    Format(String, String),
}

impl LastGood {
    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The kept set; `None` when there is none yet (or no ConfigMap).
    pub(crate) async fn load(&self) -> Result<Option<KeptSet>, LastGoodError> {
        let cm = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| LastGoodError::Api(self.describe(), e))?;
        let Some(text) = cm.and_then(|cm| cm.data?.remove(DATA_KEY)) else {
            return Ok(None);
        };
        let kept: KeptSet = serde_json::from_str(&text)
            .map_err(|e| LastGoodError::Format(self.describe(), e.to_string()))?;
        if kept.version > VERSION {
            return Err(LastGoodError::Format(
                self.describe(),
                format!(
                    "format version {} is newer than this sidecar's {VERSION}",
                    kept.version
                ),
            ));
        }
        Ok(Some(kept))
    }

    /// Keep `modules` as the last good set of `revision`.
    pub(crate) async fn save(
        &self,
        revision: &str,
        modules: BTreeMap<String, String>,
    ) -> Result<(), LastGoodError> {
        let kept = KeptSet {
            version: VERSION,
            revision: revision.to_owned(),
            modules,
        };
        let text = serde_json::to_string(&kept)
            .map_err(|e| LastGoodError::Format(self.describe(), e.to_string()))?;
        if text.len() > LIMIT {
            return Err(LastGoodError::Format(
                self.describe(),
                format!(
                    "the policy set takes {} bytes, more than a ConfigMap holds",
                    text.len()
                ),
            ));
        }
        let patch = json!({"data": {DATA_KEY: text}});
        self.api
            .patch(&self.name, &patch_params(), &Patch::Merge(&patch))
            .await
            .map_err(|e| LastGoodError::Api(self.describe(), e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_set_reads_back() {
        let kept = KeptSet {
            version: VERSION,
            revision: "abc".into(),
            modules: [("ns/cm/main.rego".to_owned(), "package p\n".to_owned())].into(),
        };
        let text = serde_json::to_string(&kept).unwrap();
        assert_eq!(
            text,
            r#"{"version":1,"revision":"abc","modules":{"ns/cm/main.rego":"package p\n"}}"#
        );
        assert_eq!(serde_json::from_str::<KeptSet>(&text).unwrap(), kept);
    }
}
