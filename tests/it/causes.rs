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
struct Waits<'a> {
    holders: Vec<(Session, String)>,
    waiters: Vec<Session>,
    slow: Begun<'a>,
    scenario: Scenario,
}

/// Each test's own tables and lock (`tag`): tests run two at a time.
fn start<'a>(db: &'a TestDb, kind: &'static str, tag: &str) -> Waits<'a> {
    db.sql(&format!(
        "CREATE DATABASE IF NOT EXISTS causes_{tag}; \
         CREATE TABLE IF NOT EXISTS causes_{tag}.hot (id INT PRIMARY KEY, v INT) ENGINE=InnoDB; \
         INSERT IGNORE INTO causes_{tag}.hot VALUES (1, 0); \
         CREATE TABLE IF NOT EXISTS causes_{tag}.ddl (id INT PRIMARY KEY) ENGINE=InnoDB; \
         CREATE TABLE IF NOT EXISTS causes_{tag}.locked (id INT PRIMARY KEY) ENGINE=InnoDB"
    ));
    // Begun before any lock is taken: it creates a table.
    let slow = begin_slow_client(db, &format!("causes_{tag}"));
    let slow_client = slow.conn;
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
        slow,
        scenario: Scenario {
            kind,
            expected,
            sleeper: sleeper_id,
            slow_client,
            holders: holder_ids,
        },
    }
}

impl Waits<'_> {
    /// Ends the holders' transactions and locks, and waits for every waiter's answer.
    fn release(self) -> Scenario {
        for (mut s, sql) in self.holders {
            s.exec(&sql);
        }
        (self.slow.release)();
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
        let cold = begin_cold_read(&db, kind, "cold_before");
        let cpu = begin_cpu_heavy(&db);
        let waits = start(&db, kind, "before");
        std::thread::sleep(Duration::from_millis(300));
        let tracer = tracer(&db);
        // Seeded waits count from tracing's start: long (20 ms) after it, looked for every 250 ms; on a busy host
        // the first look can come late.
        std::thread::sleep(Duration::from_millis(1500));
        let (cold_id, cpu_id) = (cold.conn, cpu.conn);
        (cold.release)();
        (cpu.release)();
        let scenario = waits.release();
        let (out, err) = tracer.stop();
        let records = json_lines(&out);
        check(&scenario, &records, &err);
        let last = |conn: u64| {
            *mine(&records, conn).last().unwrap_or_else(|| {
                panic!("{kind}: no record of connection {conn}:\n{records:?}\n{err}")
            })
        };
        let r = last(cold_id);
        assert_eq!(r["cause"], "page read", "{kind}: {r}");
        assert_eq!(r["io"][0]["object"], "cold_before.pages", "{kind}: {r}");
        let r = last(cpu_id);
        assert!(
            ["CPU", "run queue"].contains(&r["cause"].as_str().unwrap()),
            "{kind}: {r}"
        );
        let begun = scenario
            .expected
            .iter()
            .map(|&(conn, _, what)| (conn, what));
        for (conn, what) in
            begun.chain([(cold_id, "a cold read"), (cpu_id, "a CPU-heavy statement")])
        {
            let r = last(conn);
            assert_eq!(r["before_tracing"], true, "{kind}: {what}: {r}");
        }
    }
}

/// A table of 6,000 rows of 7 KB (48 MB), `database`.pages, whose pages are not in the buffer pool: MySQL's test
/// server has a buffer pool of 16 MB, which the table's last pages pushed its first out of; MariaDB's has one far
/// larger, and its IMPORT TABLESPACE leaves the pages out of it (MySQL's reads them in). Each test has a database of
/// its own: a `CREATE DATABASE` waits for every lock in the database, even one held by another test's scenario.
fn cold_table(db: &TestDb, kind: &str, database: &str) {
    db.sql(&format!(
        "CREATE DATABASE IF NOT EXISTS {database}; \
         CREATE TABLE IF NOT EXISTS {database}.ten (n INT) ENGINE=InnoDB; DELETE FROM {database}.ten; \
         INSERT INTO {database}.ten VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9); \
         DROP TABLE IF EXISTS {database}.pages; \
         CREATE TABLE {database}.pages (id INT AUTO_INCREMENT PRIMARY KEY, b VARCHAR(7000)) ENGINE=InnoDB; \
         INSERT INTO {database}.pages (b) SELECT REPEAT('y', 7000) FROM {database}.ten a, {database}.ten b, \
         {database}.ten c, (SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL \
         SELECT 5 UNION ALL SELECT 6) d"
    ));
    if kind.starts_with("mysql") {
        return;
    }
    let data = db.dir.join("data").join(database);
    let kept = tempdir("cold-table");
    let copy = |from: &std::path::Path, to: &std::path::Path| {
        format!(
            "SYSTEM cp {0}/pages.ibd {0}/pages.cfg {1}/",
            from.display(),
            to.display()
        )
    };
    db.sql(&format!(
        "FLUSH TABLES {database}.pages FOR EXPORT; {}; UNLOCK TABLES; \
         ALTER TABLE {database}.pages DISCARD TABLESPACE; {}; ALTER TABLE {database}.pages IMPORT TABLESPACE",
        copy(&data, &kept),
        copy(&kept, &data)
    ));
}

/// Point reads three pages apart (too sparse for InnoDB's read-ahead) of `cold_table`'s: a page read from disk each.
fn cold_read_sql(database: &str) -> String {
    let ids: Vec<String> = (1..2000).step_by(6).map(|i| i.to_string()).collect();
    format!(
        "SELECT SUM(LENGTH(b)) FROM {database}.pages WHERE id IN ({})",
        ids.join(",")
    )
}

/// A statement begun, kept running until `release` lets it end, and answered.
struct Begun<'a> {
    conn: u64,
    release: Box<dyn FnOnce() + 'a>,
}

/// A cold read (`cold_table`'s) on a disk slowed for it to 20 reads a second; released, it reads at the disk's pace.
fn begin_cold_read<'a>(db: &'a TestDb, kind: &str, database: &str) -> Begun<'a> {
    cold_table(db, kind, database);
    let mut s = db.session();
    let conn = s.connection_id();
    let tid = s.host_tid(db, kind);
    let slow = SlowReads::start(db, tid, 20);
    s.send(&format!(
        "{}; SELECT 'causes-done'",
        cold_read_sql(database)
    ));
    Begun {
        conn,
        release: Box::new(move || {
            drop(slow);
            s.read_until("causes-done");
        }),
    }
}

/// A CPU-heavy statement, killed when released.
fn begin_cpu_heavy(db: &TestDb) -> Begun<'_> {
    // Its client goes on past the error KILL QUERY ends the statement with.
    let mut s = db.session_with(&["--force"]);
    let conn = s.connection_id();
    s.send("SELECT BENCHMARK(1000000000000, CRC32('causes')); SELECT 'causes-done'");
    Begun {
        conn,
        release: Box::new(move || {
            db.sql(&format!("KILL QUERY {conn}"));
            s.read_until("causes-done");
        }),
    }
}

/// A client that reads a large result only once released (the mariadb client with --quick writes each row as it
/// reads it, into a pipe nobody reads until then).
fn begin_slow_client<'a>(db: &'a TestDb, database: &str) -> Begun<'a> {
    db.sql(&format!(
        "CREATE DATABASE IF NOT EXISTS {database}; \
         CREATE TABLE IF NOT EXISTS {database}.ten (n INT) ENGINE=InnoDB; DELETE FROM {database}.ten; \
         INSERT INTO {database}.ten VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)"
    ));
    let mut s = db.session_with(&["--quick"]);
    let conn = s.connection_id();
    s.send(&format!(
        "SELECT a.n, REPEAT('x', 4000) FROM {database}.ten a, {database}.ten b, {database}.ten c, \
         {database}.ten d; SELECT 'causes-done'"
    ));
    Begun {
        conn,
        release: Box::new(move || s.read_until("causes-done")),
    }
}

/// Four connections committing one INSERT after another into `database`.log until released.
fn begin_commits<'a>(db: &'a TestDb, database: &str) -> Begun<'a> {
    db.sql(&format!(
        "CREATE DATABASE IF NOT EXISTS {database}; \
         CREATE TABLE IF NOT EXISTS {database}.log (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=InnoDB"
    ));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let committers: Vec<_> = (0..4)
        .map(|_| {
            let mut s = db.session();
            let stop = stop.clone();
            let insert = format!("INSERT INTO {database}.log (v) VALUES (1)");
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    s.exec(&insert);
                }
            })
        })
        .collect();
    Begun {
        conn: 0,
        release: Box::new(move || {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for c in committers {
                c.join().unwrap();
            }
        }),
    }
}

#[test]
fn page_reads_commits_and_their_files_are_named_on_every_server() {
    for (kind, db) in every_server() {
        cold_table(&db, kind, "cold");
        db.sql(
            "CREATE DATABASE IF NOT EXISTS commits; \
             CREATE TABLE IF NOT EXISTS commits.log (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=InnoDB",
        );
        let tracer = tracer(&db);
        let mut cold = db.session();
        let cold_id = cold.connection_id();
        cold.query_row(&cold_read_sql("cold"));
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
        // Named so where it took the longest, or among its waits where the tests beside it kept it from a CPU longer.
        let waits_for = |cause: &str| {
            commits.iter().any(|r| {
                r["cause"] == cause
                    || ["waits", "io"].iter().any(|part| {
                        r[part]
                            .as_array()
                            .is_some_and(|ws| ws.iter().any(|w| w["cause"] == cause))
                    })
            })
        };
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
    on_every_server_at_once(|kind, db| {
        let waits = start(db, kind, "report");
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
        let findings = report_findings(kind, &page);
        let first = &findings[0];
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
    });
}

/// `report`'s first finding names what the statements waited for most where that is no lock: the disk, the redo
/// log or binlog, the client, a CPU. Each scenario is begun before tracing and ends during it.
#[test]
fn the_reports_first_finding_names_reads_commits_the_client_and_the_cpu_on_every_server() {
    // The report traces the whole server: another test's statements would be in its findings.
    servers_alone();
    on_every_server_at_once(|kind, db| {
        // What each server's commits wait for (see page_reads_commits_and_their_files_are_named_on_every_server),
        // or a CPU where the other servers' scenarios and reports keep the host's busy.
        let commit = match kind {
            "mysql-9.7" => "binlog group commit",
            "mariadb-10.11" => "redo log",
            _ => "CPU",
        };
        let scenarios: [(&str, &[&str]); 4] = [
            ("a cold read", &["page read"]),
            ("commits", &[commit, "run queue"]),
            ("a slow client", &["client"]),
            ("a CPU-heavy statement", &["CPU", "run queue"]),
        ];
        for (what, causes) in scenarios {
            let begun = match what {
                "a cold read" => begin_cold_read(db, kind, "cold_report"),
                "commits" => begin_commits(db, "commits_report"),
                "a slow client" => begin_slow_client(db, "causes_report_client"),
                _ => begin_cpu_heavy(db),
            };
            std::thread::sleep(Duration::from_millis(300));
            let dir = tempdir("causes-report");
            let page = dir.join("report.html");
            let pid = db.pid.to_string();
            let args = [
                "report",
                "-p",
                &pid,
                "-d",
                "3",
                "-o",
                page.to_str().unwrap(),
            ];
            let report = Background::start(&args, "of 4 collectors");
            std::thread::sleep(Duration::from_millis(1500));
            (begun.release)();
            report.wait();
            let findings = report_findings(kind, &page);
            assert!(
                causes
                    .iter()
                    .any(|c| findings[0].ends_with(&format!("({c})."))),
                "{kind}: {what}: the first finding names none of {causes:?}:\n{findings:#?}"
            );
            // MariaDB's commits wait for InnoDB's group commit in a function without a name of its own in Debian's
            // stripped build: its site (`mariadbd+0x… in ha_commit_trans`) is said with what the statements' waits
            // there were named.
            if kind == "mariadb-10.11" && what == "commits" {
                assert!(
                    findings
                        .iter()
                        .any(|f| f.contains("waiting for the redo log to be written and synced")),
                    "{kind}: {what}: no wait site says what it waits for:\n{findings:#?}"
                );
            }
        }
    });
}
