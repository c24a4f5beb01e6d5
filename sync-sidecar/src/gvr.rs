//! `[group/]version/resource` as given on the command line (kube-mgmt's style).

use std::fmt;
use std::str::FromStr;

/// A resource type named by group, version and plural resource name.
/// The core group is the empty string (`v1/configmaps`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Gvr {
    pub group: String,
    pub version: String,
    pub resource: String,
}

/// A `[group/]version/resource` flag value that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid resource type {value:?}: {reason} (expected [group/]version/resource, e.g. apps/v1/replicasets or v1/configmaps)"
)]
pub(crate) struct GvrParseError {
    pub value: String,
    pub reason: &'static str,
}

impl Gvr {
    pub(crate) fn new(group: &str, version: &str, resource: &str) -> Self {
        Gvr {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: resource.to_owned(),
        }
    }

    /// `v1` for the core group, `group/version` otherwise.
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

impl fmt::Display for Gvr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}/{}", self.version, self.resource)
        } else {
            write!(f, "{}/{}/{}", self.group, self.version, self.resource)
        }
    }
}

impl FromStr for Gvr {
    type Err = GvrParseError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let err = |reason| GvrParseError {
            value: value.to_owned(),
            reason,
        };
        let trimmed = value.trim();
        let parts: Vec<&str> = trimmed.split('/').collect();
        let (group, version, resource) = match parts.as_slice() {
            [version, resource] => ("", *version, *resource),
            [group, version, resource] => (*group, *version, *resource),
            _ => return Err(err("wrong number of '/'-separated parts")),
        };
        if version.is_empty() || resource.is_empty() || (parts.len() == 3 && group.is_empty()) {
            return Err(err("empty part"));
        }
        let dns_chars = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        if !dns_chars(group) {
            return Err(err("group must be a lowercase DNS name"));
        }
        if !version.starts_with('v') || !version.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(err("version must look like v1, v1beta1, ..."));
        }
        if !dns_chars(resource) || resource.contains('.') {
            return Err(err(
                "resource must be the lowercase plural name (replicasets, not ReplicaSet)",
            ));
        }
        Ok(Gvr::new(group, version, resource))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_grouped_and_core_types() {
        let rs: Gvr = "apps/v1/replicasets".parse().unwrap();
        assert_eq!(rs, Gvr::new("apps", "v1", "replicasets"));
        assert_eq!(rs.api_version(), "apps/v1");
        assert_eq!(rs.to_string(), "apps/v1/replicasets");

        let cm: Gvr = "v1/configmaps".parse().unwrap();
        assert_eq!(cm, Gvr::new("", "v1", "configmaps"));
        assert_eq!(cm.api_version(), "v1");
        assert_eq!(cm.to_string(), "v1/configmaps");

        let crd: Gvr = " federation.example.io/v1alpha1/clusters ".parse().unwrap();
        assert_eq!(crd.group, "federation.example.io");
        assert_eq!(crd.version, "v1alpha1");
    }

    #[test]
    fn rejects_malformed_values_with_a_reason() {
        for bad in [
            "",
            "replicasets",
            "apps/v1/replicasets/extra",
            "/v1/pods",
            "apps//replicasets",
            "apps/v1/",
            "apps/1/replicasets",
            "apps/v1/ReplicaSet",
            "Apps/v1/replicasets",
        ] {
            let err = bad.parse::<Gvr>().unwrap_err();
            assert!(
                err.to_string()
                    .contains("expected [group/]version/resource"),
                "{bad}: {err}"
            );
        }
    }
}
