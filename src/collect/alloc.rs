//! Allocations by stack (src/bpf/alloc.bpf.c): uprobes on the allocation functions the process calls (its C
//! library's, or those of jemalloc, tcmalloc or mimalloc when it is linked with one or preloads it).

use std::{
    collections::HashMap,
    mem::MaybeUninit,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use libbpf_rs::{skel::OpenSkel, Link, MapCore, MapFlags, UprobeMultiOpts, UprobeOpts};

use crate::target::probes::{entry_probes, EntryProbe};

use super::{drain, for_each_entry, install_unwind, kernel_at_least, open_skel, size_unwind_maps, CollectOptions, Collected, Installed};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/alloc.skel.rs"));
}
use skel::*;

/// What to trace: the calls asking for `min_size..=max_size` bytes, one in `sample_every`.
pub struct AllocOptions {
    /// alloc: every N-th call. memleak: the allocations of one period of 100 ms in N; it traces every free,
    /// which costs as much as a call to malloc, so only periods without probes on the allocation functions
    /// spare the cost (see SamplePeriods).
    pub sample_every: u64,
    pub min_size: u64,
    pub max_size: u64,
    /// memleak: report the allocations not freed when tracing ends that are at least this old (ns);
    /// `None`: report all allocations made (profile alloc).
    pub outstanding_older_than: Option<u64>,
    /// memleak: also report what is outstanding this often while tracing.
    pub interval: Option<Duration>,
}

/// The allocation functions by their arguments, with the kind the BPF program reads from the attach cookie
/// (`enum alloc_kind` in src/bpf/alloc.bpf.c).
#[derive(Clone, Copy, PartialEq, Eq)]
enum AllocFunction {
    Size = 0,
    Calloc = 1,
    Realloc = 2,
    AlignSize = 3,
    PosixMemalign = 4,
}

const FUNCTIONS: [(&str, AllocFunction); 8] = [
    ("malloc", AllocFunction::Size),
    ("calloc", AllocFunction::Calloc),
    ("realloc", AllocFunction::Realloc),
    ("aligned_alloc", AllocFunction::AlignSize),
    ("memalign", AllocFunction::AlignSize),
    ("posix_memalign", AllocFunction::PosixMemalign),
    ("valloc", AllocFunction::Size),
    ("pvalloc", AllocFunction::Size),
];

/// `value[0]` of each stack is bytes, `value[1]` calls (scaled up when sampled): asked for while tracing, or
/// (memleak) still allocated at the end.
/// With `alloc.interval`, `report` is given the outstanding allocations that often.
pub fn collect(opts: &CollectOptions, alloc: &AllocOptions, mut report: impl FnMut(&Collected)) -> Result<Collected> {
    let (allocator, places) = allocator_of(opts.pid)?;
    if !allocator.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libc")) {
        eprintln!("myprobe: note: tracing the allocator of {} (it defines malloc before the C library)", allocator.display());
    }
    let mut object = MaybeUninit::uninit();
    let mut open = open_skel(AllocSkelBuilder::default(), &mut object, opts)?;
    let rodata = open.maps.rodata_data.as_deref_mut().context("BPF object has no .rodata")?;
    let leaks = alloc.outstanding_older_than.is_some();
    rodata.target_tgid = opts.pid;
    rodata.kernel_stacks = opts.kernel_stacks;
    rodata.sample_every = if leaks { 1 } else { alloc.sample_every.max(1) };
    rodata.min_size = alloc.min_size;
    rodata.max_size = alloc.max_size;
    rodata.track_outstanding = leaks;
    let ways = ProbeWays::for_kernel(leaks);
    ways.choose_programs(&mut open.progs);
    size_unwind_maps(&mut open.maps.unwind_rows, &mut open.maps.unwind_pages, opts)?;
    let mut skel = open.load().context("loading the allocation probes into the kernel")?;
    let bss = skel.maps.bss_data.as_deref_mut().context("BPF object has no .bss")?;
    let mut installed = Installed::default();
    let (rows, pages) = (&skel.maps.unwind_rows, &skel.maps.unwind_pages);
    install_unwind(opts, &mut installed, &mut unwind_maps!(rows, pages, bss))?;

    let probes = AllocatorProbes::new(&allocator, &places, opts.pid, ways);
    let mut missing = probes.missing.clone();
    // memleak: every free, and realloc's release of the old block, whether allocations are traced or not; in
    // place before the first allocation is traced.
    let frees = if leaks { probes.attach_frees(&skel.progs)? } else { Vec::new() };
    let mut allocations = probes.attach_allocations(&skel.progs, &mut missing)?;
    if allocations.is_empty() {
        bail!(
            "could not attach to any allocation function of {}: if the process allocates through another allocator \
             (jemalloc, tcmalloc) or was linked statically, its allocations cannot be traced here",
            allocator.display()
        );
    }
    if !missing.is_empty() {
        eprintln!("myprobe: note: {} has no {} that can be probed: not traced", allocator.display(), missing.join(", "));
    }

    // The events define stacks (value[0]: their id); the amounts are summed in the totals map (alloc) or kept
    // per address in the outstanding map (memleak).
    let outstanding_map = &skel.maps.outstanding;
    let mut periods = SamplePeriods::new(if leaks { alloc.sample_every } else { 1 });
    let mut last_report = Instant::now();
    let definitions = drain(&skel.maps.events, opts, "profile alloc", (&mut installed, unwind_maps!(rows, pages, bss)), |refresh, so_far| {
        // Time probed: from the end of attaching to the start of detaching.
        match periods.due() {
            Some(true) => match probes.attach_allocations(&skel.progs, &mut Vec::new()) {
                Ok(links) => {
                    allocations = links;
                    periods.set(!allocations.is_empty());
                }
                // E.g. the process exited: what was traced so far is still reported.
                Err(e) => {
                    eprintln!("myprobe: warning: {e:#}: the allocations of the periods left are not traced");
                    periods.stop_sampling();
                }
            },
            Some(false) => {
                periods.set(false);
                allocations.clear();
            }
            None => {}
        }
        if refresh {
            if let (Some(every), Some(older)) = (alloc.interval, alloc.outstanding_older_than) {
                if last_report.elapsed() >= every {
                    last_report = Instant::now();
                    report(&outstanding(so_far, outstanding_map, older, periods.scale()));
                }
            }
        }
        Ok(bss.lost)
    });
    periods.end();
    allocations.clear();
    drop(frees);
    let definitions = definitions?;
    if let Some(older) = alloc.outstanding_older_than {
        return Ok(outstanding(&definitions, &skel.maps.outstanding, older, periods.scale()));
    }
    let mut collected = Collected { lost: definitions.lost, traced: definitions.traced, ..Collected::default() };
    for (stack, [id, _]) in definitions.stacks {
        let Ok(Some(bytes)) = skel.maps.totals.lookup(&id.to_ne_bytes(), MapFlags::ANY) else { continue };
        if bytes.len() < 16 {
            continue;
        }
        let total = u64::from_ne_bytes(bytes[0..8].try_into().unwrap());
        let calls = u64::from_ne_bytes(bytes[8..16].try_into().unwrap());
        if calls > 0 {
            collected.add(stack, [total * alloc.sample_every, calls * alloc.sample_every]);
            collected.events += calls - 1;
        }
    }
    Ok(collected)
}

/// How the running kernel lets the probes be attached.
#[derive(Clone, Copy)]
struct ProbeWays {
    leaks: bool,
    /// One uprobe_multi link for many probes (6.6): detaching a link waits for the probes in flight, about
    /// 0.1 s each.
    multi: bool,
    /// memleak with uprobe sessions (6.13): the return probe only for the calls it traces.
    sessions: bool,
}

impl ProbeWays {
    fn for_kernel(leaks: bool) -> Self {
        ProbeWays { leaks, multi: kernel_at_least(6, 6), sessions: leaks && kernel_at_least(6, 13) }
    }

    /// Loads only the programs these ways attach.
    fn choose_programs(&self, progs: &mut OpenAllocProgs) {
        let ProbeWays { leaks, multi, sessions } = *self;
        progs.on_alloc_session.set_autoload(sessions);
        progs.on_alloc_return.set_autoload(leaks && !sessions);
        progs.on_alloc_multi.set_autoload(multi && !leaks);
        progs.on_alloc.set_autoload(!multi || (leaks && !sessions));
        progs.on_free_multi.set_autoload(multi && leaks);
        progs.on_free.set_autoload(!multi && leaks);
    }
}

/// Where the probes go in the allocator, and attaching them.
struct AllocatorProbes<'a> {
    allocator: &'a Path,
    pid: i32,
    ways: ProbeWays,
    /// Each allocation function probed: (name, place, kind as cookie).
    traced: Vec<(&'static str, EntryProbe, u64)>,
    free: Option<EntryProbe>,
    /// The functions the allocator does not have.
    missing: Vec<&'static str>,
}

impl<'a> AllocatorProbes<'a> {
    /// `places`: of allocator_of, in the order of `probed_names()`.
    fn new(allocator: &'a Path, places: &[Option<EntryProbe>], pid: u32, ways: ProbeWays) -> Self {
        let (mut traced, mut missing): (Vec<(&'static str, EntryProbe, u64)>, _) = (Vec::new(), Vec::new());
        for ((function, kind), place) in FUNCTIONS.iter().zip(places) {
            match place {
                None => missing.push(*function),
                // glibc's aligned_alloc is memalign: probed once.
                Some(place) if traced.iter().any(|(_, t, _)| t.address == place.address) => {}
                Some(place) => traced.push((function, *place, *kind as u64)),
            }
        }
        let free = places.get(FUNCTIONS.len()).copied().flatten();
        AllocatorProbes { allocator, pid: pid as i32, ways, traced, free, missing }
    }

    fn attach(&self, probe: &EntryProbe, prog: &libbpf_rs::ProgramMut, retprobe: bool, cookie: u64) -> libbpf_rs::Result<Link> {
        let uprobe = UprobeOpts { retprobe, cookie, ..Default::default() };
        prog.attach_uprobe_with_opts(self.pid, self.allocator, probe.offset(), uprobe)
    }

    /// One link for all of `places` (entry probe, cookie).
    fn attach_multi(&self, prog: &libbpf_rs::ProgramMut, places: &[(EntryProbe, u64)], session: bool) -> Result<Link> {
        let multi = UprobeMultiOpts {
            offsets: places.iter().map(|(place, _)| place.offset()).collect(),
            cookies: places.iter().map(|(_, cookie)| *cookie).collect(),
            session,
            ..Default::default()
        };
        let link = prog.attach_uprobe_multi_with_opts(self.pid, self.allocator, "", multi);
        link.with_context(|| format!("attaching to the allocation functions of {}", self.allocator.display()))
    }

    /// memleak: free, and realloc for its release of the old block.
    fn attach_frees(&self, progs: &AllocProgs) -> Result<Vec<Link>> {
        let free = self.free.with_context(|| format!("{} has no free()", self.allocator.display()))?;
        let realloc = self.traced.iter().find(|(_, _, kind)| *kind == AllocFunction::Realloc as u64).map(|(_, place, _)| *place);
        let released: Vec<(EntryProbe, u64)> = [Some(free), realloc].into_iter().flatten().map(|place| (place, 0)).collect();
        if self.ways.multi {
            return Ok(vec![self.attach_multi(&progs.on_free_multi, &released, false)?]);
        }
        let attach = |(place, _): &(EntryProbe, u64)| self.attach(place, &progs.on_free, false, 0);
        let links = released.iter().map(attach).collect::<libbpf_rs::Result<Vec<_>>>();
        links.with_context(|| format!("attaching to free in {}", self.allocator.display()))
    }

    /// The probes on the allocation functions; return probes first in the list, so that they are detached
    /// first (an entry without its return would leave a pending allocation behind). The functions that could
    /// not be probed one by one go to `missing`.
    fn attach_allocations(&self, progs: &AllocProgs, missing: &mut Vec<&'static str>) -> Result<Vec<Link>> {
        let ProbeWays { leaks, multi, sessions } = self.ways;
        let all: Vec<(EntryProbe, u64)> = self.traced.iter().map(|(_, place, kind)| (*place, *kind)).collect();
        if sessions {
            return Ok(vec![self.attach_multi(&progs.on_alloc_session, &all, true)?]);
        }
        if multi && !leaks {
            return Ok(vec![self.attach_multi(&progs.on_alloc_multi, &all, false)?]);
        }
        let (mut returns, mut entries) = (Vec::new(), Vec::new());
        for (function, place, kind) in &self.traced {
            let ret = if leaks { self.attach(place, &progs.on_alloc_return, true, 0).map(Some) } else { Ok(None) };
            match (ret, self.attach(place, &progs.on_alloc, false, *kind)) {
                (Ok(ret), Ok(entry)) => {
                    returns.extend(ret);
                    entries.push(entry);
                }
                _ => missing.push(function),
            }
        }
        returns.extend(entries);
        Ok(returns)
    }
}

/// memleak's sampling: the allocation functions are probed for one period in `every` (frees always are), and
/// the results scaled by the time traced over the time probed.
struct SamplePeriods {
    every: u32,
    started: Instant,
    open_since: Option<Instant>,
    open_for: Duration,
    ended: Option<Instant>,
    /// No more periods (attaching failed).
    stopped: bool,
}

/// Long enough for attaching to cost little (a few ms), short enough for a 10 s trace to hold several periods.
const SAMPLE_PERIOD: Duration = Duration::from_millis(100);

impl SamplePeriods {
    fn new(every: u64) -> Self {
        let now = Instant::now();
        SamplePeriods { every: every.clamp(1, u32::MAX as u64) as u32, started: now, open_since: Some(now), open_for: Duration::ZERO, ended: None, stopped: false }
    }

    /// `Some(open)` when the allocation probes must be attached (true) or detached (false) now.
    fn due(&self) -> Option<bool> {
        if self.every == 1 || self.stopped {
            return None;
        }
        let cycle = SAMPLE_PERIOD * self.every;
        let open = self.started.elapsed().as_nanos() % cycle.as_nanos() < SAMPLE_PERIOD.as_nanos();
        (open != self.open_since.is_some()).then_some(open)
    }

    /// The probes are attached (`open`) or detached, from now.
    fn set(&mut self, open: bool) {
        let now = Instant::now();
        if let Some(since) = self.open_since.take() {
            self.open_for += now - since;
        }
        if open {
            self.open_since = Some(now);
        }
    }

    /// No more periods: the scale is that of the time so far.
    fn stop_sampling(&mut self) {
        self.stopped = true;
        self.end();
    }

    /// Tracing ended (the probes are detached).
    fn end(&mut self) {
        self.set(false);
        self.ended.get_or_insert_with(Instant::now);
    }

    /// Time traced over time probed, so far.
    fn scale(&self) -> f64 {
        if self.every == 1 {
            return 1.0;
        }
        let now = self.ended.unwrap_or_else(Instant::now);
        let open = self.open_for + self.open_since.map_or(Duration::ZERO, |since| now - since);
        (now - self.started).as_secs_f64() / open.as_secs_f64().max(1e-3)
    }
}

/// The object whose `malloc` the process calls, as the process sees it: the dynamic linker binds the first
/// definition it finds, so the executable (jemalloc or tcmalloc linked in statically), then the libraries of
/// LD_PRELOAD and of a known allocator (jemalloc, tcmalloc, mimalloc linked in), when they export `malloc`;
/// else the C library. With the entry probes of `probed_names()` in it.
fn allocator_of(pid: u32) -> Result<(PathBuf, Vec<Option<EntryProbe>>)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).with_context(|| format!("reading /proc/{pid}/maps"))?;
    let mut mapped: Vec<&str> = Vec::new();
    for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)).filter(|p| p.starts_with('/')) {
        if !mapped.contains(&path) {
            mapped.push(path);
        }
    }
    let file_name = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok().map(|p| p.to_string_lossy().into_owned());
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let preload: Vec<String> = environ
        .split(|&b| b == 0)
        .filter_map(|v| v.strip_prefix(b"LD_PRELOAD="))
        .flat_map(|v| String::from_utf8_lossy(v).split([':', ' ']).map(file_name).collect::<Vec<_>>())
        .filter(|name| !name.is_empty())
        .collect();
    const ALLOCATORS: [&str; 3] = ["libjemalloc", "libtcmalloc", "libmimalloc"];
    let mut candidates: Vec<&str> = mapped.iter().copied().filter(|p| Some(*p) == exe.as_deref()).collect();
    candidates.extend(mapped.iter().copied().filter(|p| preload.contains(&file_name(p))));
    candidates.extend(mapped.iter().copied().filter(|p| ALLOCATORS.iter().any(|a| file_name(p).starts_with(a))));
    let in_root = |p: &str| PathBuf::from(format!("/proc/{pid}/root{p}"));
    let names = probed_names();
    for path in candidates {
        // names[0] is malloc.
        if let Ok(places) = entry_probes(&in_root(path), &names) {
            if places[0].is_some() {
                return Ok((in_root(path), places));
            }
        }
    }
    let libc = mapped
        .iter()
        .find(|p| file_name(p).starts_with("libc.so") || file_name(p).starts_with("libc-"))
        .with_context(|| format!("process {pid} has no C library mapped (a static binary?): its allocations cannot be traced"))?;
    let places = entry_probes(&in_root(libc), &names)?;
    Ok((in_root(libc), places))
}

/// The functions probed: FUNCTIONS, then free.
fn probed_names() -> Vec<&'static str> {
    FUNCTIONS.iter().map(|(name, _)| *name).chain(["free"]).collect()
}

/// The allocations not freed, at least `older_ns` old, by stack (`definitions`: the stacks by id so far),
/// multiplied by `scale`.
fn outstanding(definitions: &Collected, map: &dyn MapCore, older_ns: u64, scale: f64) -> Collected {
    let amounts = outstanding_by_stack(map, older_ns);
    let mut collected = Collected { lost: definitions.lost, traced: definitions.traced, ..Collected::default() };
    for (stack, [id, _]) in &definitions.stacks {
        if let Some(&[bytes, count]) = amounts.get(id) {
            let scaled = |v: u64| (v as f64 * scale).round() as u64;
            collected.add(stack.clone(), [scaled(bytes), scaled(count)]);
            collected.events += count - 1;
        }
    }
    collected
}

/// Stack id → [bytes, allocations] of the allocations not freed that are at least `older_ns` old.
fn outstanding_by_stack(map: &dyn MapCore, older_ns: u64) -> HashMap<u64, [u64; 2]> {
    let now = super::monotonic_ns();
    let mut amounts: HashMap<u64, [u64; 2]> = HashMap::new();
    let mut add = |value: &[u8]| {
        let field = |i: usize| value.get(i * 8..i * 8 + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap()));
        let (Some(size), Some(ts), Some(id)) = (field(0), field(1), field(2)) else { return };
        if now.saturating_sub(ts) >= older_ns {
            let a = amounts.entry(id).or_default();
            a[0] += size;
            a[1] += 1;
        }
    };
    for_each_entry(map, |_, value| add(value));
    amounts
}
