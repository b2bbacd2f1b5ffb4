//! Lock waits (src/bpf/locks.bpf.c): futex waits per lock word and waiter stack, and the stacks that woke
//! them.

use std::collections::HashMap;

use anyhow::{Context, Result};

use super::{
    maps::{read_typed, Plain},
    skeleton::stack_skeleton,
    stack_collector::{self, Collector, DrainPacing, Loaded, Open, Stacks, Sum},
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
    stack_collector::run(&mut Locks::default(), opts)
}

/// The fixed columns, before the histogram's.
const COLUMNS: [&str; 5] = ["waits", "wait_ns", "max_wait_ns", "futex_ops", "wakes"];
const MAX_WAIT: usize = 2;
const FUTEX_OPS: usize = 3;

#[derive(Default)]
struct Locks {
    /// The sums moved from the kernel, by process (0 for one), lock word, statement (`Stacks::labels`) and stack.
    drained: HashMap<(u32, u64, u32, u64), Box<[u64]>>,
    drains: DrainPacing,
}

impl Collector for Locks {
    type Skel = Skeleton;
    const NAME: &'static str = "profile locks";
    const KIND: super::Kind = super::Kind::Locks;

    fn columns(&self) -> Vec<String> {
        let buckets = skel::types::lock_wait::default().hist.len();
        let hist = (0..buckets).map(|i| format!("hist_{i}"));
        COLUMNS.map(String::from).into_iter().chain(hist).collect()
    }

    fn label_statements(&mut self, open: &mut Open<'_, Self>) -> Result<bool> {
        super::rodata(open.maps.rodata_data.as_deref_mut())?.statement_labels = true;
        Ok(true)
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

    fn tick(&mut self, skel: &mut Loaded<'_, Self>, stacks: &mut Stacks) -> Result<()> {
        // Sums per statement and connection fill the map far sooner than sums per stack alone.
        if stacks.labels.enabled() && self.drains.due() {
            self.drain(skel, stacks)?;
        }
        Ok(())
    }

    fn read(&mut self, skel: &mut Loaded<'_, Self>, stacks: &mut Stacks) -> Result<Vec<Sum>> {
        self.drain(skel, stacks)?;
        Ok(self.take_drained())
    }

    fn slice(&mut self, skel: &mut Loaded<'_, Self>, stacks: &mut Stacks) -> Result<Vec<Sum>> {
        self.drain(skel, stacks)?;
        Ok(self.take_drained())
    }
}

impl Locks {
    /// Adds a row's values to the sums of (process, lock word, statement, stack): the longest wait is the longest,
    /// the futex operations each set's, the rest summed (stopping at `u64::MAX`).
    fn add(&mut self, key: (u32, u64, u32, u64), values: impl Iterator<Item = u64>) {
        let values: Vec<u64> = values.collect();
        let sum = self
            .drained
            .entry(key)
            .or_insert_with(|| vec![0; values.len()].into());
        for (i, (s, v)) in sum.iter_mut().zip(values).enumerate() {
            *s = match i {
                MAX_WAIT => (*s).max(v),
                FUTEX_OPS => *s | v,
                _ => s.saturating_add(v),
            };
        }
    }

    fn take_drained(&mut self) -> Vec<Sum> {
        self.drained
            .drain()
            .map(|((pid, key, statement, stack_id), values)| Sum {
                pid,
                tid: 0,
                key,
                stack_id,
                values,
                statement,
            })
            .collect()
    }

    /// Moves the waiters' and wakers' sums out of the kernel's maps, which are left empty.
    fn drain(&mut self, skel: &Loaded<'_, Locks>, stacks: &mut Stacks) -> Result<()> {
        read_typed(
            &skel.maps.waits,
            true,
            |k: skel::types::lock_key, w: skel::types::lock_wait| {
                let statement = stacks
                    .labels
                    .resolve(k.tgid, k.tid, k.statement, k.connection);
                let values = [w.count, w.total_ns, w.max_ns, w.futex_ops, 0]
                    .into_iter()
                    .chain(w.hist);
                self.add((k.tgid, k.addr, statement, k.stack_id), values);
            },
        )
        .context("reading the lock waits' sums")?;
        let buckets = skel::types::lock_wait::default().hist.len();
        read_typed(
            &skel.maps.wakes,
            true,
            |k: skel::types::lock_key, wakes: u64| {
                let statement = stacks
                    .labels
                    .resolve(k.tgid, k.tid, k.statement, k.connection);
                let values = [0, 0, 0, 0, wakes]
                    .into_iter()
                    .chain(std::iter::repeat_n(0, buckets));
                self.add((k.tgid, k.addr, statement, k.stack_id), values);
            },
        )
        .context("reading the lock wakes' sums")?;
        Ok(())
    }
}
