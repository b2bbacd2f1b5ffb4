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
    /// A client that does not read its result: the server waits to send it.
    slow_client: u64,
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
        "CREATE DATABASE IF NOT EXISTS causes_{tag}; \
         CREATE TABLE IF NOT EXISTS causes_{tag}.hot (id INT PRIMARY KEY, v INT) ENGINE=InnoDB; \
         INSERT IGNORE INTO causes_{tag}.hot VALUES (1, 0); \
         CREATE TABLE IF NOT EXISTS causes_{tag}.ddl (id INT PRIMARY KEY) ENGINE=InnoDB; \
         CREATE TABLE IF NOT EXISTS causes_{tag}.locked (id INT PRIMARY KEY) ENGINE=InnoDB; \
         CREATE TABLE IF NOT EXISTS causes_{tag}.ten (n INT) ENGINE=InnoDB; DELETE FROM causes_{tag}.ten; \
         INSERT INTO causes_{tag}.ten VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)"
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
        "BEGIN; UPDATE causes_{tag}.hot SET v = v + 1 WHERE id = 1"
    ));
    holders.push((row, "COMMIT".to_string()));
    for _ in 0..3 {
        waiter(
            &format!("UPDATE causes_{tag}.hot SET v = v + 1 WHERE id = 1"),
            "row lock",
            "a hot row",
        );
    }
    // A transaction that read a table, idle in it: an ALTER waits for its metadata lock, a reader behind the ALTER.
    let mut reader = db.session();
    holder_ids.push(("metadata lock", reader.connection_id()));
    reader.exec(&format!("BEGIN; SELECT COUNT(*) FROM causes_{tag}.ddl"));
    holders.push((reader, "COMMIT".to_string()));
    waiter(
        &format!("ALTER TABLE causes_{tag}.ddl COMMENT 'causes'"),
        "metadata lock",
        "ALTER behind an open transaction",
    );
    std::thread::sleep(Duration::from_millis(300));
    waiter(
        &format!("SELECT COUNT(*) FROM causes_{tag}.ddl"),
        "metadata lock",
        "a reader behind the ALTER",
    );
    // LOCK TABLES ... WRITE: a reader waits for the table lock (a metadata lock, named by the holder's type).
    let mut locker = db.session();
    holder_ids.push(("table lock", locker.connection_id()));
    locker.exec(&format!("LOCK TABLES causes_{tag}.locked WRITE"));
    holders.push((locker, "UNLOCK TABLES".to_string()));
    waiter(
        &format!("SELECT COUNT(*) FROM causes_{tag}.locked"),
        "table lock",
        "a reader behind LOCK TABLES ... WRITE",
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
    // A client that reads a large result only once released (the mariadb client with --quick writes each row as
    // it reads it, into a pipe nobody reads until then).
    let mut slow = db.session_with(&["--quick"]);
    let slow_client = slow.connection_id();
    slow.send(&format!(
        "SELECT a.n, REPEAT('x', 4000) FROM causes_{tag}.ten a, causes_{tag}.ten b, causes_{tag}.ten c, \
         causes_{tag}.ten d; SELECT 'causes-done'"
    ));
    waiters.push(slow);
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
            slow_client,
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
            s.read_until("causes-done");
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
    // Who holds each lock: InnoDB's lock waits on every server, metadata and user locks in MySQL's
    // performance_schema and in MariaDB's memory (it has no table of them by default).
    for &(cause, holder) in &s.holders {
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
    // The server waits for its client to read.
    let r = mine(records, s.slow_client);
    let r = r
        .last()
        .unwrap_or_else(|| panic!("{kind}: no record of the slow client:\n{records:?}\n{err}"));
    assert_eq!(r["cause"], "client", "{kind}: {r}");
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
        // On a CPU, or waiting for one where the tests beside it keep the host's CPUs busy.
        let r = mine(&records, cpu_id);
        assert!(
            r.last()
                .is_some_and(|r| r["cause"] == "CPU" || r["cause"] == "run queue"),
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

/// A table of 6,000 rows of 7 KB (48 MB) whose pages are not in the buffer pool: MySQL's test server has a buffer
/// pool of 16 MB, which the table's last pages pushed its first out of; MariaDB's has one far larger, and its IMPORT
/// TABLESPACE leaves the pages out of it (MySQL's reads them in). Each test has a database of its own: a
/// `CREATE DATABASE` waits for every lock in the database, even one held by another test's scenario.
fn cold_table(db: &TestDb, kind: &str) {
    db.sql(
        "CREATE DATABASE IF NOT EXISTS cold; \
         CREATE TABLE IF NOT EXISTS cold.ten (n INT) ENGINE=InnoDB; DELETE FROM cold.ten; \
         INSERT INTO cold.ten VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9); \
         DROP TABLE IF EXISTS cold.pages; \
         CREATE TABLE cold.pages (id INT AUTO_INCREMENT PRIMARY KEY, b VARCHAR(7000)) ENGINE=InnoDB; \
         INSERT INTO cold.pages (b) SELECT REPEAT('y', 7000) FROM cold.ten a, cold.ten b, cold.ten c, \
         (SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL \
         SELECT 6) d",
    );
    if kind.starts_with("mysql") {
        return;
    }
    let data = db.dir.join("data").join("cold");
    let kept = tempdir("cold-table");
    let copy = |from: &std::path::Path, to: &std::path::Path| {
        format!(
            "SYSTEM cp {0}/pages.ibd {0}/pages.cfg {1}/",
            from.display(),
            to.display()
        )
    };
    db.sql(&format!(
        "FLUSH TABLES cold.pages FOR EXPORT; {}; UNLOCK TABLES; \
         ALTER TABLE cold.pages DISCARD TABLESPACE; {}; ALTER TABLE cold.pages IMPORT TABLESPACE",
        copy(&data, &kept),
        copy(&kept, &data)
    ));
}

#[test]
fn page_reads_commits_and_their_files_are_named_on_every_server() {
    for (kind, db) in every_server() {
        cold_table(&db, kind);
        db.sql(
            "CREATE DATABASE IF NOT EXISTS commits; \
             CREATE TABLE IF NOT EXISTS commits.log (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=InnoDB",
        );
        let tracer = tracer(&db);
        // Point reads three pages apart (too sparse for InnoDB's read-ahead): a page read from disk each.
        let ids: Vec<String> = (1..2000).step_by(6).map(|i| i.to_string()).collect();
        let mut cold = db.session();
        let cold_id = cold.connection_id();
        cold.query_row(&format!(
            "SELECT SUM(LENGTH(b)) FROM cold.pages WHERE id IN ({})",
            ids.join(",")
        ));
        // Commits, four connections at once: each synced to the redo log, and on MySQL to its binlog first.
        let committers: Vec<_> = (0..4)
            .map(|_| {
                let mut s = db.session();
                for v in 0..25 {
                    s.send(&format!("INSERT INTO commits.log (v) VALUES ({v})"));
                }
                s.send("SELECT 'causes-done'");
                s
            })
            .collect();
        for mut s in committers {
            s.read_until("causes-done");
        }
        let (out, err) = tracer.stop();
        let records = json_lines(&out);
        let r = mine(&records, cold_id);
        let r = r
            .last()
            .unwrap_or_else(|| panic!("{kind}: no cold read:\n{records:?}\n{err}"));
        // Its time waiting went to reading pages, and is said so unless a busy host (the tests beside it) kept it
        // from a CPU longer.
        assert!(
            ["page read", "run queue"].contains(&r["cause"].as_str().unwrap()),
            "{kind}: {r}"
        );
        assert_eq!(r["io"][0]["cause"], "page read", "{kind}: {r}");
        assert_eq!(r["io"][0]["object"], "cold.pages", "{kind}: {r}");
        let commits: Vec<&Value> = records
            .iter()
            .filter(|r| {
                r["query"]
                    .as_str()
                    .is_some_and(|q| q.starts_with("INSERT INTO commits.log"))
            })
            .collect();
        assert_eq!(commits.len(), 100, "{kind}: {commits:?}\n{err}");
        // Every commit's I/O is named by its file: none is a bare file write or sync.
        for r in &commits {
            for w in r["io"].as_array().into_iter().flatten() {
                assert!(
                    !["file write", "file sync"].contains(&w["cause"].as_str().unwrap()),
                    "{kind}: {r}"
                );
            }
        }
        // What each server's commit waits for: MySQL's binlog (synced at each commit) and MariaDB 10.11's redo log.
        // MariaDB 11.8 writes its redo log to a memory map and its commits were seen to wait for nothing.
        let waits_for = |cause: &str| commits.iter().any(|r| r["cause"] == cause);
        match kind {
            "mysql-9.7" => assert!(waits_for("binlog group commit"), "{kind}: {commits:?}"),
            "mariadb-10.11" => assert!(waits_for("redo log"), "{kind}: {commits:?}"),
            _ => {}
        }
    }
}

/// `report`'s first finding names what the statements wait for most, and who holds it; its findings name each
/// connection holding what statements waited for, with what it held.
#[test]
fn the_reports_findings_name_each_cause_and_its_holder_on_every_server() {
    // The report traces the whole server: another test's scenario beside it would bring holders of its own.
    servers_alone();
    for (kind, db) in every_server() {
        let waits = start(&db, kind, "report");
        let dir = tempdir("causes-report");
        let page = dir.join("report.html");
        let pid = db.pid.to_string();
        run_ok(myprobe().args([
            "report",
            "-p",
            &pid,
            "-d",
            "4",
            "-o",
            page.to_str().unwrap(),
        ]));
        let scenario = waits.release();
        let html = std::fs::read_to_string(&page).unwrap();
        let section = html
            .split("<section id=\"findings\">")
            .nth(1)
            .and_then(|s| s.split("</section>").next())
            .unwrap_or_else(|| panic!("{kind}: no findings:\n{html}"));
        let findings: Vec<&str> = section
            .split("<li>")
            .skip(1)
            .filter_map(|f| f.split("</li>").next())
            .collect();
        let first = findings
            .first()
            .unwrap_or_else(|| panic!("{kind}: no finding:\n{section}"));
        // The first names the cause most of the time went to, and its holder.
        let (cause, holder) = scenario
            .holders
            .iter()
            .find(|(cause, _)| first.ends_with(&format!("({cause}).")))
            .unwrap_or_else(|| {
                panic!("{kind}: the first finding names no lock of the scenario: {first}")
            });
        assert!(
            first.contains(&format!("held by connection {holder} ")),
            "{kind}: {cause}: {first}"
        );
        // Each holder is named, with what it held.
        for (cause, holder) in &scenario.holders {
            assert!(
                findings
                    .iter()
                    .any(|f| f.starts_with(&format!("Connection {holder} "))
                        && f.contains(&format!("{cause} on "))),
                "{kind}: no finding names connection {holder} holding a {cause}:\n{findings:#?}"
            );
        }
    }
}
