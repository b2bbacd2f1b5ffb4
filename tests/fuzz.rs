//! Property tests of every parser that reads untrusted bytes (the wire protocol, statement text, folded
//! stacks) and of the query tracker fed sequences of events. Every target checks that nothing panics;
//! where the generator builds a well-formed input, the parser must return exactly what was built.
//!
//! `make test` runs a short corpus (the defaults below); `make fuzz` (scripts/fuzz) runs each target
//! long with fresh seeds. `PROPTEST_CASES` sets the inputs per target, `PROPTEST_RNG_SEED` replays a run.

use std::collections::{BTreeMap, HashSet};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, Index};

use myprobe::collect::queries::{RawStatement, Wire};
use myprobe::profile::{folded, Profile, Unit};
use myprobe::query::{dispatch_fd, Tracker, MAX_CONNS, MAX_PREPARED_PER_CONN};
use myprobe::wire::fingerprint::{fingerprint, fingerprint_bytes, normalize, normalize_bytes};
use myprobe::wire::protocol::{self as p, Greeting, HandshakeResponse, OkInfo, Reply};

/// Cases per target: `PROPTEST_CASES` when set, else `default`. No failure files: a failure prints its
/// minimal input, scripts/fuzz prints the seed, and a bug found gets a unit test next to its parser.
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// Building blocks

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn contains_bytes(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

fn packet(seq: u8, payload: &[u8]) -> Vec<u8> {
    let mut b = (payload.len() as u32).to_le_bytes()[..3].to_vec();
    b.push(seq);
    b.extend_from_slice(payload);
    b
}

/// A length-encoded integer, in at least `min_width` bytes after the prefix (0: the one-byte form):
/// a longer form than needed is still valid.
fn lenenc(v: u64, min_width: usize) -> Vec<u8> {
    let need = match v {
        0..=250 => 0,
        251..=0xffff => 2,
        0x1_0000..=0xff_ffff => 3,
        _ => 8,
    };
    match need.max(min_width) {
        0 => vec![v as u8],
        2 => [&[0xfc][..], &v.to_le_bytes()[..2]].concat(),
        3 => [&[0xfd][..], &v.to_le_bytes()[..3]].concat(),
        _ => [&[0xfe][..], &v.to_le_bytes()[..]].concat(),
    }
}

fn lenenc_width() -> impl Strategy<Value = usize> {
    prop_oneof![4 => Just(0), 1 => Just(2), 1 => Just(3), 1 => Just(8)]
}

/// Bytes biased towards what protocol and SQL parsers branch on.
fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    let special = select(
        b"\0\x01\x02\x03\x0a\x11\x16\x17\x19\x1f\xfa\xfb\xfc\xfd\xfe\xff#`'\";/*-\\ \n".to_vec(),
    );
    vec(prop_oneof![any::<u8>(), special], 0..=max)
}

fn no_nul(max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(1u8..=255, 0..=max)
}

/// `bytes` with a few bytes overwritten: a well-formed input slightly broken.
fn mutate(bytes: Vec<u8>, edits: &[(Index, u8)]) -> Vec<u8> {
    let mut b = bytes;
    for (i, v) in edits {
        if !b.is_empty() {
            let at = i.index(b.len());
            b[at] = *v;
        }
    }
    b
}

fn edits() -> impl Strategy<Value = Vec<(Index, u8)>> {
    vec((any::<Index>(), any::<u8>()), 0..4)
}

// Protocol: packets

proptest! {
    #![proptest_config(config(20_000))]

    #[test]
    fn split_packet_any_bytes(buf in bytes(40)) {
        match p::split_packet(&buf) {
            None => prop_assert!(buf.len() < 4),
            Some((len, seq, payload)) => {
                prop_assert_eq!(len, u32::from_le_bytes([buf[0], buf[1], buf[2], 0]));
                prop_assert_eq!(seq, buf[3]);
                let end = (len as usize + 4).min(buf.len());
                prop_assert_eq!(payload, &buf[4..end]);
            }
        }
    }

    #[test]
    fn split_packet_well_formed(seq in any::<u8>(), payload in bytes(300), after in bytes(20)) {
        let mut wire = packet(seq, &payload);
        wire.extend_from_slice(&after);
        prop_assert_eq!(
            p::split_packet(&wire),
            Some((payload.len() as u32, seq, &payload[..]))
        );
    }
}

// Protocol: the server greeting

#[derive(Debug, Clone)]
struct GreetingSpec {
    mariadb_prefix: bool,
    version: Vec<u8>,
    connection_id: u32,
    salt: Vec<u8>,
    capabilities: u32,
    charset: u8,
    status: u16,
    tail: Vec<u8>,
    cut: Option<Index>,
}

/// After the version: connection id, auth-plugin-data part 1, filler.
const GREETING_FIXED: usize = 4 + 8 + 1;

impl GreetingSpec {
    fn full(&self) -> Vec<u8> {
        let mut b = vec![10];
        if self.mariadb_prefix {
            b.extend_from_slice(b"5.5.5-");
        }
        b.extend_from_slice(&self.version);
        b.push(0);
        b.extend_from_slice(&self.connection_id.to_le_bytes());
        b.extend_from_slice(&self.salt);
        b.push(0);
        b.extend_from_slice(&(self.capabilities as u16).to_le_bytes());
        b.push(self.charset);
        b.extend_from_slice(&self.status.to_le_bytes());
        b.extend_from_slice(&((self.capabilities >> 16) as u16).to_le_bytes());
        b.extend_from_slice(&self.tail);
        b
    }

    /// The greeting cut where `cut` says (as a capture may be), and what it must parse as.
    fn cut(&self) -> (Vec<u8>, Option<Greeting>) {
        let mut b = self.full();
        if let Some(cut) = self.cut {
            b.truncate(cut.index(b.len() + 1));
        }
        let version_len = self.version.len() + if self.mariadb_prefix { 6 } else { 0 };
        let lower_end = 1 + version_len + 1 + GREETING_FIXED + 2;
        if b.len() < lower_end {
            return (b, None);
        }
        let upper = if b.len() >= lower_end + 5 {
            self.capabilities & 0xffff_0000
        } else {
            0
        };
        let full_version = &b[1..1 + version_len];
        let version = full_version
            .strip_prefix(b"5.5.5-")
            .filter(|v| !v.is_empty())
            .unwrap_or(full_version);
        let expected = Greeting {
            connection_id: self.connection_id,
            server_version: lossy(version),
            capabilities: upper | (self.capabilities & 0xffff),
        };
        (b, Some(expected))
    }
}

prop_compose! {
    fn greeting_spec()(
        mariadb_prefix in any::<bool>(),
        version in prop_oneof![
            Just(b"10.11.6-MariaDB-0+deb12u1".to_vec()),
            Just(b"8.0.36".to_vec()),
            Just(b"5.5.5-".to_vec()),
            Just(Vec::new()),
            no_nul(30),
        ],
        connection_id in any::<u32>(),
        salt in vec(any::<u8>(), 8),
        capabilities in any::<u32>(),
        charset in any::<u8>(),
        status in any::<u16>(),
        tail in bytes(40),
        cut in proptest::option::weighted(0.25, any::<Index>()),
    ) -> GreetingSpec {
        GreetingSpec {
            mariadb_prefix, version, connection_id, salt, capabilities, charset, status, tail, cut,
        }
    }
}

proptest! {
    #![proptest_config(config(20_000))]

    #[test]
    fn greeting_any_bytes(buf in bytes(80), ten in any::<bool>()) {
        let buf = if ten { [&[10][..], &buf].concat() } else { buf };
        if let Some(g) = p::parse_greeting(&buf) {
            prop_assert_eq!(buf[0], 10);
            prop_assert_eq!(g.server_version.is_empty(), buf.get(1) == Some(&0));
        }
    }

    #[test]
    fn greeting_well_formed(spec in greeting_spec(), edits in edits()) {
        let (b, expected) = spec.cut();
        prop_assert_eq!(p::parse_greeting(&b), expected);
        let _ = p::parse_greeting(&mutate(b, &edits));
    }
}

// Protocol: the handshake response and COM_CHANGE_USER

#[derive(Debug, Clone, Copy)]
enum AuthLayout {
    /// `CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA`: a length-encoded length, in this width at least.
    Lenenc(usize),
    /// `CLIENT_SECURE_CONNECTION`: a one-byte length.
    Secure,
    /// Neither: NUL-terminated.
    Nul,
}

#[derive(Debug, Clone)]
struct ResponseSpec {
    layout: AuthLayout,
    capabilities: u32,
    max_packet: u32,
    charset: u8,
    filler: Vec<u8>,
    user: Vec<u8>,
    auth: Vec<u8>,
    database: Option<Vec<u8>>,
    tail: Vec<u8>,
}

impl ResponseSpec {
    /// The capabilities as the generator drew them, made to agree with the layout, and the auth data
    /// made to fit it.
    fn agree(
        capabilities: u32,
        layout: AuthLayout,
        mut auth: Vec<u8>,
        database: Option<Vec<u8>>,
    ) -> (u32, Vec<u8>) {
        let mut caps = capabilities | p::CLIENT_PROTOCOL_41;
        caps &= !(p::CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA | p::CLIENT_SECURE_CONNECTION);
        match layout {
            AuthLayout::Lenenc(_) => caps |= p::CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA,
            AuthLayout::Secure => {
                caps |= p::CLIENT_SECURE_CONNECTION;
                auth.truncate(255);
            }
            AuthLayout::Nul => auth.retain(|&b| b != 0),
        }
        if database.is_some() {
            caps |= p::CLIENT_CONNECT_WITH_DB;
        } else {
            caps &= !p::CLIENT_CONNECT_WITH_DB;
        }
        (caps, auth)
    }

    fn full(&self) -> Vec<u8> {
        let mut b = self.capabilities.to_le_bytes().to_vec();
        b.extend_from_slice(&self.max_packet.to_le_bytes());
        b.push(self.charset);
        b.extend_from_slice(&self.filler);
        b.extend_from_slice(&self.user);
        b.push(0);
        match self.layout {
            AuthLayout::Lenenc(w) => b.extend(lenenc(self.auth.len() as u64, w)),
            AuthLayout::Secure => b.push(self.auth.len() as u8),
            AuthLayout::Nul => {}
        }
        b.extend_from_slice(&self.auth);
        if let AuthLayout::Nul = self.layout {
            b.push(0);
        }
        if let Some(db) = &self.database {
            b.extend_from_slice(db);
            b.push(0);
        }
        b.extend_from_slice(&self.tail);
        b
    }

    fn expected(&self) -> HandshakeResponse {
        HandshakeResponse {
            user: lossy(&self.user),
            database: self
                .database
                .as_deref()
                .filter(|d| !d.is_empty())
                .map(lossy),
            capabilities: self.capabilities,
            ssl_request: false,
        }
    }
}

prop_compose! {
    fn response_spec()(
        capabilities in any::<u32>(),
        layout in prop_oneof![
            lenenc_width().prop_map(AuthLayout::Lenenc),
            Just(AuthLayout::Secure),
            Just(AuthLayout::Nul),
        ],
        max_packet in any::<u32>(),
        charset in any::<u8>(),
        filler in vec(any::<u8>(), 23),
        user in no_nul(24),
        auth in prop_oneof![4 => bytes(24), 1 => vec(any::<u8>(), 240..300)],
        database in proptest::option::of(no_nul(24)),
        tail in prop_oneof![Just(b"mysql_native_password\0".to_vec()), bytes(30)],
    ) -> ResponseSpec {
        let (capabilities, auth) =
            ResponseSpec::agree(capabilities, layout, auth, database.clone());
        ResponseSpec {
            layout, capabilities, max_packet, charset, filler, user, auth, database, tail,
        }
    }
}

/// HandshakeResponse320: 16-bit capabilities, a 3-byte max packet size, NUL-terminated strings.
#[derive(Debug, Clone)]
struct Response320Spec {
    capabilities: u16,
    max_packet: [u8; 3],
    user: Vec<u8>,
    auth: Vec<u8>,
    database: Option<Vec<u8>>,
}

impl Response320Spec {
    fn bytes(&self) -> Vec<u8> {
        let mut b = self.capabilities.to_le_bytes().to_vec();
        b.extend_from_slice(&self.max_packet);
        b.extend_from_slice(&self.user);
        b.push(0);
        b.extend_from_slice(&self.auth);
        if let Some(db) = &self.database {
            b.push(0);
            b.extend_from_slice(db);
            b.push(0);
        }
        b
    }
}

prop_compose! {
    fn response320_spec()(
        capabilities in any::<u16>(),
        max_packet in any::<[u8; 3]>(),
        user in no_nul(16),
        auth in no_nul(16),
        database in proptest::option::of(no_nul(16)),
    ) -> Response320Spec {
        let mut capabilities = capabilities & !(p::CLIENT_PROTOCOL_41 as u16);
        if database.is_some() {
            capabilities |= p::CLIENT_CONNECT_WITH_DB as u16;
        } else {
            capabilities &= !(p::CLIENT_CONNECT_WITH_DB as u16);
        }
        Response320Spec { capabilities, max_packet, user, auth, database }
    }
}

proptest! {
    #![proptest_config(config(20_000))]

    #[test]
    fn handshake_response_any_bytes(buf in bytes(80), caps in any::<u32>()) {
        let _ = p::parse_handshake_response(&buf);
        // Past the capabilities, so that the parse goes deeper than the first check.
        let buf = [&caps.to_le_bytes()[..], &buf].concat();
        if let Some(r) = p::parse_handshake_response(&buf) {
            prop_assert!(!r.ssl_request || r.user.is_empty());
        }
    }

    #[test]
    fn handshake_response_well_formed(
        spec in response_spec(),
        cut in any::<Index>(),
        edits in edits(),
    ) {
        let full = spec.full();
        prop_assert_eq!(p::parse_handshake_response(&full), Some(spec.expected()));
        // Cut anywhere: never a wrong user, whatever else is missing.
        let cut = &full[..cut.index(full.len() + 1)];
        let user_end = 32 + spec.user.len() + 1;
        match p::parse_handshake_response(cut) {
            Some(r) if r.ssl_request => {
                prop_assert_eq!(cut.len(), 32);
                prop_assert!(spec.capabilities & p::CLIENT_SSL != 0);
            }
            Some(r) => {
                prop_assert!(cut.len() >= user_end);
                prop_assert_eq!(r.user, lossy(&spec.user));
                prop_assert_eq!(r.capabilities, spec.capabilities);
            }
            None => prop_assert!(cut.len() < full.len()),
        }
        let _ = p::parse_handshake_response(&mutate(full, &edits));
    }

    #[test]
    fn ssl_request_well_formed(caps in any::<u32>(), rest in vec(any::<u8>(), 28)) {
        let caps = caps | p::CLIENT_PROTOCOL_41 | p::CLIENT_SSL;
        let b = [&caps.to_le_bytes()[..], &rest].concat();
        let r = p::parse_handshake_response(&b);
        prop_assert_eq!(
            r,
            Some(HandshakeResponse {
                user: String::new(),
                database: None,
                capabilities: caps,
                ssl_request: true,
            })
        );
    }

    #[test]
    fn handshake_response_320_well_formed(spec in response320_spec()) {
        let expected = HandshakeResponse {
            user: lossy(&spec.user),
            database: spec.database.as_deref().filter(|d| !d.is_empty()).map(lossy),
            capabilities: u32::from(spec.capabilities),
            ssl_request: false,
        };
        prop_assert_eq!(p::parse_handshake_response(&spec.bytes()), Some(expected));
    }
}

#[derive(Debug, Clone)]
struct ChangeUserSpec {
    capabilities: u32,
    user: Vec<u8>,
    auth: Vec<u8>,
    database: Vec<u8>,
    /// Charset and auth plugin after the database's NUL, or the database unterminated at the end.
    tail: Option<Vec<u8>>,
}

impl ChangeUserSpec {
    fn bytes(&self) -> Vec<u8> {
        let mut b = vec![p::COM_CHANGE_USER];
        b.extend_from_slice(&self.user);
        b.push(0);
        if self.capabilities & p::CLIENT_SECURE_CONNECTION != 0 {
            b.push(self.auth.len() as u8);
            b.extend_from_slice(&self.auth);
        } else {
            b.extend(self.auth.iter().filter(|&&x| x != 0));
            b.push(0);
        }
        b.extend_from_slice(&self.database);
        if let Some(tail) = &self.tail {
            b.push(0);
            b.extend_from_slice(tail);
        }
        b
    }
}

prop_compose! {
    fn change_user_spec()(
        capabilities in any::<u32>(),
        user in no_nul(24),
        auth in bytes(40),
        database in no_nul(24),
        tail in proptest::option::of(prop_oneof![
            Just(b"\x2d\x00mysql_native_password\0".to_vec()),
            bytes(30),
        ]),
    ) -> ChangeUserSpec {
        ChangeUserSpec { capabilities, user, auth, database, tail }
    }
}

proptest! {
    #![proptest_config(config(20_000))]

    #[test]
    fn change_user_any_bytes(buf in bytes(80), caps in any::<u32>()) {
        let _ = p::parse_change_user(&buf, caps);
        let buf = [&[p::COM_CHANGE_USER][..], &buf].concat();
        if let Some(r) = p::parse_change_user(&buf, caps) {
            prop_assert!(!r.ssl_request);
            prop_assert_eq!(r.capabilities, caps);
        }
    }

    #[test]
    fn change_user_well_formed(
        spec in change_user_spec(),
        cut in any::<Index>(),
        edits in edits(),
    ) {
        let b = spec.bytes();
        let expected = HandshakeResponse {
            user: lossy(&spec.user),
            database: (!spec.database.is_empty()).then(|| lossy(&spec.database)),
            capabilities: spec.capabilities,
            ssl_request: false,
        };
        prop_assert_eq!(p::parse_change_user(&b, spec.capabilities), Some(expected));
        let cut = &b[..cut.index(b.len() + 1)];
        if let Some(r) = p::parse_change_user(cut, spec.capabilities) {
            prop_assert_eq!(r.user, lossy(&spec.user));
        }
        let _ = p::parse_change_user(&mutate(b, &edits), spec.capabilities);
    }
}

// Protocol: replies

#[derive(Debug, Clone)]
enum ReplySpec {
    Ok {
        affected_rows: (u64, usize),
        last_insert_id: (u64, usize),
        status: u16,
        warnings: u16,
        info: Vec<u8>,
    },
    Err {
        code: u16,
        sql_state: Option<[u8; 5]>,
        message: Vec<u8>,
    },
    PrepareOk {
        statement_id: u32,
        columns: u16,
        params: u16,
        warnings: u16,
    },
    ResultSet {
        columns: u64,
        width: usize,
        metadata_follows: Option<u8>,
    },
}

/// Commands whose reply is read as any other (not COM_STMT_PREPARE, COM_CHANGE_USER, COM_STATISTICS,
/// COM_FIELD_LIST, which have their own rules).
const PLAIN_COMMANDS: [u8; 6] = [
    p::COM_QUERY,
    p::COM_STMT_EXECUTE,
    p::COM_INIT_DB,
    p::COM_PING,
    p::COM_STMT_FETCH,
    p::COM_RESET_CONNECTION,
];

impl ReplySpec {
    fn payload(&self) -> Vec<u8> {
        match self {
            ReplySpec::Ok {
                affected_rows,
                last_insert_id,
                status,
                warnings,
                info,
            } => {
                let mut b = vec![0x00];
                b.extend(lenenc(affected_rows.0, affected_rows.1));
                b.extend(lenenc(last_insert_id.0, last_insert_id.1));
                b.extend_from_slice(&status.to_le_bytes());
                b.extend_from_slice(&warnings.to_le_bytes());
                b.extend_from_slice(info);
                b
            }
            ReplySpec::Err {
                code,
                sql_state,
                message,
            } => {
                let mut b = vec![0xff];
                b.extend_from_slice(&code.to_le_bytes());
                if let Some(state) = sql_state {
                    b.push(b'#');
                    b.extend_from_slice(state);
                }
                b.extend_from_slice(message);
                b
            }
            ReplySpec::PrepareOk {
                statement_id,
                columns,
                params,
                warnings,
            } => {
                let mut b = vec![0x00];
                b.extend_from_slice(&statement_id.to_le_bytes());
                b.extend_from_slice(&columns.to_le_bytes());
                b.extend_from_slice(&params.to_le_bytes());
                b.push(0);
                b.extend_from_slice(&warnings.to_le_bytes());
                b
            }
            ReplySpec::ResultSet {
                columns,
                width,
                metadata_follows,
            } => {
                let mut b = lenenc(*columns, *width);
                b.extend(metadata_follows);
                b
            }
        }
    }

    /// What `parse_reply` must make of the payload as the reply to `command`.
    fn expected(&self, command: u8) -> Reply {
        match self {
            ReplySpec::Ok { .. } => Reply::Ok,
            ReplySpec::Err {
                code,
                sql_state,
                message,
            } => Reply::Err {
                code: *code,
                sql_state: sql_state.map(|s| lossy(&s)),
                message: lossy(message),
            },
            &ReplySpec::PrepareOk {
                statement_id,
                columns,
                params,
                ..
            } => {
                if command == p::COM_STMT_PREPARE {
                    Reply::PrepareOk {
                        statement_id,
                        columns,
                        params,
                    }
                } else {
                    Reply::Ok
                }
            }
            &ReplySpec::ResultSet { columns, .. } => Reply::ResultSet { columns },
        }
    }

    /// The commands this reply can answer and still be read by `expected`.
    fn commands(&self) -> &'static [u8] {
        match self {
            ReplySpec::Ok { .. } => &PLAIN_COMMANDS,
            ReplySpec::Err { .. } => &[
                p::COM_QUERY,
                p::COM_STMT_PREPARE,
                p::COM_CHANGE_USER,
                p::COM_STATISTICS,
                p::COM_FIELD_LIST,
                p::COM_STMT_EXECUTE,
            ],
            ReplySpec::PrepareOk { .. } => &[p::COM_STMT_PREPARE, p::COM_QUERY, p::COM_PING],
            ReplySpec::ResultSet { .. } => &[p::COM_QUERY, p::COM_STMT_EXECUTE],
        }
    }
}

fn reply_spec() -> impl Strategy<Value = ReplySpec> {
    let lenenc_value = prop_oneof![0u64..300, any::<u64>()];
    prop_oneof![
        (
            (lenenc_value.clone(), lenenc_width()),
            (lenenc_value, lenenc_width()),
            any::<u16>(),
            any::<u16>(),
            bytes(20),
        )
            .prop_map(|(affected_rows, last_insert_id, status, warnings, info)| {
                ReplySpec::Ok {
                    affected_rows,
                    last_insert_id,
                    status,
                    warnings,
                    info,
                }
            }),
        (
            0u16..0xffff,
            proptest::option::of(any::<[u8; 5]>()),
            bytes(40)
        )
            .prop_map(|(code, sql_state, mut message)| {
                // Without a SQL state a message that starts with `#` would be read as one.
                if sql_state.is_none() && message.first() == Some(&b'#') {
                    message[0] = b'!';
                }
                ReplySpec::Err {
                    code,
                    sql_state,
                    message,
                }
            }),
        (any::<u32>(), any::<u16>(), any::<u16>(), any::<u16>()).prop_map(
            |(statement_id, columns, params, warnings)| ReplySpec::PrepareOk {
                statement_id,
                columns,
                params,
                warnings,
            }
        ),
        // At least 1 column, under 2^24: the 8-byte form's 0xfe prefix is an OK/EOF packet.
        (
            1u64..0xff_ffff,
            prop_oneof![Just(0usize), Just(2), Just(3)],
            proptest::option::of(any::<u8>())
        )
            .prop_map(|(columns, width, metadata_follows)| ReplySpec::ResultSet {
                columns,
                width,
                metadata_follows,
            }),
    ]
}

fn command() -> impl Strategy<Value = u8> {
    prop_oneof![
        select(vec![
            p::COM_QUERY,
            p::COM_STMT_PREPARE,
            p::COM_STMT_EXECUTE,
            p::COM_CHANGE_USER,
            p::COM_STATISTICS,
            p::COM_FIELD_LIST,
            p::COM_STMT_FETCH,
            p::COM_INIT_DB,
        ]),
        any::<u8>(),
    ]
}

/// A MariaDB progress report: an error packet with code 0xffff, then stage and progress.
fn progress_report() -> impl Strategy<Value = Vec<u8>> {
    bytes(24).prop_map(|rest| [&[0xff, 0xff, 0xff][..], &rest].concat())
}

proptest! {
    #![proptest_config(config(20_000))]

    #[test]
    fn reply_any_bytes(buf in bytes(40), cmd in command()) {
        let r = p::parse_reply(&buf, cmd);
        if matches!(r, Reply::Err { .. }) {
            prop_assert_eq!(buf[0], 0xff);
        }
        if p::parse_ok(&buf).is_some() {
            prop_assert!(buf[0] == 0x00 || buf[0] == 0xfe);
        }
        prop_assert_eq!(
            p::is_progress_report(&buf),
            buf.len() >= 3 && buf[..3] == [0xff, 0xff, 0xff]
        );
        if let Some((_, used)) = p::lenenc_int(&buf) {
            prop_assert!(used <= buf.len());
        }
    }

    #[test]
    fn reply_well_formed(spec in reply_spec(), pick in any::<Index>(), edits in edits()) {
        let payload = spec.payload();
        let cmd = *pick.get(spec.commands());
        prop_assert_eq!(p::parse_reply(&payload, cmd), spec.expected(cmd), "{:02x?}", payload);
        if let ReplySpec::Ok { affected_rows, last_insert_id, status, warnings, .. } = &spec {
            prop_assert_eq!(
                p::parse_ok(&payload),
                Some(OkInfo {
                    affected_rows: affected_rows.0,
                    last_insert_id: last_insert_id.0,
                    status: *status,
                    warnings: *warnings,
                })
            );
        }
        let _ = p::parse_reply(&mutate(payload, &edits), cmd);
    }

    #[test]
    fn reply_stream_any_bytes(buf in bytes(80), cmd in command()) {
        let _ = p::parse_reply_stream(&buf, cmd);
    }

    #[test]
    fn reply_stream_well_formed(
        reports in vec(progress_report(), 0..4),
        spec in reply_spec(),
        pick in any::<Index>(),
        after in bytes(20),
        cut in any::<Index>(),
    ) {
        let cmd = *pick.get(spec.commands());
        let mut wire = Vec::new();
        for r in &reports {
            wire.extend(packet(1, r));
        }
        let reports_end = wire.len();
        wire.extend(packet(1, &spec.payload()));
        let whole = wire.len();
        wire.extend_from_slice(&after);
        prop_assert_eq!(p::parse_reply_stream(&wire, cmd), spec.expected(cmd));
        // Cut before the real reply: only progress so far.
        let cut = cut.index(whole);
        if cut <= reports_end {
            let r = p::parse_reply_stream(&wire[..cut], cmd);
            // Unless the cut leaves 1-2 bytes of a report, which may be an error's.
            let partial_report = matches!(r, Reply::Err { code: 0, .. });
            prop_assert!(r == Reply::Unknown || partial_report, "{:?}", r);
        }
    }

    #[test]
    fn result_columns_any_bytes(buf in bytes(120)) {
        let _ = p::result_columns(&buf);
    }

    #[test]
    fn result_columns_well_formed(
        columns in vec((bytes(12), bytes(12), bytes(12)), 1..6),
        metadata_follows in any::<Option<bool>>(),
        cut in any::<Index>(),
        edits in edits(),
    ) {
        let mut head = lenenc(columns.len() as u64, 0);
        head.extend(metadata_follows.map(u8::from));
        let mut wire = packet(1, &head);
        let head_end = wire.len();
        for (i, (schema, table, name)) in columns.iter().enumerate() {
            let mut def = Vec::new();
            for s in [&b"def"[..], schema, b"alias", table, name, name] {
                def.extend(lenenc(s.len() as u64, 0));
                def.extend_from_slice(s);
            }
            def.extend([0x0c, 0x21, 0, 1, 0, 0, 0, 0xfd, 0, 0, 0, 0, 0]);
            wire.extend(packet(2 + i as u8, &def));
        }
        let names: Vec<String> = columns.iter().map(|(_, _, n)| lossy(n)).collect();
        let r = p::result_columns(&wire);
        if metadata_follows == Some(false) {
            prop_assert_eq!(r, None);
        } else {
            let r = r.unwrap();
            prop_assert_eq!(&r.names, &names);
            prop_assert_eq!(r.count, columns.len() as u64);
            // Cut anywhere after the count: the columns seen, in order, never more.
            let cut = cut.index(wire.len());
            if cut > head_end {
                if let Some(r) = p::result_columns(&wire[..cut]) {
                    prop_assert!(names.starts_with(&r.names), "{:?}", r);
                }
            }
        }
        let _ = p::result_columns(&mutate(wire, &edits));
    }

    #[test]
    fn stmt_execute_id_any_bytes(buf in bytes(12), cmd in command()) {
        let buf = [&[cmd][..], &buf].concat();
        let has_id = matches!(
            cmd,
            p::COM_STMT_EXECUTE
                | p::COM_STMT_CLOSE
                | p::COM_STMT_RESET
                | p::COM_STMT_SEND_LONG_DATA
                | p::COM_STMT_FETCH
                | p::COM_STMT_BULK_EXECUTE
        );
        let expected = (has_id && buf.len() >= 5)
            .then(|| u32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]));
        prop_assert_eq!(p::stmt_execute_id(&buf), expected);
    }

    #[test]
    fn init_db_name_any_bytes(buf in bytes(40)) {
        if let Some(name) = p::init_db_name(&buf) {
            prop_assert_eq!(buf[0], p::COM_INIT_DB);
            prop_assert!(!name.is_empty());
        }
    }

    #[test]
    fn init_db_name_well_formed(name in no_nul(40), nuls in 0usize..4) {
        let mut b = vec![p::COM_INIT_DB];
        b.extend_from_slice(&name);
        b.extend(std::iter::repeat_n(0, nuls));
        prop_assert_eq!(p::init_db_name(&b), (!name.is_empty()).then(|| lossy(&name)));
    }
}

// Protocol: `USE db` in statement text

/// Whitespace and comments, which may come before, inside and after `USE db`.
fn trivia() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(" ".to_string()),
        Just("\t".to_string()),
        Just("\r\n".to_string()),
        "[a-z ;'\"`#/-]{0,8}".prop_map(|b| format!("/*{b}*/")),
        "[a-z ;'\"`#*/-]{0,8}".prop_map(|b| format!("-- {b}\n")),
        "[a-z ;'\"`#*/-]{0,8}".prop_map(|b| format!("#{b}\n")),
    ]
}

#[derive(Debug, Clone)]
struct UseSpec {
    text: String,
    database: String,
}

prop_compose! {
    fn use_spec()(
        lead in vec(trivia(), 0..3),
        keyword in select(vec!["USE", "use", "Use", "uSE"]),
        quoted in any::<bool>(),
        plain_name in "[A-Za-z0-9_$éü中🙂]{1,12}",
        quoted_name in ".{1,12}",
        mid in vec(trivia(), 0..3),
        trail in vec(trivia(), 0..3),
        rest in proptest::option::of(".{0,20}"),
    ) -> UseSpec {
        let mut text = lead.concat();
        text.push_str(keyword);
        let database = if quoted { quoted_name } else { plain_name };
        if quoted {
            text.push_str(&mid.concat());
            text.push('`');
            text.push_str(&database.replace('`', "``"));
            text.push('`');
        } else {
            // A name must be apart from the keyword.
            let mid = mid.concat();
            text.push_str(if mid.is_empty() { " " } else { &mid });
            text.push_str(&database);
        }
        text.push_str(&trail.concat());
        if let Some(rest) = rest {
            text.push(';');
            text.push_str(&rest);
        }
        UseSpec { text, database }
    }
}

proptest! {
    #![proptest_config(config(10_000))]

    #[test]
    fn use_statement_any_text(
        text in prop_oneof![
            ".{0,40}",
            "(?i)[ \n]*(/\\*.{0,4}\\*/)?use[ `]{0,3}[a-z`; ]{0,10}",
            use_spec().prop_map(|s| s.text),
        ],
        cut in any::<Index>(),
    ) {
        let cuts = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect::<Vec<_>>();
        let text = &text[..*cut.get(&cuts)];
        if let Some(db) = p::use_statement_db(text) {
            prop_assert!(!db.is_empty());
            prop_assert!(text.contains(&db) || text.contains(&db.replace('`', "``")), "{:?}", db);
        }
    }

    #[test]
    fn use_statement_well_formed(spec in use_spec()) {
        prop_assert_eq!(p::use_statement_db(&spec.text), Some(spec.database));
    }
}

// Statement text: normalize and fingerprint

/// Words, numbers and punctuation around the literals; none holds a quote, none makes a comment
/// with its neighbours (they are always apart), none is 12 characters of [A-Z0-9].
const SQL_WORDS: [&str; 58] = [
    "SELECT",
    "select",
    "FROM",
    "WHERE",
    "AND",
    "or",
    "IN",
    "in",
    "VALUES",
    "value",
    "LIMIT",
    "OFFSET",
    "INSERT",
    "INTO",
    "UPDATE",
    "SET",
    "CALL",
    "USE",
    "LIKE",
    "BETWEEN",
    "NOT",
    "NULL",
    "true",
    "(",
    ")",
    "(",
    ")",
    ",",
    ",",
    ";",
    "=",
    "<=>",
    "-",
    "+",
    ".",
    "*",
    "?",
    "@",
    "@@",
    ":=",
    "t1",
    "c",
    "sbtest1",
    "`my col`",
    "`a``b`",
    "42",
    "-7",
    "1.5e3",
    "0x1F",
    "/*!50000",
    "/*M!100100",
    "*/",
    "N",
    "_utf8mb4",
    "X",
    "concat",
    "count(*)",
    "p",
];

/// What may sit between two tokens: nothing only next to a literal (two words could make a comment, as
/// `-` `-` does), else at least a space, maybe a comment.
const SQL_GAPS: [&str; 8] = ["", "", " ", "\n", " /* c */ ", " -- c\n", " # c\n", "\t "];

#[derive(Debug, Clone)]
enum Piece {
    Text(String),
    /// A raw byte, possibly not UTF-8; never the quote or a backslash.
    Byte(u8),
    /// A backslash and the byte it escapes.
    Escape(u8),
    /// The quote, doubled.
    Doubled,
}

#[derive(Debug, Clone)]
struct Literal {
    /// `'`, `"`, or a prefixed form such as `N'` or `_utf8mb4'`: its last byte is the quote.
    opener: &'static str,
    pieces: Vec<Piece>,
    marker: String,
    marker_at: Index,
}

impl Literal {
    fn bytes(&self) -> Vec<u8> {
        let q = *self.opener.as_bytes().last().unwrap();
        let mut content: Vec<Vec<u8>> = self
            .pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(s) => s.bytes().filter(|&b| b != q && b != b'\\').collect(),
                Piece::Byte(b) if *b != q && *b != b'\\' => vec![*b],
                Piece::Byte(_) => Vec::new(),
                Piece::Escape(b) => vec![b'\\', *b],
                Piece::Doubled => vec![q, q],
            })
            .collect();
        let at = self.marker_at.index(content.len() + 1);
        content.insert(at, self.marker.clone().into_bytes());
        let mut b = self.opener.as_bytes().to_vec();
        b.extend(content.concat());
        b.push(q);
        b
    }
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        3 => "[a-z '\"`*/#;?\\\\\\n\\t\\x00éü中🙂-]{1,6}".prop_map(Piece::Text),
        2 => any::<u8>().prop_map(Piece::Byte),
        2 => prop_oneof![select(b"'\"\\n0%_\xc3".to_vec()), any::<u8>()].prop_map(Piece::Escape),
        1 => Just(Piece::Doubled),
    ]
}

prop_compose! {
    fn literal()(
        opener in select(vec![
            "'", "\"", "'", "\"", "N'", "n'", "_utf8mb4'", "_binary\"", "X'", "b'",
        ]),
        pieces in vec(piece(), 0..8),
        marker in "QZ[A-Z0-9]{10}",
        marker_at in any::<Index>(),
    ) -> Literal {
        Literal { opener, pieces, marker, marker_at }
    }
}

#[derive(Debug, Clone)]
enum SqlToken {
    Word(&'static str),
    Literal(Literal),
}

#[derive(Debug, Clone)]
struct SqlSpec {
    tokens: Vec<(SqlToken, &'static str)>,
    executable_comment: bool,
    cut: Option<Index>,
}

impl SqlSpec {
    fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        if self.executable_comment {
            b.extend_from_slice(b"/*!40101 ");
        }
        let is_literal = |i: usize| matches!(self.tokens.get(i), Some((SqlToken::Literal(_), _)));
        for (i, (t, gap)) in self.tokens.iter().enumerate() {
            match t {
                SqlToken::Word(w) => b.extend_from_slice(w.as_bytes()),
                SqlToken::Literal(l) => b.extend(l.bytes()),
            }
            let apart = gap.is_empty() && !is_literal(i) && !is_literal(i + 1);
            b.extend_from_slice(if apart { b" " } else { gap.as_bytes() });
        }
        if self.executable_comment {
            b.extend_from_slice(b"*/");
        }
        if let Some(cut) = self.cut {
            b.truncate(cut.index(b.len() + 1));
        }
        b
    }

    fn markers(&self) -> impl Iterator<Item = &str> {
        self.tokens.iter().filter_map(|(t, _)| match t {
            SqlToken::Literal(l) => Some(l.marker.as_str()),
            SqlToken::Word(_) => None,
        })
    }
}

prop_compose! {
    fn sql_spec()(
        tokens in vec(
            (
                prop_oneof![
                    3 => select(SQL_WORDS.to_vec()).prop_map(SqlToken::Word),
                    1 => literal().prop_map(SqlToken::Literal),
                ],
                select(SQL_GAPS.to_vec()),
            ),
            0..16,
        ),
        last in literal(),
        at in any::<Index>(),
        executable_comment in any::<bool>(),
        cut in proptest::option::weighted(0.3, any::<Index>()),
    ) -> SqlSpec {
        // At least one literal, anywhere.
        let mut tokens = tokens;
        tokens.insert(at.index(tokens.len() + 1), (SqlToken::Literal(last), " "));
        SqlSpec { tokens, executable_comment, cut }
    }
}

proptest! {
    #![proptest_config(config(10_000))]

    #[test]
    fn fingerprint_any_bytes(sql in bytes(80)) {
        let n = normalize_bytes(&sql);
        let f = fingerprint_bytes(&sql);
        prop_assert!(!n.contains(['\'', '"']), "{:?}", n);
        prop_assert!(!f.contains(['\'', '"']), "{:?}", f);
        if let Ok(s) = std::str::from_utf8(&sql) {
            prop_assert_eq!(normalize(s), n);
            prop_assert_eq!(fingerprint(s), f);
        }
    }

    #[test]
    fn fingerprint_hides_quoted_literals(spec in sql_spec()) {
        let sql = spec.bytes();
        let outputs = [normalize_bytes(&sql), fingerprint_bytes(&sql)];
        for out in &outputs {
            prop_assert!(!out.contains(['\'', '"']), "{:?} -> {:?}", lossy(&sql), out);
            let upper = out.to_ascii_uppercase();
            for marker in spec.markers() {
                prop_assert!(
                    !upper.contains(marker),
                    "{} shown: {:?} -> {:?}", marker, lossy(&sql), out
                );
            }
        }
    }
}

// Folded stacks

fn read_folded(b: &[u8]) -> anyhow::Result<Profile> {
    folded::read(b, Unit::Samples)
}

/// One line's frames: never empty, no `;` or line break, no whitespace at either end (the line and
/// the stack are trimmed), and no `# ` at the start of a line (a comment).
fn frames() -> impl Strategy<Value = Vec<String>> {
    let frame = prop_oneof![
        select(vec![
            "main",
            "do_command",
            "dispatch_command(THD*, ...)",
            "[kernel]",
            "é",
            "x"
        ])
        .prop_map(str::to_string),
        "[^;#\\s]([^;\\n\\r]{0,10}[^;\\s])?",
    ];
    vec(frame, 1..5)
}

proptest! {
    #![proptest_config(config(4000))]

    #[test]
    fn folded_any_bytes(text in vec(
        prop_oneof![
            any::<u8>(),
            select(b";;  \t\n\n\r#0123456789-+.e".to_vec()),
        ],
        0..200,
    )) {
        let _ = read_folded(&text);
    }

    #[test]
    fn folded_any_lines(lines in vec(
        prop_oneof![
            ".{0,20}",
            "[a-z;]{0,10}[ \t]+[0-9]{1,25}",
            "# .{0,10}",
        ],
        0..20,
    )) {
        let text = lines.join("\n");
        if let Ok(p) = read_folded(text.as_bytes()) {
            prop_assert!(p.len() <= lines.len());
        }
    }

    #[test]
    fn folded_well_formed(
        lines in vec(
            (
                frames(),
                // Sums stay within u64 here; see folded_sums_never_wrap for beyond.
                0u64..1 << 56,
                select(vec![" ", "\t", "  ", " \t "]),
                select(vec!["\n", "\r\n", "\n\n", "\n# comment\n", "\n  \n"]),
            ),
            0..40,
        ),
        last_newline in any::<bool>(),
    ) {
        let mut text = String::new();
        let mut expected: BTreeMap<Vec<String>, u64> = BTreeMap::new();
        for (frames, value, gap, eol) in &lines {
            text.push_str(&format!("{}{gap}{value}{eol}", frames.join(";")));
            if *value > 0 {
                *expected.entry(frames.clone()).or_default() += value;
            }
        }
        if !last_newline {
            text.truncate(text.trim_end().len());
        }
        let profile = read_folded(text.as_bytes()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let got: BTreeMap<Vec<String>, u64> = profile
            .stacks()
            .into_iter()
            .map(|(f, v)| (f.into_iter().map(str::to_string).collect(), v))
            .collect();
        prop_assert_eq!(&got, &expected);
        prop_assert_eq!(profile.total(), expected.values().sum::<u64>());
        // And written back, the same.
        let mut out = Vec::new();
        folded::write(&profile, &mut out).unwrap();
        let again = read_folded(&out).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(again.stacks(), profile.stacks());
    }

    /// Sums of one stack past u64::MAX must be an error or saturate, never wrap.
    #[test]
    fn folded_sums_never_wrap(values in vec(any::<u64>(), 1..6)) {
        let text: String = values.iter().map(|v| format!("main;f {v}\n")).collect();
        if let Ok(p) = read_folded(text.as_bytes()) {
            let max = values.iter().copied().max().unwrap_or(0);
            let got = p.stacks().first().map_or(0, |s| s.1);
            prop_assert!(got >= max, "{:?} summed to {}", values, got);
            prop_assert!(p.total() >= max);
        }
    }
}

// The query tracker: sequences of events

fn fd() -> impl Strategy<Value = i32> {
    prop_oneof![1 => Just(-1), 6 => 3..5i32]
}

fn statement_id() -> impl Strategy<Value = u32> {
    prop_oneof![8 => 0..3u32, 1 => Just(u32::MAX), 1 => any::<u32>()]
}

fn statement_text() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        select(vec![
            "SELECT c FROM sbtest1 WHERE id = ?",
            "USE db1",
            "use `we``ird`",
            "/* x */ USE `café`;",
            "INSERT INTO t VALUES (1, 'secret'), (2, \"pw\")",
            "SET PASSWORD = 'hunter2'",
            "",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        use_spec().prop_map(|s| s.text.into_bytes()),
        sql_spec().prop_map(|s| s.bytes()),
        bytes(40),
    ]
}

fn handshake_payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => (response_spec(), any::<bool>()).prop_map(|(mut spec, compress)| {
            if compress {
                spec.capabilities |= p::CLIENT_COMPRESS;
            }
            spec.full()
        }),
        1 => (any::<u32>(), vec(any::<u8>(), 28)).prop_map(|(caps, rest)| {
            let caps = caps | p::CLIENT_PROTOCOL_41 | p::CLIENT_SSL;
            [&caps.to_le_bytes()[..], &rest].concat()
        }),
        1 => response320_spec().prop_map(|s| s.bytes()),
        1 => bytes(60),
    ]
}

fn request() -> impl Strategy<Value = Vec<u8>> {
    let with = |cmd: u8, rest: Vec<u8>| [&[cmd][..], &rest].concat();
    prop_oneof![
        4 => statement_text().prop_map(move |t| with(p::COM_QUERY, t)),
        4 => statement_text().prop_map(move |t| with(p::COM_STMT_PREPARE, t)),
        3 => (statement_id(), bytes(10))
            .prop_map(move |(id, rest)| {
                with(p::COM_STMT_EXECUTE, [&id.to_le_bytes()[..], &rest].concat())
            }),
        2 => change_user_spec().prop_map(|s| s.bytes()),
        1 => Just(vec![p::COM_RESET_CONNECTION]),
        1 => no_nul(16).prop_map(move |name| with(p::COM_INIT_DB, name)),
        1 => Just(vec![p::COM_PING]),
        1 => bytes(30),
    ]
}

fn prepare_ok(statement_id: u32) -> Vec<u8> {
    let mut b = vec![0x00];
    b.extend_from_slice(&statement_id.to_le_bytes());
    b.extend_from_slice(&[1, 0, 1, 0, 0, 0, 0]);
    packet(1, &b)
}

fn reply() -> impl Strategy<Value = Vec<u8>> {
    let ok = packet(1, b"\x00\x00\x00\x02\x00\x00\x00");
    prop_oneof![
        3 => Just(ok.clone()),
        1 => statement_id().prop_map(prepare_ok),
        2 => reply_spec().prop_map(|s| packet(1, &s.payload())),
        1 => (vec(progress_report(), 1..3), Just(ok)).prop_map(|(reports, ok)| {
            let mut b: Vec<u8> = reports.iter().flat_map(|r| packet(1, r)).collect();
            b.extend(ok);
            b
        }),
        1 => bytes(30),
        1 => Just(Vec::new()),
    ]
}

prop_compose! {
    fn raw_statement()(
        tid in any::<u32>(),
        fd in fd(),
        request in request(),
        reply in reply(),
        // Most prepares succeed, so that executions find their text.
        prepared in proptest::option::weighted(0.8, statement_id()),
        packet_len in proptest::option::weighted(0.2, any::<u32>()),
        start_ns in prop_oneof![3 => 0u64..1 << 62, 1 => any::<u64>()],
        duration_ns in prop_oneof![3 => 0u64..1 << 40, 1 => any::<u64>()],
        in_flight in proptest::bool::weighted(0.1),
        socket_ino in socket_ino(),
    ) -> RawStatement {
        RawStatement {
            tid,
            fd,
            socket_ino,
            packet_len: packet_len.unwrap_or(request.len() as u32),
            reply: match prepared {
                Some(id) if request.first() == Some(&p::COM_STMT_PREPARE) => prepare_ok(id),
                _ => reply,
            },
            request,
            start_ns,
            end_ns: start_ns.wrapping_add(duration_ns),
            counters: Default::default(),
            in_flight,
            pipelined: false,
            before_tracing: false,
        }
    }
}

/// A socket's inode: a few, so that connections on one descriptor meet; 0, not known.
fn socket_ino() -> impl Strategy<Value = u64> {
    0u64..4
}

fn packet_in(fd: i32, socket_ino: u64, seq: u8, payload: Vec<u8>) -> Wire {
    Wire::PacketIn {
        tid: 1,
        fd,
        socket_ino,
        seq,
        packet_len: payload.len() as u32,
        payload,
        ts_ns: 0,
    }
}

fn event() -> impl Strategy<Value = Wire> {
    prop_oneof![
        2 => (fd(), socket_ino(), greeting_spec()).prop_map(|(fd, socket_ino, g)| Wire::PacketOut {
            tid: 1,
            fd,
            socket_ino,
            bytes: packet(0, &g.full()),
        }),
        1 => (fd(), socket_ino(), bytes(40))
            .prop_map(|(fd, socket_ino, bytes)| Wire::PacketOut { tid: 1, fd, socket_ino, bytes }),
        2 => (fd(), socket_ino(), handshake_payload())
            .prop_map(|(fd, ino, payload)| packet_in(fd, ino, 1, payload)),
        1 => (fd(), socket_ino(), any::<u8>(), bytes(40))
            .prop_map(|(fd, ino, seq, payload)| packet_in(fd, ino, seq, payload)),
        2 => (fd(), socket_ino(), statement_id()).prop_map(|(fd, ino, id)| {
            packet_in(fd, ino, 0, [&[p::COM_STMT_CLOSE][..], &id.to_le_bytes()].concat())
        }),
        // A command read ahead with the statement before it (a pipelined statement).
        1 => (fd(), socket_ino(), request()).prop_map(|(fd, ino, payload)| packet_in(fd, ino, 0, payload)),
        8 => raw_statement().prop_map(|s| Wire::Statement(Box::new(s))),
    ]
}

/// Each piece of `text` between replacement characters and backticks (a `USE` name is unescaped) is
/// somewhere in the bytes fed in.
fn pieces_were_fed(text: &str, fed: &[Vec<u8>]) -> bool {
    text.split(['\u{fffd}', '`'])
        .filter(|piece| !piece.is_empty())
        .all(|piece| fed.iter().any(|f| contains_bytes(f, piece.as_bytes())))
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn tracker_event_sequences(events in vec(event(), 0..48)) {
        // The same events with and without --raw-sql: only the query text may differ, by normalize().
        let mut raw = Tracker::new(true);
        let mut normalized = Tracker::new(false);
        let mut statements: Vec<String> = Vec::new();
        let mut fed: Vec<Vec<u8>> = Vec::new();
        let mut fds = HashSet::new();
        let mut prepared_ids = HashSet::new();
        for event in events {
            match &event {
                Wire::Statement(s) => {
                    statements.push(lossy(&s.request));
                    fed.push(s.request.clone());
                    // A statement seen at dispatch_command is its thread's connection.
                    fds.insert(if s.fd >= 0 { s.fd } else { dispatch_fd(s.tid) });
                    if s.request.first() == Some(&p::COM_STMT_PREPARE) {
                        if let Reply::PrepareOk { statement_id, .. } =
                            p::parse_reply_stream(&s.reply, p::COM_STMT_PREPARE)
                        {
                            prepared_ids.insert(statement_id);
                        }
                    }
                }
                Wire::PacketIn { tid, fd, seq, payload, .. } => {
                    if *seq == 0 {
                        statements.push(lossy(payload)); // a command read ahead
                    }
                    fed.push(payload.clone());
                    fds.insert(*fd);
                    if *fd < 0 {
                        fds.insert(dispatch_fd(*tid));
                    }
                }
                Wire::PacketOut { tid, fd, bytes, .. } => {
                    fed.push(bytes.clone());
                    // A greeting opens the connection on its socket and on its thread.
                    fds.extend([*fd, dispatch_fd(*tid)]);
                }
            }
            let r = raw.handle(event.clone());
            let n = normalized.handle(event);
            prop_assert_eq!(&r.notice, &n.notice);
            let (r, n) = (r.record, n.record);

            let (conns, prepared) = raw.memory_bounds();
            prop_assert!(conns <= MAX_CONNS && conns <= fds.len(), "{} connections", conns);
            prop_assert!(
                prepared <= MAX_PREPARED_PER_CONN && prepared <= prepared_ids.len(),
                "{} prepared", prepared
            );
            prop_assert_eq!(raw.memory_bounds(), normalized.memory_bounds());

            prop_assert_eq!(r.is_some(), n.is_some());
            let (Some(r), Some(n)) = (r, n) else { continue };
            prop_assert_eq!(n.query.as_deref().map(str::to_string), r.query.as_deref().map(normalize));
            prop_assert_eq!(&n.fingerprint, &r.fingerprint);
            prop_assert_eq!((&n.user, &n.db, n.conn, n.error), (&r.user, &r.db, r.conn, r.error));
            if let Some(q) = &r.query {
                // COM_INIT_DB is shown as the USE it amounts to.
                let text = if r.command == "Init DB" {
                    q.strip_prefix("USE `").and_then(|q| q.strip_suffix('`'))
                } else {
                    Some(&**q)
                };
                prop_assert!(
                    text.is_some_and(|t| statements.iter().any(|s| s.contains(t))),
                    "query {:?} was never sent", q
                );
            }
            for field in [&r.user, &r.db].into_iter().flatten() {
                prop_assert!(pieces_were_fed(field, &fed), "{:?} was never sent", field);
            }
        }
    }
}

proptest! {
    #![proptest_config(config(6))]

    /// More connections and prepared statements than remembered: the oldest go, and are counted.
    #[test]
    fn tracker_floods(
        extra_conns in 1usize..300,
        extra_prepared in 1usize..300,
        first_fd in 0i32..1 << 20,
        prepare_every in 1usize..40,
    ) {
        let mut t = Tracker::new(false);
        let conns = MAX_CONNS + extra_conns;
        let prepares = MAX_PREPARED_PER_CONN + extra_prepared;
        let greeting = packet(0, &GreetingSpec {
            mariadb_prefix: true,
            version: b"10.11.6-MariaDB".to_vec(),
            connection_id: 1,
            salt: vec![0; 8],
            capabilities: 0xf7fe,
            charset: 0x2d,
            status: 2,
            tail: Vec::new(),
            cut: None,
        }.full());
        // Statements on one more socket, interleaved with the greetings.
        let busy_fd = first_fd - 1;
        let mut prepared = 0;
        for i in 0..conns.max(prepares * prepare_every) {
            if i < conns {
                t.handle(Wire::PacketOut {
                    tid: 1,
                    fd: first_fd + i as i32,
                    socket_ino: i as u64 + 1,
                    bytes: greeting.clone(),
                });
            }
            if i % prepare_every == 0 && prepared < prepares {
                let mut reply = vec![0x00];
                reply.extend_from_slice(&(prepared as u32).to_le_bytes());
                reply.extend_from_slice(&[0; 7]);
                t.handle(Wire::Statement(Box::new(RawStatement {
                    tid: 1,
                    fd: busy_fd,
                    socket_ino: 0,
                    packet_len: 9,
                    request: b"\x16SELECT ?".to_vec(),
                    reply: packet(1, &reply),
                    start_ns: 0,
                    end_ns: 1,
                    counters: Default::default(),
                    in_flight: false,
                    pipelined: false,
                    before_tracing: false,
                })));
                prepared += 1;
            }
            if i % 4096 == 0 {
                let (c, p) = t.memory_bounds();
                prop_assert!(c <= MAX_CONNS && p <= MAX_PREPARED_PER_CONN);
            }
        }
        let (c, p) = t.memory_bounds();
        prop_assert_eq!(c, MAX_CONNS);
        prop_assert!(p <= MAX_PREPARED_PER_CONN);
        // The busy socket may itself be forgotten among the greetings and come back, forgetting another.
        prop_assert!(t.forgotten_conns > extra_conns as u64);
        // Forgetting the busy socket forgets its statements with it, uncounted as statements.
        prop_assert!(t.forgotten_prepared <= extra_prepared as u64);
    }
}

// Core files

/// A minimal x86_64 core: the ELF header, a PT_NOTE of NT_PRSTATUS (thread 42, ip 0x1234, sp 0x2000) and
/// NT_FILE (one mapping), and a PT_LOAD of 16 bytes at 0x2000.
fn tiny_core() -> Vec<u8> {
    fn note(out: &mut Vec<u8>, kind: u32, desc: &[u8]) {
        out.extend(5u32.to_le_bytes());
        out.extend((desc.len() as u32).to_le_bytes());
        out.extend(kind.to_le_bytes());
        out.extend(b"CORE\0\0\0\0");
        out.extend(desc);
        out.resize(out.len().next_multiple_of(4), 0);
    }
    let mut notes = Vec::new();
    let mut prstatus = vec![0u8; 336];
    prstatus[32..36].copy_from_slice(&42u32.to_le_bytes());
    prstatus[112 + 16 * 8..112 + 17 * 8].copy_from_slice(&0x1234u64.to_le_bytes());
    prstatus[112 + 19 * 8..112 + 20 * 8].copy_from_slice(&0x2000u64.to_le_bytes());
    note(&mut notes, 1, &prstatus);
    let mut file = Vec::new();
    for v in [1u64, 4096, 0x1000, 0x2000, 0] {
        file.extend(v.to_le_bytes());
    }
    file.extend(b"/bin/true\0");
    note(&mut notes, 0x4649_4c45, &file);
    let (phoff, phnum) = (64u64, 2u16);
    let notes_at = phoff + 56 * u64::from(phnum);
    let load_at = notes_at + notes.len() as u64;
    let mut out = Vec::new();
    out.extend(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    out.extend(4u16.to_le_bytes()); // ET_CORE
    out.extend(62u16.to_le_bytes()); // EM_X86_64
    out.extend(1u32.to_le_bytes());
    out.extend([0u64, phoff, 0].iter().flat_map(|v| v.to_le_bytes()));
    out.extend(0u32.to_le_bytes());
    out.extend(
        [64u16, 56, phnum, 64, 0, 0]
            .iter()
            .flat_map(|v| v.to_le_bytes()),
    );
    for (kind, offset, vaddr, size) in [
        (4u32, notes_at, 0u64, notes.len() as u64),
        (1, load_at, 0x2000, 16),
    ] {
        out.extend(kind.to_le_bytes());
        out.extend(4u32.to_le_bytes());
        out.extend(
            [offset, vaddr, 0, size, size, 1]
                .iter()
                .flat_map(|v| v.to_le_bytes()),
        );
    }
    out.extend(&notes);
    out.extend(0x5555u64.to_le_bytes());
    out.extend(0x6666u64.to_le_bytes());
    out
}

#[test]
fn tiny_core_parses() {
    let core = myprobe::stacks::core_file::Core::from_bytes(tiny_core()).unwrap();
    assert_eq!(core.threads.len(), 1);
    assert_eq!((core.threads[0].tid, core.threads[0].regs.ip), (42, 0x1234));
    assert_eq!(core.read_u64(0x2008), Some(0x6666));
    assert_eq!(core.exe(), Some(std::path::Path::new("/bin/true")));
}

proptest! {
    #![proptest_config(config(256))]

    /// A core with bytes changed and cut anywhere: parsed or refused, never a panic; what it reads stays in
    /// the file; a core of another program holds no connection, wherever its list is looked for.
    #[test]
    fn core_files_mangled(
        changes in vec((any::<Index>(), any::<u8>()), 0..8),
        cut in any::<Index>(),
        cut_it in any::<bool>(),
        addr in 0x1f00u64..0x2100,
    ) {
        let mut bytes = tiny_core();
        for (at, b) in changes {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        if cut_it {
            bytes.truncate(cut.index(bytes.len()));
        }
        if let Ok(core) = myprobe::stacks::core_file::Core::from_bytes(bytes) {
            let _ = core.read_u64(addr);
            let _ = core.exe();
            let _ = core.build_id(std::path::Path::new("/bin/true"));
            if let Ok(sessions) = myprobe::sessions::read(&core, &linked_layout(addr)) {
                prop_assert!(sessions.is_empty(), "{:?}", sessions);
            }
        }
    }
}

// Stack text (`stacks --resolve`)

/// Lines of the real stack texts of the tests: crash reports, gdb, eu-stack.
fn stack_text_lines() -> Vec<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/stacks/text");
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        lines.extend(text.lines().map(str::to_string));
    }
    lines
}

proptest! {
    #![proptest_config(config(256))]

    /// Real lines shuffled, cut and mangled: parsed or refused with an error, never a panic; a parse holds
    /// at least one thread with a frame.
    #[test]
    fn stack_text_mangled(
        picks in vec(any::<Index>(), 1..60),
        changes in vec((any::<Index>(), any::<Index>(), any::<char>()), 0..12),
    ) {
        let lines = stack_text_lines();
        let mut picked: Vec<String> = picks.iter().map(|i| i.get(&lines).clone()).collect();
        for (line, at, c) in changes {
            let l = line.get_mut(&mut picked);
            let chars: Vec<char> = l.chars().collect();
            if chars.is_empty() {
                continue;
            }
            let i = at.index(chars.len());
            *l = chars[..i].iter().chain([c].iter()).chain(&chars[i + 1..]).collect();
        }
        let text = picked.join("\n");
        if let Ok(parsed) = myprobe::stacks::text::parse(&text, "fuzz") {
            prop_assert!(parsed.threads.iter().any(|t| !t.frames.is_empty()));
            for t in &parsed.threads {
                let names: Vec<String> = t.frames.iter().filter_map(|f| f.clean_function()).collect();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let e = myprobe::stacks::text::identify(&names);
                let _ = myprobe::stacks::text::summary_line(&e, &parsed.crash, names.first().copied());
            }
        }
    }
}

// Connections read from a server's memory

/// Memory holding `data` from `base`, and nothing elsewhere.
struct Image {
    base: u64,
    data: Vec<u8>,
}

impl myprobe::process::memory::Memory for Image {
    fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
        let Some(off) = addr
            .checked_sub(self.base)
            .and_then(|o| usize::try_from(o).ok())
        else {
            return 0;
        };
        let Some(rest) = self.data.get(off..) else {
            return 0;
        };
        let n = buf.len().min(rest.len());
        buf[..n].copy_from_slice(&rest[..n]);
        n
    }
}

const IMAGE_BASE: u64 = 0x10_000;
const THD_VTABLE: u64 = 0x7f00_0000_1000;
/// An object's size, and where its id and statement are.
const THD_SIZE: u64 = 0x100;
const THD_ID: u64 = 0x40;
const THD_QUERY: u64 = 0x68;
/// The command (32 bits), its start (seconds, microseconds) and the database (`{ str, length }`).
const THD_COMMAND: u64 = 0x80;
const THD_STARTED: u64 = 0x90;
const THD_DB: u64 = 0xa0;
/// A pointer to its security context, which it holds at `THD_SECURITY` (the host's `char *`, then the user's).
const THD_SECURITY_POINTER: u64 = 0xb0;
const THD_SECURITY: u64 = 0xc0;
/// The `pthread_self()` of the thread serving it: `THREAD_BASE` plus its id in pages.
const THD_THREAD: u64 = 0xd0;
const THREAD_BASE: u64 = 0x7f10_0000_0000;
/// Its options, of which `IN_TRANSACTION` says a transaction is open: in those of even index (others set besides).
const THD_OPTIONS: u64 = 0xe0;
const IN_TRANSACTION: u64 = 1 << 19;
/// Each object's command's start: this many seconds since the epoch, and its id in microseconds.
const STARTED_SECS: u64 = 1_700_000_000;

fn linked_layout(head: u64) -> myprobe::sessions::Layout {
    let list = myprobe::server::SessionList::Linked {
        head: "server_threads",
        next: 0x10,
        count: None,
    };
    let name = |at: u64| myprobe::sessions::TextField {
        pointers: vec![THD_SECURITY_POINTER],
        at,
        form: myprobe::sessions::TextForm::CString,
    };
    myprobe::sessions::Layout::new(&list, head, THD_VTABLE, (THD_ID, 8), THD_QUERY)
        .with_fields(Some(THD_COMMAND), Some(THD_STARTED), Some(THD_DB))
        .with_names(Some(name(8)), Some(name(0)))
        .with_thread(Some(THD_THREAD))
        .with_transaction(Some((THD_OPTIONS, 8, IN_TRANSACTION)))
}

/// A MariaDB-shaped image: the list's head at its start (first object, then the end marker), one object per
/// text (ids from 1), the texts after them. An object with a text runs a Query in database `db`, as user `uID`
/// from `localhost`; one without is idle (Sleep, no database, no security context).
fn linked_image(texts: &[Option<Vec<u8>>]) -> Image {
    let put = |data: &mut Vec<u8>, at: u64, v: u64| {
        let at = (at - IMAGE_BASE) as usize;
        data[at..at + 8].copy_from_slice(&v.to_le_bytes());
    };
    let objects = IMAGE_BASE + 0x40;
    let mut data = vec![0u8; 0x40 + texts.len() * THD_SIZE as usize];
    let end = IMAGE_BASE + 8;
    put(
        &mut data,
        IMAGE_BASE,
        if texts.is_empty() { end } else { objects },
    );
    for (i, text) in texts.iter().enumerate() {
        let thd = objects + i as u64 * THD_SIZE;
        put(&mut data, thd, THD_VTABLE + 16);
        let next = if i + 1 == texts.len() {
            end
        } else {
            thd + THD_SIZE
        };
        put(&mut data, thd + 0x10, next);
        put(&mut data, thd + THD_ID, i as u64 + 1);
        put(&mut data, thd + THD_STARTED, STARTED_SECS);
        put(&mut data, thd + THD_STARTED + 8, i as u64 + 1);
        let transaction = if i % 2 == 0 { IN_TRANSACTION } else { 0 };
        put(&mut data, thd + THD_OPTIONS, transaction | 0x3);
        put(
            &mut data,
            thd + THD_THREAD,
            THREAD_BASE + (i as u64 + 1) * 0x1000,
        );
        if let Some(t) = text {
            let at = IMAGE_BASE + data.len() as u64;
            data.extend_from_slice(t);
            put(&mut data, thd + THD_QUERY, at);
            put(&mut data, thd + THD_QUERY + 8, t.len() as u64);
            put(&mut data, thd + THD_COMMAND, 3);
            let at = IMAGE_BASE + data.len() as u64;
            data.extend_from_slice(b"db");
            put(&mut data, thd + THD_DB, at);
            put(&mut data, thd + THD_DB + 8, 2);
            put(&mut data, thd + THD_SECURITY_POINTER, thd + THD_SECURITY);
            for (at, name) in [(0, "localhost".to_string()), (8, format!("u{}", i + 1))] {
                let name_at = IMAGE_BASE + data.len() as u64;
                data.extend_from_slice(name.as_bytes());
                data.push(0);
                put(&mut data, thd + THD_SECURITY + at, name_at);
            }
        }
    }
    Image {
        base: IMAGE_BASE,
        data,
    }
}

proptest! {
    #![proptest_config(config(2_000))]

    /// Memory that holds no connection object gives no statement, whatever its list's head points at.
    #[test]
    fn sessions_of_random_memory(data in bytes(4096), head in any::<Index>()) {
        prop_assume!(!contains_bytes(&data, &(THD_VTABLE + 16).to_le_bytes()));
        let head = IMAGE_BASE + head.index(data.len().max(1)) as u64;
        let image = Image { base: IMAGE_BASE, data };
        if let Ok(sessions) = myprobe::sessions::read(&image, &linked_layout(head)) {
            prop_assert!(sessions.is_empty(), "{:?}", sessions);
        }
    }

    /// Objects built whole are read exactly; cut anywhere, they are refused or read as built, never made up.
    #[test]
    fn sessions_of_a_cut_image(
        texts in vec(proptest::option::of(vec(any::<u8>(), 1..40)), 0..6),
        cut in any::<Index>(),
    ) {
        use myprobe::sessions::{Query, Session};
        let image = linked_image(&texts);
        let want: Vec<Session> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| Session {
                thd: IMAGE_BASE + 0x40 + i as u64 * THD_SIZE,
                id: i as u64 + 1,
                query: t.as_ref().map(|t| Query::Text(lossy(t))),
                command: Some(if t.is_some() { "Query" } else { "Sleep" }),
                db: t.as_ref().map(|_| "db".into()),
                started_us: Some(STARTED_SECS * 1_000_000 + i as u64 + 1),
                user: t.as_ref().map(|_| format!("u{}", i + 1).into()),
                host: t.as_ref().map(|_| "localhost".into()),
                thread: Some(THREAD_BASE + (i as u64 + 1) * 0x1000),
                in_transaction: Some(i % 2 == 0),
            })
            .collect();
        let got = myprobe::sessions::read(&image, &linked_layout(IMAGE_BASE)).unwrap();
        prop_assert_eq!(&got, &want);
        let mut cut_image = image;
        let keep = cut.index(cut_image.data.len() + 1);
        cut_image.data.truncate(keep);
        if let Ok(sessions) = myprobe::sessions::read(&cut_image, &linked_layout(IMAGE_BASE)) {
            // The statement as built; a field cut off is not shown, never another.
            prop_assert_eq!(sessions.len(), want.len());
            for (got, want) in sessions.iter().zip(&want) {
                prop_assert_eq!((got.thd, got.id, &got.query), (want.thd, want.id, &want.query));
                prop_assert!(got.command.is_none() || got.command == want.command, "{:?}", got);
                prop_assert!(got.db.is_none() || got.db == want.db, "{:?}", got);
                prop_assert!(got.started_us.is_none() || got.started_us == want.started_us, "{:?}", got);
                prop_assert!(got.user.is_none() || got.user == want.user, "{:?}", got);
                prop_assert!(got.host.is_none() || got.host == want.host, "{:?}", got);
                prop_assert!(got.thread.is_none() || got.thread == want.thread, "{:?}", got);
            }
        }
    }
}

/// A reading that keeps its walk reads again only the connections chosen last time or whose thread ran since: an
/// idle one whose thread has not run cannot have changed, and is not read.
#[test]
fn a_walk_kept_reads_again_only_the_connections_whose_thread_ran() {
    use myprobe::sessions::{read_wanted, Brief, Walk};
    let runs = |b: &Brief| b.has_query;
    let ids = |s: &[myprobe::sessions::Session]| s.iter().map(|s| s.id).collect::<Vec<_>>();
    let idle = linked_image(&[Some(b"SELECT 1".to_vec()), None, None]);
    let layout = linked_layout(IMAGE_BASE);
    let mut walk = Walk::default();
    let first = read_wanted(&idle, &layout, &mut walk, |_| false, runs).unwrap();
    assert_eq!(ids(&first), [1]);
    assert_eq!(
        read_wanted(&idle, &layout, &mut walk, |_| true, runs).unwrap(),
        first
    );
    // Connection 2 begins a statement: while its thread is said not to have run, it is not looked at; once it ran,
    // it is read.
    let busy = linked_image(&[Some(b"SELECT 1".to_vec()), Some(b"SELECT 2".to_vec()), None]);
    let second = THREAD_BASE + 2 * 0x1000;
    assert_eq!(
        ids(&read_wanted(&busy, &layout, &mut walk, |_| true, runs).unwrap()),
        [1]
    );
    assert_eq!(
        ids(&read_wanted(&busy, &layout, &mut walk, |t| t != second, runs).unwrap()),
        [1, 2]
    );
}

/// Memory that says which objects' links were read.
struct Watched<'a> {
    image: &'a Image,
    reads: std::cell::RefCell<Vec<u64>>,
}

impl myprobe::process::memory::Memory for Watched<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
        self.reads.borrow_mut().push(addr);
        self.image.read(addr, buf)
    }
}

/// A linked list whose marks (first object, last link, count of objects) hold is not walked again: no link of a
/// connection left as it was is read. Once the marks change it is walked, and what changed is seen.
#[test]
fn a_list_whose_marks_hold_is_not_walked_again() {
    use myprobe::sessions::{read_wanted, Brief, Walk};
    let runs = |b: &Brief| b.has_query;
    let ids = |s: &[myprobe::sessions::Session]| s.iter().map(|s| s.id).collect::<Vec<_>>();
    let thd = |i: u64| IMAGE_BASE + 0x40 + i * THD_SIZE;
    // The image with its marks: the end marker's `prev` (head + 16) at the last object's link, and the count of
    // objects in the header, after the list's head and end marker.
    let count_at = IMAGE_BASE + 0x30;
    let marked = |texts: &[Option<Vec<u8>>]| {
        let mut image = linked_image(texts);
        let n = texts.len() as u64;
        image.data[16..24].copy_from_slice(&(thd(n - 1) + 0x10).to_le_bytes());
        image.data[0x30..0x38].copy_from_slice(&n.to_le_bytes());
        image
    };
    let layout = linked_layout(IMAGE_BASE).with_count(Some(count_at));
    let link_reads = |w: &Watched| {
        w.reads
            .borrow()
            .iter()
            .filter(|&&a| a == thd(1) + 0x10 || a == thd(2) + 0x10)
            .count()
    };
    let read = |image: &Image, walk: &mut Walk, still: &dyn Fn(u64) -> bool| {
        let watched = Watched {
            image,
            reads: Default::default(),
        };
        let got = read_wanted(&watched, &layout, walk, still, runs).unwrap();
        (ids(&got), link_reads(&watched))
    };
    let three = marked(&[Some(b"SELECT 1".to_vec()), None, None]);
    let mut walk = Walk::default();
    assert_eq!(read(&three, &mut walk, &|_| false).0, [1]);
    // With the idle ones' threads said not to have run: the marks hold, their links are not read, but once in ten
    // readings.
    let readings: Vec<(Vec<u64>, usize)> = (0..12)
        .map(|_| read(&three, &mut walk, &|_| true))
        .collect();
    assert!(readings.iter().all(|(ids, _)| ids == &[1]));
    assert_eq!(readings.iter().filter(|(_, links)| *links > 0).count(), 1);
    assert_eq!(readings[..9].iter().map(|(_, l)| l).sum::<usize>(), 0);
    // Connection 3 ends and 2 begins a statement, its thread said to have run: the marks changed, the list is
    // walked, 3 is gone and 2 is read.
    let two = marked(&[Some(b"SELECT 1".to_vec()), Some(b"SELECT 2".to_vec())]);
    let second = THREAD_BASE + 2 * 0x1000;
    let (got, links) = read(&two, &mut walk, &|t| t != second);
    assert_eq!(got, [1, 2]);
    assert!(links > 0);
}
