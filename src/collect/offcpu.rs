//! Off-CPU time (src/bpf/offcpu.bpf.c): scheduler tracepoints, split into blocked and runnable time.

use std::mem::MaybeUninit;

use anyhow::{Context, Result};
use libbpf_rs::{
    skel::{OpenSkel, Skel},
    MapCore, MapFlags,
};

use super::{drain, install_unwind, Installed, monotonic_ns, open_skel, refresh_unwind, size_unwind_maps, CollectOptions, Collected, RawStack};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/offcpu.skel.rs"));
}
use skel::*;

/// `value[0]` of each stack is blocked ns, `value[1]` runnable ns.
pub fn collect(opts: &CollectOptions, min_block_us: u64) -> Result<Collected> {
    let mut object = MaybeUninit::uninit();
    let mut open = open_skel(OffcpuSkelBuilder::default(), &mut object, opts)?;
    let rodata = open.maps.rodata_data.as_deref_mut().context("BPF object has no .rodata")?;
    rodata.target_tgid = opts.pid;
    rodata.kernel_stacks = opts.kernel_stacks;
    rodata.min_block_ns = min_block_us.saturating_mul(1000);
    size_unwind_maps(&mut open.maps.unwind_rows, &mut open.maps.unwind_pages, opts)?;
    let mut skel = open.load().context("loading the off-CPU programs into the kernel")?;
    let bss = skel.maps.bss_data.as_deref_mut().context("BPF object has no .bss")?;
    let mut installed = Installed::default();
    let (rows, pages) = (&skel.maps.unwind_rows, &skel.maps.unwind_pages);
    install_unwind(opts, &mut installed, unwind_maps!(rows, pages, bss))?;
    let started_ns = monotonic_ns();
    skel.attach().context("attaching to the scheduler tracepoints")?;

    let bss = skel.maps.bss_data.as_deref_mut().context("BPF object has no .bss")?;
    let (rows, pages) = (&skel.maps.unwind_rows, &skel.maps.unwind_pages);
    let mut collected = drain(&skel.maps.events, opts, "profile offcpu", |refresh, _| {
        if refresh {
            refresh_unwind(opts, &mut installed, unwind_maps!(rows, pages, bss))?;
        }
        Ok(bss.lost)
    })?;
    eprintln!(
        "myprobe: {} user stacks unwound, {} reused from the same thread's earlier wait at the same place",
        bss.stacks_unwound, bss.stacks_reused
    );
    add_open_waits(&skel.maps.threads, started_ns, min_block_us * 1000, &mut collected);
    Ok(collected)
}

/// What the threads have not sent yet: the waits summed on their current stack, and the wait of those still
/// off CPU when tracing ends (an idle connection blocked throughout), up to now. One map entry per thread.
fn add_open_waits(threads: &dyn MapCore, started_ns: u64, min_ns: u64, collected: &mut Collected) {
    let now = monotonic_ns();
    for key in threads.keys() {
        let Ok(Some(bytes)) = threads.lookup(&key, MapFlags::ANY) else { continue };
        if bytes.len() < std::mem::size_of::<types::thread_state>() {
            continue;
        }
        // SAFETY: the value is a `struct thread_state` of the size checked above; read unaligned.
        let st: types::thread_state = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        // Summed on the thread's current stack and not sent yet.
        let mut values = st.ev.value;
        if st.off_ts != 0 && st.off_ts <= now && now - st.off_ts >= min_ns {
            let off = st.off_ts.max(started_ns);
            let open = if st.preempted != 0 {
                [0, now - off]
            } else if st.wake_ts >= st.off_ts && st.wake_ts <= now {
                let wake = st.wake_ts.max(off);
                [wake - off, now - wake]
            } else {
                [now - off, 0]
            };
            values = [values[0] + open[0], values[1] + open[1]];
        }
        if values == [0, 0] {
            continue;
        }
        let frames = (st.ev.user_len as usize + st.ev.kernel_len as usize).min(st.ev.ips.len());
        let stack = RawStack { tid: st.ev.tid, kind: 0, user_len: st.ev.user_len, ips: st.ev.ips[..frames].into() };
        collected.add(stack, values);
    }
}
