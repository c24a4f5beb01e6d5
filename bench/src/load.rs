//! The load generator: `oha` (HTTP/1.1 keep-alive, TLS), the same for every
//! contender, its JSON report parsed.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

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
}

/// What oha sends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Body<'a> {
    /// The file's content, every request.
    File(&'a Path),
    /// One line of the file per request.
    Lines(&'a Path),
}

/// POST `body` to `url` for `duration` with `concurrency` connections.
pub(crate) fn oha(
    oha: &Path,
    url: &str,
    body: Body<'_>,
    ca: &Path,
    concurrency: usize,
    duration: Duration,
) -> Result<LoadStats> {
    let output = std::process::Command::new(oha)
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
        .arg(url)
        .output()
        .with_context(|| format!("run {}", oha.display()))?;
    if !output.status.success() {
        bail!(
            "oha failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let report: Value = serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "oha's JSON report: {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })?;
    parse(&report)
}

fn parse(report: &Value) -> Result<LoadStats> {
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
    })
}
