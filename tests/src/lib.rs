//! The test bed: real etcd, kube-apiserver and OPA on loopback, and the project's
//! own binaries, for integration and end-to-end tests.
//!
//! Peer binaries come from `scripts/testbed assets` (built once from Go modules
//! into a cache outside the repo) or from `PLACEMENT_TESTBED_BIN`, a folder
//! holding `etcd`, `kube-apiserver` and `opa`. The project's binaries must be
//! built first (`cargo build --bins`; `scripts/test` does it).
//!
//! Every peer is a [`Process`]: killed on drop and, through `PR_SET_PDEATHSIG`,
//! when the test process dies, so nothing outlives a failed test.

pub mod cgroup;
pub mod cluster;
pub mod control_plane;
pub mod fault_proxy;
pub mod hostile;
pub mod karmada;
pub mod kubectl;
pub mod ocm;
pub mod opa;
pub mod pki;
pub mod process;
pub mod sidecar;
pub mod webhook;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

pub use cluster::Cluster;
pub use control_plane::{ControlPlane, Identity, POLICY_NAMESPACE, SYSTEM_NAMESPACE};
pub use fault_proxy::FaultProxy;
pub use karmada::Karmada;
pub use ocm::Ocm;
pub use opa::OpaServer;
pub use process::{Process, free_port, port_open, restoring, wait_for, wait_or_explain};
pub use sidecar::SidecarProcess;
pub use webhook::WebhookProcess;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// The one instance of `T` shared by the tests of a test binary (each test
/// uses its own namespaces): started by `start` on first use, ending with the
/// test process. A failed start is remembered, so the other tests fail at
/// once (naming `what`) instead of each starting (and failing) one of its own.
pub fn shared<T: Sync>(
    cell: &'static OnceLock<Result<T, String>>,
    what: &str,
    start: fn() -> T,
) -> &'static T {
    let started = cell.get_or_init(|| {
        std::panic::catch_unwind(start).map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "unknown panic".to_owned())
        })
    });
    match started {
        Ok(shared) => shared,
        Err(message) => panic!("the shared {what} did not start: {message}"),
    }
}

/// One test at a time in this test binary, for tests that each start (or
/// stop) a part of the bed others would otherwise share or compete for: held
/// while the guard lives; a failed test does not poison it. One lock for all
/// the modules of a binary (each binary is one bed: tests/suites/), so the
/// tests taking it never overlap, whichever file they are in.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Run one test body on a runtime of its own (two worker threads), after
/// the previous such test of this binary finished ([`serial`]).
pub fn run_serially(test: impl std::future::Future<Output = ()>) {
    let _serial = serial();
    install_crypto();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(test);
}

/// A runtime on the calling thread, for the async parts of a synchronous test.
pub fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Folder holding `etcd`, `kube-apiserver` and `opa`.
pub fn assets() -> &'static Path {
    static ASSETS: OnceLock<PathBuf> = OnceLock::new();
    ASSETS.get_or_init(|| {
        if let Ok(dir) = std::env::var("PLACEMENT_TESTBED_BIN") {
            return PathBuf::from(dir);
        }
        let output = std::process::Command::new(repo_root().join("scripts/testbed"))
            .arg("assets")
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run scripts/testbed assets");
        assert!(output.status.success(), "scripts/testbed assets failed");
        PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
    })
}

/// Path of a peer binary from [`assets`].
pub fn peer(name: &str) -> PathBuf {
    let path = assets().join(name);
    assert!(
        path.exists(),
        "{} is missing; run scripts/testbed assets",
        path.display()
    );
    path
}

/// Path of one of this workspace's binaries (built by `cargo build --bins`).
pub fn project_bin(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let path = target.join("debug").join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first with `cargo build --bins` (scripts/test does)",
        path.display()
    );
    path
}

/// A fresh directory for one test's files, under the system temp dir. Left in
/// place on failure for inspection; `scripts/test` clears old runs.
pub fn scratch_dir(label: &str) -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir()
        .join("placement-testbed")
        .join(format!("{}-{label}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// The shipped policy modules: every `policies/*.rego` except `*_test.rego`, as
/// (file name, source), sorted by name.
pub fn shipped_policy_modules() -> Vec<(String, String)> {
    let dir = repo_root().join("policies");
    let mut modules: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|entry| {
            let path = entry.expect("dir entry").path();
            let name = path.file_name()?.to_str()?.to_owned();
            (name.ends_with(".rego") && !name.ends_with("_test.rego")).then(|| {
                let source = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                (name, source)
            })
        })
        .collect();
    modules.sort();
    modules
}

/// A file with the ownership-record key that this test process's webhooks and
/// sidecars share (as the webhook and the remediator share a Secret's).
pub fn ownership_key_file() -> &'static Path {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = scratch_dir("ownership-key").join("ownership.keys");
        // A random key whose bytes are ASCII (its hex digits): the bench's
        // OPA-itself contender signs records with it, and OPA's HMAC takes
        // the key as a string.
        let random = policy_client::ownership_keys::OwnershipKeys::generate_text()
            .expect("an ownership key");
        let hex: String = random.trim().bytes().map(|b| format!("{b:02x}")).collect();
        let text = format!(
            "{}\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, hex)
        );
        std::fs::write(&path, text).expect("write the ownership key");
        path
    })
}

/// Install the process-wide rustls provider (ring), as the binaries do.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A DNS-label-safe unique name for namespaces and objects.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// The placement annotation the shipped policy writes.
pub const PREFS: &str = "federation.kubernetes.io/replica-set-preferences";

/// The clusters named by an object's placement annotation, sorted; `None` when
/// the object has no (valid) placement.
pub fn placed_clusters(object: &serde_json::Value) -> Option<Vec<String>> {
    let raw = object["metadata"]["annotations"][PREFS].as_str()?;
    let prefs: serde_json::Value = serde_json::from_str(raw).ok()?;
    let mut clusters: Vec<String> = prefs["clusters"].as_object()?.keys().cloned().collect();
    clusters.sort();
    Some(clusters)
}
