//! Following a server's statements: the statement pipeline that `myprobe queries`, `report` and `agent` share.
//! The collector (`collect::queries`) gives events; here they become records ([`Tracker`]), named (lock words,
//! wait sites), joined with the texts of statements prepared before tracing ([`PreparedTexts`]), and handed to the
//! caller, under the options of [`FollowOptions`], whichever command set them.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{
    client::ConnectArgs,
    collect::{
        self,
        periods::{BudgetShares, CpuBudget, Duty, OwnCpu},
        queries::{Control, DispatchProbe, Event, ExecuteProbe, Status, Wire},
        unwind_store::UnwindStore,
        CollectOptions,
    },
    process::{probes, Target},
    profile::waits,
    query::{
        deadlocks::Deadlocks,
        files::Files,
        holders::{self, Holders},
        reader::OwnConnections,
        recent::Recent,
        record::{Learned, QueryRecord, Text},
        released::Releasers,
        started::Started,
        texts::PreparedTexts,
        tracker::{Notice, Tracker, UNKNOWN_PREPARED},
    },
    server::Cause,
    symbolize::{
        data::DataSymbolizer,
        wait_calls::{calls_with_constant, ConstantCall},
    },
};

/// What following statements is asked to do, by whichever command.
#[derive(Clone, Debug)]
pub struct FollowOptions {
    /// How long to trace; `None`: until Ctrl-C (or the traced process exits).
    pub duration: Option<Duration>,
    /// Statements shorter than this are counted in the kernel and not sent (`--min-ms`; 0: every one is sent).
    pub min_statement_ns: u64,
    /// Literals shown as they were sent (by default hidden as `?`: they can hold passwords).
    pub raw_sql: bool,
    /// Statements followed through uprobes on `dispatch_command` from the start (TLS connections opened before
    /// tracing), not only once a TLS handshake is seen.
    pub uprobes: bool,
    /// The kernel's BTF, where it has none in /sys/kernel/btf/vmlinux.
    pub btf: Option<PathBuf>,
    /// Kernel memory the BPF maps may take, in MiB.
    pub max_kernel_mem_mib: u64,
    /// Lock waits' stacks walked by frame pointers only (no unwind tables loaded into the kernel).
    pub frame_pointers: bool,
    /// Where each statement's longest lock wait happened (a stack taken there).
    pub wait_sites: bool,
    /// A statement's CPU time inside syscalls split out of `user` (a program at every syscall of the host).
    pub syscall_cpu: bool,
    /// The busiest programs' runs timed and counted by what they were (`Followed::run_costs`).
    pub run_costs: bool,
    /// The connection to the server for the texts of statements prepared before tracing (its process list and
    /// tables, and calibrating the execution probe on statements of myprobe's own); `None`: never connect.
    pub connect: Option<ConnectArgs>,
    /// Every statement, one second in N, or as the budget allows.
    pub sampling: SampleEvery,
    /// `SampleEvery::Auto`'s budget: the share of one CPU, in percent, that following statements may take.
    pub max_cpu_pct: f64,
    /// Between how many `SampleEvery::AtLeast`'s budget is split now: the agent's servers, which it sets.
    pub budget_shares: BudgetShares,
    /// Ends the run (the command's, or that of the collectors this one runs beside).
    pub stop: collect::Stop,
    /// How its ring buffer is read.
    pub ring: collect::RingOptions,
    /// Load the programs, tell here what the verifier needed for each, and end there (`myprobe programs`).
    pub verify_only: Option<std::sync::mpsc::Sender<collect::load::Verified>>,
    /// The statements each connection ran lately: fed by the pipeline, read for what a lock's holder ran (and by
    /// the agent's session history).
    pub recent: Arc<Recent>,
}

impl FollowOptions {
    /// Every statement followed, for as long as the caller traces, with the connection `connect`; the rest at its
    /// default.
    pub fn new(connect: Option<ConnectArgs>) -> Self {
        FollowOptions {
            duration: None,
            min_statement_ns: 0,
            raw_sql: false,
            uprobes: false,
            btf: None,
            max_kernel_mem_mib: crate::collect::budget::DEFAULT_MIB,
            frame_pointers: false,
            wait_sites: true,
            syscall_cpu: false,
            run_costs: false,
            connect,
            sampling: SampleEvery::Every(1),
            max_cpu_pct: AUTO_CPU_PER_MILLE as f64 / 10.0,
            budget_shares: BudgetShares::default(),
            stop: collect::Stop::new(),
            ring: collect::RingOptions::default(),
            verify_only: None,
            recent: Arc::default(),
        }
    }

    /// A collector's options on `pid` under these terms (the kernel's BTF, its memory, the run's stop, the ring
    /// buffer's reading), traced until stopped: the statements' own, and those of the collectors run beside them.
    pub fn collect_options(&self, pid: u32) -> CollectOptions {
        CollectOptions {
            ring: self.ring,
            verify_only: self.verify_only.clone(),
            ..CollectOptions::new(
                pid,
                self.btf.clone(),
                self.max_kernel_mem_mib.saturating_mul(1 << 20),
                self.stop.clone(),
            )
        }
    }
}

/// Statements followed one second in N (`--sample-every`), or in as many as the rate of statements asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleEvery {
    /// Every statement while their cost stays within `max_cpu_pct`; above, one second in as many as keep it so.
    Auto,
    Every(u32),
    /// One second in N or more (the agent's): as many as keep the statements traced within `max_rate` a second,
    /// or `None`, within `max_cpu_pct` (the CPU of the thread that reads them: the agent's other collectors run
    /// in the same process), split with the other servers the agent traces (`FollowOptions::budget_shares`).
    AtLeast {
        every: u32,
        max_rate: Option<u64>,
    },
}

/// What `--sample-every auto` lets tracing cost by default, in the kernel and in myprobe together: 3% of one CPU
/// (`--max-cpu`).
pub const AUTO_CPU_PER_MILLE: u32 = 30;

/// The in-kernel cost of a statement followed: bench/overhead's `kernel_ns_per_statement` on the CPU-bound server
/// (bench/README.md). myprobe's own cost is measured as it runs.
pub const KERNEL_NS_PER_STATEMENT: u64 = 1_800;

/// How long executions' replies are kept after the last one that would have labelled a statement.
const RESULTS_WANTED_FOR: Duration = Duration::from_secs(5);

/// myprobe's own cost of a statement followed, until measured (`--summary`; `--json` costs twice that).
const OWN_NS_PER_STATEMENT: u64 = 400;

/// A budget of `max_cpu_pct` of one CPU for following statements.
fn auto_budget(max_cpu_pct: f64, own: OwnCpu, shares: BudgetShares) -> CpuBudget {
    CpuBudget {
        per_mille_of_cpu: (max_cpu_pct * 10.0).round().max(1.0) as u32,
        kernel_ns_per_event: KERNEL_NS_PER_STATEMENT,
        own,
        shares,
    }
}

impl SampleEvery {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(SampleEvery::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if (1..=3600).contains(&n) => Ok(SampleEvery::Every(n)),
            _ => Err("expected `auto` or a number between 1 and 3600".into()),
        }
    }

    /// The duty of the statement tracing: none when every statement is followed; `auto` and `AtLeast` without a
    /// rate within `max_cpu_pct` of one CPU (`AtLeast`'s split between as many as `shares` says).
    pub fn duty(self, max_cpu_pct: f64, shares: &BudgetShares) -> Option<Duty> {
        let (every, max_rate, budget) = match self {
            SampleEvery::Every(1) => return None,
            SampleEvery::Every(n) => (n, None, None),
            SampleEvery::Auto => (
                1,
                None,
                Some(auto_budget(
                    max_cpu_pct,
                    OwnCpu::Process,
                    BudgetShares::default(),
                )),
            ),
            SampleEvery::AtLeast {
                every,
                max_rate: None,
            } => (
                every,
                None,
                Some(auto_budget(max_cpu_pct, OwnCpu::Thread, shares.clone())),
            ),
            SampleEvery::AtLeast { every, max_rate } => (every, max_rate, None),
        };
        // Until a period has been measured, a statement is taken to cost what bench/overhead measured.
        let first_guess = (KERNEL_NS_PER_STATEMENT + OWN_NS_PER_STATEMENT) as f64;
        Some(Duty {
            length: Duration::from_secs(1),
            every: every.max(1),
            max_rate: max_rate.or(budget.as_ref().map(|b| b.max_rate(first_guess))),
            budget,
        })
    }
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
    /// The wait sites whose cause their name does not say, with it (`SiteNames::causes`).
    pub site_causes: Vec<(String, Cause)>,
    /// With `FollowOptions::run_costs`: what the busiest programs' runs were, and cost.
    pub run_costs: Vec<collect::queries::RunCost>,
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
                crate::query::tracker::MAX_PREPARED_PER_CONN
            );
        }
        if self.forgotten_conns > 0 {
            say!(
                "myprobe: warning: {} connections forgotten (over {} at once): statements of the oldest may show \
                 no user or database",
                self.forgotten_conns,
                crate::query::tracker::MAX_CONNS
            );
        }
        for line in self.lost.report(self.seen) {
            say!("myprobe: warning: {line}");
        }
    }
}

/// The server's functions that following statements probes, found in one read of its binary
/// ([`server_functions`]).
pub struct ServerFunctions {
    /// `dispatch_command`, when its signature is the one its server's module reads: the TLS fallback.
    pub dispatch: Option<DispatchFunction>,
    /// Where each execution of a prepared statement runs: the texts of statements prepared before tracing.
    execute: Option<probes::Function>,
    /// `vio_ssl_read` and `vio_ssl_write`: TLS connections' plaintext.
    tls: Option<(probes::Function, probes::Function)>,
    /// `THD::inc_status_created_tmp_disk_tables` and `THD::inc_status_sort_merge_passes`: temporary tables and sorts
    /// on disk, by statement.
    tmp_disk_table: Option<probes::Function>,
    sort_merge_pass: Option<probes::Function>,
}

/// The functions of `target`'s server that following its statements probes; with `uprobes` (`--uprobes`), an
/// error when it has no `dispatch_command` whose arguments myprobe reads. Looked up before anything is written,
/// so that nothing goes to stdout on its error.
pub fn server_functions(uprobes: bool, target: &Target) -> Result<ServerFunctions> {
    let server = target.flavor.server();
    let expected = server.dispatch();
    let [dispatch, execute, tls_read, tls_write, tmp_disk_table, sort_merge_pass] =
        <[_; 6]>::try_from(probes::find_functions(
            &target.binary,
            &[
                probes::Wanted::Prefix("dispatch_command("),
                probes::Wanted::Prefix(server.statement_execute()),
                probes::Wanted::Named("vio_ssl_read"),
                probes::Wanted::Named("vio_ssl_write"),
                probes::Wanted::Prefix("THD::inc_status_created_tmp_disk_tables("),
                probes::Wanted::Prefix("THD::inc_status_sort_merge_passes("),
            ],
        )?)
        .map_err(|_| anyhow::anyhow!("six functions looked for"))?;
    let dispatch = match dispatch {
        Some(f) if !f.demangled.starts_with(expected.signature) => {
            let why = format!(
                "{}'s dispatch_command is `{}`, not the `{}…` of {} whose arguments myprobe reads",
                target.exe.display(),
                f.demangled,
                expected.signature,
                server.name()
            );
            if uprobes {
                bail!("{why}: --uprobes cannot be used");
            }
            say!("myprobe: warning: {why}: statements under TLS will not be followed");
            None
        }
        found => found.map(|function| DispatchFunction {
            function,
            args: expected.args,
        }),
    };
    match &dispatch {
        None if uprobes => bail!(
            "{} has no dispatch_command symbol (stripped, or an unknown server version): --uprobes cannot be used",
            target.exe.display()
        ),
        Some(d) if uprobes => say!(
            "myprobe: following statements through uprobes on {}",
            d.function.demangled
        ),
        _ => {}
    }
    Ok(ServerFunctions {
        dispatch,
        execute,
        tls: tls_read.zip(tls_write),
        tmp_disk_table,
        sort_merge_pass,
    })
}

/// The server's calls of `thd_wait_begin` (`symbolize::wait_calls`), with their causes: what the waits of the
/// functions around them are. Read only where the waits' stacks are taken (`wait_sites`), which they name; none
/// where they are not, or `target` is no server.
pub fn wait_begins(wait_sites: bool, target: &Target) -> waits::WaitBegins {
    let causes = &target.flavor.server().lock_names().causes;
    let calls = if wait_sites && target.flavor.is_server() {
        calls_with_constant(&target.binary, causes.wait_begin).unwrap_or_else(|e| {
            say!("myprobe: note: the waits of functions without a name are not named: {e:#}");
            Vec::new()
        })
    } else {
        Vec::new()
    };
    waits::WaitBegins {
        binary: target.binary.clone(),
        calls,
        causes,
    }
}

/// A server's `dispatch_command` found and checked ([`server_functions`]).
pub struct DispatchFunction {
    pub function: probes::Function,
    pub args: crate::server::DispatchArgs,
}

/// The uprobes following statements places on the server: the TLS fallback's, TLS's plaintext, executions of
/// statements prepared before tracing, the wait types of InnoDB's lock waits (with `wait_sites`), and temporary
/// tables and sorts on disk.
fn server_probes<'a>(
    target: &'a Target,
    functions: &'a ServerFunctions,
    execute_function: Option<&'a probes::Function>,
    wait_calls: &[ConstantCall],
) -> collect::queries::ServerProbes<'a> {
    collect::queries::ServerProbes {
        dispatch: functions.dispatch.as_ref().map(|d| DispatchProbe {
            binary: &target.binary,
            function: &d.function,
            args: d.args,
        }),
        // TLS connections' plaintext at the server's TLS read and write; where that cannot be, at dispatch_command.
        tls: functions
            .tls
            .as_ref()
            .map(|(read, write)| collect::queries::TlsProbe {
                binary: &target.binary,
                read: read.clone(),
                write: write.clone(),
            }),
        execute: execute_function.map(|function| ExecuteProbe {
            binary: &target.binary,
            function,
        }),
        // Where a call announces one of several types: which one, for the waits that follow.
        wait_types: Some(collect::queries::WaitTypeProbe {
            binary: &target.binary,
            call_offsets: wait_calls
                .iter()
                .filter(|c| c.values.len() > 1)
                .map(|c| c.file_offset)
                .collect(),
        }),
        spills: Some(collect::queries::SpillProbe {
            binary: &target.binary,
            tmp_disk_table: functions.tmp_disk_table.clone(),
            sort_merge_pass: functions.sort_merge_pass.clone(),
        }),
    }
}

/// Follows the statements of `target` as `a` says (its duration, wait sites, connection), with the TLS fallback
/// on `functions.dispatch` ([`server_functions`]),
/// handing every record to `emit` once its text is known or waited for long enough; `attached` is called
/// once the probes are in place. Lock waits' stacks are unwound with `tables` when the caller has them (the
/// other collectors' on the same server), else with tables read here. `myprobe queries`, `report` and `agent`
/// all trace through here.
pub fn follow(
    a: &FollowOptions,
    target: &Target,
    functions: ServerFunctions,
    tables: Option<Arc<UnwindStore>>,
    attached: impl FnOnce(),
    emit: impl FnMut(QueryRecord),
    on_lost: impl FnMut(collect::Lost),
) -> Result<Followed> {
    // Lock waits' stacks are unwound as profile's are: Debian's C library has no frame pointers.
    let unwind = if !a.wait_sites {
        None
    } else if tables.is_some() {
        tables
    } else {
        UnwindStore::for_tracing(target.pid, a.frame_pointers).unwrap_or_else(|e| {
            say!("myprobe: warning: lock wait stacks are walked by frame pointers: {e:#}");
            None
        })
    };
    let duty = a.sampling.duty(a.max_cpu_pct, &a.budget_shares);
    let opts = CollectOptions {
        duration: a.duration.unwrap_or(Duration::MAX),
        unwind,
        duty: duty.clone(),
        ..a.collect_options(target.pid)
    };
    let control = Control::default();
    // The statements running once the probes are in place, read from the server's memory.
    let started = std::cell::RefCell::new(Started::default());
    if a.uprobes {
        control.want_dispatch();
    }
    // The server's function that runs each execution of a prepared statement: where the texts of statements
    // prepared before tracing are read when the server keeps no table of them.
    let execute_function = a.connect.as_ref().and(functions.execute.clone());
    let wait_begins = wait_begins(a.wait_sites, target);
    let probes = server_probes(
        target,
        &functions,
        execute_function.as_ref(),
        &wait_begins.calls,
    );
    // myprobe's own connections (its readers'), whose statements are not the server's load.
    let own = OwnConnections::default();
    let mut stages = Stages {
        control: &control,
        exe: &target.exe,
        dispatch: functions
            .dispatch
            .as_ref()
            .map(|d| d.function.demangled.as_str()),
        tracker: Tracker::new(a.raw_sql).for_server(target.flavor.server()),
        // Connected before tracing, read only when texts are wanted.
        texts: PreparedTexts::new(a.raw_sql),
        sites: waits::SiteNames::new(target.pid, Some(wait_begins)),
        files: Files::new(target.pid),
        holders: a.connect.as_ref().map(|c| {
            control.want_long_waits(holders::LONG_WAIT.as_nanos() as u64);
            Holders::start(c, target.pid, &target.binary, &own)
        }),
        deadlocks: Deadlocks::new(target.pid),
        releasers: Releasers::default(),
        raw_sql: a.raw_sql,
        locks: DataSymbolizer::new(target.pid).context("reading the server's memory map")?,
        sink: Sink {
            emit,
            unknown_prepared: 0,
            recent: Arc::clone(&a.recent),
            ran: Vec::new(),
        },
        on_lost,
        stands_for: duty.map_or(1, |d| d.every),
        tls_followed: false,
        tls_said: false,
        results_wanted_at: None,
        seen: 0,
        started: &started,
        own: own.clone(),
    };
    if let Some(connect) = &a.connect {
        if execute_function.is_none() {
            say!(
                "myprobe: note: {} has no `{}` symbol: the texts of statements prepared before tracing are looked \
                 for in the server's tables only",
                target.exe.display(),
                target.flavor.server().statement_execute()
            );
        }
        let execute_name = execute_function.as_ref().map(|f| f.demangled.clone());
        stages.texts.start(connect, target.pid, execute_name, &own);
    }
    let statements = collect::queries::StatementOptions {
        wait_sites: a.wait_sites,
        syscall_cpu: a.syscall_cpu,
        min_statement_ns: a.min_statement_ns,
        run_costs: a.run_costs,
    };
    let attached = || {
        attached();
        read_started(target, &opts, &started)
    };
    let traced =
        collect::queries::collect(&opts, statements, &control, probes, attached, |event| {
            stages.event(event)
        })?;
    Ok(stages.finish(traced))
}

/// The statements running once the probes are in place, read from the server's memory into `started`; the seeds
/// of their threads' state for the collector.
fn read_started(
    target: &Target,
    opts: &CollectOptions,
    started: &std::cell::RefCell<Started>,
) -> Vec<collect::queries::StartedBefore> {
    match Started::read(target, opts) {
        Ok((found, seeds)) => {
            started.replace(found);
            seeds
        }
        Err(e) => {
            say!(
                "myprobe: note: the statements running when tracing began are not shown: their connections \
                 cannot be read from the server's memory: {e:#}"
            );
            Vec::new()
        }
    }
}

/// The stages the collector's events flow through, once each: the statement tracker (framing and protocol), then
/// the names (texts of statements prepared before tracing, wait sites, lock words), then the sink. What they
/// decide goes back to the collector through `control`.
struct Stages<'a, E, L> {
    control: &'a Control,
    exe: &'a Path,
    /// The TLS fallback's function, when the server has it.
    dispatch: Option<&'a str>,
    tracker: Tracker,
    texts: PreparedTexts,
    sites: waits::SiteNames,
    /// The files behind blocked I/O.
    files: Files,
    /// Who holds the locks statements wait for long, read from the server's tables while they wait.
    holders: Option<Holders>,
    /// The other side of each deadlock, read from the server's memory.
    deadlocks: Deadlocks,
    /// Who let the other lock waits go, by their threads' connections.
    releasers: Releasers,
    /// Texts are shown with their literals.
    raw_sql: bool,
    locks: DataSymbolizer,
    sink: Sink<E>,
    on_lost: L,
    /// What each statement traced stands for: its period's cycle (`Status::Cycle`).
    stands_for: u32,
    /// TLS connections are read at the server's own TLS read and write.
    tls_followed: bool,
    tls_said: bool,
    /// When an execution of a statement prepared before tracing last came back with column definitions that
    /// were not kept (`Notice::ResultsWanted`).
    results_wanted_at: Option<Instant>,
    seen: u64,
    /// The statements running when tracing began, whose records get their text and connection from it.
    started: &'a std::cell::RefCell<Started>,
    /// The connections this run opened to the server.
    own: OwnConnections,
}

/// The caller's `emit`, counting what it was given, and keeping what each connection ran.
struct Sink<E> {
    emit: E,
    /// Executions of statements prepared before tracing whose text stayed unknown.
    unknown_prepared: u64,
    recent: Arc<Recent>,
    /// What connections ran since it was last kept in `recent`: kept a batch at a time (one lock, not one per
    /// statement), at each tick, and before a holder is named.
    ran: Vec<(u64, Text, i64)>,
}

/// A lock wait this long (µs) has who wakes lock waits followed for a while (`Control::want_wakers`): a program at
/// every wakeup of the host, for what a DBA looks into (sysbench's rare row lock waits last under a millisecond, a
/// scheduling hiccup's a few).
const WAKERS_WANTED_US: u64 = 10_000;

/// Statements kept in `Sink::ran` at most before they go to `Recent`.
const RAN_BATCH: usize = 1024;

impl<E: FnMut(QueryRecord)> Sink<E> {
    fn emit(&mut self, record: QueryRecord) {
        self.unknown_prepared += (record.prepared.is_some() && record.query.is_none()) as u64;
        if let (Some(conn), Some(text)) = (record.conn, &record.query) {
            self.ran
                .push((conn.into(), text.clone(), record.ended_ns()));
            if self.ran.len() >= RAN_BATCH {
                self.keep_ran();
            }
        }
        (self.emit)(record);
    }

    fn keep_ran(&mut self) {
        self.recent.add_all(self.ran.drain(..));
    }
}

impl<E: FnMut(QueryRecord), L: FnMut(collect::Lost)> Stages<'_, E, L> {
    fn event(&mut self, event: Event) {
        match event {
            Event::Wire(wire) => self.wire(wire),
            Event::Stack { id, stack } => self.sites.add(id, &stack),
            Event::Executed(e) => {
                self.texts.executed(e);
                self.ask_execute();
            }
            Event::Status(status) => self.status(status),
            Event::LongWaits(waits) => {
                let held = |w: &collect::queries::LongWait| {
                    self.sites
                        .cause_of(w.stack, w.hint)
                        .is_some_and(|c| c.has_holder())
                };
                if let Some(holders) = self.holders.as_mut().filter(|_| waits.iter().any(held)) {
                    holders.ask();
                }
            }
            Event::Tick => {
                // Read by the collector at its next poll; asked here, not at each record (a clock read).
                self.control.keep_results(self.wants_results());
                let sink = &mut self.sink;
                let learned = self.texts.tick(&mut |r| sink.emit(r));
                self.sink.keep_ran();
                self.learn(learned);
                self.ask_execute();
            }
        }
    }

    /// Whether the kernel side should keep executions' replies long (their column definitions): only while
    /// statements prepared before tracing come back with definitions that would label them.
    fn wants_results(&self) -> bool {
        self.results_wanted_at
            .is_some_and(|t| t.elapsed() < RESULTS_WANTED_FOR)
    }

    /// What a later stage learned, for the tracker's later records.
    fn learn(&mut self, learned: Vec<Learned>) {
        for l in learned {
            self.tracker.learn(l);
        }
    }

    /// What the execution probe is to do now.
    fn ask_execute(&self) {
        let wish = self.texts.execute_wish(self.control.dispatch_wanted());
        self.control.ask_execute(wish);
    }

    fn status(&mut self, status: Status) {
        match status {
            Status::Lost(lost) => (self.on_lost)(lost),
            // Between sampled periods no statement is traced: the process list is not read either.
            Status::Period(true) => self.texts.resume(),
            Status::Period(false) => {
                let sink = &mut self.sink;
                let learned = self.texts.pause(&mut |r| sink.emit(r));
                self.learn(learned);
            }
            Status::Cycle(every) => self.stands_for = every,
            Status::ExecuteProbe(attached) => self.texts.execute_probe(attached),
            Status::ExecuteProbeFailed(why) => self.texts.execute_probe_failed(&why),
            Status::ExecuteTexts => self.texts.execute_texts(),
            Status::DispatchProbe => {
                if let Some(function) = self.dispatch {
                    say!(
                        "myprobe: a client uses TLS: its statements are encrypted on the socket; following them \
                         through uprobes on {function} from now on (--uprobes does from the start)"
                    );
                }
            }
            Status::TlsProbe(Ok(())) => self.tls_followed = true,
            Status::TlsProbe(Err(why)) => say!(
                "myprobe: warning: TLS connections will be followed at dispatch_command, not at the server's \
                 vio_ssl_read and vio_ssl_write: {why}"
            ),
        }
    }

    fn wire(&mut self, mut wire: Wire) {
        if let Wire::Statement(s) = &mut wire {
            if s.before_tracing {
                let Some(connection) = self.started.borrow_mut().join(s) else {
                    return;
                };
                self.tracker.learn(connection);
            }
        }
        let handled = self.tracker.handle(wire);
        if let Some(notice) = handled.notice {
            self.notice(notice);
        }
        if let Some(record) = handled.record {
            self.named(record);
        }
    }

    fn notice(&mut self, notice: Notice) {
        match notice {
            Notice::Tls { .. } if self.tls_followed => {
                if !std::mem::replace(&mut self.tls_said, true) {
                    say!(
                        "myprobe: a client uses TLS: its statements are followed in their plaintext, at the \
                         server's vio_ssl_read and vio_ssl_write"
                    );
                }
            }
            // Said once the uprobes are attached (`Status::DispatchProbe`).
            Notice::Tls { .. } if !self.control.dispatch_wanted() => {
                self.control.want_dispatch();
                if self.dispatch.is_none() {
                    say!(
                        "myprobe: warning: a client uses TLS and {} has no dispatch_command symbol: its \
                         statements are not traced",
                        self.exe.display()
                    );
                }
            }
            Notice::Tls { .. } => {}
            Notice::ResultsWanted => self.results_wanted_at = Some(Instant::now()),
        }
    }

    /// A statement's record: its wait site and lock named, then its text looked for.
    fn named(&mut self, mut record: QueryRecord) {
        // Its own statements (who holds a lock, prepared statements' texts) are not the server's load.
        if record.conn.is_some_and(|c| self.own.contains(u64::from(c))) {
            return;
        }
        self.seen += 1;
        // One that ran when tracing began was read with all the others then, not sampled: it stands for itself.
        record.stands_for = if record.before_tracing {
            1
        } else {
            self.stands_for
        };
        if record.lock_stack != 0 {
            record.lock_site = self.sites.of(record.lock_stack);
        }
        let files = &mut self.files;
        record.name_io(|part, fd| files.cause(part, fd));
        let sites = &self.sites;
        record.name_waits(|stack, hint| Some((sites.cause_of(stack, hint)?, sites.of(stack))));
        if (record.waits.iter()).any(|w| w.cause.has_holder() && w.us >= WAKERS_WANTED_US) {
            self.control.want_wakers();
        }
        if let Some(holders) = &mut self.holders {
            holders.name(&mut record);
        }
        self.deadlocks.name(&mut record);
        // Waits the server did not list (most: short ones) by who let them go.
        if record.wakers.iter().any(|(c, ..)| c.has_holder()) {
            self.sink.keep_ran();
            self.releasers.name(&mut record, &self.sink.recent);
        }
        self.releasers.see(&record);
        if !self.raw_sql {
            record.hide_holders_literals();
        }
        if record.waits.iter().any(|w| w.holder.is_some()) {
            self.sink.keep_ran();
            self.sink.recent.name_holders(&mut record);
        }
        if record.lock_addr_raw != 0 {
            record.lock_symbol = Some(waits::lock_word_name(
                &mut self.locks,
                record.lock_addr_raw,
                record.lock_site.as_deref(),
            ));
        }
        // What the execution probe is to do changes with an execution of unknown text (else at a tick).
        let unknown_execution = record.prepared.is_some() && record.query.is_none();
        let sink = &mut self.sink;
        let learned = self.texts.add(record, &mut |r| sink.emit(r));
        self.learn(learned);
        if unknown_execution {
            self.ask_execute();
        }
    }

    /// Tracing ended: the records still held are written, and what was counted is returned.
    fn finish(mut self, traced: collect::queries::Traced) -> Followed {
        let sink = &mut self.sink;
        let learned = self.texts.finish(&mut |r| sink.emit(r));
        self.sink.keep_ran();
        self.learn(learned);
        if let Some(line) = self.texts.summary() {
            say!("myprobe: {line}");
        }
        Followed {
            // myprobe's own reads of the process list are not the server's statements.
            seen: (self.seen + traced.below_min).saturating_sub(self.texts.own_statements),
            below_min: traced.below_min,
            lost: traced.lost,
            unknown_prepared: self.sink.unknown_prepared,
            forgotten_prepared: self.tracker.forgotten_prepared,
            forgotten_conns: self.tracker.forgotten_conns,
            scale: traced.scale,
            site_causes: self.sites.causes(),
            run_costs: traced.run_costs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sampling_gets_its_duty() {
        let one = BudgetShares::default();
        assert_eq!(SampleEvery::Every(1).duty(3.0, &one), None);
        let every = SampleEvery::Every(7).duty(3.0, &one).expect("sampled");
        assert_eq!((every.every, every.max_rate, every.budget), (7, None, None));
        // auto: every statement up to what 3% of a CPU allows at 2.2 µs each, the whole process measured.
        let auto = SampleEvery::Auto.duty(3.0, &one).expect("sampled");
        assert_eq!((auto.every, auto.max_rate), (1, Some(13_636)));
        assert_eq!(auto.budget.map(|b| b.own), Some(OwnCpu::Process));
        // The agent's: one second in 10 at least, within 0.5% of a CPU, its reading thread measured.
        let agent = SampleEvery::AtLeast {
            every: 10,
            max_rate: None,
        }
        .duty(0.5, &one)
        .expect("sampled");
        assert_eq!((agent.every, agent.max_rate), (10, Some(2_272)));
        assert_eq!(agent.budget.map(|b| b.own), Some(OwnCpu::Thread));
        let fixed = SampleEvery::AtLeast {
            every: 10,
            max_rate: Some(1_000),
        }
        .duty(0.5, &one)
        .expect("sampled");
        assert_eq!(
            (fixed.every, fixed.max_rate, fixed.budget),
            (10, Some(1_000), None)
        );
    }
}
