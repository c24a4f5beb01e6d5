//! What a Rego module defines and needs, read from its source: its package,
//! the packages it imports and the `data` paths it refers to. The policy
//! loader uses it to refuse a policy set that needs a package no module
//! defines (it would evaluate to a defined but empty decision) and to load the
//! modules of one change dependencies first, so that no query sees a module
//! without the ones it needs.
//!
//! Read from regorus's parse ([`policy_client::rego_analysis`], the analysis
//! the decision cache reads `input` paths from): comments and strings are no
//! references, the expressions of a template string are. A reference in a
//! rule body only counts as a package reference when its first segment is
//! also the first segment of a package of the set (anything else is data,
//! which policies may read without a module defining it). A module regorus
//! cannot parse is known by its package line alone (it needs nothing known),
//! and may read any replicated type.

use std::collections::{BTreeMap, BTreeSet};

use policy_client::rego_analysis::{ModuleAnalysis, Reference};

/// The package a module defines and the `data` paths it needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ModuleRefs {
    pub package: Option<String>,
    /// `import data.<path>` statements.
    pub imports: BTreeSet<String>,
    /// Dotted `data.<path>` references elsewhere.
    pub references: BTreeSet<String>,
}

/// Read a module's package, imports and references.
pub(crate) fn scan(source: &str) -> ModuleRefs {
    let dotted = |references: &[Reference]| -> BTreeSet<String> {
        references
            .iter()
            .filter(|r| !r.path.is_empty())
            .map(|r| r.path.join("."))
            .collect()
    };
    match ModuleAnalysis::parse("module", source) {
        Ok(module) => ModuleRefs {
            package: Some(module.package.join(".")),
            imports: dotted(&module.data_imports),
            references: dotted(&module.data_references),
        },
        Err(_) => ModuleRefs {
            package: ModuleAnalysis::package_line("module", source).map(|p| p.join(".")),
            ..ModuleRefs::default()
        },
    }
}

/// A module id that needs a package which no module of the set defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Missing {
    pub module: String,
    pub package: String,
}

/// The packages the modules of `set` (id -> source) need and nobody defines.
/// Paths under `data_roots` (replicated data) are data, never packages.
pub(crate) fn missing_packages(
    set: &BTreeMap<String, String>,
    data_roots: &[String],
) -> Vec<Missing> {
    let scanned: BTreeMap<&String, ModuleRefs> =
        set.iter().map(|(id, source)| (id, scan(source))).collect();
    let packages: Vec<Vec<&str>> = scanned
        .values()
        .filter_map(|r| r.package.as_deref())
        .map(|p| p.split('.').collect())
        .collect();
    let package_roots: BTreeSet<&str> =
        packages.iter().filter_map(|p| p.first().copied()).collect();
    let mut missing = Vec::new();
    for (id, refs) in &scanned {
        // An import names a package; a reference in a rule body names a rule
        // (or a member) of one, so its package is the path less its last
        // segment: `data.a.b.selected` needs `a.b`.
        let referenced = refs.references.iter().filter_map(|r| {
            let package = r
                .rsplit_once('.')
                .map_or(r.as_str(), |(package, _)| package);
            package
                .split('.')
                .next()
                .is_some_and(|root| package_roots.contains(root))
                .then(|| package.to_owned())
        });
        let needed: BTreeSet<String> = refs.imports.iter().cloned().chain(referenced).collect();
        for path in &needed {
            let segments: Vec<&str> = path.split('.').collect();
            if data_roots.iter().any(|root| root == segments[0]) {
                continue;
            }
            // A package deeper than the path (a parent document) or one the
            // path lies in (a rule of it) satisfies it.
            let defined = packages.iter().any(|p| {
                let n = p.len().min(segments.len());
                p[..n] == segments[..n]
            });
            let entry = Missing {
                module: (*id).clone(),
                package: path.clone(),
            };
            if !defined && !missing.contains(&entry) {
                missing.push(entry);
            }
        }
    }
    missing
}

/// A module a change removes that must not go alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Removal {
    pub module: String,
    pub package: String,
    pub reason: RemovalReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RemovalReason {
    /// It defines the decision package, and other modules stay: every query
    /// would find no decision (fail closed), not "no policy".
    Decision { remaining: usize },
    /// One of several files of its package, whose other files the change
    /// leaves as they are: the package would lose rules no one meant to drop.
    PartOfPackage { remaining: usize },
}

/// The removals of a change from `before` to `after` (module id -> source)
/// that would leave the policy set less than whole: the decision package
/// (`decision`, dotted) gone while other modules stay, or one file of a
/// package whose other files the change does not touch. Removing a whole
/// package (every file), or a file while editing the rest of its package,
/// is not refused here (a package something still needs is
/// [`missing_packages`]).
pub(crate) fn refused_removals(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    decision: &str,
) -> Vec<Removal> {
    // Each module read once: the packages the set keeps.
    let packages_after: Vec<(&String, Option<String>)> = after
        .iter()
        .map(|(id, source)| (id, scan(source).package))
        .collect();
    let mut refused = Vec::new();
    for (id, source) in before {
        if after.contains_key(id) {
            continue;
        }
        let Some(package) = scan(source).package else {
            continue;
        };
        let staying: Vec<&String> = packages_after
            .iter()
            .filter(|(_, p)| p.as_deref() == Some(package.as_str()))
            .map(|(id, _)| *id)
            .collect();
        let reason = if package == decision && staying.is_empty() && !after.is_empty() {
            RemovalReason::Decision {
                remaining: after.len(),
            }
        } else if !staying.is_empty()
            && staying
                .iter()
                .all(|other| before.get(*other) == after.get(*other))
        {
            RemovalReason::PartOfPackage {
                remaining: staying.len(),
            }
        } else {
            continue;
        };
        refused.push(Removal {
            module: id.clone(),
            package,
            reason,
        });
    }
    refused
}

/// The ids of `set`, each after the modules whose packages it needs (ties and
/// cycles in id order): loading in this order, no module arrives before what
/// it imports.
pub(crate) fn load_order(set: &BTreeMap<String, String>) -> Vec<String> {
    let scanned: BTreeMap<&String, ModuleRefs> =
        set.iter().map(|(id, source)| (id, scan(source))).collect();
    let needs = |id: &String| -> BTreeSet<String> {
        let refs = &scanned[id];
        scanned
            .iter()
            .filter(|(other, r)| {
                **other != id
                    && r.package.as_deref().is_some_and(|p| {
                        refs.imports
                            .iter()
                            .chain(&refs.references)
                            .any(|path| path == p || path.starts_with(&format!("{p}.")))
                    })
            })
            .map(|(other, _)| (*other).clone())
            .collect()
    };
    let mut order: Vec<String> = Vec::new();
    let mut pending: Vec<String> = set.keys().cloned().collect();
    while !pending.is_empty() {
        let ready = pending
            .iter()
            .position(|id| needs(id).iter().all(|n| order.contains(n)))
            // A cycle: take the first and go on.
            .unwrap_or(0);
        order.push(pending.remove(ready));
    }
    order
}

/// Which replicated types a policy set may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DataReads {
    /// Any of them: a reference the scanner cannot pin to one type (`data`
    /// or the replication root indexed dynamically, passed whole, imported
    /// whole), or modules whose source is unknown.
    All,
    /// Exactly these resources (plural names) under the replication root.
    Types(BTreeSet<String>),
}

impl DataReads {
    pub(crate) fn includes(&self, resource: &str) -> bool {
        match self {
            DataReads::All => true,
            DataReads::Types(types) => types.contains(resource),
        }
    }
}

/// The [`DataReads`] of the policies in force, shared by the policy loader
/// (which sets it whenever the policy set changes) and the replicators (a
/// write of a type no policy reads triggers no remediation). [`DataReads::All`]
/// until the loader first analysed the policies.
#[derive(Debug, Clone)]
pub(crate) struct PolicyReads(std::sync::Arc<parking_lot::RwLock<DataReads>>);

impl Default for PolicyReads {
    fn default() -> Self {
        PolicyReads(std::sync::Arc::new(parking_lot::RwLock::new(
            DataReads::All,
        )))
    }
}

impl PolicyReads {
    pub(crate) fn includes(&self, resource: &str) -> bool {
        self.0.read().includes(resource)
    }

    pub(crate) fn get(&self) -> DataReads {
        self.0.read().clone()
    }

    pub(crate) fn set(&self, reads: DataReads) {
        let mut current = self.0.write();
        if *current != reads {
            tracing::info!(?reads, "replicated types the policies read");
            *current = reads;
        }
    }
}

/// The replicated types that `sources` may read, for replicated data at
/// `root` (e.g. `["kubernetes"]` for `data.kubernetes.<resource>`). Errs on
/// the side of [`DataReads::All`]: a type missed here would leave workloads
/// placed on stale data.
pub(crate) fn data_reads<'a>(
    sources: impl IntoIterator<Item = &'a str>,
    root: &[&str],
) -> DataReads {
    let mut types = BTreeSet::new();
    for source in sources {
        let Ok(module) = ModuleAnalysis::parse("module", source) else {
            return DataReads::All;
        };
        for reference in module.data_imports.iter().chain(&module.data_references) {
            let segments = &reference.path;
            let shared = segments
                .iter()
                .zip(root)
                .take_while(|(a, b)| a == *b)
                .count();
            if shared < segments.len().min(root.len()) {
                // Elsewhere in `data`: a package, or other data.
                continue;
            }
            match segments.get(root.len()) {
                Some(resource) => {
                    types.insert(resource.clone());
                }
                // The root or above (`data[x]`, `walk(data)`, `import data`),
                // indexed or passed on: anything.
                None => return DataReads::All,
            }
        }
    }
    DataReads::Types(types)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> BTreeMap<String, String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        [
            "placement.rego",
            "placement_rules.rego",
            "placement_settings.rego",
        ]
        .iter()
        .map(|name| {
            (
                format!("ns/placement/{name}"),
                std::fs::read_to_string(dir.join(name)).unwrap(),
            )
        })
        .collect()
    }

    #[test]
    fn the_shipped_policy_is_whole_and_loads_dependencies_first() {
        let set = shipped();
        assert!(missing_packages(&set, &["kubernetes".into()]).is_empty());
        assert_eq!(
            load_order(&set),
            [
                "ns/placement/placement_settings.rego",
                "ns/placement/placement_rules.rego",
                "ns/placement/placement.rego"
            ]
        );
    }

    #[test]
    fn the_decision_without_its_rules_names_the_missing_package() {
        let mut set = shipped();
        set.remove("ns/placement/placement_rules.rego");
        assert_eq!(
            missing_packages(&set, &["kubernetes".into()]),
            [Missing {
                module: "ns/placement/placement.rego".into(),
                package: "io.k8s.federation.placement".into()
            }]
        );
    }

    #[test]
    fn removing_the_decision_or_part_of_a_package_is_refused() {
        let set = |modules: &[(&str, &str)]| -> BTreeMap<String, String> {
            modules
                .iter()
                .map(|(id, source)| ((*id).to_owned(), (*source).to_owned()))
                .collect()
        };
        let decision = "package io.k8s.federation.admission\n\nimport data.rules\n";
        let rules_a = "package rules\n\na := 1\n";
        let rules_b = "package rules\n\nb := 2\n";
        let before = set(&[
            ("cm/d.rego", decision),
            ("cm/a.rego", rules_a),
            ("cm/b.rego", rules_b),
        ]);
        let refused = |after: &[(&str, &str)]| {
            refused_removals(&before, &set(after), "io.k8s.federation.admission")
        };
        assert_eq!(
            refused(&[("cm/a.rego", rules_a), ("cm/b.rego", rules_b)]),
            vec![Removal {
                module: "cm/d.rego".into(),
                package: "io.k8s.federation.admission".into(),
                reason: RemovalReason::Decision { remaining: 2 }
            }]
        );
        assert!(refused(&[]).is_empty(), "the whole policy removed");
        assert_eq!(
            refused(&[("cm/d.rego", decision), ("cm/a.rego", rules_a)]),
            vec![Removal {
                module: "cm/b.rego".into(),
                package: "rules".into(),
                reason: RemovalReason::PartOfPackage { remaining: 1 }
            }]
        );
        // Folding b into a in the same change, or dropping the package whole,
        // is meant.
        let folded = "package rules\n\na := 1\n\nb := 2\n";
        assert!(refused(&[("cm/d.rego", decision), ("cm/a.rego", folded)]).is_empty());
        assert!(refused(&[("cm/d.rego", decision)]).is_empty());
    }

    #[test]
    fn data_references_comments_and_strings_are_not_packages() {
        let source = r#"package a.b
# import data.nowhere
import data.kubernetes.clusters
msg := "data.nowhere.either"
raw := `data.not.this`
x := data.inventory.hosts
y := data.a.c.rule
"#;
        let refs = scan(source);
        assert_eq!(refs.package.as_deref(), Some("a.b"));
        assert_eq!(
            refs.imports,
            BTreeSet::from(["kubernetes.clusters".to_owned()])
        );
        assert_eq!(
            refs.references,
            BTreeSet::from(["inventory.hosts".to_owned(), "a.c.rule".to_owned()])
        );
        let set = BTreeMap::from([("m".to_owned(), source.to_owned())]);
        // `data.a.c.rule` lies in the set's package tree ("a") and nothing
        // defines its package `a.c`; `data.inventory` is data; kubernetes is
        // replicated.
        assert_eq!(
            missing_packages(&set, &["kubernetes".into()]),
            [Missing {
                module: "m".into(),
                package: "a.c".into()
            }]
        );
    }

    #[test]
    fn a_data_reference_inside_a_template_string_is_a_reference() {
        // `$"..."` holds Rego expressions in `{...}`; `\{` is a literal brace
        // and strings inside an expression are strings.
        let main = r#"package a.main
msg := $"allowed: {data.a.lib.allowed} \{data.not.this} {concat(",", ["data.nor.this"])}"
raw := $`{data.a.other.rule}`
"#;
        let refs = scan(main);
        assert_eq!(
            refs.references,
            BTreeSet::from(["a.lib.allowed".to_owned(), "a.other.rule".to_owned()])
        );
        let lib = "package a.lib\nallowed := true\n";
        let set = BTreeMap::from([
            ("cm/a.rego".to_owned(), main.to_owned()),
            ("cm/b.rego".to_owned(), lib.to_owned()),
        ]);
        assert_eq!(load_order(&set), ["cm/b.rego", "cm/a.rego"]);
        assert_eq!(
            missing_packages(&set, &[]),
            [Missing {
                module: "cm/a.rego".into(),
                package: "a.other".into()
            }]
        );
        let reads = "package a\nm := $\"{count(data.kubernetes.nodes)}\"\n";
        assert_eq!(
            data_reads([reads], &["kubernetes"]),
            DataReads::Types(["nodes".to_owned()].into())
        );
    }

    /// A template string's expression is Rego like any other: a bracketed
    /// reference in it (`data["a"].lib.allowed`) names `a.lib` as much as a
    /// dotted one does, for the load order and the missing-package check.
    #[test]
    fn a_bracketed_data_reference_inside_a_template_string_is_a_reference() {
        let main = r#"package a.main
msg := $"allowed: {data["a"].lib.allowed} and {data.a["other"].rule}"
"#;
        let lib = "package a.lib\nallowed := true\n";
        let set = BTreeMap::from([
            ("cm/a.rego".to_owned(), main.to_owned()),
            ("cm/b.rego".to_owned(), lib.to_owned()),
        ]);
        assert_eq!(load_order(&set), ["cm/b.rego", "cm/a.rego"]);
        assert_eq!(
            missing_packages(&set, &[]),
            [Missing {
                module: "cm/a.rego".into(),
                package: "a.other".into()
            }]
        );
    }

    #[test]
    fn a_parent_document_or_a_rule_inside_a_package_is_satisfied() {
        let set = BTreeMap::from([
            ("p".to_owned(), "package x.y.z\nr := 1\n".to_owned()),
            (
                "q".to_owned(),
                "package x.main\nimport data.x.y\nv := data.x.y.z.r\n".to_owned(),
            ),
        ]);
        assert!(missing_packages(&set, &[]).is_empty());
        assert_eq!(load_order(&set), ["p", "q"]);
    }

    #[test]
    fn data_reads_pins_the_types_policies_read() {
        let root = ["kubernetes"];
        let shipped = [
            include_str!("../../../policies/placement.rego"),
            include_str!("../../../policies/placement_rules.rego"),
            include_str!("../../../policies/placement_settings.rego"),
        ];
        assert_eq!(
            data_reads(shipped, &root),
            DataReads::Types(["clusters".to_owned(), "managedclusters".to_owned()].into())
        );
        let aliased = "package a\nimport data.kubernetes.nodes as n\nx := count(n)\n";
        assert!(data_reads([aliased], &root).includes("nodes"));
        assert!(!data_reads([aliased], &root).includes("replicasets"));
        // Comments, strings and identifiers containing `data` are not reads.
        let quiet = "package a\n# data.kubernetes[x]\nm := input.metadata\ns := \"data[1]\"\n";
        assert_eq!(
            data_reads([quiet], &root),
            DataReads::Types(BTreeSet::new())
        );
        // Elsewhere in data: packages and other documents.
        let other =
            "package a\nimport data.io.k8s.federation.placement\nx := data.default.inventory\n";
        assert_eq!(
            data_reads([other], &root),
            DataReads::Types(BTreeSet::new())
        );
        // Whatever cannot be pinned to one type reads them all.
        for dynamic in [
            "package a\nx := data.kubernetes[t]\n",
            "package a\nx := data[\"kubernetes\"]\n",
            "package a\nimport data.kubernetes\n",
            "package a\nx := object.get(data.kubernetes, \"pods\", {})\n",
            "package a\nx := walk(data)\n",
            "package a\nimport data\n",
        ] {
            assert_eq!(data_reads([dynamic], &root), DataReads::All, "{dynamic}");
        }
        // A nested replication root.
        let nested = "package a\nx := data.replicated.k8s.pods\ny := data.replicated.other\n";
        assert_eq!(
            data_reads([nested], &["replicated", "k8s"]),
            DataReads::Types(["pods".to_owned()].into())
        );
    }
}
