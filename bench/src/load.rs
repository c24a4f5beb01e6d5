//! The load generators: `oha` (Rust: hyper, rustls) and `vegeta` (Go:
//! net/http, crypto/tls), both HTTP/1.1 keep-alive over TLS, the same for
//! every contender; their JSON reports parsed.
//!
//! Two clients because a server's cost per review depends on the client it
//! shares the machine's cores with (what the client takes, and how often it
//! wakes): the same servers measured under each tell what is the servers'.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::common::ended_children_cpu_seconds;

/// What one load run measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct LoadStats {
    /// Responses with status 200 per second of the run.
    pub(crate) rps: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    /// Responses with status 200.
    pub(crate) ok: u64,
    /// Any other status, or a connection error.
    pub(crate) failed: u64,
    /// CPU seconds the load generator itself took: on a machine it shares
    /// with the servers, taken from them.
    pub(crate) client_cpu: f64,
}

/// What a load run sends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Body<'a> {
    /// The file's content, every request.
    File(&'a Path),
    /// One line of the file per request: a random line (oha), the lines in
    /// turn (vegeta).
    Lines(&'a Path),
}

/// A load generator and where its binary is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Client<'a> {
    Oha(&'a Path),
    Vegeta(&'a Path),
}

impl Client<'_> {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Client::Oha(_) => "oha",
            Client::Vegeta(_) => "vegeta",
        }
    }

    /// POST `body` to `url` for `duration` over `concurrency` connections.
    pub(crate) fn run(
        self,
        url: &str,
        body: Body<'_>,
        ca: &Path,
        concurrency: usize,
        duration: Duration,
    ) -> Result<LoadStats> {
        match self {
            Client::Oha(bin) => oha(bin, url, body, ca, concurrency, duration),
            Client::Vegeta(bin) => vegeta(bin, url, body, ca, concurrency, duration),
        }
    }
}

fn oha(
    oha: &Path,
    url: &str,
    body: Body<'_>,
    ca: &Path,
    concurrency: usize,
    duration: Duration,
) -> Result<LoadStats> {
    let mut command = std::process::Command::new(oha);
    command
        .args([
            "--no-tui",
            "--output-format",
            "json",
            "-z",
            &format!("{}ms", duration.as_millis()),
            "-c",
            &concurrency.to_string(),
            "-m",
            "POST",
            "-H",
            "content-type: application/json",
        ])
        .args(match body {
            Body::File(path) => ["-D".as_ref(), path.as_os_str()],
            Body::Lines(path) => ["-Z".as_ref(), path.as_os_str()],
        })
        .arg("--cacert")
        .arg(ca)
        .arg(url);
    let (stdout, client_cpu) = run_to_end(command, "oha")?;
    let report = json_report(&stdout, "oha")?;
    Ok(LoadStats {
        client_cpu,
        ..parse_oha(&report)?
    })
}

fn parse_oha(report: &Value) -> Result<LoadStats> {
    let seconds = report["summary"]["total"]
        .as_f64()
        .context("summary.total in oha's report")?;
    let codes = report["statusCodeDistribution"]
        .as_object()
        .context("statusCodeDistribution in oha's report")?;
    let mut ok = 0;
    let mut failed = 0;
    for (code, n) in codes {
        let n = n.as_u64().unwrap_or(0);
        if code == "200" {
            ok += n;
        } else {
            failed += n;
        }
    }
    if let Some(errors) = report["errorDistribution"].as_object() {
        // oha counts requests cut off by the end of the run as errors; they are
        // not failures of the server.
        failed += errors
            .iter()
            .filter(|(k, _)| !k.contains("aborted due to deadline"))
            .map(|(_, n)| n.as_u64().unwrap_or(0))
            .sum::<u64>();
    }
    let pct = |key: &str| -> Result<f64> {
        Ok(report["latencyPercentiles"][key]
            .as_f64()
            .with_context(|| format!("latencyPercentiles.{key} in oha's report"))?
            * 1000.0)
    };
    Ok(LoadStats {
        rps: ok as f64 / seconds,
        p50_ms: pct("p50")?,
        p99_ms: pct("p99")?,
        ok,
        failed,
        client_cpu: 0.0,
    })
}

/// vegeta at its highest rate: `concurrency` workers, each sending its next
/// request when the last is answered, over at most `concurrency` kept
/// connections. Its targets (URL and body per request) are written beside
/// the body file, once per URL.
fn vegeta(
    vegeta: &Path,
    url: &str,
    body: Body<'_>,
    ca: &Path,
    concurrency: usize,
    duration: Duration,
) -> Result<LoadStats> {
    let targets = vegeta_targets(url, body)?;
    let results = targets.with_extension("results");
    let concurrency = concurrency.to_string();
    let mut attack = std::process::Command::new(vegeta);
    attack
        .arg("attack")
        .args(["-format=json", "-rate=0", "-http2=false", "-keepalive=true"])
        // Response bodies are not read by the bench: not kept either.
        .arg("-max-body=0")
        .arg(format!("-workers={concurrency}"))
        .arg(format!("-max-workers={concurrency}"))
        .arg(format!("-connections={concurrency}"))
        .arg(format!("-max-connections={concurrency}"))
        .arg(format!("-duration={}ms", duration.as_millis()))
        .arg("-root-certs")
        .arg(ca)
        .arg("-targets")
        .arg(&targets)
        .arg("-output")
        .arg(&results);
    let (_, client_cpu) = run_to_end(attack, "vegeta attack")?;
    let mut report = std::process::Command::new(vegeta);
    report.args(["report", "-type=json"]).arg(&results);
    let (stdout, _) = run_to_end(report, "vegeta report")?;
    let report = json_report(&stdout, "vegeta")?;
    Ok(LoadStats {
        client_cpu,
        ..parse_vegeta(&report)?
    })
}

/// Run `command` to its end: its output, and the CPU seconds it took; an
/// error naming `what` and showing its stderr if it failed.
fn run_to_end(mut command: std::process::Command, what: &str) -> Result<(Vec<u8>, f64)> {
    let cpu_before = ended_children_cpu_seconds()?;
    let output = command.output().with_context(|| format!("run {what}"))?;
    let cpu = ended_children_cpu_seconds()? - cpu_before;
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok((output.stdout, cpu))
}

/// A load generator's JSON report.
fn json_report(stdout: &[u8], what: &str) -> Result<Value> {
    serde_json::from_slice(stdout)
        .with_context(|| format!("{what}'s JSON report: {}", String::from_utf8_lossy(stdout)))
}

/// vegeta's targets for `url`: one per request body, in vegeta's JSON format.
fn vegeta_targets(url: &str, body: Body<'_>) -> Result<PathBuf> {
    use base64::Engine as _;
    let (path, lines) = match body {
        Body::File(path) => (path, false),
        Body::Lines(path) => (path, true),
    };
    // The URL's digits (address and port) tell the contenders apart.
    let digits: String = url.chars().filter(char::is_ascii_digit).collect();
    let targets = path.with_extension(format!("vegeta-{digits}.jsonl"));
    if targets.exists() {
        return Ok(targets);
    }
    let content = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let bodies: Vec<&[u8]> = if lines {
        content
            .split(|&b| b == b'\n')
            .filter(|line| !line.is_empty())
            .collect()
    } else {
        vec![&content]
    };
    let mut text = String::new();
    for body in bodies {
        let target = serde_json::json!({
            "method": "POST",
            "url": url,
            "header": {"Content-Type": ["application/json"]},
            "body": base64::engine::general_purpose::STANDARD.encode(body),
        });
        text.push_str(&target.to_string());
        text.push('\n');
    }
    std::fs::write(&targets, text).with_context(|| format!("write {}", targets.display()))?;
    Ok(targets)
}

fn parse_vegeta(report: &Value) -> Result<LoadStats> {
    let nanos = |key: &str| -> Result<f64> {
        report[key]
            .as_f64()
            .with_context(|| format!("{key} in vegeta's report"))
    };
    // The attack's length plus the wait for its last answers.
    let seconds = (nanos("duration")? + nanos("wait")?) / 1e9;
    let requests = report["requests"]
        .as_u64()
        .context("requests in vegeta's report")?;
    let ok = report["status_codes"]["200"].as_u64().unwrap_or(0);
    let latency = |key: &str| -> Result<f64> {
        Ok(report["latencies"][key]
            .as_f64()
            .with_context(|| format!("latencies.{key} in vegeta's report"))?
            / 1e6)
    };
    Ok(LoadStats {
        rps: ok as f64 / seconds,
        p50_ms: latency("50th")?,
        p99_ms: latency("99th")?,
        ok,
        failed: requests.saturating_sub(ok),
        client_cpu: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vegetas_report_counts_answers_other_than_200_as_failed() {
        let report = serde_json::json!({
            "latencies": {"50th": 1_500_000, "99th": 4_000_000},
            "duration": 9_000_000_000u64,
            "wait": 1_000_000_000u64,
            "requests": 1000,
            "status_codes": {"200": 990, "503": 10},
        });
        let stats = parse_vegeta(&report).unwrap();
        assert_eq!((stats.ok, stats.failed), (990, 10));
        assert_eq!(stats.rps, 99.0);
        assert_eq!((stats.p50_ms, stats.p99_ms), (1.5, 4.0));
    }
}
