//! Per-statement accounting (src/bpf/queries.bpf.c): the client/server protocol followed through the server's
//! socket syscalls, with each statement's syscalls, futex waits and scheduler time.

use std::{cell::Cell, mem::MaybeUninit, path::Path};

use anyhow::{Context, Result};
use libbpf_rs::{
    skel::{OpenSkel, Skel},
    Link, MapCore, MapFlags, UprobeOpts,
};

use super::{open_skel, poll_ring, CollectOptions};
use crate::target::probes::Function;

mod skel {
    include!(concat!(env!("OUT_DIR"), "/queries.skel.rs"));
}
use skel::*;

/// A statement's resource use, as the kernel side counted it (nanoseconds, bytes, counts).
pub type Counters = types::query_counters;

/// Why records went missing; indexes match `enum query_lost` in src/bpf/queries.h.
pub const LOST_REASONS: [&str; 2] = ["records dropped: ring buffer full", "threads not traced: per-thread map full"];

#[derive(Clone, Debug)]
pub struct RawStatement {
    pub tid: u32,
    pub fd: i32,
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
}

#[derive(Clone, Debug)]
pub enum Event {
    Statement(RawStatement),
    /// A client packet outside a statement (handshake response): sequence id and payload.
    PacketIn { fd: i32, seq: u8, payload: Vec<u8> },
    /// Bytes the server sent outside a statement (greeting, authentication), headers included.
    PacketOut { fd: i32, bytes: Vec<u8> },
}

/// Syscall number → class (`enum syscall_class` in src/bpf/queries.h), from this architecture's numbers.
fn syscall_classes() -> [u8; 512] {
    const NET_RECV: u8 = 1;
    const NET_SEND: u8 = 2;
    const NET_POLL: u8 = 3;
    const READ: u8 = 4;
    const WRITE: u8 = 5;
    const SYNC: u8 = 6;
    const FUTEX: u8 = 7;
    let mut classes = [0u8; 512];
    let mut set = |nrs: &[libc::c_long], class: u8| {
        for &nr in nrs {
            if let Some(c) = classes.get_mut(nr as usize) {
                *c = class;
            }
        }
    };
    set(&[libc::SYS_recvfrom, libc::SYS_recvmsg, libc::SYS_recvmmsg], NET_RECV);
    set(&[libc::SYS_sendto, libc::SYS_sendmsg, libc::SYS_sendmmsg], NET_SEND);
    set(&[libc::SYS_ppoll, libc::SYS_pselect6, libc::SYS_epoll_pwait], NET_POLL);
    #[cfg(target_arch = "x86_64")]
    set(&[libc::SYS_poll, libc::SYS_select, libc::SYS_epoll_wait], NET_POLL);
    set(&[libc::SYS_read, libc::SYS_pread64, libc::SYS_readv, libc::SYS_preadv, libc::SYS_preadv2], READ);
    set(&[libc::SYS_write, libc::SYS_pwrite64, libc::SYS_writev, libc::SYS_pwritev, libc::SYS_pwritev2], WRITE);
    set(&[libc::SYS_fsync, libc::SYS_fdatasync, libc::SYS_sync_file_range, libc::SYS_syncfs], SYNC);
    set(&[libc::SYS_futex], FUTEX);
    classes
}

/// The TLS fallback: uprobes on the server's `dispatch_command`, attached when `wanted` becomes true (set by
/// whoever sees a TLS handshake) or from the start.
pub struct DispatchProbe<'a> {
    pub binary: &'a Path,
    pub function: &'a Function,
    pub wanted: &'a Cell<bool>,
}

/// Traces until the duration ends or Ctrl-C, handing each event to `on_event` as it arrives (`attached` is
/// called once the probes are in place); returns the loss counters (see [`LOST_REASONS`]).
pub fn collect(
    opts: &CollectOptions,
    dispatch: Option<DispatchProbe>,
    attached: impl FnOnce(),
    mut on_event: impl FnMut(Event),
) -> Result<[u64; 2]> {
    let mut object = MaybeUninit::uninit();
    let mut open = open_skel(QueriesSkelBuilder::default(), &mut object, opts)?;
    let rodata = open.maps.rodata_data.as_deref_mut().context("BPF object has no .rodata")?;
    rodata.target_tgid = opts.pid;
    rodata.syscall_class = syscall_classes();
    if let Some(d) = &dispatch {
        rodata.dispatch_abi = dispatch_abi(&d.function.demangled);
    }
    let mut skel = open.load().context("loading the query tracing programs into the kernel")?;
    skel.attach().context("attaching to the syscall and scheduler tracepoints")?;

    // Return probe attached first: an entry probe without it would start statements that nothing ends.
    let mut dispatch_links: Vec<Link> = Vec::new();
    let progs = &skel.progs;
    let attach_dispatch = |links: &mut Vec<Link>| -> Result<()> {
        let Some(d) = dispatch.as_ref().filter(|d| d.wanted.get() && links.is_empty()) else { return Ok(()) };
        for (prog, retprobe) in [(&progs.on_dispatch_return, true), (&progs.on_dispatch, false)] {
            let uprobe = UprobeOpts { func_name: Some(d.function.mangled.clone()), retprobe, ..Default::default() };
            links.push(
                prog.attach_uprobe_with_opts(opts.pid as i32, d.binary, 0, uprobe)
                    .with_context(|| format!("attaching a uprobe to {} in {}", d.function.demangled, d.binary.display()))?,
            );
        }
        Ok(())
    };
    attach_dispatch(&mut dispatch_links)?;
    attached();

    let bss = &skel.maps.bss_data;
    let lost = || bss.as_ref().map(|b| b.lost).unwrap_or_default();
    let result = poll_ring(
        &skel.maps.events,
        opts.duration,
        |data| {
            if let Some(e) = decode(data) {
                on_event(e);
            }
        },
        |elapsed| {
            attach_dispatch(&mut dispatch_links)?;
            let l = lost();
            let secs = if opts.duration.as_secs() > 1 << 40 { String::new() } else { format!("/{}", opts.duration.as_secs()) };
            Ok(format!("queries: {:>4}{secs} s, {} lost", elapsed.as_secs(), l[0] + l[1]))
        },
    );
    // Return probe first, as it was attached first.
    for link in dispatch_links.drain(..) {
        drop(link);
    }
    result?;
    // A statement still running now is often the reason for tracing at all: report it, as in flight.
    let now = super::monotonic_ns();
    for key in skel.maps.threads.keys() {
        let Ok(Some(bytes)) = skel.maps.threads.lookup(&key, MapFlags::ANY) else { continue };
        if bytes.len() < std::mem::size_of::<types::query_thread>() {
            continue;
        }
        // SAFETY: the value is a `struct query_thread` (plain integers and arrays) of the size checked above.
        let st: types::query_thread = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let mut counters = st.c;
        match st.phase {
            PHASE_RUNNING => {
                if st.on_cpu != 0 {
                    counters.cpu_ns += now.saturating_sub(st.on_cpu_since);
                } else if st.runnable_since != 0 {
                    counters.runq_ns += now.saturating_sub(st.runnable_since);
                }
                if let Some(s) = statement(&st.ev, counters, now, true) {
                    on_event(Event::Statement(s));
                }
            }
            PHASE_REPLIED => {
                if let Some(s) = statement(&st.ev, st.ev.c, st.ev.end_ns, false) {
                    on_event(Event::Statement(s));
                }
            }
            _ => {}
        }
    }
    Ok(lost())
}

/// `enum phase` of src/bpf/queries.bpf.c.
const PHASE_RUNNING: u8 = 2;
const PHASE_REPLIED: u8 = 3;

fn statement(e: &types::query_event, counters: Counters, end_ns: u64, in_flight: bool) -> Option<RawStatement> {
    Some(RawStatement {
        tid: e.tid,
        fd: e.fd,
        packet_len: e.packet_len,
        request: e.text.get(..e.text_len as usize)?.to_vec(),
        reply: e.reply.get(..e.reply_len as usize)?.to_vec(),
        start_ns: e.start_ns,
        end_ns,
        counters,
        in_flight,
    })
}

/// Which argument layout a `dispatch_command` signature has (`enum dispatch_abi` in src/bpf/queries.h).
fn dispatch_abi(demangled: &str) -> u32 {
    if demangled.starts_with("dispatch_command(THD") { 1 } else { 0 }
}

/// Decodes one `struct query_event`; the record is sent without the unused part of its text.
fn decode(data: &[u8]) -> Option<Event> {
    let mut e = types::query_event::default();
    let size = std::mem::size_of::<types::query_event>();
    let n = data.len().min(size);
    // SAFETY: query_event is plain old data (integers and byte arrays); we copy at most its size into it.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (&mut e as *mut types::query_event).cast::<u8>(), n) };
    let text = e.text.get(..e.text_len as usize)?.to_vec();
    match e.kind {
        1 => statement(&e, e.c, e.end_ns, false).map(Event::Statement),
        2 => Some(Event::PacketIn { fd: e.fd, seq: e.seq, payload: text }),
        3 => Some(Event::PacketOut { fd: e.fd, bytes: text }),
        _ => None,
    }
}
