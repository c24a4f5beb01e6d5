//! The sidecar across restarts of its peers: the API server, OPA (policies
//! and data back without a sidecar restart, admission recovering), and a
//! policy that does not compile (the last good version stays).

use super::*;

const STATUS: &str = "placement-policy.io/policy-status";

fn names_in(plane: &ControlPlane, resource: &str, namespace: &str) -> BTreeSet<String> {
    let list = get_json(plane, &[resource, "-n", namespace]);
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

// ---------------------------------------------------------------------------
// Cases 1 and 2: replication follows the API server, across its restart
// ---------------------------------------------------------------------------

#[test]
fn replication_follows_the_apiserver_across_restarts() {
    run(replication_follows_the_apiserver_across_restarts_body());
}

async fn replication_follows_the_apiserver_across_restarts_body() {
    let plane = ControlPlane::start();
    let opa = OpaServer::start();
    let client = opa_client(&opa);
    let ns = unique_name("sync-repl");
    plane.create_namespace(&ns);
    apply(&plane, &replicaset(&ns, "before-start", &[]));

    let sidecar = Sidecar::start(
        &plane,
        &opa,
        &[
            "--replicate=apps/v1/replicasets",
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=off",
        ],
    );
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let ctx = || sidecar.log_tail();

    // The first list is in OPA, with managedFields stripped and the type filled in.
    let path = format!("kubernetes/replicasets/{ns}/before-start");
    let doc = eventually(
        "the listed ReplicaSet in OPA",
        Duration::from_secs(10),
        ctx,
        || opa_data(&client, &path),
    )
    .await;
    assert_eq!(doc["kind"], "ReplicaSet");
    assert_eq!(doc["apiVersion"], "apps/v1");
    assert_eq!(doc["metadata"]["name"], "before-start");
    assert!(doc["metadata"].get("managedFields").is_none(), "{doc}");

    // Create, update, delete: OPA follows within seconds.
    apply(&plane, &replicaset(&ns, "live", &[]));
    cluster(&plane, "sync-repl-eu", "europe-west1", "running");
    let live = format!("kubernetes/replicasets/{ns}/live");
    eventually(
        "created ReplicaSet in OPA",
        Duration::from_secs(10),
        ctx,
        || opa_data(&client, &live),
    )
    .await;
    let eu = eventually(
        "created Cluster in OPA",
        Duration::from_secs(10),
        ctx,
        || opa_data(&client, "kubernetes/clusters/sync-repl-eu"),
    )
    .await;
    assert_eq!(eu["spec"]["region"], "europe-west1");

    plane.kubectl_ok(&["label", "replicaset", "-n", &ns, "live", "tier=gold"]);
    eventually("updated label in OPA", Duration::from_secs(10), ctx, || {
        let client = &client;
        let live = &live;
        async move {
            let doc = opa_data(client, live).await?;
            (doc["metadata"]["labels"]["tier"] == "gold").then_some(())
        }
    })
    .await;
    set_phase(&plane, "sync-repl-eu", "offline");
    eventually("status change in OPA", Duration::from_secs(10), ctx, || {
        let client = &client;
        async move {
            let doc = opa_data(client, "kubernetes/clusters/sync-repl-eu").await?;
            (doc["status"]["phase"] == "offline").then_some(())
        }
    })
    .await;

    plane.kubectl_ok(&["delete", "replicaset", "-n", &ns, "live", "--wait=true"]);
    eventually(
        "deleted ReplicaSet gone from OPA",
        Duration::from_secs(10),
        ctx,
        || {
            let client = &client;
            let live = &live;
            async move { opa_data(client, live).await.is_none().then_some(()) }
        },
    )
    .await;

    // Case 2: objects change around an API server restart; afterwards OPA's data
    // equals the API server's state, deletions included.
    for name in ["keep", "delete-before", "delete-after"] {
        apply(&plane, &replicaset(&ns, name, &[]));
    }
    let ns_path = format!("kubernetes/replicasets/{ns}");
    eventually(
        "three more ReplicaSets in OPA",
        Duration::from_secs(10),
        ctx,
        || {
            let client = &client;
            let ns_path = &ns_path;
            async move { (keys_of(&opa_data(client, ns_path).await).len() == 4).then_some(()) }
        },
    )
    .await;
    plane.kubectl_ok(&[
        "delete",
        "replicaset",
        "-n",
        &ns,
        "delete-before",
        "--wait=false",
    ]);
    plane.restart_apiserver(|| std::thread::sleep(Duration::from_secs(2)));
    plane.kubectl_ok(&[
        "delete",
        "replicaset",
        "-n",
        &ns,
        "delete-after",
        "--wait=true",
    ]);
    apply(&plane, &replicaset(&ns, "after-restart", &[]));
    plane.kubectl_ok(&[
        "delete",
        "clusters.placement-policy.io",
        "sync-repl-eu",
        "--wait=true",
    ]);

    let expected = names_in(&plane, "replicasets", &ns);
    assert_eq!(expected, set(&["after-restart", "before-start", "keep"]));
    eventually(
        "OPA equals the API server after its restart",
        Duration::from_secs(30),
        ctx,
        || {
            let client = &client;
            let ns_path = &ns_path;
            let expected = &expected;
            async move {
                let replicasets = keys_of(&opa_data(client, ns_path).await);
                let clusters = keys_of(&opa_data(client, "kubernetes/clusters").await);
                (&replicasets == expected && clusters.is_empty()).then_some(())
            }
        },
    )
    .await;

    // A sidecar restart while objects change: the first full write of each type
    // replaces what the previous sidecar left in OPA.
    sidecar.stop();
    plane.kubectl_ok(&["delete", "replicaset", "-n", &ns, "keep", "--wait=true"]);
    apply(&plane, &replicaset(&ns, "while-away", &[]));
    let sidecar = Sidecar::start(
        &plane,
        &opa,
        &[
            "--replicate=apps/v1/replicasets",
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=off",
        ],
    );
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let replicasets = keys_of(&opa_data(&client, &ns_path).await);
    assert_eq!(
        replicasets,
        set(&["after-restart", "before-start", "while-away"])
    );
    let count = sidecar
        .metric("placement_sync_replicated_objects{resource=\"replicasets\"}")
        .await;
    assert!(count.is_some_and(|c| c >= 3.0), "{count:?}");
    sidecar.stop();
}

// ---------------------------------------------------------------------------
// Case 3: OPA restarts; the sidecar reloads policies and data by itself
// ---------------------------------------------------------------------------

#[test]
fn a_fresh_opa_gets_policies_and_data_back_without_a_sidecar_restart() {
    run(a_fresh_opa_gets_policies_and_data_back_without_a_sidecar_restart_body());
}

async fn a_fresh_opa_gets_policies_and_data_back_without_a_sidecar_restart_body() {
    let plane = ControlPlane::start();
    let mut opa = OpaServer::start();
    let client = opa_client(&opa);
    cluster(&plane, "eu-a", "europe-west1", "running");
    cluster(&plane, "eu-b", "europe-west2", "running");
    cluster(&plane, "us-c", "us-east1", "offline");
    policy_configmap(
        &plane,
        "placement",
        &[("placement.rego", &placement_policy(&["running"]))],
    );

    let sidecar = Sidecar::start(
        &plane,
        &opa,
        &[
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=off",
        ],
    );
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let ctx = || sidecar.log_tail();

    let input = json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "probe", "namespace": "default"}
    });
    let expected = json!({PREFS: prefs_value(&["eu-a", "eu-b"])});
    let decide = |client: &policy_client::opa::Opa| {
        let client = client.clone();
        let input = input.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
            match client
                .query("io/k8s/federation/admission", &input, deadline)
                .await
            {
                Ok(QueryOutcome::Defined(v)) => Some(v["annotations"].clone()),
                _ => None,
            }
        }
    };
    assert_eq!(decide(&client).await, Some(expected.clone()));

    // A fresh OPA: nothing in it.
    opa.restart();
    let started = Instant::now();
    // Until the sidecar has reloaded, the decision is undefined (the webhook then
    // fails closed); the first decision OPA gives is already the correct one,
    // because the data goes in before the policies.
    let mut undefined_seen = 0;
    let first = loop {
        match decide(&client).await {
            Some(decision) => break decision,
            None => undefined_seen += 1,
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no decision 30s after the OPA restart\n{}",
            ctx()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(first, expected, "first decision after the restart");
    let recovered = started.elapsed();
    sidecar.wait_ready(Duration::from_secs(30)).await;
    eprintln!(
        "OPA restart recovered (3 clusters, 1 policy) in {recovered:?}; {undefined_seen} undefined answers before"
    );

    let ids: Vec<String> = client
        .policies()
        .await
        .expect("policies")
        .into_keys()
        .collect();
    assert!(
        ids.contains(&format!("{POLICY_NAMESPACE}/placement/placement.rego")),
        "{ids:?}"
    );
    assert_eq!(
        keys_of(&opa_data(&client, "kubernetes/clusters").await),
        set(&["eu-a", "eu-b", "us-c"])
    );
    let restarts = sidecar.metric("placement_sync_engine_restarts_total").await;
    assert!(restarts.is_some_and(|r| r >= 1.0), "{restarts:?}");
    assert_eq!(sidecar.metric("placement_sync_synced").await, Some(1.0));

    // Later changes reach the new OPA as usual.
    set_phase(&plane, "us-c", "running");
    eventually(
        "the new OPA follows changes",
        Duration::from_secs(10),
        ctx,
        || {
            let decide = &decide;
            let client = &client;
            async move {
                (decide(client).await
                    == Some(json!({PREFS: prefs_value(&["eu-a", "eu-b", "us-c"])})))
                .then_some(())
            }
        },
    )
    .await;

    // While OPA is down the sidecar is not ready.
    opa.kill();
    eventually(
        "readyz 503 while OPA is down",
        Duration::from_secs(10),
        ctx,
        || {
            let sidecar = &sidecar;
            async move { (sidecar.get("/readyz").await.0 == 503).then_some(()) }
        },
    )
    .await;
    opa.restart();
    sidecar.wait_ready(Duration::from_secs(30)).await;
    assert!(decide(&client).await.is_some());
    sidecar.stop();
}

/// Case 3 through the real webhook, registered with the API server: decisions are
/// right again after an OPA restart without restarting the sidecar, and while
/// nothing has loaded the fresh OPA the webhook fails closed (a policy ConfigMap
/// exists).
#[test]
fn admission_through_the_webhook_recovers_after_an_opa_restart() {
    run(admission_through_the_webhook_recovers_after_an_opa_restart_body());
}

async fn admission_through_the_webhook_recovers_after_an_opa_restart_body() {
    let plane = ControlPlane::start();
    let mut opa = OpaServer::start();
    cluster(&plane, "eu-a", "europe-west1", "running");
    cluster(&plane, "eu-b", "europe-west2", "running");
    policy_configmap(
        &plane,
        "placement",
        &[("placement.rego", &placement_policy(&["running"]))],
    );
    let ns = unique_name("sync-admit");
    plane.create_namespace(&ns);
    let sync_args = [
        format!("--replicate-cluster={CLUSTERS}"),
        "--remediation=off".to_owned(),
    ];
    let sync_args: Vec<&str> = sync_args.iter().map(String::as_str).collect();
    let sidecar = Sidecar::start(&plane, &opa, &sync_args);
    sidecar.wait_ready(Duration::from_secs(60)).await;

    let webhook = WebhookProcess::start(&[
        format!("--opa-url={}", opa.url()),
        format!("--opa-token-file={}", opa.token_file().display()),
        format!(
            "--kubeconfig={}",
            plane.kubeconfig(Identity::Webhook).display()
        ),
        format!("--policy-namespace={POLICY_NAMESPACE}"),
        "--engine-deadline=5s".to_owned(),
        "--engine-timeout=1s".to_owned(),
    ]);
    plane.register_webhook(
        &ns,
        &webhook.url("/mutate"),
        &webhook.ca_pem,
        POLICY_NAMESPACE,
    );
    let create = |name: &str| {
        plane.kubectl_stdin(
            &["create", "-n", &ns, "-f", "-"],
            &replicaset(&ns, name, &[]),
        )
    };
    let stored = |name: &str| get_json(&plane, &["replicaset", "-n", &ns, name]);
    let want = set(&["eu-a", "eu-b"]);
    placement_tests::wait_for(
        "the API server to call the webhook",
        Duration::from_secs(30),
        || {
            let out = plane.kubectl_stdin(
                &[
                    "create",
                    "-n",
                    &ns,
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    "-",
                ],
                &replicaset(&ns, "probe", &[]),
            );
            String::from_utf8_lossy(&out.stdout)
                .contains(PREFS)
                .then_some(())
        },
    );
    let out = create("before");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(placed_clusters(&stored("before")), Some(want.clone()));

    // A fresh OPA: the sidecar reloads it; admission is right again.
    opa.restart();
    eventually(
        "the sidecar to notice the OPA restart",
        Duration::from_secs(30),
        || sidecar.log_tail(),
        || {
            let sidecar = &sidecar;
            async move {
                let restarts = sidecar.metric("placement_sync_engine_restarts_total").await;
                restarts.is_some_and(|r| r >= 1.0).then_some(())
            }
        },
    )
    .await;
    sidecar.wait_ready(Duration::from_secs(30)).await;
    let out = create("after-restart");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        webhook.log()
    );
    assert_eq!(
        placed_clusters(&stored("after-restart")),
        Some(want.clone())
    );

    // Nothing loads the next fresh OPA (sidecar stopped): the webhook fails closed.
    sidecar.stop();
    opa.restart();
    let out = create("unsynced");
    assert!(!out.status.success(), "admitted while OPA was not in sync");
    assert!(
        plane
            .kubectl(&["get", "replicaset", "-n", &ns, "unsynced"])
            .status
            .code()
            != Some(0)
    );
    // The sidecar comes back and loads it: admitted and placed.
    let sidecar = Sidecar::start(&plane, &opa, &sync_args);
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let out = create("unsynced");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        webhook.log()
    );
    assert_eq!(placed_clusters(&stored("unsynced")), Some(want));
    sidecar.stop();
}

// ---------------------------------------------------------------------------
// Case 4: a policy ConfigMap with a syntax error
// ---------------------------------------------------------------------------

#[test]
fn policy_compile_errors_are_reported_and_the_last_good_version_stays() {
    run(policy_compile_errors_are_reported_and_the_last_good_version_stays_body());
}

async fn policy_compile_errors_are_reported_and_the_last_good_version_stays_body() {
    let plane = ControlPlane::start();
    let opa = OpaServer::start();
    let client = opa_client(&opa);
    let sidecar = Sidecar::start(&plane, &opa, &["--remediation=off"]);
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let ctx = || sidecar.log_tail();

    let version = |v: &str| {
        format!(
            "package io.k8s.federation.admission\n\nannotations[\"example.com/policy-version\"] := \"{v}\"\n\nerrors := []\n"
        )
    };
    let decided_version = |client: &policy_client::opa::Opa| {
        let client = client.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
            match client
                .query(
                    "io/k8s/federation/admission",
                    &json!({"kind": "ReplicaSet"}),
                    deadline,
                )
                .await
            {
                Ok(QueryOutcome::Defined(v)) => v["annotations"]["example.com/policy-version"]
                    .as_str()
                    .map(str::to_owned),
                _ => None,
            }
        }
    };
    let status_of = |plane: &ControlPlane| {
        let cm = get_json(plane, &["configmap", "-n", POLICY_NAMESPACE, "placement"]);
        annotation(&cm, STATUS).and_then(|s| serde_json::from_str::<Value>(&s).ok())
    };

    policy_configmap(&plane, "placement", &[("main.rego", &version("1"))]);
    policy_configmap(
        &plane,
        "helpers",
        &[("helpers.rego", "package helpers\n\nanswer := 42\n")],
    );
    eventually("version 1 in force", Duration::from_secs(15), ctx, || {
        let decided_version = &decided_version;
        let client = &client;
        async move { (decided_version(client).await.as_deref() == Some("1")).then_some(()) }
    })
    .await;
    eventually("status ok", Duration::from_secs(15), ctx, || {
        let status_of = &status_of;
        let plane = &plane;
        async move { (status_of(plane) == Some(json!({"status": "ok"}))).then_some(()) }
    })
    .await;

    // A syntax error: the annotation carries OPA's compile error with its location.
    policy_configmap(
        &plane,
        "placement",
        &[(
            "main.rego",
            "package io.k8s.federation.admission\n\nannotations[\"x\"] := \n",
        )],
    );
    let status = eventually("error status", Duration::from_secs(15), ctx, || {
        let status_of = &status_of;
        let plane = &plane;
        async move { status_of(plane).filter(|s| s["status"] == "error") }
    })
    .await;
    let error = &status["errors"][0];
    assert_eq!(
        error["file"],
        format!("{POLICY_NAMESPACE}/placement/main.rego"),
        "{status}"
    );
    assert!(error["row"].as_u64().is_some_and(|r| r >= 3), "{status}");
    assert!(error["col"].is_u64(), "{status}");
    assert_eq!(error["code"], "rego_parse_error", "{status}");
    assert!(!error["message"].as_str().unwrap_or_default().is_empty());
    // The previous good version keeps working, and so does the other ConfigMap.
    assert_eq!(decided_version(&client).await.as_deref(), Some("1"));
    assert_eq!(opa_data(&client, "helpers/answer").await, Some(json!(42)));
    eventually(
        "policies_failed metric",
        Duration::from_secs(5),
        ctx,
        || {
            let sidecar = &sidecar;
            async move {
                (sidecar.metric("placement_sync_policies_failed").await == Some(1.0)).then_some(())
            }
        },
    )
    .await;
    let helpers = get_json(&plane, &["configmap", "-n", POLICY_NAMESPACE, "helpers"]);
    assert_eq!(
        annotation(&helpers, STATUS).as_deref(),
        Some(r#"{"status":"ok"}"#)
    );

    // Fixing it clears the error and loads the fix.
    policy_configmap(&plane, "placement", &[("main.rego", &version("2"))]);
    eventually("status ok again", Duration::from_secs(15), ctx, || {
        let status_of = &status_of;
        let plane = &plane;
        async move { (status_of(plane) == Some(json!({"status": "ok"}))).then_some(()) }
    })
    .await;
    assert_eq!(decided_version(&client).await.as_deref(), Some("2"));
    assert_eq!(
        sidecar.metric("placement_sync_policies_failed").await,
        Some(0.0)
    );

    // The status write does not loop: the ConfigMap settles.
    let rv = |plane: &ControlPlane| {
        get_json(plane, &["configmap", "-n", POLICY_NAMESPACE, "placement"])["metadata"]["resourceVersion"].clone()
    };
    let before = rv(&plane);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        rv(&plane),
        before,
        "status annotation rewritten without a change"
    );

    // Deleting a ConfigMap unloads its modules.
    plane.kubectl_ok(&[
        "delete",
        "configmap",
        "-n",
        POLICY_NAMESPACE,
        "helpers",
        "--wait=true",
    ]);
    eventually(
        "helpers module removed",
        Duration::from_secs(15),
        ctx,
        || {
            let client = &client;
            async move {
                let ids = client.policies().await.ok()?;
                (!ids.keys().any(|id| id.ends_with("/helpers/helpers.rego"))).then_some(())
            }
        },
    )
    .await;
    sidecar.stop();
}
