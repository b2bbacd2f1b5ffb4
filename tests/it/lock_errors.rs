//! Deadlocks and lock wait timeouts in words, on every server: each statement rolled back is `deadlock` in
//! `queries`, with the lock and the other side where the server's latest deadlock was its own when read; each
//! timed out is `lock wait timeout`, with the lock and its holder; `report`'s first findings say so. And what a
//! holder idle in its transaction ran in it, newest first.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Child, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use serde_json::Value;

use crate::common::*;

/// A client that runs transactions updating two rows in one order, over and over, until stopped; `--force` goes on
/// after each deadlock.
struct Storm {
    child: Child,
    conn: u64,
    feeder: std::thread::JoinHandle<()>,
    /// Its errors, read as they come: a full pipe would stop the client.
    deadlocks: std::thread::JoinHandle<usize>,
}

impl Storm {
    fn start(db: &TestDb, first: u32, second: u32, stop: &Arc<AtomicBool>) -> Storm {
        let mut child = db
            .client()
            .args(["-N", "-B", "--force", "--unbuffered"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the mariadb client");
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "SELECT CONNECTION_ID();").unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let conn = line.trim().parse().expect("a connection id");
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let deadlocks = std::thread::spawn(move || {
            stderr
                .lines()
                .map_while(Result::ok)
                .filter(|l| l.starts_with("ERROR 1213"))
                .count()
        });
        let stop = stop.clone();
        let feeder = std::thread::spawn(move || {
            let round = format!(
                "BEGIN; UPDATE lock_errors.pair SET v = v + 1 WHERE id = {first}; \
                 UPDATE lock_errors.pair SET v = v + 1 WHERE id = {second}; COMMIT;\n"
            );
            // Thirty every 10 ms at most (3,000 transactions a second): the tests beside it keep a CPU.
            while !stop.load(Ordering::Relaxed) {
                if stdin.write_all(round.repeat(30).as_bytes()).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Storm {
            child,
            conn,
            feeder,
            deadlocks,
        }
    }

    /// Ends its input; the deadlocks its client was told of.
    fn deadlocks(mut self) -> usize {
        self.feeder.join().unwrap();
        self.child.wait().unwrap();
        self.deadlocks.join().unwrap()
    }
}

/// A statement that waits two seconds for a row another connection holds, and times out; its connection.
fn time_out(db: &TestDb) -> u64 {
    let out = db
        .client()
        .args(["-N", "-B", "-e"])
        .arg(
            "SET SESSION innodb_lock_wait_timeout = 2; SELECT CONNECTION_ID(); \
             UPDATE lock_errors.pair SET v = v + 1 WHERE id = 3",
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ERROR 1205"), "no lock wait timeout: {err}");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a connection id")
}

#[test]
fn deadlocks_and_lock_wait_timeouts_are_named_with_the_other_side_on_every_server() {
    for (kind, db) in every_server() {
        db.sql(
            "CREATE DATABASE IF NOT EXISTS lock_errors; \
             CREATE TABLE IF NOT EXISTS lock_errors.pair (id INT PRIMARY KEY, v INT) ENGINE=InnoDB; \
             REPLACE INTO lock_errors.pair VALUES (1, 0), (2, 0), (3, 0)",
        );
        let pid = db.pid.to_string();
        let tracer = every_statement(&db);
        let stop = Arc::new(AtomicBool::new(false));
        let storms = [
            Storm::start(&db, 1, 2, &stop),
            Storm::start(&db, 2, 1, &stop),
        ];
        let conns = storms.each_ref().map(|s| s.conn);
        // An idle transaction holds row 3; statements time out behind it, one after the other.
        let mut holder = db.session();
        let holder_id = holder.connection_id();
        holder.exec("BEGIN; UPDATE lock_errors.pair SET v = v + 1 WHERE id = 3");
        let timeouts = std::thread::scope(|s| {
            let timeouts = s.spawn(|| {
                let mut timed_out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    timed_out.push(time_out(&db));
                }
                timed_out
            });
            let dir = tempdir("lock-errors");
            let page = dir.join("report.html");
            run_ok(
                myprobe()
                    .args(["report", "-p", &pid, "-d", "4", "-o"])
                    .arg(&page),
            );
            std::thread::sleep(Duration::from_millis(500));
            stop.store(true, Ordering::Relaxed);
            let findings = report_findings(kind, &page);
            assert!(
                findings[0].contains("statements were rolled back in deadlocks: ")
                    && findings[0]
                        .contains("rolled back in deadlocks with update lock_errors.pair set"),
                "{kind}: the first finding is not the deadlocks': {findings:#?}"
            );
            assert!(
                findings[1]
                    .contains("statements timed out waiting for a lock (lock wait timeout): ")
                    && findings[1].contains(&format!("held by connection {holder_id} ")),
                "{kind}: the second finding is not the timeouts': {findings:#?}"
            );
            timeouts.join().unwrap()
        });
        holder.exec("COMMIT");
        let told: usize = storms.into_iter().map(Storm::deadlocks).sum();
        let (out, err) = tracer.stop();
        let records = json_lines(&out);
        check_deadlocks(kind, &records, conns, told, &err);
        check_timeouts(kind, &records, &timeouts, holder_id, dropped_events(&err));
    }
}

/// Every deadlock the clients were told of is a record named `deadlock`, and those whose deadlock the server
/// still kept when read name the other storm's connection, its statement and the lock.
fn check_deadlocks(kind: &str, records: &[Value], conns: [u64; 2], told: usize, err: &str) {
    let deadlocked: Vec<&Value> = records.iter().filter(|r| r["error"] == 1213).collect();
    assert!(told > 0, "{kind}: the storms made no deadlock");
    // On a busy host the reader can fall behind the ring buffer (two unthrottled storms made 25,000 statements a
    // second), and what it dropped is said: a deadlock is missing only where events were said dropped.
    let dropped = dropped_events(err);
    assert!(
        deadlocked.len() <= told && told - deadlocked.len() <= dropped,
        "{kind}: {} deadlocks of {told} recorded, {dropped} events said dropped: {err}",
        deadlocked.len()
    );
    let mut named = 0;
    for r in deadlocked {
        assert_eq!(r["cause"], "deadlock", "{kind}: {r}");
        let w = &r["waits"][0];
        assert_eq!(w["cause"], "deadlock", "{kind}: {r}");
        let Some(other) = w["holder"]["conn"].as_u64() else {
            continue;
        };
        named += 1;
        let victim = r["conn"].as_u64().unwrap();
        assert!(
            conns.contains(&victim) && conns.contains(&other) && victim != other,
            "{kind}: {r}"
        );
        assert_eq!(
            w["holder"]["statement"], "UPDATE lock_errors.pair SET v = v + ? WHERE id = ?",
            "{kind}: {r}"
        );
        assert_eq!(
            w["object"], "lock_errors.pair (PRIMARY, X,REC_NOT_GAP)",
            "{kind}: {r}"
        );
    }
    assert!(
        named > 0,
        "{kind}: no deadlock's other side was read of {told}"
    );
    eprintln!("{kind}: {named} of {told} deadlocks named with their other side");
}

/// Every statement that timed out is a record named `lock wait timeout`, with the lock and its holder where the
/// server's lock tables were read while it waited (long waits are looked for every 250 ms, then 50 ms, and the
/// tables read every 110 ms at most: on a busy host not during each wait).
fn check_timeouts(kind: &str, records: &[Value], timeouts: &[u64], holder: u64, dropped: usize) {
    assert!(!timeouts.is_empty(), "{kind}: no statement timed out");
    let mut named = 0;
    for &conn in timeouts {
        let Some(r) = records
            .iter()
            .find(|r| r["conn"] == conn && r["error"] == 1205)
        else {
            assert!(
                dropped > 0,
                "{kind}: no record of connection {conn}'s timeout, and no event was said dropped"
            );
            continue;
        };
        assert_eq!(r["cause"], "lock wait timeout", "{kind}: {r}");
        let w = &r["waits"][0];
        assert_eq!(w["cause"], "lock wait timeout", "{kind}: {r}");
        if w["holder"].is_null() {
            continue;
        }
        named += 1;
        assert_eq!(w["holder"]["conn"], holder, "{kind}: {r}");
        assert!(
            w["object"]
                .as_str()
                .is_some_and(|o| o.starts_with("lock_errors.pair (PRIMARY, X")),
            "{kind}: {r}"
        );
    }
    assert!(named > 0, "{kind}: no timeout's holder was named");
}

#[test]
fn what_an_idle_holder_s_transaction_ran_is_named_newest_first_on_every_server() {
    // The report traces the whole server: another test's statements could be its first finding.
    servers_alone();
    on_every_server_at_once(|kind, db| {
        db.sql(
            "CREATE DATABASE IF NOT EXISTS lock_errors; \
             CREATE TABLE IF NOT EXISTS lock_errors.held (id INT PRIMARY KEY, v INT) ENGINE=InnoDB; \
             CREATE TABLE IF NOT EXISTS lock_errors.audit (n INT) ENGINE=InnoDB; \
             REPLACE INTO lock_errors.held VALUES (1, 0)",
        );
        let tracer = every_statement(db);
        let dir = tempdir("held");
        let (report, page) = report_in_background(db, 5, &dir);
        // Its transaction runs two statements, then sits idle holding the row.
        let mut holder = db.session();
        let holder_id = holder.connection_id();
        holder.exec(
            "BEGIN; INSERT INTO lock_errors.audit VALUES (1); \
             UPDATE lock_errors.held SET v = v + 1 WHERE id = 1",
        );
        let mut waiter = db.session();
        let waiter_id = waiter.connection_id();
        waiter.send("UPDATE lock_errors.held SET v = v + 1 WHERE id = 1; SELECT 'waited'");
        db.wait_for_row_lock_wait(&format!("thread id {waiter_id},"));
        // Long enough for the holder to be read while it waits, on a busy host too (long waits are looked for every
        // 250 ms).
        std::thread::sleep(Duration::from_millis(2500));
        holder.exec("COMMIT");
        waiter.read_until("waited");
        report.wait();
        let (out, err) = tracer.stop();
        let records = json_lines(&out);
        let r = records
            .iter()
            .find(|r| {
                r["conn"] == waiter_id
                    && r["query"].as_str().is_some_and(|q| q.starts_with("UPDATE"))
            })
            .unwrap_or_else(|| panic!("{kind}: no record of the waiter:\n{err}"));
        let h = &r["waits"][0]["holder"];
        assert_eq!(
            (&r["cause"], &h["conn"]),
            (&Value::from("row lock"), &Value::from(holder_id)),
            "{kind}: {r}"
        );
        let ran = holder_ran(kind, r, h);
        assert_eq!(
            ran,
            [
                "SELECT ?",
                "UPDATE lock_errors.held SET v = v + ? WHERE id = ?",
                "INSERT INTO lock_errors.audit VALUES (?)",
                "BEGIN"
            ],
            "{kind}: {r}"
        );
        let findings = report_findings(kind, &page);
        assert!(
            findings[0].contains(&format!("held by connection {holder_id} "))
                && findings[0].contains("its transaction ran, newest first: SELECT ? (ended ")
                && findings[0].contains("INSERT INTO lock_errors.audit VALUES (?) (ended "),
            "{kind}: the first finding does not name the holder and what it ran: {findings:#?}"
        );
    });
}

#[test]
fn a_hot_row_s_short_waits_are_named_with_the_holder_that_let_them_go_on_every_server() {
    // The report traces the whole server: another test's statements could be its first finding.
    servers_alone();
    let listed = std::sync::atomic::AtomicUsize::new(0);
    on_every_server_at_once(|kind, db| {
        db.sql(
            "CREATE DATABASE IF NOT EXISTS lock_errors; \
             CREATE TABLE IF NOT EXISTS lock_errors.hot (id INT PRIMARY KEY, v INT) ENGINE=InnoDB; \
             REPLACE INTO lock_errors.hot VALUES (1, 0)",
        );
        let tracer = every_statement(db);
        let dir = tempdir("hot");
        let (report, page) = report_in_background(db, 3, &dir);
        // Three clients take the row in turn, each holding it 20 ms: each waits 20 to 40 ms for the others.
        let clients: Vec<u64> = std::thread::scope(|s| {
            let each: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(|| {
                        let mut c = db.session();
                        let id = c.connection_id();
                        for _ in 0..40 {
                            c.exec(
                                "BEGIN; UPDATE lock_errors.hot SET v = v + 1 WHERE id = 1; \
                                 SELECT SLEEP(0.02); COMMIT",
                            );
                        }
                        id
                    })
                })
                .collect();
            each.into_iter().map(|h| h.join().unwrap()).collect()
        });
        report.wait();
        let (out, err) = tracer.stop();
        let waited: Vec<Value> = json_lines(&out)
            .into_iter()
            .filter(|r| {
                r["query"] == "UPDATE lock_errors.hot SET v = v + ? WHERE id = ?"
                    && r["cause"] == "row lock"
            })
            .collect();
        assert!(
            waited.len() >= 20,
            "{kind}: {} row lock waits:\n{err}",
            waited.len()
        );
        let (named, by_tables) = check_hot_row_holders(kind, &waited, &clients);
        // Who wakes lock waits is followed from the first lock wait seen on (a tick later): from the first wait
        // named on, each is (but for one whose releaser's thread had run no statement yet).
        let pattern: String = waited
            .iter()
            .map(|r| match r["waits"][0]["holder"].is_null() {
                true => '.',
                false => 'N',
            })
            .collect();
        let followed = pattern.trim_start_matches('.');
        assert!(
            followed.len() * 2 >= pattern.len()
                && followed.matches('.').count() * 20 <= followed.len(),
            "{kind}: {named} of {} waits named: {pattern}",
            waited.len()
        );
        listed.fetch_add(by_tables, Ordering::Relaxed);
        eprintln!(
            "{kind}: {named} of {} waits named with their holder, {by_tables} of them by the server's tables",
            waited.len()
        );
        // The longest wait named: by who let it go, or by the server's tables with the row's table and index.
        let findings = report_findings(kind, &page);
        let first = &findings[0];
        assert!(
            (first.contains("waits for a row lock held by connection ")
                && first.contains(
                    ", which let it go; its transaction ran, newest first: SELECT SLEEP(?) (ended "
                ))
                || (first.contains("waits for a row lock on lock_errors.hot (PRIMARY, X")
                    && first.contains(" held by connection ")),
            "{kind}: the first finding does not name the holder and what it ran: {findings:#?}"
        );
    });
    // The tables are read every 110 ms at most while a wait has lasted 20 ms: a quarter to a third of the waits.
    assert!(
        listed.into_inner() > 0,
        "no wait was named with its table by the server's tables"
    );
}

/// Each of a hot row's waits named (by who let it go, with what its transaction ran; or by the server's tables, with
/// the row's table and index) names one of the other `clients`: how many are named, and how many by the tables.
fn check_hot_row_holders(kind: &str, waited: &[Value], clients: &[u64]) -> (usize, usize) {
    let (mut named, mut by_tables) = (0, 0);
    for r in waited {
        let w = &r["waits"][0];
        let h = &w["holder"];
        let Some(holder) = h["conn"].as_u64() else {
            continue;
        };
        named += 1;
        assert!(
            clients.contains(&holder) && r["conn"] != holder,
            "{kind}: {clients:?}: {r}"
        );
        // Listed by the server's tables, read while it waited: the table and index too.
        if h["released"] != true {
            assert!(
                w["object"]
                    .as_str()
                    .is_some_and(|o| o.starts_with("lock_errors.hot (PRIMARY, X")),
                "{kind}: {r}"
            );
            by_tables += 1;
            continue;
        }
        let ran = holder_ran(kind, r, h);
        assert_eq!(
            ran,
            [
                "SELECT SLEEP(?)",
                "UPDATE lock_errors.hot SET v = v + ? WHERE id = ?",
                "BEGIN"
            ],
            "{kind}: {r}"
        );
    }
    (named, by_tables)
}

/// What the holder `h` of record `r`'s wait ran, newest first.
fn holder_ran<'a>(kind: &str, r: &Value, h: &'a Value) -> Vec<&'a str> {
    h["ran"]
        .as_array()
        .unwrap_or_else(|| panic!("{kind}: no statements of the holder: {r}"))
        .iter()
        .map(|s| s["statement"].as_str().unwrap())
        .collect()
}
