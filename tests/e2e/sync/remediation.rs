//! The remediator: workloads kept placed (or only reported), passes over
//! every workload once at start, then one workload at a time as it is
//! created, edited or fails.

use super::*;

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Cases 5 and 6: remediation after policy and data changes
// ---------------------------------------------------------------------------

#[test]
fn remediation_keeps_workloads_placed_and_report_mode_only_reports() {
    run(remediation_keeps_workloads_placed_and_report_mode_only_reports_body());
}

async fn remediation_keeps_workloads_placed_and_report_mode_only_reports_body() {
    let plane = ControlPlane::start();
    let opa = OpaServer::start();
    let ns = unique_name("sync-remediate");
    plane.create_namespace(&ns);
    cluster(&plane, "a", "europe-west1", "running");
    cluster(&plane, "b", "europe-west2", "running");
    cluster(&plane, "p", "europe-west3", "pending");
    policy_configmap(
        &plane,
        "placement",
        &[("placement.rego", &placement_policy(&["running"]))],
    );
    let developer_request = r#"{"clusters":{"a":{"weight":5},"b":{"weight":1}}}"#;
    // Created while nothing places them (no webhook here): unannotated, stale.
    apply(&plane, &replicaset(&ns, "free", &[]));
    apply(
        &plane,
        &replicaset(&ns, "requested", &[(PREFS, developer_request)]),
    );

    let sidecar = remediator(
        &plane,
        &opa,
        &["--remediation=auto", "--remediation-rate=50"],
    )
    .await;
    let ctx = || sidecar.log_tail();
    let rs = |name: &str| get_json(&plane, &["replicaset", "-n", &ns, name]);
    let placed = |name: &'static str, want: &'static [&'static str]| {
        let rs = &rs;
        async move { (placed_clusters(&rs(name)) == Some(set(want))).then_some(()) }
    };

    eventually("free placed on a, b", Duration::from_secs(30), ctx, || {
        placed("free", &["a", "b"])
    })
    .await;
    eventually(
        "requested placed on a, b",
        Duration::from_secs(30),
        ctx,
        || placed("requested", &["a", "b"]),
    )
    .await;
    // The developer's request is recorded, not lost under the policy's value.
    let requested = rs("requested");
    assert_eq!(
        annotation(&requested, PREFS).as_deref(),
        Some(prefs_value(&["a", "b"]).as_str())
    );
    let owned: Value =
        serde_json::from_str(&annotation(&requested, OWNED).expect("ownership record")).unwrap();
    assert_eq!(owned["owned"][PREFS]["requested"], developer_request);

    // Case 5: editing the policy ConfigMap (pending clusters become eligible)
    // re-annotates the affected workloads; the request still narrows "requested".
    policy_configmap(
        &plane,
        "placement",
        &[("placement.rego", &placement_policy(&["running", "pending"]))],
    );
    eventually("free gains p", Duration::from_secs(30), ctx, || {
        placed("free", &["a", "b", "p"])
    })
    .await;
    assert_eq!(placed_clusters(&rs("requested")), Some(set(&["a", "b"])));

    // A cluster going offline leaves every workload's preferences.
    set_phase(&plane, "b", "offline");
    eventually("free leaves b", Duration::from_secs(30), ctx, || {
        placed("free", &["a", "p"])
    })
    .await;
    eventually("requested leaves b", Duration::from_secs(30), ctx, || {
        placed("requested", &["a"])
    })
    .await;

    // Case 6: back online, "requested" gets b back: the policy's input was the
    // developer's request all along, not the policy's own earlier output.
    set_phase(&plane, "b", "running");
    eventually(
        "requested gets b back",
        Duration::from_secs(30),
        ctx,
        || placed("requested", &["a", "b"]),
    )
    .await;
    eventually("free gets b back", Duration::from_secs(30), ctx, || {
        placed("free", &["a", "b", "p"])
    })
    .await;
    let owned: Value =
        serde_json::from_str(&annotation(&rs("requested"), OWNED).expect("ownership record"))
            .unwrap();
    assert_eq!(owned["owned"][PREFS]["requested"], developer_request);

    // Converged: no patch loop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = (
        rs("free")["metadata"]["resourceVersion"].clone(),
        rs("requested")["metadata"]["resourceVersion"].clone(),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = (
        rs("free")["metadata"]["resourceVersion"].clone(),
        rs("requested")["metadata"]["resourceVersion"].clone(),
    );
    assert_eq!(before, after, "remediated objects kept changing\n{}", ctx());
    let patches = sidecar
        .metric("placement_sync_remediation_patches_total{result=\"ok\"}")
        .await;
    assert!(patches.is_some_and(|p| p >= 6.0), "{patches:?}");
    assert_eq!(sidecar.metric("placement_sync_leader").await, Some(1.0));
    let events = get_json(&plane, &["events.events.k8s.io", "-n", &ns]);
    assert!(
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["reason"] == "PlacementRemediated"),
        "{events}"
    );
    sidecar.stop();

    // Report mode: nothing is patched, an Event names each stale object.
    let sidecar = remediator(&plane, &opa, &["--remediation=report"]).await;
    let ctx = || sidecar.log_tail();
    let free_before = rs("free");
    let requested_before = rs("requested");
    set_phase(&plane, "a", "offline");
    eventually(
        "two stale objects reported",
        Duration::from_secs(30),
        ctx,
        || {
            let sidecar = &sidecar;
            async move {
                (sidecar
                    .metric("placement_sync_remediation_stale_objects")
                    .await
                    == Some(2.0))
                .then_some(())
            }
        },
    )
    .await;
    let stale_events = eventually(
        "PlacementStale events",
        Duration::from_secs(15),
        ctx,
        || {
            let plane = &plane;
            let ns = &ns;
            async move {
                let events = get_json(plane, &["events.events.k8s.io", "-n", ns]);
                let stale: Vec<Value> = events["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|e| e["reason"] == "PlacementStale")
                    .cloned()
                    .collect();
                let named: BTreeSet<String> = stale
                    .iter()
                    .filter_map(|e| e["regarding"]["name"].as_str().map(str::to_owned))
                    .collect();
                (named == set(&["free", "requested"])).then_some(stale)
            }
        },
    )
    .await;
    // Each Event (one at least per object, by the wait) is a Warning that says
    // which annotation is stale.
    for event in &stale_events {
        assert_eq!(event["type"], "Warning", "{event}");
        let note = event["note"].as_str().unwrap_or_default();
        assert!(
            note.contains("placement is stale") && note.contains(PREFS),
            "the Event names the stale annotation: {event}"
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        rs("free")["metadata"]["resourceVersion"],
        free_before["metadata"]["resourceVersion"],
        "report mode patched"
    );
    assert_eq!(
        rs("requested")["metadata"]["resourceVersion"],
        requested_before["metadata"]["resourceVersion"],
        "report mode patched"
    );
    let log = log_of(sidecar.log_path());
    assert!(
        !log.contains("remediated placement"),
        "report mode patched:\n{log}"
    );
    sidecar.stop();
}

#[test]
fn status_churn_of_a_type_no_policy_reads_triggers_no_remediation() {
    run(status_churn_of_a_type_no_policy_reads_triggers_no_remediation_body());
}

/// ReplicaSets are replicated and remediated, the policy reads only
/// `data.kubernetes.clusters`: ReplicaSet status updates reach OPA and cost no
/// remediation pass (no decision query per workload); a Cluster going offline
/// still re-places.
async fn status_churn_of_a_type_no_policy_reads_triggers_no_remediation_body() {
    // With OPA's authorization policy, loaded from a file as token-protected
    // OPAs run: the sidecar did not load that module, yet reads its source
    // (it reads no replicated data) instead of assuming it reads everything.
    let (plane, opa, ns) = two_running_clusters("sync-churn");
    apply(&plane, &replicaset(&ns, "web", &[]));
    let sidecar = remediator(
        &plane,
        &opa,
        &["--replicate=apps/v1/replicasets", "--remediation=auto"],
    )
    .await;
    let ctx = || sidecar.log_tail();
    let rs = || get_json(&plane, &["replicaset", "-n", &ns, "web"]);
    eventually(
        "web placed on a, b",
        Duration::from_secs(30),
        ctx,
        || async { (placed_clusters(&rs()) == Some(set(&["a", "b"]))).then_some(()) },
    )
    .await;
    const PASSES: &str = "placement_sync_remediation_passes_total";
    // Settled: no pass for a while (debounce is 200ms in the harness).
    let (before, _) = sidecar
        .remediation_at_rest(Duration::from_secs(2), AT_REST_WITHIN)
        .await;

    let client = opa_client(&opa);
    for generation in 1..=30 {
        plane.kubectl_ok(&[
            "patch",
            "replicaset",
            "web",
            "-n",
            &ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(r#"{{"status":{{"replicas":0,"observedGeneration":{generation}}}}}"#),
        ]);
    }
    let path = format!("kubernetes/replicasets/{ns}/web/status/observedGeneration");
    eventually(
        "the last status update replicated",
        Duration::from_secs(30),
        ctx,
        || {
            let (client, path) = (&client, &path);
            async move { (opa_data(client, path).await == Some(json!(30))).then_some(()) }
        },
    )
    .await;
    // Twice the debounce and more: a pass would have started by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        sidecar.metric(PASSES).await,
        Some(before),
        "status updates of an unread type started remediation passes\n{}",
        sidecar.log_tail()
    );

    set_phase(&plane, "b", "offline");
    eventually("web leaves b", Duration::from_secs(30), ctx, || async {
        (placed_clusters(&rs()) == Some(set(&["a"]))).then_some(())
    })
    .await;
    assert!(sidecar.metric(PASSES).await > Some(before));
}

/// Ten ReplicaSets created unplaced in a namespace of their own, two running
/// Clusters `a` and `b`, the placement policy, and a remediating sidecar that
/// has placed all ten on `a, b`.
struct RemediatedWorkloads {
    plane: ControlPlane,
    _opa: OpaServer,
    ns: String,
    names: Vec<String>,
    sidecar: Sidecar,
}

impl RemediatedWorkloads {
    async fn start(prefix: &str) -> RemediatedWorkloads {
        let (plane, opa, ns) = two_running_clusters(prefix);
        let names: Vec<String> = (0..10).map(|i| format!("w{i}")).collect();
        for name in &names {
            apply(&plane, &replicaset(&ns, name, &[]));
        }
        let sidecar = Sidecar::start(
            &plane,
            &opa,
            &[
                &format!("--replicate-cluster={CLUSTERS}"),
                "--remediation=auto",
                "--remediate=apps/v1/replicasets",
            ],
        );
        sidecar.wait_ready(Duration::from_secs(60)).await;
        let bed = RemediatedWorkloads {
            plane,
            _opa: opa,
            ns,
            names,
            sidecar,
        };
        for name in &bed.names {
            eventually(
                "placed on a, b",
                Duration::from_secs(30),
                || bed.sidecar.log_tail(),
                || async { bed.is_placed(name).then_some(()) },
            )
            .await;
        }
        bed
    }

    /// A marker: `w0` asks for clusters `a, b` and `marker` (no such
    /// cluster), an edit of its developer view later in the ReplicaSets' one
    /// watch than every change before it. Once the remediator has re-placed
    /// `w0` on `a, b` (its one decision query) it has seen those changes too.
    /// Returns the remediator's decision queries, at rest after that.
    async fn marker_seen(&self, marker: &str) -> f64 {
        self.plane.kubectl_ok(&[
            "annotate",
            "replicaset",
            "w0",
            "-n",
            &self.ns,
            "--overwrite",
            &format!("{PREFS}={}", prefs_value(&["a", "b", marker])),
        ]);
        eventually(
            "w0 re-placed on a, b after the marker",
            Duration::from_secs(30),
            || self.sidecar.log_tail(),
            || async { self.is_placed("w0").then_some(()) },
        )
        .await;
        remediation_at_rest(&self.sidecar).await.1
    }

    /// Whether ReplicaSet `name` is placed on exactly `a, b`.
    fn is_placed(&self, name: &str) -> bool {
        let rs = get_json(&self.plane, &["replicaset", "-n", &self.ns, name]);
        placed_clusters(&rs) == Some(set(&["a", "b"]))
    }
}

#[test]
fn a_starting_remediator_passes_over_every_workload_once() {
    run(a_starting_remediator_passes_over_every_workload_once_body());
}

/// At its start the remediator loads the policy, replicates the Clusters,
/// becomes ready and leads: each of these signals a pass over everything, and
/// one pass covers them all. (Each used to cost a pass of its own after the
/// first: with 10,000 workloads, three passes and 30,000 decision queries.)
async fn a_starting_remediator_passes_over_every_workload_once_body() {
    let bed = RemediatedWorkloads::start("sync-start").await;
    let (names, sidecar) = (&bed.names, &bed.sidecar);
    // Past the debounce and a pass's length: a second pass would have begun.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (passes, queries) = remediation_at_rest(sidecar).await;
    assert_eq!(
        (passes, queries),
        (1.0, names.len() as f64),
        "(passes, decision queries) after the start\n{}",
        sidecar.log_tail()
    );
}

/// How long a remediator may take to come to rest before the test fails.
const AT_REST_WITHIN: Duration = Duration::from_secs(60);

/// The remediator's `(passes, decision queries)`, sampled between passes (two
/// equal samples 300 ms apart), so that no pass is counted half.
async fn remediation_at_rest(sidecar: &Sidecar) -> (f64, f64) {
    sidecar
        .remediation_at_rest(Duration::from_millis(300), AT_REST_WITHIN)
        .await
}

#[test]
fn a_created_or_edited_workload_is_evaluated_alone() {
    run(a_created_or_edited_workload_is_evaluated_alone_body());
}

/// A workload created where no webhook placed it is placed by the remediator
/// with one decision query, not a pass over every workload; an edit of its
/// developer view costs one query too; its status updates and the
/// remediator's own PATCH cost none.
async fn a_created_or_edited_workload_is_evaluated_alone_body() {
    let bed = RemediatedWorkloads::start("sync-created").await;
    let (plane, ns, sidecar) = (&bed.plane, &bed.ns, &bed.sidecar);
    let ctx = || sidecar.log_tail();
    let (_, before) = remediation_at_rest(sidecar).await;

    // Created, not applied: no annotation at all (as a controller creates).
    let out = plane.kubectl_stdin(&["create", "-f", "-"], &replicaset(ns, "late", &[]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(
        "late placed on a, b",
        Duration::from_secs(30),
        ctx,
        || async { bed.is_placed("late").then_some(()) },
    )
    .await;
    // The marker's query shows that the echo of the remediator's PATCH has
    // been seen.
    let created = bed.marker_seen("echo").await;
    assert_eq!(
        created - before,
        2.0,
        "the created workload was evaluated alone, once (and the marker once)\n{}",
        sidecar.log_tail()
    );

    for generation in 1..=10 {
        plane.kubectl_ok(&[
            "patch",
            "replicaset",
            "late",
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(r#"{{"status":{{"replicas":0,"observedGeneration":{generation}}}}}"#),
        ]);
    }
    // The marker's query shows that the status updates have been seen.
    let status_updated = bed.marker_seen("status").await;
    assert_eq!(
        status_updated - created,
        1.0,
        "status updates cost decision queries (the marker one)\n{}",
        sidecar.log_tail()
    );

    plane.kubectl_ok(&["label", "replicaset", "late", "-n", ns, "tier=web"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while remediation_at_rest(sidecar).await.1 == status_updated && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, edited) = remediation_at_rest(sidecar).await;
    assert_eq!(
        edited - status_updated,
        1.0,
        "the label edit cost one query\n{}",
        sidecar.log_tail()
    );
}

#[test]
fn a_failing_workload_is_retried_alone() {
    run(a_failing_workload_is_retried_alone_body());
}

/// One workload whose decision cannot be applied (an invalid annotation key)
/// is retried with backoff, and each retry asks the decision for that one
/// workload only, not for all of them.
async fn a_failing_workload_is_retried_alone_body() {
    let plane = ControlPlane::start();
    let opa = OpaServer::start_with(false, false);
    let ns = unique_name("sync-retry");
    plane.create_namespace(&ns);
    cluster(&plane, "a", "europe-west1", "running");
    let policy = format!(
        "{}\nannotations[\"not a/valid/key\"] := \"x\" if input.metadata.name == \"broken\"\n",
        placement_policy(&["running"])
    );
    policy_configmap(&plane, "placement", &[("placement.rego", &policy)]);
    let names: Vec<String> = (0..10).map(|i| format!("w{i}")).collect();
    for name in &names {
        apply(&plane, &replicaset(&ns, name, &[]));
    }
    apply(&plane, &replicaset(&ns, "broken", &[]));
    let sidecar = remediator(&plane, &opa, &["--remediation=auto"]).await;
    let ctx = || sidecar.log_tail();
    for name in &names {
        eventually("placed on a", Duration::from_secs(30), ctx, || async {
            let rs = get_json(&plane, &["replicaset", "-n", &ns, name]);
            (placed_clusters(&rs) == Some(set(&["a"]))).then_some(())
        })
        .await;
    }
    let quiet = || remediation_at_rest(&sidecar);
    let (passes_before, queries_before) = quiet().await;
    // Retries back off (1 s doubling to 60 s, advanced by the first passes
    // too): wait for the next one.
    let deadline = Instant::now() + Duration::from_secs(90);
    let (passes_after, queries_after) = loop {
        let now = quiet().await;
        if now.0 > passes_before {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the failing workload is not retried\n{}",
            sidecar.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        queries_after - queries_before,
        passes_after - passes_before,
        "each retry queried the failing workload alone\n{}",
        sidecar.log_tail()
    );
    let broken = get_json(&plane, &["replicaset", "-n", &ns, "broken"]);
    assert!(annotation(&broken, PREFS).is_none(), "{broken}");
}
