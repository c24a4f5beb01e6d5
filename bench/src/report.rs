//! The Markdown report (`BENCHMARKS.md`) and the table printed at the end.

use std::fmt::Write as _;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Met,
    Missed,
    /// Could not be measured here (the reason is in the figure).
    Blocked,
}

impl Status {
    pub(crate) fn from_bool(met: bool) -> Status {
        if met { Status::Met } else { Status::Missed }
    }

    fn word(self) -> &'static str {
        match self {
            Status::Met => "met",
            Status::Missed => "**not met**",
            Status::Blocked => "not measurable here",
        }
    }
}

#[derive(Debug, Clone)]
struct Target {
    what: String,
    figure: String,
    status: Status,
}

#[derive(Debug, Default)]
pub(crate) struct Report {
    header: Vec<String>,
    sections: Vec<String>,
    targets: Vec<Target>,
    notes: Vec<String>,
}

impl Report {
    /// A line of the header (machine, versions, command).
    pub(crate) fn header(&mut self, line: impl Into<String>) {
        self.header.push(line.into());
    }

    pub(crate) fn section(&mut self, markdown: String) {
        println!("{markdown}");
        self.sections.push(markdown);
    }

    pub(crate) fn target(
        &mut self,
        what: impl Into<String>,
        figure: impl Into<String>,
        status: Status,
    ) {
        let t = Target {
            what: what.into(),
            figure: figure.into(),
            status,
        };
        eprintln!("target: {} -> {} ({})", t.what, t.figure, t.status.word());
        self.targets.push(t);
    }

    pub(crate) fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    pub(crate) fn render(&self, title_note: &str) -> String {
        let mut md = String::new();
        md.push_str("# Benchmarks\n\n");
        md.push_str(
            "Written by `scripts/bench` (crate `bench/`); do not edit by hand, run it again.\n\n",
        );
        if !title_note.is_empty() {
            let _ = writeln!(md, "{title_note}\n");
        }
        for line in &self.header {
            let _ = writeln!(md, "- {line}");
        }
        md.push('\n');
        for section in &self.sections {
            md.push_str(section);
            md.push('\n');
        }
        md.push_str("## Targets\n\n| target | measured | verdict |\n|---|---|---|\n");
        for t in &self.targets {
            let _ = writeln!(md, "| {} | {} | {} |", t.what, t.figure, t.status.word());
        }
        if !self.notes.is_empty() {
            md.push_str("\n## Notes\n\n");
            for n in &self.notes {
                let _ = writeln!(md, "- {n}");
            }
        }
        md
    }
}

/// Milliseconds with a precision that suits the value.
pub(crate) fn fmt_ms(ms: f64) -> String {
    if ms.is_nan() {
        "n/a".to_owned()
    } else if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

/// A ratio as a percentage (`"%"`) or a multiple (`"x"`).
pub(crate) fn fmt_ratio(r: f64, unit: &str) -> String {
    if r.is_nan() || r.is_infinite() {
        return "n/a".to_owned();
    }
    match unit {
        "%" => format!("{:.0}%", r * 100.0),
        _ => format!("{r:.2}x"),
    }
}

/// A count with thousands separators (`100,000`).
pub(crate) fn fmt_count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::fmt_count;

    #[test]
    fn counts_get_thousands_separators() {
        assert_eq!(fmt_count(0), "0");
        assert_eq!(fmt_count(999), "999");
        assert_eq!(fmt_count(1000), "1,000");
        assert_eq!(fmt_count(100_000), "100,000");
        assert_eq!(fmt_count(1_234_567), "1,234,567");
    }
}
