//! Allocations by stack (src/bpf/alloc.bpf.c): uprobes on the allocation functions the process calls (its C
//! library's, or those of jemalloc, tcmalloc or mimalloc when it is linked with one or preloads it).

use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use libbpf_rs::{Link, UprobeMultiOpts, UprobeOpts};

use crate::process::{
    self,
    maps::{MappedFile, ProcMaps},
    probes::{entry_probes, EntryProbe},
};

use super::{
    maps::{drain_typed, for_each_per_cpu, for_each_typed, Plain},
    monotonic_ns,
    periods::SamplePeriods,
    skeleton::stack_skeleton,
    stack_collector::{self, Collector, DrainPacing, Loaded, Open, Stacks, Sum},
    CollectOptions, Collected, Estimate, Features,
};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/alloc.skel.rs"));
}
use skel::types::alloc_kind;
stack_skeleton!(Skeleton, AllocSkelBuilder, OpenAllocSkel, AllocSkel);
// SAFETY: generated from BTF structs of integers.
unsafe impl Plain for skel::types::alloc_total {}
// SAFETY: as above.
unsafe impl Plain for skel::types::alloc_key {}
// SAFETY: as above.
unsafe impl Plain for skel::types::outstanding_alloc {}
// SAFETY: as above.
unsafe impl Plain for skel::types::alloc_tally {}

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

/// The allocation functions, with the kind the BPF program reads from the attach cookie.
const FUNCTIONS: [(&str, alloc_kind); 8] = [
    ("malloc", alloc_kind::ALLOC_SIZE),
    ("calloc", alloc_kind::ALLOC_CALLOC),
    ("realloc", alloc_kind::ALLOC_REALLOC),
    ("aligned_alloc", alloc_kind::ALLOC_ALIGN_SIZE),
    ("memalign", alloc_kind::ALLOC_ALIGN_SIZE),
    ("posix_memalign", alloc_kind::ALLOC_POSIX_MEMALIGN),
    ("valloc", alloc_kind::ALLOC_SIZE),
    ("pvalloc", alloc_kind::ALLOC_SIZE),
];

/// Rows: `bytes` and `calls` per stack (scaled up when sampled): asked for while tracing, or (memleak) still
/// allocated at the end. With `alloc.interval`, `report` is given the outstanding allocations that often.
pub fn collect(
    opts: &CollectOptions,
    alloc: &AllocOptions,
    report: impl FnMut(&Collected),
) -> Result<Collected> {
    let (allocator, places) = allocator_of(opts.pid)?;
    if !allocator
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("libc"))
    {
        say!(
            "myprobe: note: tracing the allocator of {} (it defines malloc before the C library)",
            allocator.display()
        );
    }
    let leaks = alloc.outstanding_older_than.is_some();
    let mut collector = Alloc {
        alloc,
        probes: AllocatorProbes::new(allocator, &places, opts.pid),
        frees: Vec::new(),
        allocations: Vec::new(),
        periods: SamplePeriods::new(SAMPLE_PERIOD, if leaks { alloc.sample_every } else { 1 }),
        last_report: Instant::now(),
        report,
        tally: Tally::default(),
        drained: HashMap::new(),
        drains: DrainPacing::default(),
    };
    let mut collected = stack_collector::run(&mut collector, opts)?;
    collected.estimate = collector.estimate(true);
    if leaks {
        let calls = collected.column("calls");
        let outstanding: u64 = collected.rows.iter().map(|r| r.values[calls]).sum();
        if let Some(e) = collected.estimate.as_mut().filter(|e| e.warning.is_none()) {
            e.warning = nothing_outstanding_warning(&e.sampling, e.traced, outstanding, e.scale);
        }
    }
    Ok(collected)
}

/// Fewer allocations traced than this, and figures scaled from them are mostly noise (a relative error of
/// about 1/√n, and what happened between samples is not seen at all): said on stderr.
const FEW_TRACED: u64 = 100;

/// What the kernel counted: allocation calls traced, frees seen (memleak).
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    traced: u64,
    frees: u64,
}

struct Alloc<'a, R> {
    alloc: &'a AllocOptions,
    probes: AllocatorProbes,
    /// memleak: free and realloc, attached throughout.
    frees: Vec<Link>,
    /// The probes on the allocation functions: attached and detached by `periods`.
    allocations: Vec<Link>,
    periods: SamplePeriods,
    last_report: Instant,
    report: R,
    tally: Tally,
    /// profile alloc's sums moved from the kernel, by statement (`Stacks::labels`) and stack id.
    drained: HashMap<(u32, u64), [u64; 2]>,
    drains: DrainPacing,
}

impl<R: FnMut(&Collected)> Alloc<'_, R> {
    fn leaks(&self) -> bool {
        self.alloc.outstanding_older_than.is_some()
    }

    /// Moves the kernel's sums here (profile alloc), emptying its map.
    fn drain(&mut self, skel: &Loaded<'_, Self>, stacks: &mut Stacks) -> Result<()> {
        drain_typed(
            &skel.maps.totals,
            |k: skel::types::alloc_key, t: skel::types::alloc_total| {
                let statement = stacks.labels.resolve(0, k.tid, k.statement, k.connection);
                let sum = self.drained.entry((statement, k.stack_id)).or_default();
                sum[0] = sum[0].saturating_add(t.bytes);
                sum[1] = sum[1].saturating_add(t.calls);
            },
        )
        .context("moving the allocation sums from the kernel")?;
        Ok(())
    }

    fn read_tally(skel: &Loaded<'_, Self>) -> Tally {
        let mut tally = Tally::default();
        for_each_per_cpu(
            &skel.maps.tally,
            |_: u32, cpus: Vec<skel::types::alloc_tally>| {
                for c in cpus {
                    tally.traced = tally.traced.saturating_add(c.traced);
                    tally.frees = tally.frees.saturating_add(c.frees);
                }
            },
        );
        tally
    }

    /// How the figures were scaled, if they were; with a warning at the end (`last`) when few were traced.
    fn estimate(&self, last: bool) -> Option<Estimate> {
        let every = self.alloc.sample_every;
        if every <= 1 {
            return None;
        }
        let traced = self.tally.traced;
        let (sampling, scale) = if self.leaks() {
            let (probed, total) = self.periods.probed();
            let sampling = format!(
                "the allocations of one {} ms period in {every} ({:.1} s of {:.1} s)",
                SAMPLE_PERIOD.as_millis(),
                probed.as_secs_f64(),
                total.as_secs_f64()
            );
            (sampling, self.periods.scale())
        } else {
            (format!("every {every}th allocation call"), every as f64)
        };
        let warning = if last {
            let secs = self.periods.probed().1.as_secs_f64();
            few_traced_warning(self.leaks(), &sampling, self.tally, secs)
        } else {
            None
        };
        Some(Estimate {
            sampling,
            scale,
            traced,
            warning,
        })
    }

    /// The allocations not freed, at least `older_ns` old, by stack, multiplied by the periods' scale.
    fn outstanding(&self, skel: &Loaded<'_, Self>, older_ns: u64) -> Vec<Sum> {
        let now = monotonic_ns();
        let mut old_enough = Vec::new();
        for_each_typed(
            &skel.maps.outstanding,
            |_: u64, a: skel::types::outstanding_alloc| {
                if now.saturating_sub(a.ts) >= older_ns {
                    old_enough.push((a.stack_id, a.size));
                }
            },
        );
        let amounts = sum_by_stack(old_enough);
        let scale = self.periods.scale();
        let scaled = |v: u64| (v as f64 * scale).round() as u64;
        amounts
            .into_iter()
            .map(|(stack_id, [bytes, count])| Sum {
                pid: 0,
                tid: 0,
                key: 0,
                stack_id,
                values: Box::new([scaled(bytes), scaled(count)]),
                statement: 0,
            })
            .collect()
    }
}

impl<R: FnMut(&Collected)> Collector for Alloc<'_, R> {
    type Skel = Skeleton;
    const NAME: &'static str = "profile alloc";
    const KIND: super::Kind = super::Kind::Alloc;

    fn columns(&self) -> Vec<String> {
        vec!["bytes".into(), "calls".into()]
    }

    fn events_column(&self) -> usize {
        1
    }

    fn label_statements(&mut self, open: &mut Open<'_, Self>) -> Result<bool> {
        if self.leaks() {
            return Ok(false);
        }
        super::rodata(open.maps.rodata_data.as_deref_mut())?.statement_labels = true;
        Ok(true)
    }

    fn configure(&mut self, open: &mut Open<'_, Self>, features: &Features) -> Result<()> {
        let leaks = self.leaks();
        let rodata = super::rodata(open.maps.rodata_data.as_deref_mut())?;
        rodata.sample_every = if leaks {
            1
        } else {
            self.alloc.sample_every.max(1)
        };
        rodata.min_size = self.alloc.min_size;
        rodata.max_size = self.alloc.max_size;
        rodata.track_outstanding = leaks;
        self.probes.ways = ProbeWays {
            leaks,
            multi: features.uprobe_multi,
            sessions: leaks && features.uprobe_session,
        };
        self.probes.ways.choose_programs(&mut open.progs);
        Ok(())
    }

    fn attach(&mut self, skel: &mut Loaded<'_, Self>) -> Result<Vec<Link>> {
        // memleak: every free, and realloc's release of the old block, whether allocations are traced or not;
        // in place before the first allocation is traced.
        if self.leaks() {
            self.frees = self.probes.attach_frees(&skel.progs)?;
        }
        let mut missing = self.probes.missing.clone();
        self.allocations = self.probes.attach_allocations(&skel.progs, &mut missing)?;
        let allocator = self.probes.allocator.display();
        if self.allocations.is_empty() {
            bail!(
                "could not attach to any allocation function of {allocator}: if the process allocates through \
                 another allocator (jemalloc, tcmalloc) or was linked statically, its allocations cannot be \
                 traced here"
            );
        }
        if !missing.is_empty() {
            say!(
                "myprobe: note: {allocator} has no {} that can be probed: not traced",
                missing.join(", ")
            );
        }
        // Time probed: from the end of attaching to the start of detaching.
        self.periods.restart();
        Ok(Vec::new())
    }

    fn tick(&mut self, skel: &mut Loaded<'_, Self>, stacks: &mut Stacks) -> Result<()> {
        // Sums per statement and connection fill the map far sooner than sums per stack alone.
        if stacks.labels.enabled() && self.drains.due() {
            self.drain(skel, stacks)?;
        }
        match self.periods.due() {
            Some(true) => match self.probes.attach_allocations(&skel.progs, &mut Vec::new()) {
                Ok(links) => {
                    self.allocations = links;
                    self.periods.set(!self.allocations.is_empty());
                }
                // E.g. the process exited: what was traced so far is still reported.
                Err(e) => {
                    say!(
                        "myprobe: warning: {e:#}: the allocations of the periods left are not traced"
                    );
                    self.periods.stop_sampling();
                }
            },
            Some(false) => {
                self.periods.set(false);
                self.allocations.clear();
            }
            None => {}
        }
        if let (Some(every), Some(older)) = (self.alloc.interval, self.alloc.outstanding_older_than)
        {
            if self.last_report.elapsed() >= every {
                self.last_report = Instant::now();
                let (rows, _) = stacks.join(self.outstanding(skel, older));
                self.tally = Self::read_tally(skel);
                let so_far = Collected {
                    columns: self.columns(),
                    rows,
                    estimate: self.estimate(false),
                    ..Collected::default()
                };
                (self.report)(&so_far);
            }
        }
        Ok(())
    }

    fn next_tick(&self) -> Option<Instant> {
        self.periods.next_change()
    }

    fn stop(&mut self) {
        self.periods.end();
        // Entries before frees: an allocation traced must not miss its free.
        self.allocations.clear();
        self.frees.clear();
    }

    fn read(&mut self, skel: &mut Loaded<'_, Self>, stacks: &mut Stacks) -> Result<Vec<Sum>> {
        self.tally = Self::read_tally(skel);
        if let Some(older) = self.alloc.outstanding_older_than {
            return Ok(self.outstanding(skel, older));
        }
        self.drain(skel, stacks)?;
        let every = self.alloc.sample_every;
        Ok(self
            .drained
            .drain()
            .map(|((statement, stack_id), [bytes, calls])| Sum {
                pid: 0,
                tid: 0,
                key: 0,
                stack_id,
                values: Box::new([scale_up(bytes, every), scale_up(calls, every)]),
                statement,
            })
            .collect())
    }
}

/// Bytes and allocations by stack id, of (stack id, size) allocations; sums stop at `u64::MAX`.
fn sum_by_stack(allocations: impl IntoIterator<Item = (u64, u64)>) -> HashMap<u64, [u64; 2]> {
    let mut amounts: HashMap<u64, [u64; 2]> = HashMap::new();
    for (stack_id, size) in allocations {
        let [bytes, count] = amounts.entry(stack_id).or_default();
        *bytes = bytes.saturating_add(size);
        *count = count.saturating_add(1);
    }
    amounts
}

/// Said when a sampled run traced few allocations: its figures are noise, or zeros that mean nothing.
fn few_traced_warning(leaks: bool, sampling: &str, tally: Tally, secs: f64) -> Option<String> {
    let traced = tally.traced;
    if traced >= FEW_TRACED {
        return None;
    }
    let seen = match traced {
        0 => "no allocation was traced".to_string(),
        1 => "only 1 allocation was traced".to_string(),
        n => format!("only {n} allocations were traced"),
    };
    // Zeros scaled are zeros: what they miss is the point, not their error.
    let unreliable = if traced == 0 {
        "the zeros say nothing"
    } else {
        "figures scaled from so few are unreliable"
    };
    if !leaks {
        return Some(format!(
            "{seen} ({sampling}): {unreliable}; --sample 1 counts every call, exactly, \
             at little more cost (the probes already fire on every call)"
        ));
    }
    // The frees are probed all the time: about as many allocation calls would be, with --sample 1.
    let rate = if tally.frees > 0 && secs > 0.0 {
        format!(
            "; here about {:.0} allocation calls a second, judging by the {} frees seen",
            tally.frees as f64 / secs,
            tally.frees
        )
    } else {
        String::new()
    };
    Some(format!(
        "{seen} in the periods probed ({sampling}): {unreliable}, and allocations made between periods, such \
         as a short burst, are not seen at all; --sample 1 traces every allocation, exactly, at the cost of \
         probing every allocation call all the time, about twice the cost of this default{rate}"
    ))
}

/// Said when the periods probed saw allocations enough but (nearly) all of them freed: a reader would conclude
/// "no leak", where what was allocated and kept between periods, as in one burst, is not seen at all.
fn nothing_outstanding_warning(
    sampling: &str,
    traced: u64,
    outstanding: u64,
    scale: f64,
) -> Option<String> {
    // Under one allocation in a hundred of those traced is still outstanding, once scaled back.
    let kept = outstanding as f64 / scale.max(1.0);
    (traced >= FEW_TRACED && kept * 100.0 < traced as f64).then(|| {
        format!(
            "of the {traced} allocations traced ({sampling}), {} outstanding: nearly all were freed again. \
             Allocations made and kept between the periods probed, such as one burst, are not seen at all, so \
             this does not mean nothing leaks; --sample 1 traces every allocation, exactly",
            if outstanding == 0 {
                "none is".to_string()
            } else {
                format!("~{outstanding} are")
            }
        )
    })
}

/// An amount traced in one call of `every`, as an estimate of all calls; stops at `u64::MAX`.
fn scale_up(traced: u64, every: u64) -> u64 {
    traced.saturating_mul(every)
}

/// How the running kernel lets the probes be attached.
#[derive(Clone, Copy, Default)]
struct ProbeWays {
    leaks: bool,
    /// One uprobe_multi link for many probes: detaching a link waits for the probes in flight, about 0.1 s
    /// each.
    multi: bool,
    /// memleak with uprobe sessions: the return probe only for the calls it traces.
    sessions: bool,
}

impl ProbeWays {
    /// Loads only the programs these ways attach.
    fn choose_programs(&self, progs: &mut skel::OpenAllocProgs) {
        let ProbeWays {
            leaks,
            multi,
            sessions,
        } = *self;
        progs.on_alloc_session.set_autoload(sessions);
        progs.on_alloc_return.set_autoload(leaks && !sessions);
        progs.on_alloc_multi.set_autoload(multi && !leaks);
        progs.on_alloc.set_autoload(!multi || (leaks && !sessions));
        progs.on_free_multi.set_autoload(multi && leaks);
        progs.on_free.set_autoload(!multi && leaks);
    }
}

/// Where the probes go in the allocator, and attaching them.
struct AllocatorProbes {
    allocator: PathBuf,
    pid: i32,
    ways: ProbeWays,
    /// Each allocation function probed: (name, place, kind as cookie).
    traced: Vec<(&'static str, EntryProbe, u64)>,
    free: Option<EntryProbe>,
    /// The functions the allocator does not have.
    missing: Vec<&'static str>,
}

impl AllocatorProbes {
    /// `places`: of allocator_of, in the order of `probed_names()`. The ways are chosen when the programs are.
    fn new(allocator: PathBuf, places: &[Option<EntryProbe>], pid: u32) -> Self {
        let (mut traced, mut missing): (Vec<(&'static str, EntryProbe, u64)>, _) =
            (Vec::new(), Vec::new());
        for ((function, kind), place) in FUNCTIONS.iter().zip(places) {
            match place {
                None => missing.push(*function),
                // glibc's aligned_alloc is memalign: probed once.
                Some(place) if traced.iter().any(|(_, t, _)| t.address == place.address) => {}
                Some(place) => traced.push((function, *place, u64::from(kind.0))),
            }
        }
        let free = places.get(FUNCTIONS.len()).copied().flatten();
        AllocatorProbes {
            allocator,
            pid: pid as i32,
            ways: ProbeWays::default(),
            traced,
            free,
            missing,
        }
    }

    fn attach(
        &self,
        probe: &EntryProbe,
        prog: &libbpf_rs::ProgramMut,
        retprobe: bool,
        cookie: u64,
    ) -> libbpf_rs::Result<Link> {
        let uprobe = UprobeOpts {
            retprobe,
            cookie,
            ..Default::default()
        };
        prog.attach_uprobe_with_opts(self.pid, &self.allocator, probe.offset(), uprobe)
    }

    /// One link for all of `places` (entry probe, cookie).
    fn attach_multi(
        &self,
        prog: &libbpf_rs::ProgramMut,
        places: &[(EntryProbe, u64)],
        session: bool,
    ) -> Result<Link> {
        let multi = UprobeMultiOpts {
            offsets: places.iter().map(|(place, _)| place.offset()).collect(),
            cookies: places.iter().map(|(_, cookie)| *cookie).collect(),
            session,
            ..Default::default()
        };
        let link = prog.attach_uprobe_multi_with_opts(self.pid, &self.allocator, "", multi);
        link.with_context(|| {
            format!(
                "attaching to the allocation functions of {}",
                self.allocator.display()
            )
        })
    }

    /// memleak: free, and realloc for its release of the old block.
    fn attach_frees(&self, progs: &skel::AllocProgs) -> Result<Vec<Link>> {
        let free = self
            .free
            .with_context(|| format!("{} has no free()", self.allocator.display()))?;
        let realloc = self
            .traced
            .iter()
            .find(|(_, _, kind)| *kind == u64::from(alloc_kind::ALLOC_REALLOC.0))
            .map(|(_, place, _)| *place);
        let released: Vec<(EntryProbe, u64)> = [Some(free), realloc]
            .into_iter()
            .flatten()
            .map(|place| (place, 0))
            .collect();
        if self.ways.multi {
            return Ok(vec![self.attach_multi(
                &progs.on_free_multi,
                &released,
                false,
            )?]);
        }
        let attach = |(place, _): &(EntryProbe, u64)| self.attach(place, &progs.on_free, false, 0);
        let links = released
            .iter()
            .map(attach)
            .collect::<libbpf_rs::Result<Vec<_>>>();
        links.with_context(|| format!("attaching to free in {}", self.allocator.display()))
    }

    /// The probes on the allocation functions; return probes first in the list, so that they are detached
    /// first (an entry without its return would leave a pending allocation behind). The functions that could
    /// not be probed one by one go to `missing`.
    fn attach_allocations(
        &self,
        progs: &skel::AllocProgs,
        missing: &mut Vec<&'static str>,
    ) -> Result<Vec<Link>> {
        let ProbeWays {
            leaks,
            multi,
            sessions,
        } = self.ways;
        let all: Vec<(EntryProbe, u64)> = self
            .traced
            .iter()
            .map(|(_, place, kind)| (*place, *kind))
            .collect();
        if sessions {
            return Ok(vec![self.attach_multi(
                &progs.on_alloc_session,
                &all,
                true,
            )?]);
        }
        if multi && !leaks {
            return Ok(vec![self.attach_multi(
                &progs.on_alloc_multi,
                &all,
                false,
            )?]);
        }
        let (mut returns, mut entries) = (Vec::new(), Vec::new());
        for (function, place, kind) in &self.traced {
            let ret = if leaks {
                self.attach(place, &progs.on_alloc_return, true, 0)
                    .map(Some)
            } else {
                Ok(None)
            };
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

/// The object whose `malloc` the process calls, as the process sees it: the dynamic linker binds the first
/// definition it finds, so the executable (jemalloc or tcmalloc linked in statically), then the libraries of
/// LD_PRELOAD and of a known allocator (jemalloc, tcmalloc, mimalloc linked in), when they export `malloc`;
/// else the C library. With the entry probes of `probed_names()` in it.
fn allocator_of(pid: u32) -> Result<(PathBuf, Vec<Option<EntryProbe>>)> {
    let maps = ProcMaps::read(pid).with_context(|| format!("reading /proc/{pid}/maps"))?;
    let mapped = maps.files_in_address_order();
    let exe = process::exe_of(pid).ok();
    let preload = process::preloaded_libraries(pid);
    const ALLOCATORS: [&str; 3] = ["libjemalloc", "libtcmalloc", "libmimalloc"];
    let mut candidates: Vec<&MappedFile> = mapped
        .iter()
        .copied()
        .filter(|f| Some(&f.symbolic) == exe.as_ref())
        .collect();
    candidates.extend(
        mapped
            .iter()
            .copied()
            .filter(|f| preload.contains(&f.basename)),
    );
    candidates.extend(
        mapped
            .iter()
            .copied()
            .filter(|f| ALLOCATORS.iter().any(|a| f.basename.starts_with(a))),
    );
    let names = probed_names();
    for file in candidates {
        // names[0] is malloc.
        if let Ok(places) = entry_probes(&file.open_path, &names) {
            if places[0].is_some() {
                return Ok((file.open_path.clone(), places));
            }
        }
    }
    let libc = mapped
        .iter()
        .find(|f| f.basename.starts_with("libc.so") || f.basename.starts_with("libc-"))
        .with_context(|| {
            format!(
                "process {pid} has no C library mapped (a static binary?): its allocations cannot be \
                 traced"
            )
        })?;
    let places = entry_probes(&libc.open_path, &names)?;
    Ok((libc.open_path.clone(), places))
}

/// The functions probed: FUNCTIONS, then free.
fn probed_names() -> Vec<&'static str> {
    FUNCTIONS
        .iter()
        .map(|(name, _)| *name)
        .chain(["free"])
        .collect()
}

/// memleak's sampling: the allocation functions are probed for one period in `every` (frees always are), and
/// the results scaled by the time traced over the time probed. Long enough for attaching to cost little (a few
/// ms), short enough for a 10 s trace to hold several periods.
const SAMPLE_PERIOD: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_past_the_largest_stop_there() {
        assert_eq!(scale_up(u64::MAX / 2, 3), u64::MAX);
        assert_eq!(scale_up(1 << 40, 1 << 30), u64::MAX);
        assert_eq!(scale_up(7, 1000), 7000);
        let sums = sum_by_stack([(1, u64::MAX - 1), (1, 16), (2, 8), (2, 8)]);
        assert_eq!(sums[&1], [u64::MAX, 2]);
        assert_eq!(sums[&2], [16, 2]);
    }

    #[test]
    fn few_allocations_traced_are_said_with_what_exact_figures_cost() {
        let tally = |traced, frees| Tally { traced, frees };
        let none = few_traced_warning(true, "periods", tally(0, 0), 2.0).unwrap();
        assert!(
            none.starts_with("no allocation was traced in the periods probed (periods)"),
            "{none}"
        );
        assert!(
            none.contains("--sample 1") && !none.contains("judging"),
            "{none}"
        );
        let few = few_traced_warning(true, "periods", tally(3, 5000), 2.0).unwrap();
        assert!(few.starts_with("only 3 allocations were traced"), "{few}");
        assert!(
            few.contains("figures scaled from so few are unreliable"),
            "{few}"
        );
        assert!(
            few.ends_with("about 2500 allocation calls a second, judging by the 5000 frees seen"),
            "{few}"
        );
        assert_eq!(
            few_traced_warning(true, "periods", tally(FEW_TRACED, 0), 2.0),
            None
        );
        let alloc =
            few_traced_warning(false, "every 10th allocation call", tally(1, 0), 2.0).unwrap();
        assert!(
            alloc.starts_with("only 1 allocation was traced (every 10th allocation call)"),
            "{alloc}"
        );
        assert!(alloc.contains("--sample 1 counts every call"), "{alloc}");
    }
}
