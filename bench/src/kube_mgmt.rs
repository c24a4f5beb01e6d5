//! kube-mgmt, the sidecar OPA users run today, as the comparison of scenarios 3
//! and 5. Built by `scripts/testbed kube-mgmt-assets` from the source kept in
//! `../shared/peers/kube-mgmt`; where that source is absent the contender is
//! skipped, never the run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, bail};
use placement_tests::{ControlPlane, Identity, OpaServer, POLICY_NAMESPACE, Process};

use crate::common::{KubeMgmtBin, Server};

/// Exit status of `scripts/testbed kube-mgmt-assets` when the source is absent.
const MISSING: i32 = 3;

/// The kube-mgmt binary: `given` (a binary or a folder holding it, from
/// `BENCH_KUBE_MGMT`), else the reason given for skipping it (`skipped`, from
/// `BENCH_KUBE_MGMT_SKIPPED`), else what `scripts/testbed kube-mgmt-assets`
/// builds or says.
pub(crate) fn resolve(given: Option<&Path>, skipped: Option<&str>) -> KubeMgmtBin {
    if let Some(path) = given {
        let bin = if path.is_dir() {
            path.join("kube-mgmt")
        } else {
            path.to_owned()
        };
        return if bin.exists() {
            Ok(bin)
        } else {
            Err(format!(
                "{} does not exist; the kube-mgmt contender is skipped",
                bin.display()
            ))
        };
    }
    if let Some(reason) = skipped.filter(|r| !r.is_empty()) {
        return Err(reason.to_owned());
    }
    let script = placement_tests::repo_root().join("scripts/testbed");
    let output = match std::process::Command::new(&script)
        .arg("kube-mgmt-assets")
        .stderr(std::process::Stdio::piped())
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            return Err(format!(
                "cannot run {} kube-mgmt-assets ({e}); the kube-mgmt contender is skipped",
                script.display()
            ));
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprint!("{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    match output.status.code() {
        Some(0) => {
            Ok(PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()).join("kube-mgmt"))
        }
        Some(MISSING) => Err(last.trim_start_matches("testbed: ").to_owned()),
        other => Err(format!(
            "scripts/testbed kube-mgmt-assets failed (status {other:?}: {last}); the kube-mgmt contender is skipped"
        )),
    }
}

/// A running kube-mgmt.
pub(crate) struct KubeMgmt {
    server: Server,
}

impl KubeMgmt {
    /// kube-mgmt against `opa` as `identity`, loading policies from the policy
    /// namespace (`--namespaces`, placement-sync's `--policy-namespace`), with
    /// `extra` flags (`--replicate=...`).
    pub(crate) fn start(
        bin: &Path,
        dir: &Path,
        plane: &ControlPlane,
        identity: Identity,
        opa: &OpaServer,
        extra: &[String],
        label: &str,
    ) -> Result<KubeMgmt> {
        std::fs::create_dir_all(dir)?;
        let mut args: Vec<String> = vec![
            format!("--kubeconfig={}", plane.kubeconfig(identity).display()),
            // kube-mgmt takes the API's base, `.../v1`.
            format!("--opa-url={}/v1", opa.url()),
            format!("--opa-auth-token-file={}", opa.token_file().display()),
            format!("--namespaces={POLICY_NAMESPACE}"),
            "--log-level=info".into(),
        ];
        args.extend(extra.iter().cloned());
        let process = Process::spawn(
            "kube-mgmt",
            bin,
            &args,
            &dir.join(format!("kube-mgmt-{label}.log")),
        )?;
        Ok(KubeMgmt {
            server: Server { process },
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.server.pid()
    }

    /// Fails when the process has exited, with its log.
    pub(crate) fn check_alive(&mut self) -> Result<()> {
        if self.server.process.has_exited() {
            bail!("kube-mgmt exited:\n{}", self.server.process.log_tail(40));
        }
        Ok(())
    }

    pub(crate) fn stop(mut self) {
        self.server.process.terminate(Duration::from_secs(10));
    }
}
