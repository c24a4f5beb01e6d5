//! A real control plane: etcd and kube-apiserver on loopback, configured the way
//! envtest does it, with static-token identities for the admin, the webhook and
//! the sync sidecar (the latter two get only what the chart's RBAC grants their
//! service accounts, as rendered in `deploy/placement-policy.yaml`).

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::process::{Process, free_port, port_open, wait_for};
use crate::{peer, scratch_dir};

/// Namespace the project's components run in (see `deploy/`).
pub const SYSTEM_NAMESPACE: &str = "placement-system";
/// The service account of the sync sidecar (the remediator's), in
/// [`SYSTEM_NAMESPACE`].
pub const SIDECAR_ACCOUNT: &str = "placement-policy-remediator";
/// Namespace whose ConfigMaps are policies: the components' default.
pub const POLICY_NAMESPACE: &str = policy_client::configmaps::DEFAULT_POLICY_NAMESPACE;

/// Who talks to the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// `system:masters`: the developer/administrator driving the tests.
    Admin,
    /// The webhook's service account (`placement-policy-webhook`).
    Webhook,
    /// The sync sidecar's: the remediator's service account
    /// (`placement-policy-remediator`), which may do all a sidecar does.
    Sidecar,
}

impl Identity {
    fn all() -> [Identity; 3] {
        [Identity::Admin, Identity::Webhook, Identity::Sidecar]
    }

    fn slug(self) -> &'static str {
        match self {
            Identity::Admin => "admin",
            Identity::Webhook => "webhook",
            Identity::Sidecar => "sidecar",
        }
    }

    /// Line of the API server's static token file: token,user,uid,"groups".
    fn token_line(self, token: &str) -> String {
        match self {
            Identity::Admin => format!("{token},admin,admin-uid,\"system:masters\""),
            Identity::Webhook | Identity::Sidecar => {
                let sa = match self {
                    Identity::Webhook => "placement-policy-webhook",
                    _ => SIDECAR_ACCOUNT,
                };
                format!(
                    "{token},system:serviceaccount:{SYSTEM_NAMESPACE}:{sa},{sa}-uid,\"system:serviceaccounts,system:serviceaccounts:{SYSTEM_NAMESPACE}\""
                )
            }
        }
    }
}

/// etcd on two fresh ports. A port can still be taken between our probe and
/// etcd's bind (by another test process), so an etcd that exits before it
/// listens is started again on other ports; its log is in the panic otherwise.
fn start_etcd(dir: &Path) -> (Process, u16) {
    const ATTEMPTS: usize = 3;
    let mut exits = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let etcd_port = free_port();
        let peer_port = free_port();
        // A clean data directory: a failed attempt may have started one.
        let _ = std::fs::remove_dir_all(dir.join("etcd"));
        let etcd_args: Vec<String> = vec![
            "--name=default".into(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
            // Tests don't need durability; fsync dominates etcd latency on CI disks.
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        let log = dir.join(format!("etcd-{attempt}.log"));
        let mut etcd = Process::spawn("etcd", &peer("etcd"), &etcd_args, &log).expect("start etcd");
        let listening = wait_for("etcd to listen", Duration::from_secs(60), || {
            if port_open(etcd_port) {
                Some(true)
            } else {
                etcd.has_exited().then_some(false)
            }
        });
        if listening {
            return (etcd, etcd_port);
        }
        exits.push(format!(
            "attempt {attempt} (ports {etcd_port}, {peer_port}):\n{}",
            etcd.log_tail(10)
        ));
    }
    panic!(
        "etcd exited before listening, {ATTEMPTS} times:\n{}",
        exits.join("\n")
    );
}

pub struct ControlPlane {
    dir: PathBuf,
    etcd: Mutex<Process>,
    apiserver: Mutex<Process>,
    apiserver_args: Vec<String>,
    examples_loaded: Mutex<bool>,
    /// How often the API server was started again.
    restarts: AtomicU32,
    pub apiserver_port: u16,
    pub etcd_port: u16,
}

impl ControlPlane {
    /// One control plane shared by the tests of a test binary (each test uses its
    /// own namespaces). Started on first use; its processes end with the test
    /// process.
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        crate::shared(&SHARED, "control plane", ControlPlane::start)
    }

    /// A control plane of one's own (for tests that restart the API server).
    pub fn start() -> ControlPlane {
        Self::start_with_args(&[])
    }

    /// A control plane of one's own whose kube-apiserver gets `extra` flags
    /// (e.g. `--admission-control-config-file`).
    pub fn start_with_args(extra: &[String]) -> ControlPlane {
        let dir = scratch_dir("control-plane");
        let (etcd, etcd_port) = start_etcd(&dir);
        let apiserver_port = free_port();

        // Serving certificate of the API server, from our own CA.
        let ca = placement_certs::Ca::generate("testbed-apiserver-ca").expect("apiserver CA");
        let serving = ca
            .issue_serving(&["127.0.0.1".into(), "localhost".into()])
            .expect("apiserver serving certificate");
        write(&dir.join("apiserver-ca.crt"), ca.cert_pem());
        write(&dir.join("apiserver.crt"), &serving.cert_pem);
        write(&dir.join("apiserver.key"), &serving.key_pem);
        // Service account signing key (ECDSA P-256).
        let sa_key = rcgen::KeyPair::generate().expect("service account key");
        write(&dir.join("sa.key"), &sa_key.serialize_pem());
        write(&dir.join("sa.pub"), &sa_key.public_key_pem());
        // Static tokens, one per identity.
        let tokens: Vec<String> = Identity::all()
            .iter()
            .map(|id| id.token_line(&token(id.slug())))
            .collect();
        write(&dir.join("tokens.csv"), &(tokens.join("\n") + "\n"));

        let mut apiserver_args: Vec<String> = vec![
            "--advertise-address=127.0.0.1".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={apiserver_port}"),
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", dir.join("apiserver.crt").display()),
            format!(
                "--tls-private-key-file={}",
                dir.join("apiserver.key").display()
            ),
            format!("--token-auth-file={}", dir.join("tokens.csv").display()),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-issuer=https://127.0.0.1:{apiserver_port}"),
            format!(
                "--service-account-key-file={}",
                dir.join("sa.pub").display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                dir.join("sa.key").display()
            ),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--enable-priority-and-fairness=false".into(),
            // No Service network here: don't publish the loopback address as the
            // `kubernetes` Endpoints (which the API server refuses with an error).
            "--endpoint-reconciler-type=none".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        apiserver_args.extend(extra.iter().cloned());
        let apiserver = Process::spawn(
            "kube-apiserver",
            &peer("kube-apiserver"),
            &apiserver_args,
            &dir.join("kube-apiserver.log"),
        )
        .expect("start kube-apiserver");
        let plane = ControlPlane {
            dir,
            etcd: Mutex::new(etcd),
            apiserver: Mutex::new(apiserver),
            apiserver_args,
            examples_loaded: Mutex::new(false),
            restarts: AtomicU32::new(0),
            apiserver_port,
            etcd_port,
        };
        for id in Identity::all() {
            plane.write_kubeconfig(id);
        }
        plane.wait_ready();
        plane.install_base();
        plane
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.apiserver_port)
    }

    /// The CA that signed the API server's serving certificate (PEM file).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("apiserver-ca.crt")
    }

    /// The bearer token of `identity` (a static token of this test bed).
    pub fn token(&self, identity: Identity) -> String {
        token(identity.slug())
    }

    /// Kubeconfig file of `identity`.
    pub fn kubeconfig(&self, identity: Identity) -> PathBuf {
        self.dir.join(format!("kubeconfig-{}", identity.slug()))
    }

    fn write_kubeconfig(&self, identity: Identity) {
        let ca = self.ca_file();
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: testbed\n  context:\n    cluster: testbed\n    user: {user}\ncurrent-context: testbed\n",
            server = self.server_url(),
            ca = ca.display(),
            user = identity.slug(),
            token = token(identity.slug()),
        );
        write(&self.kubeconfig(identity), &text);
    }

    /// A kube client for `identity` (bound to the calling test's runtime).
    pub async fn client(&self, identity: Identity) -> kube::Client {
        kube_client(&self.kubeconfig(identity)).await
    }

    /// Run kubectl as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_as(Identity::Admin, args)
    }

    pub fn kubectl_as(&self, identity: Identity, args: &[&str]) -> Output {
        crate::kubectl::kubectl(&self.kubeconfig(identity), args)
    }

    /// Run kubectl as the admin, feeding `stdin`.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        crate::kubectl::kubectl_stdin(&self.kubeconfig(Identity::Admin), args, stdin)
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        crate::kubectl::kubectl_ok(&self.kubeconfig(Identity::Admin), args)
    }

    /// Events on `kind` `namespace/name`, as `(reason, message)`.
    pub fn events(&self, namespace: &str, kind: &str, name: &str) -> Vec<(String, String)> {
        let text = self.kubectl_ok(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &format!("involvedObject.kind={kind},involvedObject.name={name}"),
            "-o",
            "json",
        ]);
        let list: serde_json::Value = serde_json::from_str(&text).expect("event list JSON");
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                    e["message"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    fn wait_ready(&self) {
        wait_for("kube-apiserver /readyz", Duration::from_secs(180), || {
            {
                let mut apiserver = self.apiserver.lock().unwrap_or_else(|p| p.into_inner());
                assert!(
                    !apiserver.has_exited(),
                    "kube-apiserver exited:\n{}",
                    apiserver.log_tail(40)
                );
            }
            let out = self.kubectl(&["get", "--raw=/readyz"]);
            (out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok")
                .then_some(())
        });
    }

    /// Namespaces, the Cluster CRD, RBAC and the remediator's Lease from
    /// `deploy/placement-policy.yaml` (not the policy: tests add their own).
    fn install_base(&self) {
        let kubeconfig = self.kubeconfig(Identity::Admin);
        let kinds = ["Namespace", "CustomResourceDefinition"];
        crate::kubectl::apply_documents(&kubeconfig, crate::kubectl::deploy_documents(&kinds));
        self.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/clusters.placement-policy.io",
        ]);
        let kinds = [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Lease",
        ];
        crate::kubectl::apply_documents(&kubeconfig, crate::kubectl::deploy_documents(&kinds));
    }

    /// Stop the API server (SIGTERM), then start it again with the same flags
    /// and wait until it is ready. `while_down` runs in between.
    pub fn restart_apiserver(&self, while_down: impl FnOnce()) {
        self.stop_apiserver();
        while_down();
        self.start_apiserver();
    }

    /// Stop the API server (SIGTERM) and wait until its port is closed; etcd
    /// keeps running. [`ControlPlane::start_apiserver`] brings it back.
    pub fn stop_apiserver(&self) {
        let mut apiserver = self.apiserver.lock().unwrap_or_else(|p| p.into_inner());
        apiserver.terminate(Duration::from_secs(20));
        wait_for(
            "kube-apiserver port to close",
            Duration::from_secs(30),
            || (!port_open(self.apiserver_port)).then_some(()),
        );
    }

    /// Start the API server again with the same flags (after
    /// [`ControlPlane::stop_apiserver`]) and wait until it is ready.
    pub fn start_apiserver(&self) {
        let mut apiserver = self.apiserver.lock().unwrap_or_else(|p| p.into_inner());
        let restarts = self.restarts.fetch_add(1, Ordering::Relaxed);
        let log = if restarts == 0 {
            "kube-apiserver-restarted.log".to_owned()
        } else {
            format!("kube-apiserver-restarted-{}.log", restarts + 1)
        };
        *apiserver = Process::spawn(
            "kube-apiserver",
            &peer("kube-apiserver"),
            &self.apiserver_args,
            &self.dir.join(log),
        )
        .expect("restart kube-apiserver");
        drop(apiserver);
        self.wait_ready();
    }

    /// Whether etcd is still running (for diagnostics).
    pub fn etcd_running(&self) -> bool {
        !self
            .etcd
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .has_exited()
    }

    /// A namespace for one test, labelled so that only that test's webhook
    /// configuration selects it.
    pub fn create_namespace(&self, name: &str) {
        let manifest = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n    placement-test: {name}\n"
        );
        let out = self.kubectl_stdin(&["apply", "-f", "-"], &manifest);
        assert!(
            out.status.success(),
            "create namespace {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl ControlPlane {
    /// A policy namespace of one's own (so tests don't see each other's policy
    /// ConfigMaps), with the Roles and RoleBindings the chart grants in
    /// the real policy namespace.
    pub fn create_policy_namespace(&self, name: &str) {
        let manifest = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n");
        let out = self.kubectl_stdin(&["apply", "-f", "-"], &manifest);
        assert!(
            out.status.success(),
            "create namespace {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut items = Vec::new();
        for mut doc in crate::kubectl::deploy_documents(&["Role", "RoleBinding"]) {
            if doc["metadata"]["namespace"].as_str() == Some(POLICY_NAMESPACE) {
                doc["metadata"]["namespace"] = serde_json::Value::String(name.to_owned());
                items.push(doc);
            }
        }
        assert!(
            !items.is_empty(),
            "deploy/placement-policy.yaml grants nothing in {POLICY_NAMESPACE}"
        );
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        let out = self.kubectl_stdin(&["apply", "-f", "-"], &list.to_string());
        assert!(
            out.status.success(),
            "grant policy namespace {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The example Cluster objects of `examples/clusters.yaml`, with their
    /// status, created once per control plane.
    pub fn ensure_example_clusters(&self) {
        let mut done = self
            .examples_loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *done {
            return;
        }
        crate::kubectl::apply_example_clusters(&self.kubeconfig(Identity::Admin));
        *done = true;
    }

    /// Cluster objects matching a label selector, as the sync sidecar would
    /// replicate them (`metadata.managedFields` stripped).
    pub fn clusters(&self, selector: &str) -> Vec<serde_json::Value> {
        let text = self.kubectl_ok(&[
            "get",
            "clusters.placement-policy.io",
            "-l",
            selector,
            "-o",
            "json",
        ]);
        let list: serde_json::Value = serde_json::from_str(&text).expect("cluster list JSON");
        list["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|mut item| {
                if let Some(meta) = item["metadata"].as_object_mut() {
                    meta.remove("managedFields");
                }
                item
            })
            .collect()
    }

    /// Register a `MutatingWebhookConfiguration` named `name` that sends
    /// CREATE/UPDATE of ReplicaSets and Deployments (and their status updates
    /// that change annotations, as the chart's) in namespaces labelled
    /// `placement-test=<name>` to `url`, trusting `ca_pem`.
    pub fn register_webhook(&self, name: &str, url: &str, ca_pem: &str, policy_namespace: &str) {
        self.register_webhook_for(
            name,
            url,
            ca_pem,
            policy_namespace,
            serde_json::json!([{
                "apiGroups": ["apps"],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["replicasets", "deployments", "replicasets/status", "deployments/status"],
                "scope": "Namespaced"
            }]),
            serde_json::json!([status_only_when_it_changes_annotations()]),
        );
    }

    /// [`ControlPlane::register_webhook`] with these `rules` and match
    /// `conditions`.
    pub fn register_webhook_for(
        &self,
        name: &str,
        url: &str,
        ca_pem: &str,
        policy_namespace: &str,
        rules: serde_json::Value,
        conditions: serde_json::Value,
    ) {
        let config = serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "placement.placement-policy.io",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": url, "caBundle": placement_certs::ca_bundle(ca_pem)},
                "rules": rules,
                "matchConditions": conditions,
                "namespaceSelector": {
                    "matchLabels": {"placement-test": name},
                    "matchExpressions": [{
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": [policy_namespace, SYSTEM_NAMESPACE]
                    }]
                },
                "sideEffects": "NoneOnDryRun",
                "timeoutSeconds": 10,
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never"
            }]
        });
        let out = self.kubectl_stdin(&["apply", "-f", "-"], &config.to_string());
        assert!(
            out.status.success(),
            "register webhook {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A kube client from a kubeconfig file (bound to the calling runtime).
pub async fn kube_client(kubeconfig: &Path) -> kube::Client {
    crate::install_crypto();
    policy_client::kube_client::client(Some(kubeconfig))
        .await
        .expect("kube client")
}

/// The static token of an identity in this test bed.
fn token(slug: &str) -> String {
    format!("testbed-{slug}-token")
}

fn write(path: &Path, contents: &str) {
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// The chart's match condition for a mutating webhook that sees status
/// updates: only those that change annotations are sent (a status update
/// cannot change a spec; Karmada's and Kubernetes' controllers write status
/// thousands of times a minute, each a webhook call the API server pays for).
pub fn status_only_when_it_changes_annotations() -> serde_json::Value {
    serde_json::json!({
        "name": "status-only-when-it-changes-annotations",
        "expression": "!has(request.subResource) || request.subResource != 'status' || (has(object.metadata.annotations) ? object.metadata.annotations : {}) != (has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {})"
    })
}
