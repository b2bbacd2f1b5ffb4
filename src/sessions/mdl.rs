//! What a MariaDB connection waits for when it waits for a metadata lock, and who keeps it waiting, read from the
//! server's memory as its own deadlock detector walks it (`MDL_lock::visit_subgraph`): the connection's
//! `MDL_context::m_waiting_for` is its pending ticket, whose lock has the key (namespace, database, name) and two
//! lists of tickets, granted and waiting. A granted ticket of another connection blocks the wait where the lock's
//! strategy says its type is incompatible with the type wanted (`m_granted_incompatible`), a waiting one where it
//! says the wait queues behind it (`m_waiting_incompatible`: a SELECT behind an ALTER's pending exclusive lock).
//! MariaDB has no fast path: every granted ticket is in its lock's list.
//!
//! Every offset is read from the build's exported code, and every pointer checked, without taking the lock's
//! `m_rwlock`: a wait granted or given up while it is read is read again, once. MySQL is not read here: its
//! `performance_schema.metadata_locks` says the same.

use std::{fs, path::Path};

use anyhow::{ensure, Context, Result};

use crate::process::memory::{self, Memory};

/// MariaDB's symbols that say where its metadata locks are (sql/mdl.h, sql/mdl.cc; the same in 10.11 and 11.8).
/// Each function is exported, and the first read of one of its arguments is a field (see `memory::accessor_fields`).
mod symbol {
    /// `thd_mdl_context(THD *)`, `return &thd->mdl_context` (sql/sql_class.cc): the `MDL_context` in a THD.
    pub const THD_MDL_CONTEXT: &str = "thd_mdl_context";
    /// `Deadlock_detection_visitor::opt_change_victim_to(MDL_context *)`: reads its victim (`m_victim`), the
    /// victim's `m_waiting_for`, then that one's vtable (`get_deadlock_weight()`).
    pub const OPT_CHANGE_VICTIM_TO: &str =
        "_ZN26Deadlock_detection_visitor20opt_change_victim_toEP11MDL_context";
    /// `MDL_ticket::downgrade_lock(enum_mdl_type)`: compares its `m_type` first.
    pub const DOWNGRADE_LOCK: &str = "_ZN10MDL_ticket14downgrade_lockE13enum_mdl_type";
    /// `MDL_lock::visit_subgraph(MDL_ticket *waiting_ticket, MDL_wait_for_graph_visitor *)`: reads the ticket's
    /// `m_ctx` (its second argument) first.
    pub const LOCK_VISIT_SUBGRAPH: &str =
        "_ZN8MDL_lock14visit_subgraphEP10MDL_ticketP26MDL_wait_for_graph_visitor";
    /// `MDL_ticket::get_key() const`, `return &m_lock->key`: only loads `m_lock`, the key being its first member.
    pub const GET_KEY: &str = "_ZNK10MDL_ticket7get_keyEv";
    /// `MDL_lock::Ticket_list::remove_ticket(MDL_ticket *)`: unlinks the ticket from its lock's list, reading its
    /// `ilist_node`'s `prev` first, the word after `next`.
    pub const LIST_REMOVE_TICKET: &str = "_ZN8MDL_lock11Ticket_list13remove_ticketEP10MDL_ticket";
    /// `MDL_lock::reschedule_waiters()`: calls through its `m_strategy` first.
    pub const RESCHEDULE_WAITERS: &str = "_ZN8MDL_lock18reschedule_waitersEv";
    /// `MDL_map::get_lock_owner(LF_PINS *, const MDL_key *)`: tests the key's namespace, `m_ptr[0]`, first.
    pub const GET_LOCK_OWNER: &str = "_ZN7MDL_map14get_lock_ownerEP7LF_PINSPK7MDL_key";
    /// `sp_name::sp_name(const MDL_key *, char *)` (sql/sp.cc): reads the key's `m_db_name_length` first.
    pub const SP_NAME: &str = "_ZN7sp_nameC1EPK7MDL_keyPc";
    /// `MDL_lock::lf_hash_initializer(LF_HASH *, MDL_lock *, const MDL_key *)`: reads the key's `m_length` first.
    /// An inline function: a build may not have it, and the length is then only checked by the key's NULs.
    pub const LF_HASH_INITIALIZER: &str = "_ZN8MDL_lock19lf_hash_initializerEP10st_lf_hashPvPKv";
    /// `MDL_lock::remove_ticket(LF_PINS *, Ticket_list MDL_lock::*list, MDL_ticket *)`: the list is a member
    /// pointer, passed as its offset in `MDL_lock`.
    pub const REMOVE_TICKET: &str =
        "_ZN8MDL_lock13remove_ticketEP7LF_PINSMS_NS_11Ticket_listEP10MDL_ticket";
    /// `MDL_context::release_lock(enum_mdl_duration, MDL_ticket *)`: removes its ticket from `&MDL_lock::m_granted`.
    pub const RELEASE_LOCK: &str =
        "_ZN11MDL_context12release_lockE17enum_mdl_durationP10MDL_ticket";
    /// `MDL_context::acquire_lock(MDL_request *, double)`: removes its ticket from `&MDL_lock::m_waiting` when the
    /// wait ends without the lock (the only call of `MDL_lock::remove_ticket` there).
    pub const ACQUIRE_LOCK: &str = "_ZN11MDL_context12acquire_lockEP11MDL_requestd";
    /// What `m_waiting_for` points to (an `MDL_wait_for_subgraph`): a ticket, or a table flush's wait
    /// (sql/table.h's `Wait_for_flush`, "Waiting for table flush"), each known by its vtable.
    pub const TICKET_VTABLE: &str = "_ZTV10MDL_ticket";
    pub const FLUSH_VTABLE: &str = "_ZTV14Wait_for_flush";
    /// A connection's class: the `MDL_context` of a ticket is in a THD.
    pub const THD_VTABLE: &str = "_ZTV3THD";
    /// `MDL_key::m_namespace_to_wait_state_name`: a `PSI_stage_info` (24 bytes) per namespace.
    pub const NAMESPACE_STAGES: &str = "_ZN7MDL_key30m_namespace_to_wait_state_nameE";
}

/// `MDL_key::enum_mdl_namespace`, the first byte of a key.
const NAMESPACES: [&str; 9] = [
    "BACKUP",
    "SCHEMA",
    "TABLE",
    "FUNCTION",
    "PROCEDURE",
    "PACKAGE_BODY",
    "TRIGGER",
    "EVENT",
    "USER_LOCK",
];

/// `sizeof(PSI_stage_info)`: `{ key; name; flags }`.
const STAGE_INFO_SIZE: usize = 24;

/// `enum_mdl_type`, the types of every lock but BACKUP's, named as `performance_schema.metadata_locks` names them.
const LOCK_TYPES: &[&str] = &[
    "INTENTION_EXCLUSIVE",
    "SHARED",
    "SHARED_HIGH_PRIO",
    "SHARED_READ",
    "SHARED_WRITE",
    "SHARED_UPGRADABLE",
    "SHARED_READ_ONLY",
    "SHARED_NO_WRITE",
    "SHARED_NO_READ_WRITE",
    "EXCLUSIVE",
];

/// The BACKUP lock's types (`MDL_BACKUP_START` …): 14 in 10.11 and 11.8, `MDL_BACKUP_COMMIT_HIGH_PRIO` added
/// after them later.
const BACKUP_TYPES: &[&str] = &[
    "BACKUP_START",
    "BACKUP_FLUSH",
    "BACKUP_WAIT_FLUSH",
    "BACKUP_WAIT_DDL",
    "BACKUP_WAIT_COMMIT",
    "BACKUP_FTWRL1",
    "BACKUP_FTWRL2",
    "BACKUP_DML",
    "BACKUP_TRANS_DML",
    "BACKUP_SYS_DML",
    "BACKUP_DDL",
    "BACKUP_BLOCK_DDL",
    "BACKUP_ALTER_COPY",
    "BACKUP_COMMIT",
    "BACKUP_COMMIT_HIGH_PRIO",
];

/// A lock strategy's symbols: the static object a lock's `m_strategy` points to, its bitmaps (by the type wanted,
/// the bits of the types that conflict: `MDL_ticket::is_incompatible_when_granted` / `_when_waiting`), its types'
/// names and the fewest of them a build has.
struct StrategySymbols {
    object: &'static str,
    granted: &'static str,
    waiting: &'static str,
    types: &'static [&'static str],
    fewest: usize,
}

const STRATEGIES: [StrategySymbols; 3] = [
    // Every namespace but SCHEMA and BACKUP.
    StrategySymbols {
        object: "_ZN8MDL_lock22m_object_lock_strategyE",
        granted: "_ZN8MDL_lock15MDL_object_lock22m_granted_incompatibleE",
        waiting: "_ZN8MDL_lock15MDL_object_lock22m_waiting_incompatibleE",
        types: LOCK_TYPES,
        fewest: LOCK_TYPES.len(),
    },
    // SCHEMA
    StrategySymbols {
        object: "_ZN8MDL_lock22m_scoped_lock_strategyE",
        granted: "_ZN8MDL_lock15MDL_scoped_lock22m_granted_incompatibleE",
        waiting: "_ZN8MDL_lock15MDL_scoped_lock22m_waiting_incompatibleE",
        types: LOCK_TYPES,
        fewest: LOCK_TYPES.len(),
    },
    // BACKUP (`MDL_map::m_backup_lock`, the one lock of its namespace)
    StrategySymbols {
        object: "_ZN8MDL_lock22m_backup_lock_strategyE",
        granted: "_ZN8MDL_lock15MDL_backup_lock22m_granted_incompatibleE",
        waiting: "_ZN8MDL_lock15MDL_backup_lock22m_waiting_incompatibleE",
        types: BACKUP_TYPES,
        fewest: 14,
    },
];

/// `MAX_MDLKEY_LENGTH`: a namespace byte, a database and a name of `NAME_LEN` (64 characters of 3 bytes), each
/// NUL-terminated.
const KEY_MAX: usize = 1 + 192 + 1 + 192 + 1;

/// Most tickets walked in one list of a lock: past it, the list is taken for not ending.
const TICKETS_MAX: usize = 10_000;

/// Where a MariaDB build keeps its metadata locks, from its own exported code.
#[derive(Clone, Debug)]
pub struct MdlLayout {
    /// THD → its `MDL_context`.
    context: u64,
    /// `MDL_context` → `m_waiting_for`, the ticket (or table flush) it waits for.
    waiting_for: u64,
    ticket: TicketFields,
    lock: LockFields,
    /// The first words of a ticket, of a table flush's wait and of a THD (each vtable's address plus 16).
    ticket_word: u64,
    flush_word: u64,
    thd_word: u64,
    strategies: Vec<Strategy>,
}

/// `MDL_ticket`'s fields.
#[derive(Clone, Copy, Debug)]
struct TicketFields {
    /// Its `ilist_node` in its lock's list: `{ next, prev }`.
    link: u64,
    /// `m_type`, 32 bits.
    kind: u64,
    /// `m_ctx`, the `MDL_context` it belongs to.
    context: u64,
    /// `m_lock`.
    lock: u64,
}

/// `MDL_lock`'s fields.
#[derive(Clone, Copy, Debug)]
struct LockFields {
    /// `key`, an `MDL_key`: `m_length`, `m_db_name_length` (16 bits each, from the key; the first where known)
    /// and `m_ptr` (the namespace byte, the database, NUL, the name, NUL).
    key: u64,
    key_length: Option<u64>,
    key_db_length: u64,
    key_chars: u64,
    /// `m_granted` and `m_waiting`, circular lists of tickets whose sentinel node is at their start.
    granted: u64,
    waiting: u64,
    /// `m_strategy`: one of the three static strategies, or null while the lock is being removed.
    strategy: u64,
}

/// A lock strategy as the process holds it.
#[derive(Clone, Debug)]
struct Strategy {
    /// Where the process keeps the strategy's object: a lock's `m_strategy`.
    address: u64,
    /// By type wanted, the bits of the types that block it, granted and waiting.
    granted_incompatible: Vec<u16>,
    waiting_incompatible: Vec<u16>,
    /// Its types' names, as many as the bitmaps have.
    types: &'static [&'static str],
}

impl Strategy {
    fn type_name(&self, kind: u32) -> Result<&'static str> {
        self.types.get(kind as usize).copied().with_context(|| {
            format!("a metadata-lock ticket of type {kind}: not a type of its lock")
        })
    }
}

/// What a connection waits for, when it waits for a metadata lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MdlWait {
    /// The lock's namespace (`MDL_key`'s): "TABLE", "SCHEMA", "BACKUP", "USER_LOCK", "FUNCTION", …
    pub namespace: &'static str,
    /// The lock's database (empty for a BACKUP or USER_LOCK lock) and name (a table's, a routine's; a user lock's,
    /// which its key keeps where the database goes; empty for a SCHEMA or BACKUP lock).
    pub db: String,
    pub name: String,
    /// The type of lock the connection waits for ("EXCLUSIVE", "SHARED_READ", "BACKUP_DDL", …).
    pub wanted: &'static str,
    /// Other connections' granted locks that conflict with it: (their THD's address, the type they hold). This and
    /// `queued_behind` are both empty only while the wait is being granted.
    pub holders: Vec<(u64, &'static str)>,
    /// Other connections' pending requests it queues behind (a SELECT behind an ALTER's pending EXCLUSIVE, which
    /// waits too): (their THD's address, the type they wait for).
    pub queued_behind: Vec<(u64, &'static str)>,
}

impl MdlLayout {
    /// The layout of process `pid`, which runs `binary`: its symbols placed where the process maps the binary.
    pub fn of_process(pid: u32, binary: &Path) -> Result<MdlLayout> {
        let file =
            fs::File::open(binary).with_context(|| format!("opening {}", binary.display()))?;
        let mapped = memory::mapped_start(pid, &file)
            .with_context(|| format!("PID {pid} does not map {}", binary.display()))?;
        MdlLayout::at(&file, binary, mapped)
    }

    /// The layout of a process that maps `binary` (opened as `file`) from `mapped`.
    pub fn at(file: &fs::File, binary: &Path, mapped: u64) -> Result<MdlLayout> {
        use symbol::*;
        let missing = |what: String| {
            format!(
                "{} defines no {what}: who holds a metadata lock is not read from memory",
                binary.display()
            )
        };
        let reading = || format!("reading the code of {}", binary.display());
        // Each function, the argument whose field it reads first, and that field's width (0: its address).
        let accessors: [(&str, usize, usize); 9] = [
            (THD_MDL_CONTEXT, 0, 0),
            (OPT_CHANGE_VICTIM_TO, 0, 8),
            (DOWNGRADE_LOCK, 0, 4),
            (LOCK_VISIT_SUBGRAPH, 1, 8),
            (LIST_REMOVE_TICKET, 1, 8),
            (RESCHEDULE_WAITERS, 0, 8),
            (GET_LOCK_OWNER, 2, 1),
            (SP_NAME, 1, 2),
            (LF_HASH_INITIALIZER, 2, 2),
        ];
        let fields = memory::accessor_fields(file, &accessors.map(|(name, arg, _)| (name, arg)))
            .with_context(reading)?;
        let field = |function: &str| {
            let i = accessors
                .iter()
                .position(|a| a.0 == function)
                .expect("listed");
            fields[i]
                .clone()
                .filter(|f| f.width == accessors[i].2)
                .with_context(|| missing(format!("function {function} that reads its field first")))
        };
        let context = field(THD_MDL_CONTEXT)?.offset;
        // m_victim, then its m_waiting_for, then what that points to's vtable.
        let victim = field(OPT_CHANGE_VICTIM_TO)?;
        let waiting_for = match victim.through[..] {
            [waiting_for, 0, ..] => waiting_for,
            _ => anyhow::bail!(missing(format!(
                "function {OPT_CHANGE_VICTIM_TO} that reads what a connection waits for"
            ))),
        };
        // The link's `prev`, after its `next`.
        let link = field(LIST_REMOVE_TICKET)?
            .offset
            .checked_sub(8)
            .with_context(|| missing(format!("function {LIST_REMOVE_TICKET} that reads a link")))?;
        let ticket_lock = memory::returned_field(file, GET_KEY)
            .with_context(reading)?
            .with_context(|| missing(format!("function {GET_KEY} that returns its lock's key")))?;
        let list = |function: &str| -> Result<u64> {
            memory::constant_argument(file, function, REMOVE_TICKET, 2)
                .with_context(reading)?
                .with_context(|| {
                    missing(format!(
                        "function {function} that passes a list of tickets to {REMOVE_TICKET}"
                    ))
                })
        };
        let (granted, waiting) = (list(RELEASE_LOCK)?, list(ACQUIRE_LOCK)?);
        let key_length = field(LF_HASH_INITIALIZER).ok().map(|f| f.offset);
        let key_db_length = field(SP_NAME)?.offset;
        let key_chars = field(GET_LOCK_OWNER)?.offset;
        // The lengths come first, and the characters a few words in (`read_key` reads the key whole).
        ensure!(
            key_length.into_iter().chain([key_db_length]).all(|l| l + 2 <= key_chars)
                && key_chars < 0x100,
            "{} reads a metadata lock's key's lengths at {key_length:?} and {key_db_length:#x}, its characters at \
             {key_chars:#x}: not a key myprobe knows",
            binary.display()
        );
        ensure!(
            granted.abs_diff(waiting) >= 16,
            "{} gives its locks' granted and waiting tickets at {granted:#x} and {waiting:#x}: not two lists",
            binary.display()
        );

        let (words, strategies) = vtables_and_strategies(file, binary, mapped)?;
        Ok(MdlLayout {
            context,
            waiting_for,
            ticket: TicketFields {
                link,
                kind: field(DOWNGRADE_LOCK)?.offset,
                context: field(LOCK_VISIT_SUBGRAPH)?.offset,
                lock: ticket_lock,
            },
            lock: LockFields {
                // `get_key()` returns `m_lock` itself.
                key: 0,
                key_length,
                key_db_length,
                key_chars,
                granted,
                waiting,
                strategy: field(RESCHEDULE_WAITERS)?.offset,
            },
            ticket_word: words[0],
            flush_word: words[1],
            thd_word: words[2],
            strategies,
        })
    }
}

/// The first words of a ticket, a table flush's wait and a THD (their vtables'), and the lock strategies, each with
/// its tables of the types that conflict with a type granted and with one waited for.
fn vtables_and_strategies(
    file: &fs::File,
    binary: &Path,
    mapped: u64,
) -> Result<([u64; 3], Vec<Strategy>)> {
    use symbol::*;
    let missing = |what: String| {
        format!(
            "{} defines no {what}: who holds a metadata lock is not read from memory",
            binary.display()
        )
    };
    let mut names = vec![TICKET_VTABLE, FLUSH_VTABLE, THD_VTABLE];
    names.extend(STRATEGIES.iter().map(|s| s.object));
    let addresses = memory::symbol_addresses(file, mapped, &names)
        .with_context(|| format!("reading the symbols of {}", binary.display()))?;
    let address = |name: &str| {
        let i = names.iter().position(|n| *n == name).expect("listed");
        addresses[i].with_context(|| missing(format!("symbol {name}")))
    };
    let mut tables = vec![NAMESPACE_STAGES];
    tables.extend(STRATEGIES.iter().flat_map(|s| [s.granted, s.waiting]));
    let contents = memory::symbol_contents(file, &tables)
        .with_context(|| format!("reading the symbols of {}", binary.display()))?;
    let content = |name: &str| {
        let i = tables.iter().position(|t| *t == name).expect("listed");
        contents[i]
            .as_deref()
            .with_context(|| missing(format!("table {name}")))
    };
    let stages = content(NAMESPACE_STAGES)?.len();
    ensure!(
        stages == NAMESPACES.len() * STAGE_INFO_SIZE,
        "{} has {stages} bytes of {NAMESPACE_STAGES}, not the {} namespaces of metadata locks myprobe knows: \
         who holds a metadata lock is not read from memory",
        binary.display(),
        NAMESPACES.len()
    );
    let words =
        [TICKET_VTABLE, FLUSH_VTABLE, THD_VTABLE].map(|v| address(v).map(|a| a.wrapping_add(16)));
    let mut strategies = Vec::new();
    for s in &STRATEGIES {
        let bitmap = |name: &str| -> Result<Vec<u16>> {
            Ok(content(name)?
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect())
        };
        let (granted_incompatible, waiting_incompatible) = (bitmap(s.granted)?, bitmap(s.waiting)?);
        let count = granted_incompatible.len();
        ensure!(
            count == waiting_incompatible.len() && (s.fewest..=s.types.len()).contains(&count),
            "{} has {count} lock types in {}, not those myprobe knows: who holds a metadata lock is not \
             read from memory",
            binary.display(),
            s.granted
        );
        strategies.push(Strategy {
            address: address(s.object)?,
            granted_incompatible,
            waiting_incompatible,
            types: &s.types[..count],
        });
    }
    let [ticket, flush, thd] = words;
    Ok(([ticket?, flush?, thd?], strategies))
}

/// Times a wait is read before what was read of it is given (`sessions::read`'s walk is taken as often).
const READS: usize = 3;

/// What connection `thd` (its THD's address) waits for, if it waits for a metadata lock (`None`: it waits for
/// none, or for a table flush). The server changes its locks while they are read: a wait that does not hold
/// together (granted, given up or freed meanwhile) is read again, and so is one that nothing blocks (its blocker
/// just gone, it is being granted), up to three times; one that never holds together is an error, one that nothing
/// blocks is given as read.
pub fn waiting_for(mem: &impl Memory, layout: &MdlLayout, thd: u64) -> Result<Option<MdlWait>> {
    let (mut unblocked, mut failed) = (None, None);
    for _ in 0..READS {
        match read_wait(mem, layout, thd) {
            Ok(Some(wait)) if wait.holders.is_empty() && wait.queued_behind.is_empty() => {
                unblocked = Some(wait)
            }
            Ok(wait) => return Ok(wait),
            Err(e) => failed = Some(e),
        }
    }
    match (unblocked, failed) {
        (Some(wait), _) => Ok(Some(wait)),
        (None, e) => Err(e.expect("read").context(format!(
            "reading what the connection at {thd:#x} waits for: its metadata-lock wait did not hold together in \
             {READS} reads (it changed each time, or the server's objects are not laid out as its code says)"
        ))),
    }
}

/// A ticket as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ticket {
    at: u64,
    context: u64,
    kind: u32,
    lock: u64,
}

fn word(mem: &impl Memory, addr: u64) -> Result<u64> {
    mem.u64_at(addr)
        .with_context(|| format!("the server's memory at {addr:#x} is not readable"))
}

fn read_wait(mem: &impl Memory, layout: &MdlLayout, thd: u64) -> Result<Option<MdlWait>> {
    let context = thd.wrapping_add(layout.context);
    let waits_at = context.wrapping_add(layout.waiting_for);
    let pending = word(mem, waits_at)?;
    if pending == 0 {
        return Ok(None);
    }
    let first = word(mem, pending)?;
    if first == layout.flush_word {
        return Ok(None);
    }
    ensure!(
        first == layout.ticket_word,
        "the connection waits for {pending:#x}, neither a metadata-lock ticket nor a table flush"
    );
    let ticket = read_ticket(mem, layout, pending)?;
    ensure!(
        ticket.context == context,
        "the ticket {pending:#x} the connection waits for is another connection's"
    );
    let lock = ticket.lock;
    let strategy_at = word(mem, lock.wrapping_add(layout.lock.strategy))?;
    let strategy = layout
        .strategies
        .iter()
        .find(|s| s.address == strategy_at)
        .with_context(|| {
            format!("the metadata lock at {lock:#x} has no strategy (being removed)")
        })?;
    let wanted = strategy.type_name(ticket.kind)?;
    let (namespace, db, name) = read_key(mem, layout, lock)?;
    let granted = tickets(mem, layout, lock, layout.lock.granted, strategy)?;
    let waiting = tickets(mem, layout, lock, layout.lock.waiting, strategy)?;
    if !waiting.iter().any(|t| t.at == pending) {
        // Granted: the lock's granter moved it, and the connection, woken, has yet to say it waits no more.
        ensure!(
            granted.iter().any(|t| t.at == pending),
            "the ticket {pending:#x} is in neither of its lock's lists"
        );
        return Ok(None);
    }
    let kind = ticket.kind as usize;
    let holders = owners(
        mem,
        layout,
        strategy,
        conflicting(&granted, context, strategy.granted_incompatible[kind]),
    )?;
    let queued_behind = owners(
        mem,
        layout,
        strategy,
        conflicting(&waiting, context, strategy.waiting_incompatible[kind]),
    )?;
    // Still the same wait, on the same lock: what was read of it is its own.
    ensure!(
        word(mem, waits_at)? == pending
            && word(mem, pending.wrapping_add(layout.ticket.lock))? == lock
            && word(mem, lock.wrapping_add(layout.lock.strategy))? == strategy_at,
        "the connection's metadata-lock wait changed while it was read"
    );
    let (db, name) = if namespace == "USER_LOCK" {
        (String::new(), db)
    } else {
        (db, name)
    };
    Ok(Some(MdlWait {
        namespace,
        db,
        name,
        wanted,
        holders,
        queued_behind,
    }))
}

fn read_ticket(mem: &impl Memory, layout: &MdlLayout, at: u64) -> Result<Ticket> {
    let kind_at = at.wrapping_add(layout.ticket.kind);
    Ok(Ticket {
        at,
        context: word(mem, at.wrapping_add(layout.ticket.context))?,
        kind: mem
            .u32_at(kind_at)
            .with_context(|| format!("the server's memory at {kind_at:#x} is not readable"))?,
        lock: word(mem, at.wrapping_add(layout.ticket.lock))?,
    })
}

/// The tickets of the lock at `lock` in its list at `list` (a circular list, the sentinel node at its start),
/// each checked to be a ticket of this lock, linked both ways, of one of its strategy's types.
fn tickets(
    mem: &impl Memory,
    layout: &MdlLayout,
    lock: u64,
    list: u64,
    strategy: &Strategy,
) -> Result<Vec<Ticket>> {
    let head = lock.wrapping_add(list);
    let mut out = Vec::new();
    let mut node = word(mem, head)?;
    while node != head {
        ensure!(
            out.len() < TICKETS_MAX,
            "the metadata lock at {lock:#x} has a list of tickets that does not end"
        );
        ensure!(
            node % 8 == 0,
            "the metadata lock at {lock:#x} links to {node:#x}, not a ticket"
        );
        let next = word(mem, node)?;
        ensure!(
            word(mem, next.wrapping_add(8))? == node,
            "the metadata lock at {lock:#x} has a list of tickets not linked back at {next:#x}"
        );
        let at = node.wrapping_sub(layout.ticket.link);
        ensure!(
            word(mem, at)? == layout.ticket_word,
            "the metadata lock at {lock:#x} lists {at:#x}, not a ticket"
        );
        let ticket = read_ticket(mem, layout, at)?;
        ensure!(
            ticket.lock == lock,
            "the metadata lock at {lock:#x} lists the ticket {at:#x} of another lock"
        );
        strategy.type_name(ticket.kind)?;
        out.push(ticket);
        node = next;
    }
    Ok(out)
}

/// The tickets of `tickets` not of the context `own` whose type is among `bits` (the types that conflict with
/// the type wanted).
fn conflicting(tickets: &[Ticket], own: u64, bits: u16) -> Vec<Ticket> {
    tickets
        .iter()
        .filter(|t| t.context != own && t.kind < 16 && bits & (1 << t.kind) != 0)
        .copied()
        .collect()
}

/// Each ticket's THD (its context's, checked to be one) and type.
fn owners(
    mem: &impl Memory,
    layout: &MdlLayout,
    strategy: &Strategy,
    tickets: Vec<Ticket>,
) -> Result<Vec<(u64, &'static str)>> {
    tickets
        .into_iter()
        .map(|t| {
            let thd = t.context.wrapping_sub(layout.context);
            ensure!(
                word(mem, thd)? == layout.thd_word,
                "the metadata-lock ticket {:#x} is of {thd:#x}, not a connection",
                t.at
            );
            Ok((thd, strategy.type_name(t.kind)?))
        })
        .collect()
}

/// The namespace, database and name of the key of the lock at `lock`.
fn read_key(
    mem: &impl Memory,
    layout: &MdlLayout,
    lock: u64,
) -> Result<(&'static str, String, String)> {
    let key = lock.wrapping_add(layout.lock.key);
    let f = &layout.lock;
    // The lengths come before the characters (`MdlLayout::at`).
    let bytes = mem
        .bytes(key, f.key_chars as usize + KEY_MAX)
        .with_context(|| format!("the key of the metadata lock at {lock:#x} is not readable"))?;
    let u16_at = |off: u64| {
        let at = off as usize;
        usize::from(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
    };
    let chars = &bytes[f.key_chars as usize..][..KEY_MAX];
    parse_key(chars, u16_at(f.key_db_length), f.key_length.map(u16_at))
        .with_context(|| format!("the key of the metadata lock at {lock:#x}"))
}

/// A key's `m_ptr` (`chars`, the namespace byte, the database, NUL, the name, NUL), given its database's length
/// and, where known, its whole length: the namespace, database and name.
fn parse_key(
    chars: &[u8],
    db_length: usize,
    length: Option<usize>,
) -> Result<(&'static str, String, String)> {
    let namespace = chars
        .first()
        .and_then(|&n| NAMESPACES.get(usize::from(n)))
        .context("not a namespace")?;
    let db = chars.get(1..1 + db_length).context("a database too long")?;
    ensure!(
        !db.contains(&0) && chars.get(1 + db_length) == Some(&0),
        "a database of {db_length} bytes not NUL-terminated"
    );
    let rest = &chars[2 + db_length..];
    let name_length = rest
        .iter()
        .position(|&b| b == 0)
        .context("a name not NUL-terminated")?;
    if let Some(length) = length {
        ensure!(
            length == db_length + name_length + 3,
            "{length} bytes, not those of its database and name"
        );
    }
    Ok((
        namespace,
        String::from_utf8_lossy(db).into_owned(),
        String::from_utf8_lossy(&rest[..name_length]).into_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Memory holding words and bytes where they were put, nothing elsewhere.
    #[derive(Default)]
    struct Fake(BTreeMap<u64, u8>);

    impl Memory for Fake {
        fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
            for (i, b) in buf.iter_mut().enumerate() {
                match self.0.get(&(addr + i as u64)) {
                    Some(&v) => *b = v,
                    None => return i,
                }
            }
            buf.len()
        }
    }

    impl Fake {
        fn put(&mut self, addr: u64, bytes: &[u8]) {
            for (i, &b) in bytes.iter().enumerate() {
                self.0.insert(addr + i as u64, b);
            }
        }

        fn word(&mut self, addr: u64, value: u64) {
            self.put(addr, &value.to_le_bytes());
        }
    }

    const TICKET_VTABLE: u64 = 0x5000;
    const FLUSH_VTABLE: u64 = 0x5100;
    const THD_VTABLE: u64 = 0x5200;
    const OBJECT_STRATEGY: u64 = 0x6000;
    const SCOPED_STRATEGY: u64 = 0x6008;
    const BACKUP_STRATEGY: u64 = 0x6010;

    /// MariaDB 10.11's and 11.8's, with their bitmaps (as both builds have them).
    fn layout() -> MdlLayout {
        let strategy = |address, granted: &[u16], waiting: &[u16], types| Strategy {
            address,
            granted_incompatible: granted.to_vec(),
            waiting_incompatible: waiting.to_vec(),
            types,
        };
        let object = strategy(
            OBJECT_STRATEGY,
            &[
                0, 0x200, 0x200, 0x300, 0x3c0, 0x3a0, 0x310, 0x3b0, 0x3f8, 0x3fe,
            ],
            &[0, 0x200, 0, 0x300, 0x380, 0x200, 0x310, 0x200, 0x200, 0],
            LOCK_TYPES,
        );
        let scoped = strategy(
            SCOPED_STRATEGY,
            &[0x202, 0x201, 0, 0, 0, 0, 0, 0, 0, 0x203],
            &[0x202, 0x200, 0, 0, 0, 0, 0, 0, 0, 0],
            LOCK_TYPES,
        );
        let backup = strategy(
            BACKUP_STRATEGY,
            &[
                0x81f, 0x1, 0x81, 0x481, 0x2681, 0x1780, 0x3780, 0x7e, 0x60, 0x70, 0x878, 0xc1f,
                0x60, 0x50,
            ],
            &[
                0x81e, 0, 0, 0, 0, 0, 0, 0x7e, 0x60, 0x70, 0x878, 0x1, 0x60, 0x50,
            ],
            &BACKUP_TYPES[..14],
        );
        MdlLayout {
            context: 0x160,
            waiting_for: 0x108,
            ticket: TicketFields {
                link: 8,
                kind: 0x30,
                context: 0x38,
                lock: 0x40,
            },
            lock: LockFields {
                // `get_key()` returns `m_lock` itself.
                key: 0,
                key_length: Some(0),
                key_db_length: 2,
                key_chars: 8,
                granted: 0x200,
                waiting: 0x250,
                strategy: 0x2a8,
            },
            ticket_word: TICKET_VTABLE + 16,
            flush_word: FLUSH_VTABLE + 16,
            thd_word: THD_VTABLE + 16,
            strategies: vec![object, scoped, backup],
        }
    }

    /// A server's metadata locks in memory, laid out as `layout()` says.
    struct Server {
        mem: Fake,
        next: u64,
    }

    impl Server {
        fn new() -> Server {
            Server {
                mem: Fake::default(),
                next: 0x10_0000,
            }
        }

        fn alloc(&mut self, size: u64) -> u64 {
            let at = self.next;
            self.next += (size + 0xff) & !0xff;
            at
        }

        /// A THD, waiting for nothing.
        fn thd(&mut self) -> u64 {
            let thd = self.alloc(0x400);
            self.mem.word(thd, THD_VTABLE + 16);
            self.mem.word(thd + 0x160 + 0x108, 0);
            thd
        }

        /// A lock of this key with empty lists.
        fn lock(&mut self, strategy: u64, key: &[u8], db_length: u16) -> u64 {
            let lock = self.alloc(0x2b0);
            self.mem.put(lock, &[0; 0x2b0]);
            self.mem.put(lock, &(key.len() as u16).to_le_bytes());
            self.mem.put(lock + 2, &db_length.to_le_bytes());
            let mut chars = key.to_vec();
            chars.resize(KEY_MAX, 0xaa);
            self.mem.put(lock + 8, &chars);
            for list in [0x200, 0x250] {
                self.mem.word(lock + list, lock + list);
                self.mem.word(lock + list + 8, lock + list);
            }
            self.mem.word(lock + 0x2a8, strategy);
            lock
        }

        /// A ticket of `thd` of this type, at the end of the lock's list at `list`.
        fn ticket(&mut self, thd: u64, lock: u64, kind: u32, list: u64) -> u64 {
            let ticket = self.alloc(0x50);
            self.mem.word(ticket, TICKET_VTABLE + 16);
            self.mem.put(ticket + 0x30, &kind.to_le_bytes());
            self.mem.word(ticket + 0x38, thd + 0x160);
            self.mem.word(ticket + 0x40, lock);
            let head = lock + list;
            let tail = self.mem_word(head + 8);
            let node = ticket + 8;
            self.mem.word(node, head);
            self.mem.word(node + 8, tail);
            self.mem.word(tail, node);
            self.mem.word(head + 8, node);
            ticket
        }

        fn mem_word(&self, addr: u64) -> u64 {
            self.mem.u64_at(addr).unwrap()
        }

        fn waits(&mut self, thd: u64, what: u64) {
            self.mem.word(thd + 0x160 + 0x108, what);
        }

        fn wait(&self, thd: u64) -> Result<Option<MdlWait>> {
            waiting_for(&self.mem, &layout(), thd)
        }
    }

    /// The ALTER, the SELECT behind it and the transaction holding the table: issue's scenario on `mdl.t`.
    #[test]
    fn a_wait_s_holders_and_the_pending_locks_it_queues_behind() {
        let mut s = Server::new();
        let (a, b, c) = (s.thd(), s.thd(), s.thd());
        let t = s.lock(OBJECT_STRATEGY, b"\x02mdl\0t\0", 3);
        // A's SELECT in its transaction (SHARED_READ); B's ALTER holds SHARED_UPGRADABLE and waits for EXCLUSIVE;
        // C's SELECT waits for SHARED_READ behind it.
        s.ticket(a, t, 3, 0x200);
        s.ticket(b, t, 5, 0x200);
        let alter = s.ticket(b, t, 9, 0x250);
        let select = s.ticket(c, t, 3, 0x250);
        s.waits(b, alter);
        s.waits(c, select);
        assert_eq!(s.wait(a).unwrap(), None);
        assert_eq!(
            s.wait(b).unwrap(),
            Some(MdlWait {
                namespace: "TABLE",
                db: "mdl".into(),
                name: "t".into(),
                wanted: "EXCLUSIVE",
                // Its own SHARED_UPGRADABLE is not a holder; C's SHARED_READ is pending, and yields to it.
                holders: vec![(a, "SHARED_READ")],
                queued_behind: vec![],
            })
        );
        assert_eq!(
            s.wait(c).unwrap(),
            Some(MdlWait {
                namespace: "TABLE",
                db: "mdl".into(),
                name: "t".into(),
                wanted: "SHARED_READ",
                // A's SHARED_READ and B's SHARED_UPGRADABLE are compatible with it.
                holders: vec![],
                queued_behind: vec![(b, "EXCLUSIVE")],
            })
        );
    }

    #[test]
    fn a_ticket_granted_before_its_connection_wakes_is_no_longer_waited_for() {
        let mut s = Server::new();
        let b = s.thd();
        let t = s.lock(OBJECT_STRATEGY, b"\x02mdl\0t\0", 3);
        // In the granted list, m_waiting_for not yet cleared.
        let granted = s.ticket(b, t, 9, 0x200);
        s.waits(b, granted);
        assert_eq!(s.wait(b).unwrap(), None);
        // In neither list.
        let lost = s.ticket(b, t, 9, 0x250);
        s.mem.word(t + 0x250, t + 0x250);
        s.mem.word(t + 0x258, t + 0x250);
        s.waits(b, lost);
        let e = s.wait(b).unwrap_err();
        assert!(format!("{e:#}").contains("neither"), "{e:#}");
    }

    #[test]
    fn a_user_lock_s_name_is_its_name() {
        let mut s = Server::new();
        let (a, d) = (s.thd(), s.thd());
        let u = s.lock(OBJECT_STRATEGY, b"\x08u\0\0", 1);
        s.ticket(a, u, 7, 0x200);
        let get_lock = s.ticket(d, u, 7, 0x250);
        s.waits(d, get_lock);
        let wait = s.wait(d).unwrap().unwrap();
        assert_eq!(
            (wait.namespace, &*wait.db, &*wait.name, wait.wanted),
            ("USER_LOCK", "", "u", "SHARED_NO_WRITE")
        );
        assert_eq!(wait.holders, vec![(a, "SHARED_NO_WRITE")]);
    }

    #[test]
    fn a_table_flush_is_not_a_metadata_lock_wait() {
        let mut s = Server::new();
        let thd = s.thd();
        let flush = s.alloc(0x20);
        s.mem.word(flush, FLUSH_VTABLE + 16);
        s.waits(thd, flush);
        assert_eq!(s.wait(thd).unwrap(), None);
        // Anything else is not read as one.
        s.mem.word(flush, 0x1234);
        let e = s.wait(thd).unwrap_err();
        assert!(
            format!("{e:#}").contains("neither a metadata-lock ticket"),
            "{e:#}"
        );
    }

    #[test]
    fn a_list_that_does_not_end_or_does_not_hold_together_is_an_error() {
        let mut s = Server::new();
        let (a, b) = (s.thd(), s.thd());
        let t = s.lock(OBJECT_STRATEGY, b"\x02mdl\0t\0", 3);
        let held = s.ticket(a, t, 3, 0x200);
        let alter = s.ticket(b, t, 9, 0x250);
        s.waits(b, alter);
        assert!(s.wait(b).is_ok());
        // The granted ticket linked to itself: a list that never comes back to its head.
        let node = held + 8;
        s.mem.word(node, node);
        s.mem.word(node + 8, node);
        let e = s.wait(b).unwrap_err();
        assert!(format!("{e:#}").contains("does not end"), "{e:#}");
        // Linked to something else than a ticket.
        let other = s.alloc(0x50);
        s.mem.word(other, 0x77);
        s.mem.word(node, other + 8);
        s.mem.word(other + 8, t + 0x200);
        s.mem.word(other + 16, node);
        s.mem.word(t + 0x208, other + 8);
        let e = s.wait(b).unwrap_err();
        assert!(format!("{e:#}").contains("not a ticket"), "{e:#}");
        // Not linked back.
        s.mem.word(t + 0x208, node);
        let e = s.wait(b).unwrap_err();
        assert!(format!("{e:#}").contains("not linked back"), "{e:#}");
        // Into memory not mapped.
        s.mem.word(node, 0xdead_0000);
        let e = s.wait(b).unwrap_err();
        assert!(format!("{e:#}").contains("not readable"), "{e:#}");
    }

    #[test]
    fn a_lock_being_removed_or_a_ticket_of_another_is_an_error() {
        let mut s = Server::new();
        let (a, b) = (s.thd(), s.thd());
        let t = s.lock(OBJECT_STRATEGY, b"\x02mdl\0t\0", 3);
        s.ticket(a, t, 8, 0x200);
        let wait = s.ticket(b, t, 3, 0x250);
        s.waits(b, wait);
        assert_eq!(
            s.wait(b).unwrap().unwrap().holders,
            vec![(a, "SHARED_NO_READ_WRITE")]
        );
        s.mem.word(t + 0x2a8, 0);
        assert!(format!("{:#}", s.wait(b).unwrap_err()).contains("no strategy"));
        s.mem.word(t + 0x2a8, OBJECT_STRATEGY);
        // The waiting ticket is of another connection.
        s.mem.word(wait + 0x38, a + 0x160);
        assert!(format!("{:#}", s.wait(b).unwrap_err()).contains("another connection"));
        s.mem.word(wait + 0x38, b + 0x160);
        // A holder whose context is in no THD.
        s.mem.word(a, 0);
        assert!(format!("{:#}", s.wait(b).unwrap_err()).contains("not a connection"));
    }

    #[test]
    fn the_backup_lock_s_types_are_its_own() {
        let mut s = Server::new();
        let (f, d) = (s.thd(), s.thd());
        let backup = s.lock(BACKUP_STRATEGY, b"\x00\0\0", 0);
        s.ticket(f, backup, 6, 0x200);
        let ddl = s.ticket(d, backup, 10, 0x250);
        s.waits(d, ddl);
        // FLUSH TABLES WITH READ LOCK's second lock blocks a DDL.
        let wait = s.wait(d).unwrap().unwrap();
        assert_eq!(
            (wait.namespace, &*wait.db, &*wait.name, wait.wanted),
            ("BACKUP", "", "", "BACKUP_DDL")
        );
        assert_eq!(wait.holders, vec![(f, "BACKUP_FTWRL2")]);
        // A type past the build's.
        s.mem.put(ddl + 0x30, &14u32.to_le_bytes());
        assert!(s.wait(d).is_err());
    }

    #[test]
    fn conflicting_tickets_are_those_of_the_bitmap_s_types_and_others() {
        let ticket = |context, kind| Ticket {
            at: 0,
            context,
            kind,
            lock: 0,
        };
        let tickets = [ticket(1, 3), ticket(2, 5), ticket(3, 9), ticket(4, 20)];
        // EXCLUSIVE wanted by 2: every granted type blocks it, but 2's own.
        assert_eq!(
            conflicting(&tickets, 2, 0x3fe),
            vec![ticket(1, 3), ticket(3, 9)]
        );
        assert_eq!(conflicting(&tickets, 9, 1 << 5), vec![ticket(2, 5)]);
        assert_eq!(conflicting(&tickets, 9, 0), vec![]);
    }

    #[test]
    fn keys_are_parsed_and_checked() {
        let key = |bytes: &[u8]| {
            let mut chars = bytes.to_vec();
            chars.resize(KEY_MAX, 0);
            chars
        };
        let ok =
            |ns: &'static str, db: &str, name: &str| Ok((ns, db.to_string(), name.to_string()));
        let parse =
            |bytes: &[u8], db, len| parse_key(&key(bytes), db, len).map_err(|e| e.to_string());
        assert_eq!(
            parse(b"\x02mdl\0t2\0", 3, Some(8)),
            ok("TABLE", "mdl", "t2")
        );
        assert_eq!(parse(b"\x02mdl\0t2\0", 3, None), ok("TABLE", "mdl", "t2"));
        assert_eq!(parse(b"\x01mdl\0\0", 3, Some(6)), ok("SCHEMA", "mdl", ""));
        assert_eq!(parse(b"\x00\0\0", 0, Some(3)), ok("BACKUP", "", ""));
        assert_eq!(
            parse(b"\x04db\0p\xc3\xa9\0", 2, Some(8)),
            ok("PROCEDURE", "db", "p\u{e9}")
        );
        // Not a namespace; a database's length past its NUL or short of it; a length not the key's.
        assert!(parse(b"\x09mdl\0t\0", 3, None).is_err());
        assert!(parse(b"\x02mdl\0t\0", 4, None).is_err());
        assert!(parse(b"\x02mdl\0t\0", 2, None).is_err());
        assert!(parse(b"\x02mdl\0t\0", 3, Some(8)).is_err());
        assert!(parse(b"\x02mdl\0t\0", 500, None).is_err());
        // A name that fills the key with no NUL.
        let mut long = b"\x02d\0".to_vec();
        long.resize(KEY_MAX, b'x');
        assert!(parse_key(&long, 1, None).is_err());
    }
}
