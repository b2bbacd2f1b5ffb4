//! `myprobe profile cpu|offcpu`: trace, symbolize, aggregate into a Profile, render.

use std::{cell::RefCell, collections::HashMap, path::PathBuf, rc::Rc, time::{Duration, Instant}};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use crate::{
    collect::{self, CollectOptions, Collected, RawStack},
    profile::{Profile, Unit},
    render::{self, Palette, RenderOptions},
    symbolize::{data::DataSymbolizer, Symbolizer},
    target::{self, Target},
    unwind::ProcessTables,
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
}

/// Options every tracing profile shares.
#[derive(Args)]
pub struct TraceArgs {
    /// Server process to trace [default: the one running mariadbd or mysqld]
    #[arg(short = 'p', long = "pid")]
    pub pid: Option<u32>,
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
    /// Trace a process that is not mariadbd/mysqld (e.g. a test program)
    #[arg(long)]
    pub any_process: bool,
    /// BTF file of the running kernel, for kernels without /sys/kernel/btf/vmlinux
    #[arg(long, value_name = "FILE")]
    pub btf: Option<PathBuf>,
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
    fn options(&self, sample: u64, outstanding_older_than: Option<u64>) -> Result<collect::alloc::AllocOptions> {
        anyhow::ensure!(sample >= 1, "--sample must be at least 1");
        let (min_size, max_size) = (self.min_size.unwrap_or(0), self.max_size.unwrap_or(u64::MAX));
        anyhow::ensure!(min_size <= max_size, "-z must not be above -Z");
        Ok(collect::alloc::AllocOptions { sample_every: sample, min_size, max_size, outstanding_older_than, interval: None })
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
}

pub fn run(c: ProfileCommand) -> Result<()> {
    match c {
        ProfileCommand::Cpu(a) => {
            anyhow::ensure!((1..=10_000).contains(&a.frequency), "-F must be between 1 and 10000 Hz");
            let (target, opts, mut symbolizer) = prepare(&a.trace)?;
            eprintln!("myprobe: sampling on-CPU stacks of {target} at {} Hz for {} s; Ctrl-C ends early", a.frequency, a.trace.duration);
            let collected = collect::cpu::collect(&opts, a.frequency)?;
            let ended = collect::tracing_ended();
            let profile = build_profile(&target, &mut symbolizer, &collected, Unit::Samples, &a.trace, |_, v| vec![(None, v[0])])?;
            finish(&target, &a.trace, &collected, &profile, ended, "CPU", Palette::Hot)
        }
        ProfileCommand::Offcpu(a) => {
            let (target, opts, mut symbolizer) = prepare(&a.trace)?;
            eprintln!(
                "myprobe: tracing off-CPU time of {target} (waits ≥ {} µs) for {} s; Ctrl-C ends early",
                a.min_block_us, a.trace.duration
            );
            let collected = collect::offcpu::collect(&opts, a.min_block_us)?;
            let ended = collect::tracing_ended();
            // Microseconds, as offcputime and the users' flame graphs count; the split is the leaf frame.
            let profile = build_profile(&target, &mut symbolizer, &collected, Unit::Microseconds, &a.trace, |_, v| {
                vec![(Some("[blocked]"), v[0] / 1000), (Some("[runnable]"), v[1] / 1000)]
            })?;
            finish(&target, &a.trace, &collected, &profile, ended, "Off-CPU", Palette::Io)
        }
        ProfileCommand::Alloc(a) => {
            let alloc = a.filter.options(a.sample, None)?;
            let (target, opts, mut symbolizer) = prepare(&a.trace)?;
            let every = if alloc.sample_every > 1 { format!("every {}th call", alloc.sample_every) } else { "every call".into() };
            eprintln!("myprobe: tracing the allocations of {target} ({every}) for {} s; Ctrl-C ends early", a.trace.duration);
            let collected = collect::alloc::collect(&opts, &alloc, |_| {})?;
            let ended = collect::tracing_ended();
            let (unit, what) = if a.calls { (Unit::Count, 1) } else { (Unit::Bytes, 0) };
            let profile = build_profile(&target, &mut symbolizer, &collected, unit, &a.trace, |_, v| vec![(None, v[what])])?;
            finish(&target, &a.trace, &collected, &profile, ended, "Allocation", Palette::Mem)
        }
        ProfileCommand::Locks(a) => {
            let (target, opts, mut symbolizer) = prepare(&a.trace)?;
            let mut names = DataSymbolizer::new(target.pid).context("reading the process's memory map")?;
            eprintln!("myprobe: timing the lock (futex) waits of {target} for {} s; Ctrl-C ends early", a.trace.duration);
            let found = collect::locks::collect(&opts)?;
            let ended = collect::tracing_ended();
            let mut profile = Profile::new(Unit::Microseconds);
            let mut locks: HashMap<u64, LockSummary> = HashMap::new();
            for (addr, raw, w) in &found.waits {
                let name = format!("lock {}", names.name(*addr));
                let frames: Vec<Rc<str>> = symbolizer.user_stack(raw.user());
                let mut ids = vec![profile.intern(&name)];
                ids.extend(frames.iter().rev().map(|f| profile.intern(f)));
                profile.add_ids(ids, w.total_ns / 1000);
                let l = locks.entry(*addr).or_default();
                l.waits += w.count;
                l.total_ns += w.total_ns;
                l.max_ns = l.max_ns.max(w.max_ns);
                for (h, n) in l.hist.iter_mut().zip(w.hist) {
                    *h += n;
                }
                l.waiters.push((w.total_ns, innermost(&frames)));
            }
            for (addr, raw, n) in &found.wakes {
                if let Some(l) = locks.get_mut(addr) {
                    l.wakers.push((*n, innermost(&symbolizer.user_stack(raw.user()))));
                }
            }
            eprint!("{}", lock_table(&mut names, locks, a.top));
            let collected = Collected {
                events: found.waits.iter().map(|w| w.2.count).sum(),
                lost: found.lost,
                traced: found.traced,
                ..Collected::default()
            };
            finish(&target, &a.trace, &collected, &profile, ended, "Lock wait", Palette::Io)
        }
        ProfileCommand::Memleak(a) => {
            let mut alloc = a.filter.options(a.sample, Some(a.older.saturating_mul(1_000_000)))?;
            anyhow::ensure!(a.interval != Some(0), "--interval must be at least 1 second");
            alloc.interval = a.interval.map(Duration::from_secs);
            let (target, opts, mut symbolizer) = prepare(&a.trace)?;
            eprintln!(
                "myprobe: tracking the allocations of {target} not freed (older than {} ms at the end; {}) for {} s; Ctrl-C ends early",
                a.older,
                if a.sample > 1 { format!("those of one 100 ms period in {}, scaled", a.sample) } else { "every allocation".into() },
                a.trace.duration
            );
            let started = Instant::now();
            let collected = collect::alloc::collect(&opts, &alloc, |so_far| {
                eprint!("after {:.0} s, ", started.elapsed().as_secs_f64());
                eprint!("{}", outstanding_table(&mut symbolizer, so_far, a.top));
            })?;
            let ended = collect::tracing_ended();
            let profile = build_profile(&target, &mut symbolizer, &collected, Unit::Bytes, &a.trace, |_, v| vec![(None, v[0])])?;
            eprint!("{}", outstanding_table(&mut symbolizer, &collected, a.top));
            finish(&target, &a.trace, &collected, &profile, ended, "Outstanding allocations", Palette::Mem)
        }
    }
}

/// Checks and resolves everything before tracing, including the symbolizer's one-time work, so that
/// results come right after tracing ends.
fn prepare(a: &TraceArgs) -> Result<(Target, CollectOptions, Symbolizer)> {
    anyhow::ensure!(a.duration > 0, "-d must be at least 1 second");
    if let Some(out) = &a.output {
        render::format_for(out)?;
    }
    target::check_environment(a.btf.as_deref())?;
    let target = target::resolve(a.pid, a.any_process)?;
    let unwind = if a.frame_pointers || !cfg!(target_arch = "x86_64") {
        None
    } else {
        let tables = ProcessTables::load(target.pid).context("reading the unwind tables of the process")?;
        for w in &tables.warnings {
            eprintln!("myprobe: warning: {w}");
        }
        Some(RefCell::new(tables))
    };
    let opts = CollectOptions {
        pid: target.pid,
        duration: Duration::from_secs(a.duration),
        kernel_stacks: a.kernel,
        btf: a.btf.clone(),
        unwind,
    };
    let mut symbolizer = Symbolizer::new(target.pid).context("preparing symbolization")?;
    symbolizer.preload(a.kernel);
    Ok((target, opts, symbolizer))
}

/// Symbolizes each unique stack once and adds it to a profile, root first; `split` turns a stack's two values
/// into (leaf marker frame, value) parts.
fn build_profile(
    target: &Target,
    symbolizer: &mut Symbolizer,
    collected: &Collected,
    unit: Unit,
    a: &TraceArgs,
    split: impl Fn(&RawStack, [u64; 2]) -> Vec<(Option<&'static str>, u64)>,
) -> Result<Profile> {
    let mut profile = Profile::new(unit);
    let mut thread_names = std::collections::HashMap::new();
    for (raw, &values) in &collected.stacks {
        let mut frames: Vec<Rc<str>> = Vec::with_capacity(raw.ips.len() + 2);
        if a.per_thread {
            let name = thread_names.entry(raw.tid).or_insert_with(|| thread_frame(target.pid, raw.tid));
            frames.push(Rc::clone(name));
        }
        if a.addresses {
            frames.extend(raw.ips.iter().rev().map(|ip| Rc::from(format!("{ip:#x}"))));
        } else {
            let user = symbolizer.user_stack(raw.user());
            frames.extend(user.into_iter().rev());
            let kernel = symbolizer.kernel_stack(raw.kernel());
            frames.extend(kernel.into_iter().rev());
            // Threads of the process that never run user code (io_uring's workers), or an unreadable stack.
            if raw.ips.is_empty() {
                frames.push(Rc::from(NO_STACK));
            }
        }
        for (leaf, value) in split(raw, values) {
            if value == 0 {
                continue;
            }
            let mut ids: Vec<u32> = frames.iter().map(|f| profile.intern(f)).collect();
            if let Some(leaf) = leaf {
                ids.push(profile.intern(leaf));
            }
            profile.add_ids(ids, value);
        }
    }
    Ok(profile)
}

/// memleak's table: the `top` stacks holding the most bytes, with their allocation counts and innermost frames
/// (leaf last), like bcc's memleak prints them.
fn outstanding_table(symbolizer: &mut Symbolizer, collected: &Collected, top: usize) -> String {
    let mut stacks: Vec<_> = collected.stacks.iter().collect();
    stacks.sort_by(|a, b| b.1[0].cmp(&a.1[0]));
    let mut out = format!("top {} stacks by bytes not freed:\n", top.min(stacks.len()));
    for (raw, v) in stacks.into_iter().take(top) {
        let frames = innermost(&symbolizer.user_stack(raw.user()));
        out += &format!("  {} bytes in {} allocations from {frames}\n", v[0], v[1]);
    }
    out
}

/// One lock word's waits, with its waiter and waker stacks (innermost frames).
#[derive(Default)]
struct LockSummary {
    waits: u64,
    total_ns: u64,
    max_ns: u64,
    hist: [u64; collect::locks::HIST_BUCKETS],
    waiters: Vec<(u64, String)>,
    wakers: Vec<(u64, String)>,
}

/// The innermost frames of a stack (leaf last), for one line of a table.
fn innermost(frames: &[Rc<str>]) -> String {
    let shown: Vec<&str> = frames.iter().take(8).rev().map(|f| f.as_ref()).collect();
    shown.join(";")
}

/// The `top` locks by time waited, each with its wait histogram, waiter stacks and waker stacks.
fn lock_table(names: &mut DataSymbolizer, locks: HashMap<u64, LockSummary>, top: usize) -> String {
    let mut locks: Vec<(u64, LockSummary)> = locks.into_iter().collect();
    locks.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns));
    let ms = |ns: u64| format!("{:.3} ms", ns as f64 / 1e6);
    let mut out = format!("top {} locks by time waited:\n", top.min(locks.len()));
    for (addr, mut l) in locks.into_iter().take(top) {
        out += &format!("  {} ({addr:#x}): {} waits, {} in all, longest {}\n", names.name(addr), l.waits, ms(l.total_ns), ms(l.max_ns));
        let hist: Vec<String> = l
            .hist
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| if i == 0 { format!("<2us:{n}") } else { format!("{}us:{n}", 1u64 << i) })
            .collect();
        out += &format!("    waits by length: {}\n", hist.join(" "));
        l.waiters.sort_by(|a, b| b.0.cmp(&a.0));
        for (ns, stack) in l.waiters.iter().take(3) {
            out += &format!("    waiter {}: {stack}\n", ms(*ns));
        }
        l.wakers.sort_by(|a, b| b.0.cmp(&a.0));
        for (n, stack) in l.wakers.iter().take(3) {
            out += &format!("    woken {n} times by: {stack}\n");
        }
    }
    out
}

/// The frame of a stack with no frames at all.
const NO_STACK: &str = "[no user stack]";

fn thread_frame(pid: u32, tid: u32) -> Rc<str> {
    let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default();
    let name = name.trim();
    if name.is_empty() { format!("thread {tid}").into() } else { format!("thread {tid} ({name})").into() }
}

/// Writes the results and reports on stderr: time to results, losses, top functions.
fn finish(
    target: &Target,
    a: &TraceArgs,
    collected: &Collected,
    profile: &Profile,
    ended: Instant,
    what: &str,
    palette: Palette,
) -> Result<()> {
    let mut meta = serde_json::Map::new();
    meta.insert("pid".into(), target.pid.into());
    meta.insert("process".into(), target.comm.clone().into());
    meta.insert("exe".into(), target.exe.display().to_string().into());
    meta.insert("flavor".into(), target.flavor.to_string().into());
    meta.insert("version".into(), target.version.clone().into());
    meta.insert("duration_s".into(), collected.traced.as_secs_f64().into());
    meta.insert("events".into(), collected.events.into());
    meta.insert("lost".into(), serde_json::json!(collected.lost));
    let opts = RenderOptions {
        title: a.title.clone().unwrap_or_else(|| format!("{what} flame graph: {target}")),
        count_name: None,
        palette,
        meta,
    };
    render::write_profile(profile, a.output.as_deref(), &opts)?;
    let ms = ended.elapsed().as_secs_f64() * 1000.0;
    eprintln!(
        "myprobe: {} events, {} stacks, {} {} traced in {:.1} s",
        collected.events,
        profile.len(),
        profile.total(),
        profile.unit.count_name(),
        collected.traced.as_secs_f64()
    );
    for line in collected.lost_report() {
        eprintln!("myprobe: warning: {line}");
    }
    if let Some(out) = &a.output {
        eprintln!("myprobe: wrote {}", out.display());
    }
    eprintln!("myprobe: results written in {ms:.0} ms after tracing ended");
    if !profile.is_empty() {
        eprint!("{}", render::summary::top_functions(profile, 10, palette == Palette::Mem));
    }
    Ok(())
}
