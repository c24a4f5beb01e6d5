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

mod commands;
mod relative_links;
mod tables;

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
