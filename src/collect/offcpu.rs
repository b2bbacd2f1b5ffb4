//! Off-CPU time (src/bpf/offcpu.bpf.c): scheduler tracepoints time every wait of the process's threads,
//! split into blocked and runnable time, summed per (thread, stack) in the kernel.

use std::collections::HashMap;

use anyhow::{Context, Result};
use libbpf_rs::{skel::Skel, Link};

use super::{
    maps::{drain_typed, for_each_typed, read_exact, Plain},
    monotonic_ns,
    skeleton::{attach_by_section, stack_skeleton},
    stack_collector::{self, Collector, DrainPacing, Loaded, Open, Stacks, Sum},
    CollectOptions, Collected, Features,
};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/offcpu.skel.rs"));
}
stack_skeleton!(Skeleton, OffcpuSkelBuilder, OpenOffcpuSkel, OffcpuSkel);
// SAFETY: generated from BTF structs of integers.
unsafe impl Plain for skel::types::offcpu_key {}
// SAFETY: as above.
unsafe impl Plain for skel::types::offcpu_time {}
// SAFETY: as above.
unsafe impl Plain for skel::types::thread_state {}
// SAFETY: as above.
unsafe impl Plain for skel::types::preempt_key {}
// SAFETY: as above.
unsafe impl Plain for skel::types::preempt_count {}

/// A task that took the CPU from a thread of the process while that thread could still run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemption {
    pub preemptor_tgid: u32,
    pub preemptor_tid: u32,
    pub preemptor_comm: String,
    /// Its process's name (its thread group leader's).
    pub preemptor_process: String,
    /// The kernel's prio: below 100 real-time, else 120 + nice.
    pub preemptor_prio: i32,
    pub preempted_tid: u32,
    pub preempted_prio: i32,
    pub count: u64,
    /// The time the preempted thread then waited for a CPU.
    pub runq_ns: u64,
}

/// What offcpu traces.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Waits shorter than this are dropped in the kernel.
    pub min_block_us: u64,
    /// Sums per thread (tid 0 otherwise).
    pub per_thread: bool,
    /// Who took the CPU from the process's threads while they could run (DTrace's sched provider's "who
    /// preempts whom"), counted in the kernel at each switch.
    pub preemptors: bool,
    /// A thread preempted at a site not unwound before keeps its instruction alone (`[preempted: leaf only]`)
    /// instead of being unwound (about 10 µs) at a switch most of whose waits are too short to count.
    pub preempted_leaf_only: bool,
}

/// Rows: `blocked_ns`, `runnable_ns` and `periods` (times off CPU) per stack (and thread); with
/// `preemptors`, the preemptions.
pub fn collect(opts: &CollectOptions, o: Options) -> Result<(Collected, Vec<Preemption>)> {
    let mut offcpu = Offcpu {
        many: opts.targets.is_some(),
        min_ns: o.min_block_us.saturating_mul(1000),
        per_thread: o.per_thread,
        preemptors: o.preemptors,
        preempted_leaf_only: o.preempted_leaf_only,
        ..Offcpu::default()
    };
    let collected = stack_collector::run(&mut offcpu, opts)?;
    Ok((collected, offcpu.preemptions))
}

/// A NUL-terminated name of a kernel `comm` field.
fn comm(bytes: &[i8]) -> String {
    let bytes: Vec<u8> = bytes
        .iter()
        .map(|&b| b as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[derive(Default)]
struct Offcpu {
    /// Several processes traced (`CollectOptions::targets`): each sum's process in its key, and what is read
    /// when tracing ends (for one process) left out.
    many: bool,
    min_ns: u64,
    /// Sums are kept per thread only when asked: otherwise what user space holds is bounded by the stacks,
    /// not by the threads that ever ran.
    per_thread: bool,
    /// The sums moved from the kernel so far, by process (0 for one), thread (0 unless per_thread), statement
    /// (`Stacks::labels`) and stack id.
    drained: HashMap<(u32, u32, u32, u64), [u64; 3]>,
    drains: DrainPacing,
    /// The threads blocked throughout are found by a task iterator when tracing ends.
    blocked_iterator: bool,
    started_ns: u64,
    ended_ns: u64,
    preemptors: bool,
    preempted_leaf_only: bool,
    preemptions: Vec<Preemption>,
}

impl Collector for Offcpu {
    type Skel = Skeleton;
    const NAME: &'static str = "profile offcpu";
    const KIND: super::Kind = super::Kind::Offcpu;

    fn columns(&self) -> Vec<String> {
        ["blocked_ns", "runnable_ns", "periods"]
            .map(String::from)
            .to_vec()
    }

    fn events_column(&self) -> usize {
        2
    }

    fn configure(&mut self, open: &mut Open<'_, Self>, features: &Features) -> Result<()> {
        let rodata = super::rodata(open.maps.rodata_data.as_deref_mut())?;
        rodata.min_block_ns = self.min_ns;
        rodata.preemptors = self.preemptors;
        rodata.preempted_leaf_only = self.preempted_leaf_only;
        // Where the kernel counts each thread's waits for a CPU, a woken one's is read at its switch in: no
        // program at every wakeup of the host.
        rodata.runq_from_sched_info = features.sched_info;
        open.progs.on_wakeup.set_autoload(!features.sched_info);
        open.progs.on_wakeup_new.set_autoload(!features.sched_info);
        // Switches out at any instruction (preemption, page faults) would make each a stack of its own.
        rodata.leaf_at_row_start = true;
        self.blocked_iterator = features.task_stacks && !features.compat();
        open.progs
            .blocked_threads
            .set_autoload(self.blocked_iterator);
        open.progs.blocked_threads.set_autoattach(false);
        open.progs.open_waits.set_autoattach(false);
        Ok(())
    }

    fn label_statements(&mut self, open: &mut Open<'_, Self>) -> Result<bool> {
        super::rodata(open.maps.rodata_data.as_deref_mut())?.statement_labels = true;
        Ok(true)
    }

    fn attach(&mut self, skel: &mut Loaded<'_, Self>) -> Result<Vec<Link>> {
        self.started_ns = monotonic_ns();
        self.drains.restart();
        attach_by_section(skel.object())
    }

    fn tick(&mut self, skel: &mut Loaded<'_, Self>, stacks: &mut Stacks) -> Result<()> {
        if self.drains.due() {
            self.drain(skel, stacks)?;
        }
        Ok(())
    }

    fn stop(&mut self) {
        self.ended_ns = monotonic_ns();
    }

    fn read(&mut self, skel: &mut Loaded<'_, Self>, stacks: &mut Stacks) -> Result<Vec<Sum>> {
        self.drain(skel, stacks)?;
        if self.many {
            return Ok(self.take_drained());
        }
        if self.preemptors {
            for_each_typed(
                &skel.maps.preemptions,
                |k: skel::types::preempt_key, c: skel::types::preempt_count| {
                    self.preemptions.push(Preemption {
                        preemptor_tgid: k.preemptor_tgid,
                        preemptor_tid: k.preemptor_tid,
                        preemptor_comm: comm(&c.preemptor_comm),
                        preemptor_process: comm(&c.preemptor_process),
                        preemptor_prio: c.preemptor_prio,
                        preempted_tid: k.preempted_tid,
                        preempted_prio: c.preempted_prio,
                        count: c.count,
                        runq_ns: c.runq_ns,
                    });
                },
            );
        }
        if let Err(e) = self.add_open_waits(skel, stacks) {
            say!("myprobe: warning: the waits still open at the end are left out: {e:#}");
        }
        if self.blocked_iterator {
            let traced_ns = self.ended_ns.saturating_sub(self.started_ns);
            match blocked_throughout(&skel.progs.blocked_threads, stacks) {
                Ok(blocked) => {
                    for (tid, stack_id, statement) in blocked {
                        self.add((0, tid, statement, stack_id), [traced_ns, 0, 1]);
                    }
                }
                Err(e) => {
                    say!("myprobe: warning: the threads blocked throughout are left out: {e:#}")
                }
            }
        }
        Ok(self.take_drained())
    }

    fn slice(&mut self, skel: &mut Loaded<'_, Self>, stacks: &mut Stacks) -> Result<Vec<Sum>> {
        self.drain(skel, stacks)?;
        Ok(self.take_drained())
    }
}

impl Offcpu {
    /// Adds to the sums of (process, thread, statement, stack id).
    fn add(&mut self, (tgid, tid, statement, stack_id): (u32, u32, u32, u64), values: [u64; 3]) {
        let tid = if self.per_thread { tid } else { 0 };
        let sum = self
            .drained
            .entry((tgid, tid, statement, stack_id))
            .or_default();
        for (s, v) in sum.iter_mut().zip(values) {
            *s = s.saturating_add(v);
        }
    }

    fn take_drained(&mut self) -> Vec<Sum> {
        self.drained
            .drain()
            .map(|((pid, tid, statement, stack_id), values)| Sum {
                pid,
                tid,
                key: 0,
                stack_id,
                values: Box::new(values),
                statement,
            })
            .collect()
    }

    /// Moves the kernel's sums here, emptying its map.
    fn drain(&mut self, skel: &Loaded<'_, Self>, stacks: &mut Stacks) -> Result<()> {
        drain_typed(
            &skel.maps.totals,
            |k: skel::types::offcpu_key, t: skel::types::offcpu_time| {
                let statement = stacks
                    .labels
                    .resolve(k.tgid, k.tid, k.statement, k.connection);
                self.add(
                    (k.tgid, k.tid, statement, k.stack_id),
                    [t.blocked_ns, t.runnable_ns, t.periods],
                );
            },
        )
        .context("moving the off-CPU sums from the kernel")?;
        Ok(())
    }

    /// The waits of the threads still off CPU when tracing ended (an idle connection blocked since its last
    /// statement), up to then, on the stack where each left the CPU.
    fn add_open_waits(&mut self, skel: &Loaded<'_, Self>, stacks: &mut Stacks) -> Result<()> {
        let end = self.ended_ns;
        let records = super::run_task_iterator(&skel.progs.open_waits)?;
        for st in records
            .chunks_exact(std::mem::size_of::<skel::types::thread_state>())
            .filter_map(read_exact::<skel::types::thread_state>)
        {
            if st.off_ts == 0
                || st.off_ts > end
                || end - st.off_ts < self.min_ns
                || st.stack_id == 0
            {
                continue;
            }
            let off = st.off_ts.max(self.started_ns);
            let [blocked, runnable] = if st.preempted != 0 {
                [0, end - off]
            } else if st.wake_ts >= st.off_ts && st.wake_ts <= end {
                let wake = st.wake_ts.max(off);
                [wake - off, end - wake]
            } else {
                [end - off, 0]
            };
            let statement = stacks
                .labels
                .resolve(0, st.tid, st.statement, st.connection);
            self.add((0, st.tid, statement, st.stack_id), [blocked, runnable, 1]);
        }
        Ok(())
    }
}

/// The threads off CPU that never left it while tracing (the task iterator of offcpu.bpf.c), as (thread,
/// stack id, statement); their stacks are added to `stacks`.
fn blocked_throughout(
    iterator: &libbpf_rs::ProgramMut,
    stacks: &mut Stacks,
) -> Result<Vec<(u32, u64, u32)>> {
    let records = super::run_task_iterator(iterator)?;
    let mut blocked = Vec::new();
    let mut rest = records.as_slice();
    // Stacks, each after its statement's text where that had not been sent.
    while rest.len() >= 8 {
        let size = if rest[..8] == [0; 8] {
            // statement.h's: a text, or a connection (kind 1).
            match rest.get(8..12) {
                Some([1, 0, 0, 0]) => super::labels::CONNECTION_BYTES,
                _ => std::mem::size_of::<skel::types::statement_text>(),
            }
        } else {
            std::mem::size_of::<skel::types::stack_event>()
        };
        let Some(record) = rest.get(..size) else {
            break;
        };
        if let Some(stack) = stacks.add_record::<Skeleton>(record) {
            blocked.push(stack);
        }
        rest = &rest[size..];
    }
    Ok(blocked)
}
