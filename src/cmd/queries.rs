//! `myprobe queries`: one record per statement with its time broken down, as lines, JSON, or a digest.

use std::{
    cell::Cell,
    io::{BufWriter, Write},
    sync::atomic::Ordering,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::{
    client::ConnectArgs,
    collect::{
        self,
        periods::{CpuBudget, Duty},
        queries::{DispatchProbe, Event, ExecuteProbe, ExecuteWish},
        CollectOptions,
    },
    process::{self, probes, Target},
    profile::waits,
    query::{digest::Digest, texts::PreparedTexts, Notice, QueryRecord, Tracker, UNKNOWN_PREPARED},
    render::queries as render,
    symbolize::data::DataSymbolizer,
    unwind::ProcessTables,
};

#[derive(Args, Clone)]
pub struct QueriesArgs {
    /// Server process to trace [default: the one running mariadbd or mysqld]
    #[arg(short = 'p', long = "pid")]
    pub pid: Option<u32>,
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
    /// Trace a process that is not mariadbd/mysqld
    #[arg(long)]
    pub any_process: bool,
    /// BTF file of the running kernel, for kernels without /sys/kernel/btf/vmlinux
    #[arg(long, value_name = "FILE")]
    pub btf: Option<std::path::PathBuf>,
    /// Kernel memory the BPF maps may take, in MiB; past it, the maps that can be smaller are (said on stderr)
    #[arg(long, value_name = "MIB", default_value_t = crate::collect::budget::DEFAULT_MIB)]
    pub max_kernel_mem: u64,
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
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// `--sample-every`: statements followed one second in N, or in as many as the rate of statements asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleEvery {
    Auto,
    Every(u32),
    /// One second in N or more: as many as keep the statements traced within `max_rate` a second (the agent's).
    AtLeast {
        every: u32,
        max_rate: u64,
    },
}

/// What `--sample-every auto` lets tracing cost by default, in the kernel and in myprobe together: 3% of one CPU
/// (`--max-cpu`).
pub const AUTO_CPU_PER_MILLE: u32 = 30;

fn parse_cpu_percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.1..=100.0).contains(&p) => Ok(p),
        _ => Err("expected a percentage of one CPU between 0.1 and 100".into()),
    }
}

/// The in-kernel cost of a statement followed: bench/overhead's `kernel_ns_per_statement` on the CPU-bound server
/// (bench/README.md). myprobe's own cost is measured as it runs.
pub const KERNEL_NS_PER_STATEMENT: u64 = 1_800;

/// myprobe's own cost of a statement followed, until measured (`--summary`; `--json` costs twice that).
const OWN_NS_PER_STATEMENT: u64 = 400;

/// `--sample-every auto`'s budget, `max_cpu_pct` of one CPU.
pub fn auto_budget(max_cpu_pct: f64) -> CpuBudget {
    CpuBudget {
        per_mille_of_cpu: (max_cpu_pct * 10.0).round().max(1.0) as u32,
        kernel_ns_per_event: KERNEL_NS_PER_STATEMENT,
    }
}

impl SampleEvery {
    fn parse(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(SampleEvery::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if (1..=3600).contains(&n) => Ok(SampleEvery::Every(n)),
            _ => Err("expected `auto` or a number between 1 and 3600".into()),
        }
    }

    /// The duty of the statement tracing: none when every statement is followed; `auto` within `max_cpu_pct` of
    /// one CPU.
    pub fn duty(self, max_cpu_pct: f64) -> Option<Duty> {
        let budget = auto_budget(max_cpu_pct);
        let (every, max_rate) = match self {
            SampleEvery::Every(1) => return None,
            SampleEvery::Every(n) => (n, None),
            SampleEvery::Auto => (
                1,
                Some(budget.max_rate((KERNEL_NS_PER_STATEMENT + OWN_NS_PER_STATEMENT) as f64)),
            ),
            SampleEvery::AtLeast { every, max_rate } => (every.max(1), Some(max_rate)),
        };
        Some(Duty {
            length: Duration::from_secs(1),
            every,
            max_rate,
            budget: (self == SampleEvery::Auto).then_some(budget),
        })
    }
}

impl QueriesArgs {
    /// The options of a statement summary traced for another command (report, agent): every other option at its
    /// default.
    pub fn summary(pid: Option<u32>, top: usize, connect: ConnectArgs) -> Self {
        QueriesArgs {
            pid,
            duration: None,
            min_ms: 0.0,
            json: false,
            summary: true,
            top,
            raw_sql: false,
            uprobes: false,
            any_process: false,
            btf: None,
            max_kernel_mem: crate::collect::budget::DEFAULT_MIB,
            frame_pointers: false,
            no_wait_sites: false,
            syscall_cpu: false,
            no_sql: false,
            sample_every: SampleEvery::Every(1),
            max_cpu: AUTO_CPU_PER_MILLE as f64 / 10.0,
            connect,
        }
    }
}

/// Records written to stdout are flushed at most this often (CLOCK_MONOTONIC ns of their statements' ends).
const FLUSH_NS: u64 = 200_000_000;

pub fn run(mut a: QueriesArgs) -> Result<()> {
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
    process::check_environment(a.btf.as_deref())?;
    let target = process::resolve(a.pid, a.any_process)?;
    say_static_query_probes(&target.binary);
    // Looked up before the header: nothing goes to stdout on its error.
    let dispatch = dispatch_function(&a, &target)?;
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
                collect::STOP.store(true, Ordering::SeqCst);
            }
        }
    };
    let followed = follow(&a, &target, dispatch, attached, emit, |_| {})?;
    let ended = collect::tracing_ended();
    if a.summary {
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
    }
    // JSON readers see where records went missing: a last line with the counts, when anything was lost.
    let forgot = followed.forgotten_prepared > 0 || followed.forgotten_conns > 0;
    if a.json && failed.is_none() && (followed.lost.total() > 0 || forgot) {
        let losses = serde_json::json!({
            "lost": followed.lost.to_json(),
            "statements": followed.seen,
            "forgotten_prepared": followed.forgotten_prepared,
            "forgotten_connections": followed.forgotten_conns,
        });
        if let Err(e) = writeln!(out, "{losses}") {
            failed = Some(e);
        }
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
    if a.summary {
        say!(
            "myprobe: results written in {:.0} ms after tracing ended",
            ended.elapsed().as_secs_f64() * 1000.0
        );
    }
    Ok(())
}

/// What following the statements counted besides the records, said on stderr by [`Followed::say_notes`].
pub struct Followed {
    /// Statements traced (myprobe's own reads of the process list left out).
    pub seen: u64,
    /// Of them, those shorter than `--min-ms`, dropped in the kernel.
    pub below_min: u64,
    pub lost: collect::Lost,
    /// Executions of statements prepared before tracing whose text stayed unknown.
    pub unknown_prepared: u64,
    pub forgotten_prepared: u64,
    pub forgotten_conns: u64,
    /// The time traced over the time statements were followed (1: all of it; `--sample-every`).
    pub scale: f64,
}

impl Followed {
    pub fn say_notes(&self) {
        if self.unknown_prepared > 0 {
            say!(
                "myprobe: note: {} executions of statements prepared before tracing began: their text is unknown \
                 (shown as `{UNKNOWN_PREPARED} #ID`, or as `SELECT … FROM TABLES (COLUMNS) #ID` where the server sent \
                 their result set's columns); statements prepared while tracing are shown in full",
                self.unknown_prepared
            );
        }
        if self.forgotten_prepared > 0 {
            say!(
                "myprobe: warning: {} prepared statements forgotten (over {} open on one connection): their \
                 executions show as `{UNKNOWN_PREPARED} #ID`",
                self.forgotten_prepared,
                crate::query::MAX_PREPARED_PER_CONN
            );
        }
        if self.forgotten_conns > 0 {
            say!(
                "myprobe: warning: {} connections forgotten (over {} at once): statements of the oldest may show \
                 no user or database",
                self.forgotten_conns,
                crate::query::MAX_CONNS
            );
        }
        for line in self.lost.report(self.seen) {
            say!("myprobe: warning: {line}");
        }
    }
}

/// The server's `dispatch_command`, for the TLS fallback, when its signature is the one its server's module
/// reads; with `--uprobes`, an error when it has none.
pub fn dispatch_function(a: &QueriesArgs, target: &Target) -> Result<Option<DispatchFunction>> {
    let server = crate::server::of_target(target);
    let expected = server.dispatch();
    let found = probes::find_function(&target.binary, "dispatch_command(")?;
    let dispatch = match found {
        Some(f) if !f.demangled.starts_with(expected.signature) => {
            let why = format!(
                "{}'s dispatch_command is `{}`, not the `{}…` of {} whose arguments myprobe reads",
                target.exe.display(),
                f.demangled,
                expected.signature,
                server.name()
            );
            if a.uprobes {
                bail!("{why}: --uprobes cannot be used");
            }
            say!("myprobe: warning: {why}: statements under TLS will not be followed");
            return Ok(None);
        }
        found => found.map(|function| DispatchFunction {
            function,
            args: expected.args,
        }),
    };
    match &dispatch {
        None if a.uprobes => bail!(
            "{} has no dispatch_command symbol (stripped, or an unknown server version): --uprobes cannot be used",
            target.exe.display()
        ),
        Some(d) if a.uprobes => say!(
            "myprobe: following statements through uprobes on {}",
            d.function.demangled
        ),
        _ => {}
    }
    Ok(dispatch)
}

/// A server's `dispatch_command` found and checked ([`dispatch_function`]).
pub struct DispatchFunction {
    pub function: probes::Function,
    pub args: crate::server::DispatchArgs,
}

/// Follows the statements of `target` as `a` says (its duration, wait sites, process list), with the TLS fallback
/// on `dispatch` ([`dispatch_function`]),
/// handing every record to `emit` once its text is known or waited for long enough; `attached` is called
/// once the probes are in place. `myprobe queries` and `myprobe report` both trace through here.
pub fn follow(
    a: &QueriesArgs,
    target: &Target,
    dispatch: Option<DispatchFunction>,
    attached: impl FnOnce(),
    mut emit: impl FnMut(QueryRecord),
    mut on_lost: impl FnMut(collect::Lost),
) -> Result<Followed> {
    // Lock waits' stacks are unwound as profile's are: Debian's C library has no frame pointers.
    let unwind = if a.no_wait_sites {
        None
    } else {
        ProcessTables::for_tracing(target.pid, a.frame_pointers).unwrap_or_else(|e| {
            say!("myprobe: warning: lock wait stacks are walked by frame pointers: {e:#}");
            None
        })
    };
    let opts = CollectOptions {
        pid: target.pid,
        duration: a.duration.map(Duration::from_secs).unwrap_or(Duration::MAX),
        kernel_stacks: false,
        btf: a.btf.clone(),
        unwind,
        max_kernel_mem: a.max_kernel_mem.saturating_mul(1 << 20),
        announce: String::new(),
        attached: None,
        slices: None,
        duty: a.sample_every.duty(a.max_cpu),
    };
    let mut locks = DataSymbolizer::new(target.pid).context("reading the server's memory map")?;
    let wanted = Cell::new(a.uprobes);
    // TLS connections' plaintext at the server's TLS read and write; where that cannot be, at dispatch_command.
    let tls = collect::queries::TlsProbe::of_binary(&target.binary)?;
    let tls_followed = Cell::new(false);
    let mut tls_said = false;
    let probe = dispatch.as_ref().map(|d| DispatchProbe {
        binary: &target.binary,
        function: &d.function,
        args: d.args,
        wanted: &wanted,
    });
    let mut tracker = Tracker::new(a.raw_sql).for_server(crate::server::of_target(target));
    let mut sites = waits::SiteNames::new(target.pid);
    let (mut seen, mut unknown_prepared) = (0u64, 0u64);
    let mut emit = |record: QueryRecord| {
        unknown_prepared += (record.prepared.is_some() && record.query.is_none()) as u64;
        emit(record);
    };
    let want_results = Cell::new(false);
    // Connected before tracing, read only when texts are wanted.
    let mut texts = PreparedTexts::default();
    let execute_function = match a.no_sql {
        true => None,
        false => statement_execute_function(target),
    };
    if !a.no_sql {
        texts.start(
            &a.connect,
            target.pid,
            execute_function.as_ref().map(|f| f.demangled.clone()),
        );
    }
    let execute_wish = Cell::new(ExecuteWish::default());
    let execute_probe = execute_function.as_ref().map(|function| ExecuteProbe {
        binary: &target.binary,
        function,
        wish: &execute_wish,
    });
    // What each statement traced stands for: its period's cycle (`Event::Cycle`).
    let mut stands_for = a.sample_every.duty(a.max_cpu).map_or(1, |d| d.every);
    let statements = collect::queries::StatementOptions {
        wait_sites: !a.no_wait_sites,
        syscall_cpu: a.syscall_cpu,
        min_statement_ns: (a.min_ms * 1e6) as u64,
    };
    let traced = collect::queries::collect(
        &opts,
        statements,
        &want_results,
        collect::queries::ServerProbes {
            dispatch: probe,
            tls,
            execute: execute_probe,
        },
        attached,
        |event| {
            let event = match event {
                Event::Executed(e) => {
                    texts.executed(e);
                    return execute_wish.set(texts.execute_wish(wanted.get()));
                }
                Event::Tick => {
                    // Read by the collector at its next poll; asked here, not at each record (a clock read).
                    want_results.set(tracker.wants_results());
                    texts.tick(&mut tracker, &mut emit);
                    return execute_wish.set(texts.execute_wish(wanted.get()));
                }
                Event::ExecuteProbe(attached) => return texts.execute_probe(attached),
                Event::DispatchProbe => {
                    if let Some(d) = &dispatch {
                        say!(
                            "myprobe: a client uses TLS: its statements are encrypted on the socket; following them \
                             through uprobes on {} from now on (--uprobes does from the start)",
                            d.function.demangled
                        );
                    }
                    return;
                }
                Event::ExecuteProbeFailed(why) => return texts.execute_probe_failed(&why),
                Event::TlsProbe(Ok(())) => return tls_followed.set(true),
                Event::TlsProbe(Err(why)) => {
                    return say!(
                        "myprobe: warning: TLS connections will be followed at dispatch_command, not at the \
                         server's vio_ssl_read and vio_ssl_write: {why}"
                    )
                }
                event => event,
            };
            match &event {
                Event::Stack { id, stack } => return sites.add(*id, stack),
                Event::Lost(lost) => return on_lost(*lost),
                // Between sampled periods no statement is traced: the process list is not read either.
                Event::Period(true) => return texts.resume(),
                Event::Period(false) => return texts.pause(&mut tracker, &mut emit),
                Event::Cycle(every) => {
                    stands_for = *every;
                    return;
                }
                _ => {}
            }
            let record = tracker.handle(event);
            for n in tracker.notices.drain(..) {
                match n {
                    Notice::Tls { .. } if tls_followed.get() => {
                        if !std::mem::replace(&mut tls_said, true) {
                            say!(
                                "myprobe: a client uses TLS: its statements are followed in their plaintext, at the \
                                 server's vio_ssl_read and vio_ssl_write"
                            );
                        }
                    }
                    // Said once the uprobes are attached (`Event::DispatchProbe`).
                    Notice::Tls { .. } if !wanted.get() => {
                        wanted.set(true);
                        if dispatch.is_none() {
                            say!(
                                "myprobe: warning: a client uses TLS and {} has no dispatch_command symbol: its \
                                 statements are not traced",
                                target.exe.display()
                            );
                        }
                    }
                    Notice::Tls { .. } => {}
                }
            }
            let Some(mut record) = record else { return };
            seen += 1;
            record.stands_for = stands_for;
            if record.lock_stack != 0 {
                record.lock_site = sites.of(record.lock_stack);
            }
            if record.lock_addr_raw != 0 {
                let symbol = locks.name(record.lock_addr_raw);
                record.lock_symbol = Some(waits::lock_name(
                    &symbol,
                    locks.names_no_variable(&symbol),
                    record.lock_addr_raw,
                    record.lock_site.as_deref(),
                ));
            }
            // What the execution probe is to do changes with an execution of unknown text (else at a tick).
            let unknown_execution = record.prepared.is_some() && record.query.is_none();
            texts.add(&mut tracker, record, &mut emit);
            if unknown_execution {
                execute_wish.set(texts.execute_wish(wanted.get()));
            }
        },
    )?;
    texts.finish(&mut tracker, &mut emit);
    if let Some(line) = texts.summary() {
        say!("myprobe: {line}");
    }
    Ok(Followed {
        // myprobe's own reads of the process list are not the server's statements.
        seen: (seen + traced.below_min).saturating_sub(texts.own_statements),
        below_min: traced.below_min,
        lost: traced.lost,
        unknown_prepared,
        forgotten_prepared: tracker.forgotten_prepared,
        forgotten_conns: tracker.forgotten_conns,
        scale: traced.scale,
    })
}

fn write_record(out: &mut impl Write, r: &QueryRecord, json: bool) -> std::io::Result<()> {
    if json {
        serde_json::to_writer(&mut *out, r)?;
        out.write_all(b"\n")
    } else {
        writeln!(out, "{}", render::line(r))
    }
}

/// The server's function that runs each execution of a prepared statement, where the texts of statements prepared
/// before tracing are read when the server keeps no table of them; None, said, when the binary has none.
fn statement_execute_function(target: &Target) -> Option<probes::Function> {
    let signature = crate::server::of_target(target).statement_execute();
    match probes::find_function(&target.binary, signature) {
        Ok(Some(f)) => Some(f),
        Ok(None) => {
            say!(
                "myprobe: note: {} has no `{signature}` symbol: the texts of statements prepared before tracing \
                 are looked for in the server's tables only",
                target.exe.display()
            );
            None
        }
        Err(e) => {
            say!("myprobe: warning: {e:#}");
            None
        }
    }
}

/// A server built with MySQL's static probes (`--enable-dtrace`): said, with why they are not the source. The
/// protocol, read at the socket, gives what they give (text, connection, timing) and the parts of each
/// statement's time, on any build; the probes can be traced with `myprobe trace usdt:mysql:query__start`.
fn say_static_query_probes(binary: &std::path::Path) {
    let probes = crate::trace::usdt::probes(binary).unwrap_or_default();
    let has = |name: &str| {
        probes
            .iter()
            .any(|p| p.provider == "mysql" && p.name == name)
    };
    if has("query__start") && has("query__done") {
        say!(
            "myprobe: note: this server has MySQL's query-start/query-done static probes; statements are read \
             from the protocol instead, which also splits their time (`myprobe trace usdt:mysql:query__start` \
             traces the probes)"
        );
    }
}
