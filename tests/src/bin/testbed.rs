//! `testbed up [--bare]`: start etcd, kube-apiserver and OPA on loopback in the
//! foreground and, unless `--bare`, the whole product on top: the example
//! Cluster registry, the shipped policy as a ConfigMap, `placement-sync`
//! replicating into OPA, and `placement-webhook` registered with the API server.
//! Prints how to reach everything; Ctrl-C stops it all.
//!
//! `testbed up --cluster [--bare]`: the single-node cluster instead, with the
//! product installed from its images. `testbed up --karmada [--bare]
//! [--members N]`: a Karmada federation (control plane and three members, or
//! N with light ones) with OPA and placement-sync against Karmada's API
//! server. `testbed up --ocm [--bare]`:
//! an Open Cluster Management hub with three managed clusters.

use std::time::Duration;

use placement_tests::{
    Cluster, ControlPlane, Identity, Karmada, Ocm, OpaServer, POLICY_NAMESPACE, SidecarProcess,
    WebhookProcess, cluster, repo_root,
};
use serde_json::json;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("up") if args.iter().any(|a| a == "--cluster") => {
            up_cluster(args.iter().any(|a| a == "--bare"))
        }
        Some("up") if args.iter().any(|a| a == "--karmada") => {
            up_karmada(args.iter().any(|a| a == "--bare"), members(&args))
        }
        Some("up") if args.iter().any(|a| a == "--ocm") => {
            up_ocm(args.iter().any(|a| a == "--bare"))
        }
        Some("up") => up(args.iter().any(|a| a == "--bare")),
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    }
}

const USAGE: &str = "usage: testbed up [--bare] [--cluster | --karmada [--members N] | --ocm]";

/// The value of `--members N` (or `--members=N`): the Karmada bed's size,
/// three unless given.
fn members(args: &[String]) -> usize {
    let value = args.iter().enumerate().find_map(|(i, a)| match a.as_str() {
        "--members" => Some(args.get(i + 1).cloned().unwrap_or_default()),
        _ => a.strip_prefix("--members=").map(str::to_owned),
    });
    let Some(value) = value else {
        return placement_tests::karmada::MEMBERS.len();
    };
    match value.parse::<usize>() {
        Ok(n) if n >= placement_tests::karmada::MEMBERS.len() => n,
        _ => {
            eprintln!(
                "--members takes a number of members, at least {} (the bed's own three): got {value:?}\n{USAGE}",
                placement_tests::karmada::MEMBERS.len()
            );
            std::process::exit(2);
        }
    }
}

/// What every `up` needs first: the crypto provider and a runtime.
fn start_up() -> tokio::runtime::Runtime {
    placement_tests::install_crypto();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn up(bare: bool) {
    let runtime = start_up();
    eprintln!("starting etcd and kube-apiserver ...");
    let plane = ControlPlane::start();
    eprintln!("starting OPA ...");
    let opa = OpaServer::start();
    let mut product = None;
    if !bare {
        eprintln!("loading the example clusters and the shipped policy ...");
        plane.ensure_example_clusters();
        placement_tests::kubectl::create_shipped_policy_configmap(
            &plane.kubeconfig(Identity::Admin),
            POLICY_NAMESPACE,
        );
        eprintln!("starting placement-sync ...");
        let sidecar = SidecarProcess::start(
            &plane,
            &opa,
            &[
                "--replicate-cluster=placement-policy.io/v1alpha1/clusters",
                "--remediation=auto",
            ],
        );
        runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
        eprintln!("starting placement-webhook ...");
        let webhook = WebhookProcess::start(&[
            format!("--opa-url={}", opa.url()),
            format!("--opa-token-file={}", opa.token_file().display()),
            format!(
                "--kubeconfig={}",
                plane.kubeconfig(Identity::Webhook).display()
            ),
        ]);
        register(&plane, &webhook);
        product = Some((sidecar, webhook));
    }

    let kubeconfig = plane.kubeconfig(Identity::Admin);
    println!();
    println!("kube-apiserver   {}", plane.server_url());
    println!("kubeconfig       {}", kubeconfig.display());
    println!(
        "OPA              {} (bearer token in {})",
        opa.url(),
        opa.token_file().display()
    );
    if let Some((sidecar, webhook)) = &product {
        println!(
            "placement-sync   http://127.0.0.1:{}/metrics (log: {})",
            sidecar.port,
            sidecar.log_path().display()
        );
        println!(
            "placement-webhook {} (metrics http://{}/metrics)",
            webhook.url("/mutate"),
            webhook.metrics_addr
        );
    }
    println!("logs             {}", plane.dir().display());
    println!();
    println!("  export KUBECONFIG={}", kubeconfig.display());
    if product.is_some() {
        println!("  kubectl get clusters");
        println!(
            "  kubectl create -f {}",
            repo_root()
                .join("examples/replicaset-eu-pci.yaml")
                .display()
        );
        println!("  kubectl get rs nginx-eu -o jsonpath='{{.metadata.annotations}}'");
        println!(
            "  kubectl create -f {}   # denied",
            repo_root()
                .join("examples/replicaset-forbidden.yaml")
                .display()
        );
    }
    println!();
    println!("Ctrl-C stops everything.");
    runtime.block_on(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    eprintln!("stopping ...");
    drop(product);
    drop(opa);
    drop(plane);
}

/// `up --cluster [--bare]`: the single-node cluster and, unless `--bare`, the
/// product installed from the project's images.
fn up_cluster(bare: bool) {
    let runtime = placement_tests::current_thread_runtime();
    eprintln!("starting the single-node cluster ...");
    let cluster = Cluster::start();
    if !bare {
        eprintln!("importing the images and installing deploy/ ...");
        cluster.import_project_images();
        cluster.install_deploy();
        placement_tests::kubectl::apply_example_clusters(&cluster.kubeconfig());
    }
    println!();
    println!(
        "node             {} ({}; namespaces of PID {}, host link {})",
        cluster::NODE_NAME,
        cluster.node_ip,
        cluster.init_pid(),
        cluster.host_interface()
    );
    println!("kube-apiserver   {}", cluster.server_url());
    println!("logs             {}", cluster.dir().display());
    println!();
    println!("  export KUBECONFIG={}", cluster.kubeconfig().display());
    println!("  kubectl get nodes,pods -A");
    if !bare {
        println!(
            "  kubectl create -f {}",
            repo_root()
                .join("examples/replicaset-eu-pci.yaml")
                .display()
        );
    }
    println!();
    println!("Ctrl-C stops everything.");
    runtime.block_on(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    eprintln!("stopping ...");
    drop(cluster);
}

/// The members `up --karmada` prints: the three of its own (a light member's
/// API server and kubeconfig are the shared host's, the same for each).
const MEMBERS_LISTED: usize = 3;

/// `up --karmada [--bare] [--members N]`: Karmada's control plane and its
/// members (three, or `count` with light ones: [`Karmada::start_with`]) and,
/// unless `--bare`, the shipped policy, OPA and placement-sync against
/// Karmada's API server.
fn up_karmada(bare: bool, count: usize) {
    let runtime = start_up();
    eprintln!("starting Karmada's control plane and its {count} members ...");
    let started = std::time::Instant::now();
    let karmada = Karmada::start_with(count);
    eprintln!(
        "Karmada reports all {count} members Ready after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let mut product = None;
    if !bare {
        eprintln!("starting OPA and placement-sync with the shipped policy ...");
        let opa = OpaServer::start();
        placement_tests::kubectl::create_shipped_policy_configmap(
            &karmada.karmada_kubeconfig(),
            POLICY_NAMESPACE,
        );
        // Both modes: the guardrail for karmada-scheduler's bindings, the
        // scheduler for those handed to placement-policy.
        let sidecar =
            karmada.start_placement_sync(&opa, POLICY_NAMESPACE, &["--guard-karmada-bindings"]);
        runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
        eprintln!("starting placement-webhook, registered with Karmada's API server ...");
        let webhook = WebhookProcess::start(&[
            format!("--opa-url={}", opa.url()),
            format!("--opa-token-file={}", opa.token_file().display()),
            format!("--kubeconfig={}", karmada.karmada_kubeconfig().display()),
        ]);
        karmada.register_guardrail_webhook(&webhook.url("/mutate"), &webhook.ca_pem);
        product = Some((opa, sidecar, webhook));
    }

    println!();
    println!("Karmada API server {}", karmada.server_url());
    for member in karmada.members().iter().take(MEMBERS_LISTED) {
        println!("{:<18} {}", member.name(), member.server_url());
    }
    if count > MEMBERS_LISTED {
        println!(
            "(and {} light members sharing one API server: kubectl get clusters.cluster.karmada.io)",
            count - MEMBERS_LISTED
        );
    }
    if let Some((opa, sidecar, webhook)) = &product {
        println!(
            "OPA                {} (bearer token in {})",
            opa.url(),
            opa.token_file().display()
        );
        println!(
            "placement-sync     http://127.0.0.1:{}/metrics (log: {})",
            sidecar.port,
            sidecar.log_path().display()
        );
        println!(
            "placement-webhook  {} (registered with Karmada's API server)",
            webhook.url("/mutate")
        );
    }
    println!("logs               {}", karmada.dir().display());
    println!();
    println!(
        "KARMADA_KUBECONFIG={}",
        karmada.karmada_kubeconfig().display()
    );
    for member in karmada.members().iter().take(MEMBERS_LISTED) {
        println!(
            "MEMBER_KUBECONFIG_{}={}",
            member.name().to_uppercase().replace('-', "_"),
            member.kubeconfig().display()
        );
    }
    println!();
    println!(
        "  export KUBECONFIG={}",
        karmada.karmada_kubeconfig().display()
    );
    println!("  kubectl get clusters.cluster.karmada.io");
    if product.is_some() {
        println!("  kubectl apply -f examples/karmada/guardrail/propagationpolicy.yaml");
        println!("  kubectl create -f examples/karmada/guardrail/deployment-eu-pci.yaml");
        println!(
            "  kubectl get resourcebinding web-eu-deployment -o jsonpath='{{.spec.clusters}}'"
        );
        println!("  kubectl create -f examples/karmada/deployment-forbidden.yaml   # denied");
    }
    println!(
        "  (workloads for member-eu-1 run image {}; docs/karmada.md has the tour)",
        placement_tests::karmada::WORKLOAD_IMAGE
    );
    println!();
    println!("Ctrl-C stops everything.");
    runtime.block_on(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    eprintln!("stopping ...");
    drop(product);
    drop(karmada);
}

/// `up --ocm [--bare]`: an OCM hub and its three managed clusters and,
/// unless `--bare`, the shipped policy, OPA and placement-sync deciding the
/// Placements that opt in, and the webhook guarding ManifestWorks.
fn up_ocm(bare: bool) {
    let runtime = start_up();
    eprintln!("starting the OCM hub and its three managed clusters ...");
    let ocm = Ocm::start();
    let mut product = None;
    if !bare {
        eprintln!("starting OPA and placement-sync with the shipped policy ...");
        let opa = OpaServer::start();
        placement_tests::kubectl::create_shipped_policy_configmap(
            &ocm.hub_kubeconfig(),
            POLICY_NAMESPACE,
        );
        let sidecar = ocm.start_placement_sync(&opa, POLICY_NAMESPACE, &[]);
        runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
        eprintln!("starting placement-webhook, registered with the hub for ManifestWorks ...");
        let guard = ocm.start_delivery_guard(&opa, POLICY_NAMESPACE, "placement-policy-delivery");
        product = Some((opa, sidecar, guard));
    }

    println!();
    println!("OCM hub API server {}", ocm.server_url());
    for cluster in ocm.clusters() {
        println!("{:<18} {}", cluster.name(), cluster.server_url());
    }
    if let Some((opa, sidecar, guard)) = &product {
        println!(
            "OPA                {} (bearer token in {})",
            opa.url(),
            opa.token_file().display()
        );
        println!(
            "placement-sync     http://127.0.0.1:{}/metrics (log: {})",
            sidecar.port,
            sidecar.log_path().display()
        );
        println!(
            "placement-webhook  {} (registered with the hub for ManifestWorks and ManifestWorkReplicaSets; log: {})",
            guard.webhook().url("/validate"),
            guard.webhook().dir.join("webhook.log").display()
        );
    }
    println!("logs               {}", ocm.dir().display());
    println!();
    println!("OCM_HUB_KUBECONFIG={}", ocm.hub_kubeconfig().display());
    for cluster in ocm.clusters() {
        println!(
            "MANAGED_KUBECONFIG_{}={}",
            cluster.name().to_uppercase().replace('-', "_"),
            cluster.kubeconfig().display()
        );
    }
    println!();
    println!("  export KUBECONFIG={}", ocm.hub_kubeconfig().display());
    println!("  kubectl get managedclusters --show-labels");
    if product.is_some() {
        println!("  kubectl apply -f examples/ocm/web-eu-pci.yaml");
        println!(
            "  kubectl get placementdecisions -l cluster.open-cluster-management.io/placement=web-eu -o yaml"
        );
        println!("  kubectl create -f examples/ocm/vault-forbidden.yaml   # refused");
    }
    println!(
        "  (the cluster set {} is bound to namespace default; workloads for ocm-eu-1 run image {}; docs/ocm.md has the tour)",
        placement_tests::ocm::CLUSTER_SET,
        placement_tests::karmada::WORKLOAD_IMAGE
    );
    println!();
    println!("Ctrl-C stops everything.");
    runtime.block_on(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    eprintln!("stopping ...");
    drop(product);
    drop(ocm);
}

/// Register the webhook with the chart's mutating configuration (from
/// `deploy/placement-policy.yaml`), pointed at the local process by URL.
fn register(plane: &ControlPlane, webhook: &WebhookProcess) {
    let mut configurations =
        placement_tests::kubectl::deploy_documents(&["MutatingWebhookConfiguration"]);
    for doc in &mut configurations {
        if let Some(hooks) = doc["webhooks"].as_array_mut() {
            for hook in hooks {
                hook["clientConfig"] = json!({
                    "url": webhook.url("/mutate"),
                    "caBundle": placement_certs::ca_bundle(&webhook.ca_pem),
                });
            }
        }
    }
    placement_tests::kubectl::apply_documents(&plane.kubeconfig(Identity::Admin), configurations);
}
