//! `myprobe report`: one trace with several collectors at once (on-CPU, off-CPU, lock waits and the
//! statements' digest), a thread snapshot at its end, and one self-contained HTML file of it all
//! (`html.rs`) with a few sentences naming the dominant costs (`findings.rs`).
//!
//! Each collector runs in a thread of its own, with its own BPF object, as its own command would; they start
//! together (tracing begins once every one is attached, `runner`) and all end at the same moment, when the main
//! thread stops their run. What they found is symbolized once, in the main thread, with one symbolizer.

pub mod chart;
pub mod findings;
pub mod html;
mod model;
pub mod past;

use std::{
    io::IsTerminal,
    sync::mpsc,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::{
    collect::{
        self,
        labels::Statement,
        unwind_store::{Stores, UnwindStore},
        CollectOptions, Collected, Kind, RingOptions, Stop,
    },
    process::{self, Target},
    profile::{
        self,
        stacks::{self, StackNamer, StackOptions},
        Profile,
    },
    query::digest::{Digest, DigestRow},
    query::follow::{FollowOptions, Followed},
    render::Palette,
    runner::{self, Plan},
    stacks::ThreadStack,
    symbolize::{data::DataSymbolizer, Symbolizer},
};

pub use model::{Past, PastIncident, ProfileSection, Report, Statements};

/// What to trace, and how.
pub struct Options {
    pub duration: Duration,
    /// On-CPU sampling frequency, Hz.
    pub frequency: u64,
    pub min_block_us: u64,
    /// The statements' tracing: its connection to the server (none: `--no-sql`), `--raw-sql`, `--btf`, memory.
    pub queries: FollowOptions,
    /// Rows of the digest and lock tables.
    pub top: usize,
    /// Where the unwind tables join those of the other servers traced at once (`--all`); `None`: tables of its own.
    pub unwind: Option<Arc<Stores>>,
}

/// What the collectors found, before symbolization.
struct Found {
    profiles: Vec<(Kind, Result<Collected>)>,
    statements: Result<(Digest, Followed)>,
    traced: Duration,
    started: std::time::SystemTime,
    tables: Option<Arc<UnwindStore>>,
}

/// Traces `target` with every collector at once for `o.duration` (or until Ctrl-C, or the server exits),
/// then reads its threads once, and puts the report together.
pub fn trace(target: &Target, o: &Options) -> Result<Report> {
    let mut symbolizer = Symbolizer::new(target.pid).context("preparing symbolization")?;
    symbolizer.preload(false);
    let mut lock_names =
        DataSymbolizer::new(target.pid).context("reading the process's memory map")?;
    let found = run_collectors(target, o)?;
    let ended = o.queries.stop.ended();
    say!("myprobe: tracing ended; reading the threads and writing the report");

    let mut missing = Vec::new();
    let mut collected = Vec::new();
    for (kind, result) in found.profiles {
        match result {
            Ok(c) => collected.push((kind, c)),
            Err(e) => not_traced(kind, &e, &mut missing),
        }
    }
    let statements = match found.statements {
        Ok((digest, followed)) => {
            followed.say_notes();
            Some(Statements {
                rows: digest.rows(),
                followed,
                graphs: Vec::new(),
            })
        }
        Err(e) => {
            not_traced(Kind::Statements, &e, &mut missing);
            None
        }
    };
    if collected.is_empty() && statements.is_none() {
        anyhow::bail!("nothing could be traced: {}", missing.join("; "));
    }
    let threads = snapshot(target, o, found.tables, &mut missing);
    let mut namer = StackNamer::new(
        &mut symbolizer,
        StackOptions {
            pid: target.pid,
            per_thread: false,
            addresses: false,
            by_statement: false,
        },
    );
    let mut profiles = Vec::new();
    let mut lock_table = Vec::new();
    for (kind, c) in &collected {
        let (profile, title, palette) = match kind {
            Kind::Cpu => (
                stacks::on_cpu(c, &mut namer),
                format!("On-CPU: {target}, {} Hz", o.frequency),
                Palette::Hot,
            ),
            Kind::Offcpu => (
                stacks::off_cpu(c, &mut namer),
                format!("Off-CPU time (µs): {target}"),
                Palette::Io,
            ),
            _ => {
                let (profile, summaries) =
                    profile::locks::summarize(c, &mut namer, &mut lock_names);
                lock_table = summaries;
                let title = format!("Lock waits (µs), lock as root: {target}");
                (profile, title, Palette::Io)
            }
        };
        profiles.push(section(kind.name(), title, profile, c, palette)?);
    }
    let mut statements = statements;
    if let Some(s) = statements.as_mut() {
        s.graphs = statement_graphs(&s.rows, &collected, &mut namer)?;
    }
    let mut report = Report {
        target: target.to_string(),
        host: hostname(),
        started: rfc3339(found.started),
        traced: found.traced,
        profiles,
        statements,
        locks: lock_table,
        threads,
        missing,
        findings: Vec::new(),
        top: o.top,
    };
    report.findings = findings::findings(&report);
    say!(
        "myprobe: report put together in {} ms after tracing ended",
        ended.elapsed().as_millis()
    );
    Ok(report)
}

/// The most statements given flame graphs of their own.
const STATEMENT_GRAPHS: usize = 10;

/// The on-CPU and off-CPU flame graphs of each of the top statements (`rows`, those with samples), from the
/// samples labelled with their fingerprint.
fn statement_graphs(
    rows: &[DigestRow],
    collected: &[(Kind, Collected)],
    namer: &mut StackNamer,
) -> Result<Vec<(String, Vec<ProfileSection>)>> {
    let mut graphs = Vec::new();
    for row in rows.iter().take(STATEMENT_GRAPHS) {
        let mut sections = Vec::new();
        for (kind, c) in collected {
            let mine = Collected {
                rows: c
                    .rows
                    .iter()
                    .filter(|r| is_of(r, &row.fingerprint))
                    .cloned()
                    .collect(),
                columns: c.columns.clone(),
                ..Collected::default()
            };
            let (profile, title, palette, events) = match kind {
                Kind::Cpu => (
                    stacks::on_cpu(&mine, namer),
                    "On-CPU (samples)",
                    Palette::Hot,
                    "samples",
                ),
                Kind::Offcpu => (
                    stacks::off_cpu(&mine, namer),
                    "Off-CPU time (µs)",
                    Palette::Io,
                    "periods",
                ),
                _ => continue,
            };
            if profile.is_empty() {
                continue;
            }
            let events = mine.rows.iter().map(|r| mine.value(r, events)).sum();
            let title = format!("{title}: {}", row.fingerprint);
            sections.push(ProfileSection::drawn(
                kind.name(),
                title,
                profile,
                palette,
                events,
                Vec::new(),
            )?);
        }
        if !sections.is_empty() {
            graphs.push((row.fingerprint.clone(), sections));
        }
    }
    Ok(graphs)
}

/// Whether a row's samples were taken in a statement of this fingerprint.
fn is_of(row: &collect::Row, fingerprint: &str) -> bool {
    matches!(row.statement.as_deref(), Some(Statement::Running(s)) if &*s.fingerprint == fingerprint)
}

fn not_traced(kind: Kind, e: &anyhow::Error, missing: &mut Vec<String>) {
    let what = match kind {
        Kind::Cpu => "on-CPU profile",
        Kind::Offcpu => "off-CPU profile",
        other => other.label(),
    };
    say!("myprobe: warning: {what} not traced: {e:#}");
    missing.push(format!("{what}: not traced: {e:#}"));
}

/// Runs every collector until `o.duration` has passed since all that could attach did (or Ctrl-C, or the
/// server's exit), then ends them all at once.
fn run_collectors(target: &Target, o: &Options) -> Result<Found> {
    let (attached_tx, attached) = mpsc::channel();
    let plan = Plan {
        target,
        frequency: o.frequency,
        min_block_us: o.min_block_us,
        preempted_leaf_only: false,
        duty: None,
        // One progress line for all collectors, said here.
        statements: FollowOptions {
            ring: RingOptions::quiet(RingOptions::default().interval),
            ..o.queries.clone()
        },
        slices: None,
        attached: Some(attached_tx),
        stores: o.unwind.as_deref(),
        shared: Vec::new(),
        labels: Some(collect::labels::StatementLabels::new(
            crate::sessions::statements::StatementsInMemory::boxed(),
        )),
    };
    let stop = plan.stop().clone();
    // Before any collector starts: an error here must not leave them running.
    let prepared = runner::prepare(&plan)?;
    let started = std::time::SystemTime::now();
    let mut digest = Digest::default();
    let (profiles, statements, traced) = std::thread::scope(|s| {
        let running = runner::start(
            s,
            &plan,
            prepared.tables.as_ref(),
            prepared.functions,
            |r| digest.add(&r),
            |_| {},
        );
        // Tracing starts when every collector that could start is attached.
        let mut ready = Vec::new();
        while ready.len() < running.running() && !stop.is_stopped() {
            if let Ok(kind) = attached.recv_timeout(runner::ATTACH_POLL) {
                ready.push(kind);
            }
        }
        let mut traced = Duration::ZERO;
        // Nothing attached: what each collector said is the error, at once.
        if !ready.is_empty() {
            let names: Vec<String> = [Kind::Cpu, Kind::Offcpu, Kind::Locks, Kind::Statements]
                .into_iter()
                .filter(|k| ready.contains(k))
                .map(|k| match k {
                    Kind::Cpu => format!("on-CPU at {} Hz", o.frequency),
                    other => other.label().to_string(),
                })
                .collect();
            say!(
                "myprobe: tracing {target} with {} of {} collectors ({}) for {} s; Ctrl-C ends early",
                ready.len(),
                running.profiles.len() + 1,
                names.join(", "),
                o.duration.as_secs()
            );
            traced = wait(o.duration, &stop, target.pid);
        }
        stop.stop();
        let profiles: Vec<_> = (running.profiles.into_iter())
            .map(|(kind, h)| (kind, runner::joined(h, kind)))
            .collect();
        let followed = runner::joined(running.statements, Kind::Statements);
        (profiles, followed, traced)
    });
    Ok(Found {
        profiles,
        statements: statements.map(|f| (digest, f)),
        traced,
        started,
        tables: prepared.tables,
    })
}

/// Waits for `duration`, Ctrl-C or the exit of the traced process `pid`, showing progress; returns the time waited.
fn wait(duration: Duration, stop: &Stop, pid: u32) -> Duration {
    let started = Instant::now();
    let terminal = std::io::stderr().is_terminal();
    let mut said = started;
    while !stop.is_stopped() && started.elapsed() < duration {
        std::thread::sleep(
            Duration::from_millis(100).min(duration - started.elapsed().min(duration)),
        );
        if process::exited(pid) {
            say!("myprobe: the traced process (PID {pid}) exited: the report covers the time until then");
            break;
        }
        // A line every second on a terminal, every 5 s in a log.
        let every = if terminal { 1 } else { 5 };
        if said.elapsed() >= Duration::from_secs(every) {
            said = Instant::now();
            let line = format!(
                "myprobe: report: {}/{} s traced",
                started.elapsed().as_secs(),
                duration.as_secs()
            );
            if terminal {
                say_part!("\r{line}   ");
            } else {
                say!("{line}");
            }
        }
    }
    if terminal {
        say!();
    }
    started.elapsed()
}

/// The threads as tracing ends, with their statements; what fails is said and left out of the page.
fn snapshot(
    target: &Target,
    o: &Options,
    tables: Option<Arc<UnwindStore>>,
    missing: &mut Vec<String>,
) -> Vec<ThreadStack> {
    let opts = CollectOptions {
        duration: Duration::ZERO,
        unwind: tables,
        ..o.queries.collect_options(target.pid)
    };
    let snapshot = match collect::threads::snapshot(&opts) {
        Ok(s) if !s.threads.is_empty() && !process::exited(target.pid) => s,
        Ok(_) => {
            missing.push("threads: the server exited before they could be read".into());
            return Vec::new();
        }
        Err(e) => {
            say!("myprobe: warning: threads not read: {e:#}");
            missing.push(format!("threads: not read: {e:#}"));
            return Vec::new();
        }
    };
    let wait_begins = crate::query::follow::wait_begins(true, target);
    let mut named = crate::stacks::name_threads(target.pid, &snapshot.threads, &wait_begins);
    if let Some(connect) = &o.queries.connect {
        match crate::stacks::statements(connect, target.pid, &target.binary) {
            Ok(word) => word.name(&mut named),
            Err(e) => {
                say!("myprobe: threads shown without their statements: the server did not answer: {e:#}");
                missing.push(format!(
                    "threads' statements: the server did not answer: {e:#}"
                ));
            }
        }
    }
    named
}

fn section(
    id: &'static str,
    title: String,
    profile: Profile,
    collected: &Collected,
    palette: Palette,
) -> Result<ProfileSection> {
    ProfileSection::drawn(
        id,
        title,
        profile,
        palette,
        collected.events,
        collected.lost.report(collected.events),
    )
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// A time as `2026-11-25T10:04:05Z`.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let ns = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i128 * 1_000_000_000)
        .unwrap_or(0);
    let micros = crate::query::format_ts(ns);
    // Whole seconds: `.000000Z` → `Z`.
    match micros.split_once('.') {
        Some((secs, _)) => format!("{secs}Z"),
        None => micros,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_in_rfc3339() {
        let at = |s| rfc3339(std::time::UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_795_000_000), "2026-11-18T11:06:40Z");
    }
}
