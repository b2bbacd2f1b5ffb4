//! Allocations by stack (src/bpf/alloc.bpf.c): uprobes on the allocation functions of the process's C library.

use std::{collections::HashMap, mem::MaybeUninit, path::PathBuf};

use anyhow::{bail, Context, Result};
use libbpf_rs::{skel::OpenSkel, Link, MapCore, MapFlags, UprobeOpts};

use super::{drain, for_each_entry, install_unwind, open_skel, refresh_unwind, size_unwind_maps, CollectOptions, Collected, Installed};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/alloc.skel.rs"));
}
use skel::*;

/// What to trace: every `sample_every`-th call asking for `min_size..=max_size` bytes.
pub struct AllocOptions {
    pub sample_every: u64,
    pub min_size: u64,
    pub max_size: u64,
    /// memleak: report the allocations not freed when tracing ends that are at least this old (ns);
    /// `None`: report all allocations made (profile alloc).
    pub outstanding_older_than: Option<u64>,
    /// memleak: also report what is outstanding this often while tracing.
    pub interval: Option<std::time::Duration>,
}

/// `value[0]` of each stack is bytes, `value[1]` calls (of the sampled calls: scale by `sample_every`): asked
/// for while tracing, or (memleak) still allocated at the end.
/// With `alloc.interval`, `report` is given the outstanding allocations that often.
pub fn collect(opts: &CollectOptions, alloc: &AllocOptions, mut report: impl FnMut(&Collected)) -> Result<Collected> {
    let libc = libc_of(opts.pid)?;
    let mut object = MaybeUninit::uninit();
    let mut open = open_skel(AllocSkelBuilder::default(), &mut object, opts)?;
    let rodata = open.maps.rodata_data.as_deref_mut().context("BPF object has no .rodata")?;
    rodata.target_tgid = opts.pid;
    rodata.kernel_stacks = opts.kernel_stacks;
    rodata.sample_every = alloc.sample_every.max(1);
    rodata.min_size = alloc.min_size;
    rodata.max_size = alloc.max_size;
    rodata.track_outstanding = alloc.outstanding_older_than.is_some();
    size_unwind_maps(&mut open.maps.unwind_rows, &mut open.maps.unwind_pages, opts)?;
    let mut skel = open.load().context("loading the allocation probes into the kernel")?;
    let bss = skel.maps.bss_data.as_deref_mut().context("BPF object has no .bss")?;
    let mut installed = Installed::default();
    let (rows, pages) = (&skel.maps.unwind_rows, &skel.maps.unwind_pages);
    install_unwind(opts, &mut installed, unwind_maps!(rows, pages, bss))?;

    let progs = &skel.progs;
    let probes = [
        ("malloc", &progs.on_malloc),
        ("calloc", &progs.on_calloc),
        ("realloc", &progs.on_realloc),
        ("aligned_alloc", &progs.on_second_arg_size),
        ("memalign", &progs.on_second_arg_size),
        ("posix_memalign", &progs.on_posix_memalign),
        ("valloc", &progs.on_malloc),
        ("pvalloc", &progs.on_malloc),
    ];
    let leaks = alloc.outstanding_older_than.is_some();
    let attach = |function: &str, prog: &libbpf_rs::ProgramMut, retprobe: bool| {
        let uprobe = UprobeOpts { func_name: Some(function.to_string()), retprobe, ..Default::default() };
        prog.attach_uprobe_with_opts(opts.pid as i32, &libc, 0, uprobe)
    };
    // Return probes first (and detached first): an entry without its return would leave a pending entry.
    let (mut returns, mut entries): (Vec<Link>, Vec<Link>) = (Vec::new(), Vec::new());
    let mut missing = Vec::new();
    for (function, prog) in probes {
        if leaks {
            match attach(function, &progs.on_alloc_return, true) {
                Ok(link) => returns.push(link),
                Err(_) => {
                    missing.push(function);
                    continue;
                }
            }
        }
        match attach(function, prog, false) {
            Ok(link) => entries.push(link),
            Err(_) => missing.push(function),
        }
    }
    if leaks {
        entries.push(attach("free", &progs.on_free, false).with_context(|| format!("attaching to free in {}", libc.display()))?);
    }
    let links = (returns, entries);
    if links.1.is_empty() {
        bail!(
            "could not attach to any allocation function of {}: if the process allocates through another allocator \
             (jemalloc, tcmalloc) or was linked statically, its allocations cannot be traced here",
            libc.display()
        );
    }
    if !missing.is_empty() {
        eprintln!("myprobe: note: {} has no {}: not traced", libc.display(), missing.join(", "));
    }

    // The events define stacks (value[0]: their id); the amounts are summed in the totals map.
    let outstanding_map = &skel.maps.outstanding;
    let mut last_report = std::time::Instant::now();
    let definitions = drain(&skel.maps.events, opts, "profile alloc", |refresh, so_far| {
        if refresh {
            refresh_unwind(opts, &mut installed, unwind_maps!(rows, pages, bss))?;
            if let (Some(every), Some(older)) = (alloc.interval, alloc.outstanding_older_than) {
                if last_report.elapsed() >= every {
                    last_report = std::time::Instant::now();
                    report(&outstanding(so_far, outstanding_map, older));
                }
            }
        }
        Ok(bss.lost)
    });
    drop(links.0);
    drop(links.1);
    let definitions = definitions?;
    if let Some(older) = alloc.outstanding_older_than {
        return Ok(outstanding(&definitions, &skel.maps.outstanding, older));
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
            collected.add(stack, [total, calls]);
            collected.events += calls - 1;
        }
    }
    Ok(collected)
}

/// The C library the process uses, as the process sees it.
fn libc_of(pid: u32) -> Result<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).with_context(|| format!("reading /proc/{pid}/maps"))?;
    let path = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next().is_some_and(|name| name.starts_with("libc.so") || name.starts_with("libc-")))
        .with_context(|| format!("process {pid} has no C library mapped (a static binary?): its allocations cannot be traced"))?;
    Ok(PathBuf::from(format!("/proc/{pid}/root{path}")))
}

/// The allocations not freed, at least `older_ns` old, by stack (`definitions`: the stacks by id so far).
fn outstanding(definitions: &Collected, map: &dyn MapCore, older_ns: u64) -> Collected {
    let amounts = outstanding_by_stack(map, older_ns);
    let mut collected = Collected { lost: definitions.lost, traced: definitions.traced, ..Collected::default() };
    for (stack, [id, _]) in &definitions.stacks {
        if let Some(&[bytes, count]) = amounts.get(id) {
            collected.add(stack.clone(), [bytes, count]);
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
