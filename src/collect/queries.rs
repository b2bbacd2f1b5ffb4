//! Per-statement accounting (src/bpf/queries.bpf.c): the client/server protocol followed through the server's
//! socket syscalls, with each statement's time partitioned (on CPU, waiting for one, in syscalls by class)
//! and the stack of its longest futex wait.

use std::{
    cell::Cell,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use libbpf_rs::{skel::Skel, Link, MapCore, ProgramAttachType, UprobeMultiOpts, UprobeOpts};

use super::{
    lifecycle::{self, End, Lifecycle, Step},
    maps::{for_each_per_cpu, read_exact, read_prefix, read_prefix_into, Plain},
    periods::SamplePeriods,
    ring,
    skeleton::{attach_by_section, decode_stack, stack_skeleton, StackSkeleton},
    CollectOptions, Lost, RawStack,
};
use crate::process::probes::Function;
use crate::wire::{compression, protocol};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/queries.skel.rs"));
}
use skel::{types::*, OpenQueriesSkel, QueriesSkel};
stack_skeleton!(Skeleton, QueriesSkelBuilder, OpenQueriesSkel, QueriesSkel);
// SAFETY: generated from BTF structs of integers, integer arrays and such structs.
unsafe impl Plain for query_event {}
// SAFETY: as above.
unsafe impl Plain for query_thread {}
// SAFETY: as above.
unsafe impl Plain for executed_event {}
// SAFETY: as above.
unsafe impl Plain for started_statement {}
// SAFETY: as above.
unsafe impl Plain for run_cost {}

/// `query_event::compressed`: the request kept is a packet's body, its header sent alone before (queries.h).
const COMPRESSED_BODY: u8 = 2;

/// Statements are sent whole, not once per stack: a larger ring buffer than the stack collectors'; about a
/// second of sysbench's statements on two CPUs, where the reader drains it every 100 ms. Mapped into
/// myprobe twice (the kernel's trick for records that wrap), so its RSS counts it twice.
const RING_BUFFER_BYTES: u32 = 8 << 20;

/// How long the execution probe stays attached once no longer wanted: statements of unknown text come in bursts
/// (a pool's connections, one after another), and each attach costs the server a few milliseconds.
const EXECUTE_PROBE_LINGER: Duration = Duration::from_secs(1);

/// How often a period's end looks for statements still in flight: the programs stay attached until none is.
const DRAIN_CHECK: Duration = Duration::from_millis(100);

/// A statement's resource use, as the kernel side counted it (nanoseconds, bytes, counts).
pub type Counters = query_counters;
/// The parts of a statement's time (`Counters::part_ns`), by their generated names: `time_part::PART_LOCK`.
pub use skel::types::time_part as TimePart;

#[derive(Clone, Debug)]
pub struct RawStatement {
    pub tid: u32,
    pub fd: i32,
    /// The inode of its socket, 0 if not known: `fd`'s number is the next connection's once this one closes.
    pub socket_ino: u64,
    /// Request payload length from its header; `request` holds its first bytes (command byte first).
    pub packet_len: u32,
    pub request: Vec<u8>,
    /// The first bytes of the reply, packet header included.
    pub reply: Vec<u8>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub counters: Counters,
    /// Still running when tracing ended: `end_ns` is then, and there is no reply yet.
    pub in_flight: bool,
    /// Read ahead with the statement before it on its thread, and run within that statement's time: no
    /// syscall separates them, so its own time and counters are unknown (zero).
    pub pipelined: bool,
    /// It ran when tracing began ([`StartedBefore`]): `request` is its command byte alone, its text the caller's;
    /// `start_ns` is its real start, and its parts are the time since tracing began.
    pub before_tracing: bool,
}

/// A statement the server ran when tracing began, read from its memory by the caller: followed from then on as if
/// traced from its start (queries.bpf.c's `start_statements`).
#[derive(Clone, Debug)]
pub struct StartedBefore {
    pub tid: u32,
    /// Its real start, CLOCK_MONOTONIC.
    pub start_ns: u64,
    /// Its command (`protocol::COM_QUERY`, …).
    pub command: u8,
    /// The stack its thread waited on when read, for a futex wait: the statement's lock wait until it ends.
    pub wait_stack: Option<RawStack>,
}

/// The stack ids given to the stacks of [`StartedBefore::wait_stack`]: the kernel's are hashes of the frames, and
/// one with these top bits is as unlikely as any collision.
const STARTED_STACK_IDS: u64 = 0x5eed << 48;

/// What the statements' collector hands on as it arrives: the server's data (what it read on the wire, stacks,
/// executions), then what the collector says of itself, then time passing.
#[derive(Clone, Debug)]
pub enum Event {
    /// What the statement tracker reads (`query::Tracker::handle`).
    Wire(Wire),
    /// A stack (the longest lock wait's of statements: `Counters::lock_stack`), sent once, before the first
    /// statement that names it.
    Stack { id: u64, stack: RawStack },
    /// An execution of a prepared statement began, seen by the execution probe ([`ExecuteProbe`]).
    Executed(Executed),
    /// What the collector did or lost: no data, said for the consumer's notes and decisions.
    Status(Status),
    /// The statements' futex waits under way for longer than `Control::want_long_waits` asks, looked for every
    /// `LONG_WAITS_LOOK` while wanted.
    LongWaits(Vec<LongWait>),
    /// Time passes: said at every poll of the ring buffer (about ten times a second), events or not.
    Tick,
}

/// A statement's futex wait under way: its thread, its stack's id and the type its thread last announced
/// (`wait_slot::hint`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LongWait {
    pub tid: u32,
    pub stack: u64,
    pub hint: u32,
}

/// A statement, or a packet outside one: what was read on a connection.
#[derive(Clone, Debug)]
pub enum Wire {
    Statement(Box<RawStatement>),
    /// A client packet outside a statement (handshake response, or a command read ahead with the one before
    /// it, at sequence 0): sequence id, the length its header gives, and its payload (maybe the beginning).
    PacketIn {
        tid: u32,
        fd: i32,
        socket_ino: u64,
        seq: u8,
        packet_len: u32,
        payload: Vec<u8>,
        ts_ns: u64,
    },
    /// Bytes the server sent outside a statement (greeting, authentication), headers included.
    PacketOut {
        tid: u32,
        fd: i32,
        socket_ino: u64,
        bytes: Vec<u8>,
    },
}

/// What the collector says of itself as it traces.
#[derive(Clone, Debug)]
pub enum Status {
    /// What was lost so far, when it changed (read every tick): losses are said as tracing goes.
    Lost(Lost),
    /// Sampled (`CollectOptions::duty`): statements start again (true), or no longer (false) until the next
    /// period.
    Period(bool),
    /// Sampled: from now on a statement traced stands for this many (`SamplePeriods::every`: its period is one
    /// in that many), until the next `Cycle`. Said when it changes from the duty's `every`.
    Cycle(u32),
    /// The TLS fallback's uprobes were attached while tracing (not from the start).
    DispatchProbe,
    /// The uprobes on the server's TLS read and write ([`TlsProbe`]) were attached (Ok) or could not be (why):
    /// said once, before tracing begins.
    TlsProbe(Result<(), String>),
    /// The execution probe was attached (true) or detached.
    ExecuteProbe(bool),
    /// The execution probe could not be attached (why): it is not tried again.
    ExecuteProbeFailed(String),
    /// The execution probe reads the statements' texts from now on (`ExecuteWish::text_offset` given to it).
    ExecuteTexts,
}

/// An execution of a prepared statement, seen at the server's function that runs it: the statement object,
/// and, once `ExecuteWish::text_offset` is set, the text it keeps there.
#[derive(Clone, Debug)]
pub struct Executed {
    pub tid: u32,
    /// The id of the statement the thread's request executes.
    pub statement_id: u32,
    pub object: u64,
    /// The text's length as the object gives it; `text` holds at most `MAX_TEXT` bytes of it.
    pub full_len: u64,
    pub text: Vec<u8>,
}

/// Syscall number → class (`enum syscall_class` of src/bpf/queries.h), from this architecture's numbers.
fn syscall_classes() -> [syscall_class; 512] {
    let mut classes = [syscall_class::SYSCALL_OTHER; 512];
    let mut set = |nrs: &[libc::c_long], class: syscall_class| {
        for &nr in nrs {
            if let Some(c) = classes.get_mut(nr as usize) {
                *c = class;
            }
        }
    };
    set(&[libc::SYS_recvfrom], syscall_class::SYSCALL_NET_RECV);
    set(&[libc::SYS_sendto], syscall_class::SYSCALL_NET_SEND);
    // Their argument is a struct msghdr, not the bytes. (recvmmsg and sendmmsg, which no server uses on a
    // client's socket, count as other syscalls.)
    set(&[libc::SYS_recvmsg], syscall_class::SYSCALL_NET_RECVMSG);
    set(&[libc::SYS_sendmsg], syscall_class::SYSCALL_NET_SENDMSG);
    set(
        &[libc::SYS_ppoll, libc::SYS_pselect6, libc::SYS_epoll_pwait],
        syscall_class::SYSCALL_NET_POLL,
    );
    #[cfg(target_arch = "x86_64")]
    set(
        &[libc::SYS_poll, libc::SYS_select, libc::SYS_epoll_wait],
        syscall_class::SYSCALL_NET_POLL,
    );
    set(
        &[
            libc::SYS_read,
            libc::SYS_pread64,
            libc::SYS_readv,
            libc::SYS_preadv,
            libc::SYS_preadv2,
        ],
        syscall_class::SYSCALL_READ,
    );
    set(
        &[
            libc::SYS_write,
            libc::SYS_pwrite64,
            libc::SYS_writev,
            libc::SYS_pwritev,
            libc::SYS_pwritev2,
        ],
        syscall_class::SYSCALL_WRITE,
    );
    set(
        &[
            libc::SYS_fsync,
            libc::SYS_fdatasync,
            libc::SYS_sync_file_range,
            libc::SYS_syncfs,
        ],
        syscall_class::SYSCALL_SYNC,
    );
    set(&[libc::SYS_futex], syscall_class::SYSCALL_FUTEX);
    set(&[libc::SYS_close], syscall_class::SYSCALL_CLOSE);
    classes
}

/// The TLS fallback: uprobes on the server's `dispatch_command`, attached once `Control::dispatch_wanted` is true
/// (set by whoever sees a TLS handshake) or from the start.
pub struct DispatchProbe<'a> {
    pub binary: &'a Path,
    pub function: &'a Function,
    pub args: crate::server::DispatchArgs,
}

impl DispatchProbe<'_> {
    /// Attaches the probes once they are wanted, return probe first: an entry probe without it would start
    /// statements that nothing ends.
    fn attach_if_wanted(
        &self,
        wanted: bool,
        progs: &skel::QueriesProgs,
        pid: u32,
        links: &mut Vec<Link>,
    ) -> Result<()> {
        if !wanted || !links.is_empty() {
            return Ok(());
        }
        for (prog, retprobe) in [
            (&progs.on_dispatch_return, true),
            (&progs.on_dispatch, false),
        ] {
            links.push(attach_uprobe(
                prog,
                retprobe,
                pid,
                self.binary,
                self.function,
            )?);
        }
        Ok(())
    }
}

/// TLS connections' plaintext: uprobes on the server's own `vio_ssl_read` and `vio_ssl_write` (MariaDB's and MySQL's
/// layer above OpenSSL: their entries are instructions the kernel emulates, where OpenSSL's `SSL_read` is
/// single-stepped at ten times the cost), attached for the whole trace.
pub struct TlsProbe<'a> {
    pub binary: &'a Path,
    pub read: Function,
    pub write: Function,
}

impl<'a> TlsProbe<'a> {
    /// Attaches the probes, and says whether they are in place: a failure leaves TLS connections unread, not the
    /// others.
    fn attach_said(
        &self,
        progs: &skel::QueriesProgs,
        pid: u32,
        on_event: &mut impl FnMut(Event),
    ) -> Vec<Link> {
        match self.attach(progs, pid) {
            Ok(links) => {
                on_event(Event::Status(Status::TlsProbe(Ok(()))));
                links
            }
            Err(e) => {
                on_event(Event::Status(Status::TlsProbe(Err(format!("{e:#}")))));
                Vec::new()
            }
        }
    }

    /// Attaches the return probe of each call, then its entry probe: an entry without its return would leave its
    /// thread in the call.
    fn attach(&self, progs: &skel::QueriesProgs, pid: u32) -> Result<Vec<Link>> {
        let mut links = Vec::new();
        for (prog, retprobe, function) in [
            (&progs.on_tls_return, true, &self.read),
            (&progs.on_tls_return, true, &self.write),
            (&progs.on_tls_read, false, &self.read),
            (&progs.on_tls_write, false, &self.write),
        ] {
            links.push(attach_uprobe(prog, retprobe, pid, self.binary, function)?);
        }
        Ok(links)
    }
}

/// The texts of statements prepared before tracing: a uprobe on the server's function that runs each execution
/// (`Server::statement_execute`), attached while `Control::execute` says it is wanted (and statements are
/// followed), detached a second after it no longer is.
pub struct ExecuteProbe<'a> {
    pub binary: &'a Path,
    pub function: &'a Function,
}

/// The execution probe's link, attached while wanted, detached a linger after it no longer is; and whether
/// attaching it failed (it is not tried again).
#[derive(Default)]
struct ExecuteLink {
    link: Option<Link>,
    unwanted_since: Option<Instant>,
    failed: bool,
}

impl ExecuteLink {
    /// Follows the probe's wish at a tick. `attached`: statements are followed now (a sampled trace's period).
    fn follow(
        &mut self,
        probe: &ExecuteProbe<'_>,
        wish: ExecuteWish,
        skel: &mut skel::QueriesSkel<'_>,
        attached: bool,
        pid: u32,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<()> {
        let bss = skel.maps.bss_data.as_deref_mut().context("no .bss")?;
        let reads_texts = bss.statement_text_offset == 0 && wish.text_offset != 0;
        bss.statement_text_offset = wish.text_offset;
        if reads_texts {
            on_event(Event::Status(Status::ExecuteTexts));
        }
        self.unwanted_since = match wish.wanted {
            true => None,
            false => self.unwanted_since.or(Some(Instant::now())),
        };
        let linger_over =
            (self.unwanted_since).is_some_and(|t| t.elapsed() >= EXECUTE_PROBE_LINGER);
        if self.link.is_some() && (!attached || linger_over) {
            self.link = None;
            on_event(Event::Status(Status::ExecuteProbe(false)));
        } else if self.link.is_none() && attached && wish.wanted && !self.failed {
            // Not fatal: a server that just exited, or a binary replaced under its path.
            let prog = &skel.progs.on_execute;
            match attach_uprobe(prog, false, pid, probe.binary, probe.function) {
                Ok(link) => {
                    self.link = Some(link);
                    on_event(Event::Status(Status::ExecuteProbe(true)));
                }
                Err(err) => {
                    self.failed = true;
                    on_event(Event::Status(Status::ExecuteProbeFailed(format!(
                        "{err:#}"
                    ))));
                }
            }
        }
        Ok(())
    }
}

/// A sampled trace's state of the socket and scheduler tracepoints, whose links are the run's (`Step::links`):
/// the agent, or a busy server's statements, detach them between periods. Statements start only within a period;
/// at its end those in flight are followed to their end (`closing`), then the tracepoints are detached until the
/// next.
struct Tracepoints {
    /// The period ended: the tracepoints are detached once no statement is in flight.
    draining: bool,
    /// The cycle said last (`Status::Cycle`).
    cycle: u32,
}

impl Tracepoints {
    /// Follows a sampled trace's periods at a tick, given the statements traced since the last (`adaptive`: the
    /// cycle is chosen from their rate). `links`: the tracepoints', empty between periods, never while attached
    /// (the switch tracepoint is always one of them).
    fn follow_period(
        &mut self,
        p: &mut SamplePeriods,
        statements: u64,
        adaptive: bool,
        skel: &mut skel::QueriesSkel<'_>,
        links: &mut Vec<Link>,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<()> {
        p.count(statements);
        let sampled = p.every() > 1;
        if let Some(open) = p.due() {
            let bss = skel.maps.bss_data.as_deref_mut().context("no .bss")?;
            bss.closing = !open;
            if open && links.is_empty() {
                bss.attach_period = bss.attach_period.wrapping_add(1);
                *links = attach_by_section(skel.object())
                    .context("attaching to the socket and scheduler tracepoints")?;
            }
            self.draining = !open;
            p.set(open);
            on_event(Event::Status(Status::Period(open)));
        }
        // Records are stamped with the cycle as they end, so saying it once after the edge is enough.
        if self.cycle != p.every() {
            self.cycle = p.every();
            on_event(Event::Status(Status::Cycle(self.cycle)));
        }
        if self.draining && in_flight(&skel.progs.in_flight)?.is_empty() {
            links.clear();
            self.draining = false;
        }
        if adaptive && sampled != (p.every() > 1) {
            say_sampling(p);
        }
        Ok(())
    }
}

/// What the side that reads the statements asks of the collector: one handle, read at every poll.
#[derive(Debug, Default)]
pub struct Control {
    /// The TLS fallback's uprobes are wanted: a TLS handshake was seen, or `--uprobes`.
    dispatch_wanted: Cell<bool>,
    /// Executions' replies are kept long enough for their column definitions (`RawStatement::reply`).
    want_results: Cell<bool>,
    /// What the execution probe is to do.
    execute: Cell<ExecuteWish>,
    /// Futex waits of statements longer than this are looked for every `LONG_WAITS_LOOK` (`Event::LongWaits`); 0:
    /// none.
    long_wait_ns: Cell<u64>,
    /// Until when who wakes the statements' lock waits is followed (`on_waking`).
    wakers_until: Cell<Option<Instant>>,
}

/// How long who wakes lock waits is followed after the last lock wait of 10 ms or more with a holder: a
/// program at every wakeup of the host, attached only while locks are waited for.
const WAKERS_LINGER: Duration = Duration::from_secs(30);

impl Control {
    /// Statements' futex waits longer than `ns` are reported every `LONG_WAITS_LOOK`, while they last.
    pub fn want_long_waits(&self, ns: u64) {
        self.long_wait_ns.set(ns);
    }

    /// A statement waited long for a lock another connection holds: who wakes such waits is followed for a while.
    pub fn want_wakers(&self) {
        self.wakers_until.set(Some(Instant::now() + WAKERS_LINGER));
    }

    /// The TLS fallback's uprobes are wanted from now on.
    pub fn want_dispatch(&self) {
        self.dispatch_wanted.set(true);
    }

    pub fn dispatch_wanted(&self) -> bool {
        self.dispatch_wanted.get()
    }

    /// Whether executions' replies are kept long enough for their column definitions.
    pub fn keep_results(&self, wanted: bool) {
        self.want_results.set(wanted);
    }

    pub fn ask_execute(&self, wish: ExecuteWish) {
        self.execute.set(wish);
    }
}

/// What user space asks of the execution probe, read at every poll.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecuteWish {
    pub wanted: bool,
    /// Where the statement object keeps its text (`statement_text_offset`); 0: unknown, the object's address is
    /// sent instead.
    pub text_offset: u32,
}

/// The uprobes on the server, each where it has what it needs.
#[derive(Default)]
pub struct ServerProbes<'a> {
    pub dispatch: Option<DispatchProbe<'a>>,
    pub tls: Option<TlsProbe<'a>>,
    pub execute: Option<ExecuteProbe<'a>>,
    pub wait_types: Option<WaitTypeProbe<'a>>,
    pub spills: Option<SpillProbe<'a>>,
}

/// Where a statement's internal temporary table goes to disk, and each merge pass of a sort that outgrew its
/// buffer (the server's `THD::inc_status_created_tmp_disk_tables` and `THD::inc_status_sort_merge_passes`):
/// `Counters::tmp_disk_tables` and `sort_merge_passes`. Each runs only in a statement that spills; attached for the
/// whole trace.
pub struct SpillProbe<'a> {
    pub binary: &'a Path,
    pub tmp_disk_table: Option<Function>,
    pub sort_merge_pass: Option<Function>,
}

impl SpillProbe<'_> {
    /// Attaches those the server has; a failure is said, and leaves those statements named by their time alone.
    fn attach(&self, progs: &skel::QueriesProgs, pid: u32) -> Vec<Link> {
        let wanted = [
            (&progs.on_tmp_disk_table, &self.tmp_disk_table),
            (&progs.on_sort_merge_pass, &self.sort_merge_pass),
        ];
        let mut links = Vec::new();
        for (prog, function) in wanted {
            let Some(function) = function else { continue };
            match attach_uprobe(prog, false, pid, self.binary, function) {
                Ok(link) => links.push(link),
                Err(e) => say!(
                    "myprobe: warning: statements' temporary tables and sorts on disk are not counted: {e:#}"
                ),
            }
        }
        links
    }
}

/// The server's calls of `thd_wait_begin` whose type is one of several (InnoDB's lock wait: a row or a table lock),
/// by their offsets in its binary (`symbolize::wait_calls`): a uprobe on each call instruction gives the type of the
/// waits that follow (`wait_slot::hint`). Each runs only before such a wait; attached for the whole trace.
pub struct WaitTypeProbe<'a> {
    pub binary: &'a Path,
    pub call_offsets: Vec<u64>,
}

impl WaitTypeProbe<'_> {
    /// Attaches them (in one link where the kernel has uprobe_multi links); a failure is said, and leaves those
    /// waits named by their stacks alone.
    fn attach(&self, prog: &libbpf_rs::ProgramMut, pid: u32) -> Vec<Link> {
        let failed = |offset: Option<u64>, e: &dyn std::fmt::Display| {
            let at = offset.map(|o| format!(" at {o:#x}")).unwrap_or_default();
            say!(
                "myprobe: warning: InnoDB's row and table lock waits are not told apart: attaching uprobes{at} \
                 of {}: {e:#}",
                self.binary.display()
            );
        };
        if in_multi_links(prog) {
            let multi = UprobeMultiOpts {
                offsets: self.call_offsets.iter().map(|&o| o as usize).collect(),
                ..Default::default()
            };
            return match prog.attach_uprobe_multi_with_opts(pid as i32, self.binary, "", multi) {
                Ok(link) => vec![link],
                Err(e) => {
                    failed(None, &e);
                    Vec::new()
                }
            };
        }
        let mut links = Vec::new();
        for &offset in &self.call_offsets {
            let opts = UprobeOpts::default();
            match prog.attach_uprobe_with_opts(pid as i32, self.binary, offset as usize, opts) {
                Ok(link) => links.push(link),
                Err(e) => {
                    failed(Some(offset), &e);
                    break;
                }
            }
        }
        links
    }
}

/// Detaches `links`, each on a thread of its own: a uprobe's detach waits for a grace period (about 0.1 s here), which
/// detaches under way at once share.
fn detach_at_once(links: Vec<Link>) {
    std::thread::scope(|s| {
        for link in links {
            s.spawn(move || drop(link));
        }
    });
}

/// What the statement tracer takes and sends, besides what every collector is given.
#[derive(Clone, Copy, Debug, Default)]
pub struct StatementOptions {
    /// The stack of each statement's longest lock wait is taken (`Event::Stack`, `Counters::lock_stack`).
    pub wait_sites: bool,
    /// Time on a CPU inside syscalls goes to their class (or `sys`) rather than `user`, for one more program
    /// at every syscall entry of the host.
    pub syscall_cpu: bool,
    /// Statements shorter are counted and dropped in the kernel, but for those whose record a later one needs
    /// (`--min-ms`; 0: none).
    pub min_statement_ns: u64,
    /// Each run of the busiest programs timed and counted by what it was (src/bpf/run_costs.h): `Traced::run_costs`.
    pub run_costs: bool,
}

/// Traces until the duration ends or Ctrl-C, handing each event to `on_event` as it arrives (`attached` is
/// called once the probes are in place, and gives the statements the server ran then); returns what was lost.
/// `control` is read at every poll. Sampled (`CollectOptions::duty`), the time traced over the time statements
/// were followed comes with what was lost.
pub fn collect(
    opts: &CollectOptions,
    statements: StatementOptions,
    control: &Control,
    probes: ServerProbes,
    attached: impl FnOnce() -> Vec<StartedBefore>,
    on_event: impl FnMut(Event),
) -> Result<Traced> {
    let mut run = Statements {
        statements,
        control,
        probes,
        attached: Some(attached),
        on_event,
        traced: 0,
        tracepoints: Tracepoints {
            draining: false,
            cycle: opts.duty.as_ref().map_or(1, |d| d.every),
        },
        dispatch_links: Vec::new(),
        whole_trace_links: Vec::new(),
        entry_links: Vec::new(),
        execute_link: ExecuteLink::default(),
        waking_link: statements.wait_sites.then_some(None),
        lost_said: Lost::default(),
        long_waits: LongWaitLooks {
            last: Instant::now(),
            found: None,
            link: None,
            pid: opts.pid,
        },
    };
    lifecycle::run(&mut run, opts)
}

/// The statements' hooks in the one life cycle (`lifecycle::run`), and what a trace of them keeps.
struct Statements<'a, A, F> {
    statements: StatementOptions,
    control: &'a Control,
    probes: ServerProbes<'a>,
    /// Called once attached: the statements running then.
    attached: Option<A>,
    on_event: F,
    /// Statements traced since the last tick: an adaptive duty's rate.
    traced: u64,
    tracepoints: Tracepoints,
    dispatch_links: Vec<Link>,
    /// The TLS probes, for the whole trace (a sampled one's closed periods too): each attach costs the server a few
    /// milliseconds.
    whole_trace_links: Vec<Link>,
    /// The wait types' and the spills' uprobes, for the whole trace: entry probes alone, detached at once.
    entry_links: Vec<Link>,
    execute_link: ExecuteLink,
    /// `on_waking`, attached while `Control::want_wakers` asks (with wait sites); None once attaching it failed.
    waking_link: Option<Option<Link>>,
    lost_said: Lost,
    long_waits: LongWaitLooks,
}

/// Where the long waits were last looked for: when, when some were last found, and the `in_flight` iterator's link
/// over the process `pid`'s threads, made at the first look and run at each.
struct LongWaitLooks {
    last: Instant,
    found: Option<Instant>,
    link: Option<Link>,
    pid: u32,
}

impl<A, F> Statements<'_, A, F>
where
    F: FnMut(Event),
{
    /// Attaches `on_waking` while who wakes lock waits is wanted, detaches it once not; a failure is said once.
    fn follow_wakers(&mut self, progs: &skel::QueriesProgs) {
        let Some(link) = &mut self.waking_link else {
            return;
        };
        let wanted = (self.control.wakers_until.get()).is_some_and(|t| Instant::now() < t);
        match (link.is_some(), wanted) {
            (false, true) => match progs.on_waking.attach() {
                Ok(l) => *link = Some(l),
                Err(e) => {
                    say!("myprobe: warning: the holders of short lock waits are not named: {e:#}");
                    self.waking_link = None;
                }
            },
            (true, false) => *link = None,
            _ => {}
        }
    }

    fn attach_dispatch(&mut self, progs: &skel::QueriesProgs, pid: u32) -> Result<()> {
        let wanted = self.control.dispatch_wanted.get();
        self.probes.dispatch.as_ref().map_or(Ok(()), |d| {
            d.attach_if_wanted(wanted, progs, pid, &mut self.dispatch_links)
        })
    }
}

impl<A, F> Lifecycle for Statements<'_, A, F>
where
    A: FnOnce() -> Vec<StartedBefore>,
    F: FnMut(Event),
{
    type Skel = Skeleton;
    type Output = Traced;
    const NAME: &'static str = "queries";
    const KIND: super::Kind = super::Kind::Statements;

    fn configure(&mut self, open: &mut OpenQueriesSkel<'_>, opts: &CollectOptions) -> Result<()> {
        configure(open, opts, self.statements, self.probes.dispatch.as_ref())
    }

    fn attach(&mut self, skel: &mut QueriesSkel<'_>, opts: &CollectOptions) -> Result<Vec<Link>> {
        let tracepoints = attach_by_section(skel.object())
            .context("attaching to the socket and scheduler tracepoints")?;
        let (pid, progs) = (opts.pid, &skel.progs);
        if let Some(w) = &self.probes.wait_types {
            self.entry_links = w.attach(&progs.on_wait_type, pid);
        }
        if let Some(s) = &self.probes.spills {
            self.entry_links.extend(s.attach(progs, pid));
        }
        if let Some(t) = &self.probes.tls {
            let links = t.attach_said(progs, pid, &mut self.on_event);
            self.whole_trace_links.extend(links);
        }
        self.attach_dispatch(progs, pid)?;
        let started = self.attached.take().map(|f| f()).unwrap_or_default();
        start_statements(skel, started, &mut self.on_event);
        Ok(tracepoints)
    }

    fn record(&mut self, data: &[u8]) {
        if let Some(e) = decode(data) {
            self.traced += matches!(e, Event::Wire(Wire::Statement(_))) as u64;
            (self.on_event)(e);
        }
    }

    fn tick(&mut self, step: &mut Step<'_, '_, Skeleton>) -> Result<ring::Tick> {
        let pid = step.opts.pid;
        if self.dispatch_links.is_empty() {
            self.attach_dispatch(&step.skel.progs, pid)?;
            if !self.dispatch_links.is_empty() {
                (self.on_event)(Event::Status(Status::DispatchProbe));
            }
        }
        if let Some(e) = &self.probes.execute {
            let (wish, attached) = (self.control.execute.get(), !step.links.is_empty());
            let on_event = &mut self.on_event;
            (self.execute_link).follow(e, wish, step.skel, attached, pid, on_event)?;
        }
        if let Some(p) = step.periods.as_deref_mut() {
            let adaptive = (step.opts.duty.as_ref()).is_some_and(|d| d.max_rate.is_some());
            let traced = std::mem::take(&mut self.traced);
            let (skel, links) = (&mut *step.skel, &mut *step.links);
            (self.tracepoints).follow_period(
                p,
                traced,
                adaptive,
                skel,
                links,
                &mut self.on_event,
            )?;
        }
        if let Some(bss) = step.skel.maps.bss_data.as_deref_mut() {
            bss.want_results = self.control.want_results.get();
        }
        self.follow_wakers(&step.skel.progs);
        if !step.links.is_empty() {
            step.refresh_unwind()?;
        }
        let (lost_said, looks) = (&mut self.lost_said, &mut self.long_waits);
        let (l, said) = said_at_tick(step.skel, self.control, lost_said, looks);
        said.into_iter().for_each(|e| (self.on_event)(e));
        // While draining, the statements in flight are looked for as often as before.
        let due = (self.tracepoints.draining).then(|| Instant::now() + DRAIN_CHECK);
        let periods = step.periods.as_deref();
        Ok(ring::Tick {
            status: status_line(step.elapsed, step.opts.duration, periods, &l),
            due,
        })
    }

    /// Detaches the probes in an order that leaves no thread inside a call, in two rounds of links detached at
    /// once: the dispatch's return probe, the TLS entries, the wait types' and the spills'; then the dispatch's
    /// entry and the TLS returns. The tracepoints last (the run's links), so that nothing is sent after the last
    /// read of the ring buffer and the threads' state is still when read.
    fn stop(&mut self) {
        self.waking_link = None;
        // As attached: the dispatch's return, then its entry (`attach_if_wanted`); the TLS returns, then their
        // entries, half each (`TlsProbe::attach`).
        let mut dispatch = std::mem::take(&mut self.dispatch_links);
        let mut tls = std::mem::take(&mut self.whole_trace_links);
        let tls_returns: Vec<Link> = tls.drain(..tls.len() / 2).collect();
        let dispatch_entry: Vec<Link> = dispatch.drain(dispatch.len().min(1)..).collect();
        let mut first = std::mem::take(&mut self.entry_links);
        first.extend(dispatch);
        first.extend(tls);
        detach_at_once(first);
        detach_at_once(dispatch_entry.into_iter().chain(tls_returns).collect());
        self.execute_link = ExecuteLink::default();
    }

    fn finish(&mut self, skel: &mut QueriesSkel<'_>, end: End<'_>) -> Result<Traced> {
        report_in_flight(&skel.progs.in_flight, &mut self.on_event);
        Ok(Traced {
            run_costs: if self.statements.run_costs {
                read_run_costs(&skel.maps.run_cost_table)
            } else {
                Vec::new()
            },
            lost: Skeleton::lost(skel),
            scale: end.periods.map_or(1.0, SamplePeriods::scale),
            below_min: skel
                .maps
                .bss_data
                .as_deref()
                .map_or(0, |b| b.below_min_statements),
        })
    }

    fn unloaded(&mut self) -> Traced {
        Traced::nothing()
    }
}

/// The programs of src/bpf/run_costs.h, in its order.
const RUN_COST_PROGRAMS: [&str; 4] = ["on_sock_recv", "on_sock_send", "on_switch", "on_sys_exit"];
/// What a run was (src/bpf/run_costs.h's outcomes, in its order).
pub const RUN_OUTCOMES: [&str; 6] = [
    "another process's",
    "a recv that found nothing",
    "the server's, no protocol byte",
    "outside statements",
    "starts a statement",
    "in a statement",
];

/// The runs of one program that turned out one way, and the time they took in all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunCost {
    pub program: &'static str,
    pub outcome: &'static str,
    pub runs: u64,
    pub ns: u64,
}

/// The per-CPU table of src/bpf/run_costs.h, summed over the CPUs; the (program, outcome) never run left out.
fn read_run_costs(map: &dyn MapCore) -> Vec<RunCost> {
    let mut costs = Vec::new();
    for_each_per_cpu::<u32, run_cost>(map, |k, per_cpu| {
        let k = k as usize;
        let (Some(&program), Some(&outcome)) = (
            RUN_COST_PROGRAMS.get(k / RUN_OUTCOMES.len()),
            RUN_OUTCOMES.get(k % RUN_OUTCOMES.len()),
        ) else {
            return;
        };
        let runs = per_cpu.iter().map(|c| c.runs).sum();
        let ns = per_cpu.iter().map(|c| c.ns).sum();
        if runs > 0 {
            costs.push(RunCost {
                program,
                outcome,
                runs,
                ns,
            });
        }
    });
    costs
}

/// Puts the threads of `started` in their statements (`start_statements`), their waits' stacks sent first; a thread
/// seen to begin one since the probes were attached is left as it is. A failure is said, and leaves them out.
fn start_statements(
    skel: &mut skel::QueriesSkel<'_>,
    started: Vec<StartedBefore>,
    on_event: &mut impl FnMut(Event),
) {
    if started.is_empty() {
        return;
    }
    if let Err(e) = seed(skel, started, on_event) {
        say!("myprobe: warning: the statements running when tracing began are left out: {e:#}");
    }
}

fn seed(
    skel: &mut skel::QueriesSkel<'_>,
    started: Vec<StartedBefore>,
    on_event: &mut impl FnMut(Event),
) -> Result<()> {
    use libbpf_rs::MapCore;
    for s in started {
        let wait_stack = match s.wait_stack {
            Some(stack) => {
                let id = STARTED_STACK_IDS | u64::from(s.tid);
                on_event(Event::Stack { id, stack });
                id
            }
            None => 0,
        };
        let value = started_statement {
            start_ns: s.start_ns,
            wait_stack,
            command: s.command,
            ..Default::default()
        };
        skel.maps
            .started
            .update(
                &s.tid.to_ne_bytes(),
                super::maps::as_bytes(std::slice::from_ref(&value)),
                libbpf_rs::MapFlags::ANY,
            )
            .context("filling the map of statements running")?;
    }
    super::run_task_iterator(&skel.progs.start_statements)?;
    Ok(())
}

/// Sets what the programs read (`.rodata`) and chooses them, before loading.
fn configure(
    open: &mut OpenQueriesSkel<'_>,
    opts: &CollectOptions,
    statements: StatementOptions,
    dispatch: Option<&DispatchProbe<'_>>,
) -> Result<()> {
    open.maps
        .events
        .set_max_entries(RING_BUFFER_BYTES)
        .context("sizing the ring buffer")?;
    let rodata = super::rodata(open.maps.rodata_data.as_deref_mut())?;
    rodata.syscall_class = syscall_classes();
    let StatementOptions {
        wait_sites,
        syscall_cpu,
        min_statement_ns,
        run_costs,
    } = statements;
    rodata.run_costs = run_costs;
    rodata.wait_sites = wait_sites;
    rodata.syscall_cpu = syscall_cpu;
    rodata.min_statement_ns = min_statement_ns;
    open.progs.on_sys_enter.set_autoload(syscall_cpu);
    // The protocol is followed at the socket layer's tracepoints, which run for recvs and sends only; at every
    // syscall exit of the host where the kernel has none, or where each syscall is wanted anyway.
    let by_syscalls = syscall_cpu || !opts.features().socket_tracepoints;
    open.progs.on_sys_exit.set_autoload(by_syscalls);
    open.progs.on_sock_recv.set_autoload(!by_syscalls);
    open.progs.on_sock_send.set_autoload(!by_syscalls);
    // Where the kernel counts each thread's waits for a CPU, a woken one's is read at its switch in: no
    // program at every wakeup of the host.
    let runq_from_sched_info = opts.features().sched_info;
    rodata.runq_from_sched_info = runq_from_sched_info;
    open.progs.on_wakeup.set_autoload(!runq_from_sched_info);
    // Who let a lock wait go: one program at every wakeup of the host, attached while locks are waited for
    // (`Control::want_wakers`).
    open.progs.on_waking.set_autoload(wait_sites);
    open.progs.on_waking.set_autoattach(false);
    if let Some(d) = dispatch {
        rodata.dispatch_abi = match d.args {
            crate::server::DispatchArgs::Packet => dispatch_abi::DISPATCH_MARIADB,
            crate::server::DispatchArgs::ComData => dispatch_abi::DISPATCH_MYSQL,
        };
    }
    // Run once, when tracing ends; and once when it begins.
    open.progs.in_flight.set_autoattach(false);
    open.progs.start_statements.set_autoattach(false);
    // Attached by attach_dispatch, to the server's binary.
    open.progs.on_dispatch.set_autoattach(false);
    open.progs.on_dispatch_return.set_autoattach(false);
    open.progs.on_execute.set_autoattach(false);
    open.progs.on_wait_type.set_autoattach(false);
    open.progs.on_tmp_disk_table.set_autoattach(false);
    open.progs.on_sort_merge_pass.set_autoattach(false);
    // Attached by TlsProbe::attach, to the server's binary.
    for prog in [
        &mut open.progs.on_tls_read,
        &mut open.progs.on_tls_write,
        &mut open.progs.on_tls_return,
    ] {
        prog.set_autoattach(false);
    }
    // The uprobes in uprobe_multi links where the kernel has them (6.6): a perf event's uprobe is detached under a
    // lock of the kernel's, one after another, each waiting for a grace period (0.1 s); links wait at once.
    if opts.features().uprobe_multi {
        for prog in [
            &mut open.progs.on_dispatch,
            &mut open.progs.on_dispatch_return,
            &mut open.progs.on_execute,
            &mut open.progs.on_wait_type,
            &mut open.progs.on_tmp_disk_table,
            &mut open.progs.on_sort_merge_pass,
            &mut open.progs.on_tls_read,
            &mut open.progs.on_tls_write,
            &mut open.progs.on_tls_return,
        ] {
            prog.set_attach_type(ProgramAttachType::TraceUprobeMulti);
        }
    }
    Ok(())
}

/// The statements running when tracing ended (often the reason for tracing at all), as in flight, and those just
/// replied.
fn report_in_flight(iterator: &libbpf_rs::ProgramMut, on_event: &mut impl FnMut(Event)) {
    let now = super::monotonic_ns();
    match in_flight(iterator) {
        Ok(threads) => {
            for st in threads {
                let mut counters = st.c;
                match st.phase {
                    phase::PHASE_RUNNING | phase::PHASE_INFILE => {
                        // The time since its last change of part is that part's.
                        if let Some(part) = counters.part_ns.get_mut(st.part.0 as usize) {
                            *part = part.saturating_add(now.saturating_sub(st.since));
                        }
                        // A futex wait under way is one of its lock waits, maybe its longest: a statement stuck
                        // behind a lock is so until the end.
                        if st.lock_block_ts != 0 {
                            let took = now.saturating_sub(st.lock_block_ts);
                            counters.lock_waits += 1;
                            if took > counters.lock_max_ns {
                                counters.lock_max_ns = took;
                                counters.lock_addr = st.lock_block_addr;
                                counters.lock_stack = st.lock_block_stack;
                            }
                            let waited = counters.part_ns[TimePart::PART_LOCK.0 as usize]
                                .saturating_sub(st.lock_before);
                            add_wait(&mut counters, st.lock_block_stack, st.wait_hint, waited);
                        }
                        if st.place == thread_place::PLACE_BLOCKED {
                            io_unblocked(&mut counters, &st, now);
                        }
                        if let Some(s) = statement(&st.ev, counters, now, true) {
                            on_event(Event::Wire(Wire::Statement(Box::new(s))));
                        }
                    }
                    phase::PHASE_REPLIED => {
                        if let Some(s) = statement(&st.ev, st.ev.c, st.ev.end_ns, false) {
                            on_event(Event::Wire(Wire::Statement(Box::new(s))));
                        }
                    }
                    _ => {}
                }
            }
        }
        Err(e) => say!("myprobe: warning: the statements in flight at the end are left out: {e:#}"),
    }
}

/// As queries.bpf.c's io_unblocked: a blocked I/O syscall under way at `now` may be its part's longest.
fn io_unblocked(c: &mut Counters, st: &query_thread, now: u64) {
    let i = st.blocked_part.0.wrapping_sub(TimePart::PART_READ.0) as usize;
    let took = now.saturating_sub(st.blocked_at);
    if i < c.io_max_ns.len() && took > c.io_max_ns[i] {
        c.io_max_ns[i] = took;
        c.io_fd[i] = st.blocked_fd;
    }
}

/// As queries.bpf.c's add_wait: a futex wait of `ns` at `stack` to its slot, or the first free one.
fn add_wait(c: &mut Counters, stack: u64, hint: u32, ns: u64) {
    if stack == 0 {
        return;
    }
    if let Some(w) = c
        .waits
        .iter_mut()
        .find(|w| w.stack == 0 || (w.stack == stack && w.hint == hint))
    {
        w.stack = stack;
        w.hint = hint;
        w.ns = w.ns.saturating_add(ns);
        w.waits += 1;
    }
}

/// The progress line: time traced, of how long, the sampling, what was lost.
fn status_line(
    elapsed: Duration,
    duration: Duration,
    periods: Option<&SamplePeriods>,
    lost: &Lost,
) -> String {
    let secs = if duration.as_secs() > 1 << 40 {
        String::new()
    } else {
        format!("/{}", duration.as_secs())
    };
    let sampled = periods
        .filter(|p| p.every() > 1)
        .map(|p| format!(", 1 s in {}", p.every()))
        .unwrap_or_default();
    format!(
        "queries: {:>4}{secs} s{sampled}, {} lost",
        elapsed.as_secs(),
        lost.total()
    )
}

/// Whether `prog` was loaded for uprobe_multi links (`configure`).
fn in_multi_links(prog: &libbpf_rs::ProgramMut) -> bool {
    matches!(prog.attach_type(), ProgramAttachType::TraceUprobeMulti)
}

/// Attaches `prog` to `function` of `binary` in process `pid`, as an entry or a return probe.
fn attach_uprobe(
    prog: &libbpf_rs::ProgramMut,
    retprobe: bool,
    pid: u32,
    binary: &Path,
    function: &Function,
) -> Result<Link> {
    // By offset where it is known, so that libbpf does not read a symbol table of tens of MiB at each attach. An
    // entry and a return probe on the same instruction, one the kernel emulates (the stack pointer a return
    // probe hijacks is still the entry's there): one trap a call.
    let (func_name, offset) = match function.entry {
        Some(e) => (None, e.offset()),
        None => (Some(function.mangled.clone()), 0),
    };
    let attached = if in_multi_links(prog) {
        let multi = UprobeMultiOpts {
            syms: func_name.into_iter().collect(),
            offsets: function.entry.map(|e| e.offset()).into_iter().collect(),
            retprobe,
            ..Default::default()
        };
        prog.attach_uprobe_multi_with_opts(pid as i32, binary, "", multi)
    } else {
        let uprobe = UprobeOpts {
            func_name,
            retprobe,
            ..Default::default()
        };
        prog.attach_uprobe_with_opts(pid as i32, binary, offset, uprobe)
    };
    attached.with_context(|| {
        format!(
            "attaching a uprobe to {} in {}",
            function.demangled,
            binary.display()
        )
    })
}

/// What a trace of statements counted besides its events.
pub struct Traced {
    /// With `StatementOptions::run_costs`: what the busiest programs' runs were, and cost.
    pub run_costs: Vec<RunCost>,
    pub lost: Lost,
    /// The time traced over the time statements were followed (1: all of it).
    pub scale: f64,
    /// Statements shorter than `min_statement_ns`, not sent.
    pub below_min: u64,
}

impl Traced {
    /// A trace of nothing (the programs loaded, never attached: `CollectOptions::verify_only`).
    fn nothing() -> Traced {
        Traced {
            run_costs: Vec::new(),
            lost: Lost::default(),
            scale: 1.0,
            below_min: 0,
        }
    }
}

/// An adaptive duty began or ended sampling.
fn say_sampling(p: &SamplePeriods) {
    if p.every() > 1 {
        say!(
            "myprobe: {:.0} statements a second: following them one second in {} from now on, to keep tracing's \
             cost within its budget (--max-cpu; --sample-every 1 follows every one)",
            p.rate(),
            p.every()
        );
    } else {
        say!(
            "myprobe: {:.0} statements a second: following every one again",
            p.rate()
        );
    }
}

/// The state of the threads in a statement when tracing ended (the task iterator of queries.bpf.c).
/// What is said at each poll: the losses when they changed since `said` (returned as they are), the long waits
/// when looked for (`last`), then the tick.
fn said_at_tick(
    skel: &skel::QueriesSkel<'_>,
    control: &Control,
    said: &mut Lost,
    looks: &mut LongWaitLooks,
) -> (Lost, Vec<Event>) {
    let mut events = Vec::new();
    let lost = Skeleton::lost(skel);
    if lost != *said {
        *said = lost;
        events.push(Event::Status(Status::Lost(lost)));
    }
    if let Some(waits) = long_waits(&skel.progs.in_flight, control, looks) {
        events.push(Event::LongWaits(waits));
    }
    events.push(Event::Tick);
    (lost, events)
}

/// How often the statements' futex waits under way are looked at, while long ones are wanted: often enough to see a
/// hot row's waits of 20 to 50 ms while they last, once some were found in the last `LONG_WAITS_LINGER`; less
/// often before. A look runs the `in_flight` iterator over the server's threads, in myprobe's own time (100 us for
/// a server of 50 threads under load: 0.2% of a CPU at 20 looks a second).
const LONG_WAITS_LOOK: Duration = Duration::from_millis(50);
const LONG_WAITS_LOOK_CALM: Duration = Duration::from_millis(250);
const LONG_WAITS_LINGER: Duration = Duration::from_secs(10);

/// The futex waits under way longer than `control` asks, every `LONG_WAITS_LOOK` at most, and only when there
/// are: the threads in statements read by the `in_flight` iterator.
fn long_waits(
    iterator: &libbpf_rs::ProgramMut,
    control: &Control,
    looks: &mut LongWaitLooks,
) -> Option<Vec<LongWait>> {
    let longer = control.long_wait_ns.get();
    let every = match looks.found.is_some_and(|t| t.elapsed() < LONG_WAITS_LINGER) {
        true => LONG_WAITS_LOOK,
        false => LONG_WAITS_LOOK_CALM,
    };
    if longer == 0 || looks.last.elapsed() < every {
        return None;
    }
    looks.last = Instant::now();
    let now = super::monotonic_ns();
    if looks.link.is_none() {
        looks.link = super::process_task_iterator(iterator, looks.pid).ok();
    }
    let mut records = Vec::new();
    super::read_task_iterator(looks.link.as_ref()?, &mut records).ok()?;
    let waits: Vec<LongWait> = query_threads(&records)
        .filter(|st| st.lock_block_ts != 0 && now.saturating_sub(st.lock_block_ts) >= longer)
        .map(|st| LongWait {
            tid: st.ev.tid,
            stack: st.lock_block_stack,
            hint: st.wait_hint,
        })
        .collect();
    if waits.is_empty() {
        return None;
    }
    looks.found = Some(looks.last);
    Some(waits)
}

fn in_flight(iterator: &libbpf_rs::ProgramMut) -> Result<Vec<query_thread>> {
    Ok(query_threads(&super::run_task_iterator(iterator)?).collect())
}

/// The threads' states the `in_flight` iterator wrote.
fn query_threads(records: &[u8]) -> impl Iterator<Item = query_thread> + '_ {
    records
        .chunks_exact(std::mem::size_of::<query_thread>())
        .filter_map(read_exact)
}

fn statement(
    e: &query_event,
    counters: Counters,
    end_ns: u64,
    in_flight: bool,
) -> Option<RawStatement> {
    let mut request = e.text.get(..e.text_len as usize)?.to_vec();
    let mut packet_len = e.packet_len;
    // A deflated request: its packet, inflated as far as the bytes kept go (nothing where they do not inflate),
    // and kept as long as the text of a request sent as is.
    if e.inflated_len > 0 && e.compressed == COMPRESSED_BODY {
        // The packet's body alone (its header came in the compressed packet before).
        let keep = (e.inflated_len as usize).min(e.text.len());
        request = compression::inflate_prefix(&request, keep).unwrap_or_default();
    } else if e.inflated_len > 0 {
        let keep = (e.inflated_len as usize).min(4 + e.text.len());
        let inflated = compression::inflate_prefix(&request, keep);
        match inflated.as_deref().and_then(protocol::split_packet) {
            Some((len, _, payload)) => (packet_len, request) = (len, payload.to_vec()),
            None => request.clear(),
        }
    }
    // An execution's reply is kept after its request, longer: its result set's column definitions.
    let mut reply = if e.result_len > 0 {
        let start = e.text_len as usize;
        e.text.get(start..start + e.result_len as usize)?.to_vec()
    } else {
        e.reply.get(..e.reply_len as usize)?.to_vec()
    };
    if e.compressed != 0 {
        reply = compression::uncompressed_stream(&reply);
    }
    Some(RawStatement {
        tid: e.tid,
        fd: e.fd,
        socket_ino: e.socket_ino,
        packet_len,
        request,
        reply,
        start_ns: e.start_ns,
        end_ns,
        counters,
        in_flight,
        pipelined: false,
        before_tracing: e.before_tracing != 0,
    })
}

/// Decodes one `struct query_event` (sent without the unused part of its text), or a stack's definition (its
/// first word is not 0).
fn decode(data: &[u8]) -> Option<Event> {
    if data.get(..4)? != [0; 4] {
        let decoded = decode_stack::<Skeleton>(data)?;
        let (id, stack) = (decoded.stack_id, decoded.stack);
        return Some(Event::Stack { id, stack });
    }
    if data.get(4..8)? == query_event_kind::EVENT_EXECUTED.0.to_ne_bytes() {
        let e: executed_event = read_prefix(data, std::mem::offset_of!(executed_event, text))?;
        return Some(Event::Executed(Executed {
            tid: e.tid,
            statement_id: e.statement_id,
            object: e.object,
            full_len: e.full_len,
            text: e.text.get(..e.text_len as usize)?.to_vec(),
        }));
    }
    thread_local! {
        // One event, reused: most of it is the text kept, which an event fills only as far as its own.
        static EVENT: std::cell::RefCell<Box<query_event>> = std::cell::RefCell::new(Box::default());
    }
    EVENT.with_borrow_mut(|e| {
        let head = std::mem::offset_of!(query_event, text);
        read_prefix_into(data, head, &mut **e)?;
        // Nothing read past what was sent (the rest is an earlier event's).
        if head + e.text_len as usize + e.result_len as usize > data.len() {
            return None;
        }
        event_of(e).map(Event::Wire)
    })
}

fn event_of(e: &query_event) -> Option<Wire> {
    let text = || e.text.get(..e.text_len as usize).map(<[u8]>::to_vec);
    match e.kind {
        query_event_kind::EVENT_STATEMENT => {
            statement(e, e.c, e.end_ns, false).map(|s| Wire::Statement(Box::new(s)))
        }
        query_event_kind::EVENT_PACKET_IN => Some(Wire::PacketIn {
            tid: e.tid,
            fd: e.fd,
            socket_ino: e.socket_ino,
            seq: e.seq,
            packet_len: e.packet_len,
            payload: text()?,
            ts_ns: e.start_ns,
        }),
        query_event_kind::EVENT_PACKET_OUT => Some(Wire::PacketOut {
            tid: e.tid,
            fd: e.fd,
            socket_ino: e.socket_ino,
            bytes: text()?,
        }),
        _ => None,
    }
}
