//! kubectl, run as users run it, against any of the test bed's API servers.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::repo_root;

/// Run kubectl with `kubeconfig`.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--request-timeout=30s")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kubectl")
}

/// kubectl that must succeed; returns stdout.
pub fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> String {
    let out = kubectl(kubeconfig, args);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An UPDATE as a user makes one: `kubectl label` the ReplicaSet `name` in
/// `namespace` with `touched=yes`, which must succeed; the object as stored.
pub fn touch_replicaset(kubeconfig: &Path, namespace: &str, name: &str) -> serde_json::Value {
    let out = kubectl(
        kubeconfig,
        &[
            "label",
            "rs",
            name,
            "-n",
            namespace,
            "touched=yes",
            "-o",
            "json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("kubectl -o json")
}

/// Run kubectl with `kubeconfig`, feeding `stdin`.
pub fn kubectl_stdin(kubeconfig: &Path, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--request-timeout=30s")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write kubectl stdin");
    child.wait_with_output().expect("kubectl output")
}

/// The Cluster objects of `examples/clusters.yaml`, with their status (the
/// CRD must be installed).
pub fn apply_example_clusters(kubeconfig: &Path) {
    let file = repo_root().join("examples/clusters.yaml");
    kubectl_ok(kubeconfig, &["apply", "-f", &file.display().to_string()]);
    let text = std::fs::read_to_string(&file).expect("read examples/clusters.yaml");
    for document in yaml_serde::Deserializer::from_str(&text) {
        let doc: serde_json::Value =
            serde::Deserialize::deserialize(document).expect("clusters.yaml is YAML");
        let name = doc["metadata"]["name"].as_str().expect("cluster name");
        let status = serde_json::json!({"status": doc["status"]}).to_string();
        kubectl_ok(
            kubeconfig,
            &[
                "patch",
                &format!("clusters.placement-policy.io/{name}"),
                "--subresource=status",
                "--type=merge",
                "-p",
                &status,
            ],
        );
    }
}

/// The shipped policy (`policies/*.rego`, tests excluded) as the ConfigMap
/// `placement` in `namespace`.
pub fn create_shipped_policy_configmap(kubeconfig: &Path, namespace: &str) {
    let data: serde_json::Map<String, serde_json::Value> = crate::shipped_policy_modules()
        .into_iter()
        .map(|(name, source)| (name, serde_json::Value::String(source)))
        .collect();
    let configmap = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "placement", "namespace": namespace},
        "data": data,
    });
    let out = kubectl_stdin(kubeconfig, &["create", "-f", "-"], &configmap.to_string());
    assert!(
        out.status.success(),
        "create the policy ConfigMap: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The documents of `deploy/placement-policy.yaml` (rendered from the chart)
/// whose kind is one of `kinds`.
pub fn deploy_documents(kinds: &[&str]) -> Vec<serde_json::Value> {
    let path = repo_root().join("deploy/placement-policy.yaml");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    yaml_documents(&text)
        .into_iter()
        .filter(|doc| {
            doc["kind"]
                .as_str()
                .is_some_and(|kind| kinds.contains(&kind))
        })
        .collect()
}

/// The documents of a YAML stream, as JSON (empty documents left out).
pub fn yaml_documents(text: &str) -> Vec<serde_json::Value> {
    yaml_serde::Deserializer::from_str(text)
        .map(|document| serde::Deserialize::deserialize(document).expect("a YAML document"))
        .filter(|doc: &serde_json::Value| !doc.is_null())
        .collect()
}

/// `kubectl apply` of `documents` as one List.
pub fn apply_documents(kubeconfig: &Path, documents: Vec<serde_json::Value>) {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": documents});
    let out = kubectl_stdin(kubeconfig, &["apply", "-f", "-"], &list.to_string());
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `kubectl placement ARGS` (the plugin, `target/debug/kubectl-placement`)
/// against the API server of `kubeconfig`; the output, stdout and stderr
/// both printed for the test log.
pub fn kubectl_placement(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    let out = std::process::Command::new(crate::project_bin("kubectl-placement"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .output()
        .expect("run kubectl-placement");
    eprintln!(
        "$ kubectl placement {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The row of `cluster` in the table `kubectl placement explain` printed in
/// `text`, its columns joined by single spaces.
pub fn explained_row(text: &str, cluster: &str) -> String {
    text.lines()
        .find(|l| l.starts_with(&format!("{cluster} ")))
        .unwrap_or_else(|| panic!("no line for {cluster}:\n{text}"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}
