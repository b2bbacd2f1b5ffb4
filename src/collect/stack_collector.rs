//! The life cycle every stack-capturing collector shares, owned here: open the BPF object, set the target
//! and the unwind maps' sizes, load, install the unwind tables, attach, read the stacks' definitions from
//! the ring buffer while tracing (installing the tables of code mapped meanwhile), detach, read the
//! collector's map of sums, join its stack ids to stacks, count what was lost.
//!
//! A collector supplies only what differs: its skeleton (one [`stack_skeleton!`] line: every stack collector
//! includes src/bpf/stack_ids.h, so the shared maps and globals have the same names in every skeleton), its
//! own settings and programs, and its map of sums ([`Collector`]).

use std::{
    cell::RefCell,
    collections::HashMap,
    mem::MaybeUninit,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use libbpf_rs::{
    skel::{OpenSkel, Skel, SkelBuilder},
    AsRawLibbpf, Link, MapCore, Object,
};

pub(crate) use super::unwind_store::Installed;
use super::{
    maps::{read_prefix, Plain},
    open_object,
    periods::SamplePeriods,
    ring,
    targets::{self, Published},
    CollectOptions, Collected, Features, Lost, RawStack, Row,
};
use crate::unwind::{BpfMapping, BpfRow, Tables};

/// A stack as the BPF side sends it (`struct stack_event` of src/bpf/stack_event.h), borrowed.
pub struct StackRecord<'a> {
    pub stack_id: u64,
    pub tid: u32,
    pub user_len: u16,
    pub kernel_len: u16,
    pub ips: &'a [u64],
}

/// The unwinder's maps and `.bss` variables of a loaded skeleton (src/bpf/unwind.h).
pub struct UnwindMaps<'a, M> {
    pub rows: &'a dyn MapCore,
    pub pages: &'a dyn MapCore,
    /// The compat build's rows by address, and the addresses it wants rows for (unwind.h).
    pub address_rows: &'a dyn MapCore,
    pub wanted_rows: &'a dyn MapCore,
    /// With many targets (target.h): each process's code (`struct unwind_process` by tgid), and which
    /// processes are traced (a bit per PID).
    pub processes: &'a dyn MapCore,
    pub target_bits: &'a dyn MapCore,
    /// The one target's code, in `.bss`.
    pub mappings: &'a mut [M],
    pub count: &'a mut u32,
    pub enabled: &'a mut u32,
    pub generation: &'a mut u32,
}

/// What every stack collector's skeleton has, by the same names; implemented by [`stack_skeleton!`].
pub trait StackSkeleton {
    type Builder: for<'o> SkelBuilder<'o, Output = Self::Open<'o>> + Default;
    type Open<'o>: OpenSkel<'o, Output = Self::Loaded<'o>>;
    type Loaded<'o>: Skel<'o>;
    /// The skeleton's generated `struct unwind_row`, `struct unwind_mapping`, `struct stack_event`.
    type UnwindRow: Plain;
    type UnwindMapping: Plain;
    type StackEvent: Plain;
    /// Where the frames of `struct stack_event` start.
    const STACK_EVENT_HEADER: usize;

    /// Sets the target (`target_tgid`, `kernel_stacks`; `many_targets`: the processes of a [`Targets`]
    /// instead), before loading.
    fn set_common(open: &mut Self::Open<'_>, pid: u32, kernel: bool, many: bool) -> Result<()>;
    /// The unwind maps (`unwind_rows`, `unwind_pages`), before loading: sized, or shared with a store's.
    fn unwind_open<'a, 'o>(
        open: &'a mut Self::Open<'o>,
    ) -> (
        &'a mut libbpf_rs::OpenMapMut<'o>,
        &'a mut libbpf_rs::OpenMapMut<'o>,
    );
    fn events<'a>(skel: &'a Self::Loaded<'_>) -> &'a dyn MapCore;
    fn unwind<'a>(skel: &'a mut Self::Loaded<'_>) -> UnwindMaps<'a, Self::UnwindMapping>;
    fn lost(skel: &Self::Loaded<'_>) -> Lost;
    /// target.h's count of attachings: a sampled collector's threads' state from an earlier period is stale.
    fn attach_period<'a>(skel: &'a mut Self::Loaded<'_>) -> &'a mut u32;
    fn unwind_row(row: &BpfRow) -> Self::UnwindRow;
    fn unwind_mapping(mapping: &BpfMapping) -> Self::UnwindMapping;
    fn stack_record(event: &Self::StackEvent) -> StackRecord<'_>;
}

/// Implements [`StackSkeleton`] for the skeleton of the module it is used in (`skel::*`), as the marker type
/// `$name`. Field by field, so that a change on the BPF side that the Rust side misses does not compile.
macro_rules! stack_skeleton {
    ($name:ident, $builder:ident, $open:ident, $loaded:ident) => {
        pub struct $name;

        // SAFETY: generated from BTF structs of integers and integer arrays.
        unsafe impl $crate::collect::maps::Plain for skel::types::unwind_row {}
        // SAFETY: as above.
        unsafe impl $crate::collect::maps::Plain for skel::types::unwind_mapping {}
        // SAFETY: as above.
        unsafe impl $crate::collect::maps::Plain for skel::types::stack_event {}

        impl $crate::collect::stack_collector::StackSkeleton for $name {
            type Builder = skel::$builder;
            type Open<'o> = skel::$open<'o>;
            type Loaded<'o> = skel::$loaded<'o>;
            type UnwindRow = skel::types::unwind_row;
            type UnwindMapping = skel::types::unwind_mapping;
            type StackEvent = skel::types::stack_event;
            const STACK_EVENT_HEADER: usize = std::mem::offset_of!(skel::types::stack_event, ips);

            fn set_common(
                open: &mut Self::Open<'_>,
                pid: u32,
                kernel: bool,
                many: bool,
            ) -> anyhow::Result<()> {
                use anyhow::Context;
                let rodata = $crate::collect::rodata(open.maps.rodata_data.as_deref_mut())?;
                rodata.target_tgid = pid;
                rodata.kernel_stacks = kernel;
                rodata.many_targets = many;
                if many {
                    open.maps
                        .target_bits
                        .set_max_entries($crate::collect::targets::BIT_WORDS)
                        .context("sizing the map of processes traced")?;
                    open.maps
                        .unwind_processes
                        .set_max_entries($crate::collect::targets::MAX_TARGETS)
                        .context("sizing the map of processes' code")?;
                }
                if !$crate::collect::features::Features::of_kernel(None).compat() {
                    // Only the compat build looks up rows by address.
                    for map in [&mut open.maps.address_rows, &mut open.maps.wanted_rows] {
                        map.set_max_entries(1)
                            .context("sizing the rows by address")?;
                    }
                }
                Ok(())
            }

            fn unwind_open<'a, 'o>(
                open: &'a mut Self::Open<'o>,
            ) -> (
                &'a mut libbpf_rs::OpenMapMut<'o>,
                &'a mut libbpf_rs::OpenMapMut<'o>,
            ) {
                (&mut open.maps.unwind_rows, &mut open.maps.unwind_pages)
            }

            fn events<'a>(skel: &'a Self::Loaded<'_>) -> &'a dyn libbpf_rs::MapCore {
                &skel.maps.events
            }

            fn unwind<'a>(
                skel: &'a mut Self::Loaded<'_>,
            ) -> $crate::collect::stack_collector::UnwindMaps<'a, Self::UnwindMapping> {
                let bss = skel
                    .maps
                    .bss_data
                    .as_deref_mut()
                    .expect("stack_ids.h puts variables in .bss");
                $crate::collect::stack_collector::UnwindMaps {
                    rows: &skel.maps.unwind_rows,
                    pages: &skel.maps.unwind_pages,
                    address_rows: &skel.maps.address_rows,
                    wanted_rows: &skel.maps.wanted_rows,
                    processes: &skel.maps.unwind_processes,
                    target_bits: &skel.maps.target_bits,
                    mappings: &mut bss.unwind_self.mappings,
                    count: &mut bss.unwind_self.count,
                    enabled: &mut bss.unwind_self.enabled,
                    generation: &mut bss.unwind_self.generation,
                }
            }

            fn attach_period<'a>(skel: &'a mut Self::Loaded<'_>) -> &'a mut u32 {
                &mut skel
                    .maps
                    .bss_data
                    .as_deref_mut()
                    .expect("target.h puts variables in .bss")
                    .attach_period
            }

            fn lost(skel: &Self::Loaded<'_>) -> $crate::collect::Lost {
                $crate::collect::lost_in_kernel!(skel
                    .maps
                    .bss_data
                    .as_deref()
                    .map(|b| b.lost)
                    .unwrap_or_default())
            }

            fn unwind_row(r: &$crate::unwind::BpfRow) -> Self::UnwindRow {
                skel::types::unwind_row {
                    pc: r.pc,
                    cfa_offset: r.cfa_offset,
                    fp_offset: r.fp_offset,
                    kind: r.kind,
                    _pad: 0,
                }
            }

            fn unwind_mapping(m: &$crate::unwind::BpfMapping) -> Self::UnwindMapping {
                skel::types::unwind_mapping {
                    start: m.start,
                    end: m.end,
                    bias: m.bias,
                    row_start: m.row_start,
                    row_count: m.row_count,
                    first_page: m.first_page,
                    page_start: m.page_start,
                    page_count: m.page_count,
                }
            }

            fn stack_record(
                e: &Self::StackEvent,
            ) -> $crate::collect::stack_collector::StackRecord<'_> {
                $crate::collect::stack_collector::StackRecord {
                    stack_id: e.stack_id,
                    tid: e.tid,
                    user_len: e.user_len,
                    kernel_len: e.kernel_len,
                    ips: &e.ips,
                }
            }
        }
    };
}
pub(crate) use stack_skeleton;

pub type Open<'o, C> = <<C as Collector>::Skel as StackSkeleton>::Open<'o>;
pub type Loaded<'o, C> = <<C as Collector>::Skel as StackSkeleton>::Loaded<'o>;

/// Amounts summed in the kernel for one stack id: a row before its stack is joined.
#[derive(Clone, Debug)]
pub struct Sum {
    /// The process, where one set of programs traces several (`CollectOptions::targets`); else 0.
    pub pid: u32,
    pub tid: u32,
    pub key: u64,
    pub stack_id: u64,
    pub values: Box<[u64]>,
}

/// What a collector supplies to [`run`].
pub trait Collector {
    type Skel: StackSkeleton;
    /// How progress lines and errors name it: "profile cpu".
    const NAME: &'static str;
    /// Which it is, for a command that runs several.
    const KIND: super::Kind;

    /// The names of the values of its rows.
    fn columns(&self) -> Vec<String>;

    /// The column that counts what was traced (samples, waits, calls).
    fn events_column(&self) -> usize {
        0
    }

    /// Its own settings (.rodata) and the programs to load, before loading.
    fn configure(&mut self, _open: &mut Open<'_, Self>, _features: &Features) -> Result<()> {
        Ok(())
    }

    /// Attaches its programs; the links are dropped in order when tracing ends, before the sums are read.
    /// By default every program loaded that attaches by its section name (tracepoints).
    fn attach(&mut self, skel: &mut Loaded<'_, Self>) -> Result<Vec<Link>> {
        attach_by_section(skel.object())
    }

    /// Called after every read of the ring buffer (at least every poll interval, see `ring::poll`) while tracing.
    fn tick(&mut self, _skel: &mut Loaded<'_, Self>, _stacks: &Stacks) -> Result<()> {
        Ok(())
    }

    /// When the next tick is due at the latest, if the collector keeps a time of its own (memleak's periods).
    fn next_tick(&self) -> Option<Instant> {
        None
    }

    /// Tracing ended: drop the links the collector holds itself, before those [`Collector::attach`] gave.
    fn stop(&mut self) {}

    /// The sums, read once the probes are detached. Stacks not sent through the ring buffer (e.g. from a task
    /// iterator) are added to `stacks`.
    fn read(&mut self, skel: &mut Loaded<'_, Self>, stacks: &mut Stacks) -> Result<Vec<Sum>>;

    /// The sums since the slice before, moved out while the probes go on (`CollectOptions::slices`): what the
    /// next slice or [`Collector::read`] returns starts from here.
    fn slice(&mut self, _skel: &mut Loaded<'_, Self>, _stacks: &mut Stacks) -> Result<Vec<Sum>> {
        anyhow::bail!("{} cannot be read while it traces", Self::NAME)
    }
}

/// A `struct stack_event` record: its thread, stack id and stack; `None` if it is malformed (never trusted).
pub fn decode_stack<S: StackSkeleton>(bytes: &[u8]) -> Option<(u32, u64, RawStack)> {
    let header = S::STACK_EVENT_HEADER;
    let event = read_prefix::<S::StackEvent>(bytes, header)?;
    let r = S::stack_record(&event);
    let frames = r.user_len as usize + r.kernel_len as usize;
    let ips = r
        .ips
        .get(..frames)
        .filter(|_| bytes.len() >= header + frames * 8)?;
    let stack = RawStack {
        user_len: r.user_len,
        ips: ips.into(),
    };
    Some((r.tid, r.stack_id, stack))
}

/// The stacks defined so far, by id.
#[derive(Default)]
pub struct Stacks {
    by_id: HashMap<u64, Arc<RawStack>>,
    /// Records received per (thread, stack id): one per stack for collectors that send a stack once, one per
    /// sample for those that send every sample (cpu).
    records: HashMap<(u32, u64), u64>,
    /// Records that were not stacks (never the case for a record of the same skeleton).
    malformed: u64,
    /// Sums of slices sent whose stacks were never defined.
    undefined: u64,
}

impl Stacks {
    /// Adds a `struct stack_event` record and returns its thread and stack id; a malformed one is counted,
    /// never trusted.
    pub fn add_record<S: StackSkeleton>(&mut self, bytes: &[u8]) -> Option<(u32, u64)> {
        let Some((tid, stack_id, stack)) = decode_stack::<S>(bytes) else {
            self.malformed += 1;
            return None;
        };
        self.by_id
            .entry(stack_id)
            .or_insert_with(|| Arc::new(stack));
        *self.records.entry((tid, stack_id)).or_default() += 1;
        Some((tid, stack_id))
    }

    /// Records received per thread and stack id, as sums of one value.
    pub fn records(&self) -> Vec<Sum> {
        self.records
            .iter()
            .map(|(&(tid, stack_id), &n)| record_sum(tid, stack_id, n))
            .collect()
    }

    /// [`Stacks::records`], counted from zero again.
    pub fn take_records(&mut self) -> Vec<Sum> {
        self.records
            .drain()
            .map(|((tid, stack_id), n)| record_sum(tid, stack_id, n))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Rows of the sums whose stacks are known, and how many sums had none.
    pub fn join(&self, sums: Vec<Sum>) -> (Vec<Row>, u64) {
        let mut undefined = 0;
        let mut rows = Vec::with_capacity(sums.len());
        for s in sums {
            match self.by_id.get(&s.stack_id) {
                Some(stack) => rows.push(Row {
                    tid: s.tid,
                    key: s.key,
                    stack: Arc::clone(stack),
                    values: s.values,
                }),
                None => undefined += 1,
            }
        }
        (rows, undefined)
    }
}

fn record_sum(tid: u32, stack_id: u64, n: u64) -> Sum {
    Sum {
        pid: 0,
        tid,
        key: 0,
        stack_id,
        values: Box::new([n]),
    }
}

/// Stacks user space keeps while slices are read: past this many, they are forgotten on both sides, so that
/// an agent's memory does not grow with every stack it ever saw.
const MAX_STACKS_KEPT: usize = 50_000;

/// Sets the target of a skeleton that includes stack_ids.h and its unwind maps, before loading: the store's of
/// `opts.unwind`, or 1 entry each when stacks are walked by frame pointers (or looked up by address: the compat
/// build has no table search, serve_wanted_rows).
pub(crate) fn set_common<S: StackSkeleton>(
    open: &mut S::Open<'_>,
    opts: &CollectOptions,
) -> Result<()> {
    let compat = Features::of_kernel(opts.btf.as_deref()).compat();
    anyhow::ensure!(
        opts.targets.is_none() || !compat,
        "one set of programs for several processes needs bpf_loop (Linux 5.17)"
    );
    S::set_common(open, opts.pid, opts.kernel_stacks, opts.targets.is_some())?;
    let (rows, pages) = S::unwind_open(open);
    match opts.unwind.as_ref().filter(|_| !compat) {
        Some(store) => store.share(rows, pages, opts.max_kernel_mem),
        None => {
            rows.set_max_entries(1)
                .context("sizing the unwind table map")?;
            pages
                .set_max_entries(1)
                .context("sizing the unwind page map")
        }
    }
}

/// Traces with `collector` for the duration (or until Ctrl-C) and returns what it found.
pub fn run<C: Collector>(collector: &mut C, opts: &CollectOptions) -> Result<Collected> {
    // bpf_loop, which every object calls, was checked before anything started (features::check_environment).
    let features = opts.features();
    let mut object = MaybeUninit::uninit();
    let builder = <C::Skel as StackSkeleton>::Builder::default();
    let mut open = open_object(builder, &mut object, opts)?;
    set_common::<C::Skel>(&mut open, opts)?;
    collector.configure(&mut open, &features)?;
    super::budget::fit(
        open.open_object_mut(),
        opts.max_kernel_mem,
        opts.shared_maps(),
    )?;
    let mut skel = super::load::load(open, C::NAME, opts.verify_only.as_ref())?;
    if opts.verify_only.is_some() {
        return Ok(Collected {
            columns: collector.columns(),
            ..Collected::default()
        });
    }
    let mut publishing = Publishing::default();
    publishing.update::<C::Skel>(opts, C::Skel::unwind(&mut skel), true)?;
    let mut links = collector.attach(&mut skel)?;
    let mut periods = opts.duty.clone().map(SamplePeriods::of);
    if !opts.announce.is_empty() {
        say!("{}", opts.announce);
    }
    if let Some(attached) = &opts.attached {
        let _ = attached.send(C::KIND);
    }

    let stacks = RefCell::new(Stacks::default());
    let reader = ring::reader(C::Skel::events(&skel), |data| {
        stacks.borrow_mut().add_record::<C::Skel>(data);
    })?;
    let mut last_slice = Instant::now();
    let traced = ring::poll(&reader, opts, |elapsed| {
        // Sampled: detached between periods, attached again by section (what offcpu and locks attach),
        // their threads' state from before left stale.
        if let Some(p) = periods.as_mut() {
            if let Some(open) = p.due() {
                if open {
                    let period = C::Skel::attach_period(&mut skel);
                    *period = period.wrapping_add(1);
                    links = attach_by_section(skel.object())?;
                } else {
                    links.clear();
                }
                p.set(open);
            }
        }
        // A set of targets follows its members whether attached or not.
        if (opts.targets.is_some() || periods.as_ref().is_none_or(SamplePeriods::open))
            && !publishing.update::<C::Skel>(opts, C::Skel::unwind(&mut skel), false)?
        {
            opts.stop.stop();
        }
        collector.tick(&mut skel, &stacks.borrow())?;
        if let Some(slices) = opts
            .slices
            .as_ref()
            .filter(|s| last_slice.elapsed() >= s.every)
        {
            let since = last_slice.elapsed();
            last_slice = Instant::now();
            let stacks = &mut stacks.borrow_mut();
            let sums = collector.slice(&mut skel, stacks)?;
            let slice = Slicing {
                sums,
                traced: since,
                at: last_slice,
                to: slices,
            };
            let delivered = publishing.deliver(collector, &skel, stacks, slice);
            if forget_past_limit::<C>(&mut skel, stacks) {
                publishing.published.forget_stacks();
            }
            // The receiver gone: whoever wanted the slices has stopped.
            if !delivered {
                opts.stop.stop();
            }
        }
        let lost = C::Skel::lost(&skel).total();
        // Woken for a period's edge and a slice on time, whatever the poll interval.
        let due = [
            periods.as_ref().and_then(SamplePeriods::next_change),
            opts.slices.as_ref().map(|s| last_slice + s.every),
            collector.next_tick(),
        ]
        .into_iter()
        .flatten()
        .min();
        Ok(ring::Tick {
            status: format!(
                "{}: {:>4}/{} s, {} stacks, {lost} lost",
                C::NAME,
                elapsed.as_secs(),
                opts.duration.as_secs(),
                stacks.borrow().len()
            ),
            due,
        })
    });
    collector.stop();
    drop(links);
    let traced = traced?;
    // What the probes sent between the last read and their detaching: the definitions of stacks first seen
    // then (a server shutting down while tracing ends makes hundreds).
    reader.consume().context("reading the ring buffer")?;
    drop(reader);
    let mut stacks = stacks.into_inner();
    let sums = collector.read(&mut skel, &mut stacks)?;
    Ok(collected(collector, &skel, &mut stacks, sums, traced))
}

/// What a run has published of the unwind tables: its process's, or each of its targets'.
#[derive(Default)]
struct Publishing {
    installed: Installed,
    published: Published,
}

impl Publishing {
    /// Publishes the tables, `first` or again where they changed; false once a set of targets has none left.
    fn update<S: StackSkeleton>(
        &mut self,
        opts: &CollectOptions,
        maps: UnwindMaps<'_, S::UnwindMapping>,
        first: bool,
    ) -> Result<bool> {
        match &opts.targets {
            Some(targets) => {
                let kernel = targets::Kernel {
                    target_bits: maps.target_bits,
                    processes: maps.processes,
                };
                self.published
                    .sync(targets, opts.unwind.as_deref(), &kernel)
            }
            None if first => install_unwind::<S>(opts, &mut self.installed, maps).map(|()| true),
            None => refresh_unwind::<S>(opts, &mut self.installed, maps).map(|()| true),
        }
    }

    /// Sends the sums of a slice, joined to their stacks, where they go: to `slices.send`, or to each target its
    /// own (an empty slice, with the set's losses, where it has none); false if nobody took them.
    fn deliver<C: Collector>(
        &mut self,
        collector: &C,
        skel: &Loaded<'_, C>,
        stacks: &mut Stacks,
        slice: Slicing<'_>,
    ) -> bool {
        let mut send = |to: &std::sync::mpsc::Sender<super::Slice>, sums| {
            let collected = collected(collector, skel, stacks, sums, slice.traced);
            let slice = super::Slice {
                collector: C::KIND,
                at: slice.at,
                collected,
            };
            to.send(slice).is_ok()
        };
        if !self.published.serves() {
            return send(&slice.to.send, slice.sums);
        }
        let mut by_pid: HashMap<u32, Vec<Sum>> = HashMap::new();
        for sum in slice.sums {
            by_pid.entry(sum.pid).or_default().push(sum);
        }
        let mut delivered = false;
        for (pid, to) in self.published.members() {
            delivered |= send(to, by_pid.remove(pid).unwrap_or_default());
        }
        delivered
    }
}

/// The sums of a slice, and where they go.
struct Slicing<'a> {
    sums: Vec<Sum>,
    /// The time they cover, which ends `at`.
    traced: Duration,
    at: Instant,
    to: &'a super::Slices,
}

/// The sums joined to their stacks, with what was lost since the collector attached.
fn collected<C: Collector>(
    collector: &C,
    skel: &Loaded<'_, C>,
    stacks: &mut Stacks,
    sums: Vec<Sum>,
    traced: Duration,
) -> Collected {
    let (rows, undefined) = stacks.join(sums);
    stacks.undefined += undefined;
    let mut lost = C::Skel::lost(skel);
    lost.ringbuf += stacks.malformed;
    lost.undefined_stacks += stacks.undefined;
    Collected {
        columns: collector.columns(),
        events: events(&rows, collector.events_column()),
        rows,
        lost,
        traced,
        estimate: None,
    }
}

/// Forgets the stacks when user space holds too many, on both sides: the kernel's record of the ids sent, and
/// each thread's call-site cache (by a new generation; for several processes, the caller gives each its own), so
/// that every stack is sent again the next time it is seen. Whether it did.
fn forget_past_limit<C: Collector>(skel: &mut Loaded<'_, C>, stacks: &mut Stacks) -> bool {
    if stacks.by_id.len() <= MAX_STACKS_KEPT {
        return false;
    }
    stacks.by_id.clear();
    // stack_ids.h's record of the ids sent.
    if let Some(known) = skel.object().maps().find(|m| m.name() == "known_stacks") {
        let keys: Vec<Vec<u8>> = known.keys().collect();
        for key in keys {
            // One gone already (it made room for another in the LRU) is what was wanted.
            let _ = known.delete(&key);
        }
    }
    let maps = C::Skel::unwind(skel);
    *maps.generation = maps.generation.wrapping_add(1);
    true
}

/// What the rows traced: the sum of their `column`, stopping at `u64::MAX`.
fn events(rows: &[Row], column: usize) -> u64 {
    rows.iter()
        .map(|r| r.values.get(column).copied().unwrap_or(0))
        .fold(0, u64::saturating_add)
}

/// Attaches every program loaded whose section says where (tracepoints, perf events); the others (uprobes
/// placed by the collector, iterators) are left to it.
pub fn attach_by_section(object: &Object) -> Result<Vec<Link>> {
    let mut links = Vec::new();
    for prog in object.progs_mut() {
        // SAFETY: the program belongs to the loaded object borrowed here.
        let auto = unsafe {
            libbpf_rs::libbpf_sys::bpf_program__autoattach(prog.as_libbpf_object().as_ptr())
        };
        if !prog.autoload() || !auto {
            continue;
        }
        let name = prog.name().to_string_lossy().into_owned();
        links.push(
            prog.attach()
                .with_context(|| format!("attaching the BPF program {name}"))?,
        );
    }
    Ok(links)
}

/// Publishes the unwind tables to a collector's programs and turns unwinding on; called again as tracing goes
/// ([`refresh_unwind`]), when the process's mappings changed.
pub(crate) fn install_unwind<S: StackSkeleton>(
    opts: &CollectOptions,
    installed: &mut Installed,
    maps: UnwindMaps<'_, S::UnwindMapping>,
) -> Result<()> {
    let Some(store) = &opts.unwind else {
        return Ok(());
    };
    if Features::of_kernel(opts.btf.as_deref()).compat() {
        if maps.enabled == &0 {
            store.with_tables(opts.pid, |t| seed_rows::<S>(opts.pid, t, &maps));
        }
        *maps.enabled = 1;
        return Ok(());
    }
    let capacity = maps.mappings.len();
    store.install(opts.pid, capacity, installed, |usable| {
        // The BPF side reads these while they change (shared memory): no mapping is searched while the slots
        // are rewritten, and the stores are volatile so that neither is elided.
        // SAFETY: count is a valid, aligned u32 of the mapped .bss.
        unsafe { std::ptr::write_volatile(maps.count, 0) };
        for (slot, m) in maps.mappings.iter_mut().zip(usable) {
            *slot = S::unwind_mapping(m);
        }
        // SAFETY: as above.
        unsafe { std::ptr::write_volatile(maps.count, usable.len() as u32) };
        *maps.enabled = 1;
        *maps.generation = maps.generation.wrapping_add(1);
    })
}

/// Publishes the tables of code mapped since (the store reads the process's memory map at most once a second
/// for all its collectors); called as tracing goes.
pub(crate) fn refresh_unwind<S: StackSkeleton>(
    opts: &CollectOptions,
    installed: &mut Installed,
    maps: UnwindMaps<'_, S::UnwindMapping>,
) -> Result<()> {
    let Some(store) = &opts.unwind else {
        return Ok(());
    };
    if Features::of_kernel(opts.btf.as_deref()).compat() {
        store.with_tables(opts.pid, |t| serve_wanted_rows::<S>(t, &maps));
    }
    store.refresh(opts.pid);
    install_unwind::<S>(opts, installed, maps)
}

/// The compat build's rows of the places where the process's threads wait now, before they are asked for: a
/// thread that waits all along switched out once, before user space could answer. Each thread's syscall site and
/// its first callers', from `/proc/PID/task/TID/syscall` (its stack and instruction pointers) and its stack.
fn seed_rows<S: StackSkeleton>(
    pid: u32,
    tables: Tables<'_>,
    maps: &UnwindMaps<'_, S::UnwindMapping>,
) {
    /// COMPAT_ROW_FRAMES of unwind.h.
    const ROW_FRAMES: usize = crate::unwind::abi::unwind_limits::COMPAT_ROW_FRAMES.0 as usize;
    use crate::process::memory::Memory;
    let Ok(mem) = crate::process::memory::ProcMemory::open(pid) else {
        return;
    };
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    let mut seeded = std::collections::HashSet::new();
    for task in tasks.flatten() {
        // "NR ARG1 … ARG6 SP PC" in a syscall; "running", or "-1 SP PC" outside one.
        let Ok(line) = std::fs::read_to_string(task.path().join("syscall")) else {
            continue;
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        let hex = |w: &&str| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok();
        let (Some(sp), Some(pc)) = (
            words
                .len()
                .checked_sub(2)
                .and_then(|i| words.get(i))
                .and_then(hex),
            words.last().and_then(hex),
        ) else {
            continue;
        };
        let regs = crate::unwind::replay::Registers { ip: pc, sp, bp: 0 };
        let read = |addr| mem.u64_at(addr);
        let frames = crate::unwind::replay::unwind(tables, regs, read, ROW_FRAMES);
        for (i, ip) in frames.into_iter().enumerate() {
            let at = if i == 0 { ip } else { ip.wrapping_sub(1) };
            if seeded.insert(at) {
                put_row::<S>(tables, maps, at);
            }
        }
    }
}

/// The compat build's wanted rows (unwind.h): each address's row from the tables, or one of kind gap where they
/// have none (frame pointers there), moved into `address_rows`. A full `address_rows` leaves the rest wanted.
fn serve_wanted_rows<S: StackSkeleton>(
    tables: Tables<'_>,
    maps: &UnwindMaps<'_, S::UnwindMapping>,
) {
    let wanted: Vec<Vec<u8>> = maps.wanted_rows.keys().collect();
    for key in wanted {
        let Ok(address) = <[u8; 8]>::try_from(key.as_slice()).map(u64::from_ne_bytes) else {
            continue;
        };
        if put_row::<S>(tables, maps, address) {
            let _ = maps.wanted_rows.delete(&key);
        }
    }
}

/// Puts the row of the instruction at `address` into the compat build's `address_rows`; false if it is full.
fn put_row<S: StackSkeleton>(
    tables: Tables<'_>,
    maps: &UnwindMaps<'_, S::UnwindMapping>,
    address: u64,
) -> bool {
    let row = crate::unwind::replay::row_at(tables, address).unwrap_or_default();
    let value = S::unwind_row(&row);
    // SAFETY: unwind_row is a plain struct of integers, as the map's value.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&value as *const S::UnwindRow).cast::<u8>(),
            std::mem::size_of::<S::UnwindRow>(),
        )
    };
    maps.address_rows
        .update(&address.to_ne_bytes(), bytes, libbpf_rs::MapFlags::ANY)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_past_the_largest_stop_there() {
        let stack = Arc::new(RawStack {
            user_len: 0,
            ips: Box::new([]),
        });
        let row = |values: &[u64]| Row {
            tid: 1,
            key: 0,
            stack: Arc::clone(&stack),
            values: values.into(),
        };
        let rows = [row(&[9, u64::MAX]), row(&[1, 2]), row(&[3])];
        assert_eq!(events(&rows, 0), 13);
        assert_eq!(events(&rows, 1), u64::MAX);
    }
}
