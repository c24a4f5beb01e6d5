//! Links: every relative link and anchor resolves (with GitHub's slugs),
//! and the README links every reference page and keeps the two commands.

use super::*;

/// The two commands of the README (a project contract, verbatim).
const RUN_COMMAND: &str = "cargo run --release -p placement-webhook -- serve";

const TEST_COMMAND: &str = "scripts/test";

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
