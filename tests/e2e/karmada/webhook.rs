//! The webhook in Karmada's API server: an unplaceable workload denied, a
//! template's placement not changed through its status.

use super::*;

/// Admission in Karmada's API server: the webhook registered there (on the
/// scheduler's OPA) denies a workload the policy cannot place before any
/// binding exists, and places one it can (the template carries the
/// placement, and the scheduler follows it).
#[test]
fn karmada_the_webhook_denies_an_unplaceable_workload_in_karmadas_api_server() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let scheduler = Scheduler::shipped(karmada);
    let namespace = unique_name("karmada-admission");
    karmada.create_namespace(&namespace);
    let webhook = WebhookProcess::start(&[
        format!("--opa-url={}", scheduler.opa.url()),
        format!("--opa-token-file={}", scheduler.opa.token_file().display()),
        format!("--kubeconfig={}", karmada.karmada_kubeconfig().display()),
        format!("--policy-namespace={}", scheduler.policy_namespace),
    ]);
    karmada.register_webhook(
        &namespace,
        &webhook.url("/mutate"),
        &webhook.ca_pem,
        &scheduler.policy_namespace,
    );
    let vault = deployment(
        &namespace,
        "vault",
        2,
        json!({EU_KEY: "true", PCI_KEY: "5"}),
    );
    create(karmada, &[&handed_to(&namespace, "vault", &scheduler.name)]);
    let out = wait_for(
        "the webhook to answer in Karmada's API server",
        Duration::from_secs(60),
        || {
            let out = karmada.kubectl_stdin(&["create", "-f", "-"], &vault.to_string());
            String::from_utf8_lossy(&out.stderr)
                .contains("no cluster satisfies")
                .then_some(out)
        },
    );
    assert!(
        !out.status.success(),
        "the forbidden Deployment was created"
    );
    assert!(binding(karmada, &namespace, "vault").is_none());

    let web = deployment(&namespace, "web", 4, json!({EU_KEY: "true", PCI_KEY: "2"}));
    create(
        karmada,
        &[&handed_to(&namespace, "web", &scheduler.name), &web],
    );
    let stored: Value = serde_json::from_str(&karmada.kubectl_ok(&[
        "get",
        "deployment",
        "web",
        "-n",
        &namespace,
        "-o",
        "json",
    ]))
    .expect("deployment JSON");
    assert_eq!(
        placement_tests::placed_clusters(&stored),
        Some(vec!["member-eu-1".to_owned(), "member-eu-2".to_owned()]),
        "the webhook placed the template"
    );
    wait_scheduled(
        karmada,
        &scheduler,
        &namespace,
        "web",
        &split(&[("member-eu-1", 2), ("member-eu-2", 2)]),
    );
}

/// A placement cannot be changed past the webhook in Karmada's API server
/// either (issue 30, part 3): `deployments/status` of a placed template
/// used to store `member-us-1` in its replica-set preferences with no
/// admission call, and its binding then stayed on "requested
/// replica-set-preferences includes invalid clusters: member-us-1" until
/// someone repaired the annotation. The webhook keeps the template's
/// annotations as stored; the binding stays scheduled where it was.
#[test]
fn karmada_a_templates_placement_cannot_be_changed_through_its_status() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let scheduler = Scheduler::shipped(karmada);
    let namespace = unique_name("karmada-status");
    karmada.create_namespace(&namespace);
    let webhook = WebhookProcess::start(&[
        format!("--opa-url={}", scheduler.opa.url()),
        format!("--opa-token-file={}", scheduler.opa.token_file().display()),
        format!("--kubeconfig={}", karmada.karmada_kubeconfig().display()),
        format!("--policy-namespace={}", scheduler.policy_namespace),
    ]);
    karmada.register_webhook(
        &namespace,
        &webhook.url("/mutate"),
        &webhook.ca_pem,
        &scheduler.policy_namespace,
    );
    let web = deployment(&namespace, "web", 4, json!({EU_KEY: "true", PCI_KEY: "2"}));
    create(
        karmada,
        &[&handed_to(&namespace, "web", &scheduler.name), &web],
    );
    let even = split(&[("member-eu-1", 2), ("member-eu-2", 2)]);
    wait_scheduled(karmada, &scheduler, &namespace, "web", &even);
    let get = || -> Value {
        serde_json::from_str(&karmada.kubectl_ok(&[
            "get",
            "deployment",
            "web",
            "-n",
            &namespace,
            "-o",
            "json",
        ]))
        .expect("deployment JSON")
    };
    let stored = get();
    let forged = json!({"metadata": {"annotations": {
        "federation.kubernetes.io/replica-set-preferences":
            r#"{"clusters":{"member-us-1":{"weight":1}}}"#
    }}});
    karmada.kubectl_ok(&[
        "patch",
        "deployment",
        "web",
        "-n",
        &namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        &forged.to_string(),
    ]);
    let after = get();
    assert_eq!(
        after["metadata"]["annotations"], stored["metadata"]["annotations"],
        "the template's annotations changed through status"
    );
    // A later change of the template re-places it as the policy says, not
    // as the forged value would have.
    karmada.kubectl_ok(&[
        "scale",
        "deployment",
        "web",
        "-n",
        &namespace,
        "--replicas=6",
    ]);
    let six = split(&[("member-eu-1", 3), ("member-eu-2", 3)]);
    wait_scheduled(karmada, &scheduler, &namespace, "web", &six);
    let binding = binding(karmada, &namespace, "web").expect("the binding");
    let condition = scheduled_condition(&binding).expect("condition");
    assert_eq!(condition["status"], "True", "{condition}");
}
