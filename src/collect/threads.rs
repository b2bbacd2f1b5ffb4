//! What every thread of a process is doing right now (src/bpf/threads.bpf.c): one run of a sleepable task
//! iterator reads each thread's state, syscall, futex words and stacks. Nothing is attached to the process and
//! no thread is stopped (no ptrace, no signal): the threads run on while they are read, so a running thread's
//! user frames are those it last entered the kernel with.

use std::{mem::MaybeUninit, sync::Arc};

// Keyed by thread pointers: hashed the fast way.
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use anyhow::{Context, Result};

use super::{
    super::unwind::{
        replay::{unwind, Registers, MAX_USER_FRAMES},
        ProcessTables, Tables,
    },
    lifecycle::open_and_load,
    maps::{read_exact, Plain},
    skeleton::{install_unwind, stack_skeleton, Installed, StackSkeleton},
    CollectOptions, Lost, RawStack,
};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/threads.skel.rs"));
}
use skel::types::thread_record;
stack_skeleton!(Skeleton, ThreadsSkelBuilder, OpenThreadsSkel, ThreadsSkel);
// SAFETY: generated from BTF structs of integers, integer arrays and such structs.
unsafe impl Plain for thread_record {}

/// A thread as the snapshot found it.
#[derive(Clone, Debug)]
pub struct ThreadRecord {
    pub tid: u32,
    /// Its name (comm), shared by the records of a run that have the same.
    pub name: Arc<str>,
    /// As `ps` shows it: R (running or runnable), S, D, T, t, X, Z, P (parked), I (idle); `None` where unknown
    /// (a core file).
    pub state: Option<char>,
    /// On a CPU at the moment it was read.
    pub on_cpu: bool,
    /// The syscall it is in and its arguments; `None` when it is not in one (running in user space, or
    /// stopped by an interrupt).
    pub syscall: Option<(i64, [u64; 6])>,
    /// How long since it last ran, for a thread that is not running: since it last got on a CPU (the
    /// scheduler's clock), against the reader's own last arrival (give or take the time the reader has run
    /// since, and the time the thread ran before it slept).
    pub idle_ns: Option<u64>,
    /// In a futex call: the futex's address, its word, and the int 8 bytes after it (a glibc mutex's
    /// `__owner`), when they could be read.
    pub futex: Option<Futex>,
    /// Its thread pointer (x86-64's fs base, glibc's `pthread_self()`), which the server keeps in the connection it
    /// serves; 0 where unknown.
    pub tls_base: u64,
    /// Its context switches so far.
    pub switches: u64,
    /// Not unwound: it waits on a futex from a place `Reader::know_waits` was given (its `stack` empty).
    pub known_wait: bool,
    /// Its user stack pointer when it entered the kernel (0 where unknown): with its futex, where it waits from.
    pub user_sp: u64,
    pub stack: RawStack,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Futex {
    pub addr: u64,
    pub word: u32,
    pub next_int: i32,
}

/// The snapshot: every thread of `opts.pid`, in the kernel's order, and what could not be read.
pub struct Snapshot {
    pub threads: Vec<ThreadRecord>,
    pub lost: Lost,
    /// With `Reader::read`'s `only`: how many of its threads ended since the last run.
    pub ended: usize,
}

/// Reads every thread of `opts.pid` once.
pub fn snapshot(opts: &CollectOptions) -> Result<Snapshot> {
    with_reader(opts, |reader| reader.read(None))?
}

/// A thread that got on a CPU this long before the last run began is read again: the scheduler's clocks of two
/// CPUs may differ a little.
const CLOCK_MARGIN_NS: u64 = 1_000_000;

/// Thread names kept by a reader (searched one by one).
const NAMES_KEPT: usize = 32;

/// The `wanted` map's size (threads.bpf.c).
const WANTED_MAX: usize = 8192;

/// The `known_waits` map's size (threads.bpf.c).
pub const KNOWN_WAITS_MAX: usize = 4096;

/// The threads' iterator, loaded once and run as often as `each` asks (the agent's history, once a second).
pub struct Reader<'obj> {
    skel: skel::ThreadsSkel<'obj>,
    link: Option<libbpf_rs::Link>,
    /// The keys and values of the `wanted` map, as last written.
    wanted: HashMap<u64, u64>,
    /// The keys of the `known_waits` map.
    known_waits: HashSet<WaitPlace>,
    /// The iterator's output, kept between runs.
    records: Vec<u8>,
    /// The threads' names seen, each made once (a server's threads have a few names between them).
    names: Vec<([u8; 16], Arc<str>)>,
    /// When the last run with `only` began, by the scheduler's clock.
    last_began: Option<u64>,
    /// The program counting the wanted threads that exit (`None` until the first run with `only`; `Some(None)`
    /// where it cannot be attached: every wanted thread is then looked up at each run), and its count seen.
    exits: Option<Option<libbpf_rs::Link>>,
    exits_seen: u64,
    mem: Option<crate::process::memory::ProcMemory>,
    pid: u32,
    unwind: Option<Arc<super::unwind_store::UnwindStore>>,
}

/// Loads the iterator for `opts.pid` and gives it to `each`.
pub fn with_reader<R>(opts: &CollectOptions, each: impl FnOnce(&mut Reader<'_>) -> R) -> Result<R> {
    let mut object = MaybeUninit::uninit();
    let mut skel = open_and_load::<Skeleton>(&mut object, opts, "stacks", |open| {
        let rodata = super::rodata(open.maps.rodata_data.as_deref_mut())?;
        rodata.futex_syscall = libc::SYS_futex;
        open.progs.snapshot.set_autoattach(false);
        Ok(())
    })?;
    // The compat build (kernels before 5.18 have no sleepable iterators) reads no thread's memory: its user
    // stacks and futex words are read here, from /proc/PID/mem, after the iterator.
    let compat = super::features::Features::of_kernel(opts.btf.as_deref()).compat();
    let mut installed = Installed::default();
    if !compat && opts.verify_only.is_none() {
        install_unwind::<Skeleton>(opts, &mut installed, Skeleton::unwind(&mut skel))?;
    }
    let mem = compat
        .then(|| crate::process::memory::ProcMemory::open(opts.pid).ok())
        .flatten();
    let mut reader = Reader {
        skel,
        link: None,
        wanted: HashMap::default(),
        known_waits: Default::default(),
        records: Vec::new(),
        names: Vec::new(),
        last_began: None,
        exits: None,
        exits_seen: 0,
        mem,
        pid: opts.pid,
        unwind: opts.unwind.clone(),
    };
    if opts.verify_only.is_some() {
        reader.pid = 0;
    }
    Ok(each(&mut reader))
}

/// Where a thread waits on a futex from: its thread pointer, its user stack pointer and the futex operation (not the
/// futex: the same wait is on many lock words).
pub type WaitPlace = (u64, u64, u64);

impl ThreadRecord {
    /// Where it waits from, if it is blocked in a futex call.
    pub fn wait_place(&self) -> Option<WaitPlace> {
        let (nr, args) = self.syscall?;
        (nr == libc::SYS_futex && self.state != Some('R') && self.user_sp != 0).then_some((
            self.tls_base,
            self.user_sp,
            args[1],
        ))
    }
}

impl Reader<'_> {
    /// The iterator unwinds no thread waiting from one of `places` from now on (with `only`): its wait was named.
    /// Past the map's size, it forgets them all first (and says so: true).
    pub fn know_waits(&mut self, places: &[WaitPlace]) -> Result<bool> {
        use libbpf_rs::MapCore;
        let map = &self.skel.maps.known_waits;
        let forgot = self.known_waits.len() + places.len() > KNOWN_WAITS_MAX;
        if forgot {
            for p in self.known_waits.drain() {
                let _ = map.delete(&place_key(p));
            }
        }
        for &p in places.iter().take(KNOWN_WAITS_MAX) {
            if self.known_waits.insert(p) {
                map.update(&place_key(p), &[1], libbpf_rs::MapFlags::ANY)?;
            }
        }
        Ok(forgot)
    }

    /// Makes the `wanted` map's keys those of `only`, writing only what changed (a syscall per key written or
    /// deleted): a new key, or one `only` says to read now. Says whether it wrote any.
    fn write_wanted(&mut self, only: &HashMap<u64, u64>) -> Result<bool> {
        use libbpf_rs::MapCore;
        let wanted = &self.skel.maps.wanted;
        for base in self.wanted.keys().filter(|b| !only.contains_key(b)) {
            let _ = wanted.delete(&base.to_ne_bytes());
        }
        self.wanted.retain(|b, _| only.contains_key(b));
        let mut room = WANTED_MAX.saturating_sub(self.wanted.len());
        let mut written = false;
        for (&base, &switches) in only {
            match self.wanted.get(&base) {
                Some(&now) if switches != u64::MAX || now == u64::MAX => continue,
                Some(_) => {}
                None if room == 0 => continue,
                None => room -= 1,
            }
            wanted.update(
                &base.to_ne_bytes(),
                &switches.to_ne_bytes(),
                libbpf_rs::MapFlags::ANY,
            )?;
            self.wanted.insert(base, switches);
            written = true;
        }
        Ok(written)
    }

    /// Runs the iterator: every thread, or with `only` just those whose thread pointers are its keys and whose
    /// switches differ from the value (they ran since it was read), a futex wait's alone unwound. The value of a
    /// key given before is what the iterator last read of it, unless `only` says `u64::MAX` (read it now).
    pub fn read(&mut self, only: Option<&HashMap<u64, u64>>) -> Result<Snapshot> {
        if self.pid == 0 {
            // Verified only (`myprobe programs`): nothing is read.
            return Ok(Snapshot {
                threads: Vec::new(),
                lost: Lost::default(),
                ended: 0,
            });
        }
        // A key written means a thread to read whether it ran or not: every thread is looked up.
        let written = match only {
            Some(only) => self.write_wanted(only)?,
            None => false,
        };
        if only.is_some() && self.exits.is_none() {
            self.exits = Some(self.skel.progs.thread_exit.attach().ok());
        }
        let counted_exits = matches!(self.exits, Some(Some(_)));
        let bss = self.skel.maps.bss_data.as_deref_mut().context("no .bss")?;
        bss.only_wanted = only.is_some();
        // Set again only by a run with `only` that succeeds: it wrote the switches of every thread that ran.
        bss.ran_since = match self.last_began.take() {
            Some(began) if counted_exits && !written => began.saturating_sub(CLOCK_MARGIN_NS),
            _ => 0,
        };
        let looked_up_all = bss.ran_since == 0;
        bss.run_began = 0;
        bss.wanted_found = 0;
        if self.link.is_none() {
            self.link = Some(super::process_task_iterator(
                &self.skel.progs.snapshot,
                self.pid,
            )?);
        }
        // The last run's buffer: a second's records are a few hundred KiB, grown once rather than each run.
        let mut bytes = std::mem::take(&mut self.records);
        bytes.clear();
        let link = self.link.as_ref().expect("attached above");
        super::read_task_iterator(link, &mut bytes)?;
        let records = bytes
            .chunks_exact(std::mem::size_of::<thread_record>())
            .filter_map(read_exact::<thread_record>);
        let mem = self.mem.as_ref();
        let selected = only.is_some();
        let names = &mut self.names;
        let replay = |tables: Tables<'_>| -> Vec<ThreadRecord> {
            records
                .map(|r| {
                    let mut t = record(&r, names);
                    // As the kernel's side does: with `only`, a futex wait's stack alone is needed.
                    let needed = r.known_wait == 0
                        && (!selected || (r.state != 0 && r.syscall == libc::SYS_futex));
                    if let Some(mem) = mem.filter(|_| needed) {
                        read_from_memory(mem, tables, &r, &mut t);
                    }
                    t
                })
                .collect()
        };
        let threads = match &self.unwind {
            Some(store) => store.with_tables(self.pid, replay),
            None => replay(ProcessTables::default().tables()),
        };
        self.records = bytes;
        let bss = self.skel.maps.bss_data.as_deref().context("no .bss")?;
        let mut ended = 0;
        if selected {
            // What the iterator wrote for each thread it read.
            for t in &threads {
                if let Some(switches) = self.wanted.get_mut(&t.tls_base) {
                    *switches = t.switches;
                }
            }
            let exited = bss.wanted_exited.saturating_sub(self.exits_seen);
            self.exits_seen = bss.wanted_exited;
            ended = if looked_up_all {
                self.wanted.len().saturating_sub(bss.wanted_found as usize)
            } else {
                exited as usize
            };
        }
        self.last_began = selected.then_some(bss.run_began);
        Ok(Snapshot {
            threads,
            lost: Skeleton::lost(&self.skel),
            ended,
        })
    }
}

/// The compat build's user stack of `r` and its futex's words, read from the process's memory (`mem`): unwound
/// by the tables where they have rows (as unwind.h would), else by frame pointers.
fn read_from_memory(
    mem: &crate::process::memory::ProcMemory,
    tables: Tables<'_>,
    r: &thread_record,
    t: &mut ThreadRecord,
) {
    use crate::process::memory::Memory;
    let regs = Registers {
        ip: r.user_ip,
        sp: r.user_sp,
        bp: r.user_bp,
    };
    let read = |addr| mem.u64_at(addr);
    let user = unwind(tables, regs, read, MAX_USER_FRAMES);
    let kernel = t.stack.ips[usize::from(t.stack.user_len)..].to_vec();
    t.stack = RawStack {
        user_len: user.len() as u16,
        ips: user.into_iter().chain(kernel).collect(),
    };
    if let Some((_, args)) = t
        .syscall
        .filter(|(nr, args)| *nr == libc::SYS_futex && args[0] != 0)
    {
        if let Some(words) = mem.bytes(args[0], 12) {
            t.futex = Some(Futex {
                addr: args[0],
                word: u32::from_le_bytes(words[..4].try_into().expect("4 bytes")),
                next_int: i32::from_le_bytes(words[8..].try_into().expect("4 bytes")),
            });
        }
    }
}

fn record(r: &thread_record, names: &mut Vec<([u8; 16], Arc<str>)>) -> ThreadRecord {
    let state = state_letter(r.state, r.exit_state);
    let running = r.state == 0 && r.exit_state == 0;
    let syscall = (r.syscall >= 0).then_some((r.syscall, r.args));
    let e = &r.stack;
    let user = usize::from(e.user_len).min(e.ips.len());
    let kernel = usize::from(e.kernel_len).min(e.ips.len() - user);
    let comm = r.comm.map(|c| c as u8);
    let name = match names.iter().find(|(c, _)| *c == comm) {
        Some((_, name)) => name.clone(),
        None => {
            let len = comm.iter().position(|&c| c == 0).unwrap_or(comm.len());
            let name: Arc<str> = String::from_utf8_lossy(&comm[..len]).into();
            if names.len() == NAMES_KEPT {
                names.clear();
            }
            names.push((comm, name.clone()));
            name
        }
    };
    ThreadRecord {
        tid: r.tid,
        name,
        state: Some(state),
        on_cpu: r.on_cpu != 0,
        syscall,
        idle_ns: (!running && r.last_ran_ns > 0 && r.now_ns > 0)
            .then(|| r.now_ns.saturating_sub(r.last_ran_ns)),
        futex: (r.futex_read != 0).then_some(Futex {
            addr: r.args[0],
            word: r.futex_word,
            next_int: r.futex_owner,
        }),
        tls_base: r.tls_base,
        switches: r.switches,
        known_wait: r.known_wait != 0,
        user_sp: r.user_sp,
        stack: RawStack {
            user_len: user as u16,
            ips: e.ips[..user + kernel].into(),
        },
    }
}

fn place_key((tls, sp, op): WaitPlace) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..8].copy_from_slice(&tls.to_ne_bytes());
    key[8..16].copy_from_slice(&sp.to_ne_bytes());
    key[16..].copy_from_slice(&op.to_ne_bytes());
    key
}

/// The letter `ps` shows for a task's state (the kernel's `task_state_index`).
pub fn state_letter(state: u32, exit_state: u32) -> char {
    const TASK_REPORT: u32 = 0x7f;
    const TASK_IDLE: u32 = 0x402;
    const TASK_RTLOCK_WAIT: u32 = 0x1000;
    if state == TASK_IDLE {
        return 'I';
    }
    let state = if state == TASK_RTLOCK_WAIT { 2 } else { state };
    let report = (state | exit_state) & TASK_REPORT;
    let index = (u32::BITS - report.leading_zeros()) as usize;
    "RSDTtXZP".chars().nth(index).unwrap_or('?')
}

#[cfg(test)]
mod tests {
    use super::{state_letter, with_reader, HashMap, Snapshot};
    use crate::{
        collect::{CollectOptions, Stop},
        symbolize::test_support::{build_dir, compile, fixture_source, Running},
    };

    /// The thread pointers of a snapshot's threads.
    fn bases(s: &Snapshot) -> Vec<u64> {
        let mut b: Vec<u64> = s.threads.iter().map(|t| t.tls_base).collect();
        b.sort();
        b
    }

    /// Reading only some threads: each is read the first time, then only once it ran, and one that ended is counted
    /// as such once (by the program on `sched_process_exit`, or by the lookups where it cannot be attached).
    #[test]
    fn wanted_threads_are_read_once_they_ran_and_counted_once_they_ended() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: loading the iterator needs root");
            return;
        }
        let out = build_dir("myprobe-threads-").join("exiting");
        let cc = ["cc", "-O1", "-pthread"];
        assert!(compile(
            &cc,
            &fixture_source("threads/exiting.c"),
            &out,
            &[]
        ));
        let mut fixture = Running::start(&out, "thread2");
        let t: Vec<u64> = (0..3)
            .map(|n| fixture.addr(&format!("thread{n}")))
            .collect();
        let mut all = t.clone();
        all.sort();
        let opts = CollectOptions::new(fixture.pid(), None, 64 << 20, Stop::new());
        let settle = || std::thread::sleep(std::time::Duration::from_millis(20));
        with_reader(&opts, |reader| {
            let mut only: HashMap<u64, u64> = t.iter().map(|&b| (b, u64::MAX)).collect();
            let mut read = |only: &mut HashMap<u64, u64>| {
                settle();
                let s = reader.read(Some(only)).unwrap();
                for r in &s.threads {
                    only.insert(r.tls_base, r.switches);
                }
                (bases(&s), s.ended)
            };
            assert_eq!(read(&mut only), (all, 0), "each read the first time");
            assert_eq!(read(&mut only), (vec![], 0), "none ran since");
            fixture.command("wake 1");
            assert_eq!(read(&mut only), (vec![t[1]], 0), "the one that ran");
            fixture.command("end 0");
            // Joined once its thread id is cleared, before the exit's tracepoint: read once it is gone.
            let tasks = format!("/proc/{}/task", fixture.pid());
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while std::fs::read_dir(&tasks).map_or(0, Iterator::count) > 3 {
                assert!(std::time::Instant::now() < deadline, "thread 0 never ended");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert_eq!(read(&mut only), (vec![], 1), "the one that ended");
            only.remove(&t[0]);
            assert_eq!(read(&mut only), (vec![], 0), "counted once");
        })
        .unwrap();
    }

    #[test]
    fn states_read_as_ps_shows_them() {
        for (state, exit, letter) in [
            (0, 0, 'R'),
            (1, 0, 'S'),
            (2, 0, 'D'),
            (0x402, 0, 'I'),
            (4, 0, 'T'),
            (8, 0, 't'),
            (0, 0x20, 'Z'),
            (0x40, 0, 'P'),
            (0x1000, 0, 'D'),
            (0x101, 0, 'S'), // TASK_FREEZABLE is not reported
        ] {
            assert_eq!(state_letter(state, exit), letter, "{state:#x} {exit:#x}");
        }
    }
}
