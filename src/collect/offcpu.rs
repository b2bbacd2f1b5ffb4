//! Off-CPU time (src/bpf/offcpu.bpf.c): scheduler tracepoints, split into blocked and runnable time.

use std::{collections::HashMap, io::Read, mem::MaybeUninit};

use anyhow::{Context, Result};
use libbpf_rs::{
    skel::{OpenSkel, Skel},
    Iter, IterOpts, MapCore,
};

use super::{
    drain, for_each_entry, for_each_keyed, install_unwind, kernel_at_least, monotonic_ns, open_skel, size_unwind_maps, CollectOptions,
    Collected, Installed, RawStack,
};

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
    // Run once at the end (bpf_copy_from_user_task: Linux 5.18).
    let blocked_iterator = kernel_at_least(5, 18);
    open.progs.blocked_threads.set_autoload(blocked_iterator);
    open.progs.blocked_threads.set_autoattach(false);
    size_unwind_maps(&mut open.maps.unwind_rows, &mut open.maps.unwind_pages, opts)?;
    let mut skel = open.load().context("loading the off-CPU programs into the kernel")?;
    let bss = skel.maps.bss_data.as_deref_mut().context("BPF object has no .bss")?;
    let mut installed = Installed::default();
    let (rows, pages) = (&skel.maps.unwind_rows, &skel.maps.unwind_pages);
    install_unwind(opts, &mut installed, &mut unwind_maps!(rows, pages, bss))?;
    let started_ns = monotonic_ns();
    skel.attach().context("attaching to the scheduler tracepoints")?;

    let bss = skel.maps.bss_data.as_deref_mut().context("BPF object has no .bss")?;
    let (rows, pages) = (&skel.maps.unwind_rows, &skel.maps.unwind_pages);
    // The events define stacks (value[0]: their id); the times are summed per (thread, stack id) in totals.
    let definitions = drain(&skel.maps.events, opts, "profile offcpu", (&mut installed, unwind_maps!(rows, pages, bss)), |_, _| {
        Ok(bss.lost)
    })?;
    let mut times: HashMap<(u64, u64), [u64; 2]> = HashMap::new();
    for_each_keyed(&skel.maps.totals, |tid, id, value| {
        let field = |i: usize| value.get(i * 8..i * 8 + 8).map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap()));
        times.insert((tid, id), [field(0), field(1)]);
    });
    add_open_waits(&skel.maps.threads, started_ns, min_block_us * 1000, &mut times);
    let stacks: HashMap<u64, RawStack> = definitions.stacks.into_iter().map(|(stack, [id, _])| (id, stack)).collect();
    let mut collected = Collected { lost: definitions.lost, traced: definitions.traced, ..Collected::default() };
    for ((tid, id), values) in times {
        if let Some(stack) = stacks.get(&id) {
            collected.add(RawStack { tid: tid as u32, ..stack.clone() }, values);
        }
    }
    if blocked_iterator {
        let traced_ns = collected.traced.as_nanos() as u64;
        match blocked_throughout(&skel.progs.blocked_threads) {
            Ok(blocked) => blocked.into_iter().for_each(|stack| collected.add(stack, [traced_ns, 0])),
            Err(e) => eprintln!("myprobe: warning: the threads blocked throughout are left out: {e:#}"),
        }
    }
    Ok(collected)
}

/// The stacks of the threads off CPU that never left it while tracing (the task iterator of offcpu.bpf.c).
fn blocked_throughout(iterator: &libbpf_rs::ProgramMut) -> Result<Vec<RawStack>> {
    let link = iterator.attach_iter_with_opts(IterOpts::None).context("attaching the task iterator")?;
    let mut records = Vec::new();
    Iter::new(&link).context("running the task iterator")?.read_to_end(&mut records)?;
    let mut blocked = Collected::default();
    for record in records.chunks_exact(std::mem::size_of::<types::stack_event>()) {
        blocked.add_event(record);
    }
    Ok(blocked.stacks.into_keys().collect())
}

/// The waits of the threads still off CPU when tracing ends (an idle connection blocked since its last
/// statement), up to now, on the stack where each left the CPU.
fn add_open_waits(threads: &dyn MapCore, started_ns: u64, min_ns: u64, times: &mut HashMap<(u64, u64), [u64; 2]>) {
    let now = monotonic_ns();
    for_each_entry(threads, |key, bytes| {
        if key.len() < 4 || bytes.len() < std::mem::size_of::<types::thread_state>() {
            return;
        }
        let tid = u32::from_ne_bytes(key[..4].try_into().unwrap()) as u64;
        // SAFETY: the value is a `struct thread_state` of the size checked above; read unaligned.
        let st: types::thread_state = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        if st.off_ts == 0 || st.off_ts > now || now - st.off_ts < min_ns || st.stack_id == 0 {
            return;
        }
        let off = st.off_ts.max(started_ns);
        let open = if st.preempted != 0 {
            [0, now - off]
        } else if st.wake_ts >= st.off_ts && st.wake_ts <= now {
            let wake = st.wake_ts.max(off);
            [wake - off, now - wake]
        } else {
            [now - off, 0]
        };
        let t = times.entry((tid, st.stack_id)).or_default();
        t[0] += open[0];
        t[1] += open[1];
    });
}
