use super::*;

const POLICY_NS: &str = "kube-federation-scheduling-policy";

fn owners() -> PackageOwners {
    PackageOwners::new(
        SHIPPED_PACKAGES.iter().map(|p| (*p).to_owned()),
        [POLICY_NS.to_owned(), "platform".to_owned()],
    )
}

fn tenant(source: &str) -> Result<(), Trespass> {
    owners().check("team-a/tenant-policy/main.rego", source)
}

#[test]
fn a_tenant_declaring_a_shipped_package_or_one_under_it_is_refused() {
    let trespass = tenant(
        "package io.k8s.federation.placement\n\njurisdiction_clusters contains \"member-us-1\"\n",
    )
    .unwrap_err();
    assert_eq!(
        trespass,
        Trespass {
            owned: "io.k8s.federation.placement".into(),
            kind: Owned::Package,
            path: "io.k8s.federation.placement".into(),
            above: false,
            line: Some(1),
        }
    );
    // A conflicting rule, the decision, the settings, a subpackage.
    for source in [
        "package io.k8s.federation.placement\n\nallowed := {}\n",
        "package io.k8s.federation.admission\n\nerrors := {\"no\"}\n",
        "package io.k8s.federation.settings\n\ntrust_cluster_claims := true\n",
        "package io.k8s.federation.placement.extra\n\nx := 1\n",
        // Declared only: nothing to gain, still not theirs.
        "package io.k8s.federation.settings\n",
    ] {
        assert!(tenant(source).is_err(), "{source}");
    }
}

#[test]
fn a_tenant_reaching_into_an_owned_package_from_above_is_refused() {
    // Rule heads that are references write below their package.
    let trespass = tenant(
        "package io.k8s\n\n# a comment\nfederation.placement.jurisdiction_clusters contains \"member-us-1\"\n",
    )
    .unwrap_err();
    assert_eq!(
        trespass.path,
        "io.k8s.federation.placement.jurisdiction_clusters"
    );
    assert_eq!(trespass.line, Some(4));
    assert!(!trespass.above);
    // A document above the package conflicts with it; a key that varies
    // may be its name.
    for source in [
        "package io.k8s\n\nfederation := {\"placement\": {}}\n",
        "package io.k8s.federation\n\nplacement[\"allowed\"] := {}\n",
        "package io.k8s\n\nfederation[kind].allowed := {} if some kind in {\"placement\"}\n",
    ] {
        let trespass = tenant(source).unwrap_err();
        assert!(
            trespass.above || trespass.path.contains("placement"),
            "{source}: {trespass:?}"
        );
    }
}

#[test]
fn a_tenants_own_packages_load_even_beside_the_shipped_ones() {
    for source in [
        "package tenant.rules\n\nok := true\n",
        // Beside the shipped packages, not in them.
        "package io.k8s.federation.tenant_a\n\nok := true\n",
        "package io.k8s\n\ntenant.limits := 3\n",
        // Reading the shipped policy is no write.
        "package tenant.rules\n\nimport data.io.k8s.federation.placement\n\nn := count(placement.allowed)\n",
        // Names that only look alike.
        "package io.k8s.federation.placements\n\nx := 1\n",
        "package tenant\n\nmsg := \"package io.k8s.federation.placement\"\n",
    ] {
        assert_eq!(tenant(source), Ok(()), "{source}");
    }
}

#[test]
fn the_owners_namespaces_write_the_owned_packages() {
    let extend =
        "package io.k8s.federation.placement\n\njurisdiction_clusters contains \"member-us-1\"\n";
    let owners = owners();
    assert_eq!(
        owners.check(&format!("{POLICY_NS}/placement/extra.rego"), extend),
        Ok(())
    );
    assert_eq!(owners.check("platform/eu-extra/main.rego", extend), Ok(()));
    // A namespace whose name starts like an owner's is another namespace.
    assert!(
        owners
            .check("platform-x/eu-extra/main.rego", extend)
            .is_err()
    );
}

#[test]
fn packages_an_administrator_names_are_owned_too() {
    let owners = PackageOwners::new(["acme.placement".to_owned()], [POLICY_NS.to_owned()]);
    assert!(
        owners
            .check("team-a/p/main.rego", "package acme.placement.rules\n")
            .is_err()
    );
    assert_eq!(
        owners.check("team-a/p/main.rego", "package acme.other\n"),
        Ok(())
    );
}

#[test]
fn what_regorus_cannot_read_is_judged_by_its_package() {
    // Not Rego regorus parses; its package, read by the scanner, decides.
    let broken_in = "package io.k8s.federation.placement\n\nallowed := \n";
    assert!(tenant(broken_in).is_err());
    let broken_above = "package io.k8s\n\nfederation.placement.allowed := \n";
    assert!(tenant(broken_above).is_err());
    let broken_elsewhere = "package tenant.rules\n\nok := \n";
    assert_eq!(tenant(broken_elsewhere), Ok(()));
}

#[test]
fn the_refusal_says_why_and_who_may_write_the_package() {
    let owners = owners();
    let id = "team-a/tenant-policy/main.rego";
    let trespass = owners
        .check(id, "package io.k8s\n\nfederation := {}\n")
        .unwrap_err();
    let error = owners.refusal(id, &trespass);
    assert_eq!(error.code.as_deref(), Some(OWNED_PACKAGE));
    assert_eq!(error.file.as_deref(), Some(id));
    assert_eq!(error.row, Some(3));
    assert_eq!(
        error.message,
        "writes data.io.k8s.federation above the owned package io.k8s.federation.admission, \
         which namespace team-a does not own: only ConfigMaps in namespace \
         kube-federation-scheduling-policy, platform may declare or extend it; it is not loaded \
         and the policy set in force stays as it is"
    );
    let nobody = PackageOwners::new(["a".to_owned()], Vec::<String>::new());
    let trespass = nobody.check(id, "package a\n").unwrap_err();
    assert!(
        nobody
            .refusal(id, &trespass)
            .message
            .contains("no namespace may (none is named: see --package-owner-namespaces)")
    );
}

#[test]
fn a_tenant_writing_among_the_replicated_objects_is_refused() {
    let owners = owners().with_documents([
        "kubernetes".to_owned(),
        "system/placement-sync/sentinel".to_owned(),
    ]);
    let id = "team-a/tenant-policy/main.rego";
    for source in [
        "package kubernetes.clusters\n\nfake := {\"status\": {\"phase\": \"running\"}}\n",
        "package kubernetes\n\nclusters.fake := {}\n",
        "package system[\"placement-sync\"]\n\nsentinel := \"x\"\n",
    ] {
        let trespass = owners.check(id, source).unwrap_err();
        assert_eq!(trespass.kind, Owned::Document, "{source}");
    }
    // Beside them: other documents.
    for source in [
        "package system.placement_sync\n\nsentinel := \"x\"\n",
        "package tenant\n\nkubernetes := 1\n",
        "package kubernetes_tools\n\nx := 1\n",
    ] {
        assert_eq!(owners.check(id, source), Ok(()), "{source}");
    }
    let error = owners.refusal(
        id,
        &owners
            .check(id, "package kubernetes.clusters\n\nfake := {}\n")
            .unwrap_err(),
    );
    assert_eq!(
        error.message,
        "writes data.kubernetes.clusters in data.kubernetes, which placement-sync writes itself \
         and namespace team-a does not own: only ConfigMaps in namespace \
         kube-federation-scheduling-policy, platform may write there; it is not loaded and the \
         policy set in force stays as it is"
    );
}
