//! The metrics and Events tables name every metric and Event reason the
//! binaries emit, and no other.

use super::*;

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
/// metrics each binary registers (its own, the endpoint crate's and the
/// engine's: placement-sync asks OPA only, so of the engine's it exports the
/// decision cache's).
#[test]
fn the_metrics_tables_name_every_metric_and_no_other() {
    let root = placement_tests::repo_root();
    let endpoint = registered_metrics(&root.join("endpoint/src/metrics.rs"));
    assert!(endpoint.contains("connections_open"), "{endpoint:?}");
    let engine = registered_metrics(&root.join("policy-client/src/engine_metrics.rs"));
    assert!(engine.contains("decision_cache_hits"), "{engine:?}");
    let decision_cache: BTreeSet<String> = engine
        .iter()
        .filter(|name| name.starts_with("decision_cache_"))
        .cloned()
        .collect();
    let mut problems = Vec::new();
    for (page, source, prefix, engine) in [
        (
            "docs/webhook.md",
            "webhook/src/metrics.rs",
            "placement_webhook_",
            &engine,
        ),
        (
            "docs/sync.md",
            "sync-sidecar/src/metrics.rs",
            "placement_sync_",
            &decision_cache,
        ),
    ] {
        let registered = &(&registered_metrics(&root.join(source)) | &endpoint) | engine;
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
