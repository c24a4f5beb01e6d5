//! Columns aligned as kubectl aligns them.

/// `rows` (the first is the header) with each column as wide as its widest
/// cell, three spaces apart; the last column is not padded.
pub(crate) fn render(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}   ", width = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_align() {
        let rows = vec![
            vec!["CLUSTER".into(), "ALLOWED".into(), "REASON".into()],
            vec!["member-eu-1".into(), "yes".into(), "running".into()],
        ];
        assert_eq!(
            super::render(&rows),
            "CLUSTER       ALLOWED   REASON\nmember-eu-1   yes       running\n"
        );
    }
}
