//! Lock waits (src/bpf/locks.bpf.c): futex waits per lock word and waiter stack, and the stacks that woke them.

use std::{collections::HashMap, mem::MaybeUninit};

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, Skel};

use super::{drain, for_each_keyed, install_unwind, open_skel, size_unwind_maps, CollectOptions, Installed, RawStack};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/locks.skel.rs"));
}
use skel::*;

/// `HIST_BUCKETS` of src/bpf/locks.bpf.c: bucket i counts waits of [2^i, 2^(i+1)) µs (bucket 0: below 2 µs).
pub const HIST_BUCKETS: usize = 24;

#[derive(Clone, Debug, Default)]
pub struct Waits {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub hist: [u64; HIST_BUCKETS],
}

/// What tracing found, by lock word (an address in the process).
#[derive(Default)]
pub struct LockWaits {
    pub waits: Vec<(u64, RawStack, Waits)>,
    pub wakes: Vec<(u64, RawStack, u64)>,
    pub traced: std::time::Duration,
    pub lost: [u64; 4],
}

pub fn collect(opts: &CollectOptions) -> Result<LockWaits> {
    let mut object = MaybeUninit::uninit();
    let mut open = open_skel(LocksSkelBuilder::default(), &mut object, opts)?;
    let rodata = open.maps.rodata_data.as_deref_mut().context("BPF object has no .rodata")?;
    rodata.target_tgid = opts.pid;
    rodata.kernel_stacks = opts.kernel_stacks;
    rodata.futex_nr = libc::SYS_futex;
    size_unwind_maps(&mut open.maps.unwind_rows, &mut open.maps.unwind_pages, opts)?;
    let mut skel = open.load().context("loading the lock wait programs into the kernel")?;
    let bss = skel.maps.bss_data.as_deref_mut().context("BPF object has no .bss")?;
    let mut installed = Installed::default();
    let (rows, pages) = (&skel.maps.unwind_rows, &skel.maps.unwind_pages);
    install_unwind(opts, &mut installed, &mut unwind_maps!(rows, pages, bss))?;
    skel.attach().context("attaching to the syscall tracepoints")?;

    let bss = skel.maps.bss_data.as_deref_mut().context("BPF object has no .bss")?;
    let (rows, pages) = (&skel.maps.unwind_rows, &skel.maps.unwind_pages);
    // The events define stacks (value[0]: their id).
    let definitions = drain(&skel.maps.events, opts, "profile locks", (&mut installed, unwind_maps!(rows, pages, bss)), |_, _| {
        Ok(bss.lost)
    })?;
    let stacks: HashMap<u64, RawStack> = definitions.stacks.into_iter().map(|(stack, [id, _])| (id, stack)).collect();
    let mut found = LockWaits { traced: definitions.traced, lost: definitions.lost, ..LockWaits::default() };
    for_each_keyed(&skel.maps.waits, |addr, id, value| {
        let Some(stack) = stacks.get(&id) else { return };
        let field = |i: usize| value.get(i * 8..i * 8 + 8).map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap()));
        let mut w = Waits { count: field(0), total_ns: field(1), max_ns: field(2), hist: [0; HIST_BUCKETS] };
        for (i, h) in w.hist.iter_mut().enumerate() {
            *h = field(3 + i);
        }
        found.waits.push((addr, stack.clone(), w));
    });
    for_each_keyed(&skel.maps.wakes, |addr, id, value| {
        let Some(stack) = stacks.get(&id) else { return };
        let n = value.get(..8).map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap()));
        found.wakes.push((addr, stack.clone(), n));
    });
    Ok(found)
}

