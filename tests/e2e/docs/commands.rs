//! Commands and flags: every command written names what exists, every flag
//! written is declared, and every declared flag is in the reference.

use super::*;

/// Flags of other programs that the flag pages name on purpose, with the
/// program; the test checks each is still mentioned, so the list cannot rot.
const FOREIGN_FLAGS: &[(&str, &str, &str)] = &[
    (
        "docs/webhook.md",
        "--admission-control-config-file",
        "kube-apiserver",
    ),
    (
        "docs/sync.md",
        "--unhealthy-zone-threshold",
        "kube-controller-manager",
    ),
    // Karmada's page names the client throttle of Karmada's own components.
    (
        "docs/karmada.md",
        "--kube-api-qps",
        "karmada-controller-manager",
    ),
    // The sidecar's page names the webhook flag that reads the sidecar's /readyz.
    ("docs/sync.md", "--engine-ready-url", "placement-webhook"),
];

/// The workspace's package names, from the root manifest's members.
fn workspace_packages(root: &Path) -> BTreeSet<String> {
    let manifest = read(&root.join("Cargo.toml"));
    let members = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("Cargo.toml lists its members");
    let mut packages = BTreeSet::new();
    for member in members.split('"').skip(1).step_by(2) {
        let member_manifest = read(&root.join(member).join("Cargo.toml"));
        let name = member_manifest
            .lines()
            .skip_while(|l| l.trim() != "[package]")
            .find_map(|l| {
                let (key, value) = l.split_once('=')?;
                (key.trim() == "name").then(|| value.trim().trim_matches('"').to_string())
            })
            .unwrap_or_else(|| panic!("{member}/Cargo.toml has no package name"));
        packages.insert(name);
    }
    assert!(
        packages.len() > 3,
        "workspace members not found: {packages:?}"
    );
    packages
}

/// The names of the `[[test]]` targets of the workspace's members (what
/// `cargo test --test <name>` runs).
fn workspace_test_targets(root: &Path) -> BTreeSet<String> {
    let manifest = read(&root.join("Cargo.toml"));
    let members = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("Cargo.toml lists its members");
    let mut targets = BTreeSet::new();
    for member in members.split('"').skip(1).step_by(2) {
        let member_manifest = read(&root.join(member).join("Cargo.toml"));
        let mut in_test = false;
        for line in member_manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                in_test = line == "[[test]]";
            } else if let Some((key, value)) = line.split_once('=')
                && in_test
                && key.trim() == "name"
            {
                targets.insert(value.trim().trim_matches('"').to_string());
            }
        }
    }
    assert!(!targets.is_empty(), "no [[test]] target found");
    targets
}

/// The commands of the `sh` blocks of a page: continuation lines joined,
/// comments dropped, split into words (quotes removed).
fn sh_commands(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut commands = Vec::new();
    for block in parse(text).blocks {
        if !matches!(block.lang.as_str(), "sh" | "bash" | "shell") {
            continue;
        }
        let mut pending = String::new();
        for line in &block.lines {
            let words: Vec<&str> = line
                .split_whitespace()
                .take_while(|w| !w.starts_with('#'))
                .collect();
            let mut joined = words.join(" ");
            let continued = joined.ends_with('\\');
            if continued {
                joined.pop();
            }
            pending.push_str(&joined);
            pending.push(' ');
            if !continued {
                let words: Vec<String> = pending
                    .split_whitespace()
                    .map(|w| w.trim_matches(|c| c == '\'' || c == '"').to_string())
                    .collect();
                if !words.is_empty() {
                    commands.push((block.line, words));
                }
                pending.clear();
            }
        }
    }
    commands
}

#[test]
fn every_command_names_what_exists() {
    let root = placement_tests::repo_root();
    let packages = workspace_packages(&root);
    let test_targets = workspace_test_targets(&root);
    // Paths into the repository start with one of its top-level folders
    // (target/ holds build output, not sources).
    let folders: BTreeSet<String> = fs::read_dir(&root)
        .expect("root")
        .map(|e| e.expect("root entry"))
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && n != "target")
        .collect();
    let mut problems = Vec::new();
    let (mut scripts, mut cargo_runs, mut helm_installs) = (0, 0, 0);
    let mut docs = vec![PathBuf::from("README.md"), PathBuf::from("CONTRIBUTING.md")];
    docs.extend(pages(&root).into_iter().filter(|p| p.starts_with("docs")));
    for page in docs {
        for (line, words) in sh_commands(&read(&root.join(&page))) {
            let at = format!("{}:{line}: `{}`", page.display(), words.join(" "));
            for word in &words {
                // `--from-file=policies/x.rego` names a path too.
                let path = word.rsplit('=').next().unwrap_or(word);
                let first = path.split('/').next().unwrap_or_default();
                if !path.contains('/') || !folders.contains(first) {
                    continue;
                }
                let full = root.join(path);
                if !full.exists() {
                    problems.push(format!("{at}: {path} does not exist"));
                } else if first == "scripts" {
                    scripts += 1;
                    let mode = fs::metadata(&full).expect("metadata").permissions().mode();
                    if !full.is_file() || mode & 0o111 == 0 {
                        problems.push(format!("{at}: {path} is not an executable file"));
                    }
                }
            }
            for (i, pair) in words.windows(2).enumerate() {
                let args = &words[i + 2..];
                let args = &args[..args.iter().position(|w| w == "--").unwrap_or(args.len())];
                if pair == ["cargo", "run"] {
                    cargo_runs += 1;
                    let package = args
                        .windows(2)
                        .find(|w| w[0] == "-p" || w[0] == "--package")
                        .map(|w| w[1].clone());
                    match package {
                        Some(p) if packages.contains(&p) => {}
                        Some(p) => problems.push(format!("{at}: no package {p} in the workspace")),
                        None => problems.push(format!("{at}: cargo run without -p")),
                    }
                }
                if pair == ["cargo", "test"] {
                    for target in args.windows(2).filter(|w| w[0] == "--test").map(|w| &w[1]) {
                        if !test_targets.contains(target) {
                            problems
                                .push(format!("{at}: no test target {target} in the workspace"));
                        }
                    }
                }
                if pair == ["helm", "install"] {
                    helm_installs += 1;
                    let chart = args.iter().find(|w| w.starts_with("charts/"));
                    match chart {
                        Some(c) if root.join(c).join("Chart.yaml").is_file() => {}
                        Some(c) => problems.push(format!("{at}: {c} holds no Chart.yaml")),
                        None => problems.push(format!("{at}: helm install of no chart in charts/")),
                    }
                }
            }
        }
    }
    assert!(scripts > 3, "only {scripts} script invocations found");
    assert!(
        cargo_runs >= 2,
        "only {cargo_runs} cargo run commands found"
    );
    assert!(
        helm_installs >= 2,
        "only {helm_installs} helm install commands found"
    );
    assert!(
        problems.is_empty(),
        "commands naming what does not exist:\n{}",
        problems.join("\n")
    );
}

/// The long flags (and aliases) declared with clap's derive in the `.rs`
/// files under `dir`: `#[arg(long)]` on a field `foo_bar` is `--foo-bar`,
/// `long = "x"` is `--x`, `alias = "y"` adds `--y`.
fn declared_flags(dir: &Path) -> BTreeSet<String> {
    let mut flags: BTreeSet<String> = ["--help", "--version"].map(String::from).into();
    let mut files = vec![dir.to_path_buf()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(
                fs::read_dir(&path)
                    .expect("src dir")
                    .map(|e| e.expect("entry").path()),
            );
            continue;
        }
        if path.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let source = read(&path);
        let mut rest = source.as_str();
        while let Some(start) = rest.find("#[arg(") {
            let body = &rest[start + "#[arg(".len()..];
            let mut depth = 1;
            let end = body
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' | '[' => depth += 1,
                        ')' | ']' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map(|(i, _)| i)
                .expect("#[arg( is closed");
            let attribute = &body[..end];
            rest = &body[end..];
            // The field: the first line after the attribute that is not
            // another attribute or a comment.
            let field = rest
                .lines()
                .skip(1)
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with("#[") && !l.starts_with("//"))
                .and_then(|l| l.split_once(':'))
                .map(|(name, _)| {
                    name.trim()
                        .trim_start_matches("pub(crate) ")
                        .trim_start_matches("pub ")
                        .trim()
                })
                .unwrap_or_default();
            let items: Vec<&str> = attribute.split(',').map(str::trim).collect();
            let quoted = |key: &str| -> Vec<String> {
                items
                    .iter()
                    .filter_map(|i| i.split_once('='))
                    .filter(|(k, _)| k.trim() == key)
                    .map(|(_, v)| v.trim().trim_matches('"').to_string())
                    .collect()
            };
            if let Some(long) = quoted("long").first() {
                flags.insert(format!("--{long}"));
            } else if items.contains(&"long") {
                flags.insert(format!("--{}", field.replace('_', "-")));
            }
            for alias in quoted("alias").into_iter().chain(quoted("visible_alias")) {
                flags.insert(format!("--{alias}"));
            }
        }
    }
    flags
}

/// The `--flag` words of a text (`--a/--b`, `--a=x` and `[--a X]` included).
fn written_flags(text: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i + 2 < chars.len() {
        let boundary =
            i == 0 || !(chars[i - 1].is_alphanumeric() || matches!(chars[i - 1], '-' | '_'));
        if boundary && chars[i] == '-' && chars[i + 1] == '-' && chars[i + 2].is_ascii_lowercase() {
            let mut j = i + 2;
            while j < chars.len()
                && (chars[j].is_ascii_lowercase() || chars[j].is_ascii_digit() || chars[j] == '-')
            {
                j += 1;
            }
            let flag: String = chars[i..j].iter().collect();
            flags.insert(flag.trim_end_matches('-').to_string());
            i = j;
        } else {
            i += 1;
        }
    }
    flags
}

#[test]
fn every_flag_written_is_declared() {
    let root = placement_tests::repo_root();
    // The ConfigMap selection flags of both are declared once, in policy-client.
    let shared = declared_flags(&root.join("policy-client/src/configmaps"));
    let webhook: BTreeSet<String> = &declared_flags(&root.join("webhook/src")) | &shared;
    let sync: BTreeSet<String> = &declared_flags(&root.join("sync-sidecar/src")) | &shared;
    assert!(
        shared.contains("--policy-label"),
        "--policy-label not found in policy-client/src/configmaps: {shared:?}"
    );
    // The parser finds flags declared every way (plain, `long = "..."`,
    // alias, in a flattened struct of another file).
    for flag in [
        "--opa-url",
        "--tls-dns-name",
        "--inject-ca-into",
        "--ca-validity",
        "--name",
    ] {
        assert!(
            webhook.contains(flag),
            "{flag} not found in webhook/src: {webhook:?}"
        );
    }
    for flag in [
        "--remediation-hold-share",
        "--health-endpoint",
        "--opa-auth-token-file",
    ] {
        assert!(
            sync.contains(flag),
            "{flag} not found in sync-sidecar/src: {sync:?}"
        );
    }
    let binaries = [("placement-webhook", &webhook), ("placement-sync", &sync)];
    let mut problems = Vec::new();
    for (page, binary, declared) in [
        ("docs/webhook.md", "placement-webhook", &webhook),
        ("docs/sync.md", "placement-sync", &sync),
    ] {
        let written = written_flags(&read(&root.join(page)));
        assert!(
            written.len() > 20,
            "only {} flags found in {page}",
            written.len()
        );
        for flag in &written {
            if declared.contains(flag) {
                continue;
            }
            match FOREIGN_FLAGS
                .iter()
                .find(|(p, f, _)| *p == page && f == flag)
            {
                Some((_, _, program)) => {
                    // A flag of our other binary must really be one of its flags.
                    if let Some((_, flags)) = binaries.iter().find(|(b, _)| b == program)
                        && !flags.contains(flag)
                    {
                        problems.push(format!("{page}: {flag} is not a flag of {program}"));
                    }
                }
                None => problems.push(format!("{page}: {flag} is not a flag of {binary}")),
            }
        }
    }
    for (page, flag, _) in FOREIGN_FLAGS {
        if !written_flags(&read(&root.join(page))).contains(*flag) {
            problems.push(format!(
                "{page} no longer names {flag}: drop it from FOREIGN_FLAGS"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "flags that no binary declares:\n{}",
        problems.join("\n")
    );
}

/// Every long flag a binary declares is written on its reference page (the
/// reverse of `every_flag_written_is_declared`): a flag cannot be added
/// without its line in the reference.
#[test]
fn every_declared_flag_is_in_the_reference() {
    let root = placement_tests::repo_root();
    let shared = declared_flags(&root.join("policy-client/src/configmaps"));
    let mut problems = Vec::new();
    for (page, src) in [
        ("docs/webhook.md", "webhook/src"),
        ("docs/sync.md", "sync-sidecar/src"),
    ] {
        let declared = &declared_flags(&root.join(src)) | &shared;
        let written = written_flags(&read(&root.join(page)));
        for flag in declared.difference(&written) {
            if !["--help", "--version"].contains(&flag.as_str()) {
                problems.push(format!("{page} does not name {flag} ({src} declares it)"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "flags missing from the reference:\n{}",
        problems.join("\n")
    );
}
