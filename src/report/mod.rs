//! `myprobe report`: one trace with several collectors at once (on-CPU, off-CPU, lock waits and the
//! statements' digest), a thread snapshot at its end, and one self-contained HTML file of it all
//! (`html.rs`) with a few sentences naming the dominant costs (`findings.rs`).
//!
//! Each collector runs in a thread of its own, with its own BPF object, as its own command would; they start
//! together (tracing begins once every one is attached) and all end at the same moment, when the main thread
//! sets [`collect::STOP`]. What they found is symbolized once, in the main thread, with one symbolizer.

pub mod findings;
pub mod html;

use std::{
    cell::RefCell,
    io::IsTerminal,
    sync::{atomic::Ordering, mpsc},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::{
    collect::{self, CollectOptions, Collected},
    process::{self, Target},
    profile::{
        self,
        locks::LockSummary,
        stacks::{self, StackNamer, StackOptions},
        Profile,
    },
    query::digest::{Digest, DigestRow},
    query::follow::{self, FollowOptions, Followed},
    render::{self, Palette, RenderOptions},
    stacks::ThreadStack,
    symbolize::{data::DataSymbolizer, Symbolizer},
    unwind::ProcessTables,
};

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
}

/// A flame graph of the report.
pub struct ProfileSection {
    /// `cpu`, `offcpu`, `locks`: also the id of its place in the page.
    pub id: &'static str,
    pub title: String,
    pub profile: Profile,
    /// inferno's SVG, whole.
    pub svg: String,
    pub events: u64,
    pub lost: Vec<String>,
}

/// The statements' part of the report.
pub struct Statements {
    pub rows: Vec<DigestRow>,
    pub followed: Followed,
}

/// Everything the page shows.
pub struct Report {
    pub target: String,
    pub host: String,
    /// When tracing began, UTC, RFC 3339.
    pub started: String,
    pub traced: Duration,
    pub profiles: Vec<ProfileSection>,
    pub statements: Option<Statements>,
    pub locks: Vec<LockSummary>,
    pub threads: Vec<ThreadStack>,
    /// What could not be traced or shown, and why (a collector's error, the server's process list).
    pub missing: Vec<String>,
    pub findings: Vec<String>,
    pub top: usize,
}

/// What the collector threads found, before symbolization.
#[derive(Default)]
struct Found {
    cpu: Option<Result<Collected>>,
    offcpu: Option<Result<Collected>>,
    locks: Option<Result<Collected>>,
    statements: Option<Result<(Digest, Followed)>>,
}

/// The number of collectors [`trace`] runs at once.
const COLLECTORS: usize = 4;

/// Traces `target` with every collector at once for `o.duration` (or until Ctrl-C, or the server exits),
/// then reads its threads once, and puts the report together.
pub fn trace(target: &Target, o: &Options) -> Result<Report> {
    collect::install_stop_handler();
    // One progress line for all collectors, said here.
    collect::ring::SHOW_PROGRESS.store(false, Ordering::Relaxed);
    collect::ring::SAY_EXIT.store(false, Ordering::Relaxed);
    // The unwind tables are read once and copied into each collector's maps.
    let tables = ProcessTables::for_tracing(target.pid, false)?.map(RefCell::into_inner);
    let mut symbolizer = Symbolizer::new(target.pid).context("preparing symbolization")?;
    symbolizer.preload(false);
    let mut lock_names =
        DataSymbolizer::new(target.pid).context("reading the process's memory map")?;
    let options = |attached: &mpsc::Sender<&'static str>| CollectOptions {
        pid: target.pid,
        // Ended by the main thread, for all collectors at once.
        duration: Duration::MAX,
        kernel_stacks: false,
        btf: o.queries.btf.clone(),
        unwind: tables.clone().map(RefCell::new),
        max_kernel_mem: o.queries.max_kernel_mem_mib.saturating_mul(1 << 20),
        announce: String::new(),
        attached: Some(attached.clone()),
        slices: None,
        duty: None,
    };
    // Before any collector starts: an error here must not leave them running.
    let functions = follow::server_functions(o.queries.uprobes, target)?;
    let (tx, attached) = mpsc::channel::<&'static str>();
    let mut found = Found::default();
    let started_at = std::time::SystemTime::now();
    let mut traced = Duration::ZERO;
    std::thread::scope(|s| -> Result<()> {
        let (cpu_opts, offcpu_opts, locks_opts) = (options(&tx), options(&tx), options(&tx));
        let cpu = s.spawn(move || collect::cpu::collect(&cpu_opts, o.frequency));
        let offcpu = s.spawn(move || {
            let offcpu = collect::offcpu::Options {
                min_block_us: o.min_block_us,
                ..Default::default()
            };
            collect::offcpu::collect(&offcpu_opts, offcpu).map(|(c, _)| c)
        });
        let locks = s.spawn(move || collect::locks::collect(&locks_opts));
        let statements_tx = tx.clone();
        let statements = s.spawn(move || {
            let mut digest = Digest::default();
            let attached = || {
                let _ = statements_tx.send("queries");
            };
            follow::follow(
                &o.queries,
                target,
                functions,
                attached,
                |r| digest.add(&r),
                |_| {},
            )
            .map(|f| (digest, f))
        });
        drop(tx);
        let running = || {
            [
                cpu.is_finished(),
                offcpu.is_finished(),
                locks.is_finished(),
                statements.is_finished(),
            ]
            .iter()
            .filter(|&&f| !f)
            .count()
        };
        // Tracing starts when every collector that could start is attached.
        let mut ready = 0;
        while ready < running() && !collect::STOP.load(Ordering::SeqCst) {
            if let Ok(_name) = attached.recv_timeout(Duration::from_millis(100)) {
                ready += 1;
            }
        }
        // Nothing attached: what each collector said is the error, at once.
        if ready > 0 {
            say!(
                "myprobe: tracing {target} with {ready} of {COLLECTORS} collectors (on-CPU at {} Hz, off-CPU, \
                 lock waits, statements) for {} s; Ctrl-C ends early",
                o.frequency,
                o.duration.as_secs()
            );
            traced = wait(o.duration);
        }
        collect::STOP.store(true, Ordering::SeqCst);
        let join = |h: std::thread::ScopedJoinHandle<'_, Result<Collected>>| {
            h.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the collector panicked")))
        };
        found.cpu = Some(join(cpu));
        found.offcpu = Some(join(offcpu));
        found.locks = Some(join(locks));
        found.statements = Some(
            statements
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the statements' tracer panicked"))),
        );
        Ok(())
    })?;
    let ended = collect::tracing_ended();
    say!("myprobe: tracing ended; reading the threads and writing the report");

    let mut missing = Vec::new();
    let mut take = |what: &str, r: Option<Result<Collected>>| match r {
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            say!("myprobe: warning: {what} not traced: {e:#}");
            missing.push(format!("{what}: not traced: {e:#}"));
            None
        }
        None => None,
    };
    let cpu = take("on-CPU profile", found.cpu);
    let offcpu = take("off-CPU profile", found.offcpu);
    let locks = take("lock waits", found.locks);
    let statements = match found.statements {
        Some(Ok((digest, followed))) => {
            followed.say_notes();
            Some(Statements {
                rows: digest.rows(),
                followed,
            })
        }
        Some(Err(e)) => {
            say!("myprobe: warning: statements not traced: {e:#}");
            missing.push(format!("statements: not traced: {e:#}"));
            None
        }
        None => None,
    };

    if cpu.is_none() && offcpu.is_none() && locks.is_none() && statements.is_none() {
        anyhow::bail!("nothing could be traced: {}", missing.join("; "));
    }
    let threads = snapshot(target, o, tables, &mut missing);

    let mut namer = StackNamer::new(
        &mut symbolizer,
        StackOptions {
            pid: target.pid,
            per_thread: false,
            addresses: false,
        },
    );
    let mut profiles = Vec::new();
    if let Some(c) = &cpu {
        let profile = stacks::on_cpu(c, &mut namer);
        let title = format!("On-CPU: {target}, {} Hz", o.frequency);
        profiles.push(section("cpu", title, profile, c, Palette::Hot)?);
    }
    if let Some(c) = &offcpu {
        let profile = stacks::off_cpu(c, &mut namer);
        let title = format!("Off-CPU time (µs): {target}");
        profiles.push(section("offcpu", title, profile, c, Palette::Io)?);
    }
    let mut lock_table = Vec::new();
    if let Some(c) = &locks {
        let (profile, summaries) = profile::locks::summarize(c, &mut namer, &mut lock_names);
        lock_table = summaries;
        let title = format!("Lock waits (µs), lock as root: {target}");
        profiles.push(section("locks", title, profile, c, Palette::Io)?);
    }
    let mut report = Report {
        target: target.to_string(),
        host: hostname(),
        started: rfc3339(started_at),
        traced,
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

/// Waits for `duration`, Ctrl-C or the traced process's exit, showing progress; returns the time waited.
fn wait(duration: Duration) -> Duration {
    let started = Instant::now();
    let terminal = std::io::stderr().is_terminal();
    let mut said = started;
    while !collect::STOP.load(Ordering::SeqCst) && started.elapsed() < duration {
        std::thread::sleep(
            Duration::from_millis(100).min(duration - started.elapsed().min(duration)),
        );
        if let Some(pid) = process::target_exited() {
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
    tables: Option<ProcessTables>,
    missing: &mut Vec<String>,
) -> Vec<ThreadStack> {
    let opts = CollectOptions {
        pid: target.pid,
        duration: Duration::ZERO,
        kernel_stacks: false,
        btf: o.queries.btf.clone(),
        unwind: tables.map(RefCell::new),
        max_kernel_mem: o.queries.max_kernel_mem_mib.saturating_mul(1 << 20),
        announce: String::new(),
        attached: None,
        slices: None,
        duty: None,
    };
    let snapshot = match collect::threads::snapshot(&opts) {
        Ok(s) if !s.threads.is_empty() && process::target_exited().is_none() => s,
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
    let mut named = crate::stacks::name_threads(target.pid, &snapshot.threads);
    if let Some(connect) = &o.queries.connect {
        match crate::stacks::statements(connect, target.pid) {
            Ok(statements) => {
                for t in &mut named {
                    t.statement = statements.get(&t.tid).cloned();
                }
            }
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
    let opts = RenderOptions {
        title: title.clone(),
        palette,
        ..RenderOptions::default()
    };
    let mut svg = Vec::new();
    if !profile.is_empty() {
        render::svg(&profile, &opts, &mut svg)
            .with_context(|| format!("drawing the {id} flame graph"))?;
    }
    Ok(ProfileSection {
        id,
        title,
        svg: String::from_utf8_lossy(&svg).into_owned(),
        events: collected.events,
        lost: collected.lost.report(collected.events),
        profile,
    })
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
