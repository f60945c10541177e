//! CSV in and out, the output checks of `--quick`, and Markdown tables for summary.md.

use std::path::Path;

use anyhow::{anyhow, bail, Context};
use serde::Serialize;

/// A CSV file read whole: header and rows of strings.
#[derive(Debug, Clone)]
pub struct Table {
    /// Column names.
    pub header: Vec<String>,
    /// Rows, each as long as the header.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// Reads `path`.
    ///
    /// # Errors
    /// Unreadable file, malformed CSV.
    pub fn read(path: &Path) -> anyhow::Result<Table> {
        let mut r =
            csv::Reader::from_path(path).with_context(|| format!("reading {}", path.display()))?;
        let header = r.headers()?.iter().map(str::to_string).collect();
        let rows = r
            .records()
            .map(|rec| rec.map(|r| r.iter().map(str::to_string).collect()))
            .collect::<Result<_, _>>()
            .with_context(|| format!("parsing {}", path.display()))?;
        Ok(Table { header, rows })
    }

    /// Index of column `name`.
    ///
    /// # Errors
    /// No such column.
    pub fn col(&self, name: &str) -> anyhow::Result<usize> {
        self.header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| anyhow!("no column {name:?} (columns: {})", self.header.join(", ")))
    }

    /// Column `name` as numbers.
    ///
    /// # Errors
    /// No such column, or a cell that is not a number.
    pub fn f64s(&self, name: &str) -> anyhow::Result<Vec<f64>> {
        let c = self.col(name)?;
        self.rows
            .iter()
            .map(|r| {
                r[c].parse::<f64>()
                    .map_err(|_| anyhow!("column {name:?}: {:?} is not a number", r[c]))
            })
            .collect()
    }
}

/// Writes `rows` as CSV and checks the file as [`check_csv`] does: every driver's CSV goes
/// through here.
///
/// # Errors
/// The file cannot be written, or the check fails.
pub fn write_checked_csv<T: Serialize>(
    path: &Path,
    rows: &[T],
    numeric: &[&str],
    text: &[&str],
) -> anyhow::Result<()> {
    write_csv(path, rows)?;
    check_csv(path, numeric, text)
}

/// Writes `rows` as CSV (header from the struct's field names).
///
/// # Errors
/// The file cannot be written.
fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> anyhow::Result<()> {
    let mut w =
        csv::Writer::from_path(path).with_context(|| format!("writing {}", path.display()))?;
    for r in rows {
        w.serialize(r)?;
    }
    w.flush()?;
    Ok(())
}

/// The `--quick` check of a CSV: at least one row, every column of `numeric` present with
/// finite numbers only, every column of `text` present.
///
/// # Errors
/// What is missing or not finite, with the file's name.
fn check_csv(path: &Path, numeric: &[&str], text: &[&str]) -> anyhow::Result<()> {
    let t = Table::read(path)?;
    let ctx = || format!("check of {}", path.display());
    if t.rows.is_empty() {
        bail!("{}: no rows", ctx());
    }
    for name in text {
        t.col(name).with_context(ctx)?;
    }
    for name in numeric {
        let v = t.f64s(name).with_context(ctx)?;
        if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            bail!("{}: column {name:?} row {} is {x}", ctx(), i + 1);
        }
    }
    Ok(())
}

/// A Markdown table; `|` inside a cell (as in |λ₂|) is escaped.
pub fn markdown(header: &[&str], rows: &[Vec<String>]) -> String {
    let row = |cells: &mut dyn Iterator<Item = &str>| {
        let cells: Vec<String> = cells.map(|c| c.replace('|', "\\|")).collect();
        format!("| {} |\n", cells.join(" | "))
    };
    let mut s = row(&mut header.iter().copied());
    s += &format!("|{}\n", "---|".repeat(header.len()));
    for r in rows {
        s += &row(&mut r.iter().map(String::as_str));
    }
    s
}

/// Mean and sample standard deviation (0 for one value).
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (m, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Row {
        name: String,
        x: f64,
    }

    #[test]
    fn check_catches_missing_columns_and_non_finite_values() {
        let dir = std::env::temp_dir().join(format!("murmur-table-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.csv");
        write_csv(
            &p,
            &[
                Row {
                    name: "a".into(),
                    x: 1.5,
                },
                Row {
                    name: "b".into(),
                    x: 2.0,
                },
            ],
        )
        .unwrap();
        check_csv(&p, &["x"], &["name"]).unwrap();
        assert_eq!(Table::read(&p).unwrap().f64s("x").unwrap(), vec![1.5, 2.0]);
        assert!(check_csv(&p, &["y"], &[]).is_err());
        assert!(check_csv(&p, &["name"], &[]).is_err());
        write_csv(
            &p,
            &[Row {
                name: "a".into(),
                x: f64::NAN,
            }],
        )
        .unwrap();
        assert!(check_csv(&p, &["x"], &[]).is_err());
        write_csv::<Row>(&p, &[]).unwrap();
        assert!(check_csv(&p, &[], &[]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn markdown_escapes_pipes_in_cells() {
        let t = markdown(&["a", "|λ₂|"], &[vec!["1".into(), "|x|".into()]]);
        assert_eq!(t, "| a | \\|λ₂\\| |\n|---|---|\n| 1 | \\|x\\| |\n");
    }

    #[test]
    fn mean_and_spread() {
        let (m, s) = mean_sd(&[1.0, 2.0, 3.0]);
        assert!((m - 2.0).abs() < 1e-12 && (s - 1.0).abs() < 1e-12);
        assert_eq!(mean_sd(&[4.0]), (4.0, 0.0));
    }
}
