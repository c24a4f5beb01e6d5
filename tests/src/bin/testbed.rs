//! `testbed up`: start etcd, kube-apiserver and OPA on loopback in the
//! foreground, print how to reach them, and stop everything on Ctrl-C.

use std::time::Duration;

use placement_tests::{ControlPlane, Identity, OpaServer};

fn main() {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("up") => up(),
        _ => {
            eprintln!("usage: testbed up");
            std::process::exit(2);
        }
    }
}

fn up() {
    eprintln!("starting etcd and kube-apiserver ...");
    let plane = ControlPlane::start();
    eprintln!("starting OPA ...");
    let opa = OpaServer::start();
    let kubeconfig = plane.kubeconfig(Identity::Admin);
    println!("kube-apiserver: {}", plane.server_url());
    println!("kubeconfig:     {}", kubeconfig.display());
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!(
        "  (webhook identity: {})",
        plane.kubeconfig(Identity::Webhook).display()
    );
    println!(
        "  (sidecar identity: {})",
        plane.kubeconfig(Identity::Sidecar).display()
    );
    println!(
        "OPA:            {} (bearer token in {})",
        opa.url(),
        opa.token_file().display()
    );
    println!("logs:           {}", plane.dir().display());
    println!("Ctrl-C stops everything.");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let _ = tokio::signal::ctrl_c().await;
        });
        let _ = tx.send(());
    });
    while rx.recv_timeout(Duration::from_secs(1)).is_err() {}
    eprintln!("stopping ...");
    drop(opa);
    drop(plane);
}
