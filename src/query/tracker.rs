//! The statement tracker: the collector's events turned into records ([`Tracker`]), following each connection's
//! handshake, database and prepared statements. Pure: it reads no clock but once, for the offset of wall-clock
//! time, and holds nothing shared; what later stages learn comes back to it through its caller
//! ([`Tracker::learn`]), and what it noticed is returned with each record ([`Handled`]).

use std::{collections::HashMap, sync::Arc};

use rustc_hash::FxHashMap;

use super::record::{
    dispatch_fd, fingerprint_and_shown, realtime_offset_ns, Learned, QueryRecord, StatementKey,
    Text, TimeParts, Timestamp, WaitSlot,
};
use crate::collect::queries::{Counters, RawStatement, Wire};
use crate::wire::protocol::{self, Reply};

/// The fingerprint of executions of a statement prepared before tracing began, followed by ` #<statement id>`.
pub const UNKNOWN_PREPARED: &str = "statement prepared before tracing";

/// Prepared statements remembered per connection, at most; beyond it one is forgotten for each new one.
pub const MAX_PREPARED_PER_CONN: usize = 4096;
/// Connections remembered, at most (they are keyed by socket fd, so this bounds a leak of closed ones).
pub const MAX_CONNS: usize = 65536;

#[derive(Default)]
struct Conn {
    id: Option<u32>,
    user: Option<Text>,
    db: Option<Text>,
    /// Statement id → what its executions are shown as. (The integer-keyed maps hash with FxHash: their keys are
    /// the kernel's and the server's numbers, not a client's choice, and SipHash was 7% of myprobe's time.)
    prepared: FxHashMap<u32, Prepared>,
    /// The client's capabilities from its handshake (how COM_CHANGE_USER is laid out), if seen.
    capabilities: Option<u32>,
    /// The id of the statement it prepared last, which MariaDB's executions name by [`LAST_PREPARED`].
    last_prepared: Option<u32>,
    /// It asked for TLS: its next packet, at sequence 2, is its handshake response (read in its plaintext).
    tls_requested: bool,
    /// The inode of its socket, 0 if not known.
    socket_ino: u64,
    /// The connection on the same descriptor before this one, for its records that come after this one began
    /// (a statement whose connection ended unseen is sent when its thread greets the next).
    previous: Option<Box<Conn>>,
}

/// The statement id by which a MariaDB client executes the statement it prepared last, without waiting for the
/// prepare's reply (Connector/J's and node's pipelined prepare and execute, Connector/C's execute_direct and
/// bulk executions).
pub const LAST_PREPARED: u32 = u32::MAX;

impl Conn {
    /// The descriptor now names another connection, on the socket of inode `ino`: this one becomes its previous.
    fn reopened(&mut self, ino: u64) {
        let old = std::mem::take(self);
        self.socket_ino = ino;
        if old.socket_ino != 0 && old.socket_ino != ino {
            self.previous = Some(Box::new(Conn {
                previous: None,
                ..old
            }));
        }
    }

    /// The statement an execution's id stands for.
    fn statement_id(&self, id: u32) -> u32 {
        match (id, self.last_prepared) {
            (LAST_PREPARED, Some(last)) => last,
            _ => id,
        }
    }

    /// What the request of `s`, on the connection of `socket`, says of its statement.
    fn request(
        &mut self,
        s: &RawStatement,
        cmd: u8,
        socket: i32,
        server_takes_attributes: bool,
    ) -> Request {
        let args = s.request.get(1..).unwrap_or_default();
        let text = match cmd {
            // Seen at dispatch_command (s.fd < 0), the server has read the attributes already.
            protocol::COM_QUERY if s.fd >= 0 => {
                Some(self.query_text(args, server_takes_attributes))
            }
            protocol::COM_QUERY | protocol::COM_STMT_PREPARE => {
                Some(String::from_utf8_lossy(args).into_owned())
            }
            protocol::COM_STMT_EXECUTE | protocol::COM_STMT_BULK_EXECUTE => {
                return self.execution(s, socket);
            }
            protocol::COM_INIT_DB => {
                protocol::init_db_name(&s.request).map(|db| format!("USE `{db}`"))
            }
            _ => None,
        };
        Request {
            text,
            ..Request::default()
        }
    }

    /// A COM_QUERY's text (`args`, after the command byte), past the query attributes its client sends first.
    fn query_text(&self, args: &[u8], server_takes_attributes: bool) -> String {
        let sends_attributes = match self.capabilities {
            Some(caps) => caps & protocol::CLIENT_QUERY_ATTRIBUTES != 0,
            // No statement starts with a count and then 1.
            None => server_takes_attributes && args.get(1) == Some(&1),
        };
        let text = sends_attributes
            .then(|| protocol::query_after_attributes(args))
            .flatten()
            .unwrap_or(args);
        String::from_utf8_lossy(text).into_owned()
    }

    /// What is known of the statement an execution runs: its id, and how it is shown when that is known or its
    /// reply's columns name it.
    fn execution(&mut self, s: &RawStatement, socket: i32) -> Request {
        let mut request = Request::default();
        let Some(id) = protocol::stmt_execute_id(&s.request).map(|id| self.statement_id(id)) else {
            return request;
        };
        request.prepared = Some((socket, id));
        request.execution = self.prepared.get(&id).cloned();
        if request.execution.is_some() {
            return request;
        }
        request.unknown_statement = Some(id);
        // Prepared before tracing: its result set's columns, if the server sent them, say what it reads, and
        // stand for it until its text is found.
        // (Not for LAST_PREPARED, which stands for another statement at each prepare.)
        if let Some(columns) = protocol::result_columns(&s.reply).filter(|_| id != LAST_PREPARED) {
            let p = Prepared {
                fingerprint: format!("{} #{id}", columns.label()).into(),
                query: None,
                truncated: false,
            };
            request.forgot_prepared += make_room(&mut self.prepared, &id, MAX_PREPARED_PER_CONN);
            self.prepared.insert(id, p.clone());
            request.execution = Some(p);
        } else if protocol::result_with_metadata(&s.reply).is_some() {
            // They were sent, not kept: the next executions' replies are.
            request.results_wanted = true;
        }
        request
    }

    /// What a statement the server accepted changes in the connection: its database, its user, its prepared
    /// statements. `text`: the statement's, from [`Conn::request`]. Returns how many prepared statements were
    /// forgotten to make room.
    fn accepted(
        &mut self,
        s: &RawStatement,
        cmd: u8,
        reply: &Reply,
        text: Option<&str>,
        raw_sql: bool,
        truncated: bool,
    ) -> u64 {
        match (cmd, reply) {
            (protocol::COM_INIT_DB, _) => {
                self.db = protocol::init_db_name(&s.request)
                    .map(Text::from)
                    .or(self.db.take())
            }
            (protocol::COM_QUERY, _) => {
                if let Some(db) = text.and_then(protocol::use_statement_db) {
                    self.db = Some(db.into());
                }
            }
            (protocol::COM_STMT_PREPARE, Reply::PrepareOk { statement_id, .. }) => {
                let forgot = make_room(&mut self.prepared, statement_id, MAX_PREPARED_PER_CONN);
                let text = text.unwrap_or_default();
                self.prepared
                    .insert(*statement_id, Prepared::of(text, raw_sql, truncated));
                self.last_prepared = Some(*statement_id);
                return forgot;
            }
            (protocol::COM_RESET_CONNECTION, _) => {
                self.prepared.clear();
                self.last_prepared = None;
            }
            (protocol::COM_CHANGE_USER, _) => {
                // Another user, maybe another database, and a fresh session: no prepared statements.
                let caps = self
                    .capabilities
                    .unwrap_or(protocol::CLIENT_PROTOCOL_41 | protocol::CLIENT_SECURE_CONNECTION);
                if let Some(h) = protocol::parse_change_user(&s.request, caps) {
                    self.user = Some(h.user.into());
                    self.db = h.database.map(Text::from);
                }
                self.prepared.clear();
                self.last_prepared = None;
            }
            _ => {}
        }
        0
    }
}

/// What the executions of a prepared statement are shown as: worked out once, as a busy connection executes
/// the same statements thousands of times a second.
#[derive(Clone)]
struct Prepared {
    fingerprint: Text,
    /// The text (normalized unless raw SQL is asked for); none when only its result set is known.
    query: Option<Text>,
    /// The prepare's request was longer than what the tracer keeps: `query` is its beginning.
    truncated: bool,
}

impl Prepared {
    fn of(text: &str, raw_sql: bool, truncated: bool) -> Self {
        let (fingerprint, query) = fingerprint_and_shown(text, raw_sql);
        Prepared {
            fingerprint,
            query: Some(query),
            truncated,
        }
    }
}

/// What a statement's request says of it: the text of a query, a prepare or a COM_INIT_DB (as `USE`); for an
/// execution, what is known of the statement prepared.
#[derive(Default)]
struct Request {
    text: Option<String>,
    /// An execution: its connection's socket and the statement id.
    prepared: Option<StatementKey>,
    /// How the statement executed is shown, if known.
    execution: Option<Prepared>,
    /// An execution of a statement prepared before tracing and not known: its id.
    unknown_statement: Option<u32>,
    /// Prepared statements forgotten to make room for one its reply named.
    forgot_prepared: u64,
    /// Its reply's column definitions were sent and not kept (see [`Notice::ResultsWanted`]).
    results_wanted: bool,
}

impl Request {
    /// The statement's fingerprint and its text as records show it.
    fn shown(self, raw_sql: bool, texts: &mut ShownTexts) -> (Option<Text>, Option<Text>) {
        match (self.text, self.execution) {
            (Some(t), _) => {
                let (fingerprint, shown) = texts.of(t, raw_sql);
                (Some(fingerprint), Some(shown))
            }
            (None, Some(p)) => (Some(p.fingerprint), p.query),
            // Prepared before tracing: its text went by unseen; the server's statement id still tells the
            // statements apart.
            (None, None) => (
                self.unknown_statement
                    .map(|id| format!("{UNKNOWN_PREPARED} #{id}").into()),
                None,
            ),
        }
    }
}

/// Before `key` goes into `map`, which holds at most `max` entries: removes one other entry (any) if `key` is
/// new and the map is full. Returns how many were removed, for the count of what was forgotten.
fn make_room<K: std::hash::Hash + Eq + Copy, V, S: std::hash::BuildHasher>(
    map: &mut HashMap<K, V, S>,
    key: &K,
    max: usize,
) -> u64 {
    if map.len() < max || map.contains_key(key) {
        return 0;
    }
    match map.keys().next().copied() {
        Some(old) => {
            map.remove(&old);
            1
        }
        None => 0,
    }
}

/// Something user space should say once on stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A client asked for TLS: its statements cannot be read from the socket.
    Tls { conn: Option<u32> },
    /// An execution of a statement prepared before tracing came back with column definitions that were not
    /// kept: the kernel side should keep executions' replies long for a while, as they would label the
    /// statement. Clients that cache definitions (MariaDB's Connector/C) send none, and cost nothing.
    ResultsWanted,
}

/// What one event told the tracker: a statement's record, and what its caller is to know of.
#[derive(Debug, Default)]
pub struct Handled {
    pub record: Option<QueryRecord>,
    pub notice: Option<Notice>,
}

/// Turns the collector's events into records: follows handshakes, `USE`/COM_INIT_DB and prepared statements.
pub struct Tracker {
    conns: FxHashMap<i32, Conn>,
    raw_sql: bool,
    /// Prepared statements and connections forgotten to keep memory bounded (reported, never silent).
    pub forgotten_prepared: u64,
    pub forgotten_conns: u64,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC, ns: turns the kernel's timestamps into wall-clock time.
    realtime_offset_ns: i128,
    /// The server takes query attributes (MySQL): a COM_QUERY of a connection whose capabilities went by
    /// unseen is read past them when it starts as they do.
    query_attributes: bool,
    shown: ShownTexts,
}

/// Query texts seen lately, with their fingerprint and their text as shown: clients send the same texts again and
/// again (`BEGIN`, `COMMIT`, a statement with the same values), and the two passes over a text cost more than the
/// rest of its record. Forgotten all at once past [`SHOWN_TEXTS_KEPT`].
#[derive(Default)]
struct ShownTexts {
    by_text: HashMap<String, (Text, Text), foldhash::fast::RandomState>,
}

/// Texts kept: at most 1 KiB each (what the kernel side keeps of a request), three times (the text, its fingerprint,
/// its shown text).
const SHOWN_TEXTS_KEPT: usize = 2048;

impl ShownTexts {
    fn of(&mut self, text: String, raw_sql: bool) -> (Text, Text) {
        if let Some((fingerprint, shown)) = self.by_text.get(&text) {
            return (Arc::clone(fingerprint), Arc::clone(shown));
        }
        if self.by_text.len() >= SHOWN_TEXTS_KEPT {
            self.by_text.clear();
        }
        let (fingerprint, shown) = fingerprint_and_shown(&text, raw_sql);
        self.by_text
            .insert(text, (Arc::clone(&fingerprint), Arc::clone(&shown)));
        (fingerprint, shown)
    }
}

impl Tracker {
    pub fn new(raw_sql: bool) -> Self {
        Tracker {
            conns: FxHashMap::default(),
            raw_sql,
            forgotten_prepared: 0,
            forgotten_conns: 0,
            realtime_offset_ns: realtime_offset_ns(),
            query_attributes: false,
            shown: ShownTexts::default(),
        }
    }

    /// Follows `server`'s ways of the protocol.
    pub fn for_server(mut self, server: &dyn crate::server::Server) -> Self {
        self.query_attributes = server.query_attributes();
        self
    }

    /// Feeds what was read on a connection; returns a record for a statement, and what it noticed.
    pub fn handle(&mut self, wire: Wire) -> Handled {
        match wire {
            Wire::PacketOut {
                tid,
                fd,
                socket_ino,
                bytes,
            } => {
                // The greeting opens a connection on this socket (a reused fd starts afresh), and on its
                // thread, as statements seen at dispatch_command know it.
                let Some((_, seq, payload)) = protocol::split_packet(&bytes) else {
                    return Handled::default();
                };
                if seq == 0 {
                    if let Some(g) = protocol::parse_greeting(payload) {
                        for (key, ino) in [(fd, socket_ino), (dispatch_fd(tid), 0)] {
                            let conn = self.conn_entry(key);
                            conn.reopened(ino);
                            conn.id = Some(g.connection_id);
                        }
                    }
                }
                Handled::default()
            }
            Wire::PacketIn {
                tid,
                fd,
                socket_ino,
                seq,
                packet_len,
                payload,
                ts_ns,
            } => {
                let command = payload.first().copied();
                let mut notice = None;
                if seq == 0 && command == Some(protocol::COM_STMT_CLOSE) {
                    let id = protocol::stmt_execute_id(&payload);
                    if let (Some(conn), Some(id)) = (self.conns.get_mut(&fd), id) {
                        conn.prepared.remove(&id);
                    }
                } else if seq == 0 && command.is_some_and(protocol::command_is_answered) {
                    // A command read ahead: a statement of its own, within the time of the one before it.
                    return self.record(RawStatement {
                        tid,
                        fd,
                        socket_ino,
                        packet_len,
                        request: payload,
                        reply: Vec::new(),
                        start_ns: ts_ns,
                        end_ns: ts_ns,
                        counters: Counters::default(),
                        in_flight: false,
                        pipelined: true,
                        before_tracing: false,
                    });
                } else if seq == 1 || seq == 2 {
                    // At sequence 2: the handshake response that follows a TLS request, read in its plaintext
                    // (otherwise, a COM_CHANGE_USER's authentication).
                    let after_tls_request = seq == 2
                        && self
                            .conns
                            .get_mut(&fd)
                            .is_some_and(|c| std::mem::take(&mut c.tls_requested));
                    if let Some(h) = (seq == 1 || after_tls_request)
                        .then(|| protocol::parse_handshake_response(&payload))
                        .flatten()
                    {
                        let conn = self.conn_at(fd, socket_ino);
                        if h.ssl_request && seq == 1 {
                            conn.tls_requested = true;
                            notice = Some(Notice::Tls { conn: conn.id });
                        } else {
                            conn.user = Some(h.user.as_str().into());
                            conn.db = h.database.as_deref().map(Text::from);
                            conn.capabilities = Some(h.capabilities);
                        }
                    }
                }
                Handled {
                    record: None,
                    notice,
                }
            }
            Wire::Statement(s) => self.record(*s),
        }
    }

    /// The connections remembered and the most prepared statements remembered on one of them: what
    /// [`MAX_CONNS`] and [`MAX_PREPARED_PER_CONN`] bound.
    pub fn memory_bounds(&self) -> (usize, usize) {
        // Each keeps at most one connection before it (`Conn::previous`), whose statements count too.
        let prepared = (self.conns.values())
            .flat_map(|c| std::iter::once(c).chain(c.previous.as_deref()))
            .map(|c| c.prepared.len())
            .max();
        (self.conns.len(), prepared.unwrap_or(0))
    }

    fn conn_entry(&mut self, fd: i32) -> &mut Conn {
        // A long-closed socket is as likely to go as any: its user and db are forgotten.
        self.forgotten_conns += make_room(&mut self.conns, &fd, MAX_CONNS);
        self.conns.entry(fd).or_default()
    }

    /// The connection on descriptor `fd` whose socket has inode `ino` (0: not known, the one there now).
    fn conn_at(&mut self, fd: i32, ino: u64) -> &mut Conn {
        let conn = self.conn_entry(fd);
        if ino == 0 || conn.socket_ino == ino {
            return conn;
        }
        if conn.socket_ino == 0 {
            conn.socket_ino = ino;
            return conn;
        }
        if conn.previous.as_ref().is_some_and(|p| p.socket_ino == ino) {
            return conn.previous.as_deref_mut().expect("checked just before");
        }
        // Another connection, whose greeting went by unseen: opened before tracing, the one known there is over.
        conn.reopened(ino);
        conn
    }

    fn record(&mut self, s: RawStatement) -> Handled {
        let cmd = s.request.first().copied().unwrap_or(0xff);
        let reply = protocol::parse_reply_stream(&s.reply, cmd);
        let ok = !s.in_flight && !matches!(reply, Reply::Err { .. });
        let truncated = s.packet_len as usize > s.request.len();
        // Statements seen at dispatch_command (TLS) have no socket: their connection is known by its thread.
        let socket = if s.fd >= 0 { s.fd } else { dispatch_fd(s.tid) };
        let raw_sql = self.raw_sql;
        let server_takes_attributes = self.query_attributes;
        let conn = self.conn_at(socket, s.socket_ino);
        let request = conn.request(&s, cmd, socket, server_takes_attributes);
        // What the statement changes in its connection, once the server accepted it.
        let forgot_prepared = if ok {
            conn.accepted(&s, cmd, &reply, request.text.as_deref(), raw_sql, truncated)
        } else {
            0
        };
        let (user, db, id) = (conn.user.clone(), conn.db.clone(), conn.id);
        self.forgotten_prepared += request.forgot_prepared + forgot_prepared;
        let notice = request.results_wanted.then_some(Notice::ResultsWanted);
        let error = match reply {
            Reply::Err { code, .. } => Some(code),
            _ => None,
        };

        // An execution's text is its prepare's, cut as that was.
        let truncated = truncated || request.execution.as_ref().is_some_and(|p| p.truncated);
        let prepared = request.prepared;
        let (fingerprint, query) = request.shown(raw_sql, &mut self.shown);
        let c = &s.counters;
        let us = |ns: u64| ns.saturating_add(500) / 1000;
        let lock_addr_raw = if c.lock_waits > 0 { c.lock_addr } else { 0 };
        let (time, duration_us) = TimeParts::of(s.end_ns.saturating_sub(s.start_ns), &c.part_ns);
        let record = QueryRecord {
            ts: Timestamp(s.start_ns as i128 + self.realtime_offset_ns),
            tid: s.tid,
            conn: id,
            user,
            db,
            command: protocol::command_name(cmd),
            fingerprint,
            query,
            duration_us,
            time,
            lock_waits: c.lock_waits,
            lock_max_us: us(c.lock_max_ns),
            lock_addr: (lock_addr_raw != 0).then(|| format!("{lock_addr_raw:#x}")),
            lock_symbol: None,
            lock_site: None,
            read_bytes: c.read_bytes,
            write_bytes: c.write_bytes,
            syncs: c.syncs,
            net_bytes: c.net_bytes,
            syscalls: c.syscalls,
            tmp_disk_tables: c.tmp_disk_tables,
            sort_merge_passes: c.sort_merge_passes,
            error,
            truncated,
            in_flight: s.in_flight,
            pipelined: s.pipelined,
            before_tracing: s.before_tracing,
            lock_addr_raw,
            // Set by whoever knows the period it was traced in (`query::follow::follow`).
            stands_for: 1,
            lock_stack: if c.lock_waits > 0 { c.lock_stack } else { 0 },
            wait_slots: c
                .waits
                .iter()
                .filter(|w| w.stack != 0 && w.ns > 0)
                .map(|w| WaitSlot {
                    stack: w.stack,
                    hint: w.hint,
                    ns: w.ns,
                    waits: u64::from(w.waits),
                    waker: w.waker,
                    woken_ns: w.woken_ns,
                })
                .collect(),
            cause: None,
            wakers: Vec::new(),
            waits: Vec::new(),
            io: Vec::new(),
            io_fds: std::array::from_fn(|i| if c.io_max_ns[i] > 0 { c.io_fd[i] } else { -1 }),
            prepared,
            socket,
            start_ns: s.start_ns,
            end_ns: s.end_ns,
        };
        Handled {
            record: Some(record),
            notice,
        }
    }

    /// What a later stage learned (the text of a prepared statement, the user of a connection): the later
    /// records carry it.
    pub fn learn(&mut self, learned: Learned) {
        match learned {
            Learned::Prepared { key, text } => self.learn_prepared(key, &text),
            Learned::Connection {
                socket,
                id,
                user,
                db,
            } => self.learn_connection(socket, id, user.as_deref(), db.as_deref()),
        }
    }

    /// What the server says of the connection on `socket` (its process list, or its memory), where its handshake
    /// went by unseen: its later statements carry it.
    fn learn_connection(&mut self, socket: i32, id: u32, user: Option<&str>, db: Option<&str>) {
        let conn = self.conn_entry(socket);
        conn.id = conn.id.or(Some(id));
        conn.user = user.map(Text::from);
        conn.db = db.map(Text::from);
    }

    /// A prepared statement's text learned otherwise (texts.rs): its later executions carry it.
    fn learn_prepared(&mut self, (fd, id): StatementKey, text: &str) {
        if id == LAST_PREPARED {
            return; // the statement prepared last then, not at the next execution by this id
        }
        let raw_sql = self.raw_sql;
        let conn = self.conn_entry(fd);
        let forgot = make_room(&mut conn.prepared, &id, MAX_PREPARED_PER_CONN);
        conn.prepared.insert(id, Prepared::of(text, raw_sql, false));
        self.forgotten_prepared += forgot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_seen_again_is_shown_as_before_without_reading_it_again() {
        let mut texts = ShownTexts::default();
        let (f, shown) = texts.of("SELECT c FROM t WHERE id=5".into(), false);
        assert_eq!(
            (&*f, &*shown),
            ("select c from t where id = ?", "SELECT c FROM t WHERE id=?")
        );
        let (again, shown_again) = texts.of("SELECT c FROM t WHERE id=5".into(), false);
        assert!(Arc::ptr_eq(&f, &again) && Arc::ptr_eq(&shown, &shown_again));
        let (other, _) = texts.of("SELECT c FROM t WHERE id=6".into(), false);
        assert_eq!(other, f, "another text, the same fingerprint");
        let mut raw = ShownTexts::default();
        assert_eq!(&*raw.of("SELECT 5".into(), true).1, "SELECT 5");
        for i in 0..=SHOWN_TEXTS_KEPT {
            texts.of(format!("SELECT {i}"), false);
        }
        assert!(texts.by_text.len() <= SHOWN_TEXTS_KEPT, "bounded");
    }

    /// A statement of thread `tid` on socket `fd` (-1: seen at dispatch_command), with its request and reply.
    fn statement(tid: u32, fd: i32, request: &[u8], reply: Vec<u8>) -> Wire {
        Wire::Statement(Box::new(RawStatement {
            tid,
            fd,
            socket_ino: 0,
            packet_len: request.len() as u32,
            request: request.to_vec(),
            reply,
            start_ns: 0,
            end_ns: 1,
            counters: Default::default(),
            in_flight: false,
            pipelined: false,
            before_tracing: false,
        }))
    }

    /// COM_STMT_PREPARE of `SELECT ?` on socket 5, answered with statement `id`.
    fn prepared(id: u32) -> Wire {
        let mut reply = vec![12, 0, 0, 1, 0];
        reply.extend(id.to_le_bytes());
        reply.extend([0; 7]);
        statement(1, 5, b"\x16SELECT ?", reply)
    }

    #[test]
    fn executions_of_the_statement_prepared_last_are_named_by_it() {
        let mut t = Tracker::new(true);
        let execute = |cmd: u8, id: u32| {
            let mut request = vec![cmd];
            request.extend(id.to_le_bytes());
            request.extend([0; 5]);
            statement(1, 5, &request, vec![7, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0])
        };
        // Before any prepare is seen, the id alone; then MariaDB's -1 is the statement prepared last.
        let r = t
            .handle(execute(protocol::COM_STMT_EXECUTE, LAST_PREPARED))
            .record
            .unwrap();
        assert_eq!(r.query, None);
        t.handle(prepared(7));
        for cmd in [protocol::COM_STMT_EXECUTE, protocol::COM_STMT_BULK_EXECUTE] {
            let r = t.handle(execute(cmd, LAST_PREPARED)).record.unwrap();
            assert_eq!(r.query.as_deref(), Some("SELECT ?"));
            assert_eq!(r.prepared, Some((5, 7)));
        }
        // A session reset forgets it, and a text learned for -1 is not kept for the next one.
        t.handle(statement(
            1,
            5,
            &[protocol::COM_RESET_CONNECTION],
            vec![7, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0],
        ));
        t.learn(Learned::Prepared {
            key: (5, LAST_PREPARED),
            text: "SELECT 'stale'".into(),
        });
        let r = t
            .handle(execute(protocol::COM_STMT_EXECUTE, LAST_PREPARED))
            .record
            .unwrap();
        assert_eq!(r.query, None);
    }

    #[test]
    fn prepared_statements_stay_bounded_and_what_is_forgotten_is_counted() {
        let mut t = Tracker::new(true);
        let over = 10;
        for id in 0..(MAX_PREPARED_PER_CONN as u32 + over) {
            t.handle(prepared(id));
        }
        assert_eq!(t.conns[&5].prepared.len(), MAX_PREPARED_PER_CONN);
        assert_eq!(t.forgotten_prepared, u64::from(over));
        // Preparing a known id again forgets nothing.
        t.handle(prepared(MAX_PREPARED_PER_CONN as u32 + over - 1));
        assert_eq!(t.forgotten_prepared, u64::from(over));
    }

    /// A statement seen at dispatch_command (no socket) on thread 9: `request` is the command and its arguments.
    fn dispatched(request: &[u8]) -> Wire {
        statement(9, -1, request, Vec::new())
    }

    /// The server's greeting of connection `id` on socket `fd` (of inode `ino`) of thread `tid`.
    fn greeting(tid: u32, fd: i32, ino: u64, id: u32) -> Wire {
        let mut greeting = vec![10];
        greeting.extend(b"9.7.4\0");
        greeting.extend(id.to_le_bytes());
        greeting.extend([b'x'; 8]);
        greeting.extend([0, 0xff, 0xf7, 8, 2, 0, 0xff, 0xdf, 21]);
        greeting.extend([0; 10]);
        let mut packet = (greeting.len() as u32).to_le_bytes()[..3].to_vec();
        packet.push(0);
        packet.extend(&greeting);
        Wire::PacketOut {
            tid,
            fd,
            socket_ino: ino,
            bytes: packet,
        }
    }

    #[test]
    fn a_statement_sent_after_the_next_connection_on_its_descriptor_began_is_its_own_connections() {
        let mut t = Tracker::new(true);
        let on = |fd: i32, ino: u64, text: &[u8]| {
            let Wire::Statement(mut s) = statement(1, fd, text, Vec::new()) else {
                unreachable!()
            };
            s.socket_ino = ino;
            Wire::Statement(s)
        };
        t.handle(greeting(1, 5, 100, 42));
        assert_eq!(
            t.handle(on(5, 100, b"\x03SELECT 1")).record.unwrap().conn,
            Some(42)
        );
        // Connection 43 on the same descriptor, then a late record of 42's, then 43's.
        t.handle(greeting(2, 5, 101, 43));
        assert_eq!(
            t.handle(on(5, 100, b"\x03SELECT 2")).record.unwrap().conn,
            Some(42)
        );
        assert_eq!(
            t.handle(on(5, 101, b"\x03SELECT 3")).record.unwrap().conn,
            Some(43)
        );
        // Where the socket is not known, the connection there now.
        assert_eq!(
            t.handle(on(5, 0, b"\x03SELECT 4")).record.unwrap().conn,
            Some(43)
        );
        // A socket never greeted (opened before tracing) is a connection of its own, not 43.
        assert_eq!(
            t.handle(on(5, 102, b"\x03SELECT 5")).record.unwrap().conn,
            None
        );
        assert_eq!(
            t.handle(on(5, 101, b"\x03SELECT 6")).record.unwrap().conn,
            Some(43)
        );
    }

    #[test]
    fn statements_seen_at_dispatch_command_belong_to_their_threads_connection() {
        // The greeting of connection 42 on thread 9.
        let mut t = Tracker::new(true);
        t.handle(greeting(9, 5, 0, 42));
        let query = t.handle(dispatched(b"\x03SELECT 1")).record.unwrap();
        assert_eq!((query.conn, query.socket), (Some(42), dispatch_fd(9)));
        t.learn_connection(dispatch_fd(9), 42, Some("alice"), Some("shop"));
        let mut execute = vec![protocol::COM_STMT_EXECUTE];
        execute.extend(7u32.to_le_bytes());
        let e = t.handle(dispatched(&execute)).record.unwrap();
        assert_eq!(
            (e.user.as_deref(), e.db.as_deref()),
            (Some("alice"), Some("shop"))
        );
        assert_eq!(e.prepared, Some((dispatch_fd(9), 7)));
        assert!(dispatch_fd(9) < -1 && dispatch_fd(u32::MAX) < 0);
    }

    /// A client packet of sequence `seq` on socket `fd`, outside any statement.
    fn client_packet(fd: i32, seq: u8, payload: Vec<u8>) -> Wire {
        Wire::PacketIn {
            tid: 1,
            fd,
            socket_ino: 0,
            seq,
            packet_len: payload.len() as u32,
            payload,
            ts_ns: 0,
        }
    }

    /// A HandshakeResponse41 with `caps` (protocol 4.1 added): of `user` (no auth data), or without one, the SSL
    /// request.
    fn handshake_response(caps: u32, user: Option<&str>) -> Vec<u8> {
        let caps = caps | protocol::CLIENT_PROTOCOL_41 | protocol::CLIENT_SECURE_CONNECTION;
        let mut payload = caps.to_le_bytes().to_vec();
        payload.extend(0x0100_0000u32.to_le_bytes());
        payload.push(0x2d);
        payload.extend([0; 23]);
        if let Some(user) = user {
            payload.extend(user.as_bytes());
            payload.extend([0, 0]); // the end of the name, no auth data
        }
        payload
    }

    /// A handshake response of `user` asking for the compressed protocol with zstd, on socket `fd`.
    fn compressed_handshake(fd: i32, user: &str) -> Wire {
        let caps = protocol::CLIENT_ZSTD_COMPRESSION_ALGORITHM;
        client_packet(fd, 1, handshake_response(caps, Some(user)))
    }

    #[test]
    fn after_a_tls_request_the_handshake_response_comes_at_sequence_2() {
        let mut t = Tracker::new(false);
        let caps = protocol::CLIENT_SSL;
        let tls = t.handle(client_packet(5, 1, handshake_response(caps, None)));
        assert_eq!(tls.notice, Some(Notice::Tls { conn: None }));
        let response = t.handle(client_packet(5, 2, handshake_response(caps, Some("alice"))));
        assert_eq!(response.notice, None);
        // A COM_CHANGE_USER's authentication, also at sequence 2, is no handshake response.
        let all_caps = caps | protocol::CLIENT_PROTOCOL_41 | protocol::CLIENT_SECURE_CONNECTION;
        let mut auth = all_caps.to_le_bytes().to_vec();
        auth.extend([0x61; 28]);
        assert_eq!(t.handle(client_packet(5, 2, auth)).notice, None);
        let r = t.handle(prepared(1)).record.unwrap();
        assert_eq!(r.user.as_deref(), Some("alice"));
    }

    #[test]
    fn a_zstd_compressed_connection_is_followed_and_remembered_within_bounds() {
        let mut t = Tracker::new(false);
        assert_eq!(t.handle(compressed_handshake(7, "alice")).notice, None);
        let Wire::Statement(mut s) = prepared(1) else {
            unreachable!()
        };
        s.fd = 7;
        let r = t.handle(Wire::Statement(s)).record.unwrap();
        assert_eq!(r.user.as_deref(), Some("alice"));
        for fd in 0..(MAX_CONNS as i32 + 100) {
            t.handle(compressed_handshake(fd, "mallory"));
        }
        assert!(t.conns.len() <= MAX_CONNS);
        assert_eq!(t.forgotten_conns, 100);
    }

    #[test]
    fn per_statement_counts_do_not_wrap() {
        // A binlog dump is one statement for as long as the replica is connected.
        let mut t = Tracker::new(true);
        let Wire::Statement(mut s) = prepared(1) else {
            unreachable!()
        };
        s.counters.lock_waits = u64::from(u32::MAX) + 2;
        s.counters.syncs = u64::from(u32::MAX) + 3;
        s.counters.syscalls = u64::from(u32::MAX) + 4;
        let r = t.handle(Wire::Statement(s)).record.unwrap();
        assert_eq!(
            (r.lock_waits, r.syncs, r.syscalls),
            (4_294_967_297, 4_294_967_298, 4_294_967_299)
        );
    }
}
