use super::evaluate::{outcome_of, rego_query};
use super::*;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

const POLICY: &str = r#"
package io.k8s.federation.admission

annotations["example.com/region"] := data.regions[input.metadata.labels.app]

errors contains msg if {
    input.metadata.labels.app == "forbidden"
    msg := "app forbidden"
}
"#;

#[tokio::test]
async fn undefined_without_policy() {
    let engine = Embedded::new();
    let out = engine
        .query("io/k8s/federation/admission", &json!({}), soon())
        .await
        .unwrap();
    assert_eq!(out, QueryOutcome::Undefined);
}

#[tokio::test]
async fn evaluates_package_document_with_data() {
    let engine = Embedded::new();
    engine.put_policy("p.rego", POLICY).await.unwrap();
    engine
        .put_data("regions", &json!({"web": "eu"}))
        .await
        .unwrap();
    let input = json!({"metadata": {"labels": {"app": "web"}}});
    let out = engine
        .query("io/k8s/federation/admission", &input, soon())
        .await
        .unwrap();
    assert_eq!(
        out,
        QueryOutcome::Defined(json!({"annotations": {"example.com/region": "eu"}, "errors": []}))
    );
    let input = json!({"metadata": {"labels": {"app": "forbidden"}}});
    let out = engine
        .query("io/k8s/federation/admission", &input, soon())
        .await
        .unwrap();
    assert_eq!(
        out,
        QueryOutcome::Defined(json!({"annotations": {}, "errors": ["app forbidden"]}))
    );
}

// The memory ceiling is process-wide (regorus counts every thread's
// allocations), so its test runs in a process of its own:
// tests/memory_limit.rs.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_stops_a_runaway_evaluation() {
    let engine = Embedded::new();
    engine
        .put_policy(
            "slow.rego",
            "package slow\n\npairs := count([a | some a in numbers.range(1, 4000); some b in numbers.range(1, 4000); a == b])\n",
        )
        .await
        .unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // More runaway queries than cores: each must give up at its deadline.
    let empty = json!({});
    let runaway = (0..cores + 1).map(|_| {
        engine.query(
            "slow/pairs",
            &empty,
            Instant::now() + Duration::from_millis(200),
        )
    });
    for outcome in futures::future::join_all(runaway).await {
        assert!(
            matches!(outcome, Err(EngineError::Timeout { .. })),
            "{outcome:?}"
        );
    }
    // The evaluations themselves stopped at the deadline and gave their cores
    // back; otherwise this query would wait behind them (16 M steps) and miss
    // its own deadline.
    engine.put_policy("p.rego", POLICY).await.unwrap();
    let out = engine
        .query(
            "io/k8s/federation/admission/errors",
            &json!({"metadata": {"labels": {"app": "forbidden"}}}),
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(out, QueryOutcome::Defined(json!(["app forbidden"])));
}

#[tokio::test]
async fn every_json_input_converts() {
    let engine = Embedded::new();
    engine
        .put_policy("probe.rego", "package probe\n\nv := input.x\n")
        .await
        .unwrap();
    // serde's private number marker, as any client can send it.
    let marker = json!({"$serde_json::private::Number": "not a number"});
    let input = json!({"x": [marker, 18446744073709551615u64, -1, 1.5]});
    let out = engine.query("probe/v", &input, soon()).await.unwrap();
    assert_eq!(out, QueryOutcome::Defined(input["x"].clone()));
}

#[tokio::test]
async fn data_changes_are_seen_by_later_queries() {
    let engine = Embedded::new();
    engine.put_policy("p.rego", POLICY).await.unwrap();
    let input = json!({"metadata": {"labels": {"app": "web"}}});
    engine.put_data("regions/web", &json!("eu")).await.unwrap();
    let first = engine
        .query("io/k8s/federation/admission/annotations", &input, soon())
        .await
        .unwrap();
    assert_eq!(
        first,
        QueryOutcome::Defined(json!({"example.com/region": "eu"}))
    );
    engine.put_data("regions/web", &json!("us")).await.unwrap();
    let second = engine
        .query("io/k8s/federation/admission/annotations", &input, soon())
        .await
        .unwrap();
    assert_eq!(
        second,
        QueryOutcome::Defined(json!({"example.com/region": "us"}))
    );
    engine.delete_data("regions/web").await.unwrap();
    engine.delete_data("regions/absent/deeper").await.unwrap();
    let third = engine
        .query("io/k8s/federation/admission/annotations", &input, soon())
        .await
        .unwrap();
    assert_eq!(third, QueryOutcome::Defined(json!({})));
}

#[tokio::test]
async fn compile_error_keeps_previous_modules() {
    let engine = Embedded::new();
    engine.put_policy("p.rego", POLICY).await.unwrap();
    let err = engine
        .put_policy(
            "p.rego",
            "package io.k8s.federation.admission\n\nannotations[x] := {\n",
        )
        .await
        .unwrap_err();
    match &err {
        EngineError::Compile(errors) => {
            assert_eq!(errors[0].file.as_deref(), Some("p.rego"));
            assert!(errors[0].row.is_some(), "{errors:?}");
        }
        other => panic!("unexpected {other:?}"),
    }
    engine
        .put_data("regions", &json!({"web": "eu"}))
        .await
        .unwrap();
    let input = json!({"metadata": {"labels": {"app": "web"}}});
    let out = engine
        .query("io/k8s/federation/admission/annotations", &input, soon())
        .await
        .unwrap();
    assert_eq!(
        out,
        QueryOutcome::Defined(json!({"example.com/region": "eu"}))
    );
    assert_eq!(
        engine.policies().await.unwrap().keys().collect::<Vec<_>>(),
        ["p.rego"]
    );
    engine.delete_policy("p.rego").await.unwrap();
    engine.delete_policy("p.rego").await.unwrap();
    assert!(engine.policies().await.unwrap().is_empty());
}

#[tokio::test]
async fn patches_data_atomically() {
    let engine = Embedded::new();
    engine
        .put_data("regions", &json!({"web": "eu"}))
        .await
        .unwrap();
    let patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/api", "value": "us"}])).unwrap();
    engine.patch_data("regions", &patch).await.unwrap();
    assert_eq!(
        engine.state.read().data,
        json!({"regions": {"web": "eu", "api": "us"}})
    );
    let failing: json_patch::Patch = serde_json::from_value(
        json!([{"op": "add", "path": "/db", "value": "x"}, {"op": "remove", "path": "/absent"}]),
    )
    .unwrap();
    let err = engine.patch_data("regions", &failing).await.unwrap_err();
    assert!(matches!(err, EngineError::NotFound { .. }), "{err:?}");
    assert_eq!(
        engine.state.read().data["regions"],
        json!({"web": "eu", "api": "us"}),
        "all or nothing"
    );
    let err = engine.patch_data("nowhere", &patch).await.unwrap_err();
    assert!(matches!(err, EngineError::NotFound { .. }), "{err:?}");
}

#[test]
fn loads_directory_like_opa() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.rego"), POLICY).unwrap();
    std::fs::write(
        dir.path().join("p_test.rego"),
        "package x\n\ntest_x if { false }\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("regions")).unwrap();
    std::fs::write(dir.path().join("regions/data.json"), r#"{"web": "eu"}"#).unwrap();
    std::fs::create_dir_all(dir.path().join("other")).unwrap();
    std::fs::write(dir.path().join("other/data.yaml"), "a: 1\n").unwrap();
    let engine = Embedded::from_dir(dir.path()).unwrap();
    assert_eq!(engine.module_count(), 1);
    let state = engine.state.read();
    assert_eq!(
        state.data,
        json!({"regions": {"web": "eu"}, "other": {"a": 1}})
    );
}

#[test]
fn bad_data_file_is_a_named_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.json"), "{").unwrap();
    let err = Embedded::from_dir(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("data.json is not valid JSON"),
        "{err}"
    );
}

/// The shipped policies and example clusters of the repository.
fn shipped() -> Embedded {
    Embedded::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")).unwrap()
}

/// Workloads differing in every way a placement policy may care about,
/// and in ways it should not (names, images, replicas).
fn varied_inputs() -> Vec<Value> {
    let mut inputs = Vec::new();
    let kinds = ["ReplicaSet", "Deployment", "ConfigMap"];
    let eu = [None, Some("true"), Some("false"), Some("yes")];
    let pci = [None, Some("0"), Some("1"), Some("2"), Some("3"), Some("x")];
    let preferences = [
        None,
        Some(
            r#"{"rebalance": true, "clusters": {"gce-europe-west1": {"weight": 2}, "*": {"weight": 1}}}"#,
        ),
        Some(r#"{"clusters": {"gce-us-central1": {"weight": 1}}}"#),
        Some(r#"{"rebalance": false, "clusters": {"member-eu-1": {}, "member-us-1": {}}}"#),
        Some(r#"{"clusters": []}"#),
        Some("not json"),
    ];
    let mut n = 0;
    for kind in kinds {
        for eu in eu {
            for pci in pci {
                for preference in preferences {
                    for copy in 0..2 {
                        n += 1;
                        let mut annotations = Map::new();
                        let mut put = |k: &str, v: Option<&str>| {
                            if let Some(v) = v {
                                annotations.insert(k.to_owned(), json!(v));
                            }
                        };
                        put(
                            "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required",
                            eu,
                        );
                        put(
                            "policy.federation.alpha.kubernetes.io/pci-compliance-level",
                            pci,
                        );
                        put(
                            "federation.kubernetes.io/replica-set-preferences",
                            preference,
                        );
                        put("team", Some(if copy == 0 { "a" } else { "b" }));
                        // Under the policy's prefix but not read by name: it
                        // makes a ConfigMap a workload.
                        let noted = copy == 1 && n % 3 == 0;
                        put(
                            "policy.federation.alpha.kubernetes.io/note",
                            noted.then_some("x"),
                        );
                        inputs.push(json!({
                            "apiVersion": "apps/v1",
                            "kind": kind,
                            "metadata": {"name": format!("w-{n}"), "namespace": format!("ns-{copy}"), "uid": format!("uid-{n}"), "annotations": annotations},
                            "spec": {"replicas": n % 7, "template": {"spec": {"containers": [{"name": "app", "image": format!("registry.example/app:{n}")}]}}},
                            "_admission": {"uid": format!("req-{n}"), "operation": "CREATE"},
                        }));
                    }
                }
            }
        }
    }
    inputs
}

async fn answers(engine: &Embedded, inputs: &[Value]) -> Vec<QueryOutcome> {
    let mut out = Vec::new();
    for input in inputs {
        out.push(
            engine
                .query(crate::DEFAULT_DECISION_PATH, input, soon())
                .await
                .unwrap(),
        );
    }
    out
}

/// The interpreter over `engine`'s modules and data, deciding on the whole
/// input: the reference of the compiled form (and of the input the engine
/// evaluates, reduced to what the modules read).
fn reference(engine: &Embedded, path: &str) -> impl FnMut(&Value) -> QueryOutcome {
    let (modules, data) = {
        let state = engine.state.read();
        (state.modules.clone(), state.data.clone())
    };
    let mut interpreter = build_engine(&modules, &data).unwrap();
    let query = rego_query(path).unwrap();
    move |input| {
        interpreter.set_input(to_rego(input));
        let results = interpreter.eval_query(query.clone(), false).unwrap();
        let value = results
            .result
            .into_iter()
            .next()
            .and_then(|r| r.expressions.into_iter().next())
            .map_or(regorus::Value::Undefined, |e| e.value);
        outcome_of(value).unwrap()
    }
}

fn compiled(engine: &Embedded, path: &str) -> bool {
    let state = engine.state.read();
    state.programs.is_compiled(&rego_query(path).unwrap())
}

/// Karmada members: ready, tainted, not ready, labelled out of or into
/// the EU against their region, with and without free CPU.
fn karmada_members() -> Value {
    let member = |region: &str, labels: Value, ready: &str, taints: Value, cpu: (&str, &str)| {
        json!({
            "apiVersion": "cluster.karmada.io/v1alpha1",
            "kind": "Cluster",
            "metadata": {"labels": labels},
            "spec": {"region": region, "taints": taints},
            "status": {
                "conditions": [{"type": "Ready", "status": ready}],
                "resourceSummary": {"allocatable": {"cpu": cpu.0}, "allocated": {"cpu": cpu.1}},
            },
        })
    };
    let pci = |level: &str| json!({"placement-policy.io/pci-compliance-level": level});
    json!({
        "member-eu-1": member("europe-west1", pci("2"), "True", json!([]), ("8", "2")),
        "member-eu-2": member("europe-west2", pci("3"), "True", json!([{"effect": "NoSchedule"}]), ("8", "1")),
        "member-eu-3": member("eu-central-1", pci("03"), "True", json!([{"effect": "PreferNoSchedule"}]), ("4", "500m")),
        "member-eu-4": member("europe-north1", pci("3"), "False", json!([]), ("8", "0")),
        "member-ch-1": member("europe-west6", json!({"placement-policy.io/jurisdiction": "non-eu", "placement-policy.io/pci-compliance-level": "3"}), "True", json!([]), ("16", "1")),
        "member-us-1": member("us-central1", json!({"placement-policy.io/jurisdiction": "eu", "placement-policy.io/pci-compliance-level": "x"}), "True", json!([]), ("8", "9")),
    })
}

/// OCM ManagedClusters: available or not, by their region claim, with
/// PCI levels of every kind.
fn ocm_managed_clusters() -> Value {
    let managed = |region: &str, level: &str, available: &str| {
        json!({
            "apiVersion": "cluster.open-cluster-management.io/v1",
            "kind": "ManagedCluster",
            "metadata": {"labels": {"placement-policy.io/pci-compliance-level": level}},
            "spec": {"hubAcceptsClient": true},
            "status": {
                "conditions": [
                    {"type": "ManagedClusterJoined", "status": "True"},
                    {"type": "ManagedClusterConditionAvailable", "status": available},
                ],
                "clusterClaims": [{"name": "region.open-cluster-management.io", "value": region}],
            },
        })
    };
    json!({
        "ocm-eu-1": managed("europe-west1", "2", "True"),
        "ocm-eu-2": managed("europe-west2", "3", "True"),
        "ocm-eu-3": managed("eu-central-1", "3", "False"),
        "ocm-us-1": managed("us-central1", "3", "True"),
    })
}

/// Every third input as placement-sync asks for an OCM Placement's
/// workload (the Placement under `_placement`: the reasons are part of the
/// answer), every fifth as the guardrail asks for a Karmada binding's
/// template (the binding under `_binding`).
fn asked_by_placement_sync(mut inputs: Vec<Value>) -> Vec<Value> {
    for (n, input) in inputs.iter_mut().enumerate() {
        let Value::Object(map) = input else { continue };
        if n % 3 == 0 {
            map.insert(
                crate::input::PLACEMENT_INPUT_KEY.to_owned(),
                json!({
                    "apiVersion": "cluster.open-cluster-management.io/v1beta1",
                    "kind": "Placement",
                    "metadata": {"name": format!("p-{n}"), "namespace": "shop", "annotations": {}},
                    "spec": {},
                }),
            );
        } else if n % 5 == 0 {
            map.insert(
                crate::input::BINDING_INPUT_KEY.to_owned(),
                json!({"name": format!("b-{n}"), "namespace": "shop", "spec": {"replicas": n % 4}}),
            );
        }
    }
    inputs
}

/// The compiled form decides as the interpreter does, over the shipped
/// policy and the example clusters, over Karmada members weighted by free
/// CPU, with a weighting the policy refuses, and over OCM's
/// ManagedClusters; for the webhook's inputs and placement-sync's (OCM
/// Placements, Karmada bindings); on the part of the input the policy
/// reads as on all of it.
#[tokio::test]
async fn compiled_decisions_equal_interpreted_ones_on_the_shipped_policy() {
    let settings = |weighting: &str| {
        format!("package io.k8s.federation.settings\n\nweighting := \"{weighting}\"\n")
    };
    let inputs = asked_by_placement_sync(varied_inputs());
    for case in [
        "example clusters",
        "least-loaded members",
        "unknown weighting",
        "ocm managed clusters",
    ] {
        let engine = shipped().with_decision_cache(0);
        if case == "ocm managed clusters" {
            engine
                .put_data("kubernetes/managedclusters", &ocm_managed_clusters())
                .await
                .unwrap();
        } else if case != "example clusters" {
            engine
                .put_data("kubernetes/clusters", &karmada_members())
                .await
                .unwrap();
            let weighting = if case == "unknown weighting" {
                "most-loaded"
            } else {
                "least-loaded"
            };
            engine
                .put_policy("placement_settings.rego", &settings(weighting))
                .await
                .unwrap();
        }
        let mut interpreted = reference(&engine, crate::DEFAULT_DECISION_PATH);
        let truth: Vec<QueryOutcome> = inputs.iter().map(&mut interpreted).collect();
        let distinct: std::collections::BTreeSet<String> =
            truth.iter().map(|t| format!("{t:?}")).collect();
        assert!(
            distinct.len() > 10,
            "{case}: the inputs must get many different answers"
        );
        let decided = answers(&engine, &inputs).await;
        for ((input, decided), truth) in inputs.iter().zip(&decided).zip(&truth) {
            assert_eq!(decided, truth, "{case}: {input}");
        }
        assert!(
            compiled(&engine, crate::DEFAULT_DECISION_PATH),
            "{case}: the shipped decision must run compiled"
        );
        let query = rego_query(crate::DEFAULT_DECISION_PATH).unwrap();
        assert_eq!(
            engine.state.read().programs.undefined_answers(&query),
            0,
            "{case}: every member of the shipped decision must be defined, or the interpreter answers"
        );
    }
}

/// A comprehension that yields nothing inside a rule iterating over a
/// collection is an empty value, as in OPA: such a policy set is
/// interpreted, because regorus's VM failed the iteration instead (an OCM
/// Placement's reasons came back `{}` for the clusters it selected).
#[tokio::test]
async fn a_comprehension_yielding_nothing_inside_an_iteration_is_empty() {
    let engine = Embedded::new();
    engine
        .put_policy(
            "p.rego",
            "package io.k8s.federation.admission\n\n\
             annotations[name] := concat(\",\", parts) if {\n\
             \tsome name in {\"a\", \"b\"}\n\
             \teu := [\"eu\" | input.eu == true]\n\
             \tbig := [sprintf(\"%d > 5\", [input.size]) | input.size > 5]\n\
             \tparts := array.concat(array.concat([\"running\"], eu), big)\n\
             }\n\nerrors := []\n",
        )
        .await
        .unwrap();
    for (input, parts) in [
        (json!({"eu": false, "size": 1}), "running"),
        (json!({"eu": true, "size": 7}), "running,eu,7 > 5"),
    ] {
        let expected =
            QueryOutcome::Defined(json!({"annotations": {"a": parts, "b": parts}, "errors": []}));
        assert_eq!(
            reference(&engine, crate::DEFAULT_DECISION_PATH)(&input),
            expected,
            "{input}"
        );
        assert_eq!(
            engine
                .query(crate::DEFAULT_DECISION_PATH, &input, soon())
                .await
                .unwrap(),
            expected,
            "{input}"
        );
    }
    assert!(!compiled(&engine, crate::DEFAULT_DECISION_PATH));
}

/// The first answers of a compiled query after a policy change are
/// checked against the interpreter's: a form the VM evaluates wrongly
/// without an error is answered as the interpreter answers, and the query
/// is interpreted from then on. Shown with the comprehension inside an
/// iteration, compiled here despite its form.
#[tokio::test]
async fn a_compiled_answer_unlike_the_interpreters_is_not_given() {
    let engine = Embedded::new();
    engine
        .put_policy(
            "p.rego",
            "package io.k8s.federation.admission\n\n\
             annotations[name] := concat(\",\", parts) if {\n\
             \tsome name in {\"a\", \"b\"}\n\
             \tparts := array.concat([\"running\"], [\"eu\" | input.eu == true])\n\
             }\n\nerrors := []\n",
        )
        .await
        .unwrap();
    engine.state.write().programs = Arc::new(Programs::taking_known_wrong_forms(Arc::clone(
        &engine.checks,
    )));
    let eu = json!({"eu": true});
    let not_eu = json!({"eu": false});
    // Agreeing answers keep the compiled form.
    assert_eq!(
        engine
            .query(crate::DEFAULT_DECISION_PATH, &eu, soon())
            .await
            .unwrap(),
        QueryOutcome::Defined(
            json!({"annotations": {"a": "running,eu", "b": "running,eu"}, "errors": []})
        )
    );
    assert!(compiled(&engine, crate::DEFAULT_DECISION_PATH));
    // The VM's `{}` for this one is not given.
    let expected = QueryOutcome::Defined(
        json!({"annotations": {"a": "running", "b": "running"}, "errors": []}),
    );
    assert_eq!(
        engine
            .query(crate::DEFAULT_DECISION_PATH, &not_eu, soon())
            .await
            .unwrap(),
        expected
    );
    assert!(!compiled(&engine, crate::DEFAULT_DECISION_PATH));
}

/// Where the compiled form leaves the decision or a member of it undefined
/// (a rule with two values, a missing module), the interpreter answers:
/// the conflict is an error, as in OPA, and a package without its rules
/// is what the interpreter makes of it.
#[tokio::test]
async fn what_the_compiled_form_leaves_undefined_the_interpreter_decides() {
    let engine = Embedded::new();
    engine
        .put_policy(
            "p.rego",
            "package io.k8s.federation.admission\n\nerrors := []\n\nannotations = {\"a\": \"1\"} if input.metadata.name\n\nannotations = {\"a\": \"2\"} if input.kind\n",
        )
        .await
        .unwrap();
    let input = json!({"kind": "ReplicaSet", "metadata": {"name": "rs"}});
    let err = engine
        .query(crate::DEFAULT_DECISION_PATH, &input, soon())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::Evaluation(m) if m.contains("rule conflicts")),
        "{err:?}"
    );
    assert!(compiled(&engine, crate::DEFAULT_DECISION_PATH));
    // One value: answered compiled.
    let one = json!({"kind": "ReplicaSet", "metadata": {}});
    assert_eq!(
        engine
            .query(crate::DEFAULT_DECISION_PATH, &one, soon())
            .await
            .unwrap(),
        QueryOutcome::Defined(json!({"annotations": {"a": "2"}, "errors": []}))
    );

    // The shipped admission package without the rules it draws on.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let alone = Embedded::new();
    alone
        .put_policy(
            "placement.rego",
            &std::fs::read_to_string(dir.join("placement.rego")).unwrap(),
        )
        .await
        .unwrap();
    let workload = json!({"kind": "ReplicaSet", "metadata": {"name": "rs"}});
    assert_eq!(
        alone
            .query(crate::DEFAULT_DECISION_PATH, &workload, soon())
            .await
            .unwrap(),
        reference(&alone, crate::DEFAULT_DECISION_PATH)(&workload)
    );
    assert!(compiled(&alone, crate::DEFAULT_DECISION_PATH));
}

/// A compiled form that fails where the interpreter answers is given up
/// until the policies change (here the VM refuses data at a rule's path,
/// which the interpreter reads as the data).
#[tokio::test]
async fn a_compiled_form_that_fails_is_given_up_for_the_interpreter() {
    let engine = Embedded::new();
    engine
        .put_policy("x.rego", "package x\n\ny := 1\n")
        .await
        .unwrap();
    engine.put_data("x/y", &json!(2)).await.unwrap();
    let reference = reference(&engine, "x/y")(&json!({}));
    for _ in 0..2 {
        let out = engine.query("x/y", &json!({}), soon()).await.unwrap();
        assert_eq!(out, reference);
        assert!(!compiled(&engine, "x/y"));
    }
    engine
        .put_policy("x.rego", "package x\n\nz := 1\n")
        .await
        .unwrap();
    engine.query("x/z", &json!({}), soon()).await.unwrap();
    assert!(
        compiled(&engine, "x/z"),
        "new policies, a new compiled form"
    );
}

/// The cache's soundness on the shipped policy: cached answers equal
/// evaluated ones over inputs varying each path the policy reads (it fails
/// when the key leaves one out: the answer of a neighbour comes back).
#[tokio::test]
async fn cached_decisions_equal_evaluated_ones_on_the_shipped_policy() {
    let cached = shipped();
    let evaluated = shipped().with_decision_cache(0);
    let stats = cached.decision_cache().unwrap();
    assert_eq!(stats.refused, None, "the shipped policy must be cacheable");
    let inputs = varied_inputs();
    let truth = answers(&evaluated, &inputs).await;
    assert!(
        truth
            .iter()
            .map(|t| format!("{t:?}"))
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 10,
        "the inputs must get many different answers for this to test anything"
    );
    // Twice over, so that the second round is answered from the cache.
    assert_eq!(answers(&cached, &inputs).await, truth);
    assert_eq!(answers(&cached, &inputs).await, truth);
    let stats = cached.decision_cache().unwrap();
    assert!(stats.hits >= inputs.len() as u64, "{stats:?}");
    assert_eq!(evaluated.decision_cache().unwrap().hits, 0);
}

/// What the shipped policy does not read of a workload's annotations
/// (`kubectl apply`'s last applied configuration, the PropagationPolicy
/// Karmada names on each template) leaves its decision remembered.
#[tokio::test]
async fn a_workloads_other_annotations_leave_its_decision_remembered() {
    let engine = shipped();
    let deployment = |name: &str, others: Value| {
        let mut annotations = json!({
            "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true",
        });
        annotations
            .as_object_mut()
            .unwrap()
            .extend(others.as_object().unwrap().clone());
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": name, "namespace": "shop", "annotations": annotations}})
    };
    let first = deployment(
        "web",
        json!({"kubectl.kubernetes.io/last-applied-configuration": "{\"kind\":\"Deployment\",\"metadata\":{\"name\":\"web\"}}",
               "propagationpolicy.karmada.io/name": "group-1"}),
    );
    let second = deployment(
        "api",
        json!({"kubectl.kubernetes.io/last-applied-configuration": "{\"kind\":\"Deployment\",\"metadata\":{\"name\":\"api\"}}",
               "propagationpolicy.karmada.io/name": "group-2"}),
    );
    let path = crate::DEFAULT_DECISION_PATH;
    let a = engine.query(path, &first, soon()).await.unwrap();
    let b = engine.query(path, &second, soon()).await.unwrap();
    assert_eq!(a, b);
    assert_eq!(engine.decision_cache().unwrap().hits, 1);
    // A requirement under the policy's prefix is a different decision.
    let mut stricter = second.clone();
    stricter["metadata"]["annotations"]["policy.federation.alpha.kubernetes.io/pci-compliance-level"] =
        json!("3");
    engine.query(path, &stricter, soon()).await.unwrap();
    assert_eq!(engine.decision_cache().unwrap().hits, 1);
}

/// An input given in its parts (the object and the request's metadata,
/// as the webhook gives it) is decided as the same input put together,
/// evaluated and remembered alike.
#[tokio::test]
async fn an_input_in_parts_is_decided_as_the_whole_input() {
    let keys = crate::ownership_keys::OwnershipKeys::ephemeral().unwrap();
    let (kind, resource, user) = (json!({"kind": "ReplicaSet"}), json!({}), json!({}));
    let objects: Vec<Value> = varied_inputs()
        .into_iter()
        .map(|mut input| {
            input
                .as_object_mut()
                .unwrap()
                .remove(crate::input::ADMISSION_INPUT_KEY);
            input
        })
        .collect();
    for memory in [0, DEFAULT_DECISION_CACHE_BYTES] {
        let engine = shipped().with_decision_cache(memory);
        for (n, object) in objects.iter().enumerate() {
            let meta = crate::input::RequestMeta {
                uid: "u",
                operation: if n % 2 == 0 { "CREATE" } else { "UPDATE" },
                kind: &kind,
                resource: &resource,
                namespace: None,
                name: None,
                user_info: &user,
                dry_run: false,
                old_object: None,
                keys: &keys,
            };
            let parts = PolicyInput::new(object, &meta);
            let whole = parts.clone().into_value();
            let path = crate::DEFAULT_DECISION_PATH;
            assert_eq!(
                engine.query_input(path, &parts, soon()).await.unwrap(),
                engine.query(path, &whole, soon()).await.unwrap(),
                "memory {memory}: {whole}"
            );
        }
    }
}

#[tokio::test]
async fn a_change_of_policy_data_or_a_read_path_changes_the_answer() {
    let engine = Embedded::new();
    engine.put_policy("p.rego", POLICY).await.unwrap();
    engine
        .put_data("regions", &json!({"web": "eu", "api": "us"}))
        .await
        .unwrap();
    let web = json!({"metadata": {"name": "a", "labels": {"app": "web"}}});
    let region = |outcome: QueryOutcome| match outcome {
        QueryOutcome::Defined(v) => v["annotations"]["example.com/region"].clone(),
        QueryOutcome::Undefined => Value::Null,
    };
    let ask = |input: Value| {
        let engine = &engine;
        async move {
            region(
                engine
                    .query("io/k8s/federation/admission", &input, soon())
                    .await
                    .unwrap(),
            )
        }
    };
    assert_eq!(ask(web.clone()).await, "eu");
    // What the policy does not read: answered from the cache.
    let renamed = json!({"metadata": {"name": "b", "labels": {"app": "web", "tier": "x"}}});
    assert_eq!(ask(renamed).await, "eu");
    assert_eq!(engine.decision_cache().unwrap().hits, 1);
    // A read path.
    assert_eq!(
        ask(json!({"metadata": {"labels": {"app": "api"}}})).await,
        "us"
    );
    // Data.
    engine
        .put_data("regions", &json!({"web": "ch"}))
        .await
        .unwrap();
    assert_eq!(ask(web.clone()).await, "ch");
    // Policy.
    let policy = POLICY.replace(
        "data.regions[input.metadata.labels.app]",
        "concat(\"-\", [\"fixed\", data.regions[input.metadata.labels.app]])",
    );
    engine.put_policy("p.rego", &policy).await.unwrap();
    assert_eq!(ask(web).await, "fixed-ch");
}

#[tokio::test]
async fn a_policy_set_reading_the_whole_input_is_evaluated_every_time() {
    let engine = Embedded::new();
    let policy =
        "package io.k8s.federation.admission\n\nannotations[\"n\"] := count(walk(input))\n";
    engine.put_policy("p.rego", policy).await.unwrap();
    for _ in 0..3 {
        engine
            .query("io/k8s/federation/admission", &json!({"a": 1}), soon())
            .await
            .unwrap();
    }
    let stats = engine.decision_cache().unwrap();
    assert_eq!(
        stats.refused.as_deref(),
        Some("p.rego:3: reads the whole input (`input` without a constant path after it)")
    );
    assert_eq!((stats.hits, stats.entries), (0, 0), "{stats:?}");
}

#[test]
fn queries_quote_unusual_segments() {
    assert_eq!(
        rego_query("io/k8s/admission").unwrap(),
        "data.io.k8s.admission"
    );
    assert_eq!(
        rego_query("kubernetes/clusters/eu-west-1").unwrap(),
        r#"data.kubernetes.clusters["eu-west-1"]"#
    );
    assert_eq!(rego_query("").unwrap(), "data");
}

/// `kubectl placement explain` asks the rules package for `exclusions` and
/// `reasons`: compiled, as the decision is (no comprehension inside an
/// iteration), and answering as the interpreter does.
#[tokio::test]
async fn the_explaining_rules_run_compiled_and_answer_as_interpreted() {
    let inputs = varied_inputs();
    for path in [
        "io/k8s/federation/placement/exclusions",
        "io/k8s/federation/placement/reasons",
    ] {
        let engine = shipped().with_decision_cache(0);
        let mut interpreted = reference(&engine, path);
        for input in &inputs {
            let truth = interpreted(input);
            let decided = engine.query(path, input, soon()).await.unwrap();
            assert_eq!(decided, truth, "{path}: {input}");
        }
        assert!(compiled(&engine, path), "{path} must run compiled");
    }
}

mod checks;
mod forms;
