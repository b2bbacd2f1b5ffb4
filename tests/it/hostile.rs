//! What a client writes cannot forge, hide or garble a statement record. The framing cases run against a C
//! fixture whose server thread reads as MariaDB does, so that every record expected is known exactly.

use std::process::Command;

use crate::common::*;
use serde_json::{json, Value};

/// `queries --raw-sql` of process `pid`, with `extra` options, started.
fn raw_sql_tracer(pid: u32, extra: &[&str]) -> Background {
    let pid = pid.to_string();
    // Every statement followed, whatever the rate: these tests look for each.
    let mut args = vec!["queries", "--raw-sql", "--sample-every", "1", "-p", &pid];
    args.extend_from_slice(extra);
    Background::start(&args, "tracing the statements")
}

/// The records `queries --raw-sql --json` gives for the fixture's work, in order.
fn traced(fixture: &mut Fixture) -> (Vec<Value>, String) {
    let tracer = raw_sql_tracer(fixture.child.id(), &["--any-process", "--json"]);
    fixture.go();
    let (out, err) = tracer.stop();
    (json_lines(&out), err)
}

/// The fake wire fixture's records, its stderr; `port`: over TCP to that port instead of a socket pair.
fn fake_wire(port: Option<u16>) -> (Vec<Value>, String) {
    let dir = tempdir("fake-wire");
    let exe = compile_fixture(&dir, "fake_wire", &["protocol/fake_wire.c"], &["-pthread"]);
    let mut cmd = Command::new(&exe);
    if let Some(port) = port {
        cmd.arg(port.to_string());
    }
    let mut fixture = Fixture::start(&mut cmd);
    traced(&mut fixture)
}

fn queries_of(records: &[Value]) -> Vec<&str> {
    records
        .iter()
        .map(|r| r["query"].as_str().unwrap_or("<none>"))
        .collect()
}

#[test]
fn framing_load_data_local_closed_statements_change_user_and_read_ahead_are_followed_exactly() {
    for port in [None, Some(free_tcp_port())] {
        let (records, err) = fake_wire(port);
        assert_eq!(
            queries_of(&records),
            [
                "SELECT 1",
                "SELECT 2",
                "SELECT 3",
                "LOAD DATA LOCAL INFILE 'f' INTO TABLE t",
                "SELECT 4",
                "SELECT ?",
                "SELECT ?",
                "<none>",
                "<none>",
                "SELECT 5",
                // Read ahead: recorded when read, before the statement whose read brought them ends; the
                // third was cut by the read's end.
                "SELECT 7",
                "SE",
                "SELECT 6",
            ],
            "over {port:?}; stderr:\n{err}"
        );
        // COM_CHANGE_USER: the statements after it are the new user's, in the new database.
        let select5 = &records[9];
        assert_eq!(
            (&select5["user"], &select5["db"]),
            (&json!("bob"), &json!("db2")),
            "{select5}"
        );
        let pipelined: Vec<_> = records
            .iter()
            .map(|r| r["pipelined"] == json!(true))
            .collect();
        assert_eq!(pipelined[9..], [false, true, true, false], "{records:?}");
        assert_eq!(records[11]["truncated"], json!(true), "{}", records[11]);
    }
}

/// A TCP port nothing listens on now.
fn free_tcp_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn the_x_protocol_port_is_not_followed() {
    if std::net::TcpListener::bind("127.0.0.1:33060").is_err() {
        eprintln!("skipped: port 33060 is in use here");
        return;
    }
    let (records, err) = fake_wire(Some(33060));
    assert_eq!(queries_of(&records), Vec::<&str>::new(), "stderr:\n{err}");
}

#[test]
fn load_data_local_of_forged_packets_is_one_statement() {
    let db = testdb();
    let dir = tempdir("infile");
    // 10 MB of lines that are each a packet header and a COM_QUERY, wherever the client cuts its packets.
    let forged = "\x13\x00\x00\x00\x03SELECT 'xyzzy' + 1\n";
    let file = dir.join("forged.txt");
    std::fs::write(&file, forged.repeat(10 * 1024 * 1024 / forged.len())).unwrap();
    db.sql("SET GLOBAL local_infile = 1");
    db.sql("CREATE TABLE IF NOT EXISTS sbtest.forged_lines (line BLOB)");
    let tracer = raw_sql_tracer(db.pid, &["--json"]);
    let load = db
        .client()
        .args(["--local-infile=1", "sbtest", "-e"])
        .arg(format!(
            "LOAD DATA LOCAL INFILE '{}' INTO TABLE forged_lines; SELECT 'after the file'",
            file.display()
        ))
        .output()
        .unwrap();
    assert!(
        load.status.success(),
        "{}",
        String::from_utf8_lossy(&load.stderr)
    );
    let (out, err) = tracer.stop();
    db.sql("DROP TABLE sbtest.forged_lines");
    let queries: Vec<String> = json_lines(&out)
        .iter()
        .filter_map(|r| r["query"].as_str().map(str::to_string))
        .collect();
    assert!(
        !queries.iter().any(|q| q.contains("xyzzy")),
        "a file's bytes became statements: {queries:?}\n{err}"
    );
    assert_eq!(
        queries
            .iter()
            .filter(|q| q.starts_with("LOAD DATA LOCAL"))
            .count(),
        1,
        "{queries:?}\n{err}"
    );
    assert_eq!(
        queries
            .iter()
            .filter(|q| q.as_str() == "SELECT 'after the file'")
            .count(),
        1,
        "{queries:?}\n{err}"
    );
}

#[test]
fn a_connection_killed_mid_statement_frees_its_thread_for_the_next() {
    crate::common::servers_alone();
    let db = testdb();
    let pid = db.pid.to_string();
    let tracer = Background::start(&["queries", "--json", "-p", &pid], "tracing the statements");
    let mut victim = db.session();
    let tid = victim.server_tid();
    let conn: u64 = victim.query_row("SELECT CONNECTION_ID()").parse().unwrap();
    victim.send("SELECT SLEEP(30)");
    std::thread::sleep(std::time::Duration::from_millis(500));
    db.sql(&format!("KILL {conn}"));
    drop(victim);
    // The killed connection's thread goes back to the thread cache; sessions are opened (and kept, so that
    // their threads stay busy) until one is served by it.
    let mut others = Vec::new();
    let mut next = loop {
        let mut s = db.session();
        if s.server_tid() == tid {
            break s;
        }
        others.push(s);
        assert!(
            others.len() < 20,
            "thread {tid} never served another connection"
        );
    };
    for i in 0..100 {
        assert_eq!(
            next.query_row(&format!("SELECT {i} + 1")),
            (i + 1).to_string()
        );
    }
    let (out, err) = tracer.stop();
    let sums = json_lines(&out)
        .iter()
        .filter(|r| r["tid"] == tid && r["query"] == "SELECT ? + ?")
        .count();
    assert_eq!(sums, 100, "statements of the reused thread {tid}:\n{err}");
}

/// The vanishing fixture (tests/fixtures/queries/vanishing.c) against `db` in `mode`: the ids of the connection
/// that vanished and of the next one on its thread.
fn vanishing_client(db: &TestDb, mode: &str) -> (u64, u64) {
    let dir = tempdir("vanishing");
    let exe = compile_client_fixture(&dir, "vanishing", "queries/vanishing.c");
    let run = Command::new(&exe)
        .arg(&db.socket)
        .arg(mode)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let id = |what: &str| -> u64 {
        out.lines()
            .find_map(|l| l.strip_prefix(what)?.split(' ').nth(1)?.parse().ok())
            .unwrap_or_else(|| panic!("the fixture said no `{what}`: {out}"))
    };
    (id("vanished "), id("next "))
}

#[test]
fn a_client_gone_mid_statement_leaves_its_thread_to_the_next_connection_on_every_server() {
    crate::common::servers_alone();
    let servers = crate::common::every_server();
    for (kind, db) in &servers {
        // Its request cut short (the server reads to the end of the stream), or KILLed in its SLEEP (MySQL
        // closes the connection without a word).
        for (mode, vanished_text) in [("cut", "SELECT 'cut short' "), ("kill", "SELECT SLEEP(30)")]
        {
            let tracer = raw_sql_tracer(db.pid, &["--json"]);
            let (vanished, next) = vanishing_client(db, mode);
            let (out, err) = tracer.stop();
            let records = json_lines(&out);
            let conns_of = |pred: &dyn Fn(&str) -> bool| -> Vec<&Value> {
                records
                    .iter()
                    .filter(|r| r["query"].as_str().is_some_and(pred))
                    .map(|r| &r["conn"])
                    .collect()
            };
            let after = conns_of(&|q| q.starts_with("SELECT 'after', "));
            assert_eq!(
                after,
                vec![&json!(next); 20],
                "{kind} {mode}: the next connection's\n{err}"
            );
            let gone: Vec<_> = records
                .iter()
                .filter(|r| r["query"] == vanished_text)
                .collect();
            assert_eq!(gone.len(), 1, "{kind} {mode}: {records:?}\n{err}");
            assert_eq!(
                gone[0]["conn"],
                json!(vanished),
                "{kind} {mode}: {}",
                gone[0]
            );
            // It ended when its connection did, not when the thread next served one, 3 s later.
            let took = gone[0]["duration_us"].as_u64().unwrap();
            assert!(
                took < 3_000_000 && gone[0].get("in_flight").is_none(),
                "{kind} {mode}: {}",
                gone[0]
            );
        }
    }
}

#[test]
fn every_thread_of_thousands_is_followed() {
    let dir = tempdir("many-threads");
    let exe = compile_fixture(
        &dir,
        "many_threads",
        &["protocol/many_threads.c"],
        &["-pthread"],
    );
    let mut fixture = Fixture::start(&mut Command::new(&exe));
    let (records, err) = traced(&mut fixture);
    // 8300 threads each serve one statement; a table of 8192 threads followed 8192 of them and counted the
    // others. Their replies are the last thing each thread does: the records come from the threads' state
    // when tracing ends.
    let statements: Vec<_> = records
        .iter()
        .filter(|r| r["query"] == "SELECT 'from a thread of many'")
        .collect();
    let threads: std::collections::HashSet<_> =
        statements.iter().map(|r| r["tid"].as_u64()).collect();
    assert_eq!((statements.len(), threads.len()), (8300, 8300), "{err}");
    assert!(
        records.iter().all(|r| r.get("lost").is_none()) && !err.contains("per-thread"),
        "{err}"
    );
}

/// A client of the classic protocol written byte by byte, so that a test chooses every byte and every write.
mod wire {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::os::unix::net::UnixStream;
    use std::path::PathBuf;

    #[derive(Clone, Debug)]
    pub enum Transport {
        Unix(PathBuf),
        V4(u16),
        V6(u16),
    }

    pub const CLIENT_LONG_PASSWORD: u32 = 1;
    pub const CLIENT_CONNECT_WITH_DB: u32 = 8;
    /// MySQL's compressed protocol with zstd (a handshake that asks for it; MariaDB does not offer it).
    pub const CLIENT_ZSTD_COMPRESSION: u32 = 0x400_0000;
    pub const CLIENT_PROTOCOL_41: u32 = 0x200;
    pub const CLIENT_SECURE_CONNECTION: u32 = 0x8000;
    pub const CLIENT_PLUGIN_AUTH: u32 = 0x8_0000;

    pub trait Stream: Read + Write + Send {}
    impl<T: Read + Write + Send> Stream for T {}

    pub struct Client {
        stream: Box<dyn Stream>,
        /// The server's connection id, from its greeting.
        pub id: u32,
    }

    /// A packet: 3 bytes of length, the sequence id, the payload.
    pub fn packet(seq: u8, payload: &[u8]) -> Vec<u8> {
        let mut p = (payload.len() as u32).to_le_bytes()[..3].to_vec();
        p.push(seq);
        p.extend_from_slice(payload);
        p
    }

    /// A handshake response: `caps` added to protocol 4.1 and plugin auth, no auth data unless given.
    pub fn handshake_response(user: &[u8], db: Option<&str>, caps: u32, auth: &[u8]) -> Vec<u8> {
        let caps = caps
            | CLIENT_LONG_PASSWORD
            | CLIENT_PROTOCOL_41
            | CLIENT_SECURE_CONNECTION
            | CLIENT_PLUGIN_AUTH
            | if db.is_some() {
                CLIENT_CONNECT_WITH_DB
            } else {
                0
            };
        let mut p = caps.to_le_bytes().to_vec();
        p.extend((1u32 << 24).to_le_bytes());
        p.push(0x21); // utf8
        p.extend([0; 23]);
        p.extend_from_slice(user);
        p.push(0);
        p.push(auth.len() as u8);
        p.extend_from_slice(auth);
        if let Some(db) = db {
            p.extend(db.as_bytes());
            p.push(0);
        }
        p.extend(b"mysql_native_password\0");
        p
    }

    impl Client {
        /// Connects and reads the server's greeting.
        pub fn connect(t: &Transport) -> Client {
            let stream: Box<dyn Stream> = match t {
                Transport::Unix(path) => Box::new(UnixStream::connect(path).expect("unix socket")),
                Transport::V4(port) => {
                    let s = TcpStream::connect(("127.0.0.1", *port)).expect("TCP over IPv4");
                    s.set_nodelay(true).unwrap();
                    Box::new(s)
                }
                Transport::V6(port) => {
                    let s = TcpStream::connect(("::1", *port)).expect("TCP over IPv6");
                    s.set_nodelay(true).unwrap();
                    Box::new(s)
                }
            };
            let mut c = Client { stream, id: 0 };
            let (_, greeting) = c.read_packet();
            assert_eq!(greeting.first(), Some(&10), "not a greeting: {greeting:?}");
            let version_end = greeting.iter().skip(1).position(|&b| b == 0).unwrap() + 2;
            c.id = u32::from_le_bytes(greeting[version_end..version_end + 4].try_into().unwrap());
            c
        }

        /// Connects and logs in as a user without a password; panics unless the server says OK.
        pub fn login(t: &Transport, user: &str, db: Option<&str>) -> Client {
            let mut c = Client::connect(t);
            let reply = c.handshake(user.as_bytes(), db, 0, &[]);
            assert_eq!(
                reply.first(),
                Some(&0),
                "login refused: {}",
                String::from_utf8_lossy(&reply)
            );
            c
        }

        /// Sends a handshake response; returns the payload of the server's answer.
        pub fn handshake(
            &mut self,
            user: &[u8],
            db: Option<&str>,
            caps: u32,
            auth: &[u8],
        ) -> Vec<u8> {
            self.write(&packet(1, &handshake_response(user, db, caps, auth)));
            self.read_packet().1
        }

        pub fn write(&mut self, bytes: &[u8]) {
            self.stream.write_all(bytes).expect("writing to the server");
        }

        pub fn read_packet(&mut self) -> (u8, Vec<u8>) {
            let mut h = [0u8; 4];
            self.stream.read_exact(&mut h).expect("a packet header");
            let len = u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize;
            let mut payload = vec![0; len];
            self.stream.read_exact(&mut payload).expect("a packet body");
            (h[3], payload)
        }

        /// The whole reply to a command: OK, ERR, or a result set (without CLIENT_DEPRECATE_EOF: column
        /// definitions, EOF, rows, EOF). Returns its first packet's payload.
        pub fn reply(&mut self) -> Vec<u8> {
            let (_, first) = self.read_packet();
            if matches!(first.first(), Some(0x00 | 0xff)) {
                return first;
            }
            let mut eofs = 0;
            while eofs < 2 {
                let (_, p) = self.read_packet();
                if p.first() == Some(&0xff) {
                    return p;
                }
                if p.first() == Some(&0xfe) && p.len() < 9 {
                    eofs += 1;
                }
            }
            first
        }

        /// A command (its byte, then its arguments) in one write; its reply's first packet.
        pub fn command(&mut self, cmd: u8, args: &[u8]) -> Vec<u8> {
            let mut payload = vec![cmd];
            payload.extend_from_slice(args);
            self.write(&packet(0, &payload));
            self.reply()
        }

        pub fn query(&mut self, sql: &str) -> Vec<u8> {
            self.command(0x03, sql.as_bytes())
        }

        /// COM_STMT_PREPARE; the statement id.
        pub fn prepare(&mut self, sql: &str) -> u32 {
            let mut payload = vec![0x16];
            payload.extend(sql.as_bytes());
            self.write(&packet(0, &payload));
            let (_, ok) = self.read_packet();
            assert_eq!(
                ok.first(),
                Some(&0),
                "prepare refused: {}",
                String::from_utf8_lossy(&ok)
            );
            let id = u32::from_le_bytes(ok[1..5].try_into().unwrap());
            let columns = u16::from_le_bytes([ok[5], ok[6]]) as usize;
            let params = u16::from_le_bytes([ok[7], ok[8]]) as usize;
            // Parameter and column definitions, each list ended by an EOF.
            let more = params + (params > 0) as usize + columns + (columns > 0) as usize;
            for _ in 0..more {
                self.read_packet();
            }
            id
        }
    }
}

#[test]
fn statement_prepared_before_tracing_is_labelled_by_its_result_set() {
    let db = testdb();
    // The raw client announces none of MariaDB's extended capabilities, so it caches no metadata (Connector/C
    // does: see queries.rs): each result set comes with its column definitions.
    let mut client = wire::Client::login(
        &wire::Transport::Unix(db.socket.clone()),
        "root",
        Some("sbtest"),
    );
    let select =
        client.prepare("SELECT s.c, s.pad, s.id + 1 AS next FROM sbtest1 s WHERE s.id = 1");
    let update = client.prepare("UPDATE sbtest1 SET k = k WHERE id = 1");
    // Its records by its thread: other tests run statements prepared before tracing on the same server.
    let tid = db.sql(&format!(
        "SELECT TID FROM information_schema.PROCESSLIST WHERE ID = {}",
        client.id
    ));
    let tid: u64 = tid.trim().parse().expect("the raw client's thread");
    let tracer = raw_sql_tracer(db.pid, &["--json", "--no-sql"]);
    // COM_STMT_EXECUTE: the id, no cursor, one iteration (the statements have no parameters).
    let execute = |id: u32| [&id.to_le_bytes()[..], &[0, 1, 0, 0, 0]].concat();
    // The first reply tells that this client gets column definitions: the next ones are kept (the kernel side
    // is told at the tracer's next poll, every 100 ms; a busy host's may come later).
    assert_eq!(client.command(0x17, &execute(select)), [3]);
    std::thread::sleep(std::time::Duration::from_millis(2000));
    for _ in 0..3 {
        let head = client.command(0x17, &execute(select));
        assert_eq!(head, [3], "a result set of three columns");
        assert_eq!(client.command(0x17, &execute(update)).first(), Some(&0));
    }
    drop(client);
    let (out, err) = tracer.stop();
    let all = json_lines(&out);
    let executes: Vec<_> = all
        .iter()
        .filter(|r| r["command"] == "Execute" && r["tid"] == tid)
        .collect();
    assert_eq!(executes.len(), 7, "{all:?}\nstderr:\n{err}");
    for r in &executes {
        assert!(
            r["query"].is_null(),
            "the text is unknown, not made up: {r}"
        );
    }
    // The tables are the stored ones (not the alias s), the columns as the statement names them.
    let labelled = format!("SELECT … FROM sbtest.sbtest1 (c, pad, next) #{select}");
    assert_eq!(
        executes
            .iter()
            .filter(|r| r["fingerprint"] == labelled)
            .count(),
        3,
        "{executes:?}"
    );
    // The first, and those without a result set: nothing to show but their id.
    for (id, n) in [(select, 1), (update, 3)] {
        let unknown = format!("statement prepared before tracing #{id}");
        assert_eq!(
            executes
                .iter()
                .filter(|r| r["fingerprint"] == unknown)
                .count(),
            n,
            "{executes:?}"
        );
    }
}

/// Every transport of the test server: its unix socket, TCP over IPv4 and IPv6 (if the server listens there).
fn transports(db: &TestDb) -> Vec<wire::Transport> {
    let port: u16 = std::env::var("MYPROBE_TEST_PORT")
        .expect("MYPROBE_TEST_PORT")
        .parse()
        .unwrap();
    let mut all = vec![
        wire::Transport::Unix(db.socket.clone()),
        wire::Transport::V4(port),
    ];
    if std::net::TcpStream::connect(("::1", port)).is_ok() {
        all.push(wire::Transport::V6(port));
    } else {
        eprintln!("note: the test server does not listen on ::1: no IPv6 client");
    }
    all
}

/// Users without a password, from every host the transports come from, and their databases.
fn create_hostile_users(db: &TestDb) {
    let mut sql = String::from(
        "CREATE DATABASE IF NOT EXISTS hostiledb; CREATE DATABASE IF NOT EXISTS hostiledb2;",
    );
    for user in ["hostile", "hostile2"] {
        for host in ["localhost", "127.0.0.1", "::1"] {
            sql += &format!(
                "CREATE USER IF NOT EXISTS '{user}'@'{host}'; GRANT ALL ON *.* TO '{user}'@'{host}';"
            );
        }
    }
    db.sql(&sql);
}

/// What one raw client does (`tag` names it in its statements), the 20 MiB statement if `big`. Returns its
/// connection id and the records expected of it: (query or `<command>`, user, db).
fn hostile_client(
    t: &wire::Transport,
    tag: &str,
    big: bool,
) -> (u32, Vec<(String, &'static str, &'static str)>) {
    let mut c = wire::Client::login(t, "hostile", Some("hostiledb"));
    let mut expected = Vec::new();
    let mut expect = |q: String, user, db| expected.push((q, user, db));
    // 1. A header one byte a write: the server reads it in pieces.
    let sql = format!("SELECT '{tag}', 1");
    let mut payload = vec![0x03];
    payload.extend(sql.as_bytes());
    let p = wire::packet(0, &payload);
    for b in &p[..4] {
        c.write(&[*b]);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    c.write(&p[4..]);
    assert_eq!(c.reply().first(), Some(&2), "{sql}: two columns");
    expect(sql, "hostile", "hostiledb");
    // 1b. A body in three writes, as a client that writes in pieces or a network's segments deliver it: the server
    // reads it in pieces, and its text is whole.
    let sql = format!("SELECT '{tag}', 'a body in pieces'");
    let mut payload = vec![0x03];
    payload.extend(sql.as_bytes());
    let p = wire::packet(0, &payload);
    for piece in [&p[..9], &p[9..20], &p[20..]] {
        c.write(piece);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(c.reply().first(), Some(&2), "{sql}: two columns");
    expect(sql, "hostile", "hostiledb");
    // 2. An empty packet: answered with an error, and no statement.
    c.write(&wire::packet(0, &[]));
    assert_eq!(c.reply().first(), Some(&0xff));
    let sql = format!("SELECT '{tag}', 2");
    c.query(&sql);
    expect(sql, "hostile", "hostiledb");
    // 5. A statement of 20 MiB (two packets: 16 MiB - 1 and the rest), holding forged packets.
    if big {
        let forged = "\x0e\x00\x00\x00\x03SELECT forged";
        let sql = format!(
            "SELECT LENGTH('{}')",
            forged.repeat(20 * 1024 * 1024 / forged.len())
        );
        let mut payload = vec![0x03];
        payload.extend(sql.as_bytes());
        let mut bytes = wire::packet(0, &payload[..0xff_ffff]);
        bytes.extend(wire::packet(1, &payload[0xff_ffff..]));
        c.write(&bytes);
        assert_eq!(
            c.reply().first(),
            Some(&1),
            "the 20 MiB statement is answered"
        );
        expect("SELECT LENGTH('".into(), "hostile", "hostiledb");
    }
    // 6. Two statements in one write.
    let (a, b) = (format!("SELECT '{tag}', 61"), format!("SELECT '{tag}', 62"));
    let mut bytes = wire::packet(0, &[&[0x03u8][..], a.as_bytes()].concat());
    bytes.extend(wire::packet(0, &[&[0x03u8][..], b.as_bytes()].concat()));
    c.write(&bytes);
    c.reply();
    c.reply();
    expect(a, "hostile", "hostiledb");
    expect(b, "hostile", "hostiledb");
    // 9. COM_CHANGE_USER, then COM_RESET_CONNECTION, which drops the prepared statement.
    let mut change = b"hostile2\0\0hostiledb2\0".to_vec();
    change.extend(0x21u16.to_le_bytes());
    change.extend(b"mysql_native_password\0");
    c.write(&wire::packet(0, &[&[0x11u8][..], &change].concat()));
    let (seq, mut answer) = c.read_packet();
    if answer.first() == Some(&0xfe) {
        // An authentication switch (a new scramble): an empty password is an empty reply.
        c.write(&wire::packet(seq + 1, &[]));
        answer = c.read_packet().1;
    }
    assert_eq!(
        answer.first(),
        Some(&0),
        "change user: {}",
        String::from_utf8_lossy(&answer)
    );
    expect("<Change user>".into(), "hostile2", "hostiledb2");
    let sql = format!("SELECT '{tag}', 9");
    c.query(&sql);
    expect(sql, "hostile2", "hostiledb2");
    let id = c.prepare(&format!("SELECT '{tag}', ?"));
    expect(format!("SELECT '{tag}', ?"), "hostile2", "hostiledb2");
    assert_eq!(c.command(0x1f, &[]).first(), Some(&0), "reset connection");
    expect("<Reset Connection>".into(), "hostile2", "hostiledb2");
    let mut execute = id.to_le_bytes().to_vec();
    execute.extend([0, 1, 0, 0, 0]);
    assert_eq!(
        c.command(0x17, &execute).first(),
        Some(&0xff),
        "a statement reset away"
    );
    expect("<Execute>".into(), "hostile2", "hostiledb2");
    let sql = format!("SELECT '{tag}', 10");
    c.query(&sql);
    expect(sql, "hostile2", "hostiledb2");
    c.write(&wire::packet(0, &[0x01])); // COM_QUIT
    (c.id, expected)
}

#[test]
fn raw_clients_over_three_transports_at_once_are_followed_exactly() {
    let db = testdb();
    create_hostile_users(&db);
    let max_packet = db.sql("SELECT @@GLOBAL.max_allowed_packet");
    db.sql("SET GLOBAL max_allowed_packet = 64 * 1024 * 1024");
    let tracer = raw_sql_tracer(db.pid, &["--json"]);
    let clients: Vec<_> = transports(&db)
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            std::thread::spawn(move || {
                let tag = format!("{t:?}").split('(').next().unwrap().to_string();
                (tag.clone(), hostile_client(&t, &tag, i == 0))
            })
        })
        .collect();
    let clients: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let (out, err) = tracer.stop();
    db.sql(&format!(
        "SET GLOBAL max_allowed_packet = {}",
        max_packet.trim()
    ));
    let records = json_lines(&out);
    assert!(
        !records.iter().any(|r| r["query"]
            .as_str()
            .is_some_and(|q| q.starts_with("SELECT forged"))),
        "bytes of a statement became a statement:\n{err}"
    );
    for (tag, (conn, expected)) in clients {
        let got: Vec<(String, &str, &str)> = records
            .iter()
            .filter(|r| r["conn"] == json!(conn))
            .map(|r| {
                let q = match r["query"].as_str() {
                    Some(q) if q.starts_with("SELECT LENGTH('") => "SELECT LENGTH('".to_string(),
                    Some(q) => q.to_string(),
                    None => format!("<{}>", r["command"].as_str().unwrap_or("?")),
                };
                (
                    q,
                    r["user"].as_str().unwrap_or("-"),
                    r["db"].as_str().unwrap_or("-"),
                )
            })
            .collect();
        let got: Vec<(String, &str, &str)> = got.into_iter().collect();
        let expected: Vec<(String, &str, &str)> = expected;
        assert_eq!(
            got, expected,
            "client over {tag} (connection {conn}); stderr:\n{err}"
        );
    }
}

#[test]
fn ten_thousand_unauthenticated_handshakes_with_terminal_escapes_reach_no_terminal() {
    crate::common::servers_alone();
    let db = testdb();
    create_hostile_users(&db);
    // The table, not JSON: what root reads in a terminal.
    let tracer = raw_sql_tracer(db.pid, &[]);
    let evil = b"\x1b[31mevil\x1b]0;pwned\x07\x1b[2J\xc2\x9b1m";
    let workers: Vec<_> = transports(&db)
        .into_iter()
        .take(2)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..5000 {
                    let mut c = wire::Client::connect(&t);
                    // One in ten asks for zstd compression: its framing is never taken up.
                    let caps = if i % 10 == 0 {
                        wire::CLIENT_ZSTD_COMPRESSION
                    } else {
                        0
                    };
                    let answer = c.handshake(evil, Some("hostiledb"), caps, &[1; 20]);
                    assert_eq!(answer.first(), Some(&0xff), "a wrong password is refused");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    // And statements whose text and identifiers hold escapes, from a user who logged in.
    let mut c = wire::Client::login(&transports(&db)[0], "hostile", Some("hostiledb"));
    c.query("SELECT '\x1b[2J' AS `\x1b]0;owned\x07`");
    let rss_kib = std::fs::read_to_string(format!("/proc/{}/status", tracer.pid()))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
        .unwrap();
    let (out, err) = tracer.stop();
    for (name, text) in [("stdout", &out), ("stderr", &err)] {
        let bad: Vec<char> = text
            .chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect();
        assert!(
            bad.is_empty(),
            "control characters {bad:?} reach the terminal on {name}:\n{text}"
        );
    }
    // (Unless a busy host's reader fell so far behind the 10,000 handshakes that the ring buffer was full when it
    // came: then the loss is said.)
    assert!(
        out.contains("\\x1b[2J") || err.contains("ring buffer full"),
        "the statement is shown, escaped:\n{out}\nstderr:\n{err}"
    );
    // 10,000 connections leave no trace in memory (peak RSS of a run that saw one statement is ~40 MiB).
    assert!(rss_kib < 100 * 1024, "peak RSS {rss_kib} KiB");
}

#[test]
fn a_compressed_client_and_a_client_killed_mid_update_forge_nothing() {
    // Every record on the server is looked at: no other test's.
    crate::common::servers_alone();
    let db = testdb();
    let tracer = raw_sql_tracer(db.pid, &["--json"]);
    // 4. The compressed protocol: a short statement sent as is, a long one deflated.
    let long = format!("SELECT 'compressed', '{}'", "deflated ".repeat(50));
    let compressed = db
        .client()
        .args(["--compress", "-e"])
        .arg(format!("SELECT 'compressed', 4; {long}"))
        .output()
        .unwrap();
    assert!(compressed.status.success(), "{compressed:?}");
    // 8. A client SIGKILLed while its UPDATE waits for a row lock; the lock is then released.
    let mut holder = db.session();
    holder.query_row("BEGIN; UPDATE sbtest.sbtest1 SET k = k + 1 WHERE id = 1; SELECT 'held'");
    let mut victim = db
        .client()
        .args([
            "-e",
            "UPDATE sbtest.sbtest1 SET k = k + 1 WHERE id = 1 AND 'victim' <> ''",
        ])
        .spawn()
        .unwrap();
    // Killed half a second after its UPDATE blocked, however long it took to get there.
    db.wait_for_row_lock_wait("'victim'");
    std::thread::sleep(std::time::Duration::from_millis(700));
    victim.kill().unwrap();
    victim.wait().unwrap();
    holder.query_row("COMMIT; SELECT 'released'");
    // The thread is free for what comes next.
    std::thread::sleep(std::time::Duration::from_millis(300));
    for i in 0..20 {
        db.sql(&format!("SELECT 'after', {i}"));
    }
    let (out, err) = tracer.stop();
    let records = json_lines(&out);
    let queries: Vec<&str> = records.iter().filter_map(|r| r["query"].as_str()).collect();
    for q in ["SELECT 'compressed', 4", long.as_str()] {
        assert_eq!(
            queries.iter().filter(|x| **x == q).count(),
            1,
            "{q} on the compressed connection: {queries:?}"
        );
    }
    // Nothing but what the clients sent: the mariadb client's own statements, the UPDATEs, the SELECTs.
    let strange: Vec<_> = records
        .iter()
        .filter(|r| r.get("lost").is_none())
        .filter(|r| r["command"] != json!("Query") && r["command"] != json!("Init DB"))
        .collect();
    assert!(strange.is_empty(), "records of no statement: {strange:?}");
    let victim = records
        .iter()
        .find(|r| {
            r["query"]
                .as_str()
                .is_some_and(|q| q.starts_with("UPDATE") && q.contains("victim"))
        })
        .unwrap_or_else(|| panic!("no record of the killed client's UPDATE: {queries:?}\n{err}"));
    assert!(
        victim["lock_us"].as_u64().unwrap() >= 500_000,
        "it waited for the row lock: {victim}"
    );
    for i in 0..20 {
        let q = format!("SELECT 'after', {i}");
        assert_eq!(
            queries.iter().filter(|x| **x == q).count(),
            1,
            "{q}: {queries:?}"
        );
    }
}

/// A network namespace of the test's own, joined to the host's by a veth pair with the usual MTU of 1,500 bytes,
/// the client's side rate-limited so that a statement of some kilobytes reaches the server in several reads.
/// Removed on drop.
struct SlowNetwork {
    namespace: String,
    host_side: String,
    server_ip: String,
}

impl SlowNetwork {
    fn new() -> SlowNetwork {
        let id = std::process::id();
        let net = SlowNetwork {
            namespace: format!("myprobe-mtu-{id}"),
            host_side: format!("mpv{id}h"),
            server_ip: format!("10.213.{}.1", id % 250),
        };
        let client_side = format!("mpv{id}c");
        let client_ip = format!("10.213.{}.2/30", id % 250);
        let ns = net.namespace.as_str();
        for args in [
            vec!["netns", "add", ns],
            vec![
                "link",
                "add",
                &net.host_side,
                "mtu",
                "1500",
                "type",
                "veth",
                "peer",
                "name",
                &client_side,
            ],
            vec!["link", "set", &client_side, "netns", ns],
            vec![
                "addr",
                "add",
                &format!("{}/30", net.server_ip),
                "dev",
                &net.host_side,
            ],
            vec!["link", "set", &net.host_side, "up"],
            vec!["-n", ns, "addr", "add", &client_ip, "dev", &client_side],
            vec!["-n", ns, "link", "set", &client_side, "mtu", "1500", "up"],
            vec!["-n", ns, "link", "set", "lo", "up"],
        ] {
            run_ok(Command::new("ip").args(&args));
        }
        // 20 Mbit/s: a 10 KB statement takes 4 ms to go out, in segments of 1,448 bytes.
        run_ok(
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    ns,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    &client_side,
                ])
                .args([
                    "root", "tbf", "rate", "20mbit", "burst", "4kb", "latency", "100ms",
                ]),
        );
        net
    }
}

impl Drop for SlowNetwork {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_side])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.namespace])
            .status();
    }
}

/// Statements of 10 KB from a client across a 1,500-byte MTU come in segments, and the server reads each in
/// several pieces: the text of each is whole up to what myprobe keeps (1,023 bytes after the command), marked
/// truncated.
#[test]
fn statements_of_10_kb_over_a_1500_byte_mtu_are_whole_to_the_capture_limit() {
    let db = testdb();
    let net = SlowNetwork::new();
    let dir = tempdir("mtu");
    let server = db.start_another(
        &dir.join("db"),
        &[
            &format!("--bind-address={}", net.server_ip),
            "--skip-name-resolve",
        ],
    );
    server
        .0
        .sql("CREATE USER 'mtu'@'%'; GRANT ALL ON *.* TO 'mtu'@'%'");
    let port = server.0.port();
    let tracer = raw_sql_tracer(server.0.pid, &["--json"]);
    // Each different all along, so that a piece out of place would show.
    let statements: Vec<String> = (0..5)
        .map(|i| {
            let words: String = (0..1300).map(|w| format!("w{i}_{w:04} ")).collect();
            format!("SELECT {i}, LENGTH('{words}')")
        })
        .collect();
    let client = Command::new("ip")
        .args([
            "netns",
            "exec",
            &net.namespace,
            "mariadb",
            "--no-defaults",
            "--skip-ssl",
        ])
        .args(["-h", &net.server_ip, "-P", &port, "-u", "mtu", "-e"])
        .arg(statements.join(";\n"))
        .output()
        .unwrap();
    assert!(client.status.success(), "{client:?}");
    let (out, err) = tracer.stop();
    let records = json_lines(&out);
    for (i, sent) in statements.iter().enumerate() {
        assert!(sent.len() > 10_000);
        let prefix = format!("SELECT {i}, ");
        let seen: Vec<&Value> = records
            .iter()
            .filter(|r| r["query"].as_str().is_some_and(|q| q.starts_with(&prefix)))
            .collect();
        assert_eq!(seen.len(), 1, "statement {i}: {seen:?}\n{err}");
        let query = seen[0]["query"].as_str().unwrap();
        assert_eq!(seen[0]["truncated"], json!(true), "{}", seen[0]);
        assert_eq!(query, &sent[..1023], "statement {i}, as kept:\n{query}");
    }
}
