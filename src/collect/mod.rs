//! Collectors: load and attach BPF programs, drain their events until the duration ends or Ctrl-C,
//! and hand raw stacks (addresses) to the symbolizer. One module per collector, all of this shape.

/// The [`UnwindMaps`] of a collector, from its unwind maps and its skeleton's `.bss` (every collector
/// includes src/bpf/unwind.h, so the names are the same).
macro_rules! unwind_maps {
    ($rows:expr, $pages:expr, $bss:expr) => {
        $crate::collect::UnwindMaps {
            rows: $rows,
            pages: $pages,
            mappings: &mut $bss.unwind_mappings,
            count: &mut $bss.unwind_mapping_count,
            enabled: &mut $bss.unwind_enabled,
            generation: &mut $bss.unwind_generation,
        }
    };
}

pub mod alloc;
pub mod cpu;
pub mod locks;
pub mod offcpu;
pub mod queries;

use std::{
    cell::RefCell,
    collections::HashMap,
    io::IsTerminal,
    mem::MaybeUninit,
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use libbpf_rs::{skel::SkelBuilder, MapCore, MapFlags, OpenObject, RingBufferBuilder};

use crate::unwind::{BpfMapping, ProcessTables};

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
    /// `.eh_frame` tables for unwinding user stacks in the kernel; `None`: frame pointers only.
    pub unwind: Option<RefCell<ProcessTables>>,
}

/// Rows (and page index entries) the BPF unwinder maps hold beyond what the process has now, for libraries
/// loaded while tracing.
const SPARE_UNWIND_ROWS: usize = 65536;

/// Sizes a collector's unwind_rows and unwind_pages maps (before loading them).
pub fn size_unwind_maps(rows: &mut libbpf_rs::OpenMapMut, pages: &mut libbpf_rs::OpenMapMut, opts: &CollectOptions) -> Result<()> {
    let (r, p) = opts.unwind.as_ref().map(|t| (t.borrow().rows.len(), t.borrow().pages.len())).unwrap_or((0, 0));
    let size = |n: usize| if opts.unwind.is_some() { (n + SPARE_UNWIND_ROWS) as u32 } else { 1 };
    rows.set_max_entries(size(r)).context("sizing the unwind table map")?;
    pages.set_max_entries(size(p)).context("sizing the unwind page map")
}

/// One collector's side of the unwinder (src/bpf/unwind.h): its maps and `.bss` variables, and how much of
/// the tables it holds.
pub struct UnwindMaps<'a, M> {
    pub rows: &'a dyn MapCore,
    pub pages: &'a dyn MapCore,
    pub mappings: &'a mut [M],
    pub count: &'a mut u32,
    pub enabled: &'a mut u32,
    pub generation: &'a mut u32,
}

/// How much of the tables a collector's maps hold (rows and pages are only ever appended).
#[derive(Default)]
pub struct Installed {
    rows: usize,
    pages: usize,
    warned: bool,
}

/// Writes `items[*done..]` into an array map at the same indexes, as far as it holds; returns how far it got.
fn append_array<T>(map: &dyn MapCore, done: &mut usize, items: &[T]) -> Result<usize> {
    let end = items.len().min(map.max_entries() as usize);
    for (i, chunk) in items[(*done).min(end)..end].chunks(65536).enumerate() {
        let first = (*done + i * 65536) as u32;
        let keys: Vec<u8> = (first..first + chunk.len() as u32).flat_map(u32::to_ne_bytes).collect();
        // SAFETY: T is a #[repr(C)] plain-integer type of the map's value layout; the bytes are only read.
        let values = unsafe { std::slice::from_raw_parts(chunk.as_ptr().cast::<u8>(), std::mem::size_of_val(chunk)) };
        map.update_batch(&keys, values, chunk.len() as u32, MapFlags::ANY, MapFlags::ANY)
            .context("loading unwind tables into the kernel")?;
    }
    *done = end;
    Ok(end)
}

/// Loads the unwind tables into a collector's maps and turns unwinding on; called again after
/// `ProcessTables::update`. Rows and pages are appended before the mappings that use them are published, so a
/// stack being unwound meanwhile reads valid entries.
pub fn install_unwind<M>(opts: &CollectOptions, installed: &mut Installed, maps: &mut UnwindMaps<M>) -> Result<()> {
    let Some(tables) = &opts.unwind else { return Ok(()) };
    let tables = tables.borrow();
    assert_eq!(std::mem::size_of::<M>(), std::mem::size_of::<BpfMapping>(), "struct unwind_mapping layout");
    let rows = append_array(maps.rows, &mut installed.rows, &tables.rows)?;
    let pages = append_array(maps.pages, &mut installed.pages, &tables.pages)?;
    if (rows < tables.rows.len() || pages < tables.pages.len()) && !installed.warned {
        installed.warned = true;
        eprintln!(
            "myprobe: warning: the unwind tables of code loaded while tracing do not fit ({} rows for {}): its stacks are walked with frame pointers",
            maps.rows.max_entries(),
            tables.rows.len()
        );
    }
    // Mappings whose rows or pages did not fit are unwound with frame pointers.
    let usable: Vec<BpfMapping> = tables
        .mappings
        .iter()
        .map(|m| {
            let fits = (m.row_start + m.row_count) as usize <= rows && (m.page_start + m.page_count + 1) as usize <= pages;
            if fits { *m } else { BpfMapping { row_count: 0, ..*m } }
        })
        .take(maps.mappings.len())
        .collect();
    *maps.count = 0;
    // SAFETY: M and BpfMapping have the same size (asserted) and layout (src/bpf/unwind.h); at most
    // mappings.len() entries are written.
    unsafe {
        std::ptr::copy_nonoverlapping(usable.as_ptr().cast::<u8>(), maps.mappings.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(usable.as_slice()))
    };
    *maps.count = usable.len() as u32;
    *maps.enabled = 1;
    *maps.generation = maps.generation.wrapping_add(1);
    Ok(())
}

/// Called once a second (by drain): adds the tables of mappings that appeared (a plugin loaded) and installs them.
fn refresh_unwind<M>(opts: &CollectOptions, installed: &mut Installed, maps: &mut UnwindMaps<M>) -> Result<()> {
    let Some(tables) = &opts.unwind else { return Ok(()) };
    let changed = tables.borrow_mut().update(opts.pid).unwrap_or(false);
    if changed {
        install_unwind(opts, installed, maps)?;
    }
    Ok(())
}

/// Whether the running kernel is at least `major.minor`, to choose between ways of probing. MYPROBE_KERNEL_VERSION
/// (e.g. 5.17) takes the older ways on a newer kernel, for tests.
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::env::var("MYPROBE_KERNEL_VERSION")
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/osrelease"))
        .unwrap_or_default();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

/// Calls `f(first, second, value)` for every entry of a map keyed by two u64 (e.g. a lock word or a thread,
/// and a stack id).
pub fn for_each_keyed(map: &dyn MapCore, mut f: impl FnMut(u64, u64, &[u8])) {
    for_each_entry(map, |key, value| {
        if key.len() >= 16 {
            f(u64::from_ne_bytes(key[..8].try_into().unwrap()), u64::from_ne_bytes(key[8..16].try_into().unwrap()), value);
        }
    });
}

/// Calls `f(key, value)` for every entry of a hash map, read in batches (the maps summed in the kernel hold
/// up to a million entries); one entry at a time on kernels without batch lookups for hash maps.
pub fn for_each_entry(map: &dyn MapCore, mut f: impl FnMut(&[u8], &[u8])) {
    match map.lookup_batch(4096, MapFlags::ANY, MapFlags::ANY) {
        Ok(batches) => batches.for_each(|(k, v)| f(&k, &v)),
        Err(_) => {
            for key in map.keys() {
                if let Ok(Some(value)) = map.lookup(&key, MapFlags::ANY) {
                    f(&key, &value);
                }
            }
        }
    }
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
    "not counted: a per-thread or per-stack map is full",
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
/// is left. Once a second it installs the unwind tables of what the process mapped since (`unwind`: the
/// collector's maps, as far as `install_unwind` filled them). `check` returns the collector's in-kernel loss
/// counters; it is called after every poll with what was read so far, and with `true` once a second.
pub fn drain<M>(
    events: &dyn MapCore,
    opts: &CollectOptions,
    what: &str,
    (installed, mut unwind): (&mut Installed, UnwindMaps<M>),
    mut check: impl FnMut(bool, &Collected) -> Result<[u64; 4]>,
) -> Result<Collected> {
    let collected = std::cell::RefCell::new(Collected::default());
    let mut last_refresh = Instant::now();
    let traced = poll_ring(
        events,
        opts.duration,
        |data| collected.borrow_mut().add_event(data),
        |elapsed| {
            let refresh = last_refresh.elapsed() >= Duration::from_secs(1);
            if refresh {
                last_refresh = Instant::now();
                refresh_unwind(opts, installed, &mut unwind)?;
            }
            let c = collected.borrow();
            let lost = check(refresh, &c)?;
            Ok(format!("{what}: {:>4}/{} s, {} events, {} lost", elapsed.as_secs(), opts.duration.as_secs(), c.events, c.lost_total() + lost[0]))
        },
    )?;
    let mut c = collected.into_inner();
    let in_kernel = check(false, &c)?;
    for (total, k) in c.lost.iter_mut().zip(in_kernel) {
        *total += k;
    }
    c.traced = traced;
    Ok(c)
}

static TRACING_ENDED: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);

/// When the last tracing of this process ended (the end of `poll_ring`): what "results within N ms after
/// tracing ended" counts from, maps read after it included. Now, if no tracing ended.
pub fn tracing_ended() -> Instant {
    TRACING_ENDED.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or_else(Instant::now)
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
    *TRACING_ENDED.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
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
