//! What a client writes cannot forge, hide or garble a statement record. The framing cases run against a C
//! fixture whose server thread reads as MariaDB does, so that every record expected is known exactly.

mod common;
use std::process::Command;

use common::*;
use serde_json::{json, Value};

/// The JSON records of a `queries --json` run.
fn records(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The records `queries --raw-sql --json` gives for the fixture's work, in order.
fn traced(fixture: &mut Fixture) -> (Vec<Value>, String) {
    let pid = fixture.child.id().to_string();
    let tracer = Background::start(
        &[
            "queries",
            "--any-process",
            "--raw-sql",
            "--json",
            "-p",
            &pid,
        ],
        "tracing the statements",
    );
    fixture.go();
    let (out, err) = tracer.stop();
    (records(&out), err)
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
    let pid = db.pid.to_string();
    let tracer = Background::start(
        &["queries", "--raw-sql", "--json", "-p", &pid],
        "tracing the statements",
    );
    let load = Command::new("mariadb")
        .arg("-S")
        .arg(&db.socket)
        .args(["-uroot", "--local-infile=1", "sbtest", "-e"])
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
    let queries: Vec<String> = records(&out)
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
    let sums = records(&out)
        .iter()
        .filter(|r| r["tid"] == tid && r["query"] == "SELECT ? + ?")
        .count();
    assert_eq!(sums, 100, "statements of the reused thread {tid}:\n{err}");
}

#[test]
fn threads_beyond_those_followed_are_counted_once_each() {
    let dir = tempdir("many-threads");
    let exe = compile_fixture(
        &dir,
        "many_threads",
        &["protocol/many_threads.c"],
        &["-pthread"],
    );
    let mut fixture = Fixture::start(&mut Command::new(&exe));
    let (_, err) = traced(&mut fixture);
    // 8300 threads, 8192 followed (MAX_THREADS in src/bpf/queries.h): 108 are not, each counted once
    // however many syscalls it makes.
    let line = err
        .lines()
        .find(|l| l.contains("per-thread"))
        .unwrap_or_else(|| panic!("no loss reported:\n{err}"));
    assert!(line.contains(": 108 ("), "{line}");
}
