//! The product as users run it: the project's own images in a real single-node
//! cluster (kubelet, containerd, controllers, kube-proxy), installed with
//! `kubectl apply -f deploy/`, reached by the API server through its Service.

use std::time::Duration;

use placement_tests::kubectl::apply_example_clusters;
use placement_tests::{Cluster, POLICY_NAMESPACE, placed_clusters, repo_root, serial, wait_for};

/// Where the shipped policy places the EU/PCI example.
const EU_PCI: [&str; 2] = ["gce-europe-west1", "gce-europe-west2"];

/// A cluster of this test's own with deploy/ installed, gone when dropped:
/// the shared cluster of this binary holds `operations`' Helm releases,
/// which deploy/'s objects (the same names) would collide with.
fn installed() -> Cluster {
    let cluster = Cluster::start();
    cluster.import_project_images();
    cluster.install_deploy();
    apply_example_clusters(&cluster.kubeconfig());
    // deploy/ holds the shipped policy; the sidecars report its load on the
    // ConfigMap once their OPA has it.
    wait_for(
        "the policy ConfigMap's status to be ok",
        Duration::from_secs(120),
        || {
            let status = cluster.kubectl_ok(&[
                "get",
                "configmap",
                "placement",
                "-n",
                POLICY_NAMESPACE,
                "-o",
                "jsonpath={.metadata.annotations.placement-policy\\.io/policy-status}",
            ]);
            status.contains("\"ok\"").then_some(())
        },
    );
    cluster
}

#[test]
fn deploy_places_replicasets_created_by_users_and_by_the_deployment_controller() {
    let _serial = serial();
    let cluster = installed();

    // A user's `kubectl create` returns the object with its placement.
    let example = repo_root().join("examples/replicaset-eu-pci.yaml");
    let created =
        cluster.kubectl_ok(&["create", "-f", &example.display().to_string(), "-o", "json"]);
    let created: serde_json::Value = serde_json::from_str(&created).expect("created object JSON");
    assert_eq!(
        placed_clusters(&created),
        Some(EU_PCI.map(String::from).to_vec()),
        "kubectl create returned {created}\n{}",
        cluster.diagnostics()
    );

    // The Deployment controller creates the ReplicaSet; the webhook places it.
    let deployment = r#"{
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web-eu",
            "namespace": "default",
            "annotations": {
                "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true",
                "policy.federation.alpha.kubernetes.io/pci-compliance-level": "2"
            }
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web-eu"}},
            "template": {
                "metadata": {"labels": {"app": "web-eu"}},
                "spec": {"containers": [{
                    "name": "web",
                    "image": "registry.k8s.io/pause:3.10",
                    "imagePullPolicy": "IfNotPresent"
                }]}
            }
        }
    }"#;
    let out = cluster.kubectl_stdin(&["create", "-f", "-"], deployment);
    assert!(
        out.status.success(),
        "create the Deployment: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let replicaset = wait_for(
        "the Deployment controller to create a ReplicaSet",
        Duration::from_secs(60),
        || {
            let list = cluster.kubectl_ok(&[
                "get",
                "replicasets",
                "-n",
                "default",
                "-l",
                "app=web-eu",
                "-o",
                "json",
            ]);
            let list: serde_json::Value = serde_json::from_str(&list).expect("list JSON");
            list["items"].as_array()?.first().cloned()
        },
    );
    assert_eq!(
        replicaset["metadata"]["ownerReferences"][0]["kind"], "Deployment",
        "{replicaset}"
    );
    assert_eq!(
        placed_clusters(&replicaset),
        Some(EU_PCI.map(String::from).to_vec()),
        "the controller's ReplicaSet: {replicaset}\n{}",
        cluster.diagnostics()
    );
    // The controller's own writes (status, scale) keep going through the webhook.
    cluster.kubectl_ok(&[
        "rollout",
        "status",
        "deployment/web-eu",
        "-n",
        "default",
        "--timeout=120s",
    ]);
}

/// A test bed killed without warning (a crashed or cancelled test run) leaves
/// no process, mount, network device or iptables rule on the host, and the next
/// start removes its empty cgroup folders.
#[test]
fn a_killed_cluster_leaves_nothing_behind() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let _serial = serial();
    let iptables_before = host_iptables();
    // Killed also when a check fails before the test kills it.
    struct TestBed(std::process::Child);
    impl Drop for TestBed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut testbed = TestBed(
        Command::new(placement_tests::project_bin("testbed"))
            .args(["up", "--cluster", "--bare"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start testbed up --cluster"),
    );
    let stdout = BufReader::new(testbed.0.stdout.take().expect("stdout"));
    let mut init_pid = None;
    for line in stdout.lines() {
        let line = line.expect("testbed output");
        if let Some(rest) = line.split("namespaces of PID ").nth(1) {
            init_pid = rest
                .split(',')
                .next()
                .and_then(|pid| pid.trim().parse::<u32>().ok());
        }
        if line.contains("Ctrl-C stops everything") {
            break;
        }
    }
    let init_pid = init_pid.expect("testbed printed the node's PID");
    let pid_ns =
        std::fs::read_link(format!("/proc/{init_pid}/ns/pid")).expect("node PID namespace");
    let mount_ns =
        std::fs::read_link(format!("/proc/{init_pid}/ns/mnt")).expect("node mount namespace");
    let interface = format!("pptb{init_pid}");
    assert!(
        link_exists(&interface),
        "the running node has its host link"
    );
    let in_namespace = || {
        std::fs::read_dir("/proc")
            .expect("read /proc")
            .filter_map(|e| e.ok())
            .filter(|e| std::fs::read_link(e.path().join("ns/pid")).is_ok_and(|ns| ns == pid_ns))
            .count()
    };
    assert!(in_namespace() > 5, "the node runs its components");
    // Its cgroup folders exist, so that their absence after the sweep means
    // something.
    let cgroups = || {
        placement_tests::cluster::cgroup_hierarchies()
            .into_iter()
            .map(|hierarchy| hierarchy.join(format!("placement-testbed-{init_pid}")))
            .filter(|folder| folder.exists())
            .collect::<Vec<_>>()
    };
    assert!(!cgroups().is_empty(), "the running node has cgroup folders");

    testbed.0.kill().expect("kill the test bed");
    testbed.0.wait().expect("reap the test bed");
    wait_for(
        "the node's processes to die",
        Duration::from_secs(30),
        || (in_namespace() == 0).then_some(()),
    );
    wait_for(
        "the node's host link to go",
        Duration::from_secs(30),
        || (!link_exists(&interface)).then_some(()),
    );
    let mount_ns_alive = std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(|e| e.ok())
        .any(|e| std::fs::read_link(e.path().join("ns/mnt")).is_ok_and(|ns| ns == mount_ns));
    assert!(
        !mount_ns_alive,
        "the node's mount namespace (its mounts) is gone"
    );
    let host_mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !host_mounts.contains("placement-testbed"),
        "no test-bed mount on the host:\n{host_mounts}"
    );
    assert_eq!(
        host_iptables(),
        iptables_before,
        "the host's iptables rules are unchanged"
    );

    placement_tests::cluster::sweep_cgroups();
    assert_eq!(cgroups(), Vec::<std::path::PathBuf>::new(), "swept");
}

fn link_exists(name: &str) -> bool {
    std::path::Path::new("/sys/class/net").join(name).exists()
}

/// The host's iptables rules, counters left out. A failed `iptables-save`
/// fails the test: two failures would compare equal.
fn host_iptables() -> String {
    let out = std::process::Command::new("iptables-save")
        .output()
        .expect("run iptables-save");
    assert!(
        out.status.success(),
        "iptables-save failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| !line.starts_with('#') && !line.starts_with(':'))
        .collect::<Vec<_>>()
        .join("\n")
}
