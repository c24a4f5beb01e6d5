//! The documentation keeps working: every relative link of README.md,
//! CONTRIBUTING.md, docs/*.md and sync-sidecar/README.md names a file of the
//! repository (and, with `#anchor`, a heading of that file); the README keeps
//! the project's two commands; every repository path, script, package, test target and
//! chart named in an `sh` block exists; and every `--flag` written in
//! docs/webhook.md and docs/sync.md is declared by the binary's clap
//! configuration. Needs no server: it reads the repository's files.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

/// The two commands of the README (a project contract, verbatim).
const RUN_COMMAND: &str = "cargo run --release -p placement-webhook -- serve";
const TEST_COMMAND: &str = "scripts/test";

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

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The pages whose links are checked, relative to the root.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![
        PathBuf::from("README.md"),
        PathBuf::from("CONTRIBUTING.md"),
        PathBuf::from("sync-sidecar/README.md"),
    ];
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| p.strip_prefix(root).expect("under root").to_path_buf())
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/ holds no page");
    pages.extend(docs);
    pages
}

/// A Markdown file split into prose lines (outside fences) and fenced blocks.
struct Page {
    prose: Vec<(usize, String)>,
    blocks: Vec<Block>,
}

struct Block {
    lang: String,
    line: usize,
    lines: Vec<String>,
}

fn parse(text: &str) -> Page {
    let mut prose = Vec::new();
    let mut blocks = Vec::new();
    let mut open: Option<(String, Block)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let fence = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f));
        match (&mut open, fence) {
            (None, Some(f)) => {
                let lang = trimmed[f.len()..].trim().to_string();
                open = Some((
                    f.to_string(),
                    Block {
                        lang,
                        line: i + 1,
                        lines: Vec::new(),
                    },
                ));
            }
            (Some((f, _)), Some(g)) if *f == g && trimmed[g.len()..].trim().is_empty() => {
                blocks.push(open.take().expect("open block").1);
            }
            (Some((_, block)), _) => block.lines.push(line.trim_start().to_string()),
            (None, None) => prose.push((i + 1, line.to_string())),
        }
    }
    assert!(open.is_none(), "a fenced block is never closed");
    Page { prose, blocks }
}

/// The prose without its inline code spans (links inside them are examples);
/// a code span may run over lines of a paragraph, never past its end.
fn without_code_spans(prose: &[(usize, String)]) -> Vec<(usize, String)> {
    let mut in_code = false;
    let mut out = Vec::new();
    for (line_no, line) in prose {
        if line.trim().is_empty() {
            in_code = false;
        }
        let mut kept = String::new();
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                kept.push(c);
            }
        }
        out.push((*line_no, kept));
    }
    out
}

/// The targets of the inline links `[text](target)` of the prose of a page.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut targets = Vec::new();
    for (line_no, line) in without_code_spans(&parse(text).prose) {
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push((line_no, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    targets
}

/// GitHub's anchor of a heading: lower case, punctuation other than `-` and
/// `_` dropped, spaces turned into hyphens.
fn slug(heading: &str) -> String {
    // Links in headings count by their text.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(i) = rest.find("](") {
        let Some(end) = rest[i..].find(')') else {
            break;
        };
        text.push_str(&rest[..i]);
        rest = &rest[i + end + 1..];
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a Markdown file, duplicates numbered as GitHub numbers them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in parse(text).prose {
        let level = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&level) || !line[level..].starts_with(' ') {
            continue;
        }
        let base = slug(line[level..].trim().trim_end_matches('#').trim());
        let n = seen.entry(base.clone()).or_insert(0);
        anchors.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    anchors
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Problems with the relative links of one page (`page` relative to `root`).
fn link_problems(root: &Path, page: &Path) -> Vec<String> {
    let text = read(&root.join(page));
    let dir = page.parent().unwrap_or(Path::new(""));
    let mut problems = Vec::new();
    for (line_no, target) in links(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let file = if path.is_empty() {
            page.to_path_buf()
        } else if let Some(abs) = path.strip_prefix('/') {
            normalize(Path::new(abs))
        } else {
            normalize(&dir.join(path))
        };
        let at = format!("{}:{line_no}: ({target})", page.display());
        if !root.join(&file).exists() {
            problems.push(format!("{at}: {} does not exist", file.display()));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if file.extension().is_none_or(|x| x != "md") {
            problems.push(format!("{at}: anchor into a file that is not Markdown"));
            continue;
        }
        if !anchors(&read(&root.join(&file))).contains(anchor) {
            problems.push(format!(
                "{at}: {} has no heading with the anchor #{anchor}",
                file.display()
            ));
        }
    }
    problems
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(
        slug("Metrics (`/metrics`, OpenMetrics text)"),
        "metrics-metrics-openmetrics-text"
    );
    assert_eq!(
        slug("OPA restarts and `/readyz`"),
        "opa-restarts-and-readyz"
    );
    assert_eq!(
        slug("The webhook's configuration file"),
        "the-webhooks-configuration-file"
    );
    let twice = anchors("# A\n## Run\n```sh\n# Run\n```\n## Run\n");
    assert_eq!(
        twice,
        ["a", "run", "run-1"]
            .map(String::from)
            .into_iter()
            .collect()
    );
}

#[test]
fn every_relative_link_resolves() {
    let root = placement_tests::repo_root();
    let mut problems = Vec::new();
    let mut found = 0;
    for page in pages(&root) {
        found += links(&read(&root.join(&page))).len();
        problems.extend(link_problems(&root, &page));
    }
    assert!(
        found > 20,
        "only {found} links found: is the parser broken?"
    );
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_broken_link_is_found() {
    // The checker itself: a page with a missing file and a missing anchor.
    let dir = std::env::temp_dir().join(format!("placement-docs-test-{}", std::process::id()));
    fs::create_dir_all(dir.join("docs")).expect("temp dir");
    fs::write(dir.join("docs/a.md"), "# A page\n\n## Real heading\n").expect("write");
    fs::write(
        dir.join("docs/b.md"),
        "[ok](a.md#real-heading) [gone](missing.md) [no anchor](a.md#nothing) \
         `[in code](missing-too.md)`\n```sh\n[in a block](missing-three.md)\n```\n",
    )
    .expect("write");
    let problems = link_problems(&dir, Path::new("docs/b.md"));
    fs::remove_dir_all(&dir).ok();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("docs/missing.md does not exist"),
        "{problems:?}"
    );
    assert!(problems[1].contains("#nothing"), "{problems:?}");
}

#[test]
fn the_readme_links_every_reference_page() {
    let root = placement_tests::repo_root();
    let readme = read(&root.join("README.md"));
    let linked: BTreeSet<String> = links(&readme)
        .into_iter()
        .map(|(_, t)| t.split('#').next().unwrap_or_default().to_string())
        .collect();
    for page in pages(&root) {
        let page = page.to_string_lossy().into_owned();
        if page.starts_with("docs/") || page == "CONTRIBUTING.md" {
            assert!(linked.contains(&page), "README.md does not link {page}");
        }
    }
}

#[test]
fn the_readme_keeps_the_two_commands() {
    let root = placement_tests::repo_root();
    let readme = parse(&read(&root.join("README.md")));
    let sh_lines: Vec<&str> = readme
        .blocks
        .iter()
        .filter(|b| b.lang == "sh")
        .flat_map(|b| b.lines.iter().map(|l| l.trim()))
        .collect();
    for command in [RUN_COMMAND, TEST_COMMAND] {
        assert!(
            sh_lines.contains(&command),
            "README.md has no sh block line that is exactly `{command}`"
        );
    }
    let ci = read(&root.join(".ci/run"));
    let calls = ci
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .any(|l| l.split_whitespace().any(|t| t == TEST_COMMAND));
    assert!(calls, ".ci/run does not call {TEST_COMMAND}");
}

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

/// The metric names a metrics source registers (prometheus-client adds the
/// `_total` of counters): the string literals on lines of their own before
/// its tests, as `registry.register(` and the collectors write them.
fn registered_metrics(path: &Path) -> BTreeSet<String> {
    let source = read(path);
    let product = source.split("#[cfg(test)]").next().unwrap_or_default();
    product
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix('"')?.strip_suffix("\",").map(str::to_owned))
        .filter(|name| {
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .collect()
}

/// The lines of the section under `heading` (to the next heading of the
/// same or a higher level).
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut lines = text.lines().skip_while(|l| !l.starts_with(heading));
    let Some(_) = lines.next() else {
        return Vec::new();
    };
    lines
        .take_while(|l| {
            let hashes = l.chars().take_while(|c| *c == '#').count();
            hashes == 0 || hashes > level
        })
        .collect()
}

/// The metric names of a page's metrics table (its first column), without
/// the binary's prefix and `_total`: `a_total{x}`, `b`, `` `c_hits_total`, `_misses_total` ``
/// (a name starting with `_` shares the one before it but as many parts).
fn documented_metrics(lines: &[&str], prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in lines {
        let Some(first) = line.strip_prefix('|').and_then(|l| l.split('|').next()) else {
            continue;
        };
        let mut previous = String::new();
        for span in first.split('`').skip(1).step_by(2) {
            let name = span.split('{').next().unwrap_or_default().trim();
            let name = name.strip_prefix(prefix).unwrap_or(name);
            let full = if let Some(suffix) = name.strip_prefix('_') {
                let parts = suffix.split('_').count();
                let stem: Vec<&str> = previous.split('_').collect();
                let keep = stem.len().saturating_sub(parts);
                format!("{}_{suffix}", stem[..keep].join("_"))
            } else {
                name.to_owned()
            };
            if full.is_empty() || !full.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                continue;
            }
            names.insert(full.trim_end_matches("_total").to_owned());
            previous = full;
        }
    }
    names
}

/// The metrics tables of docs/webhook.md and docs/sync.md name exactly the
/// metrics each binary registers (its own and the endpoint crate's).
#[test]
fn the_metrics_tables_name_every_metric_and_no_other() {
    let root = placement_tests::repo_root();
    let endpoint = registered_metrics(&root.join("endpoint/src/metrics.rs"));
    assert!(endpoint.contains("connections_open"), "{endpoint:?}");
    let mut problems = Vec::new();
    for (page, source, prefix) in [
        (
            "docs/webhook.md",
            "webhook/src/metrics.rs",
            "placement_webhook_",
        ),
        (
            "docs/sync.md",
            "sync-sidecar/src/metrics.rs",
            "placement_sync_",
        ),
    ] {
        let registered = &registered_metrics(&root.join(source)) | &endpoint;
        assert!(registered.len() > 10, "{source}: {registered:?}");
        let text = read(&root.join(page));
        let metrics_heading = text
            .lines()
            .find(|l| l.starts_with("### Metrics"))
            .unwrap_or_else(|| panic!("{page} has no Metrics section under its Reference"));
        let documented = documented_metrics(&section(&text, metrics_heading), prefix);
        for name in registered.difference(&documented) {
            problems.push(format!(
                "{page}: metric {prefix}{name} ({source}) is missing from the Metrics table"
            ));
        }
        for name in documented.difference(&registered) {
            problems.push(format!(
                "{page}: the Metrics table names {prefix}{name}, which {source} does not register"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The Event reasons the code under `dir` emits: PascalCase literals passed
/// where an Event is made (`emit(`, `_event(`, `_events(`, an event planned
/// as `Some((normal, "Reason", ..))` or pushed as `events.push((normal,
/// "Reason", ..))`, `reason: "Reason".to_owned()`, a constant passed to an
/// `emit`), and the webhook's failure reasons (`PlacementFailure::.. =>
/// "Reason"`).
fn emitted_reasons(dir: &Path) -> BTreeSet<String> {
    let mut reasons = BTreeSet::new();
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
        let is_test = path.file_name().is_some_and(|n| n == "tests.rs");
        if path.extension().is_none_or(|x| x != "rs") || is_test {
            continue;
        }
        let source = read(&path);
        let product = source.split("#[cfg(test)]").next().unwrap_or_default();
        let flat: String = product.split_whitespace().collect::<Vec<_>>().join(" ");
        let pieces: Vec<&str> = flat.split('"').collect();
        let mut offset = 0;
        for (i, piece) in pieces.iter().enumerate() {
            let start = offset;
            offset += piece.len() + 1;
            let pascal = i % 2 == 1
                && piece.len() > 3
                && piece.starts_with(|c: char| c.is_ascii_uppercase())
                && piece.chars().all(|c| c.is_ascii_alphabetic())
                && piece.chars().filter(char::is_ascii_uppercase).count() > 1;
            if !pascal {
                continue;
            }
            let mut from = start.saturating_sub(61);
            while !flat.is_char_boundary(from) {
                from += 1;
            }
            let before = &flat[from..start.saturating_sub(1)];
            let window = before.replace("( ", "(");
            let after = pieces.get(i + 1).copied().unwrap_or_default();
            let event = window.contains(".emit(")
                || window.contains("_event(")
                || window.contains("_events(")
                || window.ends_with("Some((true, ")
                || window.ends_with("Some((false, ")
                || window.ends_with("events.push((true, ")
                || window.ends_with("events.push((false, ")
                || (window.ends_with(": &str = ") && emitted_const(&flat, &window))
                || (window.ends_with("reason: ") && after.starts_with(".to_owned()"))
                || (window.contains("PlacementFailure::") && window.ends_with("=> "));
            if event {
                reasons.insert((*piece).to_owned());
            }
        }
    }
    reasons
}

/// Whether the constant whose declaration `window` ends with (`NAME: &str = `)
/// is passed where an Event is made (`emit(request, NAME,`, `emit_about(.., NAME,`).
fn emitted_const(flat: &str, window: &str) -> bool {
    let Some(declared) = window.strip_suffix(": &str = ") else {
        return false;
    };
    let name = declared.rsplit(' ').next().unwrap_or_default();
    let upper = name.chars().all(|c| c.is_ascii_uppercase() || c == '_');
    upper
        && !name.is_empty()
        && flat.match_indices(&format!(", {name},")).any(|(at, _)| {
            let line_start = flat[..at].rfind(';').map_or(0, |i| i + 1);
            flat[line_start..at].contains(".emit")
        })
}

/// The reasons of a page's Events table (its first column).
fn documented_reasons(lines: &[&str]) -> BTreeSet<String> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix('|')?.split('|').next())
        .flat_map(|cell| {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|r| r.chars().all(|c| c.is_ascii_alphabetic()))
        .collect()
}

/// The Events tables of docs/webhook.md and docs/sync.md name exactly the
/// Event reasons each binary emits.
#[test]
fn the_events_tables_name_every_event_reason_and_no_other() {
    let root = placement_tests::repo_root();
    let mut problems = Vec::new();
    for (page, src) in [
        ("docs/webhook.md", "webhook/src"),
        ("docs/sync.md", "sync-sidecar/src"),
    ] {
        let emitted = emitted_reasons(&root.join(src));
        assert!(emitted.len() > 5, "{src}: {emitted:?}");
        let text = read(&root.join(page));
        let events = section(&text, "### Events");
        assert!(
            !events.is_empty(),
            "{page} has no Events section under its Reference"
        );
        let documented = documented_reasons(&events);
        for reason in emitted.difference(&documented) {
            problems.push(format!(
                "{page}: Event reason {reason} ({src} emits it) is missing from the Events table"
            ));
        }
        for reason in documented.difference(&emitted) {
            problems.push(format!(
                "{page}: the Events table names {reason}, which {src} does not emit"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
