//! Live progress of a long run on a terminal (indicatif), with plain lines when stderr is
//! not a terminal (CI, logs): the one bar style of `launch` and `simulate`.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps named `unit` (e.g. `epoch`, `round`), with the elapsed time, the
/// time left (indicatif's estimate from the steps' rate) and a message. indicatif hides it
/// when stderr is not a terminal.
pub(crate) fn bar(len: u64, unit: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} {unit} {{pos}}/{{len}} [{{bar:30}}] {{elapsed_precise}}, ~{{eta}} left {{msg}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
}

/// A bar of `total` bytes to move (the data plane's benchmarks): bytes so far, the rate and
/// the time left; hidden when stderr is not a terminal.
pub(crate) fn bytes_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} {what} {{bytes}}/{{total_bytes}} [{{bar:30}}] {{bytes_per_sec}}, ~{{eta}} left"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
}

/// Prints `line` on standard output: above `bar` while it is drawn, plainly when it is
/// hidden (the table must show either way).
pub(crate) fn print(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        println!("{line}");
    } else {
        bar.println(line);
    }
}
