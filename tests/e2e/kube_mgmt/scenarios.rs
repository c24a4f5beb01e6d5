//! kube-mgmt's own end-to-end scenarios, run against placement-sync and,
//! where its source is kept, against kube-mgmt itself.

use super::*;

/// `jsonpath "$.result.*" count`: members of an object, items of an array.
fn count(value: &Value) -> usize {
    match value {
        Value::Object(map) => map.len(),
        Value::Array(items) => items.len(),
        _ => 0,
    }
}

/// `jsonpath "$.result[?(@.id == '<id>')]" count >= 1`
fn has_policy(policies: &Value, id: &str) -> bool {
    policies["result"]
        .as_array()
        .is_some_and(|all| all.iter().any(|p| p["id"] == id))
}

// ---- default, custom_mgmt_token ------------------------------------------

/// `1_initial_state.hurl` of default and labels.
async fn initial_state_is_empty(bed: &Bed) {
    bed.eventually("initial state is empty", || async {
        for data in bed.get("/v1/data").await {
            // jsonpath "$.result.*" count == 0
            check(count(&data["result"]) == 0, || format!("data: {data}"))?;
        }
        Ok(())
    })
    .await;
}

/// `2_policy_loaded.hurl` (default, labels), `1_policy_loaded.hurl` (custom_mgmt_token).
async fn policy_is_loaded(bed: &Bed) {
    bed.eventually("policy is loaded and evaluated correctly", || async {
        for policies in bed.get("/v1/policies").await {
            // jsonpath "$.result[?(@.id == 'default/policy-include/include.rego')]" count >= 1
            check(
                has_policy(&policies, "default/policy-include/include.rego"),
                || format!("policies: {policies}"),
            )?;
        }
        for allow in bed.get("/v1/data/example/include/allow").await {
            // jsonpath "$.result" == true
            check(allow["result"] == json!(true), || format!("allow: {allow}"))?;
        }
        Ok(())
    })
    .await;
}

/// `3_data_loaded.hurl` (default, labels), `2_data_loaded.hurl` (custom_mgmt_token).
async fn data_is_loaded(bed: &Bed) {
    bed.eventually("data is loaded correctly", || async {
        for data in bed.get("/v1/data/default").await {
            // jsonpath "$.result.*" count == 1
            check(count(&data["result"]) == 1, || format!("data: {data}"))?;
            // jsonpath "$.result.data-include" exists
            check(!data["result"]["data-include"].is_null(), || {
                format!("data: {data}")
            })?;
        }
        for include in bed.get("/v1/data/default/data-include").await {
            // jsonpath "$.result['include.json'].inKey" == "inValue"
            check(
                include["result"]["include.json"]["inKey"] == "inValue",
                || format!("data-include: {include}"),
            )?;
        }
        Ok(())
    })
    .await;
}

const STATUS: &str = "openpolicyagent.org/kube-mgmt-status";

const RETRIES: &str = "openpolicyagent.org/kube-mgmt-retries";

const OK: &str = r#"{"status":"ok"}"#;

/// Every policy and data ConfigMap's status annotation is ok.
async fn statuses_are_ok(bed: &Bed) {
    bed.assert_configmaps(
        "policy status",
        "-l=openpolicyagent.org/policy=rego",
        &[(STATUS, OK)],
    )
    .await;
    bed.assert_configmaps(
        "data status",
        "-l=openpolicyagent.org/data=opa",
        &[(STATUS, OK)],
    )
    .await;
}

/// kube-mgmt's `default` scenario.
async fn default_scenario(contender: Contender) {
    let bed = Bed::start(&contender, Values::default()).await;
    initial_state_is_empty(&bed).await;
    bed.apply("fixture.yaml");
    policy_is_loaded(&bed).await;
    data_is_loaded(&bed).await;
    // configmap status annotations are ok
    statuses_are_ok(&bed).await;
    bed.delete("fixture.yaml");
}

/// kube-mgmt's `custom_mgmt_token` scenario: two OPA replicas, each with its
/// sidecar; the token from a Secret of the user's (here: the flag).
async fn custom_mgmt_token_scenario(contender: Contender) {
    let values = Values {
        opa_replicas: 2,
        token_as_flag: true,
        ..Values::default()
    };
    let bed = Bed::start(&contender, values).await;
    bed.apply("fixture.yaml");
    policy_is_loaded(&bed).await;
    data_is_loaded(&bed).await;
    statuses_are_ok(&bed).await;
    bed.delete("fixture.yaml");
}

// ---- labels --------------------------------------------------------------

fn plain_http(args: &[&str]) -> Values {
    Values {
        https: false,
        authz: false,
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        ..Values::default()
    }
}

/// kube-mgmt's `labels` scenario: custom policy and data labels.
async fn labels_scenario(contender: Contender) {
    let values = plain_http(&[
        "--policy-label=qweqwe/policy",
        "--policy-value=111",
        "--data-label=asdasd/data",
        "--data-value=222",
        "--log-level=debug",
    ]);
    let bed = Bed::start(&contender, values).await;
    initial_state_is_empty(&bed).await;
    bed.apply("fixture-labels.yaml");
    policy_is_loaded(&bed).await;
    data_is_loaded(&bed).await;
    bed.assert_configmaps("policy status", "-l=qweqwe/policy=111", &[(STATUS, OK)])
        .await;
    bed.assert_configmaps("data status", "-l=asdasd/data=222", &[(STATUS, OK)])
        .await;
    bed.delete("fixture-labels.yaml");
}

// ---- multi ---------------------------------------------------------------

async fn my_rule_not_exists(bed: &Bed, step: &str) {
    bed.eventually(step, || async {
        for rule in bed.get("/v1/data/my_pkg/my_rule").await {
            // jsonpath "$.result" not exists
            check(rule.get("result").is_none(), || format!("my_rule: {rule}"))?;
        }
        Ok(())
    })
    .await;
}

/// `2_policies_loaded.hurl`, `4_policies_reloaded.hurl`.
async fn policies_loaded(bed: &Bed, step: &str) {
    bed.eventually(step, || async {
        for policies in bed.get("/v1/policies").await {
            // jsonpath "$.result" count == 2
            check(count(&policies["result"]) == 2, || {
                format!("policies: {policies}")
            })?;
            // jsonpath "$.result[?(@.id == 'default/multi-file-policy/a.rego')]" count >= 1
            // jsonpath "$.result[?(@.id == 'default/multi-file-policy/b.rego')]" count >= 1
            for id in [
                "default/multi-file-policy/a.rego",
                "default/multi-file-policy/b.rego",
            ] {
                check(has_policy(&policies, id), || {
                    format!("policies: {policies}")
                })?;
            }
        }
        for (hello, want) in [("world", true), ("incorrect", false)] {
            let input = json!({"input": {"hello": hello}});
            for rule in bed.post("/v1/data/my_pkg/my_rule", input).await {
                // jsonpath "$.result" == true / == false
                check(rule["result"] == json!(want), || {
                    format!("my_rule for {hello}: {rule}")
                })?;
            }
        }
        Ok(())
    })
    .await;
}

/// kube-mgmt's `multi` scenario: a two-module ConfigMap, a ConfigMap that
/// fails, and a policy label removed and put back.
async fn multi_scenario(contender: Contender) {
    let bed = Bed::start(&contender, plain_http(&["--log-level=debug"])).await;
    my_rule_not_exists(&bed, "initial state is empty").await;
    bed.apply("fixture-multi.yaml");
    policies_loaded(&bed, "policies are loaded and evaluated correctly").await;
    // configmap status annotations are ok
    bed.assert_configmaps(
        "multi-file-policy status",
        "--field-selector=metadata.name=multi-file-policy",
        &[(STATUS, OK), (RETRIES, "0")],
    )
    .await;
    bed.eventually("multi-file-fail-policy status", || async {
        let cm: Value = serde_json::from_str(&bed.kubectl_ok(&[
            "get",
            "cm",
            "multi-file-fail-policy",
            "-n",
            RELEASE_NAMESPACE,
            "-o",
            "json",
        ]))
        .expect("kubectl JSON");
        let annotations = &cm["metadata"]["annotations"];
        // .metadata.annotations["openpolicyagent.org/kube-mgmt-status"] | from_json | .status == "error"
        let status: Value = annotations[STATUS]
            .as_str()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        check(status["status"] == "error", || {
            format!("status: {}", annotations[STATUS])
        })?;
        // .metadata.annotations["openpolicyagent.org/kube-mgmt-retries"] == "0"
        check(annotations[RETRIES] == "0", || {
            format!("retries: {}", annotations[RETRIES])
        })
    })
    .await;
    // remove policy label
    bed.kubectl_ok(&[
        "patch",
        "cm",
        "multi-file-policy",
        "-n",
        RELEASE_NAMESPACE,
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"openpolicyagent.org/policy":""}}}"#,
    ]);
    my_rule_not_exists(&bed, "policy is unloaded").await;
    // re-add policy label
    bed.kubectl_ok(&[
        "label",
        "--overwrite",
        "cm",
        "multi-file-policy",
        "-n",
        RELEASE_NAMESPACE,
        "openpolicyagent.org/policy=rego",
    ]);
    policies_loaded(&bed, "policies are reloaded and evaluated correctly").await;
    bed.delete("fixture-multi.yaml");
}

// ---- replicate -----------------------------------------------------------

/// kube-mgmt's `replicate` scenario: Services replicated, one namespace ignored.
async fn replicate_scenario(contender: Contender) {
    let mut values = plain_http(&[
        "--enable-data=false",
        "--enable-policies=false",
        "--replicate-ignore-namespaces=ignore-me",
        "--replicate=v1/services",
        "--log-level=debug",
    ]);
    values.extra_resources = vec!["services"];
    let bed = Bed::start(&contender, values).await;
    // The chart's own Service for OPA, in the release namespace beside
    // `kubernetes`: the second of the two Services the scenario counts there.
    bed.kubectl_ok(&[
        "create",
        "service",
        "clusterip",
        "opa-kube-mgmt",
        "-n",
        RELEASE_NAMESPACE,
        "--tcp=443:8443",
    ]);
    bed.apply("fixture-replication.yaml");
    bed.eventually("replication is correct", || async {
        for ignored in bed.get("/v1/data/kubernetes/services/ignore-me").await {
            // jsonpath "$.result" not exists
            check(ignored.get("result").is_none(), || {
                format!("ignore-me: {ignored}")
            })?;
        }
        for kept in bed.get("/v1/data/kubernetes/services/dont-ignore-me").await {
            // jsonpath "$.result.*" count == 1
            check(count(&kept["result"]) == 1, || {
                format!("dont-ignore-me: {kept}")
            })?;
            // jsonpath "$.result.dont-ignore-me" exists
            check(!kept["result"]["dont-ignore-me"].is_null(), || {
                format!("dont-ignore-me: {kept}")
            })?;
        }
        for default in bed.get("/v1/data/kubernetes/services/default").await {
            // jsonpath "$.result.*" count == 2
            check(count(&default["result"]) == 2, || {
                format!("default: {default}")
            })?;
        }
        Ok(())
    })
    .await;
    bed.delete("fixture-replication.yaml");
}

// ---- the runs ------------------------------------------------------------

#[test]
fn default_scenario_passes_with_placement_sync() {
    run(default_scenario(Contender::PlacementSync));
}

#[test]
fn labels_scenario_passes_with_placement_sync() {
    run(labels_scenario(Contender::PlacementSync));
}

#[test]
fn multi_scenario_passes_with_placement_sync() {
    run(multi_scenario(Contender::PlacementSync));
}

#[test]
fn replicate_scenario_passes_with_placement_sync() {
    run(replicate_scenario(Contender::PlacementSync));
}

#[test]
fn custom_mgmt_token_scenario_passes_with_placement_sync() {
    run(custom_mgmt_token_scenario(Contender::PlacementSync));
}

#[test]
fn kube_mgmt_itself_passes_default_scenario() {
    run(default_scenario(Contender::kube_mgmt()));
}

#[test]
fn kube_mgmt_itself_passes_labels_scenario() {
    run(labels_scenario(Contender::kube_mgmt()));
}

#[test]
fn kube_mgmt_itself_passes_multi_scenario() {
    run(multi_scenario(Contender::kube_mgmt()));
}

#[test]
fn kube_mgmt_itself_passes_replicate_scenario() {
    run(replicate_scenario(Contender::kube_mgmt()));
}

#[test]
fn kube_mgmt_itself_passes_custom_mgmt_token_scenario() {
    run(custom_mgmt_token_scenario(Contender::kube_mgmt()));
}

/// The fixtures kept in the repository are kube-mgmt's, unchanged.
#[test]
fn kube_mgmt_itself_fixtures_match_the_kept_source() {
    let source = kube_mgmt_source().expect(
        "kube-mgmt's source is not beside the repository (../shared/peers/kube-mgmt or \
         $PLACEMENT_KUBE_MGMT_SRC): run with `--skip kube_mgmt_itself`, as scripts/test does",
    );
    let ours = repo_root().join("tests/fixtures/kube-mgmt");
    let mut compared = 0;
    for entry in std::fs::read_dir(source.join("test/e2e")).expect("kube-mgmt's test/e2e") {
        let path = entry.expect("dir entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with("fixture") && name.ends_with(".yaml") {
            let kept = std::fs::read(ours.join(name))
                .unwrap_or_else(|e| panic!("tests/fixtures/kube-mgmt/{name}: {e}"));
            assert_eq!(
                kept,
                std::fs::read(&path).expect("read kube-mgmt fixture"),
                "tests/fixtures/kube-mgmt/{name} differs from {}",
                path.display()
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 4, "kube-mgmt's suite has four fixtures");
}
