//! Packages have owners. The decision's package, the shipped policy's
//! packages and any an administrator names are written only by policy
//! ConfigMaps of the owners' namespaces (the policy namespace and
//! `--package-owner-namespaces`): a module from any other namespace that
//! declares one of them or a package under it, or whose rules define a path
//! in one (`package io.k8s` with `federation.placement.allowed := {}`), or a
//! document above one (which would extend or conflict with it), is refused.
//! Otherwise a tenant allowed a labelled ConfigMap could add clusters to the
//! shipped policy's allowed set, or make every decision fail.

use std::collections::BTreeSet;

use policy_client::engine::CompileError;

use crate::policies::rego_refs;
use crate::policies::rego_writes::module_writes;

/// The shipped policy's packages beside its decision (policies/*.rego).
pub(crate) const SHIPPED_PACKAGES: [&str; 3] = [
    "io.k8s.federation.admission",
    "io.k8s.federation.placement",
    "io.k8s.federation.settings",
];

/// Error code of a module refused for writing a package it does not own.
pub(crate) const OWNED_PACKAGE: &str = "owned_package";

/// Who may write which packages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PackageOwners {
    /// Owned packages (each with the packages under it), as components.
    packages: Vec<Vec<String>>,
    /// Namespaces whose policy ConfigMaps may write them.
    namespaces: BTreeSet<String>,
}

/// Why a module may not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trespass {
    /// The owned package it writes.
    pub package: String,
    /// What it writes (a package or a rule's path).
    pub path: String,
    /// The path is a document above the package (it would extend or
    /// conflict with it), not in it.
    pub above: bool,
    pub line: Option<u32>,
}

impl PackageOwners {
    /// `packages` (dotted) are written only from `namespaces`.
    pub(crate) fn new(
        packages: impl IntoIterator<Item = String>,
        namespaces: impl IntoIterator<Item = String>,
    ) -> Self {
        let mut packages: Vec<Vec<String>> = packages
            .into_iter()
            .map(|p| p.split('.').map(str::to_owned).collect())
            .collect();
        packages.sort();
        packages.dedup();
        PackageOwners {
            packages,
            namespaces: namespaces.into_iter().collect(),
        }
    }

    /// The namespaces that may write the owned packages.
    pub(crate) fn namespaces(&self) -> &BTreeSet<String> {
        &self.namespaces
    }

    /// The owned packages, dotted.
    pub(crate) fn packages(&self) -> Vec<String> {
        self.packages.iter().map(|p| p.join(".")).collect()
    }

    /// Whether module `id` (`namespace/configmap/key`) with `source` may be
    /// loaded: always from an owner's namespace; from elsewhere, unless it
    /// writes an owned package.
    pub(crate) fn check(&self, id: &str, source: &str) -> Result<(), Trespass> {
        let namespace = id.split('/').next().unwrap_or_default();
        if self.namespaces.contains(namespace) {
            return Ok(());
        }
        match module_writes(id, source) {
            Ok(writes) => {
                // The package itself counts only at or under an owned one:
                // `package io.k8s` writes nothing by being declared.
                if let Some(owned) = self.under(&writes.package.path) {
                    return Err(trespass(
                        owned,
                        &writes.package.path,
                        Some(writes.package.line),
                    ));
                }
                for rule in &writes.rules {
                    if let Some(owned) = self.on_branch(&rule.path) {
                        return Err(trespass(owned, &rule.path, Some(rule.line)));
                    }
                }
                Ok(())
            }
            // What regorus cannot read the engine may still take: judge it
            // by its package, read by the scanner, and refuse one on an owned
            // package's branch (its rules could reach into it).
            Err(_) => {
                let Some(package) = rego_refs::scan(source).package else {
                    return Ok(());
                };
                let path: Vec<String> = package.split('.').map(str::to_owned).collect();
                match self.on_branch(&path) {
                    Some(owned) => Err(trespass(owned, &path, None)),
                    None => Ok(()),
                }
            }
        }
    }

    /// The owned package `path` lies in (at or under it).
    fn under(&self, path: &[String]) -> Option<&Vec<String>> {
        self.packages.iter().find(|owned| path.starts_with(owned))
    }

    /// The owned package `path` lies in, or lies above.
    fn on_branch(&self, path: &[String]) -> Option<&Vec<String>> {
        self.packages
            .iter()
            .find(|owned| path.starts_with(owned) || owned.starts_with(path))
    }

    /// The status error of `trespass` by module `id`.
    pub(crate) fn refusal(&self, id: &str, trespass: &Trespass) -> CompileError {
        let writers = if self.namespaces.is_empty() {
            "no namespace may write it (none is named: see --package-owner-namespaces)".to_owned()
        } else {
            format!(
                "only policy ConfigMaps in namespace {} may declare or extend it",
                self.namespaces
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let namespace = id.split('/').next().unwrap_or_default();
        let relation = if trespass.above { "above" } else { "in" };
        CompileError {
            file: Some(id.to_owned()),
            row: trespass.line,
            col: None,
            code: Some(OWNED_PACKAGE.to_owned()),
            message: format!(
                "writes data.{} {relation} the owned package {}, which namespace {namespace} does not own: {writers}; the module is not loaded and the policy set in force stays as it is",
                trespass.path, trespass.package
            ),
        }
    }
}

fn trespass(owned: &[String], path: &[String], line: Option<u32>) -> Trespass {
    Trespass {
        package: owned.join("."),
        path: path.join("."),
        above: !path.starts_with(owned),
        line,
    }
}

#[cfg(test)]
mod tests;
