//! What a futex wait is, from its stack's frame names (leaf first) and its futex operation: where it happens (its
//! site: the innermost function above the locking primitives) and what kind of wait it is (the primitive: a
//! mutex or rw-lock held by another thread is contention; a condition variable or an event is a thread waiting
//! for something to do, or to happen).

use std::{collections::HashMap, path::PathBuf, rc::Rc};

use crate::{
    collect::RawStack,
    server::{
        self,
        causes::{COMMON_AROUND, COMMON_ASKED},
        Cause, WaitCauses, WaitKind,
    },
    symbolize::{data::DataSymbolizer, unnamed_in_binary, wait_calls::ConstantCall, Symbolizer},
};

/// Frames of the locking primitives themselves, by the start of their cleaned names: the C library's and the
/// C++ library's, and the wrappers every server has (the performance-schema wrappers, MDL's wait). Each
/// server's own latches are its module's (`server::LockNames`).
const PRIMITIVE_PREFIXES: &[&str] = &[
    "__",
    "pthread_",
    "futex",
    "syscall",
    "sem_",
    "std::",
    "lll_",
    "inline_mysql_",
    "psi_",
    "my_cond_",
    "mysql_cond_",
    "mysql_mutex_",
    "mysql_rwlock_",
    "safe_mutex_",
    "safe_cond_",
    "my_pthread_",
    "MDL_wait::",
    "Interruptible_wait::",
];

/// Unnamed frames of the C and C++ libraries (`libc.so.6+0x…`) are primitives too.
const LIBRARY_PREFIXES: &[&str] = &["libc.so", "libc-", "libpthread", "libstdc++", "ld-linux"];

/// A server's own primitive that `frame` is, and the kind of wait it tells.
fn server_primitive(frame: &str) -> Option<Option<WaitKind>> {
    server::all_lock_names()
        .flat_map(|names| names.primitives)
        .find(|(prefix, _)| frame.starts_with(prefix))
        .map(|&(_, kind)| kind)
}

fn is_primitive(frame: &str) -> bool {
    PRIMITIVE_PREFIXES.iter().any(|p| frame.starts_with(p))
        || LIBRARY_PREFIXES.iter().any(|p| frame.starts_with(p))
        || server_primitive(frame).is_some()
}

/// A frame the symbolizer could not name: `mariadbd+0x8a1c00`, `[unknown]`.
fn is_unnamed(frame: &str) -> bool {
    frame.starts_with('[') || unnamed_in_binary(frame).is_some()
}

/// Where a wait happens: the innermost frame above the primitives, by name (`MDL_context::acquire_lock`); when
/// that frame has no name, with the innermost named one above it (`mariadbd+0xd5ad50 in
/// handler::ha_index_read_map`). `None` for a stack of primitives only.
pub fn site(frames: &[Rc<str>]) -> Option<String> {
    let mut above = frames.iter().skip_while(|f| is_primitive(f));
    let first = above.next()?;
    if !is_unnamed(first) {
        return Some(first.to_string());
    }
    match above.find(|f| !is_unnamed(f) && !is_primitive(f)) {
        Some(named) => Some(format!("{first} in {named}")),
        None => Some(first.to_string()),
    }
}

/// What every server waits for at sites whose name does not say it; each server's own are its module's.
const KNOWN_SITES: &[(&str, &str)] = &[
    ("log_write_up_to", "the redo log's write and sync"),
    ("MDL_context::acquire_lock", "a metadata lock"),
];

/// What a site waits for, when its name does not say it: `net_real_write` → the redo log's write and sync.
pub fn site_meaning(site: &str) -> Option<&'static str> {
    KNOWN_SITES
        .iter()
        .chain(server::all_lock_names().flat_map(|names| names.sites))
        .find(|(name, _)| site == *name || site.ends_with(&format!(" in {name}")))
        .map(|(_, meaning)| *meaning)
}

/// The name of a lock word: its variable's (`symbol`, from `DataSymbolizer`); a word in no variable
/// (`anonymous`: `[heap]`, `[anon]`, `mariadbd+0x21a69cc`) also by its address and where it is waited for:
/// `[heap] 0x55d0c8a4e2a8 (in lock_wait)`.
pub fn lock_name(symbol: &str, anonymous: bool, addr: u64, site: Option<&str>) -> String {
    let mapping = symbol.starts_with('[');
    match (anonymous, site) {
        (false, _) => symbol.to_string(),
        (true, Some(site)) if mapping => format!("{symbol} {addr:#x} (in {site})"),
        (true, Some(site)) => format!("{symbol} (in {site})"),
        (true, None) if mapping => format!("{symbol} {addr:#x}"),
        (true, None) => symbol.to_string(),
    }
}

/// The frame every connection's thread passes through while it runs a statement (MariaDB's and MySQL's alike): a
/// stack without it is a background thread's, or an idle pool worker's.
pub const STATEMENT_FRAME: &str = "do_command";

/// The name of the lock word at `addr`, waited for from `site`, as [`lock_name`] says it.
pub fn lock_word_name(data: &mut DataSymbolizer, addr: u64, site: Option<&str>) -> String {
    let symbol = data.name(addr);
    let anonymous = data.names_no_variable(&symbol);
    lock_name(&symbol, anonymous, addr, site)
}

/// The futex operation of a wait, as far as it tells the kind: glibc's mutexes wait with FUTEX_WAIT (or
/// FUTEX_LOCK_PI), its condition variables and semaphores with FUTEX_WAIT_BITSET.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FutexOp {
    Wait,
    WaitBitset,
    LockPi,
    Unknown,
}

impl FutexOp {
    /// From a set of operations (bit `op & 15` for each, as locks.bpf.c counts them): a condition's wait wins.
    pub fn of_set(ops: u64) -> Self {
        if ops & (1 << 9) != 0 {
            FutexOp::WaitBitset
        } else if ops & (1 << 0) != 0 {
            FutexOp::Wait
        } else if ops & ((1 << 6) | (1 << 13)) != 0 {
            FutexOp::LockPi
        } else {
            FutexOp::Unknown
        }
    }
}

/// The kind of a wait: the server's own lock in its primitives (a metadata lock waits on a condition variable);
/// else the innermost primitive that tells (a mutex taken again after a condition wait is a mutex wait); else
/// its futex operation.
pub fn kind(frames: &[Rc<str>], op: FutexOp) -> WaitKind {
    match primitive_kind(frames, op) {
        WaitKind::Condition if frames.iter().any(|f| f.as_ref() == "dispatch_command") => {
            WaitKind::StatementWait
        }
        kind => kind,
    }
}

fn primitive_kind(frames: &[Rc<str>], op: FutexOp) -> WaitKind {
    let primitives = || frames.iter().take_while(|f| is_primitive(f));
    // The server's own lock, over the primitives it is built on (a metadata lock waits on a condition).
    for f in primitives() {
        if f.starts_with("MDL_wait::") {
            return WaitKind::MetadataLock;
        }
        if let Some(Some(kind)) = server_primitive(f) {
            return kind;
        }
    }
    for f in primitives() {
        let f: &str = f;
        if f.contains("mutex_lock")
            || f.contains("mutex_cond_lock")
            || f.starts_with("__lll_lock")
            || f.starts_with("lll_lock")
            || f.starts_with("std::mutex")
            || f.starts_with("mysql_mutex_")
            || f.starts_with("inline_mysql_mutex")
        {
            return WaitKind::Mutex;
        }
        if f.contains("rwlock")
            || f.starts_with("inline_mysql_rwlock")
            || f.starts_with("psi_rd_lock")
            || f.starts_with("psi_wr_lock")
            || f.starts_with("psi_u_lock")
            || f.starts_with("std::shared_mutex")
        {
            return WaitKind::RwLock;
        }
        if f.contains("cond_") || f.contains("condition_variable") || f.starts_with("sem_") {
            return WaitKind::Condition;
        }
    }
    match op {
        FutexOp::Wait | FutexOp::LockPi => WaitKind::OtherLock,
        FutexOp::WaitBitset | FutexOp::Unknown => WaitKind::Condition,
    }
}

/// What a futex wait's stack says it waits for: one cause, or, where the function around it announces one of
/// several types to `thd_wait_begin` (InnoDB's lock wait: a row or a table lock), the cause of each type, told
/// apart by the type the statement's thread last announced (`wait_slot::hint`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StackCause {
    One(Cause),
    ByType(Vec<(u32, Cause)>),
}

impl StackCause {
    /// The cause, given the type last announced (0: none seen; the first type's then, InnoDB's row lock).
    pub fn given(&self, hint: u32) -> Cause {
        match self {
            StackCause::One(c) => *c,
            StackCause::ByType(types) => types
                .iter()
                .find(|(t, _)| *t == hint)
                .or(types.first())
                .map_or(Cause::UnknownWait, |(_, c)| *c),
        }
    }
}

/// The functions of a server that call `thd_wait_begin` with a constant type, by their frames' names, each with
/// the causes its types are (`WaitCauses::wait_types`).
pub type Brackets = HashMap<Rc<str>, Vec<(u32, Cause)>>;

/// The cause of a futex wait with `frames` (leaf first) of kind `kind`: a frame of what the statement asked for
/// (`SLEEP`, `GET_LOCK`), else the innermost frame that names one (a server's wait function, or one that announces
/// its waits to `thd_wait_begin`), else its primitive's (a mutex held: an internal lock), else unknown.
pub fn cause(frames: &[Rc<str>], kind: WaitKind, brackets: &Brackets) -> StackCause {
    let tables = || server::all_lock_names().map(|names| &names.causes);
    let asked = || std::iter::once(COMMON_ASKED).chain(tables().map(|c: &WaitCauses| c.asked));
    let around = || std::iter::once(COMMON_AROUND).chain(tables().map(|c: &WaitCauses| c.around));
    for (name, cause) in asked().flatten() {
        if frames.iter().any(|f| f.as_ref() == *name) {
            return StackCause::One(*cause);
        }
    }
    for f in frames {
        if let Some((_, cause)) = around().flatten().find(|(name, _)| f.as_ref() == *name) {
            return StackCause::One(*cause);
        }
        if let Some(types) = brackets.get(f) {
            return match types.as_slice() {
                [(_, one)] => StackCause::One(*one),
                _ => StackCause::ByType(types.clone()),
            };
        }
    }
    StackCause::One(match kind {
        WaitKind::MetadataLock => Cause::MetadataLock,
        WaitKind::Mutex | WaitKind::RwLock | WaitKind::OtherLock => Cause::InternalLock,
        WaitKind::StatementWait | WaitKind::Condition => Cause::UnknownWait,
    })
}

/// The causes of the types each call announces, in the server whose `thd_wait_begin` it calls: InnoDB's lock wait
/// announces a row lock or a table lock, whose table lock is InnoDB's, not the server's.
fn causes_of_types(values: &[u32], causes: &WaitCauses) -> Vec<(u32, Cause)> {
    let innodb = values.contains(&server::causes::THD_WAIT_ROW_LOCK);
    values
        .iter()
        .filter_map(|v| {
            let (_, cause) = causes.wait_types.iter().find(|(t, _)| t == v)?;
            Some(match cause {
                Cause::TableLock if innodb => (*v, Cause::InnodbTableLock),
                c => (*v, *c),
            })
        })
        .collect()
}

/// Stacks of lock waits named by their site, at most this many (a server has a few hundred wait sites).
const MAX_SITES: usize = 65536;

/// The server's binary and its calls of `thd_wait_begin` ([`crate::symbolize::wait_calls`]), with its causes.
pub struct WaitBegins {
    pub binary: PathBuf,
    pub calls: Vec<ConstantCall>,
    pub causes: &'static WaitCauses,
}

impl WaitBegins {
    /// The functions around these calls, by the names `symbolizer` gives their frames in process `pid`, with the
    /// causes of the types each announces.
    pub fn brackets(&self, pid: u32, symbolizer: &mut Symbolizer) -> Brackets {
        let Some(bias) = std::fs::File::open(&self.binary)
            .ok()
            .and_then(|f| crate::process::memory::load_bias(pid, &f))
        else {
            return Brackets::new();
        };
        self.calls
            .iter()
            .filter_map(|call| {
                let at = call.vaddr.checked_add(bias)?;
                let name = symbolizer.user_stack(&[at]).into_iter().next()?;
                Some((name, causes_of_types(&call.values, self.causes)))
            })
            .filter(|(_, types)| !types.is_empty())
            .collect()
    }
}

/// The sites and causes of lock waits' stacks, as they arrive: symbolized once each, while tracing.
pub struct SiteNames {
    pid: u32,
    symbolizer: Option<Symbolizer>,
    by_stack: HashMap<u64, Option<(Rc<str>, StackCause)>>,
    wait_begins: Option<WaitBegins>,
    brackets: Brackets,
}

impl SiteNames {
    /// For the process `pid`, symbolized from the first stack on; `wait_begins` name the waits of functions without
    /// a name of their own.
    pub fn new(pid: u32, wait_begins: Option<WaitBegins>) -> Self {
        SiteNames {
            pid,
            symbolizer: None,
            by_stack: HashMap::new(),
            wait_begins,
            brackets: Brackets::new(),
        }
    }

    /// Names the site and cause of a stack as it arrives.
    pub fn add(&mut self, id: u64, stack: &RawStack) {
        if self.by_stack.len() >= MAX_SITES {
            self.by_stack.clear();
        }
        if self.symbolizer.is_none() {
            match Symbolizer::new(self.pid) {
                Ok(s) => self.symbolizer = Some(s),
                Err(e) => {
                    say!("myprobe: warning: lock wait sites are not named: {e:#}");
                    self.by_stack.insert(id, None);
                    return;
                }
            }
            self.brackets = self.brackets_named();
        }
        let Some(symbolizer) = self.symbolizer.as_mut() else {
            return;
        };
        let frames = symbolizer.user_stack(stack.user());
        let named = site(&frames).map(|site| {
            let cause = cause(&frames, kind(&frames, FutexOp::Unknown), &self.brackets);
            (Rc::from(site), cause)
        });
        self.by_stack.insert(id, named);
    }

    /// The functions that announce their waits, by the names their frames have in this process.
    fn brackets_named(&mut self) -> Brackets {
        match (self.wait_begins.take(), self.symbolizer.as_mut()) {
            (Some(w), Some(symbolizer)) => w.brackets(self.pid, symbolizer),
            _ => Brackets::new(),
        }
    }

    /// The site of a stack that arrived.
    pub fn of(&self, id: u64) -> Option<String> {
        self.by_stack
            .get(&id)?
            .as_ref()
            .map(|(site, _)| site.to_string())
    }

    /// The sites whose waits have one cause that their name does not say (a function without a name of its own,
    /// named by the type it announces to `thd_wait_begin`), each once, for the sentences that name sites.
    pub fn causes(&self) -> Vec<(String, Cause)> {
        let mut named: Vec<(String, Cause)> = self
            .by_stack
            .values()
            .flatten()
            .filter_map(|(site, cause)| match cause {
                StackCause::One(c) if !matches!(c, Cause::InternalLock | Cause::UnknownWait) => {
                    Some((site.to_string(), *c))
                }
                _ => None,
            })
            .filter(|(site, _)| site_meaning(site).is_none())
            .collect();
        named.sort_unstable();
        named.dedup();
        // A site whose waits were given several causes says none.
        let once = |site: &str| named.iter().filter(|(s, _)| s == site).count() == 1;
        named.iter().filter(|(s, _)| once(s)).cloned().collect()
    }

    /// The cause of a wait at a stack that arrived, given the wait type its thread last announced.
    pub fn cause_of(&self, id: u64, hint: u32) -> Option<Cause> {
        self.by_stack
            .get(&id)?
            .as_ref()
            .map(|(_, cause)| cause.given(hint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::Server;

    fn frames(names: &[&str]) -> Vec<Rc<str>> {
        names.iter().map(|&n| Rc::from(n)).collect()
    }

    #[test]
    fn mysql_s_innodb_waits_are_named_by_their_latch() {
        // A latch waits in the sync array on an event, itself a condition variable: the latch tells the kind.
        let latch = frames(&[
            "__futex_abstimed_wait_common",
            "___pthread_cond_wait",
            "os_event::wait_low",
            "os_event_wait_low",
            "sync_array_wait_event",
            "TTASEventMutex<GenericPolicy>::wait",
            "PolicyMutex<TTASEventMutex<GenericPolicy> >::enter",
            "buf_page_get_gen",
            "dispatch_command",
        ]);
        assert_eq!(kind(&latch, FutexOp::WaitBitset), WaitKind::Mutex);
        assert_eq!(site(&latch).as_deref(), Some("buf_page_get_gen"));
        let rw = frames(&[
            "___pthread_cond_wait",
            "os_event_wait_low",
            "sync_array_wait_event",
            "rw_lock_x_lock_func",
            "btr_cur_search_to_nth_level",
        ]);
        assert_eq!(kind(&rw, FutexOp::WaitBitset), WaitKind::RwLock);
        // A row lock: an event waited on in a statement, at a site that says what it is.
        let row_lock = frames(&[
            "___pthread_cond_timedwait",
            "os_event::timed_wait",
            "os_event_wait_time_low",
            "lock_wait_suspend_thread",
            "row_mysql_handle_errors",
            "dispatch_command",
        ]);
        assert_eq!(
            kind(&row_lock, FutexOp::WaitBitset),
            WaitKind::StatementWait
        );
        let at = site(&row_lock).unwrap();
        assert_eq!(at, "lock_wait_suspend_thread");
        assert_eq!(site_meaning(&at), Some("a row lock"));
    }

    #[test]
    fn a_wait_s_cause_comes_from_what_was_asked_then_its_innermost_named_frame() {
        let stack = |names: &[&str]| frames(names);
        let none = Brackets::new();
        let cause_of =
            |f: &[Rc<str>], brackets: &Brackets| cause(f, kind(f, FutexOp::Unknown), brackets);
        // GET_LOCK waits in the metadata lock subsystem: a user lock.
        let get_lock = stack(&[
            "___pthread_cond_timedwait",
            "MDL_wait::timed_wait",
            "MDL_context::acquire_lock",
            "Item_func_get_lock::val_int",
            "dispatch_command",
        ]);
        assert_eq!(cause_of(&get_lock, &none), StackCause::One(Cause::UserLock));
        let mdl = stack(&[
            "___pthread_cond_timedwait",
            "MDL_wait::timed_wait",
            "open_table",
        ]);
        assert_eq!(cause_of(&mdl, &none), StackCause::One(Cause::MetadataLock));
        // Debian's stripped MariaDB: InnoDB's lock_wait has no name, but calls thd_wait_begin with a row lock's or
        // a table lock's type; the type its thread announced tells which.
        let row = stack(&[
            "__futex_abstimed_wait_common",
            "___pthread_cond_timedwait",
            "mariadbd+0xd5ad50",
            "handler::ha_index_read_map",
            "dispatch_command",
        ]);
        let mut brackets = Brackets::new();
        brackets.insert(
            Rc::from("mariadbd+0xd5ad50"),
            vec![(3, Cause::RowLock), (6, Cause::InnodbTableLock)],
        );
        let by_type = cause_of(&row, &brackets);
        assert_eq!(by_type.given(3), Cause::RowLock);
        assert_eq!(by_type.given(6), Cause::InnodbTableLock);
        assert_eq!(cause_of(&row, &none), StackCause::One(Cause::UnknownWait));
        // The redo log's group commit inside the binlog's: the innermost names it.
        let redo = stack(&[
            "syscall",
            "group_commit_lock::acquire",
            "log_write_up_to",
            "MYSQL_BIN_LOG::queue_for_group_commit",
        ]);
        assert_eq!(cause_of(&redo, &none), StackCause::One(Cause::RedoLog));
        let mutex = stack(&["__lll_lock_wait", "___pthread_mutex_lock", "open_table"]);
        assert_eq!(
            cause_of(&mutex, &none),
            StackCause::One(Cause::InternalLock)
        );
        let values = causes_of_types(&[3, 6], &server::MariaDb.lock_names().causes);
        assert_eq!(values, [(3, Cause::RowLock), (6, Cause::InnodbTableLock)]);
    }

    #[test]
    fn a_site_is_the_first_frame_above_the_primitives() {
        let mdl = frames(&[
            "__futex_abstimed_wait_common",
            "___pthread_cond_timedwait",
            "MDL_wait::timed_wait",
            "MDL_context::acquire_lock",
            "open_table",
        ]);
        assert_eq!(site(&mdl).as_deref(), Some("MDL_context::acquire_lock"));
        assert_eq!(kind(&mdl, FutexOp::WaitBitset), WaitKind::MetadataLock);

        let row_lock = frames(&[
            "__futex_abstimed_wait_common",
            "___pthread_cond_timedwait",
            "mariadbd+0xd5ad50",
            "mariadbd+0xdb63c0",
            "handler::ha_index_read_map",
        ]);
        assert_eq!(
            site(&row_lock).as_deref(),
            Some("mariadbd+0xd5ad50 in handler::ha_index_read_map")
        );
        assert_eq!(kind(&row_lock, FutexOp::WaitBitset), WaitKind::Condition);
        let mut in_statement = row_lock.clone();
        in_statement.push(Rc::from("dispatch_command"));
        assert_eq!(
            kind(&in_statement, FutexOp::WaitBitset),
            WaitKind::StatementWait
        );
        assert!(WaitKind::StatementWait.is_contention());

        let named_row_lock = frames(&[
            "__futex_abstimed_wait_common",
            "___pthread_cond_timedwait",
            "lock_wait",
        ]);
        assert_eq!(site(&named_row_lock).as_deref(), Some("lock_wait"));

        let latch = frames(&[
            "syscall",
            "mariadbd+0xd6e1e0",
            "mariadbd+0xd5e2c0",
            "ha_commit_trans",
        ]);
        assert_eq!(
            site(&latch).as_deref(),
            Some("mariadbd+0xd6e1e0 in ha_commit_trans")
        );
        assert_eq!(kind(&latch, FutexOp::Wait), WaitKind::OtherLock);

        assert_eq!(
            site(&frames(&["__lll_lock_wait", "libc.so.6+0x8a000"])),
            None
        );
    }

    #[test]
    fn known_sites_say_what_is_waited_for() {
        assert_eq!(
            site_meaning("net_real_write"),
            Some("the redo log to be written and synced before replying")
        );
        assert_eq!(
            site_meaning("mariadbd+0x10 in lock_wait"),
            Some("a row lock")
        );
        assert_eq!(site_meaning("my_lock_wait"), None);
    }

    #[test]
    fn an_anonymous_lock_is_named_by_its_site() {
        assert_eq!(
            lock_name("LOCK_open", false, 1, Some("open_table")),
            "LOCK_open"
        );
        assert_eq!(
            lock_name("no_work+0x28", false, 1, Some("idle_worker")),
            "no_work+0x28"
        );
        assert_eq!(
            lock_name("[heap]", true, 0x55d0, Some("lock_wait")),
            "[heap] 0x55d0 (in lock_wait)"
        );
        assert_eq!(
            lock_name("mariadbd+0x21a69cc", true, 7, Some("ha_commit_trans")),
            "mariadbd+0x21a69cc (in ha_commit_trans)"
        );
        assert_eq!(lock_name("[anon]", true, 0x10, None), "[anon] 0x10");
    }

    #[test]
    fn a_mutex_taken_again_after_a_condition_wait_is_contention() {
        let retake = frames(&[
            "__lll_lock_wait",
            "__pthread_mutex_cond_lock",
            "___pthread_cond_clockwait",
            "tpool::thread_pool_generic::wait_for_tasks",
        ]);
        assert_eq!(kind(&retake, FutexOp::Wait), WaitKind::Mutex);
        let idle = frames(&[
            "__futex_abstimed_wait_common",
            "___pthread_cond_clockwait",
            "libstdc++.so.6.0.30+0xd4490",
            "tpool::thread_pool_generic::wait_for_tasks",
        ]);
        assert_eq!(kind(&idle, FutexOp::WaitBitset), WaitKind::Condition);
        assert!(!WaitKind::Condition.is_contention());
        assert_eq!(
            site(&idle).as_deref(),
            Some("tpool::thread_pool_generic::wait_for_tasks")
        );
    }
}
