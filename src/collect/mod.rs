//! Collectors: load and attach BPF programs, trace until the duration ends or Ctrl-C, and hand what they
//! found (raw stacks, with named values) to the layers above. One module per collector, one BPF file each.
//!
//! Every stack-capturing collector has the same life cycle, which [`stack_collector::run`] owns: a collector
//! module supplies its skeleton, its own settings and programs, and its map of sums (see
//! [`stack_collector::Collector`]). `queries` follows statements rather than stacks and drives the ring
//! buffer itself ([`ring`]).

pub mod alloc;
pub mod budget;
pub mod cpu;
pub mod features;
pub mod load;
pub mod locks;
pub mod maps;
pub mod offcpu;
pub mod periods;
pub mod queries;
pub mod ring;
pub mod stack_collector;
pub mod syscalls;
pub mod targets;
pub mod threads;
pub mod trace;
pub mod unwind_store;

use std::{
    mem::MaybeUninit,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{Context, Result};
use libbpf_rs::{skel::SkelBuilder, OpenObject};

pub use features::Features;

/// Set by Ctrl-C (or SIGTERM), for every run of the process: a signal handler has no other place to write to. Read
/// only through [`Stop`], which every loop that Ctrl-C ends is given.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Installs the Ctrl-C handler once; a second Ctrl-C while results are being written is ignored.
pub fn install_stop_handler() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let _ = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst));
    });
}

/// Whether Ctrl-C (or SIGTERM) came.
fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Ends a run of collectors, and tells when it ended. One per run, cloned into each collector of it (the
/// clones share it): the command that runs several ends them all at once, a collector whose results nobody
/// reads any more ends its own run, and Ctrl-C ends every run. Commands that run no collector (`stat`, `pfs`)
/// and the agent's own loops ask one too: it is the only way to the Ctrl-C flag.
#[derive(Clone, Debug, Default)]
pub struct Stop {
    stopped: Arc<AtomicBool>,
    ended: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

impl Stop {
    /// A run not stopped yet. Ctrl-C stops it once the handler is installed, by [`open_object`] before
    /// anything is attached (not here: the agent installs it after choosing its threads' scheduling, which the
    /// handler's thread inherits).
    pub fn new() -> Stop {
        Stop::default()
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst) || interrupted()
    }

    /// Notes that tracing ended now (the last of its collectors to end says it).
    pub fn mark_ended(&self) {
        *self.ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
    }

    /// When tracing ended: what "results within N ms after tracing ended" counts from, the maps read after it
    /// included. Now, if it has not ended.
    pub fn ended(&self) -> std::time::Instant {
        self.ended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(std::time::Instant::now)
    }
}

/// The collectors, as the commands that run several at once name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Cpu,
    Offcpu,
    Locks,
    Alloc,
    Syscalls,
    Statements,
    Trace,
}

impl Kind {
    /// The stack collectors that `report` and the agent run.
    pub const PROFILES: [Kind; 3] = [Kind::Cpu, Kind::Offcpu, Kind::Locks];

    /// Its short name: `cpu`, `offcpu`, …, `queries` (as files and metrics name it).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Cpu => "cpu",
            Kind::Offcpu => "offcpu",
            Kind::Locks => "locks",
            Kind::Alloc => "alloc",
            Kind::Syscalls => "syscalls",
            Kind::Statements => "queries",
            Kind::Trace => "trace",
        }
    }

    /// What it traces, for people.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Cpu => "on-CPU",
            Kind::Offcpu => "off-CPU",
            Kind::Locks => "lock waits",
            Kind::Alloc => "allocations",
            Kind::Syscalls => "syscalls",
            Kind::Statements => "statements",
            Kind::Trace => "functions",
        }
    }
}

/// What every collector needs to know.
pub struct CollectOptions {
    pub pid: u32,
    pub duration: Duration,
    pub kernel_stacks: bool,
    /// BTF of the running kernel, for kernels without /sys/kernel/btf/vmlinux.
    pub btf: Option<PathBuf>,
    /// `.eh_frame` tables for unwinding user stacks in the kernel, shared with the collectors that trace the
    /// same process or processes of the same code; `None`: frame pointers only.
    pub unwind: Option<Arc<unwind_store::UnwindStore>>,
    /// The kernel memory the maps may take, in bytes (`--max-kernel-mem`; see [`budget`]).
    pub max_kernel_mem: u64,
    /// Said on stderr once the probes are in place (what is traced, for how long): a line that scripts and
    /// tests can wait for.
    pub announce: String,
    /// Told the collector's name once its probes are in place, by a command that runs several at once.
    pub attached: Option<std::sync::mpsc::Sender<Kind>>,
    /// Sums moved out while tracing goes on (`myprobe agent`); `None`: read once, when tracing ends.
    pub slices: Option<Slices>,
    /// Every process of this set rather than `pid` alone (target.h's `many_targets`: the agent's off-CPU for
    /// its servers), each one's slices sent to it rather than to `slices.send`; the run ends once none is left.
    pub targets: Option<Arc<targets::Targets>>,
    /// Attached for one period in N only (`myprobe agent`; `myprobe queries`, with N chosen from the rate of
    /// statements), the sums scaled by N; `None`: all the time.
    pub duty: Option<periods::Duty>,
    /// Ends the run this collector is part of.
    pub stop: Stop,
    /// How the ring buffer is read: progress, wakeups.
    pub ring: ring::RingOptions,
    /// Load the programs, tell here what the verifier needed for each, and end there, nothing attached
    /// (`myprobe programs`).
    pub verify_only: Option<std::sync::mpsc::Sender<load::Verified>>,
}

/// What a collector summed, moved out of the kernel every `every` while it goes on tracing, and sent as a
/// [`Slice`].
#[derive(Clone)]
pub struct Slices {
    pub every: Duration,
    pub send: std::sync::mpsc::Sender<Slice>,
}

/// A collector's sums of the time since the slice before. Its `lost` counts from the attaching.
pub struct Slice {
    pub collector: Kind,
    /// When it was taken: what it covers ends here.
    pub at: std::time::Instant,
    pub collected: Collected,
}

impl CollectOptions {
    /// Options to trace `pid` until stopped, with nothing else asked: the rest is set field by field.
    pub fn new(pid: u32, btf: Option<PathBuf>, max_kernel_mem: u64, stop: Stop) -> CollectOptions {
        CollectOptions {
            pid,
            duration: Duration::MAX,
            kernel_stacks: false,
            btf,
            unwind: None,
            max_kernel_mem,
            announce: String::new(),
            attached: None,
            slices: None,
            targets: None,
            duty: None,
            stop,
            ring: ring::RingOptions::default(),
            verify_only: None,
        }
    }

    /// The maps its objects reuse from another's rather than make (`budget::fit` leaves them out).
    pub fn shared_maps(&self) -> &'static [&'static str] {
        match &self.unwind {
            Some(_) if !self.features().compat() => &unwind_store::SHARED_MAPS,
            _ => &[],
        }
    }

    /// The features of the running kernel.
    pub fn features(&self) -> Features {
        Features::of_kernel(self.btf.as_deref())
    }
}

/// A stack as captured: user frames then kernel frames, both leaf first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawStack {
    pub user_len: u16,
    pub ips: Box<[u64]>,
}

impl RawStack {
    pub fn user(&self) -> &[u64] {
        &self.ips[..self.user_len as usize]
    }
    pub fn kernel(&self) -> &[u64] {
        &self.ips[self.user_len as usize..]
    }
}

/// One result of a collector: a stack, what else the values were summed by, and the values, in the order of
/// [`Collected::columns`].
#[derive(Clone, Debug)]
pub struct Row {
    /// The thread, for collectors that sum per thread (cpu, offcpu); 0 for the others.
    pub tid: u32,
    /// What else the collector sums by: the lock word (locks), the syscall number (syscalls); 0 otherwise.
    pub key: u64,
    /// Shared by the rows of one stack; `Arc`, so that what a collector found can be handed to another thread.
    pub stack: Arc<RawStack>,
    pub values: Box<[u64]>,
}

/// What was lost while tracing, by cause (`struct lost_counts` of src/bpf/lost.h, and what user space adds):
/// reported, never dropped silently.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    /// Events dropped: the ring buffer was full.
    pub ringbuf: u64,
    /// Stacks kept without user frames: the user stack was unreadable.
    pub user_stack: u64,
    /// Stacks kept without kernel frames.
    pub kernel_stack: u64,
    /// Not counted: a per-thread or summing map was full.
    pub state: u64,
    /// Amounts whose stack never reached user space (its definition was dropped): left out.
    pub undefined_stacks: u64,
}

impl Lost {
    /// Every loss, summed; stops at `u64::MAX`.
    pub fn total(&self) -> u64 {
        [
            self.ringbuf,
            self.user_stack,
            self.kernel_stack,
            self.state,
            self.undefined_stacks,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    /// One line per kind of loss, for stderr; empty when nothing was lost. `events`: what was traced.
    pub fn report(&self, events: u64) -> Vec<String> {
        let reasons = [
            (self.ringbuf, "events dropped: ring buffer full"),
            (
                self.user_stack,
                "stacks without user frames: user stack unreadable",
            ),
            (
                self.kernel_stack,
                "stacks without kernel frames: kernel stack unreadable",
            ),
            (
                self.state,
                "not counted: a per-thread or per-stack map is full",
            ),
            (
                self.undefined_stacks,
                "left out: amounts whose stack was never received",
            ),
        ];
        let attempted = events
            .saturating_add(self.ringbuf)
            .saturating_add(self.state);
        reasons
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, why)| {
                let pct = if attempted > 0 {
                    *n as f64 * 100.0 / attempted as f64
                } else {
                    100.0
                };
                format!("{why}: {n} ({pct:.2}% of {attempted} events)")
            })
            .collect()
    }

    /// For JSON metadata.
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "ringbuf": self.ringbuf,
            "user_stack": self.user_stack,
            "kernel_stack": self.kernel_stack,
            "state": self.state,
            "undefined_stacks": self.undefined_stacks,
        })
    }
}

/// The [`Lost`] counted in the kernel, from a skeleton's generated `struct lost_counts` (src/bpf/lost.h):
/// each skeleton has its own type of it, so this is a macro rather than a function.
macro_rules! lost_in_kernel {
    ($counts:expr) => {{
        let l = $counts;
        $crate::collect::Lost {
            ringbuf: l.ringbuf,
            user_stack: l.user_stack,
            kernel_stack: l.kernel_stack,
            state: l.state,
            undefined_stacks: 0,
        }
    }};
}
pub(crate) use lost_in_kernel;

/// The result of a tracing run, before symbolization: every collector returns this.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    /// The names of the values of every row, e.g. `["blocked_ns", "runnable_ns", "periods"]`.
    pub columns: Vec<String>,
    pub rows: Vec<Row>,
    /// What was traced: samples, waits, calls, allocations.
    pub events: u64,
    pub lost: Lost,
    pub traced: Duration,
    /// When the values were scaled up from a sample: how (every figure shown from them says it is estimated).
    pub estimate: Option<Estimate>,
}

/// Figures scaled up from a sample of what happened.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// How the sample was taken, e.g. `the allocations of one 100 ms period in 10 (0.4 s of 4.0 s)`.
    pub sampling: String,
    /// What every value traced was multiplied by.
    pub scale: f64,
    /// The events traced before scaling, e.g. allocation calls.
    pub traced: u64,
    /// For stderr, when the sample is too small to estimate from: what it misses, and what exact figures cost.
    pub warning: Option<String>,
}

impl Estimate {
    /// One line: `scaled ×9.87 from the allocations of ...`.
    pub fn describe(&self) -> String {
        format!("scaled ×{:.2} from {}", self.scale, self.sampling)
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "sampling": self.sampling,
            "scale": self.scale,
            "traced": self.traced,
        })
    }
}

impl Collected {
    /// The index of the column `name` in every row's values.
    ///
    /// Panics if the collector has no such column: a mistake in the code, not in the input.
    pub fn column(&self, name: &str) -> usize {
        self.columns
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| {
                panic!("no column {name} among {:?}", self.columns);
            })
    }

    /// The value of column `name` in `row`.
    pub fn value(&self, row: &Row, name: &str) -> u64 {
        row.values[self.column(name)]
    }
}

/// The `.rodata` of an opened skeleton (`open.maps.rodata_data`), where a collector's settings go before
/// loading.
pub fn rodata<T>(data: Option<&mut T>) -> Result<&mut T> {
    data.context("BPF object has no .rodata")
}

/// Opens a BPF object, pointing libbpf at the kernel's BTF when given one. From here on Ctrl-C ends tracing
/// with results: the handler is installed before anything is attached, so that a Ctrl-C right after attaching
/// still detaches cleanly.
pub fn open_object<'obj, B: SkelBuilder<'obj>>(
    mut builder: B,
    object: &'obj mut MaybeUninit<OpenObject>,
    opts: &CollectOptions,
) -> Result<B::Output> {
    install_stop_handler();
    load::install_print();
    if let Some(btf) = &opts.btf {
        builder
            .object_builder_mut()
            .btf_custom_path(btf)
            .context("setting the BTF path")?;
    }
    let open = builder.open(object).context("opening the BPF object")?;
    let name = libbpf_rs::skel::OpenSkel::open_object(&open)
        .name()
        .unwrap_or_default();
    let collector = name.to_str().unwrap_or_default().trim_end_matches("_bpf");
    features::Features::of_kernel(opts.btf.as_deref()).require_build_for(collector)?;
    Ok(open)
}

/// Runs a task iterator program once and returns what it wrote.
pub fn run_task_iterator(iterator: &libbpf_rs::ProgramMut) -> Result<Vec<u8>> {
    let link = iterator
        .attach_iter_with_opts(libbpf_rs::IterOpts::None)
        .context("attaching the task iterator")?;
    let mut records = Vec::new();
    std::io::Read::read_to_end(
        &mut libbpf_rs::Iter::new(&link).context("running the task iterator")?,
        &mut records,
    )
    .context("running the task iterator")?;
    Ok(records)
}

/// The CPUs perf events can be opened on.
pub fn online_cpus() -> Result<Vec<u32>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .context("reading /sys/devices/system/cpu/online")?;
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.parse()?, b.parse()?);
        cpus.extend(a..=b);
    }
    Ok(cpus)
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of bpf_ktime_get_ns().
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_past_the_largest_stop_there() {
        let lost = Lost {
            ringbuf: u64::MAX,
            state: 2,
            undefined_stacks: 1,
            ..Lost::default()
        };
        assert_eq!(lost.total(), u64::MAX);
        let report = lost.report(5);
        assert_eq!(
            report[0],
            format!(
                "events dropped: ring buffer full: {0} (100.00% of {0} events)",
                u64::MAX
            )
        );
    }
}
