//! Progress bars of the long commands (`convert`, `perplexity`, `bench`), drawn on stderr
//! by indicatif only when stderr is a terminal, so that piped and `--json` output stays
//! clean.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps named `unit` ("tensors", "windows", "runs"), with a message after
/// the count, the time spent and the time left; `len` may be set later (0 until known).
pub fn bar(len: u64, unit: &str) -> Result<ProgressBar> {
    let template =
        format!("{{bar:40}} {{pos}}/{{len}} {unit} {{msg}} [{{elapsed_precise}}, eta {{eta}}]");
    let style = ProgressStyle::with_template(&template).context("progress bar template")?;
    Ok(ProgressBar::new(len).with_style(style))
}
