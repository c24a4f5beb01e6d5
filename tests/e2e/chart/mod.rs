//! The Helm chart, rendered by the real helm (built by the test bed) and
//! checked against a real API server: what every install gets, whatever the
//! values.

use placement_tests::{ControlPlane, cluster, repo_root};
use serde_json::{Value, json};

mod accounts;
mod dashboard;
mod federation;
mod rbac;
mod values;

/// `helm template` of the chart with `values` (`--set` arguments), as JSON
/// documents.
fn render(values: &[&str]) -> Vec<Value> {
    render_release("placement-policy", "placement-system", values)
}

/// `helm template` of release `release` in `namespace`.
fn render_release(release: &str, namespace: &str, values: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "template",
        release,
        "charts/placement-policy",
        "-n",
        namespace,
        "--include-crds",
    ];
    for value in values {
        args.extend(["--set", value]);
    }
    let out = std::process::Command::new(cluster::cluster_assets().join("helm"))
        .args(&args)
        .current_dir(repo_root())
        .output()
        .expect("run helm template");
    assert!(
        out.status.success(),
        "helm template {values:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_serde::Deserializer::from_str(&String::from_utf8_lossy(&out.stdout))
        .map(|document| serde::Deserialize::deserialize(document).expect("rendered YAML"))
        .filter(|doc: &Value| !doc.is_null())
        .collect()
}

/// `helm template` with `value` set fails, naming the problem with `message`.
fn refused(value: &str, message: &str) {
    let out = std::process::Command::new(cluster::cluster_assets().join("helm"))
        .args(["template", "x", "charts/placement-policy", "--set", value])
        .current_dir(repo_root())
        .output()
        .expect("run helm template");
    assert!(!out.status.success(), "{value} rendered");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(message), "{value}: {stderr}");
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// A Deployment's containers; it has one at least, so that checks of each
/// cannot pass on none.
fn containers(deployment: &Value) -> Vec<&Value> {
    let containers: Vec<&Value> = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .collect();
    assert!(
        !containers.is_empty(),
        "{} renders no containers",
        deployment["metadata"]["name"]
    );
    containers
}

fn args(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}
