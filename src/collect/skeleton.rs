//! What every collector's skeleton shares, by the same names (each includes src/bpf/stack_ids.h: the target, the
//! unwinder, the ring buffer `events`, the loss counters): the trait its marker type implements
//! ([`StackSkeleton`], by one [`stack_skeleton!`] line), its target and unwind maps set before loading
//! ([`set_common`]), the unwind tables published to it ([`install_unwind`], [`refresh_unwind`]; the compat build's
//! rows by address), its programs attached by section, and a stack record decoded.

use anyhow::{Context, Result};
use libbpf_rs::{
    skel::{OpenSkel, Skel, SkelBuilder},
    AsRawLibbpf, Link, MapCore, Object,
};

pub(crate) use super::unwind_store::Installed;
use super::{
    maps::{read_prefix, Plain},
    CollectOptions, Features, Lost, RawStack,
};
use crate::unwind::{BpfMapping, BpfRow, Tables};

/// A stack as the BPF side sends it (`struct stack_event` of src/bpf/stack_event.h), borrowed.
pub struct StackRecord<'a> {
    pub stack_id: u64,
    pub tid: u32,
    pub user_len: u16,
    pub kernel_len: u16,
    /// A sample's statement (src/bpf/statement.h's label) and connection, where the collector labels samples; else 0.
    pub statement: u64,
    pub connection: u64,
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

        impl $crate::collect::skeleton::StackSkeleton for $name {
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
            ) -> $crate::collect::skeleton::UnwindMaps<'a, Self::UnwindMapping> {
                let bss = skel
                    .maps
                    .bss_data
                    .as_deref_mut()
                    .expect("stack_ids.h puts variables in .bss");
                $crate::collect::skeleton::UnwindMaps {
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

            fn stack_record(e: &Self::StackEvent) -> $crate::collect::skeleton::StackRecord<'_> {
                $crate::collect::skeleton::StackRecord {
                    stack_id: e.stack_id,
                    tid: e.tid,
                    user_len: e.user_len,
                    kernel_len: e.kernel_len,
                    statement: e.statement,
                    connection: e.connection,
                    ips: &e.ips,
                }
            }
        }
    };
}
pub(crate) use stack_skeleton;

/// A `struct stack_event` record; `None` if it is malformed (never trusted).
pub fn decode_stack<S: StackSkeleton>(bytes: &[u8]) -> Option<DecodedStack> {
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
    Some(DecodedStack {
        tid: r.tid,
        stack_id: r.stack_id,
        statement: (r.statement, r.connection),
        stack,
    })
}

/// A `struct stack_event` record decoded: its thread, stack id, statement label and connection, and stack.
pub struct DecodedStack {
    pub tid: u32,
    pub stack_id: u64,
    pub statement: (u64, u64),
    pub stack: RawStack,
}

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
