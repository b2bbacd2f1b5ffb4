//! Lock waits (src/bpf/locks.bpf.c): futex waits per lock word and waiter stack, and the stacks that woke
//! them.

use anyhow::{Context, Result};

use super::{
    maps::{read_typed, Plain},
    skeleton::stack_skeleton,
    stack_collector::{self, Collector, Loaded, Open, Stacks, Sum},
    CollectOptions, Collected, Features,
};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/locks.skel.rs"));
}
stack_skeleton!(Skeleton, LocksSkelBuilder, OpenLocksSkel, LocksSkel);
// SAFETY: generated from BTF structs of integers and integer arrays.
unsafe impl Plain for skel::types::lock_key {}
// SAFETY: as above.
unsafe impl Plain for skel::types::lock_wait {}

/// Rows keyed by the lock word (an address in the process), of two kinds: a waiter stack's `waits`,
/// `wait_ns`, `max_wait_ns`, `futex_ops` (bit `op & 15` for each futex operation it waited with) and `hist_<i>`
/// (waits of [2^i, 2^(i+1)) µs; `hist_0` below 2 µs); or a waker stack's `wakes`.
pub fn collect(opts: &CollectOptions) -> Result<Collected> {
    stack_collector::run(&mut Locks, opts)
}

/// The fixed columns, before the histogram's.
const COLUMNS: [&str; 5] = ["waits", "wait_ns", "max_wait_ns", "futex_ops", "wakes"];

struct Locks;

impl Collector for Locks {
    type Skel = Skeleton;
    const NAME: &'static str = "profile locks";
    const KIND: super::Kind = super::Kind::Locks;

    fn columns(&self) -> Vec<String> {
        let buckets = skel::types::lock_wait::default().hist.len();
        let hist = (0..buckets).map(|i| format!("hist_{i}"));
        COLUMNS.map(String::from).into_iter().chain(hist).collect()
    }

    fn configure(&mut self, open: &mut Open<'_, Self>, features: &Features) -> Result<()> {
        let rodata = super::rodata(open.maps.rodata_data.as_deref_mut())?;
        rodata.futex_nr = libc::SYS_futex;
        // futex's own tracepoints spare every other syscall of the host a program run; the raw ones stay
        // for kernels without them and for kernel frames, which a syscall tracepoint's program has none of.
        let own = features.futex_tracepoints && !rodata.kernel_stacks;
        open.progs.on_futex_enter.set_autoload(own);
        open.progs.on_futex_exit.set_autoload(own);
        open.progs.on_sys_enter.set_autoload(!own);
        open.progs.on_sys_exit.set_autoload(!own);
        Ok(())
    }

    fn read(&mut self, skel: &mut Loaded<'_, Self>, _: &mut Stacks) -> Result<Vec<Sum>> {
        sums(skel, false)
    }

    fn slice(&mut self, skel: &mut Loaded<'_, Self>, _: &mut Stacks) -> Result<Vec<Sum>> {
        sums(skel, true)
    }
}

/// The waiters' and wakers' sums; `drain`: moved out of the kernel's maps, which are left empty.
fn sums(skel: &Loaded<'_, Locks>, drain: bool) -> Result<Vec<Sum>> {
    let mut sums = Vec::new();
    read_typed(
        &skel.maps.waits,
        drain,
        |k: skel::types::lock_key, w: skel::types::lock_wait| {
            let values = [w.count, w.total_ns, w.max_ns, w.futex_ops, 0]
                .into_iter()
                .chain(w.hist);
            sums.push(Sum {
                pid: k.tgid,
                tid: 0,
                key: k.addr,
                stack_id: k.stack_id,
                values: values.collect(),
                statement: 0,
            });
        },
    )
    .context("reading the lock waits' sums")?;
    let buckets = skel::types::lock_wait::default().hist.len();
    read_typed(
        &skel.maps.wakes,
        drain,
        |k: skel::types::lock_key, wakes: u64| {
            let values = [0, 0, 0, 0, wakes]
                .into_iter()
                .chain(std::iter::repeat_n(0, buckets));
            sums.push(Sum {
                pid: k.tgid,
                tid: 0,
                key: k.addr,
                stack_id: k.stack_id,
                values: values.collect(),
                statement: 0,
            });
        },
    )
    .context("reading the lock wakes' sums")?;
    Ok(sums)
}
