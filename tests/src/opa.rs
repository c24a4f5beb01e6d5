//! A real OPA server on loopback with bearer-token authentication.

use std::path::PathBuf;
use std::time::Duration;

use crate::process::{Process, free_port, port_open, wait_for};
use crate::{peer, scratch_dir};

/// The token OPA accepts in these tests.
pub const OPA_TOKEN: &str = "testbed-opa-token";

/// OPA's own authorization policy: only our token may use the API.
const AUTHZ_POLICY: &str = r#"package system.authz

default allow := false

allow if input.identity == "testbed-opa-token"
"#;

pub struct OpaServer {
    process: Option<Process>,
    dir: PathBuf,
    pub port: u16,
    restarts: u32,
    /// Served over HTTPS with a certificate of a CA of its own (`ca.crt`).
    tls: Option<placement_certs::CertPaths>,
    /// Token authentication and the authorization policy above; without it
    /// anyone on loopback may use the API (as OPA's default is).
    authz: bool,
}

impl OpaServer {
    /// Start OPA on a free loopback port and wait until it answers `/health`.
    pub fn start() -> OpaServer {
        Self::start_with(false, true)
    }

    /// Start OPA; with `tls`, serving HTTPS with a certificate for `127.0.0.1`
    /// from a CA of its own (see [`OpaServer::ca_file`]); with `authz`, only
    /// [`OPA_TOKEN`] may use its API.
    pub fn start_with(tls: bool, authz: bool) -> OpaServer {
        let dir = scratch_dir("opa");
        std::fs::write(dir.join("authz.rego"), AUTHZ_POLICY).expect("write authz policy");
        let tls = tls.then(|| {
            placement_certs::generate_to_dir(
                &dir.join("tls"),
                &["127.0.0.1".into(), "localhost".into()],
            )
            .expect("OPA serving certificate")
        });
        let mut opa = OpaServer {
            process: None,
            dir,
            port: free_port(),
            restarts: 0,
            tls,
            authz,
        };
        opa.spawn();
        opa
    }

    /// The CA that signed an HTTPS OPA's certificate (for `--opa-ca-file`).
    /// The OPA process's id (for measuring it); `None` while it is stopped.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref()?.pid()
    }

    pub fn ca_file(&self) -> Option<&std::path::Path> {
        self.tls.as_ref().map(|paths| paths.ca.as_path())
    }

    fn spawn(&mut self) {
        let mut args: Vec<String> = vec![
            "run".into(),
            "--server".into(),
            format!("--addr=127.0.0.1:{}", self.port),
            "--log-level=error".into(),
            "--skip-version-check".into(),
        ];
        if self.authz {
            args.push("--authentication=token".into());
            args.push("--authorization=basic".into());
            args.push(self.dir.join("authz.rego").display().to_string());
        }
        if let Some(tls) = &self.tls {
            args.push(format!("--tls-cert-file={}", tls.cert.display()));
            args.push(format!("--tls-private-key-file={}", tls.key.display()));
        }
        let log = self.dir.join(format!("opa-{}.log", self.restarts));
        let process = Process::spawn("opa", &peer("opa"), &args, &log).expect("start opa");
        self.process = Some(process);
        let port = self.port;
        wait_for("OPA to listen", Duration::from_secs(60), || {
            port_open(port).then_some(())
        });
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn token(&self) -> &'static str {
        OPA_TOKEN
    }

    /// A token file for `--opa-token-file`.
    pub fn token_file(&self) -> PathBuf {
        let path = self.dir.join("token");
        std::fs::write(&path, OPA_TOKEN).expect("write token file");
        path
    }

    /// Kill OPA (SIGKILL: all its in-memory policies and data are gone).
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
        let port = self.port;
        wait_for("OPA port to close", Duration::from_secs(10), || {
            (!port_open(port)).then_some(())
        });
    }

    /// Start a fresh OPA on the same port (empty: no policies, no data).
    pub fn restart(&mut self) {
        self.kill();
        self.restarts += 1;
        self.spawn();
    }

    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// A policy-client for this OPA.
    pub fn client(&self) -> policy_client::opa::Opa {
        crate::install_crypto();
        let mut config = policy_client::opa::OpaConfig::new(self.url().parse().expect("OPA URL"));
        config.token = Some(policy_client::opa::Token::new(OPA_TOKEN));
        config.ca_pem = self
            .ca_file()
            .map(|ca| std::fs::read(ca).expect("read OPA's CA"));
        policy_client::opa::Opa::new(config).expect("OPA client")
    }

    /// Load every `*.rego` (not `*_test.rego`) of the repo's `policies/`, and the
    /// example data, the way the sync sidecar would.
    pub async fn load_shipped_policies(&self, with_example_clusters: bool) {
        use policy_client::engine::PolicyEngine;
        let client = self.client();
        for (name, source) in crate::shipped_policy_modules() {
            client
                .put_policy(&format!("shipped/{name}"), &source)
                .await
                .expect("load policy into OPA");
        }
        if with_example_clusters {
            let data: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(
                    crate::repo_root().join("policies/kubernetes/clusters/data.json"),
                )
                .expect("read example clusters"),
            )
            .expect("example clusters JSON");
            client
                .put_data("kubernetes/clusters", &data)
                .await
                .expect("load clusters into OPA");
        }
    }
}
