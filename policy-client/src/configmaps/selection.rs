//! The selection itself: which ConfigMaps are policies and which are data
//! (see the [parent module](super)).

use std::collections::BTreeMap;

/// The policy namespace of placement-policy's own design.
pub const DEFAULT_POLICY_NAMESPACE: &str = "kube-federation-scheduling-policy";

/// The ConfigMap the API server publishes into every namespace.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";

/// kube-mgmt's default labels.
pub const DEFAULT_POLICY_LABEL: &str = "openpolicyagent.org/policy";
pub const DEFAULT_POLICY_VALUE: &str = "rego";
pub const DEFAULT_DATA_LABEL: &str = "openpolicyagent.org/data";
pub const DEFAULT_DATA_VALUE: &str = "opa";

/// What a ConfigMap is to the policy engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigMapKind {
    /// Every data key is a Rego module.
    Policy,
    /// Every data key is a JSON (or YAML) document.
    Data,
}

/// The selection. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapSelection {
    /// Every ConfigMap here is a policy (unless labelled as data).
    pub policy_namespace: Option<String>,
    /// Namespaces of labelled ConfigMaps; `*` is every namespace.
    pub namespaces: Vec<String>,
    pub enable_policies: bool,
    pub enable_data: bool,
    pub policy_label: String,
    pub policy_value: String,
    pub data_label: String,
    pub data_value: String,
}

impl Default for ConfigMapSelection {
    fn default() -> Self {
        ConfigMapSelection {
            policy_namespace: None,
            namespaces: Vec::new(),
            enable_policies: true,
            enable_data: true,
            policy_label: DEFAULT_POLICY_LABEL.to_owned(),
            policy_value: DEFAULT_POLICY_VALUE.to_owned(),
            data_label: DEFAULT_DATA_LABEL.to_owned(),
            data_value: DEFAULT_DATA_VALUE.to_owned(),
        }
    }
}

impl ConfigMapSelection {
    /// The selection of these flags: the policy namespace given, or the
    /// default one unless labelled discovery (`namespaces`) is asked for, so
    /// that a kube-mgmt deployment's flags mean what they meant.
    pub fn resolve(
        policy_namespace: Option<String>,
        namespaces: Vec<String>,
        labels: ConfigMapSelection,
    ) -> ConfigMapSelection {
        let namespaces: Vec<String> = namespaces
            .into_iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        let policy_namespace = match policy_namespace {
            Some(ns) if ns.trim().is_empty() => None,
            Some(ns) => Some(ns),
            None if namespaces.is_empty() => Some(DEFAULT_POLICY_NAMESPACE.to_owned()),
            None => None,
        };
        ConfigMapSelection {
            policy_namespace,
            namespaces,
            ..labels
        }
    }

    fn labelled_namespace(&self, namespace: &str) -> bool {
        self.namespaces.iter().any(|n| n == "*" || n == namespace)
    }

    /// What the ConfigMap `namespace/name` with `labels` is, if anything.
    pub fn classify(
        &self,
        namespace: &str,
        name: &str,
        labels: Option<&BTreeMap<String, String>>,
    ) -> Option<ConfigMapKind> {
        let has =
            |key: &str, value: &str| labels.and_then(|l| l.get(key)).is_some_and(|v| v == value);
        // The API server publishes its CA bundle into every namespace.
        let in_policy_namespace =
            self.policy_namespace.as_deref() == Some(namespace) && name != ROOT_CA_CONFIGMAP;
        let labelled = self.labelled_namespace(namespace);
        if self.enable_data
            && (labelled || in_policy_namespace)
            && has(&self.data_label, &self.data_value)
        {
            return Some(ConfigMapKind::Data);
        }
        if !self.enable_policies {
            return None;
        }
        if in_policy_namespace || (labelled && has(&self.policy_label, &self.policy_value)) {
            return Some(ConfigMapKind::Policy);
        }
        None
    }

    /// The namespaces to watch ConfigMaps in; `None` when every namespace must
    /// be watched (`*`).
    pub fn watched_namespaces(&self) -> Option<Vec<String>> {
        if self.namespaces.iter().any(|n| n == "*") {
            return None;
        }
        let mut namespaces: Vec<String> = self
            .namespaces
            .iter()
            .filter(|n| !n.is_empty())
            .cloned()
            .chain(self.policy_namespace.clone())
            .collect();
        namespaces.sort();
        namespaces.dedup();
        Some(namespaces)
    }

    /// A short description for messages ("policy ConfigMaps in ...").
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(ns) = &self.policy_namespace {
            parts.push(format!("namespace {ns}"));
        }
        if !self.namespaces.is_empty() && self.enable_policies {
            let namespaces = if self.namespaces.iter().any(|n| n == "*") {
                "every namespace".to_owned()
            } else {
                format!("namespaces {}", self.namespaces.join(", "))
            };
            parts.push(format!(
                "ConfigMaps labelled {}={} in {namespaces}",
                self.policy_label, self.policy_value
            ));
        }
        if parts.is_empty() {
            "nowhere (policy discovery is off)".to_owned()
        } else {
            parts.join(" and ")
        }
    }
}

#[cfg(test)]
mod tests;
