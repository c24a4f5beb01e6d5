//! Packages have owners. The decision's package, the shipped policy's
//! packages and any an administrator names are written only by policy
//! ConfigMaps of the owners' namespaces (the policy namespace and
//! `--package-owner-namespaces`): a module from any other namespace that
//! declares one of them or a package under it, or whose rules define a path
//! in one (`package io.k8s` with `federation.placement.allowed := {}`), or a
//! document above one (which would extend or conflict with it), is refused.
//! Otherwise a tenant allowed a labelled ConfigMap could add clusters to the
//! shipped policy's allowed set, or make every decision fail.
//!
//! Nor may modules or data ConfigMaps (at `data.<namespace>.<name>.<key>`)
//! of other namespaces write where placement-sync writes documents of its
//! own (the replicated objects, its sentinel): `package kubernetes.clusters`,
//! or a data ConfigMap of a namespace named `kubernetes`, would add a cluster
//! to `data.kubernetes.clusters`. Data ConfigMaps of other namespaces may not
//! write in an owned package either.

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
    /// Documents placement-sync writes itself, as components.
    documents: Vec<Vec<String>>,
    /// Namespaces whose ConfigMaps may write them.
    namespaces: BTreeSet<String>,
}

/// What is owned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owned {
    Package,
    /// A document placement-sync writes itself.
    Document,
}

/// Why a module or data document may not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trespass {
    /// The owned package or document it writes, dotted.
    pub owned: String,
    pub kind: Owned,
    /// What it writes (a package, a rule's path, a document's path), dotted.
    pub path: String,
    /// The path is a document above the owned one (it would extend or
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
            documents: Vec::new(),
            namespaces: namespaces.into_iter().collect(),
        }
    }

    /// With the documents placement-sync writes itself (`a/b` paths).
    pub(crate) fn with_documents(mut self, paths: impl IntoIterator<Item = String>) -> Self {
        self.documents = paths
            .into_iter()
            .map(|p| {
                p.split('/')
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .filter(|p: &Vec<String>| !p.is_empty())
            .collect();
        self
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
    /// writes an owned package or among the documents placement-sync writes
    /// (rules under `data.kubernetes.clusters` would add clusters).
    pub(crate) fn check(&self, id: &str, source: &str) -> Result<(), Trespass> {
        let namespace = id.split('/').next().unwrap_or_default();
        if self.namespaces.contains(namespace) {
            return Ok(());
        }
        let owned = [
            (&self.packages, Owned::Package),
            (&self.documents, Owned::Document),
        ];
        match module_writes(id, source) {
            Ok(writes) => {
                for (paths, kind) in owned {
                    // The package itself counts only at or under an owned
                    // path: `package io.k8s` writes nothing by being declared.
                    let package = &writes.package;
                    if let Some(o) = under(paths, &package.path) {
                        return Err(trespass(o, kind, &package.path, Some(package.line)));
                    }
                    for rule in &writes.rules {
                        if let Some(o) = on_branch(paths, &rule.path) {
                            return Err(trespass(o, kind, &rule.path, Some(rule.line)));
                        }
                    }
                }
                Ok(())
            }
            // What regorus cannot read the engine may still take: judge it
            // by its package, read by the scanner, and refuse one on an owned
            // path's branch (its rules could reach into it).
            Err(_) => {
                let Some(package) = rego_refs::scan(source).package else {
                    return Ok(());
                };
                let path: Vec<String> = package.split('.').map(str::to_owned).collect();
                for (paths, kind) in owned {
                    if let Some(o) = on_branch(paths, &path) {
                        return Err(trespass(o, kind, &path, None));
                    }
                }
                Ok(())
            }
        }
    }

    /// Whether the data document `id` (`namespace/configmap/key`) may be
    /// written: always from an owner's namespace; from elsewhere, unless it
    /// lies in or above an owned package or a document placement-sync writes.
    pub(crate) fn check_data(&self, id: &str) -> Result<(), Trespass> {
        let path: Vec<String> = id.split('/').map(str::to_owned).collect();
        if path.first().is_some_and(|ns| self.namespaces.contains(ns)) {
            return Ok(());
        }
        if let Some(owned) = on_branch(&self.packages, &path) {
            return Err(trespass(owned, Owned::Package, &path, None));
        }
        if let Some(owned) = on_branch(&self.documents, &path) {
            return Err(trespass(owned, Owned::Document, &path, None));
        }
        Ok(())
    }

    /// The status error of `trespass` by module or data document `id`.
    pub(crate) fn refusal(&self, id: &str, trespass: &Trespass) -> CompileError {
        let namespace = id.split('/').next().unwrap_or_default();
        let relation = if trespass.above { "above" } else { "in" };
        let (owned, may) = match trespass.kind {
            Owned::Package => (
                format!("the owned package {}, which", trespass.owned),
                "may declare or extend it",
            ),
            Owned::Document => (
                format!(
                    "data.{}, which placement-sync writes itself and",
                    trespass.owned
                ),
                "may write there",
            ),
        };
        let writers = if self.namespaces.is_empty() {
            "no namespace may (none is named: see --package-owner-namespaces)".to_owned()
        } else {
            format!(
                "only ConfigMaps in namespace {} {may}",
                self.namespaces
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        CompileError {
            file: Some(id.to_owned()),
            row: trespass.line,
            col: None,
            code: Some(OWNED_PACKAGE.to_owned()),
            message: format!(
                "writes data.{} {relation} {owned} namespace {namespace} does not own: {writers}; it is not loaded and the policy set in force stays as it is",
                trespass.path
            ),
        }
    }
}

/// The owned path `path` lies in (at or under it).
fn under<'a>(owned: &'a [Vec<String>], path: &[String]) -> Option<&'a Vec<String>> {
    owned.iter().find(|o| path.starts_with(o))
}

/// The owned path `path` lies in, or lies above.
fn on_branch<'a>(owned: &'a [Vec<String>], path: &[String]) -> Option<&'a Vec<String>> {
    owned
        .iter()
        .find(|o| path.starts_with(o) || o.starts_with(path))
}

fn trespass(owned: &[String], kind: Owned, path: &[String], line: Option<u32>) -> Trespass {
    Trespass {
        owned: owned.join("."),
        kind,
        path: path.join("."),
        above: !path.starts_with(owned),
        line,
    }
}

#[cfg(test)]
mod tests;
