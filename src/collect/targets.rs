//! Several processes traced by one set of programs (target.h's `many_targets`): the agent's servers whose unwind
//! tables share a store share one off-CPU object, whose programs run once per switch of the host rather than
//! once per server. Who is traced now, and where each one's sums go.
//!
//! The programs know a target by its bit in `target_bits` and its code by its entry in `unwind_processes`
//! (unwind.h); `stack_collector::run` writes both as members come and go, and sends each member the sums of its
//! threads (the collector gives each sum its process, `Sum::pid`).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{mpsc::Sender, Mutex, MutexGuard},
};

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use super::{
    collected::Slice,
    maps::{as_bytes, Plain},
    unwind_store::{Installed, UnwindStore},
};
use crate::unwind::{
    abi::{unwind_limits, unwind_process},
    BpfMapping,
};

/// The kernel's PID_MAX_LIMIT on 64-bit (include/linux/threads.h): no PID is above it, whatever pid_max says.
const PID_MAX_LIMIT: u32 = 4 << 20;
/// `target_bits`'s entries: a bit per PID.
pub const BIT_WORDS: u32 = PID_MAX_LIMIT / 32;
/// Processes one set of programs traces at most (`unwind_processes`'s entries: 12 KiB each).
pub const MAX_TARGETS: u32 = 64;
/// MAX_UNWIND_MAPPINGS of unwind.h.
const MAX_UNWIND_MAPPINGS: usize = unwind_limits::MAX_UNWIND_MAPPINGS.0 as usize;

// SAFETY: `struct unwind_process` of unwind.h, generated from its BTF: integers and structs of integers, its
// padding explicit fields.
unsafe impl Plain for unwind_process {}

/// The processes a set of programs traces, and where each one's slices go. A set with none left is closed: a
/// process that comes later starts a set of its own.
#[derive(Default)]
pub struct Targets(Mutex<Members>);

#[derive(Default)]
struct Members {
    by_pid: BTreeMap<u32, Sender<Slice>>,
    closed: bool,
}

impl Targets {
    /// A set with `pid` in it.
    pub fn of(pid: u32, send: Sender<Slice>) -> Targets {
        let targets = Targets::default();
        targets.lock().by_pid.insert(pid, send);
        targets
    }

    /// Adds `pid`, whose slices go to `send`; false if the set is closed or full.
    pub fn join(&self, pid: u32, send: Sender<Slice>) -> bool {
        let mut m = self.lock();
        if m.closed || m.by_pid.len() >= MAX_TARGETS as usize {
            return false;
        }
        m.by_pid.insert(pid, send);
        true
    }

    /// Takes `pid` out: its threads are no longer traced, nothing more is sent for it.
    pub fn leave(&self, pid: u32) {
        self.lock().by_pid.remove(&pid);
    }

    /// The members now; `None` once none is left, the set then closed for good.
    fn members(&self) -> Option<BTreeMap<u32, Sender<Slice>>> {
        let mut m = self.lock();
        if m.by_pid.is_empty() {
            m.closed = true;
        }
        (!m.closed).then(|| m.by_pid.clone())
    }

    fn lock(&self) -> MutexGuard<'_, Members> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The maps of a loaded object that say who is traced (unwind.h, target.h).
pub(crate) struct Kernel<'a> {
    pub target_bits: &'a dyn MapCore,
    pub processes: &'a dyn MapCore,
}

/// What a set of programs has told the kernel of its members.
#[derive(Default)]
pub(crate) struct Published {
    /// Each member's tables, as last written to `unwind_processes`.
    installed: HashMap<u32, (Installed, u32)>,
    /// Where each member's slices go.
    members: BTreeMap<u32, Sender<Slice>>,
    synced: bool,
}

impl Published {
    /// Follows the members: a new one's bit set and its code given, a gone one's taken back, and every one's
    /// code given again when its memory map changed. False once the set is closed (no member left).
    pub(crate) fn sync(
        &mut self,
        targets: &Targets,
        store: Option<&UnwindStore>,
        kernel: &Kernel<'_>,
    ) -> Result<bool> {
        self.synced = true;
        let Some(members) = targets.members() else {
            return Ok(false);
        };
        for &pid in self.members.keys().filter(|p| !members.contains_key(p)) {
            set_bit(kernel.target_bits, pid, false)?;
            // None there (no tables were given) is what was wanted.
            let _ = kernel.processes.delete(&pid.to_ne_bytes());
            self.installed.remove(&pid);
        }
        for &pid in members.keys().filter(|p| !self.members.contains_key(p)) {
            set_bit(kernel.target_bits, pid, true)?;
        }
        self.members = members;
        let Some(store) = store else {
            return Ok(true);
        };
        for &pid in self.members.keys() {
            store.refresh(pid);
            let (installed, generation) = self.installed.entry(pid).or_default();
            let mut written = Ok(());
            store.install(pid, MAX_UNWIND_MAPPINGS, installed, |usable| {
                *generation = generation.wrapping_add(1);
                written = write_process(kernel, pid, usable, *generation);
            })?;
            written?;
        }
        Ok(true)
    }

    /// Whether it follows a set of targets (it was synced once at least).
    pub(crate) fn serves(&self) -> bool {
        self.synced
    }

    /// Every member's code given again at the next [`Published::sync`], with a new generation: their
    /// threads' call-site caches are forgotten with the stacks user space forgot.
    pub(crate) fn forget_stacks(&mut self) {
        for (installed, _) in self.installed.values_mut() {
            *installed = Installed::default();
        }
    }

    /// The members as last synced, and where each one's slices go.
    pub(crate) fn members(&self) -> &BTreeMap<u32, Sender<Slice>> {
        &self.members
    }
}

fn set_bit(bits: &dyn MapCore, pid: u32, on: bool) -> Result<()> {
    let word = pid / 32;
    anyhow::ensure!(word < BIT_WORDS, "PID {pid} is above the kernel's limit");
    let key = word.to_ne_bytes();
    let now = bits
        .lookup(&key, MapFlags::ANY)
        .context("reading the map of processes traced")?
        .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
        .map_or(0, u32::from_ne_bytes);
    let mask = 1 << (pid % 32);
    let new = if on { now | mask } else { now & !mask };
    bits.update(&key, &new.to_ne_bytes(), MapFlags::ANY)
        .context("writing the map of processes traced")
}

/// Writes `struct unwind_process` of `pid` whole: its mappings, their count, unwinding on, its generation.
fn write_process(
    kernel: &Kernel<'_>,
    pid: u32,
    usable: &[BpfMapping],
    generation: u32,
) -> Result<()> {
    let mut process = Box::new(unwind_process {
        count: usable.len().min(MAX_UNWIND_MAPPINGS) as u32,
        enabled: 1,
        generation,
        ..unwind_process::default()
    });
    for (slot, m) in process.mappings.iter_mut().zip(usable) {
        *slot = *m;
    }
    let value = as_bytes(std::slice::from_ref(&*process));
    anyhow::ensure!(
        kernel.processes.value_size() as usize == value.len(),
        "unwind_processes holds {} bytes a process, not the {} expected",
        kernel.processes.value_size(),
        value.len()
    );
    kernel
        .processes
        .update(&pid.to_ne_bytes(), value, MapFlags::ANY)
        .context("writing the code of a process traced")
}
