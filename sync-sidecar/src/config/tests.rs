use policy_client::configmaps::DEFAULT_POLICY_NAMESPACE;

use super::engine::{ReplicaScope, parse_opa_url};
use super::writers::DEFAULT_LEASE_NAME;
use super::*;

fn args(extra: &[&str]) -> Args {
    let mut argv = vec!["placement-sync"];
    argv.extend_from_slice(extra);
    Args::try_parse_from(argv).unwrap()
}

#[test]
fn repeatable_and_comma_separated_types() {
    let a = args(&[
        "--replicate=apps/v1/replicasets",
        "--replicate",
        "v1/services,v1/pods",
        "--replicate-cluster=federation.example.io/v1/clusters",
        "--replicate-ignore-namespaces=kube-system, kube-public",
        "--leader-election=false",
    ]);
    let s = Settings::from_args(a).unwrap();
    let names: Vec<String> = s.replicate.iter().map(|r| r.gvr.to_string()).collect();
    assert_eq!(
        names,
        [
            "apps/v1/replicasets",
            "v1/services",
            "v1/pods",
            "federation.example.io/v1/clusters"
        ]
    );
    assert_eq!(s.replicate[3].scope, ReplicaScope::Cluster);
    assert_eq!(s.replicate[0].scope, ReplicaScope::Namespaced);
    assert_eq!(
        s.ignore_namespaces.iter().collect::<Vec<_>>(),
        ["kube-public", "kube-system"]
    );
    assert!(s.leader.is_none());
}

#[test]
fn defaults() {
    let s = Settings::from_args(args(&["--identity=pod-a"])).unwrap();
    assert_eq!(s.replicate_path, "kubernetes");
    assert_eq!(
        s.configmaps.policy_namespace.as_deref(),
        Some(DEFAULT_POLICY_NAMESPACE)
    );
    assert!(s.configmaps.namespaces.is_empty());
    assert_eq!(s.decision, "io/k8s/federation/admission");
    assert_eq!(s.remediation, RemediationMode::Auto);
    assert_eq!(
        s.remediate,
        vec![
            Gvr::new("apps", "v1", "replicasets"),
            Gvr::new("apps", "v1", "deployments")
        ]
    );
    assert_eq!(s.remediation_debounce, Duration::from_millis(500));
    assert_eq!(
        s.partition,
        PartitionRule {
            threshold: 0.55,
            window: Duration::from_secs(60)
        }
    );
    let leader = s.leader.unwrap();
    assert_eq!(leader.identity, "pod-a");
    assert_eq!(leader.lease_name, DEFAULT_LEASE_NAME);
    assert_eq!(s.opa_url.as_str(), "http://127.0.0.1:8181/");
}

#[test]
fn bad_values_are_named() {
    assert!(Args::try_parse_from(["x", "--replicate=ReplicaSet"]).is_err());
    assert!(Args::try_parse_from(["x", "--remediation=sometimes"]).is_err());
    let dup = Settings::from_args(args(&[
        "--replicate=apps/v1/replicasets",
        "--replicate=extensions/v1beta1/replicasets",
    ]))
    .unwrap_err();
    assert!(dup.to_string().contains("replicated twice"), "{dup}");
    let label = Settings::from_args(args(&["--policy-label=a=b=c"])).unwrap_err();
    assert!(label.to_string().contains("--policy-label"), "{label}");
    let bundles = Settings::from_args(args(&["--analysis-entrypoint=main/main"])).unwrap_err();
    assert!(bundles.to_string().contains("not supported"), "{bundles}");
    let token = Settings::from_args(args(&["--opa-token-file=/nonexistent/token"])).unwrap_err();
    assert!(token.to_string().contains("--opa-token-file"), "{token}");
    let rate = Settings::from_args(args(&["--remediation-rate=-1"])).unwrap_err();
    assert!(rate.to_string().contains("--remediation-rate"), "{rate}");
}

#[test]
fn each_group_names_its_flag() {
    let error = |flags: &[&str]| Settings::from_args(args(flags)).unwrap_err().to_string();
    for (flags, message) in [
        (
            &["--sentinel-path=kubernetes/x"][..],
            "--sentinel-path must not lie under --replicate-path",
        ),
        (
            &["--replicate-path=/"],
            "--replicate-path must not be empty",
        ),
        (&["--decision=/"], "--decision must not be empty"),
        (&["--workers=0"], "--workers must be at least 1"),
        (
            &["--engine-check-interval=0s"],
            "--engine-check-interval must be positive",
        ),
        (
            &["--schedule-karmada-bindings", "--scheduler-name= "],
            "--scheduler-name must not be empty",
        ),
        (
            &["--decide-ocm-placements", "--scheduler-name= "],
            "--scheduler-name must not be empty",
        ),
        (
            &["--sig-placement-decisions"],
            "--sig-placement-decisions needs --decide-ocm-placements",
        ),
        (
            &["--identity=pod-a", "--lease-duration=1s"],
            "--lease-duration must be at least 3s",
        ),
        (
            &["--ownership-secret=nameonly"],
            "--ownership-secret must be NAMESPACE/NAME, got \"nameonly\"",
        ),
        (
            &["--last-good-policies=ns/"],
            "--last-good-policies must be NAMESPACE/NAME, got \"ns/\"",
        ),
        (
            &["--remediation-hold-share=1.5"],
            "--remediation-hold-share must be between 0 and 1, got 1.5",
        ),
        (
            &["--remediation-partition-threshold=-0.1"],
            "--remediation-partition-threshold must be between 0 and 1, got -0.1",
        ),
    ] {
        assert_eq!(
            error(flags),
            format!("configuration: {message}"),
            "{flags:?}"
        );
    }
    // The first mistake in a fixed order is the one named.
    assert_eq!(
        error(&["--workers=0", "--replicate-path=/"]),
        "configuration: --replicate-path must not be empty"
    );
}

#[test]
fn opa_url_accepts_kube_mgmt_style() {
    assert_eq!(
        parse_opa_url("http://localhost:8181/v1").unwrap().as_str(),
        "http://localhost:8181/"
    );
    assert_eq!(
        parse_opa_url("https://opa.example:8443/proxy/v1/")
            .unwrap()
            .as_str(),
        "https://opa.example:8443/proxy"
    );
    assert!(parse_opa_url("ftp://x").is_err());
    assert!(parse_opa_url("not a url").is_err());
}

#[test]
fn kube_mgmt_flags_mean_kube_mgmt_mode() {
    let s = Settings::from_args(args(&[
        "--opa-url=https://127.0.0.1:8181/v1",
        "--namespaces=default,team-a",
        "--enable-data=false",
        "--policy-label=qweqwe/policy",
        "--policy-value=111",
        "--opa-allow-insecure",
        "--health-endpoint=0.0.0.0:8182",
        "--log-level=debug",
    ]))
    .unwrap();
    assert_eq!(s.configmaps.policy_namespace, None);
    assert_eq!(s.configmaps.namespaces, ["default", "team-a"]);
    assert!(s.configmaps.enable_policies && !s.configmaps.enable_data);
    assert_eq!(s.configmaps.policy_label, "qweqwe/policy");
    assert_eq!(s.opa_url.as_str(), "https://127.0.0.1:8181/");
    assert!(s.opa_allow_insecure);
    assert_eq!(s.listen.to_string(), "0.0.0.0:8182");
    // No webhook, no RBAC for workloads: nothing to remediate, no Lease.
    assert_eq!(s.remediation, RemediationMode::Off);
    assert!(s.leader.is_none());
    let asked = Settings::from_args(args(&[
        "--namespaces=default",
        "--remediation=report",
        "--identity=pod-a",
    ]))
    .unwrap();
    assert_eq!(asked.remediation, RemediationMode::Report);
    assert_eq!(
        asked.leader.unwrap().lease_namespace,
        DEFAULT_POLICY_NAMESPACE
    );
}

#[test]
fn a_binding_scheduler_elects_a_leader_with_remediation_off() {
    let s = Settings::from_args(args(&[
        "--remediation=off",
        "--schedule-karmada-bindings",
        "--identity=pod-a",
    ]))
    .unwrap();
    assert_eq!(s.remediation, RemediationMode::Off);
    assert!(s.karmada.schedule && !s.karmada.guard);
    assert_eq!(s.karmada.scheduler_name, "placement-policy");
    assert_eq!(s.leader.unwrap().identity, "pod-a");
    let guard = Settings::from_args(args(&[
        "--remediation=off",
        "--guard-karmada-bindings",
        "--identity=pod-a",
    ]))
    .unwrap();
    assert!(guard.karmada.guard && !guard.karmada.schedule);
    assert!(guard.leader.is_some(), "the guardrail writes too");
    let alone = Settings::from_args(args(&["--remediation=off", "--identity=pod-a"])).unwrap();
    assert!(alone.leader.is_none());
}

#[test]
fn the_placement_decider_elects_a_leader_and_shares_the_scheduler_name() {
    let s = Settings::from_args(args(&[
        "--remediation=off",
        "--decide-ocm-placements",
        "--sig-placement-decisions",
        "--scheduler-name=rego",
        "--identity=pod-a",
    ]))
    .unwrap();
    assert_eq!(
        s.ocm_decider,
        Some(OcmDecider {
            scheduler_name: "rego".into(),
            sig_placement_decisions: true
        })
    );
    assert!(!s.karmada.any(), "deciding Placements schedules no binding");
    assert_eq!(s.leader.unwrap().identity, "pod-a");
}

#[test]
fn the_replicate_path_gives_the_data_root_and_the_segments() {
    let s = Settings::from_args(args(&["--replicate-path=/kube/objects/"])).unwrap();
    assert_eq!(s.replicate_path, "kube/objects");
    assert_eq!(s.replicate_root(), ["kube", "objects"]);
    assert_eq!(s.data_roots(), ["kube"]);
    let s = Settings::from_args(args(&[])).unwrap();
    assert_eq!(s.replicate_root(), ["kubernetes"]);
    assert_eq!(s.data_roots(), ["kubernetes"]);
}

#[test]
fn owned_packages_are_written_from_the_policy_namespace_and_the_named_ones() {
    let s = Settings::from_args(args(&["--leader-election=false"])).unwrap();
    assert_eq!(
        s.package_owners.packages(),
        [
            "io.k8s.federation.admission",
            "io.k8s.federation.placement",
            "io.k8s.federation.settings"
        ]
    );
    assert_eq!(
        s.package_owners.namespaces().iter().collect::<Vec<_>>(),
        [DEFAULT_POLICY_NAMESPACE]
    );
    let s = Settings::from_args(args(&[
        "--leader-election=false",
        "--decision=acme/admission",
        "--owned-packages=acme.rules, data.acme.settings,acme/tiers",
        "--package-owner-namespaces=platform,security",
    ]))
    .unwrap();
    assert_eq!(
        s.package_owners.packages(),
        [
            "acme.admission",
            "acme.rules",
            "acme.settings",
            "acme.tiers",
            "io.k8s.federation.admission",
            "io.k8s.federation.placement",
            "io.k8s.federation.settings"
        ]
    );
    assert_eq!(
        s.package_owners.namespaces().iter().collect::<Vec<_>>(),
        [DEFAULT_POLICY_NAMESPACE, "platform", "security"]
    );
    // kube-mgmt's mode: no policy namespace, only the named owners.
    let s = Settings::from_args(args(&["--namespaces=*", "--leader-election=false"])).unwrap();
    assert!(s.package_owners.namespaces().is_empty());
    let err = Settings::from_args(args(&["--owned-packages=acme.rules,acme-x"])).unwrap_err();
    assert!(
        err.to_string()
            .contains("--owned-packages: \"acme-x\" is not a package name"),
        "{err}"
    );
}
