//! Collectors: load and attach BPF programs, trace until the duration ends or Ctrl-C, and hand what they
//! found (raw stacks, with named values) to the layers above. One module per collector, one BPF file each.
//!
//! Every collector that traces has the same life cycle, which [`lifecycle::run`] owns: a collector supplies its
//! skeleton and its hooks ([`lifecycle::Lifecycle`]). The stack collectors' hooks are shared
//! ([`stack_collector::run`]): each supplies its own settings and programs, and its map of sums (see
//! [`stack_collector::Collector`]); `queries` follows statements rather than stacks, with hooks of its own.

pub mod alloc;
pub mod budget;
mod collected;
pub mod cpu;
pub mod features;
pub mod labels;
pub mod lifecycle;
pub mod load;
pub mod locks;
pub mod maps;
pub mod offcpu;
pub mod periods;
pub mod queries;
pub mod ring;
pub mod skeleton;
pub mod stack_collector;
pub mod syscalls;
pub mod targets;
pub mod threads;
pub mod trace;
pub mod unwind_store;

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{Context, Result};

pub(crate) use collected::lost_in_kernel;
pub use collected::{Collected, Estimate, Kind, Lost, RawStack, Row, Slice};
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
    /// A run not stopped yet. Ctrl-C stops it once the handler is installed, by [`lifecycle::open_and_load`] before
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
    pub ring: RingOptions,
    /// Load the programs, tell here what the verifier needed for each, and end there, nothing attached
    /// (`myprobe programs`).
    pub verify_only: Option<std::sync::mpsc::Sender<load::Verified>>,
    /// Label each sample by the statement its thread runs (src/bpf/statement.h), where the collector can; the
    /// servers' layouts are found once for the run's collectors.
    pub statements: Option<Arc<labels::StatementLabels>>,
}

/// What a collector summed, moved out of the kernel every `every` while it goes on tracing, and sent as a
/// [`Slice`].
#[derive(Clone)]
pub struct Slices {
    pub every: Duration,
    pub send: std::sync::mpsc::Sender<Slice>,
}

/// How [`ring::poll`] reads a ring buffer.
#[derive(Clone, Copy, Debug)]
pub struct RingOptions {
    /// Whether it shows its progress line on a terminal: off where a command runs several collectors at once and
    /// shows one line for all of them (`myprobe report`).
    pub progress: bool,
    /// Whether it says that the traced process exited: off where the command says it once for all its collectors.
    pub say_exit: bool,
    /// The longest it waits between ticks: 100 ms where records are written as they come and progress is shown;
    /// the agent, which answers in seconds, waits 1 s, so that its readers wake a busy server's CPUs less (every
    /// wakeup of a tracer thread there takes a CPU from a server thread).
    pub interval: Duration,
}

impl Default for RingOptions {
    fn default() -> RingOptions {
        RingOptions {
            progress: true,
            say_exit: true,
            interval: Duration::from_millis(100),
        }
    }
}

impl RingOptions {
    /// For a collector that runs beside others, under a command that shows progress and says an exit once.
    pub fn quiet(interval: Duration) -> RingOptions {
        RingOptions {
            progress: false,
            say_exit: false,
            interval,
        }
    }
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
            ring: RingOptions::default(),
            verify_only: None,
            statements: None,
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

/// The `.rodata` of an opened skeleton (`open.maps.rodata_data`), where a collector's settings go before
/// loading.
pub fn rodata<T>(data: Option<&mut T>) -> Result<&mut T> {
    data.context("BPF object has no .rodata")
}

/// Runs a task iterator program once and returns what it wrote.
pub fn run_task_iterator(iterator: &libbpf_rs::ProgramMut) -> Result<Vec<u8>> {
    let link = iterator
        .attach_iter_with_opts(libbpf_rs::IterOpts::None)
        .context("attaching the task iterator")?;
    let mut records = Vec::new();
    read_task_iterator(&link, &mut records)?;
    Ok(records)
}

/// Runs a task iterator's `link` once (made by [`process_task_iterator`] to run again), appending what it wrote to
/// `records`.
pub fn read_task_iterator(link: &libbpf_rs::Link, records: &mut Vec<u8>) -> Result<()> {
    std::io::Read::read_to_end(
        &mut libbpf_rs::Iter::new(link).context("running the task iterator")?,
        records,
    )
    .context("running the task iterator")?;
    Ok(())
}

/// A task iterator's link that walks the process `pid`'s threads only (kernels from 6.1), else every task of the
/// host (where the program keeps the process's). libbpf-rs 0.27's options have no task, hence libbpf's own call.
pub fn process_task_iterator(
    program: &libbpf_rs::ProgramMut<'_>,
    pid: u32,
) -> Result<libbpf_rs::Link> {
    use libbpf_rs::AsRawLibbpf;
    let mut info = libbpf_sys::bpf_iter_link_info::default();
    info.task.pid = pid;
    let opts = libbpf_sys::bpf_iter_attach_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_iter_attach_opts>() as _,
        link_info: &mut info,
        link_info_len: std::mem::size_of::<libbpf_sys::bpf_iter_link_info>() as _,
        ..Default::default()
    };
    // SAFETY: the program is loaded and outlives the call; `opts` and `info` live across it.
    let link =
        unsafe { libbpf_sys::bpf_program__attach_iter(program.as_libbpf_object().as_ptr(), &opts) };
    // libbpf returns NULL with errno set on failure (libbpf 1.0's mode, libbpf-rs's).
    match std::ptr::NonNull::new(link) {
        // SAFETY: a link libbpf made, handed over whole: the `Link` destroys it.
        Some(link) => Ok(unsafe { libbpf_rs::Link::from_ptr(link) }),
        None => program
            .attach_iter_with_opts(libbpf_rs::IterOpts::None)
            .context("attaching the task iterator"),
    }
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
