//! What the sidecar writes to OPA and the API server: only the types the
//! policies read, a conflict told to the developer, and decisions
//! remembered only while every write is announced.

use super::*;

#[test]
fn only_the_types_the_policies_read_are_written() {
    run(only_the_types_the_policies_read_are_written_body());
}

/// `--replicate-only-read-types`: Clusters and ReplicaSets are replicated,
/// the placement policy reads only the Clusters, so OPA holds no ReplicaSets.
/// A policy that starts reading ReplicaSets never sees them missing (it is
/// loaded only once they are written), and when it goes they are deleted from
/// OPA again. The ReplicaSets' one watch is shared with the remediator, whose
/// object selector it then applies itself: the replicator still sees both.
async fn only_the_types_the_policies_read_are_written_body() {
    let (plane, opa, ns) = two_running_clusters("sync-reads");
    apply(&plane, &replicaset(&ns, "web", &[]));
    plane.kubectl_ok(&["label", "replicaset", "web", "-n", &ns, "tier=web"]);
    apply(&plane, &replicaset(&ns, "batch", &[]));
    let sidecar = remediator(
        &plane,
        &opa,
        &[
            "--replicate=apps/v1/replicasets",
            "--replicate-only-read-types",
            "--remediation=auto",
            "--scope-object-selector=tier in (web, api)",
        ],
    )
    .await;
    let ctx = || sidecar.log_tail();
    let client = opa_client(&opa);
    eventually(
        "web placed on a, b",
        Duration::from_secs(30),
        ctx,
        || async {
            let rs = get_json(&plane, &["replicaset", "-n", &ns, "web"]);
            (placed_clusters(&rs) == Some(set(&["a", "b"]))).then_some(())
        },
    )
    .await;
    assert_eq!(
        keys_of(&opa_data(&client, "kubernetes/clusters").await),
        set(&["a", "b"])
    );
    assert_eq!(
        opa_data(&client, "kubernetes/replicasets").await,
        None,
        "no policy reads ReplicaSets, yet OPA holds them"
    );
    let batch = get_json(&plane, &["replicaset", "-n", &ns, "batch"]);
    assert_eq!(
        placed_clusters(&batch),
        None,
        "batch is outside the object selector, yet it was placed"
    );

    // Watch what a policy counting ReplicaSets answers, from before it exists.
    let census = "placement/census/replicasets";
    let seen = std::sync::Arc::new(Mutex::new(Vec::<Value>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (client, seen, stop) = (opa_client(&opa), seen.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(v) = opa_data(&client, census).await {
                    seen.lock().unwrap().push(v);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    policy_configmap(
        &plane,
        "census",
        &[(
            "census.rego",
            "package placement.census\n\nreplicasets := count([1 | data.kubernetes.replicasets[_][_]])\n",
        )],
    );
    eventually(
        "the census module answering",
        Duration::from_secs(30),
        ctx,
        || async { (!seen.lock().unwrap().is_empty()).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    poller.await.unwrap();
    let answers = seen.lock().unwrap().clone();
    let wrong: Vec<&Value> = answers.iter().filter(|v| **v != json!(2)).collect();
    assert!(
        wrong.is_empty(),
        "the census policy saw ReplicaSets missing: {wrong:?} among {} answers\n{}",
        answers.len(),
        sidecar.log_tail()
    );
    assert_eq!(
        keys_of(&opa_data(&client, &format!("kubernetes/replicasets/{ns}")).await),
        set(&["batch", "web"])
    );

    plane.kubectl_ok(&["delete", "configmap", "census", "-n", POLICY_NAMESPACE]);
    eventually(
        "ReplicaSets deleted from OPA once no policy reads them",
        Duration::from_secs(30),
        ctx,
        || async {
            opa_data(&client, "kubernetes/replicasets")
                .await
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        keys_of(&opa_data(&client, "kubernetes/clusters").await),
        set(&["a", "b"])
    );
}

/// In the remediator, a decision with errors never removes
/// or replaces a placement, also when the policy gives annotations beside its
/// errors (a request in conflict with the policy: a requested cluster is no longer allowed, the
/// rest of the request still is). The workload whose developer asked for the
/// cluster that went offline keeps its placement and gets a Warning Event
/// naming the error; the one the policy placed by itself is re-placed.
#[test]
fn a_conflict_keeps_the_placement_and_tells_the_developer() {
    run(a_conflict_keeps_the_placement_and_tells_the_developer_body());
}

async fn a_conflict_keeps_the_placement_and_tells_the_developer_body() {
    let plane = ControlPlane::start();
    let opa = OpaServer::start();
    let ns = unique_name("sync-conflict");
    plane.create_namespace(&ns);
    cluster(&plane, "a", "europe-west1", "running");
    cluster(&plane, "b", "europe-west2", "running");
    // The conflict rule: a requested cluster that is not allowed is an
    // error, and the decision still carries the allowed part of the request.
    let policy = placement_policy(&["running"]).replace(
        "errors := []",
        r#"errors contains msg if {
	invalid := requested - allowed
	count(invalid) > 0
	msg := sprintf("requested clusters that are not allowed: %v", [sort(invalid)])
}"#,
    );
    policy_configmap(&plane, "placement", &[("placement.rego", &policy)]);
    apply(&plane, &replicaset(&ns, "free", &[]));
    apply(
        &plane,
        &replicaset(
            &ns,
            "requested",
            &[(PREFS, r#"{"clusters":{"a":{"weight":5},"b":{"weight":1}}}"#)],
        ),
    );
    let sidecar = remediator(&plane, &opa, &["--remediation=auto"]).await;
    let ctx = || sidecar.log_tail();
    let rs = |name: &str| get_json(&plane, &["replicaset", "-n", &ns, name]);
    for name in ["free", "requested"] {
        eventually(
            &format!("{name} placed on a, b"),
            Duration::from_secs(30),
            ctx,
            || {
                let placed = placed_clusters(&rs(name)) == Some(set(&["a", "b"]));
                async move { placed.then_some(()) }
            },
        )
        .await;
    }
    let before = rs("requested");

    set_phase(&plane, "b", "offline");
    eventually("free leaves b", Duration::from_secs(30), ctx, || {
        let placed = placed_clusters(&rs("free")) == Some(set(&["a"]));
        async move { placed.then_some(()) }
    })
    .await;
    let note = eventually(
        "a PlacementRejected Event for requested",
        Duration::from_secs(30),
        ctx,
        || {
            let events = get_json(&plane, &["events.events.k8s.io", "-n", &ns]);
            let note = events["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| {
                    e["reason"] == "PlacementRejected" && e["regarding"]["name"] == "requested"
                })
                .and_then(|e| e["note"].as_str().map(str::to_owned));
            async move { note }
        },
    )
    .await;
    assert!(
        note.contains("requested clusters that are not allowed") && note.contains("b"),
        "{note}"
    );
    // A pass later, the placement and its record are exactly as they were.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rs("requested");
    for key in [PREFS, OWNED] {
        assert_eq!(
            annotation(&after, key),
            annotation(&before, key),
            "{key} kept\n{}",
            ctx()
        );
    }
    sidecar.stop();
}

/// A CREATE review of ReplicaSet `name` in `namespace` with `annotations`.
fn replicaset_review(namespace: &str, name: &str, annotations: &[(&str, &str)]) -> Vec<u8> {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{name}"),
            "kind": {"group": "apps", "version": "v1", "kind": "ReplicaSet"},
            "resource": {"group": "apps", "version": "v1", "resource": "replicasets"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "developer"},
            "object": {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "c", "image": format!("registry.invalid/{name}:1")}]}}}
            },
            "dryRun": true
        }
    })
    .to_string()
    .into_bytes()
}

/// The clusters the webhook's answer to `review` places on (from its patch).
async fn clusters_answered(webhook: &WebhookProcess, review: Vec<u8>) -> BTreeSet<String> {
    let (status, body) = webhook.post("/mutate", review).await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("AdmissionReview JSON");
    assert_eq!(answer["response"]["allowed"], json!(true), "{body}");
    let patch = answer["response"]["patch"]
        .as_str()
        .unwrap_or_else(|| panic!("no patch in {body}"));
    let patch: Value = serde_json::from_slice(
        &base64::Engine::decode(&base64::engine::general_purpose::STANDARD, patch)
            .expect("base64 patch"),
    )
    .expect("JSON patch");
    let prefs = patch
        .as_array()
        .expect("patch operations")
        .iter()
        .find_map(|op| {
            let path = op["path"].as_str()?;
            if path.ends_with(&PREFS.replace('/', "~1")) {
                op["value"].as_str().map(str::to_owned)
            } else {
                op["value"][PREFS].as_str().map(str::to_owned)
            }
        })
        .unwrap_or_else(|| panic!("no placement in {patch}"));
    let prefs: Value = serde_json::from_str(&prefs).expect("preferences JSON");
    prefs["clusters"]
        .as_object()
        .expect("clusters")
        .keys()
        .cloned()
        .collect()
}

/// With OPA, the webhook remembers decisions only while placement-sync (OPA's
/// writer) announces each write first: a data change, a policy change and a
/// read input path each change the very next answer once OPA holds them;
/// identical reviews are answered from memory; with the sidecar gone the
/// memory is off and a write that bypassed it is seen at once.
#[test]
fn opa_decisions_are_remembered_only_while_every_write_is_announced() {
    run(opa_decisions_are_remembered_only_while_every_write_is_announced_body());
}

async fn opa_decisions_are_remembered_only_while_every_write_is_announced_body() {
    let (plane, opa, ns) = two_running_clusters("remember");
    let clusters = format!("--replicate-cluster={CLUSTERS}");
    let sidecar = Sidecar::start(&plane, &opa, &[&clusters, "--remediation=off"]);
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let webhook_args = |extra: Option<String>| {
        let mut args = vec![
            format!("--opa-url={}", opa.url()),
            format!("--opa-token-file={}", opa.token_file().display()),
            format!(
                "--kubeconfig={}",
                plane.kubeconfig(Identity::Webhook).display()
            ),
            format!("--policy-namespace={POLICY_NAMESPACE}"),
        ];
        args.extend(extra);
        args
    };
    let webhook = WebhookProcess::start(&webhook_args(Some(format!(
        "--engine-revisions-url=http://127.0.0.1:{}/engine/revisions",
        sidecar.port
    ))));
    let hits = || webhook.metric("placement_webhook_decision_cache_hits_total");
    let enabled = || webhook.metric("placement_webhook_decision_cache_enabled");
    eventually(
        "the webhook to follow the sidecar's revisions",
        Duration::from_secs(30),
        || webhook.log(),
        || async { (enabled().await == 1.0).then_some(()) },
    )
    .await;
    let review =
        |name: &str, annotations: &[(&str, &str)]| replicaset_review(&ns, name, annotations);

    assert_eq!(
        clusters_answered(&webhook, review("one", &[])).await,
        set(&["a", "b"])
    );
    let before = hits().await;
    // Differs only in what the policy never reads (name, uid, image).
    assert_eq!(
        clusters_answered(&webhook, review("two", &[])).await,
        set(&["a", "b"])
    );
    assert_eq!(
        hits().await,
        before + 1.0,
        "an identical decision is remembered"
    );
    // A read input path: the developer's request.
    // (Weighted otherwise than the policy says, so that the answer patches it.)
    let only_a = json!({"clusters": {"a": {"weight": 5}}}).to_string();
    assert_eq!(
        clusters_answered(&webhook, review("three", &[(PREFS, &only_a)])).await,
        set(&["a"])
    );

    // Data: once OPA holds cluster b offline, the next answer says so.
    let client = opa_client(&opa);
    set_phase(&plane, "b", "offline");
    eventually(
        "OPA to hold cluster b offline",
        Duration::from_secs(30),
        || sidecar.log_tail(),
        || {
            let client = &client;
            async move {
                let b = opa_data(client, "kubernetes/clusters/b").await?;
                (b["status"]["phase"] == "offline").then_some(())
            }
        },
    )
    .await;
    assert_eq!(
        clusters_answered(&webhook, review("four", &[])).await,
        set(&["a"])
    );

    // Policy: once OPA holds the policy that allows offline clusters too.
    policy_configmap(
        &plane,
        "placement",
        &[("placement.rego", &placement_policy(&["running", "offline"]))],
    );
    eventually(
        "OPA to hold the new policy",
        Duration::from_secs(30),
        || sidecar.log_tail(),
        || {
            let client = &client;
            async move {
                let modules = client.policies().await.ok()?;
                modules
                    .values()
                    .any(|source| source.contains("\"offline\""))
                    .then_some(())
            }
        },
    )
    .await;
    assert_eq!(
        clusters_answered(&webhook, review("five", &[])).await,
        set(&["a", "b"])
    );
    let remembered = hits().await;
    assert_eq!(
        clusters_answered(&webhook, review("six", &[])).await,
        set(&["a", "b"])
    );
    assert_eq!(hits().await, remembered + 1.0);

    // The writer gone: the lease runs out and nothing is remembered, so a
    // write that bypassed it (nothing announced) is seen at once.
    sidecar.stop();
    eventually(
        "the decision memory to turn off",
        Duration::from_secs(30),
        || webhook.log(),
        || async { (enabled().await == 0.0).then_some(()) },
    )
    .await;
    client
        .put_data("kubernetes/clusters/a/status/phase", &json!("maintenance"))
        .await
        .expect("a write to OPA");
    let unremembered = hits().await;
    assert_eq!(
        clusters_answered(&webhook, review("seven", &[])).await,
        set(&["b"])
    );
    assert_eq!(
        clusters_answered(&webhook, review("eight", &[])).await,
        set(&["b"])
    );
    assert_eq!(
        hits().await,
        unremembered,
        "nothing remembered without the writer"
    );

    // Without the revisions endpoint, OPA's decisions are never remembered.
    let plain = WebhookProcess::start(&webhook_args(None));
    for name in ["nine", "ten"] {
        assert_eq!(
            clusters_answered(&plain, review(name, &[])).await,
            set(&["b"])
        );
    }
    let page = plain.metrics().await;
    assert!(
        !page.contains("placement_webhook_decision_cache_hits_total"),
        "{page}"
    );
}
