//! The MySQL/MariaDB client/server protocol, as far as a tracer of the server's socket reads and writes
//! needs it: packet framing, the connection handshake (who connects, to which database), the command
//! byte of a request and the kind of its reply.
//!
//! Every byte here comes from a live server's sockets through a capture of limited size, so buffers may
//! be truncated or be something else entirely: the parsers never panic and never index out of bounds;
//! they return `None` (or [`Reply::Unknown`]) for what they cannot read. Not handled: compressed
//! connections (`CLIENT_COMPRESS`, the framing differs), TLS (only the plaintext SSL request is seen),
//! and payloads of 16 MiB - 1 or more, which continue in the next packet.

// A complete protocol table: each caller uses a different subset.
#![allow(dead_code)]

use super::abi::{client_capability, mysql_command};

// The numbers the statements' programs share are src/bpf/protocol.h's, through `wire::abi`: written once, in C.

/// Command bytes (the first payload byte of a client request).
pub const COM_SLEEP: u8 = mysql_command::COM_SLEEP.0;
pub const COM_QUIT: u8 = mysql_command::COM_QUIT.0;
pub const COM_INIT_DB: u8 = mysql_command::COM_INIT_DB.0;
pub const COM_QUERY: u8 = mysql_command::COM_QUERY.0;
pub const COM_FIELD_LIST: u8 = mysql_command::COM_FIELD_LIST.0;
pub const COM_CREATE_DB: u8 = mysql_command::COM_CREATE_DB.0;
pub const COM_DROP_DB: u8 = mysql_command::COM_DROP_DB.0;
pub const COM_REFRESH: u8 = mysql_command::COM_REFRESH.0;
pub const COM_SHUTDOWN: u8 = mysql_command::COM_SHUTDOWN.0;
pub const COM_STATISTICS: u8 = mysql_command::COM_STATISTICS.0;
pub const COM_PROCESS_INFO: u8 = mysql_command::COM_PROCESS_INFO.0;
pub const COM_CONNECT: u8 = mysql_command::COM_CONNECT.0;
pub const COM_PROCESS_KILL: u8 = mysql_command::COM_PROCESS_KILL.0;
pub const COM_DEBUG: u8 = mysql_command::COM_DEBUG.0;
pub const COM_PING: u8 = mysql_command::COM_PING.0;
pub const COM_TIME: u8 = mysql_command::COM_TIME.0;
pub const COM_DELAYED_INSERT: u8 = mysql_command::COM_DELAYED_INSERT.0;
pub const COM_CHANGE_USER: u8 = mysql_command::COM_CHANGE_USER.0;
pub const COM_BINLOG_DUMP: u8 = mysql_command::COM_BINLOG_DUMP.0;
pub const COM_TABLE_DUMP: u8 = mysql_command::COM_TABLE_DUMP.0;
pub const COM_CONNECT_OUT: u8 = mysql_command::COM_CONNECT_OUT.0;
pub const COM_REGISTER_SLAVE: u8 = mysql_command::COM_REGISTER_SLAVE.0;
pub const COM_STMT_PREPARE: u8 = mysql_command::COM_STMT_PREPARE.0;
pub const COM_STMT_EXECUTE: u8 = mysql_command::COM_STMT_EXECUTE.0;
pub const COM_STMT_SEND_LONG_DATA: u8 = mysql_command::COM_STMT_SEND_LONG_DATA.0;
pub const COM_STMT_CLOSE: u8 = mysql_command::COM_STMT_CLOSE.0;
pub const COM_STMT_RESET: u8 = mysql_command::COM_STMT_RESET.0;
pub const COM_SET_OPTION: u8 = mysql_command::COM_SET_OPTION.0;
pub const COM_STMT_FETCH: u8 = mysql_command::COM_STMT_FETCH.0;
pub const COM_DAEMON: u8 = mysql_command::COM_DAEMON.0;
pub const COM_BINLOG_DUMP_GTID: u8 = mysql_command::COM_BINLOG_DUMP_GTID.0;
pub const COM_RESET_CONNECTION: u8 = mysql_command::COM_RESET_CONNECTION.0;
/// MySQL 8.
pub const COM_CLONE: u8 = mysql_command::COM_CLONE.0;
/// MariaDB: array binding of a prepared statement (statement id follows, like COM_STMT_EXECUTE).
pub const COM_STMT_BULK_EXECUTE: u8 = mysql_command::COM_STMT_BULK_EXECUTE.0;
/// MariaDB (10.2 - 10.5): several commands in one packet.
pub const COM_MULTI: u8 = mysql_command::COM_MULTI.0;

/// Capability flags (greeting and handshake response).
pub const CLIENT_LONG_PASSWORD: u32 = client_capability::CLIENT_LONG_PASSWORD.0;
pub const CLIENT_FOUND_ROWS: u32 = client_capability::CLIENT_FOUND_ROWS.0;
pub const CLIENT_LONG_FLAG: u32 = client_capability::CLIENT_LONG_FLAG.0;
pub const CLIENT_CONNECT_WITH_DB: u32 = client_capability::CLIENT_CONNECT_WITH_DB.0;
pub const CLIENT_NO_SCHEMA: u32 = client_capability::CLIENT_NO_SCHEMA.0;
pub const CLIENT_COMPRESS: u32 = client_capability::CLIENT_COMPRESS.0;
pub const CLIENT_LOCAL_FILES: u32 = client_capability::CLIENT_LOCAL_FILES.0;
pub const CLIENT_IGNORE_SPACE: u32 = client_capability::CLIENT_IGNORE_SPACE.0;
pub const CLIENT_PROTOCOL_41: u32 = client_capability::CLIENT_PROTOCOL_41.0;
pub const CLIENT_INTERACTIVE: u32 = client_capability::CLIENT_INTERACTIVE.0;
pub const CLIENT_SSL: u32 = client_capability::CLIENT_SSL.0;
pub const CLIENT_TRANSACTIONS: u32 = client_capability::CLIENT_TRANSACTIONS.0;
pub const CLIENT_SECURE_CONNECTION: u32 = client_capability::CLIENT_SECURE_CONNECTION.0;
pub const CLIENT_MULTI_STATEMENTS: u32 = client_capability::CLIENT_MULTI_STATEMENTS.0;
pub const CLIENT_MULTI_RESULTS: u32 = client_capability::CLIENT_MULTI_RESULTS.0;
pub const CLIENT_PS_MULTI_RESULTS: u32 = client_capability::CLIENT_PS_MULTI_RESULTS.0;
pub const CLIENT_PLUGIN_AUTH: u32 = client_capability::CLIENT_PLUGIN_AUTH.0;
pub const CLIENT_CONNECT_ATTRS: u32 = client_capability::CLIENT_CONNECT_ATTRS.0;
pub const CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA: u32 =
    client_capability::CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA.0;
pub const CLIENT_SESSION_TRACK: u32 = client_capability::CLIENT_SESSION_TRACK.0;
pub const CLIENT_DEPRECATE_EOF: u32 = client_capability::CLIENT_DEPRECATE_EOF.0;
/// MySQL's compressed protocol with zstd instead of zlib.
pub const CLIENT_ZSTD_COMPRESSION_ALGORITHM: u32 =
    client_capability::CLIENT_ZSTD_COMPRESSION_ALGORITHM.0;
/// MySQL 8.0.23 on: COM_QUERY and COM_STMT_EXECUTE carry named parameters (query attributes) before the
/// statement (MariaDB has no such bit).
pub const CLIENT_QUERY_ATTRIBUTES: u32 = client_capability::CLIENT_QUERY_ATTRIBUTES.0;

/// A payload of this length continues in the next packet.
pub const MAX_PAYLOAD_LEN: u32 = 0x00ff_ffff;

/// Whether the server answers the command (COM_QUIT, COM_STMT_SEND_LONG_DATA and COM_STMT_CLOSE it does not).
pub fn command_is_answered(cmd: u8) -> bool {
    !matches!(cmd, COM_QUIT | COM_STMT_SEND_LONG_DATA | COM_STMT_CLOSE)
}

/// The name SHOW PROCESSLIST and performance_schema give the command (`"Query"`, `"Execute"`, ...),
/// `"Unknown"` for unassigned values.
pub fn command_name(cmd: u8) -> &'static str {
    match cmd {
        COM_SLEEP => "Sleep",
        COM_QUIT => "Quit",
        COM_INIT_DB => "Init DB",
        COM_QUERY => "Query",
        COM_FIELD_LIST => "Field List",
        COM_CREATE_DB => "Create DB",
        COM_DROP_DB => "Drop DB",
        COM_REFRESH => "Refresh",
        COM_SHUTDOWN => "Shutdown",
        COM_STATISTICS => "Statistics",
        COM_PROCESS_INFO => "Processlist",
        COM_CONNECT => "Connect",
        COM_PROCESS_KILL => "Kill",
        COM_DEBUG => "Debug",
        COM_PING => "Ping",
        COM_TIME => "Time",
        COM_DELAYED_INSERT => "Delayed insert",
        COM_CHANGE_USER => "Change user",
        COM_BINLOG_DUMP => "Binlog Dump",
        COM_TABLE_DUMP => "Table Dump",
        COM_CONNECT_OUT => "Connect Out",
        COM_REGISTER_SLAVE => "Register Slave",
        COM_STMT_PREPARE => "Prepare",
        COM_STMT_EXECUTE => "Execute",
        COM_STMT_SEND_LONG_DATA => "Long Data",
        COM_STMT_CLOSE => "Close stmt",
        COM_STMT_RESET => "Reset stmt",
        COM_SET_OPTION => "Set option",
        COM_STMT_FETCH => "Fetch",
        COM_DAEMON => "Daemon",
        COM_BINLOG_DUMP_GTID => "Binlog Dump GTID",
        COM_RESET_CONNECTION => "Reset Connection",
        COM_CLONE => "Clone",
        COM_STMT_BULK_EXECUTE => "Bulk_execute",
        0xfb => "Slave_worker",
        0xfc => "Slave_IO",
        0xfd => "Slave_SQL",
        COM_MULTI => "Com_multi",
        _ => "Unknown",
    }
}

/// Splits the 4-byte header off a packet: `(payload length, sequence id, payload)`, where the payload
/// is what `buf` holds of it (shorter than the length when the capture was cut). `None` when `buf`
/// does not even hold the header.
pub fn split_packet(buf: &[u8]) -> Option<(u32, u8, &[u8])> {
    let [a, b, c, seq] = *buf.first_chunk::<4>()?;
    let len = u32::from_le_bytes([a, b, c, 0]);
    let end = usize::try_from(len).ok()?.saturating_add(4).min(buf.len());
    Some((len, seq, buf.get(4..end)?))
}

/// A length-encoded integer: `(value, bytes consumed)`. `None` for NULL (0xfb), the invalid 0xff and
/// truncated input.
pub fn lenenc_int(buf: &[u8]) -> Option<(u64, usize)> {
    let (&first, rest) = buf.split_first()?;
    let width = match first {
        0..=0xfa => return Some((u64::from(first), 1)),
        0xfc => 2,
        0xfd => 3,
        0xfe => 8,
        _ => return None,
    };
    Some((le_uint(rest.get(..width)?), width + 1))
}

fn le_uint(bytes: &[u8]) -> u64 {
    bytes.iter().rev().fold(0, |v, &b| (v << 8) | u64::from(b))
}

fn u16_at(buf: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_le_bytes(*buf.get(i..)?.first_chunk()?))
}

fn u32_at(buf: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_le_bytes(*buf.get(i..)?.first_chunk()?))
}

/// A NUL-terminated string and what follows the NUL.
fn cstr(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = buf.iter().position(|&b| b == 0)?;
    Some((buf.get(..nul)?, buf.get(nul + 1..)?))
}

/// Up to the first NUL or the end of `buf`, as the server itself reads the database name.
fn until_nul(buf: &[u8]) -> &[u8] {
    cstr(buf).map_or(buf, |(s, _)| s)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn non_empty(b: &[u8]) -> Option<String> {
    (!b.is_empty()).then(|| text(b))
}

/// The server's Initial Handshake Packet (protocol version 10), the first packet of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    pub connection_id: u32,
    /// As the server reports it, without the `5.5.5-` that MariaDB prefixes for old clients.
    pub server_version: String,
    /// Lower 16 bits only when the server sent no more (pre-4.1 servers).
    pub capabilities: u32,
}

/// Parses the server greeting; `None` if it is not protocol version 10 (an error packet such as
/// "Too many connections" can come instead) or is cut before the capability flags.
pub fn parse_greeting(payload: &[u8]) -> Option<Greeting> {
    let (&protocol, rest) = payload.split_first()?;
    if protocol != 10 {
        return None;
    }
    let (version, rest) = cstr(rest)?;
    let connection_id = u32_at(rest, 0)?;
    // Connection id (4), auth-plugin-data part 1 (8), filler (1).
    let rest = rest.get(13..)?;
    let lower = u16_at(rest, 0)?;
    // Then charset (1) and status flags (2) before the upper capability bytes.
    let upper = u16_at(rest, 5).unwrap_or(0);
    let version = version
        .strip_prefix(b"5.5.5-")
        .filter(|v| !v.is_empty())
        .unwrap_or(version);
    Some(Greeting {
        connection_id,
        server_version: text(version),
        capabilities: (u32::from(upper) << 16) | u32::from(lower),
    })
}

/// The client's answer to the greeting: who logs in, to which database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeResponse {
    pub user: String,
    pub database: Option<String>,
    pub capabilities: u32,
    /// The short packet a client sends before switching to TLS; `user` is empty and the real
    /// response follows encrypted.
    pub ssl_request: bool,
}

impl HandshakeResponse {
    fn ssl(capabilities: u32) -> Self {
        HandshakeResponse {
            user: String::new(),
            database: None,
            capabilities,
            ssl_request: true,
        }
    }
}

/// Parses HandshakeResponse41 (or the pre-4.1 HandshakeResponse320), including the SSL request.
/// `None` when cut before the user name, or before the database when the client sent one.
/// An empty database name is `None`.
pub fn parse_handshake_response(payload: &[u8]) -> Option<HandshakeResponse> {
    let caps = u32::from(u16_at(payload, 0)?);
    if caps & CLIENT_PROTOCOL_41 == 0 {
        return parse_response_320(payload, caps);
    }
    let capabilities = u32_at(payload, 0)?;
    if payload.len() == 32 && capabilities & CLIENT_SSL != 0 {
        return Some(HandshakeResponse::ssl(capabilities));
    }
    // Capabilities (4), max packet size (4), charset (1), filler (23).
    let (user, rest) = cstr(payload.get(32..)?)?;
    let rest = if capabilities & CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA != 0 {
        let (len, used) = lenenc_int(rest)?;
        rest.get(used..)?.get(usize::try_from(len).ok()?..)?
    } else if capabilities & CLIENT_SECURE_CONNECTION != 0 {
        let (&len, rest) = rest.split_first()?;
        rest.get(usize::from(len)..)?
    } else {
        cstr(rest).map_or(&[][..], |(_, r)| r)
    };
    let database = if capabilities & CLIENT_CONNECT_WITH_DB != 0 {
        non_empty(until_nul(rest))
    } else {
        None
    };
    Some(HandshakeResponse {
        user: text(user),
        database,
        capabilities,
        ssl_request: false,
    })
}

fn parse_response_320(payload: &[u8], capabilities: u32) -> Option<HandshakeResponse> {
    // Capabilities (2), max packet size (3).
    if payload.len() == 5 && capabilities & CLIENT_SSL != 0 {
        return Some(HandshakeResponse::ssl(capabilities));
    }
    let (user, rest) = cstr(payload.get(5..)?)?;
    let database = if capabilities & CLIENT_CONNECT_WITH_DB != 0 {
        // The auth response is NUL-terminated only when a database follows.
        non_empty(until_nul(cstr(rest)?.1))
    } else {
        None
    };
    Some(HandshakeResponse {
        user: text(user),
        database,
        capabilities,
        ssl_request: false,
    })
}

/// Parses a COM_CHANGE_USER request (command byte included); `capabilities` are the client's from
/// its handshake response. `ssl_request` is always false.
pub fn parse_change_user(payload: &[u8], capabilities: u32) -> Option<HandshakeResponse> {
    let (&cmd, rest) = payload.split_first()?;
    if cmd != COM_CHANGE_USER {
        return None;
    }
    let (user, rest) = cstr(rest)?;
    let rest = if capabilities & CLIENT_SECURE_CONNECTION != 0 {
        let (&len, rest) = rest.split_first()?;
        rest.get(usize::from(len)..)?
    } else {
        cstr(rest)?.1
    };
    Some(HandshakeResponse {
        user: text(user),
        database: non_empty(until_nul(rest)),
        capabilities,
        ssl_request: false,
    })
}

/// The kind of a reply, from its first packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Ok,
    Err {
        code: u16,
        sql_state: Option<String>,
        message: String,
    },
    Eof,
    ResultSet {
        columns: u64,
    },
    PrepareOk {
        statement_id: u32,
        columns: u16,
        params: u16,
    },
    LocalInfile,
    Unknown,
}

/// MariaDB's progress report travels as an error packet with this code; the real reply follows.
const PROGRESS_REPORT: u16 = 0xffff;

/// Classifies the first packet (payload only) of the reply to `command`.
///
/// - `Unknown` also covers what is not a final answer: a MariaDB progress report, and an auth switch
///   or auth continuation for COM_CHANGE_USER; the caller should keep waiting for the next packet.
/// - A 0xfe packet of 9 bytes or more is the OK packet of `CLIENT_DEPRECATE_EOF` clients.
/// - A column count must be alone in its packet (a metadata-follows byte allowed); anything longer
///   is not a result set header (e.g. COM_STATISTICS's plain text) and is `Unknown`.
/// - For COM_STMT_FETCH a 0x00 packet is a binary row: still `Ok`, the fetch succeeded. So is any
///   non-error reply to COM_STATISTICS (plain text) and COM_FIELD_LIST (column definitions).
/// - A truncated COM_STMT_PREPARE OK is `Ok`, as its statement id is unknown.
pub fn parse_reply(first_payload: &[u8], command: u8) -> Reply {
    let Some((&header, rest)) = first_payload.split_first() else {
        return Reply::Unknown;
    };
    match header {
        0x00 if command == COM_STMT_PREPARE => {
            match (u32_at(rest, 0), u16_at(rest, 4), u16_at(rest, 6)) {
                (Some(statement_id), Some(columns), Some(params)) => Reply::PrepareOk {
                    statement_id,
                    columns,
                    params,
                },
                _ => Reply::Ok,
            }
        }
        0x00 => Reply::Ok,
        0xff => parse_err(rest),
        _ if command == COM_CHANGE_USER => Reply::Unknown,
        0xfe if first_payload.len() < 9 => Reply::Eof,
        _ if matches!(command, COM_STATISTICS | COM_FIELD_LIST) => Reply::Ok,
        0xfe => Reply::Ok,
        0xfb => Reply::LocalInfile,
        _ => match lenenc_int(first_payload) {
            Some((columns, used)) if first_payload.len() <= used + 1 => {
                Reply::ResultSet { columns }
            }
            _ => Reply::Unknown,
        },
    }
}

/// Whether a reply packet (payload) is a MariaDB progress report, which a long statement sends,
/// possibly many times, before its real reply to clients that asked for them (the `mariadb` CLI).
pub fn is_progress_report(payload: &[u8]) -> bool {
    payload.first() == Some(&0xff) && u16_at(payload, 1) == Some(PROGRESS_REPORT)
}

/// [`parse_reply`] on captured reply bytes (packet headers included), skipping progress reports;
/// `Unknown` when the bytes hold nothing else (the real reply then comes in a later write).
pub fn parse_reply_stream(buf: &[u8], command: u8) -> Reply {
    let mut rest = buf;
    while let Some((len, _, payload)) = split_packet(rest) {
        if !is_progress_report(payload) {
            return parse_reply(payload, command);
        }
        let next = usize::try_from(len).map_or(usize::MAX, |l| l.saturating_add(4));
        rest = rest.get(next..).unwrap_or_default();
    }
    Reply::Unknown
}

/// What a result set's column definitions say of the statement that made it: the tables its columns come
/// from (`schema.table`, each once, in order) and the columns' names, as far as the captured bytes go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultColumns {
    pub tables: Vec<String>,
    pub names: Vec<String>,
    /// The column count the result set announced (more than `names` when the capture was cut).
    pub count: u64,
}

/// Column names shown in a label, at most.
const LABEL_COLUMNS: usize = 8;

impl ResultColumns {
    /// `SELECT … FROM sbtest.sbtest1 (c)`: what the protocol shows of a statement whose text is unknown; the
    /// `…` says that the rest of the text was not seen.
    pub fn label(&self) -> String {
        let mut label = String::from("SELECT …");
        if !self.tables.is_empty() {
            label.push_str(" FROM ");
            label.push_str(&self.tables.join(", "));
        }
        let shown = self.names.len().min(LABEL_COLUMNS);
        let mut columns = self.names[..shown].join(", ");
        if (shown as u64) < self.count {
            columns.push_str(if shown == 0 { "…" } else { ", …" });
        }
        label.push_str(&format!(" ({columns})"));
        label
    }
}

/// The column definitions at the head of a result set (packet headers included), when the server sent
/// them: a client that caches metadata (MariaDB's `MARIADB_CLIENT_CACHE_METADATA`, which Connector/C uses)
/// gets them only when a statement is prepared, and its executions' result sets begin with the column count
/// and a zero metadata-follows byte. `None` when the reply is not a result set or has no definitions.
pub fn result_columns(buf: &[u8]) -> Option<ResultColumns> {
    let (count, mut rest) = result_with_metadata(buf)?;
    let (mut tables, mut names) = (Vec::new(), Vec::new());
    while (names.len() as u64) < count {
        let Some((_, _, def)) = split_packet(rest) else {
            break;
        };
        let Some(column) = column_definition(def) else {
            break;
        };
        if !column.table.is_empty() {
            let table = if column.schema.is_empty() {
                column.table
            } else {
                format!("{}.{}", column.schema, column.table)
            };
            if !tables.contains(&table) {
                tables.push(table);
            }
        }
        names.push(column.name);
        rest = rest.get(4 + def.len()..).unwrap_or_default();
    }
    (!names.is_empty()).then_some(ResultColumns {
        tables,
        names,
        count,
    })
}

/// Whether `buf` begins a result set whose column definitions follow its column count: `(count, the bytes
/// after the count)`.
pub fn result_with_metadata(buf: &[u8]) -> Option<(u64, &[u8])> {
    let (len, _, payload) = split_packet(buf)?;
    let (count, used) = lenenc_int(payload)?;
    // The count alone, or with the metadata-follows byte; anything else is not a result set's head.
    if count == 0 || payload.len() != len as usize || payload.len() > used + 1 {
        return None;
    }
    if payload.get(used) == Some(&0) {
        return None;
    }
    Some((count, buf.get(4 + payload.len()..)?))
}

struct ColumnDefinition {
    schema: String,
    /// The table as stored (`org_table`), not its alias in the statement.
    table: String,
    /// The column as the statement names it (its alias).
    name: String,
}

/// A ColumnDefinition41 packet's strings: catalog (`def`), schema, table, org_table, name, org_name.
fn column_definition(payload: &[u8]) -> Option<ColumnDefinition> {
    let mut rest = payload;
    let mut strings = Vec::with_capacity(6);
    for _ in 0..6 {
        let (len, used) = lenenc_int(rest)?;
        let end = used.checked_add(usize::try_from(len).ok()?)?;
        strings.push(rest.get(used..end)?);
        rest = rest.get(end..)?;
    }
    (strings[0] == b"def").then(|| ColumnDefinition {
        schema: text(strings[1]),
        table: text(strings[3]),
        name: text(strings[4]),
    })
}

fn parse_err(rest: &[u8]) -> Reply {
    let Some(code) = u16_at(rest, 0) else {
        return Reply::Err {
            code: 0,
            sql_state: None,
            message: String::new(),
        };
    };
    if code == PROGRESS_REPORT {
        return Reply::Unknown;
    }
    let body = rest.get(2..).unwrap_or_default();
    let (sql_state, message) = match (body.first(), body.get(1..6), body.get(6..)) {
        (Some(b'#'), Some(state), Some(msg)) => (Some(text(state)), msg),
        _ => (None, body),
    };
    Reply::Err {
        code,
        sql_state,
        message: text(message),
    }
}

/// The numbers of an OK packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OkInfo {
    pub affected_rows: u64,
    pub last_insert_id: u64,
    pub status: u16,
    pub warnings: u16,
}

/// Parses an OK packet (header 0x00, or 0xfe of 7+ bytes with `CLIENT_DEPRECATE_EOF`), protocol 4.1.
pub fn parse_ok(payload: &[u8]) -> Option<OkInfo> {
    let (&header, rest) = payload.split_first()?;
    if header != 0x00 && !(header == 0xfe && payload.len() >= 7) {
        return None;
    }
    let (affected_rows, a) = lenenc_int(rest)?;
    let rest = rest.get(a..)?;
    let (last_insert_id, b) = lenenc_int(rest)?;
    let rest = rest.get(b..)?;
    Some(OkInfo {
        affected_rows,
        last_insert_id,
        status: u16_at(rest, 0)?,
        warnings: u16_at(rest, 2)?,
    })
}

/// The statement id of COM_STMT_EXECUTE, COM_STMT_CLOSE, COM_STMT_RESET, COM_STMT_SEND_LONG_DATA,
/// COM_STMT_FETCH or MariaDB's COM_STMT_BULK_EXECUTE (payload with the command byte); `None` for
/// other commands. MariaDB's "last prepared statement" id 0xffffffff is returned as is.
pub fn stmt_execute_id(payload: &[u8]) -> Option<u32> {
    match *payload.first()? {
        COM_STMT_EXECUTE
        | COM_STMT_CLOSE
        | COM_STMT_RESET
        | COM_STMT_SEND_LONG_DATA
        | COM_STMT_FETCH
        | COM_STMT_BULK_EXECUTE => u32_at(payload, 1),
        _ => None,
    }
}

/// The text of a COM_QUERY body (after the command byte) whose client sends query attributes: past the
/// parameter count, the parameter set count (always 1), and, with parameters, the NULL bitmap, the
/// new-params-bound flag, each parameter's type and name, and their values. `None` when the body is not laid
/// out so (cut short, or not attributes at all).
pub fn query_after_attributes(body: &[u8]) -> Option<&[u8]> {
    let (count, n) = lenenc_int(body)?;
    let mut at = n;
    let (sets, n) = lenenc_int(body.get(at..)?)?;
    at += n;
    if sets != 1 {
        return None;
    }
    if count == 0 {
        return body.get(at..);
    }
    let count = usize::try_from(count).ok()?;
    at = at.checked_add(count.div_ceil(8))?;
    let null_bitmap = body.get(at - count.div_ceil(8)..at)?;
    if *body.get(at)? != 1 {
        // The types are always sent with query attributes.
        return None;
    }
    at += 1;
    let mut types = Vec::with_capacity(count.min(body.len()));
    for _ in 0..count {
        types.push(*body.get(at)?);
        at += 2;
        let (name_len, n) = lenenc_int(body.get(at..)?)?;
        at = at
            .checked_add(n)?
            .checked_add(usize::try_from(name_len).ok()?)?;
    }
    for (i, &ty) in types.iter().enumerate() {
        if null_bitmap[i / 8] & (1 << (i % 8)) != 0 {
            continue;
        }
        at = at.checked_add(binary_value_len(ty, body.get(at..)?)?)?;
    }
    body.get(at..)
}

/// The length of a binary-protocol value of column type `ty` at the start of `buf`.
fn binary_value_len(ty: u8, buf: &[u8]) -> Option<usize> {
    Some(match ty {
        0x06 => 0,               // NULL
        0x01 => 1,               // TINY
        0x02 | 0x0d => 2,        // SHORT, YEAR
        0x03 | 0x09 | 0x04 => 4, // LONG, INT24, FLOAT
        0x08 | 0x05 => 8,        // LONGLONG, DOUBLE
        // DATE, DATETIME, TIMESTAMP, TIME: a length byte, then that many.
        0x0a | 0x0c | 0x07 | 0x0b => 1 + usize::from(*buf.first()?),
        // Strings, decimals, blobs, JSON, ...: length-encoded.
        _ => {
            let (len, n) = lenenc_int(buf)?;
            n.checked_add(usize::try_from(len).ok()?)?
        }
    })
}

/// The database of a COM_INIT_DB request (payload with the command byte).
pub fn init_db_name(payload: &[u8]) -> Option<String> {
    let (&cmd, name) = payload.split_first()?;
    if cmd != COM_INIT_DB {
        return None;
    }
    let end = name.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    non_empty(name.get(..end)?)
}

/// The database of a `USE db` statement (any case, leading whitespace and comments, `` `quoted` ``
/// names, a trailing `;`, possibly followed by more statements); `None` for any other statement.
pub fn use_statement_db(sql: &str) -> Option<String> {
    let s = sql.as_bytes();
    let i = skip_trivia(s, 0);
    if !s.get(i..i + 3)?.eq_ignore_ascii_case(b"use") || is_ident(at(s, i + 3)) {
        return None;
    }
    let i = skip_trivia(s, i + 3);
    let (name, end) = if at(s, i) == b'`' {
        quoted_name(s, i)?
    } else {
        let end = (i..=s.len()).find(|&j| !is_ident(at(s, j)))?;
        (text(s.get(i..end)?), end)
    };
    let end = skip_trivia(s, end);
    (!name.is_empty() && matches!(s.get(end), None | Some(b';'))).then_some(name)
}

fn at(s: &[u8], i: usize) -> u8 {
    s.get(i).copied().unwrap_or(0)
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// A backtick-quoted name starting at `i`, unescaped, and the index after it.
fn quoted_name(s: &[u8], i: usize) -> Option<(String, usize)> {
    let mut name = Vec::new();
    let mut j = i + 1;
    loop {
        let k = j + s.get(j..)?.iter().position(|&b| b == b'`')?;
        name.extend_from_slice(s.get(j..k)?);
        if at(s, k + 1) != b'`' {
            return Some((text(&name), k + 1));
        }
        name.push(b'`');
        j = k + 2;
    }
}

fn skip_trivia(s: &[u8], mut i: usize) -> usize {
    let find = |from: usize, pat: &[u8]| {
        s.get(from..)
            .and_then(|r| r.windows(pat.len()).position(|w| w == pat))
            .map(|p| p + from)
    };
    while i < s.len() {
        match (at(s, i), at(s, i + 1)) {
            (b, _) if b <= b' ' => i += 1,
            (b'/', b'*') => i = find(i + 2, b"*/").map_or(s.len(), |j| j + 2),
            (b'#', _) => i = find(i, b"\n").map_or(s.len(), |j| j + 1),
            (b'-', b'-') if at(s, i + 2) <= b' ' => i = find(i, b"\n").map_or(s.len(), |j| j + 1),
            _ => break,
        }
    }
    i
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_attributes_come_before_the_text() {
        assert_eq!(
            query_after_attributes(b"\x00\x01select 1"),
            Some(&b"select 1"[..])
        );
        // One string attribute `a` = `b`: count, set count, NULL bitmap, bound flag, type and name, value.
        let body = b"\x01\x01\x00\x01\xfe\x00\x01a\x01bSELECT 2";
        assert_eq!(query_after_attributes(body), Some(&b"SELECT 2"[..]));
        // A NULL one has no value; a LONGLONG has 8 bytes.
        let body = b"\x02\x01\x01\x01\x06\x00\x01n\x08\x00\x01i12345678SELECT 3";
        assert_eq!(query_after_attributes(body), Some(&b"SELECT 3"[..]));
        // Plain text is no attribute block; nor is one cut short.
        assert_eq!(query_after_attributes(b"select 1"), None);
        assert_eq!(
            query_after_attributes(b"\x01\x01\x00\x01\xfe\x00\x05ab"),
            None
        );
        assert_eq!(query_after_attributes(b"\x00\x02select"), None);
    }

    use super::*;

    fn packet(seq: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut p = len.to_le_bytes()[..3].to_vec();
        p.push(seq);
        p.extend_from_slice(payload);
        p
    }

    /// Runs `f` on every proper prefix of `buf`: none may panic.
    fn prefixes<T>(buf: &[u8], mut f: impl FnMut(&[u8]) -> T) {
        for i in 0..buf.len() {
            f(&buf[..i]);
        }
    }

    fn mariadb_greeting() -> Vec<u8> {
        let mut p = vec![0x0a];
        p.extend_from_slice(b"5.5.5-10.11.6-MariaDB-0+deb12u1\0");
        p.extend_from_slice(&42u32.to_le_bytes());
        p.extend_from_slice(b"Xg3#k)9a"); // auth-plugin-data part 1
        p.push(0); // filler
        p.extend_from_slice(&0xf7feu16.to_le_bytes()); // MariaDB clears CLIENT_LONG_PASSWORD (= CLIENT_MYSQL)
        p.push(0x2d); // utf8mb4_general_ci
        p.extend_from_slice(&0x0002u16.to_le_bytes()); // SERVER_STATUS_AUTOCOMMIT
        p.extend_from_slice(&0x81ffu16.to_le_bytes());
        p.push(21); // auth-plugin-data length
        p.extend_from_slice(&[0; 6]);
        p.extend_from_slice(&0x0000_001du32.to_le_bytes()); // MariaDB extended capabilities
        p.extend_from_slice(b"Q2`h=NK7v\"u]\0");
        p.extend_from_slice(b"mysql_native_password\0");
        p
    }

    fn mysql8_greeting() -> Vec<u8> {
        let mut p = vec![0x0a];
        p.extend_from_slice(b"8.0.36\0");
        p.extend_from_slice(&7u32.to_le_bytes());
        p.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 0]);
        p.extend_from_slice(&0xffffu16.to_le_bytes());
        p.push(0xff);
        p.extend_from_slice(&0x0002u16.to_le_bytes());
        p.extend_from_slice(&0xdfffu16.to_le_bytes());
        p.push(21);
        p.extend_from_slice(&[0; 10]);
        p.extend_from_slice(&[9; 12]);
        p.push(0);
        p.extend_from_slice(b"caching_sha2_password\0");
        p
    }

    const CAPS41: u32 = CLIENT_LONG_PASSWORD
        | CLIENT_PROTOCOL_41
        | CLIENT_SECURE_CONNECTION
        | CLIENT_TRANSACTIONS
        | CLIENT_MULTI_RESULTS
        | CLIENT_PLUGIN_AUTH;

    fn response41(caps: u32, user: &str, auth: &[u8], db: Option<&str>) -> Vec<u8> {
        let mut p = caps.to_le_bytes().to_vec();
        p.extend_from_slice(&0x0100_0000u32.to_le_bytes());
        p.push(0x2d);
        p.extend_from_slice(&[0; 23]);
        p.extend_from_slice(user.as_bytes());
        p.push(0);
        // Short auth data: its lenenc length is one byte, like the 1-byte length.
        if caps & (CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA | CLIENT_SECURE_CONNECTION) != 0 {
            p.push(auth.len() as u8);
            p.extend_from_slice(auth);
        } else {
            p.extend_from_slice(auth);
            p.push(0);
        }
        if let Some(db) = db {
            p.extend_from_slice(db.as_bytes());
            p.push(0);
        }
        if caps & CLIENT_PLUGIN_AUTH != 0 {
            p.extend_from_slice(b"mysql_native_password\0");
        }
        if caps & CLIENT_CONNECT_ATTRS != 0 {
            p.extend_from_slice(b"\x0c\x0c_client_name\x00"); // lenenc attrs, deliberately cut short
        }
        p
    }

    #[test]
    fn command_names() {
        let expected = [
            "Sleep",
            "Quit",
            "Init DB",
            "Query",
            "Field List",
            "Create DB",
            "Drop DB",
            "Refresh",
            "Shutdown",
            "Statistics",
            "Processlist",
            "Connect",
            "Kill",
            "Debug",
            "Ping",
            "Time",
            "Delayed insert",
            "Change user",
            "Binlog Dump",
            "Table Dump",
            "Connect Out",
            "Register Slave",
            "Prepare",
            "Execute",
            "Long Data",
            "Close stmt",
            "Reset stmt",
            "Set option",
            "Fetch",
            "Daemon",
            "Binlog Dump GTID",
            "Reset Connection",
        ];
        for (cmd, name) in (0u8..).zip(expected) {
            assert_eq!(command_name(cmd), name, "{cmd:#x}");
        }
        assert_eq!(command_name(COM_QUERY), "Query");
        assert_eq!(command_name(COM_INIT_DB), "Init DB");
        assert_eq!(command_name(COM_STMT_EXECUTE), "Execute");
        assert_eq!(command_name(COM_MULTI), "Com_multi");
        assert_eq!(command_name(COM_STMT_BULK_EXECUTE), "Bulk_execute");
        for cmd in [0x22, 0x80, 0xf9, 0xff] {
            assert_eq!(command_name(cmd), "Unknown");
        }
    }

    #[test]
    fn split_packets() {
        let p = packet(3, b"\x03SELECT 1");
        assert_eq!(split_packet(&p), Some((9, 3, &b"\x03SELECT 1"[..])));
        assert_eq!(split_packet(&p[..7]), Some((9, 3, &b"\x03SE"[..])));
        assert_eq!(split_packet(&p[..4]), Some((9, 3, &b""[..])));
        assert_eq!(split_packet(&p[..3]), None);
        assert_eq!(split_packet(&[]), None);
        // Bytes after the payload belong to the next packet.
        let mut two = packet(0, b"\x0e");
        two.extend(packet(0, b"\x01"));
        assert_eq!(split_packet(&two), Some((1, 0, &b"\x0e"[..])));
        assert_eq!(
            split_packet(&[0xff, 0xff, 0xff, 7, 1]),
            Some((MAX_PAYLOAD_LEN, 7, &b"\x01"[..]))
        );
    }

    #[test]
    fn lenenc_ints() {
        assert_eq!(lenenc_int(&[0x00]), Some((0, 1)));
        assert_eq!(lenenc_int(&[0xfa, 9]), Some((250, 1)));
        assert_eq!(lenenc_int(&[0xfb]), None);
        assert_eq!(lenenc_int(&[0xff, 1, 2]), None);
        assert_eq!(lenenc_int(&[0xfc, 0x34, 0x12]), Some((0x1234, 3)));
        assert_eq!(lenenc_int(&[0xfd, 0x56, 0x34, 0x12]), Some((0x12_3456, 4)));
        let eight = [0xfe, 8, 7, 6, 5, 4, 3, 2, 1, 0xaa];
        assert_eq!(lenenc_int(&eight), Some((0x0102_0304_0506_0708, 9)));
        assert_eq!(
            lenenc_int(&[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            Some((u64::MAX, 9))
        );
        assert_eq!(lenenc_int(&[]), None);
        prefixes(&eight[..9], |b| assert_eq!(lenenc_int(b), None));
        prefixes(&[0xfc, 1, 0], |b| assert_eq!(lenenc_int(b), None));
    }

    #[test]
    fn mariadb_greeting_parses() {
        let g = parse_greeting(&mariadb_greeting()).unwrap();
        assert_eq!(g.connection_id, 42);
        assert_eq!(g.server_version, "10.11.6-MariaDB-0+deb12u1");
        assert_eq!(g.capabilities, 0x81ff_f7fe);
        assert_ne!(g.capabilities & CLIENT_PROTOCOL_41, 0);
        // Through the framing, as read from the socket.
        let wire = packet(0, &mariadb_greeting());
        let (len, seq, payload) = split_packet(&wire).unwrap();
        assert_eq!((len as usize, seq), (payload.len(), 0));
        assert_eq!(parse_greeting(payload), Some(g));
    }

    #[test]
    fn mysql_greeting_parses() {
        let g = parse_greeting(&mysql8_greeting()).unwrap();
        assert_eq!(
            g,
            Greeting {
                connection_id: 7,
                server_version: "8.0.36".into(),
                capabilities: 0xdfff_ffff
            }
        );
    }

    #[test]
    fn greeting_prefixes_and_garbage() {
        let full = mariadb_greeting();
        let version_end = 1 + full.iter().position(|&b| b == 0).unwrap();
        let lower_caps_end = version_end + 4 + 8 + 1 + 2;
        for i in 0..full.len() {
            let g = parse_greeting(&full[..i]);
            assert_eq!(g.is_some(), i >= lower_caps_end, "prefix {i}");
            if let Some(g) = g {
                assert_eq!(g.connection_id, 42);
                // Upper capabilities only once they are there.
                assert_eq!(
                    g.capabilities >> 16 != 0,
                    i >= lower_caps_end + 5,
                    "prefix {i}"
                );
            }
        }
        assert_eq!(parse_greeting(b"\xff\x10\x04Too many connections"), None);
        assert_eq!(parse_greeting(b"\x09old\0"), None);
        assert_eq!(parse_greeting(b"\x0a5.0 no nul"), None);
        // A bare "5.5.5-" is left alone rather than emptied.
        let mut p = full.clone();
        p.splice(1..version_end - 1, b"5.5.5-".iter().copied());
        assert_eq!(parse_greeting(&p).unwrap().server_version, "5.5.5-");
    }

    #[test]
    fn handshake_response_secure_connection() {
        let caps = CAPS41 | CLIENT_CONNECT_WITH_DB;
        let p = response41(caps, "sbtest", &[0xab; 20], Some("sbtest"));
        let r = parse_handshake_response(&p).unwrap();
        assert_eq!(
            r,
            HandshakeResponse {
                user: "sbtest".into(),
                database: Some("sbtest".into()),
                capabilities: caps,
                ssl_request: false
            }
        );
        // The scramble may contain NUL bytes: its length is what counts.
        let p = response41(caps, "root", &[0; 20], Some("db1"));
        assert_eq!(
            parse_handshake_response(&p).unwrap().database.as_deref(),
            Some("db1")
        );
    }

    #[test]
    fn handshake_response_lenenc_and_attrs() {
        let caps = CAPS41
            | CLIENT_CONNECT_WITH_DB
            | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
            | CLIENT_CONNECT_ATTRS;
        let p = response41(caps, "app", &[0; 32], Some("shop"));
        let r = parse_handshake_response(&p).unwrap();
        assert_eq!(
            (r.user.as_str(), r.database.as_deref()),
            ("app", Some("shop"))
        );
        // A longer auth response: 0xfc-prefixed length.
        let mut p = response41(caps & !CLIENT_CONNECT_ATTRS, "u", &[], Some("d"));
        let at = 32 + 2;
        p.splice(at..at + 1, [0xfc, 0x2c, 0x01].into_iter().chain([7u8; 300]));
        assert_eq!(
            parse_handshake_response(&p).unwrap().database.as_deref(),
            Some("d")
        );
    }

    #[test]
    fn handshake_response_without_db_or_secure_connection() {
        let r = parse_handshake_response(&response41(CAPS41, "nodb", &[1; 20], None)).unwrap();
        assert_eq!((r.user.as_str(), r.database), ("nodb", None));
        let caps = CLIENT_PROTOCOL_41 | CLIENT_CONNECT_WITH_DB;
        let r = parse_handshake_response(&response41(caps, "old", b"scrambl", Some("x"))).unwrap();
        assert_eq!((r.user.as_str(), r.database.as_deref()), ("old", Some("x")));
        // Empty database name.
        let r = parse_handshake_response(&response41(
            CAPS41 | CLIENT_CONNECT_WITH_DB,
            "u",
            &[],
            Some(""),
        ))
        .unwrap();
        assert_eq!(r.database, None);
        // Database not NUL-terminated at the very end: read as the server does.
        let mut p = response41(
            CAPS41 & !CLIENT_PLUGIN_AUTH | CLIENT_CONNECT_WITH_DB,
            "u",
            &[],
            Some("tail"),
        );
        p.pop();
        assert_eq!(
            parse_handshake_response(&p).unwrap().database.as_deref(),
            Some("tail")
        );
    }

    #[test]
    fn ssl_request() {
        let caps = CAPS41 | CLIENT_SSL;
        let p = response41(caps, "", &[], None);
        let r = parse_handshake_response(&p[..32]).unwrap();
        assert!(r.ssl_request);
        assert_eq!(
            (r.user.as_str(), r.database, r.capabilities),
            ("", None, caps)
        );
        // Without CLIENT_SSL a 32-byte packet is just truncated.
        assert_eq!(
            parse_handshake_response(&response41(CAPS41, "", &[], None)[..32]),
            None
        );
        let r = parse_handshake_response(&[0x00, 0x08, 0, 0, 1]).unwrap();
        assert!(r.ssl_request);
    }

    #[test]
    fn handshake_response_320() {
        let caps = (CLIENT_LONG_PASSWORD | CLIENT_CONNECT_WITH_DB) as u16;
        let mut p = caps.to_le_bytes().to_vec();
        p.extend_from_slice(&[0, 0, 1]);
        p.extend_from_slice(b"old\0scramble\0mydb\0");
        let r = parse_handshake_response(&p).unwrap();
        assert_eq!(
            (r.user.as_str(), r.database.as_deref(), r.ssl_request),
            ("old", Some("mydb"), false)
        );
        let mut p = (CLIENT_LONG_PASSWORD as u16).to_le_bytes().to_vec();
        p.extend_from_slice(&[0, 0, 1]);
        p.extend_from_slice(b"old\0scramble");
        assert_eq!(parse_handshake_response(&p).unwrap().database, None);
    }

    #[test]
    fn handshake_response_prefixes() {
        let caps = CAPS41 | CLIENT_CONNECT_WITH_DB | CLIENT_CONNECT_ATTRS;
        let full = response41(caps, "sbtest", &[0x5a; 20], Some("sbtest"));
        let db_at = 32 + 7 + 21;
        for i in 0..full.len() {
            let r = parse_handshake_response(&full[..i]);
            if i < db_at {
                assert_eq!(r, None, "prefix {i}");
            } else {
                let r = r.unwrap();
                assert_eq!(r.user, "sbtest");
                // A cut database name is read as far as it goes.
                assert!(
                    "sbtest".starts_with(r.database.as_deref().unwrap_or("")),
                    "prefix {i}"
                );
            }
        }
        for caps in [
            CAPS41 | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA,
            CLIENT_PROTOCOL_41,
            CLIENT_CONNECT_WITH_DB,
        ] {
            prefixes(
                &response41(caps, "u", b"x", Some("d")),
                parse_handshake_response,
            );
        }
        // Garbage auth lengths.
        let mut p = response41(
            CAPS41 | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA | CLIENT_CONNECT_WITH_DB,
            "u",
            &[],
            Some("d"),
        );
        p.splice(
            34..35,
            [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        );
        assert_eq!(parse_handshake_response(&p), None);
        p.splice(34..43, [0xfb]);
        assert_eq!(parse_handshake_response(&p), None);
    }

    #[test]
    fn change_user() {
        let caps = CAPS41 | CLIENT_CONNECT_WITH_DB;
        let mut p = vec![COM_CHANGE_USER];
        p.extend_from_slice(b"bob\0\x14");
        p.extend_from_slice(&[0; 20]);
        p.extend_from_slice(b"reports\0\x2d\x00mysql_native_password\0");
        let r = parse_change_user(&p, caps).unwrap();
        assert_eq!(
            (r.user.as_str(), r.database.as_deref()),
            ("bob", Some("reports"))
        );
        assert_eq!(parse_change_user(&p, 0).map(|r| r.user), Some("bob".into()));
        assert_eq!(parse_change_user(b"\x03bob\0", caps), None);
        prefixes(&p, |b| parse_change_user(b, caps));
        prefixes(&p, |b| parse_change_user(b, 0));
    }

    #[test]
    fn reply_ok_eof_infile() {
        let ok = b"\x00\x01\x00\x02\x00\x00\x00";
        assert_eq!(parse_reply(ok, COM_QUERY), Reply::Ok);
        assert_eq!(
            parse_ok(ok),
            Some(OkInfo {
                affected_rows: 1,
                last_insert_id: 0,
                status: 2,
                warnings: 0
            })
        );
        let big = b"\x00\xfc\x10\x27\xfd\x01\x00\x01\x22\x00\x03\x00";
        assert_eq!(
            parse_ok(big),
            Some(OkInfo {
                affected_rows: 10000,
                last_insert_id: 0x01_0001,
                status: 0x22,
                warnings: 3
            })
        );
        prefixes(big, |b| assert_eq!(parse_ok(b), None));
        assert_eq!(parse_ok(b"\xff\x00\x00"), None);
        assert_eq!(parse_reply(b"\x00", COM_PING), Reply::Ok);
        assert_eq!(parse_reply(b"\xfe\x00\x00\x02\x00", COM_QUERY), Reply::Eof);
        assert_eq!(parse_reply(b"\xfe", COM_FIELD_LIST), Reply::Eof);
        // CLIENT_DEPRECATE_EOF's OK packet, e.g. to COM_STMT_FETCH past the last row.
        let ok_fe = b"\xfe\x00\x00\x82\x00\x00\x00\x00\x00";
        assert_eq!(parse_reply(ok_fe, COM_STMT_FETCH), Reply::Ok);
        assert_eq!(parse_ok(ok_fe).map(|o| o.status), Some(0x82));
        assert_eq!(
            parse_reply(b"\xfb/tmp/data.csv", COM_QUERY),
            Reply::LocalInfile
        );
        assert_eq!(parse_reply(b"", COM_QUERY), Reply::Unknown);
    }

    #[test]
    fn reply_error_1146() {
        let p = b"\xff\x7a\x04#42S02Table 'test.no_such_table' doesn't exist";
        let expected = Reply::Err {
            code: 1146,
            sql_state: Some("42S02".into()),
            message: "Table 'test.no_such_table' doesn't exist".into(),
        };
        assert_eq!(parse_reply(p, COM_QUERY), expected);
        assert_eq!(parse_reply(p, COM_STMT_PREPARE), expected);
        assert_eq!(parse_reply(p, COM_CHANGE_USER), expected);
        let wire = packet(1, p);
        assert_eq!(
            parse_reply(split_packet(&wire).unwrap().2, COM_QUERY),
            expected
        );
        for i in 1..p.len() {
            match parse_reply(&p[..i], COM_QUERY) {
                Reply::Err {
                    code,
                    sql_state,
                    message,
                } => {
                    assert_eq!(code, if i >= 3 { 1146 } else { 0 }, "prefix {i}");
                    assert_eq!(sql_state.is_some(), i >= 9, "prefix {i}");
                    assert!(
                        expected_message(p).starts_with(&message) || i < 9,
                        "prefix {i}"
                    );
                }
                other => panic!("prefix {i}: {other:?}"),
            }
        }
        fn expected_message(p: &[u8]) -> String {
            String::from_utf8_lossy(&p[9..]).into_owned()
        }
    }

    #[test]
    fn reply_error_without_sqlstate() {
        let p = b"\xff\x10\x04Too many connections";
        assert_eq!(
            parse_reply(p, COM_QUERY),
            Reply::Err {
                code: 1040,
                sql_state: None,
                message: "Too many connections".into()
            }
        );
        assert_eq!(
            parse_reply(b"\xff\x15\x04#28", COM_QUERY),
            Reply::Err {
                code: 1045,
                sql_state: None,
                message: "#28".into()
            }
        );
    }

    #[test]
    fn reply_progress_report_is_not_final() {
        let p = b"\xff\xff\xff\x01\x00\x01\xe8\x03\x00\x0bcopy to tmp";
        assert_eq!(parse_reply(p, COM_QUERY), Reply::Unknown);
        assert!(is_progress_report(p));
        assert!(!is_progress_report(b"\xff\x7a\x04#42S02"));
        assert!(!is_progress_report(b"\xff\xff"));
        // Captured reply bytes: two progress reports, then the OK.
        let mut wire = packet(1, p);
        wire.extend(packet(1, p));
        wire.extend(packet(1, b"\x00\x00\x00\x02\x00\x00\x00"));
        assert_eq!(parse_reply_stream(&wire, COM_QUERY), Reply::Ok);
        prefixes(&wire, |b| {
            let r = parse_reply_stream(b, COM_QUERY);
            // A packet cut to 1-2 bytes cannot tell a progress report from an error.
            let cut = matches!(r, Reply::Err { code: 0, .. });
            assert!(cut || matches!(r, Reply::Unknown | Reply::Ok), "{r:?}");
        });
        let err = packet(1, b"\xff\x7a\x04#42S02Table 't.x' doesn't exist");
        assert!(matches!(
            parse_reply_stream(&err, COM_QUERY),
            Reply::Err { code: 1146, .. }
        ));
        assert_eq!(
            parse_reply_stream(&packet(1, b"\x03"), COM_QUERY),
            Reply::ResultSet { columns: 3 }
        );
        assert_eq!(parse_reply_stream(&[], COM_QUERY), Reply::Unknown);
    }

    #[test]
    fn reply_to_text_commands() {
        assert_eq!(
            parse_reply(b"Uptime: 42  Threads: 1  Questions: 7", COM_STATISTICS),
            Reply::Ok
        );
        assert_eq!(
            parse_reply(b"\x03def\x04test\x01t\x01t\x01a\x01a\x0c", COM_FIELD_LIST),
            Reply::Ok
        );
        assert_eq!(
            parse_reply(b"\xfe\x00\x00\x02\x00", COM_FIELD_LIST),
            Reply::Eof
        );
        assert!(matches!(
            parse_reply(b"\xff\x7a\x04#42S02no", COM_FIELD_LIST),
            Reply::Err { code: 1146, .. }
        ));
    }

    #[test]
    fn reply_result_sets() {
        assert_eq!(
            parse_reply(b"\x01", COM_QUERY),
            Reply::ResultSet { columns: 1 }
        );
        assert_eq!(
            parse_reply(b"\x04", COM_STMT_EXECUTE),
            Reply::ResultSet { columns: 4 }
        );
        assert_eq!(
            parse_reply(b"\xfc\x2c\x01", COM_QUERY),
            Reply::ResultSet { columns: 300 }
        );
        // With CLIENT_OPTIONAL_RESULTSET_METADATA a metadata-follows byte comes after the count.
        assert_eq!(
            parse_reply(b"\x02\x01", COM_QUERY),
            Reply::ResultSet { columns: 2 }
        );
        assert_eq!(
            parse_reply(b"Uptime: 42  Threads: 1", COM_QUERY),
            Reply::Unknown
        );
        assert_eq!(parse_reply(b"\xfc\x01", COM_QUERY), Reply::Unknown);
        assert_eq!(parse_reply(b"\xfd", COM_QUERY), Reply::Unknown);
    }

    /// A ColumnDefinition41 payload; `extended` adds MariaDB's extended metadata (an empty string).
    fn column(schema: &str, table: &str, org_table: &str, name: &str, extended: bool) -> Vec<u8> {
        let mut p = Vec::new();
        for s in ["def", schema, table, org_table, name, name] {
            p.push(s.len() as u8);
            p.extend(s.as_bytes());
        }
        if extended {
            p.push(0);
        }
        p.extend([0x0c, 0x2d, 0, 0xe0, 1, 0, 0, 0xfe, 1, 0, 0, 0, 0]);
        p
    }

    #[test]
    fn result_columns_name_tables_and_columns() {
        let mut reply = packet(1, b"\x03");
        reply.extend(packet(2, &column("sbtest", "s", "sbtest1", "c", false)));
        reply.extend(packet(3, &column("sbtest", "s", "sbtest1", "pad", false)));
        reply.extend(packet(4, &column("", "", "", "SUM(k)", false)));
        reply.extend(packet(5, b"\xfe\x00\x00\x02\x00"));
        let r = result_columns(&reply).unwrap();
        assert_eq!(r.tables, ["sbtest.sbtest1"]);
        assert_eq!(r.names, ["c", "pad", "SUM(k)"]);
        assert_eq!(r.label(), "SELECT … FROM sbtest.sbtest1 (c, pad, SUM(k))");
        // Cut after the first definition: what was seen, and that there is more.
        let cut = &reply[..4 + 1 + 4 + column("sbtest", "s", "sbtest1", "c", false).len() + 3];
        let r = result_columns(cut).unwrap();
        assert_eq!(r.label(), "SELECT … FROM sbtest.sbtest1 (c, …)");
        // Metadata follows (1), with MariaDB's extended metadata in the definitions.
        let mut reply = packet(1, b"\x01\x01");
        reply.extend(packet(2, &column("db", "t", "t", "v", true)));
        assert_eq!(
            result_columns(&reply).unwrap().label(),
            "SELECT … FROM db.t (v)"
        );
    }

    #[test]
    fn result_columns_absent() {
        // Connector/C caches metadata: the count, a zero metadata-follows byte, then rows (sysbench's reply).
        let reply = b"\x02\x00\x00\x01\x01\x00\x05\x00\x00\x02\xfe\x00\x00\x03\x00";
        assert_eq!(result_columns(reply), None);
        for reply in [
            &packet(1, b"\x00\x01\x00\x02\x00\x00\x00")[..], // OK
            &packet(1, b"\xff\x7a\x04#42S02no")[..],
            &packet(1, b"\x01")[..], // the count, and nothing after it
            &packet(1, b"\x01\x01\x01")[..],
            b"",
            b"\x05\x00",
        ] {
            assert_eq!(result_columns(reply), None, "{reply:?}");
        }
        let mut bad = packet(1, b"\x01");
        bad.extend(packet(2, b"\x03abc\x00\x00\x00\x01c\x01c"));
        assert_eq!(
            result_columns(&bad),
            None,
            "not a definition: catalog is not def"
        );
    }

    #[test]
    fn reply_prepare_ok() {
        let p = b"\x00\x07\x00\x00\x00\x02\x00\x03\x00\x00\x00\x00";
        assert_eq!(
            parse_reply(p, COM_STMT_PREPARE),
            Reply::PrepareOk {
                statement_id: 7,
                columns: 2,
                params: 3
            }
        );
        assert_eq!(parse_reply(p, COM_QUERY), Reply::Ok);
        for i in 1..9 {
            assert_eq!(
                parse_reply(&p[..i], COM_STMT_PREPARE),
                Reply::Ok,
                "prefix {i}"
            );
        }
        assert!(matches!(
            parse_reply(&p[..9], COM_STMT_PREPARE),
            Reply::PrepareOk {
                statement_id: 7,
                ..
            }
        ));
    }

    #[test]
    fn reply_change_user() {
        assert_eq!(
            parse_reply(b"\x00\x00\x00\x02\x00\x00\x00", COM_CHANGE_USER),
            Reply::Ok
        );
        assert_eq!(
            parse_reply(b"\xfecaching_sha2_password\0abc", COM_CHANGE_USER),
            Reply::Unknown
        );
        assert_eq!(parse_reply(b"\x01\x03", COM_CHANGE_USER), Reply::Unknown);
    }

    #[test]
    fn reply_never_panics() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let bytes = seed.to_le_bytes();
            let len = (seed >> 60) as usize % 9;
            for cmd in [COM_QUERY, COM_STMT_PREPARE, COM_CHANGE_USER] {
                let _ = parse_reply(&bytes[..len], cmd);
            }
            let _ = parse_greeting(&bytes[..len]);
            let _ = parse_handshake_response(&bytes[..len]);
            let _ = split_packet(&bytes[..len]);
            let _ = parse_ok(&bytes[..len]);
        }
    }

    #[test]
    fn statement_ids() {
        let exec = b"\x17\x05\x00\x00\x00\x00\x01\x00\x00\x00";
        assert_eq!(stmt_execute_id(exec), Some(5));
        for cmd in [
            COM_STMT_CLOSE,
            COM_STMT_RESET,
            COM_STMT_SEND_LONG_DATA,
            COM_STMT_FETCH,
            COM_STMT_BULK_EXECUTE,
        ] {
            assert_eq!(
                stmt_execute_id(&[cmd, 0x01, 0x02, 0x00, 0x00]),
                Some(0x0201)
            );
        }
        assert_eq!(stmt_execute_id(b"\xff\xff\xff\xff\xff"), None);
        assert_eq!(
            stmt_execute_id(&[COM_STMT_EXECUTE, 0xff, 0xff, 0xff, 0xff]),
            Some(u32::MAX)
        );
        assert_eq!(stmt_execute_id(b"\x03SELECT 1"), None);
        prefixes(&exec[..5], |b| assert_eq!(stmt_execute_id(b), None));
    }

    #[test]
    fn init_db() {
        assert_eq!(init_db_name(b"\x02sbtest"), Some("sbtest".into()));
        assert_eq!(init_db_name(b"\x02my db\0"), Some("my db".into()));
        assert_eq!(init_db_name(b"\x02"), None);
        assert_eq!(init_db_name(b"\x02\0"), None);
        assert_eq!(init_db_name(b""), None);
        assert_eq!(init_db_name(b"\x03sbtest"), None);
        assert_eq!(init_db_name(b"\x02caf\xc3\xa9"), Some("café".into()));
        assert_eq!(init_db_name(b"\x02caf\xc3"), Some("caf\u{fffd}".into()));
    }

    #[test]
    fn use_statements() {
        for (sql, db) in [
            ("USE sbtest", "sbtest"),
            ("use sbtest;", "sbtest"),
            ("  \n\tUse   Shop_2 ; ", "Shop_2"),
            ("/* app */ USE db1", "db1"),
            ("-- hi\n# there\nuse db1", "db1"),
            ("USE `my db`", "my db"),
            ("use`quoted`", "quoted"),
            ("USE `we``ird`;", "we`ird"),
            ("USE db /* c */ ;", "db"),
            ("USE d1; SELECT 1", "d1"),
            ("USE café", "café"),
        ] {
            assert_eq!(use_statement_db(sql).as_deref(), Some(db), "{sql:?}");
        }
        for sql in [
            "",
            "USE",
            "USE ;",
            "use ``",
            "USE `unterminated",
            "user",
            "USEdb",
            "SELECT 1",
            "USE a b",
            "USE db.t",
            "use 'db'",
            "-- USE db",
            "/* USE db",
            "SET @x = 'USE db'",
        ] {
            assert_eq!(use_statement_db(sql), None, "{sql:?}");
        }
        let s = "/* x */ USE `a``b`; ";
        for i in 0..=s.len() {
            if let Some(p) = s.get(..i) {
                let _ = use_statement_db(p);
            }
        }
    }
}
