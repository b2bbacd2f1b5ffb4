//! `myprobe queries` against the throwaway MariaDB: real clients, real statements, real BPF.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    time::Duration,
};

use crate::common::*;
use serde_json::{json, Value};

const READY: &str = "tracing the statements";

/// Every field of ARCHITECTURE.md's "Query records".
const FIELDS: [&str; 32] = [
    "ts",
    "tid",
    "conn",
    "user",
    "db",
    "command",
    "query",
    "fingerprint",
    "duration_us",
    "user_us",
    "sys_us",
    "runq_us",
    "lock_us",
    "read_us",
    "write_us",
    "sync_us",
    "net_us",
    "other_us",
    "sleep_us",
    "unseen_us",
    "lock_waits",
    "lock_max_us",
    "lock_addr",
    "lock_symbol",
    "lock_site",
    "cause",
    "read_bytes",
    "write_bytes",
    "syncs",
    "net_bytes",
    "syscalls",
    "error",
];

/// The parts of a record's time, which add up to its duration.
const PARTS: [&str; 11] = [
    "user_us",
    "sys_us",
    "runq_us",
    "lock_us",
    "read_us",
    "write_us",
    "sync_us",
    "net_us",
    "other_us",
    "sleep_us",
    "unseen_us",
];

/// Every statement followed (`--sample-every 1`): these tests count them; sampling has a test of its own.
fn trace(db: &TestDb, extra: &[&str]) -> Background {
    let pid = db.pid.to_string();
    let mut args = vec!["queries", "-p", &pid, "--json", "--sample-every", "1"];
    args.extend_from_slice(extra);
    Background::start(&args, READY)
}

/// The records of 4 s of tracing (with `extra` options) with 3 s of sysbench, and stderr.
fn records_under_load(db: &TestDb, extra: &[&str]) -> (Vec<Value>, String) {
    let mut args = vec!["-d", "4"];
    args.extend_from_slice(extra);
    let tracer = trace(db, &args);
    db.load(3).wait();
    let (out, err) = tracer.wait();
    (without_lost(json_lines(&out)), err)
}

/// The records, without the last line of what was lost, if anything was (a busy host's ring buffer may fill).
fn without_lost(lines: Vec<Value>) -> Vec<Value> {
    lines
        .into_iter()
        .filter(|r| r.get("lost").is_none())
        .collect()
}

fn of_thread(records: &[Value], tid: u32) -> Vec<&Value> {
    records.iter().filter(|r| r["tid"] == tid).collect()
}

fn query_is<'a>(records: &[&'a Value], query: &str) -> Vec<&'a Value> {
    records
        .iter()
        .copied()
        .filter(|r| r["query"] == query)
        .collect()
}

fn num(r: &Value, field: &str) -> u64 {
    r[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} is not a number in {r}"))
}

#[test]
fn sleep_is_one_record_of_blocked_time() {
    let db = testdb();
    let mut s = db.session();
    let tid = s.server_tid();
    let tracer = trace(&db, &[]);
    assert_eq!(s.query_row("SELECT SLEEP(0.3)"), "0");
    let (out, err) = tracer.stop();
    let all = json_lines(&out);
    let mine = of_thread(&all, tid);
    let sleeps = query_is(&mine, "SELECT SLEEP(?)");
    assert_eq!(
        sleeps.len(),
        1,
        "expected one SLEEP record of thread {tid}: {mine:?}\nstderr:\n{err}"
    );
    let r = sleeps[0];
    // At least its 0.3 s; how much more is the host's.
    let d = num(r, "duration_us");
    assert!(
        (290_000..=30_000_000).contains(&d),
        "SLEEP(0.3) took {d} us: {r}"
    );
    let on_cpu = num(r, "user_us") + num(r, "sys_us");
    assert!(on_cpu * 10 < d, "SLEEP should be blocked, not on CPU: {r}");
    assert_eq!(r["command"], "Query");
    assert_eq!(r["fingerprint"], "select sleep(?)");
    assert!(r["error"].is_null(), "{r}");
}

#[test]
fn statement_still_running_at_the_end_is_reported_in_flight() {
    let db = testdb();
    let mut s = db.session();
    let tid = s.server_tid();
    let conn = s.connection_id();
    let tracer = trace(&db, &[]);
    s.send("SELECT SLEEP(60)");
    db.wait_for_state(tid, "User sleep");
    std::thread::sleep(Duration::from_millis(800));
    let (out, err) = tracer.stop();
    // Interrupted (the client, in batch mode, then exits on the error).
    db.sql(&format!("KILL QUERY {conn}"));
    let all = json_lines(&out);
    let sleeps = query_is(&of_thread(&all, tid), "SELECT SLEEP(?)");
    assert_eq!(sleeps.len(), 1, "{all:?}\nstderr:\n{err}");
    let r = sleeps[0];
    assert_eq!(r["in_flight"], true, "{r}");
    let d = num(r, "duration_us");
    assert!((800_000..60_000_000).contains(&d), "{r}");
    assert!(r["error"].is_null(), "{r}");
}

/// A statement (`wait`, answered by the line `answer`; `shown` normalized) that waits half a second behind one
/// session's `hold`, until its `release`, traced (with `options`): its record.
fn record_of_a_wait(
    db: &TestDb,
    [hold, wait, answer, release, shown]: [&str; 5],
    options: &[&str],
) -> Value {
    let mut holder = db.session();
    let mut waiter = db.session();
    let tid = waiter.server_tid();
    let connection = waiter.connection_id();
    let tracer = trace(db, options);
    holder.exec(hold);
    waiter.send(wait);
    // Half a second from the moment it blocks, however long it took to get there.
    let mdl_wait = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE TID = {tid} \
         AND STATE = 'Waiting for table metadata lock'"
    );
    let row_lock_wait = format!("thread id {connection},");
    db.wait_until("a lock wait", || {
        db.sql(&mdl_wait).trim() != "0" || db.waits_for_row_lock(&row_lock_wait)
    });
    std::thread::sleep(Duration::from_millis(500));
    holder.exec(release);
    assert_eq!(waiter.read_line(), answer);
    let (out, err) = tracer.stop();
    let all = json_lines(&out);
    let mine = of_thread(&all, tid);
    let records = query_is(&mine, shown);
    assert_eq!(
        records.len(),
        1,
        "expected one record of {shown}: {mine:?}\nstderr:\n{err}"
    );
    records[0].clone()
}

#[test]
fn row_lock_wait_is_lock_time_with_an_address() {
    let db = testdb();
    db.sql("CREATE TABLE IF NOT EXISTS sbtest.locktest (id INT PRIMARY KEY, v INT) ENGINE=InnoDB; REPLACE INTO sbtest.locktest VALUES (1, 0)");
    let r = &record_of_a_wait(
        &db,
        [
            "BEGIN; SELECT v FROM sbtest.locktest WHERE id = 1 FOR UPDATE",
            "UPDATE sbtest.locktest SET v = v + 1 WHERE id = 1; SELECT 'updated'",
            "updated",
            "COMMIT",
            "UPDATE sbtest.locktest SET v = v + ? WHERE id = ?",
        ],
        &[],
    );
    assert!(num(r, "duration_us") >= 450_000, "{r}");
    assert!(
        num(r, "lock_us") >= 400_000,
        "the row lock wait is not lock time: {r}"
    );
    assert!(
        num(r, "lock_waits") >= 1 && num(r, "lock_max_us") >= 400_000,
        "{r}"
    );
    let addr = r["lock_addr"]
        .as_str()
        .unwrap_or_else(|| panic!("no lock address: {r}"));
    assert!(
        addr.starts_with("0x") && u64::from_str_radix(&addr[2..], 16).is_ok_and(|a| a != 0),
        "{r}"
    );
    assert!(
        r["lock_symbol"].as_str().is_some_and(|s| !s.is_empty()),
        "the lock has no name: {r}"
    );
    // Where: InnoDB's lock_wait, or without its symbol the unnamed function in the handler call that read the
    // row; never a metadata lock's or the redo log's site.
    let site = r["lock_site"].as_str().unwrap_or_default();
    assert!(is_row_lock_site(site), "not a row lock's site: {r}");
    assert!(!is_mdl_site(site) && !is_redo_site(site), "{r}");
}

fn is_row_lock_site(site: &str) -> bool {
    site == "lock_wait" || site.contains(" in handler::") || site.contains(" in ha_innobase::")
}

fn is_mdl_site(site: &str) -> bool {
    site == "MDL_context::acquire_lock"
}

fn is_redo_site(site: &str) -> bool {
    // MariaDB 10.6 and later: the reply waits in net_real_write until the redo log is durable.
    [
        "group_commit_lock::",
        "log_write_up_to",
        "ha_commit_trans",
        "net_real_write",
    ]
    .iter()
    .any(|s| site.contains(s))
}

#[test]
fn metadata_lock_wait_is_named_by_its_site() {
    let db = testdb();
    db.sql("CREATE TABLE IF NOT EXISTS sbtest.mdltest (id INT PRIMARY KEY) ENGINE=InnoDB");
    let statements = [
        "LOCK TABLES sbtest.mdltest WRITE",
        "SELECT COUNT(*) FROM sbtest.mdltest",
        "0",
        "UNLOCK TABLES",
        "SELECT COUNT(*) FROM sbtest.mdltest",
    ];
    let r = &record_of_a_wait(&db, statements, &[]);
    assert!(num(r, "lock_max_us") >= 400_000, "{r}");
    let site = r["lock_site"].as_str().unwrap_or_default();
    assert!(is_mdl_site(site), "not the metadata lock's site: {r}");
    assert!(!is_row_lock_site(site) && !is_redo_site(site), "{r}");
    // Without wait sites, the same wait, and no site.
    let r = &record_of_a_wait(&db, statements, &["--no-wait-sites"]);
    assert!(num(r, "lock_max_us") >= 400_000, "{r}");
    assert!(r["lock_site"].is_null(), "{r}");
}

#[test]
fn a_pile_up_behind_a_metadata_lock_that_began_before_tracing_is_listed_on_every_server() {
    // The statements stuck now are those that began before anyone looked: read from the server's memory when
    // tracing begins, each is shown with its text, its connection, its wait and its time from its real start.
    let servers = crate::common::every_server();
    for (kind, db) in &servers {
        db.sql("CREATE TABLE IF NOT EXISTS sbtest.mdlpile (id INT PRIMARY KEY) ENGINE=InnoDB");
        let mut holder = db.session_in(Some("sbtest"));
        holder.exec("LOCK TABLES mdlpile WRITE");
        let sent = std::time::Instant::now();
        let waiters: Vec<(Session, u64, String)> = (0..4)
            .map(|i| {
                let mut s = db.session_in(Some("sbtest"));
                let id = s.connection_id();
                let text = format!("SELECT COUNT(*), 'pile-{i}' FROM mdlpile");
                s.send(&text);
                (s, id, text)
            })
            .collect();
        let count = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT COUNT(*), ''pile-%' \
                     AND STATE = 'Waiting for table metadata lock'";
        db.wait_until(count, || db.sql(count).trim() == "4");
        let waiting_since = std::time::Instant::now();
        let tracer = trace(db, &["-d", "5", "--raw-sql"]);
        let (out, err) = tracer.wait();
        let (least, most) = (waiting_since.elapsed(), sent.elapsed());
        holder.exec("UNLOCK TABLES");
        let records = json_lines(&out);
        for (_, id, text) in &waiters {
            let mine: Vec<&Value> = records.iter().filter(|r| r["conn"] == *id).collect();
            assert_eq!(mine.len(), 1, "{kind}: connection {id}: {records:?}\n{err}");
            let r = mine[0];
            assert_eq!(r["query"], text.as_str(), "{kind}: {r}");
            assert_eq!(
                (&r["user"], &r["db"], &r["in_flight"], &r["before_tracing"]),
                (&json!("root"), &json!("sbtest"), &json!(true), &json!(true)),
                "{kind}: {r}"
            );
            // From its real start: longer than it was seen waiting (less the time the tracer took to exit),
            // shorter than since it was sent.
            let d = Duration::from_micros(num(r, "duration_us"));
            assert!(
                d + Duration::from_millis(1500) >= least && d <= most,
                "{kind}: {d:?} not within {least:?}..{most:?}: {r}"
            );
            // The time before tracing is not seen; the time since is its wait for the lock, named.
            assert!(
                num(r, "unseen_us") > 0 && num(r, "lock_us") >= 4_000_000,
                "{kind}: {r}"
            );
            let site = r["lock_site"].as_str().unwrap_or_default();
            assert!(
                is_mdl_site(site),
                "{kind}: not the metadata lock's site: {r}"
            );
        }
        for (mut s, _, _) in waiters {
            s.read_line();
        }
    }
}

#[test]
fn commits_waiting_for_the_redo_log_are_named_by_their_site() {
    // Concurrent commits with a durable log: one thread writes and syncs the redo log for the group, the others
    // wait for it.
    let db = testdb();
    db.sql("SET GLOBAL innodb_flush_log_at_trx_commit = 1");
    let (all, err) = records_under_load(&db, &[]);
    let mut sites: std::collections::HashMap<&str, u64> = Default::default();
    for r in all.iter().filter(|r| r["query"] == "COMMIT") {
        if let Some(site) = r["lock_site"].as_str() {
            *sites.entry(site).or_default() += num(r, "lock_max_us");
        }
    }
    let top = sites
        .iter()
        .max_by_key(|(_, us)| **us)
        .map(|(s, _)| *s)
        .unwrap_or_else(|| panic!("no COMMIT waited: {sites:?}\nstderr:\n{err}"));
    assert!(is_redo_site(top), "COMMIT waits most in {top}: {sites:?}");
    assert!(!is_row_lock_site(top) && !is_mdl_site(top), "{sites:?}");
}

#[test]
fn commit_with_durable_log_has_sync_time() {
    crate::common::servers_alone();
    let db = testdb();
    db.sql("SET GLOBAL innodb_flush_log_at_trx_commit = 1; CREATE TABLE IF NOT EXISTS sbtest.synctest (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=InnoDB");
    let mut s = db.session();
    let tid = s.server_tid();
    let tracer = trace(&db, &[]);
    s.exec("BEGIN; INSERT INTO sbtest.synctest (v) VALUES (1); COMMIT");
    let (out, err) = tracer.stop();
    let all = json_lines(&out);
    let mine = of_thread(&all, tid);
    let commits = query_is(&mine, "COMMIT");
    assert_eq!(
        commits.len(),
        1,
        "expected one COMMIT record: {mine:?}\nstderr:\n{err}"
    );
    let r = commits[0];
    assert!(
        num(r, "syncs") > 0 && num(r, "sync_us") > 0,
        "COMMIT with innodb_flush_log_at_trx_commit=1 did not sync: {r}"
    );
    assert_eq!(
        query_is(&mine, "INSERT INTO sbtest.synctest (v) VALUES (?)").len(),
        1,
        "{mine:?}"
    );
}

#[test]
fn user_database_and_connection_id() {
    let db = testdb();
    let mut before = db.session();
    let before_tid = before.server_tid();
    let tracer = trace(&db, &[]);
    // Opened while tracing: the handshake is seen, then `USE` (COM_INIT_DB) changes the database.
    let mut after = db.session();
    let conn_id: u64 = after.query_row("SELECT CONNECTION_ID()").parse().unwrap();
    after.exec("USE sbtest");
    let after_tid = after.server_tid();
    assert_eq!(
        after.query_row("SELECT COUNT(*) FROM sbtest1 WHERE id <= 10"),
        "10"
    );
    // Connected with a database in the handshake.
    let mut with_db = db.session_in(Some("mysql"));
    let with_db_tid = with_db.server_tid();
    assert_eq!(with_db.query_row("SELECT 2"), "2");
    assert_eq!(before.query_row("SELECT 3"), "3");
    let (out, err) = tracer.stop();
    let all = json_lines(&out);

    let count = query_is(
        &of_thread(&all, after_tid),
        "SELECT COUNT(*) FROM sbtest1 WHERE id <= ?",
    )
    .first()
    .copied()
    .cloned()
    .unwrap_or_else(|| panic!("no record of the new connection's SELECT\nstderr:\n{err}"));
    assert_eq!(count["user"], "root", "{count}");
    assert_eq!(count["db"], "sbtest", "{count}");
    assert_eq!(count["conn"], conn_id, "{count}");
    let init_db: Vec<_> = of_thread(&all, after_tid)
        .into_iter()
        .filter(|r| r["command"] == "Init DB")
        .collect();
    assert_eq!(init_db.len(), 1, "the USE of the new connection: {all:?}");

    let two = query_is(&of_thread(&all, with_db_tid), "SELECT ?");
    assert_eq!(two.len(), 1, "{all:?}");
    assert_eq!(
        (&two[0]["user"], &two[0]["db"]),
        (&Value::from("root"), &Value::from("mysql")),
        "{}",
        two[0]
    );

    // Opened before tracing: unknown is fine, wrong is not.
    let three = query_is(&of_thread(&all, before_tid), "SELECT ?");
    assert_eq!(three.len(), 1, "{all:?}");
    let r = three[0];
    assert!(r["user"].is_null() || r["user"] == "root", "{r}");
    assert!(r["db"].is_null(), "the old connection has no database: {r}");
}

/// The C fixture that prepares `SELECT id FROM sbtest1 WHERE id = ?` and executes it on request.
struct PreparedClient {
    child: std::process::Child,
    stdout: BufReader<std::process::ChildStdout>,
    /// The server's thread of its connection: the records of its executions (other tests, and tracers' own
    /// statements, run on the same server).
    tid: u64,
    /// Its connection: once it has closed, the thread serves others' (the server's thread cache).
    conn: u64,
}

impl PreparedClient {
    fn start(db: &TestDb) -> Self {
        let dir = tempdir("prepared");
        let exe = compile_client_fixture(&dir, "prepared", "queries/prepared.c");
        let mut child = Command::new(&exe)
            .arg(&db.socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let (tid, conn) = line
            .trim()
            .strip_prefix("thread ")
            .and_then(|t| t.split_once(' '))
            .and_then(|(tid, conn)| Some((tid.parse().ok()?, conn.parse().ok()?)))
            .unwrap_or_else(|| panic!("the fixture said `{line}`"));
        PreparedClient {
            child,
            stdout,
            tid,
            conn,
        }
    }

    /// Its records among `records`: of its thread, and of its connection where the record names one (a
    /// connection opened before tracing may not be named).
    fn records<'a>(
        &self,
        records: &'a [serde_json::Value],
        command: &str,
    ) -> Vec<&'a serde_json::Value> {
        records
            .iter()
            .filter(|r| r["command"] == command && r["tid"] == self.tid)
            .filter(|r| r["conn"].is_null() || r["conn"] == self.conn)
            .collect()
    }

    /// Its executions among `records`.
    fn executions<'a>(&self, records: &'a [serde_json::Value]) -> Vec<&'a serde_json::Value> {
        self.records(records, "Execute")
    }

    fn execute(&mut self, times: u32) {
        writeln!(self.child.stdin.as_mut().unwrap(), "{times}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), format!("done {times}"));
    }

    fn close(&mut self) {
        drop(self.child.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

const PREPARED_TEXT: &str = "SELECT id FROM sbtest1 WHERE id = ?";

#[test]
fn prepared_statement_executed_100_times() {
    let db = testdb();
    let tracer = trace(&db, &[]);
    let mut client = PreparedClient::start(&db);
    client.execute(100);
    client.close();
    let (out, err) = tracer.stop();
    let all = json_lines(&out);
    let executes = client.executions(&all);
    assert_eq!(
        executes.len(),
        100,
        "expected 100 Execute records\nstderr:\n{err}"
    );
    for r in &executes {
        assert_eq!(r["query"], PREPARED_TEXT, "{r}");
        assert_eq!(r["db"], "sbtest", "{r}");
        assert!(r["error"].is_null(), "{r}");
    }
    let prepares = client.records(&all, "Prepare");
    assert_eq!(prepares.len(), 1, "{prepares:?}");
    assert_eq!(prepares[0]["query"], PREPARED_TEXT);
}

#[test]
fn statement_prepared_before_tracing_is_labelled_by_id() {
    let db = testdb();
    let mut client = PreparedClient::start(&db);
    client.execute(1);
    // Without SQL to the server, its text stays unknown.
    let tracer = trace(&db, &["--no-sql"]);
    client.execute(3);
    client.close();
    let (out, err) = tracer.stop();
    let all = json_lines(&out);
    let executes = client.executions(&all);
    assert_eq!(executes.len(), 3, "{all:?}\nstderr:\n{err}");
    // Statement ids are the server's: one id, one statement.
    let fingerprint = executes[0]["fingerprint"].as_str().unwrap();
    assert!(
        fingerprint.starts_with("statement prepared before tracing #"),
        "{}",
        executes[0]
    );
    for r in &executes {
        assert!(
            r["query"].is_null(),
            "the text is unknown, not made up: {r}"
        );
        assert_eq!(r["fingerprint"], fingerprint, "{r}");
    }
    assert!(
        err.contains(" executions of statements prepared before tracing"),
        "{err}"
    );
}

#[test]
fn statement_prepared_before_tracing_gets_its_text_at_its_executions() {
    let db = testdb();
    let mut client = PreparedClient::start(&db);
    client.execute(1);
    let tracer = Background::start(
        &["queries", "-p", &db.pid.to_string(), "--json"],
        "myprobe: tracing the statements",
    );
    // Its first execution traced brings the probe, whose offset is found on myprobe's own statements; the
    // executions that follow carry the text, which also names those before.
    client.execute(100);
    tracer.wait_for_stderr("read at their executions");
    client.execute(100);
    client.close();
    let (out, err) = tracer.stop();
    let all = json_lines(&out);
    let executes = client.executions(&all);
    assert_eq!(executes.len(), 200, "stderr:\n{err}");
    // The text is the statement's own, read from the server's statement object (performance_schema is off).
    for r in &executes {
        assert_eq!(
            r["query"], "SELECT id FROM sbtest1 WHERE id = ?",
            "{r}\nstderr:\n{err}"
        );
    }
    assert!(
        err.contains("statements prepared before tracing named at their executions"),
        "{err}"
    );
    // The tracer's own statements are not the server's.
    assert!(
        !all.iter().any(|r| r["query"]
            .as_str()
            .is_some_and(|q| q.contains("myprobe_calibration"))),
        "myprobe's own statements were reported"
    );
}

#[test]
fn sysbench_connected_before_tracing_has_its_texts() {
    // A connection pool: sysbench prepares its statements before tracing begins. The server to itself: another
    // test's load would pass for this one's, and one that ends while traced leaves its last executions unnamed,
    // rightly (a statement of unknown text is named at its next execution, and has none).
    crate::common::servers_alone();
    let db = testdb();
    let mut load = db.load(600);
    db.wait_for("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'sbtest' AND COMMAND = 'Execute'");
    // Its records, of the connections there before tracing and still there after. By connection id where the
    // record has one (a thread serves another connection once one closes), else by thread (connected before
    // tracing, its id may not be read in time).
    let sysbench = || -> Vec<(u64, u64)> {
        db.sql("SELECT ID, TID FROM information_schema.PROCESSLIST WHERE USER = 'sbtest'")
            .lines()
            .filter_map(|l| {
                let (id, tid) = l.trim().split_once('\t')?;
                Some((id.parse().ok()?, tid.parse().ok()?))
            })
            .collect()
    };
    let before = sysbench();
    let tracer = trace(&db, &["-d", "5"]);
    let (out, err) = tracer.wait();
    let sysbench: Vec<(u64, u64)> = sysbench()
        .into_iter()
        .filter(|c| before.contains(c))
        .collect();
    assert!(load.running(), "the load ended before tracing did");
    drop(load);
    let all = json_lines(&out);
    let records: Vec<_> = all
        .iter()
        .filter(|r| r.get("duration_us").is_some())
        .filter(|r| {
            sysbench.iter().any(|&(id, tid)| match r["conn"].as_u64() {
                Some(conn) => conn == id,
                None => r["tid"] == tid,
            })
        })
        .collect();
    let with_text = records.iter().filter(|r| !r["query"].is_null()).count();
    assert!(
        records.len() > 1000,
        "{} records of sysbench's connections {sysbench:?} (of {} records)\nstderr:\n{err}",
        records.len(),
        all.len()
    );
    // Read at the executions themselves (performance_schema is off): the probe is attached at the first execution
    // of a statement of unknown text, and its offset calibrated on myprobe's own statements, which on a busy host
    // takes a while. From the first execution named on, all have their text but those whose execution had begun
    // when the probe was given the offset (one per thread at most). An execution, not any record: sysbench's
    // BEGIN and COMMIT are text queries, named from the first.
    let mut by_start: Vec<&&Value> = records.iter().collect();
    by_start.sort_by(|a, b| a["ts"].as_str().cmp(&b["ts"].as_str()));
    let named_from = by_start
        .iter()
        .position(|r| r["command"] == "Execute" && !r["query"].is_null())
        .unwrap_or(by_start.len());
    let since = &by_start[named_from..];
    let unnamed_since = since.iter().filter(|r| r["query"].is_null()).count();
    assert!(
        with_text * 2 >= records.len()
            && (unnamed_since * 1000 <= since.len() || unnamed_since <= 2 * sysbench.len()),
        "{with_text} of {} records have their text; {unnamed_since} of the {} from the first named execution on \
         (at {}) have none\nstderr:\n{err}",
        records.len(),
        since.len(),
        since.first().map_or("none", |r| r["ts"].as_str().unwrap_or("?"))
    );
    assert!(err.contains("read at their executions"), "stderr:\n{err}");
    // Never a wrong one: each is one of the statements sysbench prepared.
    for r in records.iter().filter(|r| r["command"] == "Execute") {
        let query = r["query"].as_str().unwrap_or("");
        assert!(
            query.is_empty() || query.contains("sbtest") || ["BEGIN", "COMMIT"].contains(&query),
            "{r}\nstderr:\n{err}"
        );
    }
}

#[test]
fn failed_statement_has_its_error_code_and_literals_stay_hidden() {
    let db = testdb();
    for raw in [false, true] {
        let tracer = trace(&db, if raw { &["--raw-sql"] } else { &[] });
        let out = db
            .client()
            .args([
                "sbtest",
                "-e",
                "SELECT * FROM no_such_table WHERE c = 'secret-literal-42'",
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let (out, err) = tracer.stop();
        let all = json_lines(&out);
        // Its own: other tests' statements fail on the same server.
        let failed: Vec<_> = all
            .iter()
            .filter(|r| {
                !r["error"].is_null()
                    && r["query"]
                        .as_str()
                        .is_some_and(|q| q.contains("no_such_table"))
            })
            .collect();
        assert_eq!(
            failed.len(),
            1,
            "expected one failed statement: {all:?}\nstderr:\n{err}"
        );
        assert_eq!(failed[0]["error"], 1146, "{}", failed[0]);
        let query = failed[0]["query"].as_str().unwrap();
        if raw {
            assert_eq!(
                query,
                "SELECT * FROM no_such_table WHERE c = 'secret-literal-42'"
            );
        } else {
            assert_eq!(query, "SELECT * FROM no_such_table WHERE c = ?");
            assert!(
                !out.contains("secret-literal"),
                "a literal leaked without --raw-sql"
            );
        }
    }
}

#[test]
fn json_records_under_load_have_every_field() {
    // Every execution is to carry its text: no other test's load, prepared before this trace began, is seen.
    crate::common::servers_alone();
    let db = testdb();
    let (all, err) = records_under_load(&db, &[]);
    assert!(
        all.len() > 200,
        "only {} records under sysbench load\nstderr:\n{err}",
        all.len()
    );
    for r in &all {
        let obj = r.as_object().unwrap();
        for f in FIELDS {
            assert!(obj.contains_key(f), "record lacks {f}: {r}");
        }
        // Method R: the parts are the duration, partitioned (rounded to microseconds so that they add up).
        let parts: u64 = PARTS.iter().map(|p| num(r, p)).sum();
        assert_eq!(parts, num(r, "duration_us"), "parts do not add up: {r}");
        assert!(num(r, "unseen_us") == 0 || r["pipelined"] == true, "{r}");
        // Time on a CPU inside syscalls is user time unless --syscall-cpu splits it out.
        assert_eq!(num(r, "sys_us"), 0, "{r}");
    }
    // sysbench uses prepared statements: their executions carry the prepared text.
    let executes = all.iter().filter(|r| r["command"] == "Execute").count();
    let with_text = all
        .iter()
        .filter(|r| {
            r["command"] == "Execute"
                && r["query"]
                    .as_str()
                    .is_some_and(|q| q.contains("sbtest") || q == "BEGIN" || q == "COMMIT")
        })
        .count();
    assert!(
        executes > 100 && with_text * 100 >= executes * 99,
        "{with_text} of {executes} executions have their text"
    );
    assert!(
        all.iter()
            .any(|r| r["user"] == "sbtest" && r["db"] == "sbtest"),
        "no record with sysbench's user and database"
    );
    assert!(err.contains("statements traced"), "{err}");
}

#[test]
fn without_socket_tracepoints_syscall_exits_follow_the_same_statements() {
    // Kernels before 6.3 have no sock_recv_length/sock_send_length: the protocol is followed at every syscall
    // exit instead, which also counts each statement's syscalls (never counted at the socket tracepoints).
    // Before 5.17, the compat build does the same with hash maps by thread for task storage.
    let db = testdb();
    let pid = db.pid.to_string();
    for (disabled, syscalls_counted) in [
        ("socket_tracepoints", true),
        ("", false),
        ("bpf_loop,socket_tracepoints", true),
    ] {
        let tracer = Background::start_with_env(
            &["queries", "-p", &pid, "--json", "-d", "4"],
            &[("MYPROBE_DISABLE", disabled)],
            READY,
        );
        db.load(3).wait();
        let (out, err) = tracer.wait();
        let all = without_lost(json_lines(&out));
        let commits = all.iter().filter(|r| r["query"] == "COMMIT").count();
        assert!(
            all.len() > 200 && commits > 10,
            "MYPROBE_DISABLE={disabled}: {} records, {commits} commits\nstderr:\n{err}",
            all.len()
        );
        for r in &all {
            let parts: u64 = PARTS.iter().map(|p| num(r, p)).sum();
            assert_eq!(parts, num(r, "duration_us"), "parts do not add up: {r}");
        }
        let replied = all.iter().filter(|r| num(r, "net_bytes") > 0).count();
        assert!(
            replied * 2 > all.len(),
            "{replied} of {} records replied",
            all.len()
        );
        let with_syscalls = all.iter().filter(|r| num(r, "syscalls") > 0).count();
        assert_eq!(
            with_syscalls * 2 > all.len(),
            syscalls_counted,
            "MYPROBE_DISABLE={disabled}: {with_syscalls} of {} records count syscalls",
            all.len()
        );
    }
}

#[test]
fn syscall_cpu_splits_the_time_on_a_cpu_in_syscalls_out_of_user() {
    let db = testdb();
    let (all, err) = records_under_load(&db, &["--syscall-cpu"]);
    assert!(
        all.len() > 200,
        "only {} records\nstderr:\n{err}",
        all.len()
    );
    for r in &all {
        let parts: u64 = PARTS.iter().map(|p| num(r, p)).sum();
        assert_eq!(parts, num(r, "duration_us"), "parts do not add up: {r}");
    }
    // Commits wake the threads waiting for the group commit (futex wakes: on a CPU, in no waiting class).
    let sys: u64 = all.iter().map(|r| num(r, "sys_us")).sum();
    assert!(
        sys > 0,
        "no sys time in {} records\nstderr:\n{err}",
        all.len()
    );
}

#[test]
fn a_busy_server_is_sampled_and_its_digest_scaled_to_the_servers_count() {
    crate::common::servers_alone();
    // `--sample-every auto` (the default) follows every statement while that costs within --max-cpu: sysbench
    // runs well over the 2,300 statements a second that half a percent of a CPU allows here, so they are followed
    // one second in a few, and the digest's counts scaled up by the time traced over the time followed.
    let db = testdb();
    let pid = db.pid.to_string();
    let load = db.running_load();
    let tracer = Background::start(
        &[
            "queries",
            "-p",
            &pid,
            "-d",
            "8",
            "--summary",
            "--json",
            "--max-cpu",
            "0.5",
        ],
        READY,
    );
    let before = db.questions();
    let (out, err) = tracer.wait();
    let asked = db.questions() - before;
    load.finish();
    let rows = json_lines(&out);
    assert!(
        err.contains("statements a second: following them one second in"),
        "not sampled ({asked} statements in about 8 s)\nstderr:\n{err}"
    );
    let scale = rows.first().map(|r| r["scaled_by"].as_f64().unwrap_or(0.0));
    assert!(
        scale.is_some_and(|s| s > 1.5) && rows.iter().all(|r| r["scaled_by"].as_f64() == scale),
        "digest rows not scaled: {rows:?}\nstderr:\n{err}"
    );
    // Questions also counts what ran while myprobe started and ended, around its 8 s; and the seconds followed
    // run slower than the others, by the tracing's own cost, the more so on a busy host of two CPUs (0.58 there,
    // with a soak running beside).
    let counted: u64 = rows.iter().map(|r| num(r, "count")).sum();
    let ratio = counted as f64 / asked as f64;
    assert!(
        (0.5..1.3).contains(&ratio),
        "{counted} statements estimated, the server was sent {asked}\nstderr:\n{err}"
    );
    assert!(
        err.contains("the digest's counts and times are estimates"),
        "{err}"
    );
    // Every statement followed when asked.
    let tracer = Background::start(
        &[
            "queries",
            "-p",
            &pid,
            "-d",
            "3",
            "--summary",
            "--json",
            "--sample-every",
            "1",
        ],
        READY,
    );
    db.load(2).wait();
    let (out, err) = tracer.wait();
    let rows = json_lines(&out);
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r.get("scaled_by").is_none()),
        "{rows:?}\nstderr:\n{err}"
    );
    assert!(!err.contains("following them one second in"), "{err}");
}

#[test]
fn summary_digest_and_min_ms() {
    let db = testdb();
    let pid = db.pid.to_string();
    let tracer = Background::start(&["queries", "-p", &pid, "-d", "4", "--summary"], READY);
    let load = db.load(3);
    load.wait();
    let (out, err) = tracer.wait();
    // Sampled (a busy server, `--sample-every auto`), a line says the table is estimated.
    let table: Vec<&str> = out
        .lines()
        .skip_while(|l| l.starts_with("Estimated: "))
        .collect();
    let header = table.first().copied().unwrap_or_default();
    for col in [
        "COUNT",
        "P50",
        "P95",
        "P99",
        "MAX",
        "USER%",
        "RUNQ%",
        "LOCK%",
        "SYNC%",
        "NET%",
        "FINGERPRINT",
    ] {
        assert!(header.contains(col), "digest header lacks {col}: {out}");
    }
    assert!(
        out.contains("select c from sbtest"),
        "digest lacks sysbench's point select:\n{out}\nstderr:\n{err}"
    );
    assert!(out.contains("commit"), "digest lacks COMMIT:\n{out}");
    // The shares of each row add up to 100%, and the top fingerprints get a sentence.
    let rows: Vec<&str> = table
        .iter()
        .copied()
        .skip(1)
        .take_while(|l| !l.is_empty() && !l.starts_with("..."))
        .collect();
    assert!(!rows.is_empty(), "{out}");
    for row in rows {
        let cells: Vec<&str> = row.split_whitespace().collect();
        let parts = header
            .split_whitespace()
            .filter(|c| c.ends_with('%'))
            .count();
        let shares: f64 = cells[9..9 + parts]
            .iter()
            .map(|c| c.parse::<f64>().unwrap())
            .sum();
        assert!(
            (shares - 100.0).abs() < 0.01,
            "shares add up to {shares}: {row}"
        );
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with("commit: ") && l.contains("% of its time")),
        "no sentence for COMMIT:\n{out}"
    );

    // A slow-statement log under load misses none: with --min-ms every statement is followed (a sample would
    // miss the rare slow one), and the shorter ones are left in the kernel.
    let tracer = Background::start(&["queries", "-p", &pid, "--json", "--min-ms", "100"], READY);
    let load = db.load(4);
    let mut s = db.session();
    let tid = s.server_tid();
    for _ in 0..10 {
        assert_eq!(s.query_row("SELECT SLEEP(0.15)"), "0");
    }
    load.wait();
    let (out, err) = tracer.stop();
    let all = json_lines(&out);
    let statements: Vec<_> = all.iter().filter(|r| r.get("lost").is_none()).collect();
    assert!(
        !statements.is_empty() && statements.iter().all(|r| num(r, "duration_us") >= 100_000),
        "{all:?}"
    );
    // Its own: other tests sleep on the same server.
    assert_eq!(
        query_is(&of_thread(&all, tid), "SELECT SLEEP(?)").len(),
        10,
        "{all:?}\n{err}"
    );
    assert!(
        err.contains("shorter than --min-ms left in the kernel") && !err.contains("one second in"),
        "{err}"
    );
}

#[test]
fn tls_connections_are_followed_in_their_plaintext() {
    // Every test server speaks TLS (scripts/testdb gives MariaDB 10.11 its certificates).
    let tls = &testdb();

    // Opened before tracing: only --uprobes sees it.
    let mut before = tls.session_with(&["--ssl"]);
    assert_eq!(
        before
            .query_row("SHOW STATUS LIKE 'Ssl_version'")
            .split('\t')
            .nth(1)
            .map(|v| v.starts_with("TLS")),
        Some(true)
    );
    let before_tid = before.server_tid();
    a_sum_is_followed_through_uprobes(tls, &mut before, before_tid);

    // Opened while tracing: followed at the server's SSL_read and SSL_write.
    let tracer = trace(tls, &[]);
    let mut during = tls.session_with(&["--ssl"]);
    let tid = during.server_tid();
    assert_eq!(during.query_row("SELECT SLEEP(0.2)"), "0");
    // One more statement, so that the sleep's has ended when tracing does, however busy the machine.
    assert_eq!(during.query_row("SELECT 1"), "1");
    let (out, err) = tracer.stop();
    assert!(
        err.contains("uses TLS: its statements are followed in their plaintext"),
        "TLS not reported on stderr: {err}"
    );
    assert!(!err.contains("dispatch_command"), "{err}");
    let all = json_lines(&out);
    let sleeps = query_is(&of_thread(&all, tid), "SELECT SLEEP(?)");
    assert_eq!(sleeps.len(), 1, "{all:?}\nstderr:\n{err}");
    let d = num(sleeps[0], "duration_us");
    assert!((180_000..=30_000_000).contains(&d), "{}", sleeps[0]);
    assert!(
        num(sleeps[0], "sleep_us") >= 150_000,
        "{}\nstderr:\n{err}",
        sleeps[0]
    );
}

#[test]
fn a_server_whose_binary_was_replaced_is_still_followed_through_uprobes() {
    let db = testdb();
    let dir = tempdir("upgraded");
    let binary = dir.join("mariadbd");
    std::fs::copy("/usr/sbin/mariadbd", &binary).unwrap();
    let server = db.start_another_binary(&dir.join("server"), Some(&binary), &[]);
    let upgraded = &server.0;
    let mut before = upgraded.session();
    let tid = before.server_tid();
    // The upgrade, as a package manager does it: a new file renamed over the path; the running one is deleted.
    let new = dir.join("mariadbd.new");
    std::fs::copy("/bin/true", &new).unwrap();
    std::fs::rename(&new, &binary).unwrap();

    a_sum_is_followed_through_uprobes(upgraded, &mut before, tid);
}

/// Traces `db` with `--uprobes` while `session`, served by thread `tid`, runs `SELECT 2 + 2`: the statement
/// is followed through the uprobes on dispatch_command, once.
fn a_sum_is_followed_through_uprobes(db: &TestDb, session: &mut Session, tid: u32) {
    let tracer = trace(db, &["--uprobes"]);
    assert_eq!(session.query_row("SELECT 2 + 2"), "4");
    let (out, err) = tracer.stop();
    assert!(
        err.contains("through uprobes on dispatch_command("),
        "{err}"
    );
    let all = json_lines(&out);
    assert_eq!(
        query_is(&of_thread(&all, tid), "SELECT ? + ?").len(),
        1,
        "{all:?}\nstderr:\n{err}"
    );
}
