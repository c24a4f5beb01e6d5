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

use placement_tests::{
    ControlPlane, Identity, OpaServer, Process, free_port, project_bin, repo_root, scratch_dir,
};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};
// One scenario at a time, each on its own runtime: each has a control
// plane, and all use `default`.
use placement_tests::run_serially as run;

mod admission;
mod scenarios;

/// The chart's release namespace in kube-mgmt's suite.
const RELEASE_NAMESPACE: &str = "default";

/// How long a hurl file or a chainsaw assertion may take to pass.
const PATIENCE: Duration = Duration::from_secs(30);

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

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
}
