//! kube-mgmt's own end-to-end suite (`test/e2e` of open-policy-agent/kube-mgmt at
//! the commit pinned in `../shared/peers/README.md`), translated, run against
//! `placement-sync` and against kube-mgmt itself with the same flags.
//!
//! The translation, one for one:
//! - The Helm values of a scenario become the command line kube-mgmt's chart
//!   renders from them (`--namespaces=<release namespace>`, `--enable-*`,
//!   `--replicate*`, the `extraArgs`; `--opa-auth-token-file` and an `https`
//!   `--opa-url` when `authz`/`useHttps` are on, as by default); the release
//!   namespace is `default`. Both sidecars get exactly the same flags.
//! - The chart's pod becomes an OPA server (HTTPS and token authorization, or
//!   plain HTTP without, as the values say) and the sidecar beside it; the
//!   chart's startup probe becomes a wait for `/health` on `--health-endpoint`;
//!   the chart's RBAC (ConfigMaps of the release namespace, the `extraRules`)
//!   is granted to the sidecar's identity.
//! - Chainsaw's `apply`/`delete` steps are kubectl; its `assert` of a resource
//!   checks every ConfigMap with the given labels or name; its scripts run
//!   kubectl as written (`yq -e` becomes a JSON check).
//! - Each hurl assertion is one assertion here, quoted above it. A hurl file
//!   is retried (its `--retry`, here for up to 30 s; files without `--retry`
//!   get the same patience, since only timing separates them).
//!
//! Not translated: `custom_config` and `replicate_auto`, which need OPA's
//! bundle configuration (`--opa-config`), which placement-sync refuses by name.
//!
//! The kube-mgmt runs (`kube_mgmt_itself_*`) need its source beside the
//! repository (`../shared/peers/kube-mgmt`, or `$PLACEMENT_KUBE_MGMT_SRC`);
//! `scripts/test` leaves them out, saying so, where it is absent.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use placement_tests::{
    ControlPlane, Identity, OpaServer, Process, free_port, project_bin, repo_root, scratch_dir,
};

/// The chart's release namespace in kube-mgmt's suite.
const RELEASE_NAMESPACE: &str = "default";

/// How long a hurl file or a chainsaw assertion may take to pass.
const PATIENCE: Duration = Duration::from_secs(30);

// One scenario at a time, each on its own runtime: each has a control
// plane, and all use `default`.
use placement_tests::run_serially as run;

/// The sidecar under test.
#[derive(Debug, Clone)]
enum Contender {
    PlacementSync,
    KubeMgmt(PathBuf),
}

impl Contender {
    fn kube_mgmt() -> Contender {
        Contender::KubeMgmt(kube_mgmt_bin().join("kube-mgmt"))
    }

    fn name(&self) -> &'static str {
        match self {
            Contender::PlacementSync => "placement-sync",
            Contender::KubeMgmt(_) => "kube-mgmt",
        }
    }

    fn program(&self) -> PathBuf {
        match self {
            Contender::PlacementSync => project_bin("placement-sync"),
            Contender::KubeMgmt(path) => path.clone(),
        }
    }
}

/// The folder holding kube-mgmt: `$PLACEMENT_KUBE_MGMT_BIN` (set by
/// `scripts/test`), else built by `scripts/testbed kube-mgmt-assets`.
fn kube_mgmt_bin() -> PathBuf {
    if let Ok(dir) = std::env::var("PLACEMENT_KUBE_MGMT_BIN") {
        return PathBuf::from(dir);
    }
    let output = std::process::Command::new(repo_root().join("scripts/testbed"))
        .arg("kube-mgmt-assets")
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run scripts/testbed kube-mgmt-assets");
    assert!(
        output.status.success(),
        "kube-mgmt could not be provided (exit {:?}; 3 means its source is absent): \
         run these tests with `--skip kube_mgmt_itself` where it is, as scripts/test does",
        output.status.code()
    );
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// Where kube-mgmt's source is kept, if it is.
fn kube_mgmt_source() -> Option<PathBuf> {
    let dir = std::env::var_os("PLACEMENT_KUBE_MGMT_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/peers/kube-mgmt"));
    dir.join("go.mod").exists().then_some(dir)
}

fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/kube-mgmt").join(name)
}

/// A scenario's pod: OPA and one sidecar beside each OPA replica.
struct Bed {
    plane: ControlPlane,
    opas: Vec<OpaServer>,
    sidecars: Vec<Process>,
    http: reqwest::Client,
    authz: bool,
}

/// What a scenario's values say.
struct Values {
    https: bool,
    authz: bool,
    opa_replicas: usize,
    /// Flags from the values, after the chart's common ones.
    args: Vec<String>,
    /// The token reaches the sidecar as a flag instead of a file.
    token_as_flag: bool,
    /// RBAC `extraRules`: resources to list and watch cluster-wide.
    extra_resources: Vec<&'static str>,
}

impl Default for Values {
    /// The chart's defaults: HTTPS, token authorization, one replica.
    fn default() -> Values {
        Values {
            https: true,
            authz: true,
            opa_replicas: 1,
            args: Vec::new(),
            token_as_flag: false,
            extra_resources: Vec::new(),
        }
    }
}

impl Bed {
    async fn start(contender: &Contender, values: Values) -> Bed {
        let plane = ControlPlane::start();
        grant_chart_rbac(&plane, &values.extra_resources);
        let opas: Vec<OpaServer> = (0..values.opa_replicas)
            .map(|_| OpaServer::start_with(values.https, values.authz))
            .collect();
        let mut sidecars = Vec::new();
        for opa in &opas {
            sidecars.push(start_sidecar(contender, &plane, opa, &values));
        }
        let http = reqwest::Client::builder()
            // hurl --insecure
            .danger_accept_invalid_certs(true)
            .timeout(Duration::from_secs(10))
            .build()
            .expect("HTTP client");
        Bed {
            plane,
            opas,
            sidecars,
            http,
            authz: values.authz,
        }
    }

    fn kubectl_ok(&self, args: &[&str]) -> String {
        self.plane.kubectl_ok(args)
    }

    /// An OPA request as the hurl file makes it, to every OPA replica.
    async fn opa(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Vec<Value> {
        let mut answers = Vec::new();
        for opa in &self.opas {
            let mut request = self
                .http
                .request(method.clone(), format!("{}{path}", opa.url()));
            if self.authz {
                request = request.bearer_auth(opa.token());
            }
            if let Some(body) = &body {
                request = request.json(body);
            }
            let response = request
                .send()
                .await
                .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
            // HTTP 200
            assert_eq!(response.status().as_u16(), 200, "{method} {path}");
            answers.push(response.json().await.expect("OPA answers JSON"));
        }
        answers
    }

    async fn get(&self, path: &str) -> Vec<Value> {
        self.opa(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> Vec<Value> {
        self.opa(reqwest::Method::POST, path, Some(body)).await
    }

    fn sidecar_logs(&self) -> String {
        self.sidecars
            .iter()
            .map(|s| format!("--- {}:\n{}", s.name(), s.log_tail(40)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Retry `check` (a hurl file, a chainsaw assert) until it passes.
    async fn eventually<F, Fut>(&self, step: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match check().await {
                Ok(()) => return,
                Err(failure) if Instant::now() >= deadline => panic!(
                    "step {step:?} did not pass within {PATIENCE:?}: {failure}\n{}",
                    self.sidecar_logs()
                ),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    /// Chainsaw's `assert` of ConfigMaps in the release namespace selected by
    /// `selector` (`-l`) or `name`: each carries `annotations`.
    async fn assert_configmaps(&self, step: &str, selector: &str, annotations: &[(&str, &str)]) {
        self.eventually(step, || async {
            let list: Value = serde_json::from_str(&self.kubectl_ok(&[
                "get",
                "configmaps",
                "-n",
                RELEASE_NAMESPACE,
                "-o",
                "json",
                selector,
            ]))
            .expect("kubectl JSON");
            let items = list["items"].as_array().cloned().unwrap_or_default();
            if items.is_empty() {
                return Err(format!("no ConfigMap {selector}"));
            }
            for cm in &items {
                for (key, want) in annotations {
                    let got = &cm["metadata"]["annotations"][key];
                    if got.as_str() != Some(want) {
                        return Err(format!(
                            "ConfigMap {}: {key} is {got}, want {want}",
                            cm["metadata"]["name"]
                        ));
                    }
                }
            }
            Ok(())
        })
        .await;
    }

    /// Fixtures without a namespace land in the kubeconfig's, `default`: the
    /// test's namespace in kube-mgmt's suite.
    fn apply(&self, file: &str) {
        self.kubectl_ok(&["apply", "-f", &fixture(file).display().to_string()]);
    }

    fn delete(&self, file: &str) {
        self.kubectl_ok(&[
            "delete",
            "--ignore-not-found",
            "--wait=false",
            "-f",
            &fixture(file).display().to_string(),
        ]);
    }
}

/// What kube-mgmt's chart grants its service account: the ConfigMaps of the
/// release namespace (read, and patch for the status annotation) and the
/// scenario's `rbac.extraRules`.
fn grant_chart_rbac(plane: &ControlPlane, extra_resources: &[&str]) {
    let subject = json!([{
        "kind": "ServiceAccount",
        "name": "placement-policy-remediator",
        "namespace": placement_tests::SYSTEM_NAMESPACE,
    }]);
    let mut items = vec![
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "kube-mgmt-e2e", "namespace": RELEASE_NAMESPACE},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                       "verbs": ["get", "list", "watch", "patch", "update"]}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "kube-mgmt-e2e", "namespace": RELEASE_NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kube-mgmt-e2e"},
            "subjects": subject,
        }),
    ];
    if !extra_resources.is_empty() {
        items.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "kube-mgmt-e2e-extra"},
            "rules": [{"apiGroups": [""], "resources": extra_resources, "verbs": ["*"]}],
        }));
        items.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "kube-mgmt-e2e-extra"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kube-mgmt-e2e-extra"},
            "subjects": subject,
        }));
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    let out = plane.kubectl_stdin(&["apply", "-f", "-"], &list.to_string());
    assert!(
        out.status.success(),
        "grant kube-mgmt's RBAC: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The sidecar with the flags kube-mgmt's chart renders from `values`;
/// returns once its `/health` answers 200 (the chart's startup probe).
fn start_sidecar(
    contender: &Contender,
    plane: &ControlPlane,
    opa: &OpaServer,
    values: &Values,
) -> Process {
    let dir = scratch_dir(contender.name());
    let health = free_port();
    let mut args = vec![
        format!(
            "--kubeconfig={}",
            plane.kubeconfig(Identity::Sidecar).display()
        ),
        format!("--opa-url={}/v1", opa.url()),
        format!("--namespaces={RELEASE_NAMESPACE}"),
        format!("--health-endpoint=127.0.0.1:{health}"),
    ];
    if values.authz {
        if values.token_as_flag {
            args.push(format!("--opa-auth-token={}", opa.token()));
        } else {
            args.push(format!(
                "--opa-auth-token-file={}",
                opa.token_file().display()
            ));
        }
    }
    if values.https {
        // The chart's OPA certificate is self-signed; with a CA at hand, the
        // CA flag is used (custom_mgmt_token), else the chart's default.
        match (values.token_as_flag, opa.ca_file()) {
            (true, Some(ca)) => args.push(format!("--opa-ca-file={}", ca.display())),
            _ => args.push("--opa-allow-insecure".into()),
        }
    }
    args.extend(values.args.iter().cloned());
    let mut process = Process::spawn(
        contender.name(),
        &contender.program(),
        &args,
        &dir.join(format!("{}.log", contender.name())),
    )
    .unwrap_or_else(|e| panic!("start {}: {e}", contender.name()));
    let url = format!("http://127.0.0.1:{health}/health");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = std::process::Command::new("curl")
            .args(["-sf", "-o", "/dev/null", "--max-time", "2", &url])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return process;
        }
        assert!(
            !process.has_exited(),
            "{} exited with flags {args:?}:\n{}",
            contender.name(),
            process.log_tail(40)
        );
        assert!(
            Instant::now() < deadline,
            "{} did not answer {url}:\n{}",
            contender.name(),
            process.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

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

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
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

// ---- the webhook beside a kube-mgmt selection -----------------------------

/// An AdmissionReview for a ReplicaSet in the release namespace.
fn review() -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b6c8f1e-5d0a-4f44-9d36-3d7f3b2f9a01",
            "kind": {"group": "apps", "version": "v1", "kind": "ReplicaSet"},
            "resource": {"group": "apps", "version": "v1", "resource": "replicasets"},
            "namespace": RELEASE_NAMESPACE,
            "operation": "CREATE",
            "userInfo": {"username": "developer"},
            "object": {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": "web", "namespace": RELEASE_NAMESPACE},
                "spec": {
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
                    },
                },
            },
        },
    })
}

async fn admitted(webhook: &placement_tests::WebhookProcess) -> bool {
    let body = serde_json::to_vec(&review()).unwrap();
    let (status, text) = webhook.post("/mutate", body).await;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).expect("AdmissionReview");
    answer["response"]["allowed"] == json!(true)
}

async fn wait_admission(webhook: &placement_tests::WebhookProcess, want: bool, step: &str) {
    let deadline = Instant::now() + PATIENCE;
    while admitted(webhook).await != want {
        assert!(
            Instant::now() < deadline,
            "{step}: allowed is still {}\n{}",
            !want,
            webhook.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Fail closed iff policies exist, where "policies" are what the sidecar
/// loads with kube-mgmt's flags: labelled ConfigMaps of `--namespaces`. OPA
/// is down throughout, so an admission is allowed only while none exists.
#[test]
fn webhook_policies_exist_follows_the_kube_mgmt_selection() {
    run(async {
        let plane = ControlPlane::start();
        // The chart grants the webhook what it grants the sidecar: reading
        // ConfigMaps of the selected namespaces.
        let grant = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "webhook-policies", "namespace": RELEASE_NAMESPACE},
             "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "webhook-policies", "namespace": RELEASE_NAMESPACE},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "webhook-policies"},
             "subjects": [{"kind": "ServiceAccount", "name": "placement-policy-webhook",
                           "namespace": placement_tests::SYSTEM_NAMESPACE}]},
        ]});
        let out = plane.kubectl_stdin(&["apply", "-f", "-"], &grant.to_string());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dead_opa = free_port();
        let webhook = placement_tests::WebhookProcess::start(&[
            format!(
                "--kubeconfig={}",
                plane.kubeconfig(Identity::Webhook).display()
            ),
            format!("--opa-url=http://127.0.0.1:{dead_opa}/v1"),
            format!("--namespaces={RELEASE_NAMESPACE}"),
            "--engine-deadline=1s".into(),
        ]);
        wait_admission(&webhook, true, "no policy ConfigMap: fail open").await;
        // kube-mgmt's fixture: a policy labelled `qwerty`, a labelless one, data.
        plane.kubectl_ok(&[
            "apply",
            "-f",
            &fixture("fixture.yaml").display().to_string(),
        ]);
        plane.kubectl_ok(&["delete", "cm", "policy-include"]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            admitted(&webhook).await,
            "ConfigMaps without the policy label are not policies"
        );
        plane.kubectl_ok(&[
            "label",
            "--overwrite",
            "cm",
            "policy-labeless",
            "openpolicyagent.org/policy=rego",
        ]);
        wait_admission(&webhook, false, "a labelled policy: fail closed").await;
        plane.kubectl_ok(&[
            "label",
            "cm",
            "policy-labeless",
            "openpolicyagent.org/policy-",
        ]);
        wait_admission(&webhook, true, "the label removed: fail open again").await;
    });
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
