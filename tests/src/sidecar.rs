//! The `placement-sync` binary, run as a user would run it.

use std::time::{Duration, Instant};

use crate::process::{Process, free_port};
use crate::{ControlPlane, Identity, OpaServer, project_bin, scratch_dir, unique_name};

pub struct SidecarProcess {
    process: Process,
    pub port: u16,
}

impl SidecarProcess {
    /// `placement-sync` against `opa`, as the sidecar's own service account,
    /// on a free loopback port, with `extra` flags.
    pub fn start(plane: &ControlPlane, opa: &OpaServer, extra: &[&str]) -> SidecarProcess {
        SidecarProcess::start_as(plane, Identity::Sidecar, opa, extra)
    }

    pub fn start_as(
        plane: &ControlPlane,
        identity: Identity,
        opa: &OpaServer,
        extra: &[&str],
    ) -> SidecarProcess {
        let dir = scratch_dir("sync");
        let port = free_port();
        let mut args: Vec<String> = vec![
            format!("--kubeconfig={}", plane.kubeconfig(identity).display()),
            format!("--opa-url={}", opa.url()),
            format!("--opa-token-file={}", opa.token_file().display()),
            format!("--listen=127.0.0.1:{port}"),
            "--lease-namespace=placement-system".into(),
            format!("--identity={}", unique_name("sync")),
            "--engine-check-interval=500ms".into(),
        ];
        if !extra
            .iter()
            .any(|a| a.starts_with("--remediation-debounce"))
        {
            args.push("--remediation-debounce=200ms".into());
        }
        if !extra.iter().any(|a| a.starts_with("--ownership-")) {
            args.push(format!(
                "--ownership-key-file={}",
                crate::ownership_key_file().display()
            ));
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let env = vec![(
            "RUST_LOG".to_owned(),
            "info,placement_sync=debug".to_owned(),
        )];
        let mut process = Process::spawn_with_env(
            "placement-sync",
            &project_bin("placement-sync"),
            &args,
            &env,
            &dir.join("placement-sync.log"),
        )
        .expect("start placement-sync");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !crate::port_open(port) {
            assert!(
                !process.has_exited(),
                "placement-sync exited:\n{}",
                process.log()
            );
            assert!(
                Instant::now() < deadline,
                "placement-sync did not listen:\n{}",
                process.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        SidecarProcess { process, port }
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let response = reqwest::get(format!("http://127.0.0.1:{}{path}", self.port))
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    pub async fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let (status, body) = self.get("/readyz").await;
            if status == 200 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sidecar not ready after {timeout:?}: {body}\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn metric(&self, name_and_labels: &str) -> Option<f64> {
        let (_, text) = self.get("/metrics").await;
        text.lines()
            .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// The remediator's `(passes, decision queries)` once it rests: two equal
    /// samples `interval` apart, so that no pass is counted half. Panics with
    /// the log when it has not rested within `timeout`: a remediator that never
    /// rests (a patch loop) fails the test instead of hanging it.
    pub async fn remediation_at_rest(&self, interval: Duration, timeout: Duration) -> (f64, f64) {
        let sample = || async {
            (
                self.metric("placement_sync_remediation_passes_total")
                    .await
                    .expect("the passes metric"),
                self.metric("placement_sync_remediation_queries_total")
                    .await
                    .expect("the queries metric"),
            )
        };
        let deadline = Instant::now() + timeout;
        let mut last = sample().await;
        loop {
            tokio::time::sleep(interval).await;
            let now = sample().await;
            if now == last {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "the remediator did not rest for {interval:?} within {timeout:?}: \
                 (passes, queries) went from {last:?} to {now:?}\n{}",
                self.log_tail()
            );
            last = now;
        }
    }

    /// The process id (for `/proc/<pid>`).
    pub fn pid(&self) -> u32 {
        self.process.pid().expect("placement-sync is running")
    }

    pub fn log_path(&self) -> &std::path::Path {
        self.process.log_path()
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail(60)
    }

    /// SIGKILL: the process dies without releasing anything (its Lease
    /// runs out).
    pub fn kill(mut self) {
        self.process.kill();
    }

    pub fn stop(mut self) {
        self.process.terminate(Duration::from_secs(10));
    }
}
