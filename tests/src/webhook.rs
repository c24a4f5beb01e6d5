//! The `placement-webhook` binary, run as a user would run it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::process::{Process, wait_for};
use crate::{project_bin, scratch_dir};

pub struct WebhookProcess {
    process: Process,
    pub admission_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub dir: PathBuf,
    /// CA that signed the serving certificate (PEM).
    pub ca_pem: String,
}

impl WebhookProcess {
    /// `placement-webhook serve ARGS` on free loopback ports, with a CA and
    /// serving certificate generated for it (passed as `--tls-cert/--tls-key`).
    pub fn start(args: &[String]) -> WebhookProcess {
        Self::start_with(args, None)
    }

    /// [`WebhookProcess::start`] inside `cgroup` from its first instruction
    /// (so it sees the cgroup's memory limit as a container's).
    pub fn start_in(args: &[String], cgroup: &crate::cgroup::MemoryCgroup) -> WebhookProcess {
        Self::start_with(args, Some(cgroup))
    }

    fn start_with(args: &[String], cgroup: Option<&crate::cgroup::MemoryCgroup>) -> WebhookProcess {
        let dir = scratch_dir("webhook");
        let paths = placement_certs::generate_to_dir(
            &dir.join("certs"),
            &["127.0.0.1".into(), "localhost".into()],
        )
        .expect("webhook certificates");
        let given = |flag: &str| args.iter().any(|a| a.starts_with(flag));
        let mut full: Vec<String> = vec!["serve".into()];
        for (flag, default) in [
            ("--listen", "--listen=127.0.0.1:0"),
            ("--metrics-listen", "--metrics-listen=127.0.0.1:0"),
        ] {
            if !given(&format!("{flag}=")) {
                full.push(default.into());
            }
        }
        // With self-managed certificates (--tls-secret) the webhook makes
        // its own; `ca_pem` is then the generated CA nobody uses.
        if !given("--tls-secret") {
            full.push(format!("--tls-cert={}", paths.cert.display()));
            full.push(format!("--tls-key={}", paths.key.display()));
        }
        if !args.iter().any(|a| a.starts_with("--ownership-")) {
            full.push(format!(
                "--ownership-key-file={}",
                crate::ownership_key_file().display()
            ));
        }
        full.extend(args.iter().cloned());
        let env = vec![(
            "RUST_LOG".to_owned(),
            "info,placement_webhook=debug,policy_client=debug".to_owned(),
        )];
        let binary = project_bin("placement-webhook");
        let (program, full) = match cgroup {
            None => (binary, full),
            Some(cgroup) => {
                // The shell joins the cgroup, then becomes the webhook.
                let mut wrapped = vec![
                    "-c".to_owned(),
                    format!(
                        "echo $$ > '{}' && exec \"$0\" \"$@\"",
                        cgroup.procs().display()
                    ),
                    binary.display().to_string(),
                ];
                wrapped.extend(full);
                (PathBuf::from("/bin/sh"), wrapped)
            }
        };
        let mut process = Process::spawn_with_env(
            "placement-webhook",
            &program,
            &full,
            &env,
            &dir.join("webhook.log"),
        )
        .expect("start placement-webhook");
        let (admission_addr, metrics_addr) = wait_for(
            "placement-webhook to listen",
            Duration::from_secs(60),
            || {
                assert!(
                    !process.has_exited(),
                    "placement-webhook exited:\n{}",
                    process.log()
                );
                parse_listening(&process.log())
            },
        );
        let ca_pem = std::fs::read_to_string(&paths.ca).expect("read webhook CA");
        WebhookProcess {
            process,
            admission_addr,
            metrics_addr,
            dir,
            ca_pem,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.admission_addr)
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        !self.process.has_exited()
    }

    /// The process id (for `/proc/<pid>/status` and resource limits).
    pub fn pid(&self) -> u32 {
        self.process.pid().expect("placement-webhook is running")
    }

    /// The value of one sample of the metrics page (`name{labels}` exactly as
    /// encoded), 0 when absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        metric_value(&self.metrics().await, sample)
    }

    /// An HTTPS client that trusts only this webhook's CA.
    pub fn https_client(&self) -> reqwest::Client {
        crate::install_crypto();
        reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).expect("CA PEM"),
            )
            .timeout(Duration::from_secs(30))
            .build()
            .expect("HTTPS client")
    }

    /// POST a review body to `path` and return (status, body).
    pub async fn post(&self, path: &str, body: Vec<u8>) -> (u16, String) {
        let response = self
            .https_client()
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("POST to webhook");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    /// The metrics page.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.metrics_addr))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics body")
    }

    pub fn stop(&mut self) {
        self.process.terminate(Duration::from_secs(5));
    }
}

/// The value of `sample` (`name{labels}` as encoded) in a metrics page; 0 when
/// absent.
pub fn metric_value(page: &str, sample: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Parse "admission on https://ADDR, metrics on http://ADDR/metrics".
fn parse_listening(log: &str) -> Option<(SocketAddr, SocketAddr)> {
    let line = log.lines().find(|l| l.contains("admission on https://"))?;
    let admission = line
        .split("admission on https://")
        .nth(1)?
        .split(',')
        .next()?
        .parse()
        .ok()?;
    let metrics = line
        .split("metrics on http://")
        .nth(1)?
        .split('/')
        .next()?
        .parse()
        .ok()?;
    Some((admission, metrics))
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_the_listening_line() {
        let (a, m) = super::parse_listening(
            "x\nplacement-webhook: admission on https://127.0.0.1:4443, metrics on http://127.0.0.1:9090/metrics (engine: x)\n",
        )
        .unwrap();
        assert_eq!(a.port(), 4443);
        assert_eq!(m.port(), 9090);
    }
}
