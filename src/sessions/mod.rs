//! The server's connections read from its memory, as gdb would from a core, without asking the server anything:
//! what a hung server, which answers no SQL, is running. Each connection object (`THD`) is found through the
//! list the server keeps of them (`Server::sessions`), checked by its first word (the class's vtable), and its
//! fields are read at the offsets the server's own exported accessors read them at (`thd_get_thread_id`,
//! `thd_query_string`; through the pointers they follow, as `thd_user_name` does its security context's): the
//! binary says where they are, for its own build. What does not hold together (a
//! list that does not end, ids not distinct, a text's pointer outside memory) is said, never shown.

pub mod mdl;
pub mod statements;

use std::{fs, path::Path, sync::Arc};

// Keyed by addresses and ids, which no client chooses: hashed the fast way.
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use anyhow::{bail, ensure, Context, Result};

use crate::{
    collect::threads::ThreadRecord,
    process::memory::{self, Memory, ProcMemory},
    server::{Server, SessionList, TextAccessor},
};

/// A connection as its object holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The object's address.
    pub thd: u64,
    /// The connection id (`CONNECTION_ID()`, PROCESSLIST's `ID`).
    pub id: u64,
    /// The statement it runs, as the server holds it; `None` when it runs none.
    pub query: Option<Query>,
    /// The command it runs (the protocol's name: `Query`, `Execute`, `Sleep`, …), where the layout knows it.
    pub command: Option<&'static str>,
    /// Its default database, where the layout knows it and it has one.
    pub db: Option<Arc<str>>,
    /// When its command began, in microseconds since the epoch (an idle connection's: its last command's), where
    /// the layout knows it.
    pub started_us: Option<u64>,
    /// The user it logged in as, and the host it came from, where the layout knows them and it has them.
    pub user: Option<Arc<str>>,
    pub host: Option<Arc<str>>,
    /// The thread serving it, by its `pthread_self()` (its TLS base: `fs_base` on x86-64), where the layout
    /// knows it and a thread serves it.
    pub thread: Option<u64>,
    /// Whether a transaction of its is open (begun, not yet committed or rolled back), where the layout knows it.
    pub in_transaction: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Query {
    Text(String),
    /// Longer than what is read: its first `TEXT_MAX` bytes.
    Truncated(String),
    /// The connection changed its statement while it was read.
    Changing,
}

/// Most connections walked: past it, the list is taken for not ending.
const SESSIONS_MAX: usize = 200_000;

/// The longest text read of a statement.
pub const TEXT_MAX: usize = 64 * 1024;

/// The longest user or host name read (MariaDB's and MySQL's host names are at most 255 bytes).
const NAME_MAX: usize = 256;

/// Where a process's connections and their fields are.
#[derive(Clone, Debug)]
pub struct Layout {
    list: List,
    /// An object's first word.
    vtable_word: u64,
    id_offset: u64,
    id_width: usize,
    query_offset: u64,
    command_offset: Option<u64>,
    db_offset: Option<u64>,
    started_offset: Option<u64>,
    thread_offset: Option<u64>,
    /// The field that says a transaction is open: its offset, width and bits.
    transaction: Option<(u64, usize, u64)>,
    user: Option<TextField>,
    host: Option<TextField>,
}

/// A text reached from the object through pointers: each at its displacement from the last object reached, the
/// text at `at` in the last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextField {
    pub pointers: Vec<u64>,
    pub at: u64,
    pub form: TextForm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextForm {
    /// A `char *`, NUL-terminated.
    CString,
    /// A `{ const char *str; size_t length; }`.
    StrLen,
}

impl TextField {
    /// Where the accessor `accessor` says its text is, given `field`, what each of its functions reads.
    fn of(
        accessor: &TextAccessor,
        field: impl Fn(&str) -> Option<memory::Field>,
    ) -> Option<TextField> {
        match *accessor {
            // Each read through the last pointer loads the next; the last loads the text's address.
            TextAccessor::CString(f) => {
                let f = field(f).filter(|f| f.width == 8)?;
                let mut reads: Vec<u64> = std::iter::once(f.offset).chain(f.through).collect();
                let at = reads.pop()?;
                Some(TextField {
                    pointers: reads,
                    at,
                    form: TextForm::CString,
                })
            }
            TextAccessor::Through(pointer, text) => {
                let p = field(pointer).filter(|f| f.width == 8)?;
                let t = field(text).filter(|f| f.width == 8)?;
                Some(TextField {
                    pointers: std::iter::once(p.offset).chain(p.through).collect(),
                    at: t.offset,
                    form: TextForm::StrLen,
                })
            }
        }
    }

    fn names(accessor: &TextAccessor) -> Vec<&'static str> {
        match *accessor {
            TextAccessor::CString(f) => vec![f],
            TextAccessor::Through(p, t) => vec![p, t],
        }
    }
}

#[derive(Clone, Debug)]
enum List {
    Linked {
        head: u64,
        next: u64,
        count: Option<u64>,
    },
    Partitioned {
        manager: u64,
        partitions: u64,
        stride: u64,
        inline: u64,
    },
}

impl Layout {
    /// The layout of process `pid`, which runs `binary`, a `server`: its symbols placed where the process maps
    /// the binary.
    pub fn of_process(pid: u32, binary: &Path, server: &dyn Server) -> Result<Layout> {
        let file =
            fs::File::open(binary).with_context(|| format!("opening {}", binary.display()))?;
        let mapped = memory::mapped_start(pid, &file)
            .with_context(|| format!("PID {pid} does not map {}", binary.display()))?;
        Layout::at(&file, binary, mapped, server)
    }

    /// The layout of a process that maps `binary` (opened as `file`) from `mapped`.
    pub fn at(file: &fs::File, binary: &Path, mapped: u64, server: &dyn Server) -> Result<Layout> {
        let spec = server.sessions();
        let (list_symbol, count_symbol) = match spec.list {
            SessionList::Linked { head, count, .. } => (head, count),
            SessionList::Partitioned { manager, .. } => (manager, None),
        };
        let names = [
            list_symbol,
            spec.vtable,
            count_symbol.unwrap_or(list_symbol),
        ];
        let found = memory::symbol_addresses(file, mapped, &names)
            .with_context(|| format!("reading the symbols of {}", binary.display()))?;
        let symbol = |i: usize| {
            found[i].with_context(|| {
                format!(
                    "{} defines no symbol {}: its connections cannot be found in its memory",
                    binary.display(),
                    names[i]
                )
            })
        };
        let (list_at, vtable) = (symbol(0)?, symbol(1)?);
        // Every accessor decoded in one parse of the binary: the id and the statement first, which are needed;
        // then the command, its start, the database, the user, the host and whether a transaction is open, which
        // are not (`Layout::unknown` says what is missing).
        let mut accessors: Vec<(&str, usize)> = [
            spec.id,
            spec.query,
            spec.command,
            spec.started,
            spec.transaction.0,
        ]
        .into_iter()
        .map(|name| (name, 0))
        .chain(spec.db)
        .collect();
        accessors.extend(
            TextField::names(&spec.user)
                .into_iter()
                .map(|name| (name, 0)),
        );
        accessors.extend(
            TextField::names(&spec.host)
                .into_iter()
                .map(|name| (name, 0)),
        );
        let fields = memory::accessor_fields(file, &accessors)
            .with_context(|| format!("reading the code of {}", binary.display()))?;
        let by_name = |name: &str| {
            let i = accessors.iter().position(|(a, _)| *a == name)?;
            fields[i].clone()
        };
        let needed = |name: &str| {
            by_name(name).with_context(|| {
                format!(
                    "{} has no function {name} that reads a field of its argument: where its connections keep \
                     it is not known",
                    binary.display(),
                )
            })
        };
        let memory::Field {
            offset: id_offset,
            width: id_width,
            ..
        } = needed(spec.id)?;
        ensure!(
            matches!(id_width, 4 | 8),
            "{} reads a connection id of {id_width} bytes: not one myprobe knows",
            spec.id
        );
        let query_offset = needed(spec.query)?.offset;
        let of_width =
            |name: &str, width: usize| by_name(name).filter(|f| f.width == width).map(|f| f.offset);
        let db = spec
            .db
            .and_then(|(name, _)| by_name(name))
            .map(|f| f.offset);
        let user = TextField::of(&spec.user, by_name);
        let host = TextField::of(&spec.host, by_name);
        let transaction = by_name(spec.transaction.0)
            .filter(|f| matches!(f.width, 4 | 8))
            .map(|f| (f.offset, f.width, spec.transaction.1));
        let (method, callee) = spec.thread;
        let thread = memory::stored_call_result(file, method, callee)
            .with_context(|| format!("reading the code of {}", binary.display()))?;
        Ok(Layout::new(
            &spec.list,
            list_at,
            vtable,
            (id_offset, id_width),
            query_offset,
        )
        .with_fields(of_width(spec.command, 4), of_width(spec.started, 8), db)
        .with_names(user, host)
        .with_thread(thread)
        .with_transaction(transaction)
        .with_count(count_symbol.and(found[2])))
    }

    /// The same, with the variable that counts a linked list's objects at this address, where known.
    pub fn with_count(mut self, at: Option<u64>) -> Layout {
        if let List::Linked { count, .. } = &mut self.list {
            *count = at;
        }
        self
    }

    /// The same, with whether a transaction is open in the field at this offset, of this width, where these bits
    /// are set, where known.
    pub fn with_transaction(mut self, transaction: Option<(u64, usize, u64)>) -> Layout {
        self.transaction = transaction;
        self
    }

    /// The same, with the serving thread's `pthread_self()` at this offset, where known.
    pub fn with_thread(mut self, thread: Option<u64>) -> Layout {
        self.thread_offset = thread;
        self
    }

    /// The same, with the command (32 bits), its start (`{ seconds; microseconds }`) and the database
    /// (`{ str, length }`) at these offsets, where known.
    pub fn with_fields(
        mut self,
        command: Option<u64>,
        started: Option<u64>,
        db: Option<u64>,
    ) -> Layout {
        (self.command_offset, self.started_offset, self.db_offset) = (command, started, db);
        self
    }

    /// The same, with the user and the client's host where these say.
    pub fn with_names(mut self, user: Option<TextField>, host: Option<TextField>) -> Layout {
        (self.user, self.host) = (user, host);
        self
    }

    /// What this layout cannot read of a connection, in a line (`None`: everything shown).
    pub fn unknown(&self) -> Option<String> {
        let missing: Vec<&str> = [
            self.command_offset.is_none().then_some("command"),
            self.started_offset.is_none().then_some("command's start"),
            self.db_offset.is_none().then_some("database"),
            self.user.is_none().then_some("user"),
            self.host.is_none().then_some("host"),
            self.transaction.is_none().then_some("transaction"),
        ]
        .into_iter()
        .flatten()
        .collect();
        (!missing.is_empty()).then(|| {
            format!(
                "the server exports no function that reads its connections' {}: not shown",
                missing.join(" or ")
            )
        })
    }

    /// The layout of `list` at `list_at` (its head, or the variable holding its manager's address), of objects
    /// whose vtable is at `vtable`, with the id (offset, width) and the statement's `{ str, length }` at
    /// `query_offset`.
    pub fn new(
        list: &SessionList,
        list_at: u64,
        vtable: u64,
        (id_offset, id_width): (u64, usize),
        query_offset: u64,
    ) -> Layout {
        let list = match *list {
            SessionList::Linked { next, .. } => List::Linked {
                head: list_at,
                next,
                count: None,
            },
            SessionList::Partitioned {
                partitions,
                stride,
                inline,
                ..
            } => List::Partitioned {
                manager: list_at,
                partitions,
                stride,
                inline,
            },
        };
        Layout {
            list,
            vtable_word: vtable.wrapping_add(16),
            id_offset,
            id_width,
            query_offset,
            command_offset: None,
            db_offset: None,
            started_offset: None,
            thread_offset: None,
            transaction: None,
            user: None,
            host: None,
        }
    }
}

/// Where a thread finds the statement it runs in its connection object: the id's offset and width, the statement's
/// `{ str, length }` and its start's `{ seconds; microseconds }`; `None` where the start is not known.
pub struct StatementFields {
    pub id: (u64, usize),
    pub query: u64,
    pub started: u64,
}

impl Layout {
    /// What a thread's connection object says of the statement it runs (src/bpf/statement.h reads it).
    pub fn statement_fields(&self) -> Option<StatementFields> {
        Some(StatementFields {
            id: (self.id_offset, self.id_width),
            query: self.query_offset,
            started: self.started_offset?,
        })
    }
}

/// The user and the database of the connection `id` whose object is at `thd`, where the layout knows them and
/// the object still holds that connection; `None` where it does not.
pub fn user_and_db(
    mem: &impl Memory,
    layout: &Layout,
    thd: u64,
    id: u64,
) -> Option<(Option<String>, Option<String>)> {
    let held = mem.bytes(thd.wrapping_add(layout.id_offset), layout.id_width)?;
    let mut word = [0u8; 8];
    word[..held.len()].copy_from_slice(&held);
    if u64::from_le_bytes(word) != id || mem.u64_at(thd) != Some(layout.vtable_word) {
        return None;
    }
    let user = layout.user.as_ref().and_then(|f| name(mem, thd, f));
    let db = layout
        .db_offset
        .and_then(|o| query(mem, thd.wrapping_add(o)).ok().flatten())
        .and_then(|q| match q {
            Query::Text(t) => Some(t),
            _ => None,
        });
    Some((user, db))
}

/// Every connection of process `pid`, read from `/proc/PID/mem` (see [`read`]).
pub fn read_process(pid: u32, layout: &Layout) -> Result<Vec<Session>> {
    read(&ProcMemory::open(pid)?, layout)
}

/// The thread serving each connection of `sessions` that one serves, by the object's address: the one of
/// `threads` whose thread pointer the connection keeps.
pub fn serving_threads<'a>(
    sessions: &[Session],
    threads: &'a [ThreadRecord],
) -> HashMap<u64, &'a ThreadRecord> {
    let by_tls: HashMap<u64, &ThreadRecord> = threads
        .iter()
        .filter(|t| t.tls_base != 0)
        .map(|t| (t.tls_base, t))
        .collect();
    sessions
        .iter()
        .filter_map(|s| Some((s.thd, *by_tls.get(&s.thread?)?)))
        .collect()
}

/// Every connection of the process whose memory is `mem`. A running server changes its list while it is read:
/// a walk that does not hold together is taken again, up to three times.
pub fn read(mem: &impl Memory, layout: &Layout) -> Result<Vec<Session>> {
    read_wanted(mem, layout, &mut Walk::default(), |_| false, |_| true)
}

/// What a reading of the connections keeps for the next (the history reads them each second): the objects in the
/// list's order, so that a linked list is checked in one gather of its links rather than followed link by link
/// (and not at all while its marks hold); each connection's user and host, which it keeps while it lasts, and its
/// database; and each object's thread, and which were idle.
#[derive(Default)]
pub struct Walk {
    list: Vec<u64>,
    names: HashMap<u64, Names>,
    /// The thread serving each object, where read.
    threads: HashMap<u64, u64>,
    /// The objects not chosen last time: their words cannot have changed while their thread has not run.
    idle: HashSet<u64>,
    /// A linked list's marks before it was read last, and how many readings since it was walked link by link.
    marks: Option<Marks>,
    unwalked: u32,
    /// The database of each connection read last, by object, with its id and the database's `{ str, length }`: read
    /// again only when either changes.
    dbs: HashMap<u64, (u64, Pair, Arc<str>)>,
}

impl Walk {
    /// The threads known to serve the connections, by their thread pointers.
    pub fn serving(&self) -> impl Iterator<Item = u64> + '_ {
        self.threads.values().copied()
    }
}

/// A connection's user and host as read last, by its object: kept while the object holds the same id, and the
/// same first pointers to them where those are read (a COM_CHANGE_USER changes them).
struct Names {
    id: u64,
    pointers: (Option<u64>, Option<u64>),
    user: Option<Arc<str>>,
    host: Option<Arc<str>>,
}

/// What a connection's object says in a few words: enough to choose the connections read whole.
#[derive(Clone, Copy, Debug)]
pub struct Brief {
    /// Its command, where the layout knows it.
    pub command: Option<&'static str>,
    /// Whether it holds a statement's text.
    pub has_query: bool,
    pub in_transaction: Option<bool>,
}

/// The connections of the process whose memory is `mem` for which `wanted` holds, each read whole; the others
/// in a few words each (what a second's sample of a thousand idle connections can afford), and not at all where
/// they were not wanted at the last reading and their thread has not run since (`still`, given its pointer). The
/// words of every object, then the fields of those read whole, then their texts, are each read in one gather.
pub fn read_wanted(
    mem: &impl Memory,
    layout: &Layout,
    walk: &mut Walk,
    still: impl Fn(u64) -> bool,
    wanted: impl Fn(&Brief) -> bool,
) -> Result<Vec<Session>> {
    let mut last = None;
    for _ in 0..3 {
        match read_once(mem, layout, walk, &still, &wanted) {
            Ok(s) => return Ok(s),
            Err(e) => {
                // Walked again, and every object read again.
                walk.list.clear();
                walk.idle.clear();
                walk.marks = None;
                last = Some(e);
            }
        }
    }
    Err(last.expect("tried"))
}

/// A `{ str, length }`, or a `{ seconds; microseconds }`.
type Pair = (u64, u64);

/// Fields of objects, each at its offset and of its width, read in one gather: those near one another in one piece.
#[derive(Default)]
struct Fields(Vec<(u64, usize)>);

/// Fields closer than this are read as one piece: each piece costs a walk of the page tables, the bytes between
/// next to nothing.
const PIECE_GAP: u64 = 256;

impl Fields {
    /// Adds a field: its index among them.
    fn add(&mut self, offset: u64, width: usize) -> usize {
        self.0.push((offset, width));
        self.0.len() - 1
    }

    /// These fields of each of `objects`.
    fn of(&self, mem: &impl Memory, objects: &[u64]) -> Read {
        let mut order: Vec<usize> = (0..self.0.len()).collect();
        order.sort_by_key(|&f| self.0[f].0);
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        let mut at = vec![(0, 0); self.0.len()];
        for f in order {
            let (offset, width) = self.0[f];
            let end = offset.saturating_add(width as u64);
            let n = pieces.len();
            match pieces.last_mut() {
                Some((start, last)) if offset <= last.saturating_add(PIECE_GAP) => {
                    *last = (*last).max(end);
                    at[f] = (n - 1, (offset - *start) as usize);
                }
                _ => {
                    pieces.push((offset, end));
                    at[f] = (pieces.len() - 1, 0);
                }
            }
        }
        let reads: Vec<(u64, usize)> = objects
            .iter()
            .flat_map(|&o| {
                pieces
                    .iter()
                    .map(move |&(start, end)| (o.wrapping_add(start), (end - start) as usize))
            })
            .collect();
        Read {
            got: mem.gather(&reads),
            pieces: pieces.len(),
            at: at
                .into_iter()
                .zip(&self.0)
                .map(|((piece, delta), &(_, width))| (piece, delta, width))
                .collect(),
        }
    }
}

struct Read {
    got: memory::Gathered,
    pieces: usize,
    /// Each field's piece, where it is in it, and its width.
    at: Vec<(usize, usize, usize)>,
}

impl Read {
    fn bytes(&self, object: usize, field: usize) -> Option<&[u8]> {
        let (piece, delta, width) = self.at[field];
        self.got
            .get(object * self.pieces + piece)?
            .get(delta..delta + width)
    }

    /// A field of 4 or 8 bytes.
    fn word(&self, object: usize, field: usize) -> Option<u64> {
        let (piece, delta, width) = self.at[field];
        self.got.word(object * self.pieces + piece, delta, width)
    }

    /// A `{ str, length }` (or `{ seconds; microseconds }`) field.
    fn pair(&self, object: usize, field: usize) -> Option<(u64, u64)> {
        let b = self.bytes(object, field)?;
        Some((
            u64::from_le_bytes(b.get(..8)?.try_into().ok()?),
            u64::from_le_bytes(b.get(8..16)?.try_into().ok()?),
        ))
    }
}

/// A connection chosen: its object, where it is among those whose fields were read, what a few words of it say,
/// and its statement's `{ str, length }`.
type Chosen = (u64, usize, Brief, Pair);

/// A linked list's marks, read before the list: its first object, where its last one links to the end, and the
/// count of objects made and not yet destroyed. Marks that did not change leave one change of the list unseen: an
/// object that ended and a new one made at its address, in its place. The thread of the one that ended ran (to end
/// it, and ended or served another), so that object is read again.
type Marks = (u64, u64, u64);

/// A list whose marks stay the same is still walked link by link once in this many readings.
const WALK_EVERY: u32 = 10;

fn marks(mem: &impl Memory, layout: &Layout) -> Option<Marks> {
    let List::Linked {
        head,
        count: Some(count),
        ..
    } = layout.list
    else {
        return None;
    };
    let got = mem.gather(&[(head, 24), (count, 4)]);
    Some((got.word(0, 0, 8)?, got.word(0, 16, 8)?, got.word(1, 0, 4)?))
}

/// The fields read of each object not left as it was, by their index among `Fields`: those that check it is one
/// and choose it, and the others of those chosen (read with them: a piece costs more than its bytes).
struct Each {
    vtable: usize,
    link: Option<usize>,
    query: usize,
    command: Option<usize>,
    transaction: Option<usize>,
    id: usize,
    db: Option<usize>,
    started: Option<usize>,
    thread: Option<usize>,
}

impl Each {
    fn of(layout: &Layout) -> (Fields, Each) {
        let mut f = Fields::default();
        let each = Each {
            vtable: f.add(0, 8),
            link: match layout.list {
                List::Linked { next, .. } => Some(f.add(next, 8)),
                List::Partitioned { .. } => None,
            },
            query: f.add(layout.query_offset, 16),
            command: layout.command_offset.map(|o| f.add(o, 4)),
            transaction: layout.transaction.map(|(o, w, _)| f.add(o, w)),
            id: f.add(layout.id_offset, layout.id_width),
            db: layout.db_offset.map(|o| f.add(o, 16)),
            started: layout.started_offset.map(|o| f.add(o, 16)),
            thread: layout.thread_offset.map(|o| f.add(o, 8)),
        };
        (f, each)
    }
}

/// What `choose` found: the list, and those of its objects `wanted` chooses, with the fields read of them.
struct Choice {
    list: Listed,
    chosen: Vec<Chosen>,
    fields: Read,
}

/// The objects of the list; those `wanted` does not choose; the list's marks, and whether it was walked link by link.
struct Listed {
    thds: Vec<u64>,
    idle: HashSet<u64>,
    marks: Option<Marks>,
    walked: bool,
}

/// The objects of the list, those of them `wanted` chooses, and those it does not.
fn choose(
    mem: &impl Memory,
    layout: &Layout,
    walk: &Walk,
    still: &impl Fn(u64) -> bool,
    wanted: &impl Fn(&Brief) -> bool,
) -> Result<(Choice, Each)> {
    // The fields of each object, with its link in a linked list, which checks the list walked last. Of an object
    // left as it was, its link alone, and not even that while the list's marks stay the same.
    let (fields, each) = Each::of(layout);
    let mut link_only = Fields::default();
    let end = match layout.list {
        List::Linked { next, head, .. } => {
            link_only.add(next, 8);
            head.wrapping_add(8)
        }
        List::Partitioned { .. } => 0,
    };
    let marks = marks(mem, layout);
    let left =
        |thd: &u64| walk.idle.contains(thd) && walk.threads.get(thd).is_some_and(|&t| still(t));
    let split = |list: &[u64]| -> (Vec<u64>, Vec<u64>) { list.iter().partition(|t| left(t)) };
    // The objects walked last, left or read, and where each is among those of its kind.
    let (mut last_left, mut last_read) = (Vec::new(), Vec::new());
    let place: Vec<(bool, usize)> = walk
        .list
        .iter()
        .map(|&t| {
            let is_left = left(&t);
            let kind = if is_left {
                &mut last_left
            } else {
                &mut last_read
            };
            kind.push(t);
            (is_left, kind.len() - 1)
        })
        .collect();
    let last_read_fields = each
        .link
        .filter(|_| !walk.list.is_empty())
        .map(|_| fields.of(mem, &last_read));
    // The marks as they were: the list as walked, where each object read links to the one after it.
    let kept = marks.is_some() && marks == walk.marks && walk.unwalked < WALK_EVERY;
    let holds = kept
        && last_read_fields.as_ref().is_some_and(|b| {
            place.iter().enumerate().all(|(k, &(was_left, p))| {
                let after = walk.list.get(k + 1).copied().unwrap_or(end);
                was_left || each.link.and_then(|f| b.word(p, f)) == Some(after)
            })
        });
    let (thds, left_now, read, got, walked) = match last_read_fields {
        Some(b) if holds => (walk.list.clone(), last_left, last_read, b, false),
        last_read_fields => {
            let links = last_read_fields
                .as_ref()
                .map(|_| link_only.of(mem, &last_left));
            let thds = objects(mem, layout, &walk.list, |k| match place[k] {
                (true, p) => links.as_ref()?.word(p, 0),
                (false, p) => last_read_fields.as_ref()?.word(p, each.link?),
            })?;
            match last_read_fields {
                Some(b) if thds == walk.list => (thds, last_left, last_read, b, true),
                _ => {
                    let (l, r) = split(&thds);
                    let b = fields.of(mem, &r);
                    (thds, l, r, b, true)
                }
            }
        }
    };
    let mut idle: HashSet<u64> = left_now.into_iter().collect();
    let mut chosen = Vec::new();
    for (i, &thd) in read.iter().enumerate() {
        ensure!(
            got.word(i, each.vtable) == Some(layout.vtable_word),
            "the list of connections holds {thd:#x}, which is not a connection"
        );
        let statement = got.pair(i, each.query);
        let b = Brief {
            command: each.command.and_then(|f| command_named(got.word(i, f)?)),
            has_query: statement.is_some_and(|(p, _)| p != 0),
            in_transaction: each.transaction.and_then(|f| {
                let bits = layout.transaction?.2;
                Some(got.word(i, f)? & bits != 0)
            }),
        };
        if !wanted(&b) {
            idle.insert(thd);
            continue;
        }
        let statement = statement.with_context(|| {
            format!(
                "a connection's text at {:#x} is not readable",
                thd.wrapping_add(layout.query_offset)
            )
        })?;
        chosen.push((thd, i, b, statement));
    }
    let choice = Choice {
        list: Listed {
            thds,
            idle,
            marks,
            walked,
        },
        chosen,
        fields: got,
    };
    Ok((choice, each))
}

fn read_once(
    mem: &impl Memory,
    layout: &Layout,
    walk: &mut Walk,
    still: &impl Fn(u64) -> bool,
    wanted: &impl Fn(&Brief) -> bool,
) -> Result<Vec<Session>> {
    let (
        Choice {
            list,
            chosen,
            fields,
        },
        each,
    ) = choose(mem, layout, walk, still, wanted)?;
    let objects: Vec<u64> = chosen.iter().map(|&(thd, ..)| thd).collect();
    // Their statements' texts, and their databases' where not kept, then their `{ str, length }` again, to see they
    // held still.
    let pairs: Vec<(Pair, Option<Pair>)> = chosen
        .iter()
        .map(|&(_, i, _, q)| (q, each.db.and_then(|f| fields.pair(i, f))))
        .collect();
    let ids: Vec<Option<u64>> = chosen
        .iter()
        .map(|&(_, i, ..)| fields.word(i, each.id))
        .collect();
    read_names(mem, layout, walk, &objects, &ids, list.walked);
    let kept_db = |n: usize, d: Option<Pair>| {
        walk.dbs
            .get(&objects[n])
            .filter(|(id, p, _)| Some(*id) == ids[n] && Some(*p) == d)
            .map(|(.., name)| name)
    };
    let text_read = |p: Option<Pair>| {
        p.filter(|&(at, len)| at != 0 && len != 0)
            .map_or((0, 0), text_span)
    };
    let texts = mem.gather(
        &pairs
            .iter()
            .enumerate()
            .flat_map(|(n, &(q, d))| {
                let db = if kept_db(n, d).is_some() { None } else { d };
                [text_read(Some(q)), text_read(db)]
            })
            .collect::<Vec<_>>(),
    );
    let mut again = Fields::default();
    again.add(layout.query_offset, 16);
    if let Some(o) = layout.db_offset {
        again.add(o, 16);
    }
    let again = again.of(mem, &objects);
    let mut distinct = HashSet::default();
    let mut out = Vec::with_capacity(chosen.len());
    let mut dbs = HashMap::default();
    for (n, &(thd, i, b, _)) in chosen.iter().enumerate() {
        let (q, d) = pairs[n];
        let id = ids[n].with_context(|| format!("the connection at {thd:#x} is not readable"))?;
        ensure!(
            distinct.insert(id),
            "two connections have the id {id}: their objects are not laid out as the accessors say"
        );
        let query = text_of(q, texts.get(2 * n), again.pair(n, 0))?;
        let db = match d.filter(|&(at, len)| at != 0 && len != 0) {
            Some(d) if again.pair(n, 1) != Some(d) => None,
            Some(d) => match kept_db(n, Some(d)) {
                Some(name) => Some(name.clone()),
                None => match text_of(d, texts.get(2 * n + 1), Some(d))? {
                    Some(Query::Text(db)) => Some(Arc::from(db)),
                    _ => None,
                },
            },
            None => None,
        };
        if let (Some(d), Some(name)) = (d, &db) {
            dbs.insert(thd, (id, d, name.clone()));
        }
        let (user_name, host_name) = walk
            .names
            .get(&thd)
            .map_or((None, None), |n| (n.user.clone(), n.host.clone()));
        out.push(Session {
            thd,
            id,
            query,
            command: b.command,
            db,
            started_us: each
                .started
                .and_then(|f| fields.pair(i, f))
                .and_then(|(secs, micros)| started_time(secs, micros)),
            user: user_name,
            host: host_name,
            // 0 while no thread serves it (MySQL's restore_globals clears it).
            thread: each
                .thread
                .and_then(|f| fields.word(i, f))
                .filter(|&t| t != 0),
            in_transaction: b.in_transaction,
        });
    }
    walk.dbs = dbs;
    remember(mem, layout, walk, list, &out);
    Ok(out)
}

/// The user and host of each of `objects` (whose ids are `ids`) whose object holds another connection than at the
/// last reading, or, at a reading that walked the list (`check`), whose first pointers to them changed: each
/// connection's names are read once, and checked once in `WALK_EVERY` readings.
fn read_names(
    mem: &impl Memory,
    layout: &Layout,
    walk: &mut Walk,
    objects: &[u64],
    ids: &[Option<u64>],
    check: bool,
) {
    let (to_read, to_ids): (Vec<u64>, Vec<u64>) = objects
        .iter()
        .zip(ids)
        .filter_map(|(&thd, &id)| Some((thd, id?)))
        .filter(|&(thd, id)| check || walk.names.get(&thd).is_none_or(|n| n.id != id))
        .unzip();
    let first_pointer = |t: &TextField| t.pointers.first().copied().unwrap_or(t.at);
    let mut fields = Fields::default();
    let user = layout
        .user
        .as_ref()
        .map(|t| fields.add(first_pointer(t), 8));
    let host = layout
        .host
        .as_ref()
        .map(|t| fields.add(first_pointer(t), 8));
    let read = fields.of(mem, &to_read);
    for (i, (&thd, &id)) in to_read.iter().zip(&to_ids).enumerate() {
        let pointers = (
            user.and_then(|f| read.word(i, f)),
            host.and_then(|f| read.word(i, f)),
        );
        if walk
            .names
            .get(&thd)
            .is_some_and(|n| n.id == id && n.pointers == pointers)
        {
            continue;
        }
        let names = Names {
            id,
            pointers,
            user: layout
                .user
                .as_ref()
                .and_then(|f| name(mem, thd, f))
                .map(Arc::from),
            host: layout
                .host
                .as_ref()
                .and_then(|f| name(mem, thd, f))
                .map(Arc::from),
        };
        walk.names.insert(thd, names);
    }
}

/// Keeps what the next reading reuses: the list, its marks, the idle objects, and each object's thread.
fn remember(mem: &impl Memory, layout: &Layout, walk: &mut Walk, list: Listed, read: &[Session]) {
    let live: HashSet<u64> = list.thds.iter().copied().collect();
    walk.names.retain(|thd, _| live.contains(thd));
    walk.threads.retain(|thd, _| live.contains(thd));
    for s in read {
        match s.thread {
            Some(t) => walk.threads.insert(s.thd, t),
            None => walk.threads.remove(&s.thd),
        };
    }
    learn_threads(mem, layout, walk, &list.idle);
    walk.idle = list.idle;
    walk.list = list.thds;
    walk.marks = list.marks;
    walk.unwalked = if list.walked { 0 } else { walk.unwalked + 1 };
}

/// The serving thread of each of `idle` whose thread is not known yet, read once: it serves the connection until
/// it ends (a thread of a pool serves many: it does not wait on one connection's socket, see `read_wanted`'s
/// caller).
fn learn_threads(mem: &impl Memory, layout: &Layout, walk: &mut Walk, idle: &HashSet<u64>) {
    let Some(offset) = layout.thread_offset else {
        return;
    };
    let unknown: Vec<u64> = idle
        .iter()
        .filter(|t| !walk.threads.contains_key(t))
        .copied()
        .collect();
    let mut field = Fields::default();
    field.add(offset, 8);
    let read = field.of(mem, &unknown);
    for (i, &thd) in unknown.iter().enumerate() {
        if let Some(t) = read.word(i, 0).filter(|&t| t != 0) {
            walk.threads.insert(thd, t);
        }
    }
}

/// The addresses of the connection objects, each once. A linked list walked before (`last`) is checked by the
/// links already read of it (`link_of`: the next of `last[k]`), and walked link by link only past where it changed.
fn objects(
    mem: &impl Memory,
    layout: &Layout,
    last: &[u64],
    link_of: impl Fn(usize) -> Option<u64>,
) -> Result<Vec<u64>> {
    let word = |addr: u64| {
        mem.u64_at(addr)
            .with_context(|| format!("the server's memory at {addr:#x} is not readable"))
    };
    let mut thds = Vec::new();
    match layout.list {
        List::Linked { head, next, .. } => {
            let end = head.wrapping_add(8);
            let mut at = word(head)?;
            for (k, &thd) in last.iter().enumerate() {
                let Some(after) = link_of(k).filter(|_| at == thd) else {
                    break;
                };
                thds.push(thd);
                at = after;
            }
            while at != end {
                ensure!(
                    thds.len() < SESSIONS_MAX,
                    "the list of connections does not end"
                );
                thds.push(at);
                at = word(at.wrapping_add(next))?;
            }
        }
        List::Partitioned {
            manager,
            partitions,
            stride,
            inline,
        } => {
            let manager = word(manager)?;
            ensure!(manager != 0, "the server has no list of connections yet");
            for part in 0..partitions {
                let array = manager.wrapping_add(part * stride);
                let inline_count = mem
                    .u32_at(array.wrapping_add(4))
                    .context("the list of connections is not readable")?
                    as i32;
                let (first, count) = match u64::try_from(inline_count) {
                    Ok(n) if n <= inline => (array.wrapping_add(8), n),
                    Ok(n) => bail!("{n} connections inline, past the {inline} an array holds"),
                    Err(_) => (word(array.wrapping_add(8))?, word(array.wrapping_add(16))?),
                };
                ensure!(
                    count <= (SESSIONS_MAX - thds.len()) as u64,
                    "{count} connections in one part of the list: not a count"
                );
                let bytes = mem
                    .bytes(first, count as usize * 8)
                    .context("the list of connections is not readable")?;
                thds.extend(
                    bytes
                        .chunks_exact(8)
                        .map(|w| u64::from_le_bytes(w.try_into().unwrap())),
                );
            }
        }
    }
    let mut seen = HashSet::default();
    for &thd in &thds {
        ensure!(
            seen.insert(thd),
            "the list of connections holds {thd:#x} twice"
        );
    }
    Ok(thds)
}

fn command_named(word: u64) -> Option<&'static str> {
    u8::try_from(word)
        .ok()
        .map(crate::wire::protocol::command_name)
}

/// Where a text whose `{ str, length }` is `pair` is read: all of it, or its first `TEXT_MAX` bytes.
fn text_span((str_at, len): Pair) -> (u64, usize) {
    (
        str_at,
        usize::try_from(len).unwrap_or(usize::MAX).min(TEXT_MAX),
    )
}

/// A text from its `{ str, length }` (`pair`), its bytes (`bytes`: `None` where not readable) and the pair read
/// again after them (`again`): `Changing` where the connection changed it meanwhile.
fn text_of(
    (str_at, len): (u64, u64),
    bytes: Option<&[u8]>,
    again: Option<(u64, u64)>,
) -> Result<Option<Query>> {
    if str_at == 0 || len == 0 {
        return Ok(None);
    }
    let again = again.context("a connection's text is not readable")?;
    let Some(bytes) = bytes else {
        // Freed between the reads, or not a text at all.
        ensure!(
            again != (str_at, len),
            "a connection's text at {str_at:#x} is not in memory"
        );
        return Ok(Some(Query::Changing));
    };
    if again != (str_at, len) {
        return Ok(Some(Query::Changing));
    }
    let text = String::from_utf8_lossy(bytes).into_owned();
    Ok(Some(if bytes.len() as u64 == len {
        Query::Text(text)
    } else {
        Query::Truncated(text)
    }))
}

/// The wall-clock time `{ seconds; microseconds }`, in microseconds; `None` unless it is one (a command not yet
/// begun is 0).
fn started_time(secs: u64, micros: u64) -> Option<u64> {
    // 2001 to 2286: a time, not another field.
    ((1_000_000_000..10_000_000_000).contains(&secs) && micros < 1_000_000)
        .then(|| secs * 1_000_000 + micros)
}

/// A user's or host's name at `field` of the object at `thd`; `None` where a pointer is null, or the name is not
/// one (unreadable, unterminated, longer than `NAME_MAX`, or with control characters).
fn name(mem: &impl Memory, thd: u64, field: &TextField) -> Option<String> {
    let mut object = thd;
    for &d in &field.pointers {
        object = mem.u64_at(object.wrapping_add(d)).filter(|&p| p != 0)?;
    }
    let at = object.wrapping_add(field.at);
    let bytes = match field.form {
        TextForm::StrLen => match query(mem, at).ok()?? {
            Query::Text(t) if t.len() <= NAME_MAX => t.into_bytes(),
            _ => return None,
        },
        TextForm::CString => {
            let str_at = mem.u64_at(at).filter(|&p| p != 0)?;
            let mut buf = vec![0u8; NAME_MAX + 1];
            let n = mem.read(str_at, &mut buf);
            let end = buf[..n].iter().position(|&b| b == 0)?;
            buf.truncate(end);
            buf
        }
    };
    let name = String::from_utf8(bytes).ok()?;
    (!name.is_empty() && !name.chars().any(char::is_control)).then_some(name)
}

/// The text whose `{ str, length }` is at `at` (a statement's, a database's), read between two reads of them
/// that agree.
fn query(mem: &impl Memory, at: u64) -> Result<Option<Query>> {
    let pair = || {
        let b = mem.bytes(at, 16)?;
        Some((
            u64::from_le_bytes(b[..8].try_into().ok()?),
            u64::from_le_bytes(b[8..].try_into().ok()?),
        ))
    };
    let first =
        pair().with_context(|| format!("a connection's text at {at:#x} is not readable"))?;
    if first.0 == 0 || first.1 == 0 {
        return Ok(None);
    }
    let (str_at, kept) = text_span(first);
    let bytes = mem.bytes(str_at, kept);
    text_of(first, bytes.as_deref(), pair())
}
