//! Collectors: load and attach BPF programs, drain their events until the duration ends or Ctrl-C,
//! and hand raw stacks (addresses) to the symbolizer. One module per collector, all of this shape.

pub mod cpu;
pub mod offcpu;
pub mod queries;

use std::{
    collections::HashMap,
    io::IsTerminal,
    mem::MaybeUninit,
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use libbpf_rs::{skel::SkelBuilder, MapCore, OpenObject, RingBufferBuilder};

/// Set by Ctrl-C (or SIGTERM): tracing ends early and results are still written.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// Installs the Ctrl-C handler once; a second Ctrl-C while results are being written is ignored.
pub fn install_stop_handler() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let _ = ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst));
    });
}

/// What every collector needs to know.
pub struct CollectOptions {
    pub pid: u32,
    pub duration: Duration,
    pub kernel_stacks: bool,
    /// BTF of the running kernel, for kernels without /sys/kernel/btf/vmlinux.
    pub btf: Option<PathBuf>,
}

/// Opens a skeleton, pointing libbpf at a custom BTF file when one is given.
pub fn open_skel<'obj, B: SkelBuilder<'obj>>(
    mut builder: B,
    object: &'obj mut MaybeUninit<OpenObject>,
    opts: &CollectOptions,
) -> Result<B::Output> {
    // From here on Ctrl-C ends tracing with results; installed before anything is attached, so that a Ctrl-C
    // right after attaching still detaches cleanly.
    install_stop_handler();
    if let Some(btf) = &opts.btf {
        builder.object_builder_mut().btf_custom_path(btf).context("setting the BTF path")?;
    }
    builder.open(object).context("opening the BPF object")
}

/// Why events went missing; indexes match `enum lost_reason` in src/bpf/stack_event.h.
pub const LOST_REASONS: [&str; 4] = [
    "events dropped: ring buffer full",
    "stacks without user frames: user stack unreadable",
    "stacks without kernel frames: kernel stack unreadable",
    "waits not timed: per-thread state map full",
];

/// A stack as captured: user frames then kernel frames, both leaf first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawStack {
    pub tid: u32,
    pub kind: u32,
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

/// The result of a tracing run, before symbolization.
#[derive(Default)]
pub struct Collected {
    /// Per unique stack, the two values the collector sends (e.g. samples; or blocked and runnable ns).
    pub stacks: HashMap<RawStack, [u64; 2]>,
    pub events: u64,
    pub lost: [u64; 4],
    pub traced: Duration,
}

impl Collected {
    /// Adds one `struct stack_event` from the ring buffer; a malformed record is counted, never trusted.
    fn add_event(&mut self, data: &[u8]) {
        const HEADER: usize = 32;
        let u32_at = |o: usize| u32::from_ne_bytes(data[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_ne_bytes(data[o..o + 8].try_into().unwrap());
        let u16_at = |o: usize| u16::from_ne_bytes(data[o..o + 2].try_into().unwrap());
        if data.len() < HEADER {
            self.lost[0] += 1;
            return;
        }
        let (user_len, kernel_len) = (u16_at(24), u16_at(26));
        let frames = user_len as usize + kernel_len as usize;
        if data.len() < HEADER + frames * 8 {
            self.lost[0] += 1;
            return;
        }
        let ips: Box<[u64]> = (0..frames).map(|i| u64_at(HEADER + i * 8)).collect();
        self.add(RawStack { tid: u32_at(0), kind: u32_at(4), user_len, ips }, [u64_at(8), u64_at(16)]);
    }

    pub fn add(&mut self, stack: RawStack, values: [u64; 2]) {
        let v = self.stacks.entry(stack).or_insert([0, 0]);
        v[0] += values[0];
        v[1] += values[1];
        self.events += 1;
    }

    pub fn lost_total(&self) -> u64 {
        self.lost.iter().sum()
    }

    /// One line per kind of loss, for stderr; empty when nothing was lost.
    pub fn lost_report(&self) -> Vec<String> {
        let attempted = self.events + self.lost[0];
        self.lost
            .iter()
            .zip(LOST_REASONS)
            .filter(|(n, _)| **n > 0)
            .map(|(n, why)| {
                let pct = if attempted > 0 { *n as f64 * 100.0 / attempted as f64 } else { 100.0 };
                format!("{why}: {n} ({pct:.2}% of {attempted} events)")
            })
            .collect()
    }
}

/// Reads a collector's ring buffer of `struct stack_event` until `duration` passes or Ctrl-C; then reads what
/// is left. `lost` reads the collector's in-kernel loss counters at the end.
pub fn drain(events: &dyn MapCore, opts: &CollectOptions, what: &str, lost: impl Fn() -> [u64; 4]) -> Result<Collected> {
    let collected = std::cell::RefCell::new(Collected::default());
    let traced = poll_ring(
        events,
        opts.duration,
        |data| collected.borrow_mut().add_event(data),
        |elapsed| {
            let c = collected.borrow();
            Ok(format!("{what}: {:>4}/{} s, {} events, {} lost", elapsed.as_secs(), opts.duration.as_secs(), c.events, c.lost_total() + lost()[0]))
        },
    )?;
    let mut c = collected.into_inner();
    let in_kernel = lost();
    for (total, k) in c.lost.iter_mut().zip(in_kernel) {
        *total += k;
    }
    c.traced = traced;
    Ok(c)
}

/// Calls `on_event` for every record of a ring buffer until `duration` passes or Ctrl-C, then for what is
/// left. `tick` runs after every poll (at least every 100 ms) and returns a status line, shown once a second
/// on a terminal. Returns the time traced. The programs stay attached until the caller drops them.
pub fn poll_ring(
    events: &dyn MapCore,
    duration: Duration,
    mut on_event: impl FnMut(&[u8]),
    mut tick: impl FnMut(Duration) -> Result<String>,
) -> Result<Duration> {
    let mut builder = RingBufferBuilder::new();
    builder
        .add(events, |data: &[u8]| {
            on_event(data);
            0
        })
        .context("setting up the ring buffer reader")?;
    let ring = builder.build().context("setting up the ring buffer reader")?;

    install_stop_handler();
    let started = Instant::now();
    let show_progress = std::io::stderr().is_terminal();
    let mut last_progress = started;
    while !STOP.load(Ordering::SeqCst) {
        let left = duration.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        // The BPF side wakes us only once a batch has accumulated; otherwise what it sent without a wakeup is
        // read when the timeout expires, so nothing waits more than 100 ms.
        match ring.poll(left.min(Duration::from_millis(100))) {
            Ok(()) => {}
            Err(e) if e.kind() == libbpf_rs::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("reading the ring buffer"),
        }
        ring.consume().context("reading the ring buffer")?;
        let status = tick(started.elapsed())?;
        if show_progress && last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            eprint!("\r{status}   ");
        }
    }
    let traced = started.elapsed();
    ring.consume().context("reading the ring buffer")?;
    if show_progress {
        eprintln!();
    }
    Ok(traced)
}

/// The CPUs perf events can be opened on.
pub fn online_cpus() -> Result<Vec<u32>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").context("reading /sys/devices/system/cpu/online")?;
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
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
