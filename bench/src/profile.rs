//! Where a decision the memory cannot answer goes: `scripts/profile`'s
//! instruction counts (valgrind's callgrind over `target/release/evaluations`)
//! for the interpreter, the compiled form, and the compiled form under the
//! app-label rule, measured in the run that writes the report (instructions
//! do not move with the machine's load, where time does).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// A module the compiler refuses (a partial object rule with a constant key),
/// so that the whole policy set is interpreted: how every query was decided
/// before the compiled form.
const REFUSED_BY_THE_COMPILER: &str =
    "package io.k8s.federation.admission\n\nrefused_by_the_compiler[\"key\"] := 1\n";

/// The profile's section of scenario 1's report: a table of instructions per
/// decision, or why it was not measured.
pub(crate) fn decision_profile(dir: &Path) -> String {
    let mut md = String::from("\n### Profile of a decision the memory cannot answer\n\n");
    match measure(dir) {
        Ok(rows) => {
            md.push_str(
                "`scripts/profile` counts with valgrind's callgrind what `target/release/evaluations` spends deciding the varied stream in process \
                 (no HTTP, no TLS; each review's policy input built as the webhook builds it; `--rounds 1` less `--rounds 0`, over the reviews), \
                 in this run:\n\n\
                 | policy set, evaluator | instructions per decision | command |\n|---|---:|---|\n",
            );
            for (label, instructions, command) in rows {
                md.push_str(&format!(
                    "| {label} | {:.3} M | `{command}` |\n",
                    instructions as f64 / 1e6
                ));
            }
            md.push_str(
                "\nThe interpreter resolves each rule reference by building and looking up path strings and switching modules; the compiled \
                 form calls rules by index. `callgrind_annotate` on the call graphs kept under the run's logs (`profile-*/callgrind.rounds-1`) \
                 shows where the rest goes.\n",
            );
        }
        Err(e) => md.push_str(&format!("Not measured in this run: {e:#}.\n")),
    }
    md
}

/// (row label, instructions per decision, command) for each evaluator.
fn measure(dir: &Path) -> Result<Vec<(&'static str, u64, String)>> {
    let refused = dir.join("refused_by_the_compiler.rego");
    std::fs::write(&refused, REFUSED_BY_THE_COMPILER)?;
    let refused = refused.display().to_string();
    let cases: [(&str, &str, Vec<&str>); 3] = [
        (
            "interpreter",
            "shipped policy, regorus's interpreter (FILE: a module the compiler refuses, `refused_by_the_compiler[\"key\"] := 1`)",
            vec!["--reviews", "500", "--module", &refused],
        ),
        (
            "compiled",
            "shipped policy, compiled to regorus's bytecode VM",
            vec![],
        ),
        (
            "app-label",
            "shipped policy and the app-label rule, compiled (b2)",
            vec!["--module", "bench/rego/app_label.rego"],
        ),
    ];
    let mut rows = Vec::new();
    for (key, label, args) in cases {
        eprintln!("scenario 1: scripts/profile {}", args.join(" "));
        let instructions = profile(dir, key, &args)?;
        let shown = args
            .iter()
            .map(|a| if *a == refused { "FILE" } else { a })
            .collect::<Vec<_>>()
            .join(" ");
        let command = format!("scripts/profile {shown}").trim_end().to_owned();
        rows.push((label, instructions, command));
    }
    Ok(rows)
}

/// One decision's instructions by `scripts/profile ARGS`, its call graphs
/// kept in `dir/profile-KEY`.
fn profile(dir: &Path, key: &str, args: &[&str]) -> Result<u64> {
    let root = placement_tests::repo_root();
    let output = Command::new(root.join("scripts/profile"))
        .args(args)
        .current_dir(&root)
        .env("PROFILE_OUT", dir.join(format!("profile-{key}")))
        .output()
        .context("run scripts/profile")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or_default();
        bail!("scripts/profile {} failed: {last}", args.join(" "));
    }
    one_decision(&stdout).with_context(|| format!("scripts/profile printed no count: {stdout}"))
}

/// The count in `scripts/profile`'s line `... one decision: N instructions`.
fn one_decision(stdout: &str) -> Option<u64> {
    stdout
        .lines()
        .find_map(|line| line.split("one decision: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_of_one_decision_is_read_from_the_scripts_line() {
        let out = "setup and one warm-up round: 91 instructions\n\
                   one round of 2000 reviews: 892000000 instructions; one decision: 446000 instructions\n";
        assert_eq!(one_decision(out), Some(446_000));
        assert_eq!(one_decision("no count here\n"), None);
    }
}
