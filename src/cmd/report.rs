//! `myprobe report`: trace once with every collector, write one self-contained HTML file.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::{collect::unwind_store::Stores, history::time, report};

/// The options of tracing a server now, which a past range (`--from`) does not take.
const LIVE: [&str; 19] = [
    "pid",
    "any_process",
    "btf",
    "max_kernel_mem",
    "duration",
    "frequency",
    "min_block_us",
    "top",
    "all",
    "raw_sql",
    "no_sql",
    "socket",
    "host",
    "port",
    "user",
    "password_file",
    "defaults_file",
    "connect_timeout",
    "password_on_command_line",
];

/// Where the agent keeps its windows and history unless told otherwise (`agent --dir`).
const AGENT_DIR: &str = "/var/lib/myprobe";

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
    /// Trace nothing: write the report of a past range, from what the agent kept in --dir (its session history and
    /// flame-graph windows). Its start: 03:10 (the last such time of day), -2h (before now), an ISO date
    /// (2026-12-06T03:10:00Z) or now
    #[arg(long, value_name = "TIME", allow_hyphen_values = true, conflicts_with_all = LIVE)]
    pub from: Option<String>,
    /// The end of the past range, as --from (default: now)
    #[arg(
        long,
        value_name = "TIME",
        allow_hyphen_values = true,
        requires = "from"
    )]
    pub to: Option<String>,
    /// With --from: the agent's directory [default: /var/lib/myprobe]
    #[arg(long, value_name = "DIR", requires = "from")]
    pub dir: Option<PathBuf>,
}

/// A conflict between a past range and the options of tracing now, with what to do in a tip.
pub fn explain_conflict(e: &mut clap::Error) {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let text = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => s.clone(),
        Some(ContextValue::Strings(v)) => v.join(" "),
        Some(ContextValue::StyledStr(s)) => s.to_string(),
        _ => String::new(),
    };
    let usage = text(ContextKind::Usage);
    let args = format!(
        "{} {}",
        text(ContextKind::InvalidArg),
        text(ContextKind::PriorArg)
    );
    let past = args
        .split_whitespace()
        .any(|a| ["--from", "--to", "--dir"].contains(&a));
    if e.kind() == ErrorKind::ArgumentConflict && usage.contains("myprobe report") && past {
        e.insert(
            ContextKind::Suggested,
            ContextValue::StyledStrs(vec![
                "--from/--to write the report of a past range from the agent's files (--dir) and trace nothing: \
                 leave out the tracing options (-p, -d, -F, --all, --top, the connection's), or leave out \
                 --from/--to to trace the server now"
                    .into(),
            ]),
        );
    }
}

/// Fails at once when the report could not be written: said before tracing, not after 30 s.
fn check_output(output: &Path) -> Result<()> {
    let parent = output.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(dir) = parent.filter(|d| !d.is_dir()) {
        bail!(
            "cannot create {}: {} is not a directory",
            output.display(),
            dir.display()
        );
    }
    Ok(())
}

/// The report of a past range, from the agent's directory.
fn past(a: &ReportArgs, from: &str) -> Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let from = time::parse(from, now).context("--from")?;
    let to = match &a.to {
        Some(t) => time::parse(t, now).context("--to")?,
        None => now,
    };
    anyhow::ensure!(
        from < to,
        "--from ({}) is not before --to ({})",
        time::format(from),
        time::format(to)
    );
    check_output(&a.output)?;
    let options = report::past::Options {
        dir: a.dir.clone().unwrap_or_else(|| AGENT_DIR.into()),
        from,
        to,
        points: 120,
        moments: 3,
    };
    let p = report::past::read(&options)?;
    for m in &p.missing {
        say!("myprobe: not in the report: {m}");
    }
    let page = report::html::render_past(&p);
    std::fs::write(&a.output, &page).with_context(|| format!("writing {}", a.output.display()))?;
    say!(
        "myprobe: wrote {} ({} KiB): {} to {}, {} flame-graph windows",
        a.output.display(),
        page.len() / 1024,
        time::format(from),
        time::format(to),
        p.windows
    );
    for f in &p.findings {
        say!("  {f}");
    }
    Ok(())
}

pub fn run(a: ReportArgs) -> Result<()> {
    if let Some(from) = &a.from {
        return past(&a, from);
    }
    anyhow::ensure!(a.duration > 0, "-d must be at least 1 second");
    anyhow::ensure!(
        (1..=10_000).contains(&a.frequency),
        "-F must be between 1 and 10000 Hz"
    );
    check_output(&a.output)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    #[command(name = "myprobe")]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Report(ReportArgs),
    }

    fn parse(args: &[&str]) -> Result<ReportArgs, clap::Error> {
        <Cli as clap::Parser>::try_parse_from([&["myprobe", "report"], args].concat()).map(|c| {
            let Command::Report(a) = c.command;
            a
        })
    }

    #[test]
    fn a_past_range_takes_no_tracing_option() {
        let a = parse(&["--from", "-2h", "--to", "-1h", "--dir", "/tmp/x"]).unwrap();
        assert_eq!(a.from.as_deref(), Some("-2h"));
        assert_eq!(a.to.as_deref(), Some("-1h"));
        assert!(parse(&["--from", "03:10"]).unwrap().dir.is_none());
        // Tracing now, as before.
        assert!(parse(&["-p", "1", "-d", "5"]).unwrap().from.is_none());
        assert!(parse(&["--to", "now"]).is_err());
        assert!(parse(&["--dir", "/tmp"]).is_err());
        for live in [
            &["-p", "1"][..],
            &["-d", "5"],
            &["-F", "49"],
            &["--all"],
            &["--socket", "/tmp/s"],
            &["--top", "5"],
        ] {
            let mut e = parse(&[&["--from", "-1h"], live].concat()).err().unwrap();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{live:?}"
            );
            explain_conflict(&mut e);
            let text = e.render().to_string();
            assert!(
                text.contains("tip: --from/--to write the report of a past range"),
                "{live:?}: {text}"
            );
        }
    }
}
