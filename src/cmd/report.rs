//! `myprobe report`: trace once with every collector, write one self-contained HTML file.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::{collect::unwind_store::Stores, report};

#[derive(Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub target: crate::cmd::TargetArgs,
    /// Tracing duration in seconds (Ctrl-C ends early and still writes the report)
    #[arg(short = 'd', long = "duration", default_value_t = 30)]
    pub duration: u64,
    /// The HTML file to write
    #[arg(short = 'o', long = "output", default_value = "report.html")]
    pub output: PathBuf,
    /// On-CPU sampling frequency per CPU, in Hz
    #[arg(short = 'F', long = "frequency", default_value_t = 99)]
    pub frequency: u64,
    /// Ignore off-CPU periods shorter than this many microseconds
    #[arg(long, default_value_t = 1)]
    pub min_block_us: u64,
    /// Rows of the statement and lock tables
    #[arg(long, default_value_t = 50)]
    pub top: usize,
    /// Of several servers running, trace every one at once, each into a file of its own (`report-PID.html`);
    /// without it, the busiest is traced
    #[arg(long, conflicts_with = "pid")]
    pub all: bool,
    #[command(flatten)]
    pub sql: crate::cmd::SqlArgs,
}

pub fn run(a: ReportArgs) -> Result<()> {
    anyhow::ensure!(a.duration > 0, "-d must be at least 1 second");
    anyhow::ensure!(
        (1..=10_000).contains(&a.frequency),
        "-F must be between 1 and 10000 Hz"
    );
    // Checked before tracing: a report that cannot be written is said at once, not after 30 s.
    let parent = a.output.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(dir) = parent.filter(|d| !d.is_dir()) {
        bail!(
            "cannot create {}: {} is not a directory",
            a.output.display(),
            dir.display()
        );
    }
    let targets = a.target.servers_to_read(a.all)?;
    if let [target] = targets.as_slice() {
        return report_of(&a, target, &a.output, None);
    }
    // Each server's report in a thread of its own, traced over the same time, servers of the same code with one
    // copy of its unwind tables.
    let a = &a;
    let stores = Arc::new(Stores::default());
    let failed: Vec<String> = std::thread::scope(|s| {
        let running: Vec<_> = targets
            .iter()
            .map(|t| {
                let output = crate::cmd::per_server(&a.output, t.pid);
                let stores = Arc::clone(&stores);
                (t, s.spawn(move || report_of(a, t, &output, Some(stores))))
            })
            .collect();
        running
            .into_iter()
            .filter_map(|(t, r)| match r.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("{t}: {e:#}")),
                Err(_) => Some(format!("{t}: its report panicked")),
            })
            .collect()
    });
    if !failed.is_empty() {
        bail!("no report of {}", failed.join("; "));
    }
    Ok(())
}

/// Traces `target` and writes its report to `output`.
fn report_of(
    a: &ReportArgs,
    target: &crate::process::Target,
    output: &Path,
    unwind: Option<Arc<Stores>>,
) -> Result<()> {
    let options = report::Options {
        duration: Duration::from_secs(a.duration),
        frequency: a.frequency,
        min_block_us: a.min_block_us,
        top: a.top,
        queries: a.sql.clone().follow_options(&a.target),
        unwind,
    };
    let r = report::trace(target, &options)?;
    let page = report::html::render(&r);
    std::fs::write(output, &page).with_context(|| format!("writing {}", output.display()))?;
    say!(
        "myprobe: wrote {} ({} KiB); results written in {} ms after tracing ended",
        output.display(),
        page.len() / 1024,
        options.queries.stop.ended().elapsed().as_millis()
    );
    for f in &r.findings {
        say!("  {f}");
    }
    Ok(())
}
