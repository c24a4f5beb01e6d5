//! Shared plumbing: locating binaries, spawning servers, reading /proc, statistics.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use placement_tests::{Process, free_port, port_open};

/// POST an AdmissionReview to the webhook at `url`: the answered review, and its
/// JSON patch decoded from base64 (checked to be of `patchType: JSONPatch`).
pub(crate) async fn post_review(
    client: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
) -> Result<(serde_json::Value, Option<String>)> {
    use base64::Engine as _;
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .with_context(|| format!("POST to {url}"))?;
    let status = response.status();
    let text = response.text().await?;
    anyhow::ensure!(status.is_success(), "{url}: HTTP {status}: {text}");
    let review: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{url}: {text}"))?;
    let Some(b64) = review["response"]["patch"].as_str() else {
        return Ok((review, None));
    };
    anyhow::ensure!(
        review["response"]["patchType"] == "JSONPatch",
        "{url}: patchType: {text}"
    );
    let patch = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64)?)?;
    Ok((review, Some(patch)))
}

/// Paths of everything the benchmark runs.
#[derive(Debug, Clone)]
pub(crate) struct Bins {
    pub(crate) webhook: PathBuf,
    pub(crate) sync: PathBuf,
    pub(crate) noop: PathBuf,
    pub(crate) oha: PathBuf,
    pub(crate) vegeta: PathBuf,
    pub(crate) opa: PathBuf,
    /// The comparison of scenarios 3 and 5, or why it is skipped.
    pub(crate) kube_mgmt: KubeMgmtBin,
}

/// Where kube-mgmt is: the binary, or why the contender is skipped (resolved by
/// `kube_mgmt::resolve`).
pub(crate) type KubeMgmtBin = std::result::Result<PathBuf, String>;

/// A binary of this workspace's release build (`cargo build --release --bins`).
pub(crate) fn release_bin(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| placement_tests::repo_root().join("target"));
    target.join("release").join(name)
}

pub(crate) fn require(path: &Path, hint: &str) -> Result<()> {
    if !path.exists() {
        bail!("{} is missing: {hint}", path.display());
    }
    Ok(())
}

/// Clock ticks per second of /proc/<pid>/stat's utime and stime.
fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The CPU of a contender's processes from a start: what a timed run used.
pub(crate) struct CpuSince {
    pids: Vec<u32>,
    before: Vec<f64>,
    machine_before: f64,
}

impl CpuSince {
    pub(crate) fn start(pids: &[u32]) -> Result<CpuSince> {
        Ok(CpuSince {
            pids: pids.to_vec(),
            before: pids
                .iter()
                .map(|p| cpu_seconds(*p))
                .collect::<Result<_>>()?,
            machine_before: machine_busy_seconds()?,
        })
    }

    /// A run of `seconds` with the CPU each process used since the start.
    pub(crate) fn contending(&self, seconds: f64) -> Result<Contending> {
        let parts = self
            .pids
            .iter()
            .zip(&self.before)
            .map(|(pid, before)| Ok(cpu_seconds(*pid)? - before))
            .collect::<Result<Vec<f64>>>()?;
        Ok(Contending {
            seconds,
            cpu: parts.iter().sum(),
            parts,
            machine: machine_busy_seconds()? - self.machine_before,
        })
    }
}

/// CPU seconds the whole machine has been busy (every core, every process:
/// what a contender costs the processes it calls, an API server calling
/// webhooks, shows here and not in its own).
fn machine_busy_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat").context("read /proc/stat")?;
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("cpu "))
        .context("no cpu line in /proc/stat")?
        .split_whitespace()
        .map(|field| field.parse::<f64>().context("malformed /proc/stat"))
        .collect::<Result<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let busy: f64 = ticks.iter().take(8).sum::<f64>()
        - ticks.get(3).unwrap_or(&0.0)
        - ticks.get(4).unwrap_or(&0.0);
    Ok(busy / clock_ticks())
}

/// User + system CPU seconds a process has used so far (its threads included).
pub(crate) fn cpu_seconds(pid: u32) -> Result<f64> {
    stat_seconds(&pid.to_string(), 11)
}

/// The CPU seconds of this process's children that have ended and been
/// waited for (cutime + cstime): around a command run to its end, that
/// command's.
pub(crate) fn ended_children_cpu_seconds() -> Result<f64> {
    stat_seconds("self", 13)
}

/// The sum of two clock-tick fields of /proc/<pid>/stat, `at` and the next,
/// counted from its third field, in seconds.
fn stat_seconds(pid: &str, at: usize) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed /proc/pid/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let first: f64 = fields.get(at).context("a field short")?.parse()?;
    let second: f64 = fields.get(at + 1).context("a field short")?.parse()?;
    Ok((first + second) / clock_ticks())
}

/// Times the threads of `pid` were switched off a core, voluntarily
/// (waiting) or not (preempted): (voluntary, preempted).
pub(crate) fn context_switches(pid: u32) -> Result<(u64, u64)> {
    let mut counts = (0, 0);
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        // A thread may end while it is read.
        let Ok(status) = std::fs::read_to_string(task?.path().join("status")) else {
            continue;
        };
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or(0)
        };
        counts.0 += field("voluntary_ctxt_switches:");
        counts.1 += field("nonvoluntary_ctxt_switches:");
    }
    Ok(counts)
}

/// A `Vm*` line of /proc/<pid>/status, in KiB (e.g. `VmHWM`, `VmRSS`).
pub(crate) fn vm_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// Poll `check` until it returns `Some`, or fail after `timeout`.
pub(crate) fn poll<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check()? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(every);
    }
}

/// A server process whose stdout announces its address.
pub(crate) struct Server {
    pub(crate) process: Process,
}

impl Server {
    pub(crate) fn pid(&self) -> u32 {
        self.process.pid().unwrap_or(0)
    }
}

/// Spawn `bin args`, wait for a log line containing `marker`, return the process
/// and that line.
pub(crate) fn spawn_announced(
    name: &str,
    bin: &Path,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
    marker: &str,
) -> Result<(Server, String)> {
    let mut process = Process::spawn_with_env(name, bin, args, env, log)
        .with_context(|| format!("start {}", bin.display()))?;
    let line = poll(
        &format!("{name} to listen"),
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            if process.has_exited() {
                bail!("{name} exited:\n{}", process.log_tail(30));
            }
            Ok(process
                .log()
                .lines()
                .find(|l| l.contains(marker))
                .map(str::to_owned))
        },
    )?;
    Ok((Server { process }, line))
}

/// The address after `prefix` in `line` (up to `,`, `/` or whitespace).
pub(crate) fn addr_after(line: &str, prefix: &str) -> Result<SocketAddr> {
    let rest = line
        .split(prefix)
        .nth(1)
        .with_context(|| format!("no {prefix:?} in {line:?}"))?;
    let end = rest
        .find(|c: char| c == ',' || c == '/' || c.is_whitespace())
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .with_context(|| format!("address in {line:?}"))
}

/// placement-webhook asking `opa`, registered with the API server for the
/// workloads of namespace `ns` (as a webhook pod serves them).
pub(crate) fn start_registered_webhook(
    bins: &Bins,
    dir: &Path,
    plane: &placement_tests::ControlPlane,
    opa: &placement_tests::OpaServer,
    ns: &str,
) -> Result<Server> {
    let certs = placement_certs::generate_to_dir(
        &dir.join("certs"),
        &["127.0.0.1".into(), "localhost".into()],
    )?;
    let (webhook, addr, _) = start_webhook(
        bins,
        dir,
        &certs,
        &[
            format!("--opa-url={}", opa.url()),
            format!("--opa-token-file={}", opa.token_file().display()),
            format!(
                "--kubeconfig={}",
                plane
                    .kubeconfig(placement_tests::Identity::Webhook)
                    .display()
            ),
            format!(
                "--policy-namespace={}",
                placement_tests::control_plane::POLICY_NAMESPACE
            ),
        ],
    )?;
    plane.create_namespace(ns);
    plane.register_webhook(
        ns,
        &format!("https://{addr}/mutate"),
        &std::fs::read_to_string(&certs.ca)?,
        placement_tests::control_plane::POLICY_NAMESPACE,
    );
    Ok(webhook)
}

/// `placement-webhook serve` on loopback: (server, admission addr, metrics addr).
pub(crate) fn start_webhook(
    bins: &Bins,
    dir: &Path,
    certs: &placement_certs::CertPaths,
    extra: &[String],
) -> Result<(Server, SocketAddr, SocketAddr)> {
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--listen=127.0.0.1:0".into(),
        "--metrics-listen=127.0.0.1:0".into(),
        format!("--tls-cert={}", certs.cert.display()),
        format!("--tls-key={}", certs.key.display()),
        // The key the bench's sidecars sign ownership records with.
        format!(
            "--ownership-key-file={}",
            placement_tests::ownership_key_file().display()
        ),
    ];
    args.extend(extra.iter().cloned());
    let (server, line) = spawn_announced(
        "placement-webhook",
        &bins.webhook,
        &args,
        &[],
        &dir.join(format!("webhook-{}.log", free_port())),
        "admission on https://",
    )?;
    let admission = addr_after(&line, "admission on https://")?;
    let metrics = addr_after(&line, "metrics on http://")?;
    Ok((server, admission, metrics))
}

/// `opa run --server` on a free loopback port with `args` (TLS flags, files).
pub(crate) fn start_opa(
    bins: &Bins,
    dir: &Path,
    label: &str,
    args: &[String],
) -> Result<(Server, u16)> {
    let port = free_port();
    let mut full: Vec<String> = vec![
        "run".into(),
        "--server".into(),
        format!("--addr=127.0.0.1:{port}"),
        "--log-level=error".into(),
        "--skip-version-check".into(),
    ];
    full.extend(args.iter().cloned());
    let mut process = Process::spawn(
        "opa",
        &bins.opa,
        &full,
        &dir.join(format!("opa-{label}.log")),
    )
    .context("start opa")?;
    poll(
        "OPA to listen",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            if process.has_exited() {
                bail!("opa exited:\n{}", process.log_tail(30));
            }
            Ok(port_open(port).then_some(()))
        },
    )?;
    Ok((Server { process }, port))
}

/// One contender's run in a scenario of several: its wall time, its CPU,
/// and the CPU of each process counted (in the order of their pids).
#[derive(Debug, Clone)]
pub(crate) struct Contending {
    pub(crate) seconds: f64,
    pub(crate) cpu: f64,
    pub(crate) parts: Vec<f64>,
    /// The whole machine's busy CPU seconds over the run.
    pub(crate) machine: f64,
}

impl Contending {
    /// The median of each figure over runs.
    pub(crate) fn median(runs: &[Contending]) -> Contending {
        let of = |figure: &dyn Fn(&Contending) -> f64| {
            median(&runs.iter().map(figure).collect::<Vec<_>>())
        };
        let parts = runs.first().map_or(0, |r| r.parts.len());
        Contending {
            seconds: of(&|r| r.seconds),
            cpu: of(&|r| r.cpu),
            parts: (0..parts).map(|i| of(&|r| r.parts[i])).collect(),
            machine: of(&|r| r.machine),
        }
    }
}

pub(crate) fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Nearest-rank percentile (`p` in 0..=100) of unsorted samples.
pub(crate) fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// A version line of a tool (`first line of CMD ARGS`), or "unknown".
pub(crate) fn version_of(bin: &Path, args: &[&str]) -> String {
    std::process::Command::new(bin)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned()
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// A plain-HTTP GET on loopback (`HTTP/1.0`, one connection per request, so no
/// chunked bodies), with an optional bearer token: (status, body).
pub(crate) fn http_get(port: u16, path: &str, token: Option<&str>) -> Result<(u16, String)> {
    http_request(port, "GET", path, token, None)
}

/// A plain-HTTP POST of a JSON body on loopback, like [`http_get`].
pub(crate) fn http_post(
    port: u16,
    path: &str,
    token: Option<&str>,
    json: &str,
) -> Result<(u16, String)> {
    http_request(port, "POST", path, token, Some(json))
}

fn http_request(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    json: Option<&str>,
) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connect to 127.0.0.1:{port}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let body = json
        .map(|b| {
            format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            )
        })
        .unwrap_or_else(|| "\r\n".to_owned());
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n{auth}Accept: */*\r\n{body}"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("malformed HTTP response from 127.0.0.1:{port}{path}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// The value of one sample of a Prometheus/OpenMetrics text page, `name{labels}`
/// written exactly as on the page.
pub(crate) fn metric(page: &str, name_and_labels: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
        .and_then(|l| l[name_and_labels.len()..].split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The sum of the samples of a Prometheus/OpenMetrics text page whose name is
/// `name` and whose labels contain every one of `labels` (`key="value"`).
pub(crate) fn metric_sum(page: &str, name: &str, labels: &[&str]) -> f64 {
    page.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (set, value) = match rest.strip_prefix('{') {
                Some(r) => r.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            labels
                .iter()
                .all(|want| set.split(',').any(|have| have == *want))
                .then(|| value.split_whitespace().next()?.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// `placement-sync` on loopback, talking to `opa` as `identity`.
pub(crate) struct Sidecar {
    pub(crate) server: Server,
    pub(crate) port: u16,
}

impl Sidecar {
    pub(crate) fn start(
        bins: &Bins,
        dir: &Path,
        plane: &placement_tests::ControlPlane,
        identity: placement_tests::Identity,
        opa: &placement_tests::OpaServer,
        extra: &[String],
        label: &str,
    ) -> Result<Sidecar> {
        let opa = [
            format!("--opa-url={}", opa.url()),
            format!("--opa-token-file={}", opa.token_file().display()),
        ];
        Self::start_for(bins, dir, plane, identity, &opa, extra, label)
    }

    /// [`Sidecar::start`] with OPA given by its flags (`--opa-url`, ...).
    pub(crate) fn start_for(
        bins: &Bins,
        dir: &Path,
        plane: &placement_tests::ControlPlane,
        identity: placement_tests::Identity,
        opa: &[String],
        extra: &[String],
        label: &str,
    ) -> Result<Sidecar> {
        std::fs::create_dir_all(dir)?;
        let port = free_port();
        let mut args: Vec<String> = vec![
            format!("--kubeconfig={}", plane.kubeconfig(identity).display()),
            format!("--listen=127.0.0.1:{port}"),
            format!(
                "--ownership-key-file={}",
                placement_tests::ownership_key_file().display()
            ),
        ];
        args.extend(opa.iter().cloned());
        args.extend(extra.iter().cloned());
        let env = vec![("RUST_LOG".to_owned(), "info".to_owned())];
        let process = Process::spawn_with_env(
            "placement-sync",
            &bins.sync,
            &args,
            &env,
            &dir.join(format!("placement-sync-{label}.log")),
        )
        .context("start placement-sync")?;
        Ok(Sidecar {
            server: Server { process },
            port,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.server.pid()
    }

    /// Whether `/readyz` answers 200 (not yet listening: false). Fails when the
    /// process exited.
    pub(crate) fn ready(&mut self) -> Result<bool> {
        if self.server.process.has_exited() {
            bail!(
                "placement-sync exited:\n{}",
                self.server.process.log_tail(40)
            );
        }
        Ok(matches!(http_get(self.port, "/readyz", None), Ok((200, _))))
    }

    /// Poll `/readyz` every `every` until 200; returns when.
    pub(crate) fn wait_ready(&mut self, timeout: Duration, every: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.ready()? {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                bail!(
                    "placement-sync not ready after {timeout:?}:\n{}",
                    self.server.process.log_tail(40)
                );
            }
            std::thread::sleep(every);
        }
    }

    pub(crate) fn metrics(&self) -> Result<String> {
        let (status, body) = http_get(self.port, "/metrics", None)?;
        if status != 200 {
            bail!("placement-sync /metrics: HTTP {status}");
        }
        Ok(body)
    }

    /// One metric sample (0 when absent).
    pub(crate) fn metric(&self, name_and_labels: &str) -> Result<f64> {
        Ok(metric(&self.metrics()?, name_and_labels).unwrap_or(0.0))
    }

    /// Fails when the process has exited, with its log.
    pub(crate) fn check_alive(&mut self) -> Result<()> {
        if self.server.process.has_exited() {
            bail!(
                "placement-sync exited:\n{}",
                self.server.process.log_tail(40)
            );
        }
        Ok(())
    }

    pub(crate) fn log_tail(&self) -> String {
        self.server.process.log_tail(40)
    }

    /// The whole log so far.
    pub(crate) fn log(&self) -> String {
        self.server.process.log()
    }

    pub(crate) fn stop(mut self) {
        self.server.process.terminate(Duration::from_secs(10));
    }
}

/// The ceiling, `noop-webhook`: (server, admission addr, stats addr).
pub(crate) fn start_noop(
    bins: &Bins,
    dir: &Path,
    certs: &placement_certs::CertPaths,
    extra: &[String],
) -> Result<(Server, SocketAddr, SocketAddr)> {
    let mut args = vec![
        "--listen=127.0.0.1:0".into(),
        format!("--tls-cert={}", certs.cert.display()),
        format!("--tls-key={}", certs.key.display()),
    ];
    args.extend_from_slice(extra);
    let (server, line) = spawn_announced(
        "noop-webhook",
        &bins.noop,
        &args,
        &[],
        &dir.join(format!("noop-webhook-{}.log", free_port())),
        "admission on https://",
    )?;
    Ok((
        server,
        addr_after(&line, "admission on https://")?,
        addr_after(&line, "stats on http://")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread kept busy for 0.3 s shows in the machine's busy time (and
    /// whatever else ran meanwhile only adds to it).
    #[test]
    fn the_machines_busy_time_grows_with_work() {
        let before = machine_busy_seconds().unwrap();
        let until = Instant::now() + Duration::from_millis(300);
        let mut spins = 0u64;
        while Instant::now() < until {
            spins = std::hint::black_box(spins.wrapping_add(1));
        }
        let busy = machine_busy_seconds().unwrap() - before;
        assert!(busy >= 0.2, "{busy} s busy over 0.3 s of spinning");
    }
}
