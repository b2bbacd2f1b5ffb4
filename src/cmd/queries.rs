//! `myprobe queries`: one record per statement with its time broken down, as lines, JSON, or a digest.

use std::{
    io::{BufWriter, Write},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::{
    client::ConnectArgs,
    query::{
        digest::Digest,
        follow::{self, FollowOptions, Followed, SampleEvery, AUTO_CPU_PER_MILLE},
        QueryRecord,
    },
    render::queries as render,
};

#[derive(Args, Clone)]
pub struct QueriesArgs {
    #[command(flatten)]
    pub target: crate::cmd::TargetArgs,
    /// Tracing duration in seconds [default: until Ctrl-C]
    #[arg(short = 'd', long = "duration")]
    pub duration: Option<u64>,
    /// Report only statements that took at least this long (milliseconds, fractions allowed)
    #[arg(long, value_name = "N", default_value_t = 0.0)]
    pub min_ms: f64,
    /// One JSON object per line on stdout (fields: see ARCHITECTURE.md "Query records"), nothing else
    #[arg(long)]
    pub json: bool,
    /// Instead of one line per statement, print a digest per fingerprint at the end (pt-query-digest's table):
    /// count, total, p50/p95/p99/max latency and each part's share of the time (adding up to 100%), then a
    /// sentence per top fingerprint naming its dominant part and where it waits
    #[arg(long)]
    pub summary: bool,
    /// Rows of the digest table
    #[arg(long, default_value_t = 30)]
    pub top: usize,
    /// Show query text with its literals (they can hold passwords); by default literals are replaced by `?`
    #[arg(long)]
    pub raw_sql: bool,
    /// Follow statements through uprobes on the server's dispatch_command from the start, for TLS connections
    /// opened before tracing (a TLS handshake seen while tracing turns them on by itself)
    #[arg(long)]
    pub uprobes: bool,
    /// Walk the stacks of lock waits (for their site) by frame pointers only, without loading the process's
    /// .eh_frame tables into the kernel
    #[arg(long)]
    pub frame_pointers: bool,
    /// Do not record where lock waits happen (`lock_site`): no stack is taken at a statement's longest lock
    /// wait, and no unwind tables are loaded (less memory, a quicker start)
    #[arg(long)]
    pub no_wait_sites: bool,
    /// Split a statement's time on a CPU inside syscalls out of `user`: into the syscall's part (net, read,
    /// write, sync, lock) or `sys`; and count its syscalls and bytes read and written. Costs a BPF program at
    /// every syscall entry and exit of the host, where without it only socket recvs and sends run one, which
    /// is why it is off: without it `user` is all of the statement's CPU time, its syscalls' included
    #[arg(long)]
    pub syscall_cpu: bool,
    /// Never connect to the server: the texts of statements prepared before tracing are not looked up in its
    /// process list
    #[arg(long)]
    pub no_sql: bool,
    /// Follow statements one second in N (1: every statement), or `auto`: every statement while tracing them costs
    /// within --max-cpu (in the kernel and here together, about 2.2 µs a statement: every one of some 13,000 a
    /// second), and above that one second in as many as keep it so, chosen again after each second traced from
    /// what a statement was measured to cost. Sampled, the digest's counts and times are scaled up (and said to
    /// be); latencies stay as measured
    #[arg(long, value_name = "N|auto", default_value = "auto", value_parser = SampleEvery::parse)]
    pub sample_every: SampleEvery,
    /// With `--sample-every auto`: the share of one CPU, in percent, that tracing statements may take
    #[arg(long, value_name = "PERCENT", default_value_t = AUTO_CPU_PER_MILLE as f64 / 10.0, value_parser = parse_cpu_percent)]
    pub max_cpu: f64,
    /// The cost model (bench/statement-cost): each run of the busiest programs timed and counted by what it was,
    /// a table on stderr at the end. The timing itself adds to each run
    #[arg(long, hide = true)]
    pub run_costs: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

pub(crate) fn parse_cpu_percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.1..=100.0).contains(&p) => Ok(p),
        _ => Err("expected a percentage of one CPU between 0.1 and 100".into()),
    }
}

impl QueriesArgs {
    /// What following the statements takes from the command line.
    fn follow_options(&self) -> FollowOptions {
        FollowOptions {
            duration: self.duration.map(Duration::from_secs),
            min_statement_ns: (self.min_ms * 1e6) as u64,
            raw_sql: self.raw_sql,
            uprobes: self.uprobes,
            btf: self.target.btf.clone(),
            max_kernel_mem_mib: self.target.max_kernel_mem,
            frame_pointers: self.frame_pointers,
            wait_sites: !self.no_wait_sites,
            syscall_cpu: self.syscall_cpu,
            run_costs: self.run_costs,
            sampling: self.sample_every,
            max_cpu_pct: self.max_cpu,
            ..FollowOptions::new((!self.no_sql).then(|| self.connect.clone()))
        }
    }
}

/// Records written to stdout are flushed at most this often (CLOCK_MONOTONIC ns of their statements' ends).
const FLUSH_NS: u64 = 200_000_000;

pub fn run(mut a: QueriesArgs) -> Result<()> {
    check_options(&mut a)?;
    let target = a.target.resolve()?;
    say_static_query_probes(&target.binary);
    // Looked up before the header: nothing goes to stdout on its error.
    let functions = follow::server_functions(a.uprobes, &target)?;
    let mut digest = Digest::default();
    let min_us = (a.min_ms * 1000.0) as u64;
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut reported = 0u64;
    let mut failed: Option<std::io::Error> = None;

    let until = a
        .duration
        .map(|d| format!("for {d} s"))
        .unwrap_or_else(|| "until Ctrl-C".into());
    let attached = || say!("myprobe: tracing the statements of {target} {until}");
    if !a.json && !a.summary {
        let _ = writeln!(out, "{}", render::LINE_HEADER);
        let _ = out.flush();
    }
    let mut last_flush_ns = 0u64;
    // Every record goes out here, once its text is known or waited for long enough.
    let options = a.follow_options();
    let stop = options.stop.clone();
    let emit = |record: QueryRecord| {
        if record.duration_us < min_us {
            return;
        }
        reported += 1;
        if a.summary {
            digest.add(&record);
        } else if failed.is_none() {
            let mut written = write_record(&mut out, &record, a.json);
            // Lines appear as statements finish, yet a busy server does not cost a write per line, nor a read
            // of the clock (dear in a VM): the statements' own ends time the flushes.
            if written.is_ok() && record.end_ns.saturating_sub(last_flush_ns) >= FLUSH_NS {
                last_flush_ns = record.end_ns;
                written = out.flush();
            }
            if let Err(e) = written {
                // Nobody reads any more (`| head` exited): tracing ends now, not at Ctrl-C.
                failed = Some(e);
                stop.stop();
            }
        }
    };
    let followed = follow::follow(&options, &target, functions, None, attached, emit, |_| {})?;
    let ended = options.stop.ended();
    if a.summary {
        write_digest(&mut out, &a, &digest, &followed, min_us)?;
    }
    if a.json && failed.is_none() {
        failed = write_losses(&mut out, &followed).err();
    }
    let written = match failed {
        Some(e) => Err(e),
        None => out.flush(),
    };
    match written {
        // A closed pipe (`| head`) is the reader's choice, not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r.context("writing the records")?,
    }
    say_summary(&a, &followed, reported, ended);
    Ok(())
}

/// Checks the options, and follows every statement when `--min-ms` asks for the slow ones.
fn check_options(a: &mut QueriesArgs) -> Result<()> {
    anyhow::ensure!(a.duration != Some(0), "-d must be at least 1 second");
    anyhow::ensure!(
        a.min_ms >= 0.0 && a.min_ms.is_finite(),
        "--min-ms must be a number of milliseconds ≥ 0"
    );
    // A threshold asks for the rare statement, which a sample would miss: every one is followed, and those
    // shorter are dropped in the kernel.
    if a.min_ms > 0.0 {
        match a.sample_every {
            SampleEvery::Auto | SampleEvery::Every(1) => a.sample_every = SampleEvery::Every(1),
            _ => bail!(
                "--min-ms follows every statement, so as to miss none of the slow ones: leave out --sample-every"
            ),
        }
    }
    Ok(())
}

/// `--summary`: the digest, scaled up if statements were sampled, as JSON rows or the table and its findings.
fn write_digest(
    out: &mut impl Write,
    a: &QueriesArgs,
    digest: &Digest,
    followed: &Followed,
    min_us: u64,
) -> Result<()> {
    let mut rows = digest.rows();
    if followed.scale > 1.0 {
        rows.iter_mut().for_each(|r| r.scale(followed.scale));
    }
    if a.json {
        for r in &rows {
            writeln!(out, "{}", serde_json::to_string(r)?)?;
        }
    } else if digest.is_empty() {
        say!(
            "myprobe: no statements{}",
            if min_us > 0 {
                " at or above --min-ms"
            } else {
                ""
            }
        );
    } else {
        write!(out, "{}", render::digest_table(&rows, a.top))?;
        write!(out, "\n{}", render::digest_findings(&rows, 5))?;
    }
    Ok(())
}

/// JSON readers see where records went missing: a last line with the counts, when anything was lost.
fn write_losses(out: &mut impl Write, followed: &Followed) -> std::io::Result<()> {
    let forgot = followed.forgotten_prepared > 0 || followed.forgotten_conns > 0;
    if followed.lost.total() == 0 && !forgot {
        return Ok(());
    }
    let losses = serde_json::json!({
        "lost": followed.lost.to_json(),
        "statements": followed.seen,
        "forgotten_prepared": followed.forgotten_prepared,
        "forgotten_connections": followed.forgotten_conns,
    });
    writeln!(out, "{losses}")
}

/// `--run-costs`' table: each program's runs by what they were, a statement's share of them and their time.
fn run_cost_table(costs: &[crate::collect::queries::RunCost], statements: u64) -> String {
    let per = |v: u64| v as f64 / statements.max(1) as f64;
    let mut t = format!(
        "myprobe: the programs' runs by what they were, over {statements} statements (each run timed: the timing \
         adds to it)\n{:<14} {:<32} {:>12} {:>9} {:>12}\n",
        "program", "run", "runs a stmt", "ns a run", "ns a stmt"
    );
    for c in costs {
        t += &format!(
            "{:<14} {:<32} {:>12.2} {:>9.0} {:>12.0}\n",
            c.program,
            c.outcome,
            per(c.runs),
            c.ns as f64 / c.runs.max(1) as f64,
            per(c.ns)
        );
    }
    let ns: u64 = costs.iter().map(|c| c.ns).sum();
    t += &format!(
        "{:<14} {:<32} {:>12} {:>9} {:>12.0}\n",
        "all",
        "",
        "",
        "",
        per(ns)
    );
    t
}

/// The counts on stderr once the records are out: statements traced and reported, the sampling, the notes.
fn say_summary(a: &QueriesArgs, followed: &Followed, reported: u64, ended: Instant) {
    say!(
        "myprobe: {} statements traced, {reported} reported{}",
        followed.seen,
        if followed.below_min > 0 {
            format!(
                " ({} shorter than --min-ms left in the kernel)",
                followed.below_min
            )
        } else {
            String::new()
        }
    );
    if followed.scale > 1.0 {
        say!(
            "myprobe: statements were followed for 1 s in {:.1} on average (--sample-every){}",
            followed.scale,
            if a.summary {
                ": the digest's counts and times are estimates, scaled up by as much"
            } else {
                ""
            }
        );
    }
    followed.say_notes();
    if !followed.run_costs.is_empty() {
        say_part!("{}", run_cost_table(&followed.run_costs, followed.seen));
    }
    if a.summary {
        say!(
            "myprobe: results written in {:.0} ms after tracing ended",
            ended.elapsed().as_secs_f64() * 1000.0
        );
    }
}

fn write_record(out: &mut impl Write, r: &QueryRecord, json: bool) -> std::io::Result<()> {
    if json {
        serde_json::to_writer(&mut *out, r)?;
        out.write_all(b"\n")
    } else {
        writeln!(out, "{}", render::line(r))
    }
}

/// A server built with MySQL's static probes (`--enable-dtrace`): said, with why they are not the source. The
/// protocol, read at the socket, gives what they give (text, connection, timing) and the parts of each
/// statement's time, on any build; the probes can be traced with `myprobe trace usdt:mysql:query__start`.
fn say_static_query_probes(binary: &std::path::Path) {
    let probes = crate::trace::usdt::probes(binary).unwrap_or_default();
    let (provider, start, done) = crate::server::STATEMENT_PROBES;
    let has = |name: &str| {
        probes
            .iter()
            .any(|p| p.provider == provider && p.name == name)
    };
    if has(start) && has(done) {
        say!(
            "myprobe: note: this server has MySQL's query-start/query-done static probes; statements are read \
             from the protocol instead, which also splits their time (`myprobe trace usdt:mysql:query__start` \
             traces the probes)"
        );
    }
}
