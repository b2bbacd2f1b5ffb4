//! `myprobe profile …`: the options, the choice of collector, and the output.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use syscalls::Sysno;

use crate::{
    collect::{self, unwind_store::UnwindStore, CollectOptions, Collected},
    process::{self, Target},
    profile::{
        self,
        stacks::{self, Part, StackNamer, StackOptions},
        Profile, Unit,
    },
    render::{self, tables, Palette, RenderOptions},
    symbolize::{data::DataSymbolizer, Symbolizer},
};

#[derive(Subcommand)]
pub enum ProfileCommand {
    /// On-CPU flame graph: sample the server's stacks at a fixed rate.
    Cpu(CpuArgs),
    /// Off-CPU flame graph: time each thread spends off CPU by stack, split into [blocked] and [runnable].
    ///
    /// Every wait is timed, none is sampled away. Its user stack is taken when the thread leaves the CPU:
    /// unwound from .eh_frame the first time the thread leaves it at that place (instruction, stack and
    /// frame pointers: the same call chain), then known by its id; waits are summed in the kernel per thread
    /// and stack, and each stack is sent to user space once. Threads blocked throughout (off CPU from before
    /// tracing to its end) are found when tracing ends, with all of the time traced.
    #[command(verbatim_doc_comment)]
    Offcpu(OffcpuArgs),
    /// Allocation flame graph: bytes (or calls) asked of malloc, calloc, realloc, aligned_alloc, posix_memalign,
    /// memalign, valloc and pvalloc (C++ new reaches them), by user stack.
    Alloc(AllocArgs),
    /// Allocations not freed yet, by stack: what the traced allocations still hold when tracing ends
    /// (realloc and free tracked; free(NULL) ignored). A table of the top stacks goes to stderr.
    Memleak(MemleakArgs),
    /// Lock waits: time in futex waits (pthread mutexes, condition variables, rw-locks, InnoDB's latches) by
    /// lock and stack, the lock as root frame, named by the variable that holds it; a table of the top locks
    /// on stderr with their waiters and the stacks that woke them (the holders releasing them).
    Locks(LocksArgs),
    /// Syscalls by stack: every syscall of the server timed from entry to exit, as a flame graph of time in
    /// syscalls (leaf frame `[syscall] NAME`) and a table on stderr: calls, total, mean and longest per
    /// syscall, and the failed calls by errno.
    Syscalls(SyscallsArgs),
}

/// Options every tracing profile shares.
#[derive(Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub target: crate::cmd::TargetArgs,
    /// Tracing duration in seconds (Ctrl-C ends early and still writes results)
    #[arg(short = 'd', long = "duration", default_value_t = 10)]
    pub duration: u64,
    /// Output file; the extension picks the format: .folded/.txt, .svg, .json, .pb.gz [default: folded on stdout]
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Add kernel frames (suffixed _[k]) below the user frames
    #[arg(long)]
    pub kernel: bool,
    /// Start every stack with a frame naming its thread (`thread 1234 (name)`)
    #[arg(long)]
    pub per_thread: bool,
    /// Flame graph title (SVG output)
    #[arg(long)]
    pub title: Option<String>,
    /// Walk user stacks by frame pointers only (as bcc and bpftrace do), not with the .eh_frame unwinder:
    /// cheaper, but stacks stop at the first function built without frame pointers (Debian's glibc)
    #[arg(long)]
    pub frame_pointers: bool,
    /// Frames as raw addresses (0x…) instead of function names, e.g. to compare with eu-stack or gdb
    #[arg(long)]
    pub addresses: bool,
    /// Start every stack with a frame naming what it was split by: `statement`, the statement its thread ran (its
    /// fingerprint, or `[no statement running]`, `[no connection: the server's own threads]`) [cpu, offcpu, locks, alloc]
    #[arg(long, value_name = "WHAT", value_enum)]
    pub by: Option<By>,
    /// Keep only the samples of the statements whose fingerprint (or bracketed name) matches this regular
    /// expression, e.g. `sbtest1 where id` [cpu, offcpu, locks, alloc]
    #[arg(long, value_name = "REGEX")]
    pub statement: Option<String>,
    /// Do not read which statement each sample was taken in (a few reads of the server's memory per event; pprof
    /// output then has no `db_query_summary`, `connection`, `db_user` and `db_namespace` labels)
    #[arg(long)]
    pub no_statements: bool,
}

/// What `--by` splits stacks by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// The statement the thread ran.
    Statement,
}

#[derive(Args)]
pub struct CpuArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Sampling frequency per CPU, in Hz
    #[arg(short = 'F', long = "frequency", default_value_t = 99)]
    pub frequency: u64,
}

#[derive(Args)]
pub struct OffcpuArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Ignore off-CPU periods shorter than this many microseconds (filtered in the kernel, like offcputime -m)
    #[arg(long, default_value_t = 1)]
    pub min_block_us: u64,
    /// Also count, at each context switch, the tasks that took the CPU from a server thread that could still
    /// run: a table on stderr of preemptor and preempted thread with their priorities, count and run-queue
    /// time caused (DTrace's "who preempts whom")
    #[arg(long)]
    pub preemptors: bool,
    /// Do not unwind a thread preempted at a place not unwound before: keep its instruction alone, shown as that
    /// function under `[preempted: leaf only]`. Saves about 10 µs at each such switch, most of whose waits are
    /// too short to count (the always-on agent's choice); blocked threads are unwound as always
    #[arg(long)]
    pub preempted_leaf_only: bool,
    /// Rows of the preemptor table
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
}

/// Which allocations alloc and memleak trace.
#[derive(Args)]
pub struct AllocFilter {
    /// Only allocations of at least this many bytes
    #[arg(short = 'z', long = "min-size", value_name = "BYTES")]
    pub min_size: Option<u64>,
    /// Only allocations of at most this many bytes
    #[arg(short = 'Z', long = "max-size", value_name = "BYTES")]
    pub max_size: Option<u64>,
}

impl AllocFilter {
    fn options(
        &self,
        sample: u64,
        outstanding_older_than: Option<u64>,
    ) -> Result<collect::alloc::AllocOptions> {
        anyhow::ensure!(sample >= 1, "--sample must be at least 1");
        let (min_size, max_size) = (
            self.min_size.unwrap_or(0),
            self.max_size.unwrap_or(u64::MAX),
        );
        anyhow::ensure!(min_size <= max_size, "-z must not be above -Z");
        Ok(collect::alloc::AllocOptions {
            sample_every: sample,
            min_size,
            max_size,
            outstanding_older_than,
            interval: None,
        })
    }
}

#[derive(Args)]
pub struct AllocArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Trace every N-th allocation call and scale the results by N
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub sample: u64,
    #[command(flatten)]
    pub filter: AllocFilter,
    /// Count calls instead of bytes
    #[arg(long)]
    pub calls: bool,
}

#[derive(Args)]
pub struct MemleakArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Trace the allocations of one period of 100 ms in N and scale the results by the time traced over the
    /// time sampled; frees are always traced. 1: every allocation, exact, at about twice the cost
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub sample: u64,
    #[command(flatten)]
    pub filter: AllocFilter,
    /// Leave out allocations younger than this many milliseconds when tracing ends
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub older: u64,
    /// Stacks in the table on stderr
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Also print the table every this many seconds while tracing
    #[arg(long, value_name = "SECS")]
    pub interval: Option<u64>,
}

#[derive(Args)]
pub struct LocksArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Locks in the table on stderr
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Also list condition variable and event waits (idle workers, timers), not only contention
    #[arg(long)]
    pub all: bool,
}

#[derive(Args)]
pub struct SyscallsArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Only calls that take at least this many microseconds (filtered in the kernel)
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub min_us: u64,
    /// Only these syscalls, by name [default: all]
    #[arg(long = "syscall", value_name = "NAME[,NAME]", value_delimiter = ',')]
    pub syscalls: Vec<String>,
    /// Count calls instead of time
    #[arg(long)]
    pub calls: bool,
    /// Syscalls in the table on stderr
    #[arg(long, value_name = "N", default_value_t = 15)]
    pub top: usize,
}

pub fn run(c: ProfileCommand) -> Result<()> {
    match c {
        ProfileCommand::Cpu(a) => cpu(a),
        ProfileCommand::Offcpu(a) => offcpu(a),
        ProfileCommand::Alloc(a) => alloc(a),
        ProfileCommand::Locks(a) => locks(a),
        ProfileCommand::Memleak(a) => memleak(a),
        ProfileCommand::Syscalls(a) => syscalls(a),
    }
}

/// `profile cpu`: the sampled stacks as an on-CPU flame graph.
fn cpu(a: CpuArgs) -> Result<()> {
    anyhow::ensure!(
        (1..=10_000).contains(&a.frequency),
        "-F must be between 1 and 10000 Hz"
    );
    let mut s = Session::start(&a.trace)?;
    let target = &s.target;
    s.opts.announce = format!(
        "myprobe: sampling on-CPU stacks of {target} at {} Hz for {} s; Ctrl-C ends early",
        a.frequency, a.trace.duration
    );
    s.label_statements()?;
    let collected = collect::cpu::collect(&s.opts, a.frequency)?;
    let mut namer = s.namer();
    let profile = stacks::on_cpu(&collected, &mut namer);
    s.finish(&collected, &profile, "CPU", Palette::Hot)
}

/// `profile offcpu`: the timed waits as an off-CPU flame graph, then the preemptor table if asked.
fn offcpu(a: OffcpuArgs) -> Result<()> {
    let mut s = Session::start(&a.trace)?;
    let target = &s.target;
    s.opts.announce = format!(
        "myprobe: tracing off-CPU time of {target} (waits ≥ {} µs) for {} s; Ctrl-C ends early",
        a.min_block_us, a.trace.duration
    );
    s.label_statements()?;
    let (collected, preemptions) = collect::offcpu::collect(
        &s.opts,
        collect::offcpu::Options {
            min_block_us: a.min_block_us,
            per_thread: a.trace.per_thread,
            preemptors: a.preemptors,
            preempted_leaf_only: a.preempted_leaf_only,
        },
    )?;
    let mut namer = s.namer();
    let profile = stacks::off_cpu(&collected, &mut namer);
    s.finish(&collected, &profile, "Off-CPU", Palette::Io)?;
    if a.preemptors {
        let pid = s.target.pid;
        let mut name = |tid: u32| process::thread_name(pid, tid);
        say_part!("{}", tables::preemptors(preemptions, a.top, &mut name));
    }
    Ok(())
}

/// `profile alloc`: the bytes (or calls) asked for, by stack.
fn alloc(a: AllocArgs) -> Result<()> {
    let alloc = a.filter.options(a.sample, None)?;
    let mut s = Session::start(&a.trace)?;
    s.label_statements()?;
    let target = &s.target;
    let every = if alloc.sample_every > 1 {
        format!("every {}th call", alloc.sample_every)
    } else {
        "every call".into()
    };
    s.opts.announce = format!(
        "myprobe: tracing the allocations of {target} ({every}) for {} s; Ctrl-C ends early",
        a.trace.duration
    );
    let collected = collect::alloc::collect(&s.opts, &alloc, |_| {})?;
    let (unit, column) = if a.calls {
        (Unit::Count, "calls")
    } else {
        (Unit::Bytes, "bytes")
    };
    let mut namer = s.namer();
    let profile = stacks::build(&collected, &mut namer, unit, |c, row| {
        vec![Part::value(c.value(row, column))]
    });
    s.finish(&collected, &profile, "Allocation", Palette::Mem)
}

/// `profile locks`: the futex waits by lock and stack, with the table of the top locks before the results.
fn locks(a: LocksArgs) -> Result<()> {
    let mut s = Session::start(&a.trace)?;
    s.label_statements()?;
    let target = &s.target;
    let mut names =
        DataSymbolizer::new(s.target.pid).context("reading the process's memory map")?;
    s.opts.announce = format!(
        "myprobe: timing the lock (futex) waits of {target} for {} s; Ctrl-C ends early",
        a.trace.duration
    );
    let collected = collect::locks::collect(&s.opts)?;
    let mut namer = s.namer();
    let (profile, locks) = profile::locks::summarize(&collected, &mut namer, &mut names);
    say_part!("{}", tables::locks(locks, a.top, a.all));
    s.finish(&collected, &profile, "Lock wait", Palette::Io)
}

/// `profile memleak`: the allocations still held when tracing ends, with the table of the top stacks (also
/// every `--interval` while tracing).
fn memleak(a: MemleakArgs) -> Result<()> {
    let alloc = memleak_options(&a)?;
    let mut s = Session::start(&a.trace)?;
    s.without_statements()?;
    let target = &s.target;
    s.opts.announce = format!(
        "myprobe: tracking the allocations of {target} not freed (older than {} ms at the end; {}) \
         for {} s; Ctrl-C ends early",
        a.older,
        if a.sample > 1 {
            format!("those of one 100 ms period in {}, scaled", a.sample)
        } else {
            "every allocation".into()
        },
        a.trace.duration
    );
    let started = Instant::now();
    // Borrows only the symbolizer: the options are read while it reports.
    let stack_options = s.stack_options();
    let mut namer = StackNamer::new(&mut s.symbolizer, stack_options);
    let collected = collect::alloc::collect(&s.opts, &alloc, |so_far| {
        say_part!("after {:.0} s, ", started.elapsed().as_secs_f64());
        say_part!("{}", tables::outstanding(&mut namer, so_far, a.top));
    })?;
    let profile = stacks::build(&collected, &mut namer, Unit::Bytes, |c, row| {
        vec![Part::value(c.value(row, "bytes"))]
    });
    say_part!("{}", tables::outstanding(&mut namer, &collected, a.top));
    let what = "Outstanding allocations";
    s.finish(&collected, &profile, what, Palette::Mem)
}

/// What memleak traces, checked before the process is looked at.
fn memleak_options(a: &MemleakArgs) -> Result<collect::alloc::AllocOptions> {
    let mut alloc = a
        .filter
        .options(a.sample, Some(a.older.saturating_mul(1_000_000)))?;
    anyhow::ensure!(
        a.interval != Some(0),
        "--interval must be at least 1 second"
    );
    alloc.interval = a.interval.map(Duration::from_secs);
    Ok(alloc)
}

/// `profile syscalls`: time in syscalls (or their calls) by stack, with the table of syscalls before the
/// results.
fn syscalls(a: SyscallsArgs) -> Result<()> {
    let only = syscalls_named(&a.syscalls)?;
    let mut s = Session::start(&a.trace)?;
    s.without_statements()?;
    let target = &s.target;
    let which = if only.is_empty() {
        "the syscalls".to_string()
    } else {
        only.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
    };
    s.opts.announce = format!(
        "myprobe: timing {which} of {target} (calls ≥ {} µs) for {} s; Ctrl-C ends early",
        a.min_us, a.trace.duration
    );
    let found = collect::syscalls::collect(&s.opts, a.min_us.saturating_mul(1000), &only)?;
    let mut namer = s.namer();
    let (unit, column, scale) = if a.calls {
        (Unit::Count, "calls", 1)
    } else {
        (Unit::Microseconds, "total_ns", 1000)
    };
    let profile = stacks::build(&found.collected, &mut namer, unit, |c, row| {
        let leaf = format!("[syscall] {}", collect::syscalls::name(row.key));
        vec![Part::leaf(leaf, c.value(row, column) / scale)]
    });
    say_part!("{}", tables::syscalls(&found, a.top));
    s.finish(&found.collected, &profile, "Syscall", Palette::Io)
}

/// The syscalls `--syscall` names, each known on this architecture.
fn syscalls_named(names: &[String]) -> Result<Vec<Sysno>> {
    names
        .iter()
        .map(|name| {
            name.trim().parse::<Sysno>().map_err(|_| {
                anyhow::anyhow!(
                    "--syscall: no syscall {name:?} on this architecture (e.g. pwrite64, fsync)"
                )
            })
        })
        .collect()
}

/// One tracing run of a command: its options, the process, and what is resolved before tracing.
struct Session<'a> {
    a: &'a TraceArgs,
    target: Target,
    opts: CollectOptions,
    symbolizer: Symbolizer,
    /// `--statement`.
    statement_filter: Option<regex::Regex>,
}

impl<'a> Session<'a> {
    /// Checks and resolves everything before tracing, including the symbolizer's one-time work, so that
    /// results come right after tracing ends.
    fn start(a: &'a TraceArgs) -> Result<Self> {
        anyhow::ensure!(a.duration > 0, "-d must be at least 1 second");
        if let Some(out) = &a.output {
            render::format_for(out)?;
        }
        let statement_filter = a
            .statement
            .as_deref()
            .map(|re| crate::cmd::flame::compile("--statement", re))
            .transpose()?;
        let target = a.target.resolve()?;
        let unwind = UnwindStore::for_tracing(target.pid, a.frame_pointers)?;
        let opts = CollectOptions {
            duration: Duration::from_secs(a.duration),
            kernel_stacks: a.kernel,
            unwind,
            ..a.target.collect_options(&target)
        };
        let mut symbolizer = Symbolizer::new(target.pid).context("preparing symbolization")?;
        symbolizer.preload(a.kernel);
        Ok(Session {
            a,
            target,
            opts,
            symbolizer,
            statement_filter,
        })
    }

    /// For the collectors that do not label their samples by statement: `--by statement` and `--statement` refused.
    fn without_statements(&self) -> Result<()> {
        anyhow::ensure!(
            self.a.by.is_none() && self.a.statement.is_none(),
            "--by statement and --statement are for profile cpu, offcpu, locks and alloc"
        );
        Ok(())
    }

    /// Labels the samples by statement, unless `--no-statements` or the process is no server.
    fn label_statements(&mut self) -> Result<()> {
        let asked = self.a.by == Some(By::Statement) || self.a.statement.is_some();
        if self.a.no_statements || !self.target.flavor.is_server() {
            anyhow::ensure!(
                !asked,
                "--by statement and --statement need the statements read: {}",
                if self.a.no_statements {
                    "drop --no-statements"
                } else {
                    "the process is no MySQL or MariaDB server"
                }
            );
            return Ok(());
        }
        self.opts.statements = Some(collect::labels::StatementLabels::new(
            crate::sessions::statements::StatementsInMemory::boxed(),
        ));
        Ok(())
    }

    fn stack_options(&self) -> StackOptions {
        StackOptions {
            pid: self.target.pid,
            per_thread: self.a.per_thread,
            addresses: self.a.addresses,
            by_statement: self.a.by == Some(By::Statement),
        }
    }

    fn namer(&mut self) -> StackNamer<'_> {
        let opts = self.stack_options();
        StackNamer::new(&mut self.symbolizer, opts)
            .with_statement_filter(self.statement_filter.clone())
    }

    /// Writes the results and reports on stderr: time to results, losses, top functions.
    fn finish(
        &self,
        collected: &Collected,
        profile: &Profile,
        what: &str,
        palette: Palette,
    ) -> Result<()> {
        let (a, target, ended) = (self.a, &self.target, self.opts.stop.ended());
        let mut meta = serde_json::Map::new();
        meta.insert("pid".into(), target.pid.into());
        meta.insert("process".into(), target.comm.clone().into());
        meta.insert("exe".into(), target.exe.display().to_string().into());
        meta.insert("flavor".into(), target.flavor.to_string().into());
        meta.insert("version".into(), target.version.clone().into());
        meta.insert("duration_s".into(), collected.traced.as_secs_f64().into());
        meta.insert("events".into(), collected.events.into());
        meta.insert("lost".into(), collected.lost.to_json());
        if let Some(t) = collected.statement_texts {
            meta.insert(
                "statements".into(),
                serde_json::json!({ "fingerprints": t.fingerprints, "texts": t.labels }),
            );
        }
        let estimate = collected.estimate.as_ref();
        if let Some(e) = estimate {
            meta.insert("estimate".into(), e.to_json());
        }
        let opts = RenderOptions {
            title: a
                .title
                .clone()
                .unwrap_or_else(|| format!("{what} flame graph: {target}")),
            count_name: None,
            palette,
            meta,
            estimate: estimate.map(|e| e.describe()),
        };
        render::write_profile(profile, a.output.as_deref(), &opts)?;
        let ms = ended.elapsed().as_secs_f64() * 1000.0;
        let (events, total, unit, secs) = (
            collected.events,
            profile.total(),
            profile.unit.count_name(),
            collected.traced.as_secs_f64(),
        );
        match estimate {
            None => say!(
                "myprobe: {events} events, {} stacks, {total} {unit} traced in {secs:.1} s",
                profile.len()
            ),
            Some(e) => say!(
                "myprobe: {} events, {} stacks traced; estimated: ~{events} events, ~{total} {unit} ({}) \
                 traced in {secs:.1} s",
                e.traced,
                profile.len(),
                e.describe()
            ),
        }
        if let Some(t) = collected.statement_texts {
            say!(
                "myprobe: statements: {} fingerprints, from {} texts read",
                t.fingerprints,
                t.labels
            );
        }
        for line in collected.lost.report(collected.events) {
            say!("myprobe: warning: {line}");
        }
        if let Some(warning) = estimate.and_then(|e| e.warning.as_ref()) {
            say!("myprobe: warning: {warning}");
        }
        if let Some(out) = &a.output {
            say!("myprobe: wrote {}", out.display());
        }
        say!("myprobe: results written in {ms:.0} ms after tracing ended");
        let memory = palette == Palette::Mem;
        if !profile.is_empty() {
            say_part!(
                "{}",
                render::summary::top_functions(profile, 10, memory, estimate.is_some())
            );
        }
        let debuginfod = std::env::var_os("DEBUGINFOD_URLS").is_some_and(|u| !u.is_empty());
        if let Some(line) = render::summary::unnamed_line(profile, memory, debuginfod) {
            say!("myprobe: {line}");
        }
        Ok(())
    }
}
