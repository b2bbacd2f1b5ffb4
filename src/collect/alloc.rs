//! Allocations by stack (src/bpf/alloc.bpf.c): uprobes on the allocation functions of the process's C library.

use std::{mem::MaybeUninit, path::PathBuf};

use anyhow::{bail, Context, Result};
use libbpf_rs::{skel::OpenSkel, Link, MapCore, MapFlags, UprobeOpts};

use super::{drain, install_unwind, open_skel, refresh_unwind, size_unwind_maps, CollectOptions, Collected, Installed};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/alloc.skel.rs"));
}
use skel::*;

/// What to trace: every `sample_every`-th call asking for `min_size..=max_size` bytes.
pub struct AllocOptions {
    pub sample_every: u64,
    pub min_size: u64,
    pub max_size: u64,
}

/// `value[0]` of each stack is bytes requested, `value[1]` calls (of the sampled calls: scale by `sample_every`).
pub fn collect(opts: &CollectOptions, alloc: &AllocOptions) -> Result<Collected> {
    let libc = libc_of(opts.pid)?;
    let mut object = MaybeUninit::uninit();
    let mut open = open_skel(AllocSkelBuilder::default(), &mut object, opts)?;
    let rodata = open.maps.rodata_data.as_deref_mut().context("BPF object has no .rodata")?;
    rodata.target_tgid = opts.pid;
    rodata.kernel_stacks = opts.kernel_stacks;
    rodata.sample_every = alloc.sample_every.max(1);
    rodata.min_size = alloc.min_size;
    rodata.max_size = alloc.max_size;
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
        ("realloc", &progs.on_second_arg_size),
        ("aligned_alloc", &progs.on_second_arg_size),
        ("memalign", &progs.on_second_arg_size),
        ("posix_memalign", &progs.on_posix_memalign),
        ("valloc", &progs.on_malloc),
        ("pvalloc", &progs.on_malloc),
    ];
    let mut links: Vec<Link> = Vec::new();
    let mut missing = Vec::new();
    for (function, prog) in probes {
        let uprobe = UprobeOpts { func_name: Some(function.to_string()), ..Default::default() };
        match prog.attach_uprobe_with_opts(opts.pid as i32, &libc, 0, uprobe) {
            Ok(link) => links.push(link),
            Err(_) => missing.push(function),
        }
    }
    if links.is_empty() {
        bail!("could not attach to any allocation function of {}", libc.display());
    }
    if !missing.is_empty() {
        eprintln!("myprobe: note: {} has no {}: not traced", libc.display(), missing.join(", "));
    }

    // The events define stacks (value[0]: their id); the amounts are summed in the totals map.
    let definitions = drain(&skel.maps.events, opts, "profile alloc", |refresh| {
        if refresh {
            refresh_unwind(opts, &mut installed, unwind_maps!(rows, pages, bss))?;
        }
        Ok(bss.lost)
    });
    drop(links);
    let definitions = definitions?;
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
