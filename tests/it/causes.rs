//! Why statements wait, in a DBA's words: each scenario's statements named by their cause (`cause`, `waits`) on
//! every server the tests start, whether the scenario began during tracing or before it.

use std::time::Duration;

use serde_json::Value;

use crate::common::*;

/// The causes of the statements waiting in each scenario, and of the ones that do not wait.
struct Scenario {
    kind: &'static str,
    /// Connection id → the cause its statement must be given, and what it is.
    expected: Vec<(u64, &'static str, &'static str)>,
    sleeper: u64,
    /// The connection holding each kind of lock.
    holders: Vec<(&'static str, u64)>,
}

/// Holders and waiters of each kind of wait, the waiters' statements sent; `release` lets them all go.
struct Waits {
    holders: Vec<(Session, String)>,
    waiters: Vec<Session>,
    scenario: Scenario,
}

/// Each test's own tables and lock (`tag`): tests run two at a time.
fn start(db: &TestDb, kind: &'static str, tag: &str) -> Waits {
    db.sql(&format!(
        "CREATE DATABASE IF NOT EXISTS causes; \
         CREATE TABLE IF NOT EXISTS causes.hot_{tag} (id INT PRIMARY KEY, v INT) ENGINE=InnoDB; \
         INSERT IGNORE INTO causes.hot_{tag} VALUES (1, 0); \
         CREATE TABLE IF NOT EXISTS causes.ddl_{tag} (id INT PRIMARY KEY) ENGINE=InnoDB"
    ));
    let mut holders = Vec::new();
    let mut waiters = Vec::new();
    let mut expected = Vec::new();
    let mut waiter = |sql: &str, cause: &'static str, what: &'static str| {
        let mut s = db.session();
        let id = s.connection_id();
        // Answered by a line whether the statement returns rows or not.
        s.send(&format!("{sql}; SELECT 'causes-done'"));
        expected.push((id, cause, what));
        waiters.push(s);
    };
    // A hot row: a transaction holds it, three more update it.
    let mut holder_ids = Vec::new();
    let mut row = db.session();
    holder_ids.push(("row lock", row.connection_id()));
    row.exec(&format!(
        "BEGIN; UPDATE causes.hot_{tag} SET v = v + 1 WHERE id = 1"
    ));
    holders.push((row, "COMMIT".to_string()));
    for _ in 0..3 {
        waiter(
            &format!("UPDATE causes.hot_{tag} SET v = v + 1 WHERE id = 1"),
            "row lock",
            "a hot row",
        );
    }
    // A transaction that read a table, idle in it: an ALTER waits for its metadata lock, a reader behind the ALTER.
    let mut reader = db.session();
    holder_ids.push(("metadata lock", reader.connection_id()));
    reader.exec(&format!("BEGIN; SELECT COUNT(*) FROM causes.ddl_{tag}"));
    holders.push((reader, "COMMIT".to_string()));
    waiter(
        &format!("ALTER TABLE causes.ddl_{tag} COMMENT 'causes'"),
        "metadata lock",
        "ALTER behind an open transaction",
    );
    std::thread::sleep(Duration::from_millis(300));
    waiter(
        &format!("SELECT COUNT(*) FROM causes.ddl_{tag}"),
        "metadata lock",
        "a reader behind the ALTER",
    );
    // A user lock.
    let mut user = db.session();
    holder_ids.push(("user lock", user.connection_id()));
    let lock = format!("causes-{tag}");
    assert_eq!(
        user.query_row(&format!("SELECT GET_LOCK('{lock}', 30)")),
        "1"
    );
    holders.push((user, format!("DO RELEASE_LOCK('{lock}')")));
    waiter(
        &format!("SELECT GET_LOCK('{lock}', 30)"),
        "user lock",
        "GET_LOCK held by another",
    );
    // SLEEP, which waits for nothing.
    let mut sleeper = db.session();
    let sleeper_id = sleeper.connection_id();
    // Long enough to be running still once a tracer started after it is in place (a few seconds on a slow host).
    let secs = if tag == "before" { 6 } else { 2 };
    sleeper.send(&format!("SELECT SLEEP({secs}), 'causes-done'"));
    waiters.push(sleeper);
    Waits {
        holders,
        waiters,
        scenario: Scenario {
            kind,
            expected,
            sleeper: sleeper_id,
            holders: holder_ids,
        },
    }
}

impl Waits {
    /// Ends the holders' transactions and locks, and waits for every waiter's answer.
    fn release(self) -> Scenario {
        for (mut s, sql) in self.holders {
            s.exec(&sql);
        }
        for mut s in self.waiters {
            while !s.read_line().contains("causes-done") {}
        }
        self.scenario
    }
}

fn mine(records: &[Value], conn: u64) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| {
            r["conn"] == conn
                && r["query"]
                    .as_str()
                    .is_some_and(|q| !q.contains("CONNECTION_ID") && q != "SELECT 'causes-done'")
        })
        .collect()
}

fn check(s: &Scenario, records: &[Value], err: &str) {
    let kind = s.kind;
    for &(conn, cause, what) in &s.expected {
        let r = mine(records, conn);
        assert!(
            !r.is_empty(),
            "{kind}: {what}: no record of connection {conn}:\n{records:?}\n{err}"
        );
        let r = r[r.len() - 1];
        assert_eq!(r["cause"], cause, "{kind}: {what}: {r}");
        // Its waits name the same cause, first.
        assert_eq!(r["waits"][0]["cause"], cause, "{kind}: {what}: {r}");
        assert!(r["lock_us"].as_u64().unwrap() > 0, "{kind}: {what}: {r}");
    }
    // Who holds each lock, where the server lists it: InnoDB's lock waits on every server, metadata and user locks
    // in MySQL's performance_schema (MariaDB has no table of them by default).
    for &(cause, holder) in &s.holders {
        if cause != "row lock" && !kind.starts_with("mysql") {
            continue;
        }
        let held_by = |conn: u64| {
            mine(records, conn)
                .last()
                .map(|r| r["waits"][0]["holder"]["conn"].clone())
        };
        let named = s
            .expected
            .iter()
            .filter(|(_, c, _)| *c == cause)
            .any(|&(conn, _, _)| held_by(conn) == Some(Value::from(holder)));
        assert!(
            named,
            "{kind}: no {cause} held by connection {holder}:\n{records:?}\n{err}"
        );
    }
    // SLEEP is no lock wait.
    let r = mine(records, s.sleeper);
    let r = r
        .last()
        .unwrap_or_else(|| panic!("{kind}: no SLEEP record:\n{records:?}\n{err}"));
    assert_eq!(r["cause"], "sleep", "{kind}: {r}");
    assert_eq!(
        (&r["lock_us"], &r["lock_waits"]),
        (&Value::from(0), &Value::from(0)),
        "{kind}: {r}"
    );
    assert!(
        r["lock_symbol"].is_null() && r["lock_site"].is_null(),
        "{kind}: {r}"
    );
    assert!(r["sleep_us"].as_u64().unwrap() >= 200_000, "{kind}: {r}");
}

/// `queries` on `db`, every statement followed, texts as sent.
fn tracer(db: &TestDb) -> Background {
    let pid = db.pid.to_string();
    let args = [
        "queries",
        "-p",
        &pid,
        "--json",
        "--raw-sql",
        "--sample-every",
        "1",
        "-d",
        "30",
    ];
    Background::start(&args, "tracing the statements")
}

#[test]
fn every_wait_is_named_by_its_cause_on_every_server() {
    for (kind, db) in every_server() {
        let tracer = tracer(&db);
        let waits = start(&db, kind, "during");
        // A CPU-heavy statement beside them.
        let mut cpu = db.session();
        let cpu_id = cpu.connection_id();
        cpu.query_row("SELECT BENCHMARK(20000000, CRC32('causes'))");
        std::thread::sleep(Duration::from_millis(1500));
        let scenario = waits.release();
        let (out, err) = tracer.stop();
        let records = json_lines(&out);
        check(&scenario, &records, &err);
        let r = mine(&records, cpu_id);
        assert_eq!(
            r.last().map(|r| &r["cause"]),
            Some(&Value::from("CPU")),
            "{kind}: {r:?}"
        );
    }
}

#[test]
fn waits_that_began_before_tracing_are_named_by_their_cause_on_every_server() {
    for (kind, db) in every_server() {
        let waits = start(&db, kind, "before");
        std::thread::sleep(Duration::from_millis(300));
        let tracer = tracer(&db);
        // Seeded waits count from tracing's start: long (200 ms) after it, looked for once a second; on a busy host
        // the first look can come late.
        std::thread::sleep(Duration::from_millis(3000));
        let scenario = waits.release();
        let (out, err) = tracer.stop();
        let records = json_lines(&out);
        check(&scenario, &records, &err);
        for (conn, _, what) in &scenario.expected {
            let r = mine(&records, *conn);
            assert_eq!(
                r.last().unwrap()["before_tracing"],
                true,
                "{kind}: {what}: {r:?}"
            );
        }
    }
}
