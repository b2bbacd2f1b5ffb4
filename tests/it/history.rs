//! The agent's session history, read after the fact: an incident replayed on every server while the agent runs (a
//! hot row held by a connection idle in its transaction, a metadata-lock pile-up behind an ALTER, a client slow to
//! read its result), the agent restarted, and then `myprobe history` asked what happened at each moment and over
//! each range, from the store's file and from the running agent.

use std::{
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

pub(crate) use crate::agent::free_port;
use crate::common::*;

pub(crate) fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The agent tracing `db` on `port`, its history in `dir`; every statement traced (`--sample-every 1`), so that
/// what a holder ran is known. Ready once it samples and counts a statement.
fn agent(db: &TestDb, port: u16, dir: &Path) -> Background {
    agent_with(db, port, dir, &[])
}

/// [`agent`] with more options.
pub(crate) fn agent_with(db: &TestDb, port: u16, dir: &Path, more: &[&str]) -> Background {
    let args = agent_args(db, port, dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Background::start(
        &[&args[..], &["--sample-every", "1"], more].concat(),
        "myprobe: agent: tracing",
    );
    agent.wait_for_stderr("myprobe: agent: sampling the sessions of");
    // Said to trace before its statements' probes are in place: what a holder runs next must be traced.
    db.wait_until("the agent counts a statement", || {
        crate::agent::statement_counted(port, db)
    });
    agent
}

/// The agent's command line tracing `db`, listening on `port`, its history in `dir`.
fn agent_args(db: &TestDb, port: u16, dir: &Path) -> Vec<String> {
    let (pid, listen) = (db.pid.to_string(), format!("127.0.0.1:{port}"));
    let dir = dir.to_str().unwrap();
    ["agent", "-p", &pid, "--listen", &listen, "--dir", dir]
        .map(String::from)
        .to_vec()
}

/// `myprobe history ARGS`'s stdout.
fn history_text(args: &[&str]) -> String {
    let out = myprobe().arg("history").args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "history {args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// `myprobe history ARGS -o -`, as JSON.
fn history(args: &[&str]) -> Value {
    let out = history_text(&[args, &["-o", "-"]].concat());
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The sessions of the one server sampled at `at`.
fn sessions_at(store: &Path, at: i64) -> Vec<Value> {
    let m = history(&["--store", store.to_str().unwrap(), "--at", &at.to_string()]);
    let servers = m["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 1, "{m}");
    servers[0]["sessions"].as_array().unwrap().clone()
}

fn session(sessions: &[Value], conn: u64) -> &Value {
    sessions
        .iter()
        .find(|s| s["conn"] == conn)
        .unwrap_or_else(|| panic!("no connection {conn} in {sessions:#?}"))
}

/// Of the incident's causes, the one that took the most load over `from..to` (the other tests' sessions on the
/// same server add load of their own, mostly on a CPU).
fn first_state(store: &Path, from: i64, to: i64) -> String {
    let r = history(&[
        "--store",
        store.to_str().unwrap(),
        "--from",
        &from.to_string(),
        "--to",
        &to.to_string(),
    ]);
    r["states"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["key"].as_str())
        .find(|k| ["row lock", "metadata lock", "client"].contains(k))
        .unwrap_or_else(|| panic!("none of the incident's causes from {from} to {to}: {r}"))
        .to_string()
}

/// Waits until `sql` counts `n`, then long enough for a few seconds to be sampled; the second it returns.
fn held(db: &TestDb, sql: &str, n: u32) -> i64 {
    db.wait_until(&format!("{n} of {sql}"), || {
        db.sql(sql).trim().parse::<u32>().unwrap_or(0) >= n
    });
    // Long enough for the holder's statement to have gone through the agent's pipeline (read once a second) on a
    // busy host: seen by the history's seconds of the moment.
    std::thread::sleep(Duration::from_secs(3));
    let t = now_s();
    std::thread::sleep(Duration::from_millis(1500));
    t
}

/// What t1 left: the connections that waited, the holder and what it ran.
pub(crate) struct HotRow {
    pub(crate) at: i64,
    pub(crate) holder: u64,
    pub(crate) waiters: Vec<u64>,
}

fn hot_row(db: &TestDb) -> HotRow {
    hot_row_on(db, "hist.t")
}

/// A row of `table` (its database made if need be) held by a connection idle in its transaction, two waiting for it.
pub(crate) fn hot_row_on(db: &TestDb, table: &str) -> HotRow {
    let schema = table.split('.').next().unwrap();
    db.sql(&format!(
        "CREATE DATABASE IF NOT EXISTS {schema}; CREATE TABLE IF NOT EXISTS {table} (id INT PRIMARY KEY, k INT) \
         ENGINE=InnoDB; REPLACE INTO {table} VALUES (1, 0)"
    ));
    let mut holder = db.session();
    let holder_id = holder.connection_id();
    holder.exec(&format!("BEGIN; UPDATE {table} SET k = k + 1 WHERE id = 1"));
    let mut waiters: Vec<Session> = (0..3).map(|_| db.session()).collect();
    let ids = waiters.iter_mut().map(Session::connection_id).collect();
    for w in &mut waiters {
        w.send(&format!(
            "UPDATE {table} SET k = k + 2 WHERE id = 1 AND 'hot-row' <> ''"
        ));
    }
    let at = held(
        db,
        &format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'UPDATE {table} SET k = k + 2%'"
        ),
        3,
    );
    holder.exec("ROLLBACK");
    for mut w in waiters {
        w.exec("DO 0");
    }
    HotRow {
        at,
        holder: holder_id,
        waiters: ids,
    }
}

/// t2: an ALTER behind a transaction that read the table, and readers queued behind the ALTER.
struct Pile {
    at: i64,
    reader: u64,
    alter: u64,
    queued: Vec<u64>,
}

fn metadata_pile_up(db: &TestDb) -> Pile {
    db.sql("CREATE TABLE IF NOT EXISTS hist.ddl (n INT) ENGINE=InnoDB");
    let mut reader = db.session();
    let reader_id = reader.connection_id();
    reader.exec("BEGIN; SELECT COUNT(*) FROM hist.ddl");
    let mut alter = db.session();
    let alter_id = alter.connection_id();
    alter.send("ALTER TABLE hist.ddl COMMENT 'pile-up'");
    std::thread::sleep(Duration::from_millis(300));
    let mut queued: Vec<Session> = (0..3).map(|_| db.session()).collect();
    let ids = queued.iter_mut().map(Session::connection_id).collect();
    for q in &mut queued {
        q.send("SELECT COUNT(*) FROM hist.ddl WHERE 'pile-up' <> ''");
    }
    let at = held(
        db,
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '%pile-up%' AND STATE LIKE \
         '%metadata lock%'",
        4,
    );
    reader.exec("COMMIT");
    alter.exec("DO 0");
    for mut q in queued {
        q.exec("DO 0");
    }
    Pile {
        at,
        reader: reader_id,
        alter: alter_id,
        queued: ids,
    }
}

/// t3: clients that read their large result only once released.
fn slow_clients(db: &TestDb) -> (i64, Vec<u64>) {
    db.sql(
        "CREATE TABLE IF NOT EXISTS hist.ten (n INT) ENGINE=InnoDB; DELETE FROM hist.ten; \
         INSERT INTO hist.ten VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)",
    );
    let mut clients: Vec<Session> = (0..3).map(|_| db.session_with(&["--quick"])).collect();
    let conns = clients.iter_mut().map(Session::connection_id).collect();
    for c in &mut clients {
        c.send(
            "SELECT a.n, REPEAT('x', 4000), 'slow-client' FROM hist.ten a, hist.ten b, hist.ten c, hist.ten d; \
             SELECT 'slow-done'",
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    let at = now_s();
    std::thread::sleep(Duration::from_millis(1500));
    for mut c in clients {
        c.read_until("slow-done");
    }
    (at, conns)
}

fn hot_row_is_read_back(kind: &str, store: &Path, t1: &HotRow) {
    let sessions = sessions_at(store, t1.at);
    for &w in &t1.waiters {
        let s = session(&sessions, w);
        assert_eq!(s["state"], "row lock", "{kind}: {s}");
        assert!(
            s["object"].as_str().unwrap().starts_with("hist.t "),
            "{kind}: {s}"
        );
        assert_eq!(s["root_blocker"], t1.holder, "{kind}: {s}");
        assert!(
            s["statement"]
                .as_str()
                .unwrap()
                .contains("UPDATE hist.t SET k = k + ?"),
            "{kind}: {s}"
        );
    }
    let h = session(&sessions, t1.holder);
    assert_eq!(h["state"], "idle in transaction", "{kind}: {h}");
    let ran: Vec<&str> = h["holder_statements"]
        .as_array()
        .unwrap_or_else(|| panic!("{kind}: the holder's statements unknown: {h}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        ran.iter()
            .any(|r| r.starts_with("UPDATE hist.t SET k = k + ? WHERE id = ?")),
        "{kind}: {h}"
    );
    assert_eq!(
        first_state(store, t1.at - 1, t1.at + 1),
        "row lock",
        "{kind}"
    );
}

fn pile_up_is_read_back(kind: &str, store: &Path, t2: &Pile) {
    let sessions = sessions_at(store, t2.at);
    let alter = session(&sessions, t2.alter);
    assert_eq!(alter["state"], "metadata lock", "{kind}: {alter}");
    assert_eq!(alter["root_blocker"], t2.reader, "{kind}: {alter}");
    assert!(
        alter["statement"]
            .as_str()
            .unwrap()
            .starts_with("ALTER TABLE hist.ddl"),
        "{kind}: {alter}"
    );
    for &q in &t2.queued {
        let s = session(&sessions, q);
        assert_eq!(s["state"], "metadata lock", "{kind}: {s}");
        assert!(
            s["object"].as_str().unwrap().contains("hist.ddl"),
            "{kind}: {s}"
        );
        // Behind the ALTER, held up by the transaction that read the table.
        assert_eq!(s["root_blocker"], t2.reader, "{kind}: {s}");
    }
    let r = session(&sessions, t2.reader);
    assert_eq!(r["state"], "idle in transaction", "{kind}: {r}");
    assert_eq!(
        first_state(store, t2.at - 1, t2.at + 1),
        "metadata lock",
        "{kind}"
    );
}

fn slow_client_is_read_back(kind: &str, store: &Path, (at, conns): (i64, Vec<u64>)) {
    let sessions = sessions_at(store, at);
    for conn in conns {
        let s = session(&sessions, conn);
        assert_eq!(s["state"], "client", "{kind}: {s}");
        assert!(
            s["statement"]
                .as_str()
                .unwrap()
                .starts_with("SELECT a.n, REPEAT("),
            "{kind}: {s}"
        );
    }
    assert_eq!(first_state(store, at - 1, at + 1), "client", "{kind}");
}

#[test]
fn an_incident_is_read_back_after_the_agent_restarted_on_every_server() {
    // Each server with an agent of its own, at once.
    // MariaDB 10.11 a server of the test's own: the shared one holds the other tests' row-lock incidents.
    let dir = tempdir("history-own");
    let own = testdb().start_another(&dir, &[]);
    let servers = every_server();
    std::thread::scope(|s| {
        for (kind, db) in &servers {
            let db = if *kind == "mariadb-10.11" { &own.0 } else { db };
            s.spawn(move || replayed_and_read_back(kind, db));
        }
    });
}

fn replayed_and_read_back(kind: &str, db: &TestDb) {
    let dir = tempdir(&format!("history-{kind}"));
    let port = free_port();
    let first = agent(db, port, &dir);
    let t1 = hot_row(db);
    let t2 = metadata_pile_up(db);
    let t3 = slow_clients(db);
    let (_, err) = first.stop();
    assert!(!err.contains("no session history"), "{kind}: {err}");
    // Restarted: what the first kept is read from the file and from the new agent alike.
    let again = agent(db, port, &dir);
    let store = dir.join("history.sqlite");
    hot_row_is_read_back(kind, &store, &t1);
    pile_up_is_read_back(kind, &store, &t2);
    slow_client_is_read_back(kind, &store, t3);
    let url = format!("http://127.0.0.1:{port}");
    let at = t1.at.to_string();
    let served = history(&["--agent", &url, "--at", &at]);
    let from_file = history(&["--store", store.to_str().unwrap(), "--at", &at]);
    assert_eq!(served, from_file, "{kind}");
    let text = history_text(&["--store", store.to_str().unwrap(), "--at", &at]);
    assert!(
        text.contains(&format!("connection {} (", t1.holder)),
        "{kind}: {text}"
    );
    assert!(text.contains("idle in its transaction"), "{kind}: {text}");
    again.stop();
}

/// A second in which connections run: a statement sleeping, and a transaction left open.
fn busy(db: &TestDb) -> Vec<Session> {
    let mut sleeper = db.session();
    sleeper.send("SELECT SLEEP(30), 'history-faults'");
    let mut open = db.session();
    open.exec("BEGIN; SELECT 1");
    vec![sleeper, open]
}

/// The lines of the agent's stderr about its history that say it keeps none.
fn history_warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("no session history is kept"))
        .collect()
}

/// The agent on a store it cannot use: one line, and it goes on serving its metrics.
fn goes_on_without_history(db: &TestDb, dir: &Path, why: &str) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let args = agent_args(db, port, dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Background::start(&args, "myprobe: agent: tracing");
    agent.wait_for_stderr("no session history is kept");
    std::thread::sleep(Duration::from_secs(1));
    let metrics = ureq::get(&format!("http://{listen}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(metrics.contains("myprobe_"), "{why}: {metrics}");
    let (_, err) = agent.stop();
    let lines = history_warnings(&err);
    assert_eq!(lines.len(), 1, "{why}: {err}");
    assert!(lines[0].contains(why), "{why}: {err}");
}

#[test]
fn a_store_killed_mid_write_opens_and_one_that_fails_is_one_line() {
    let db = testdb();
    let _busy = busy(&db);
    // Killed while it writes each second: the store opens and answers, whole.
    let dir = tempdir("history-killed");
    let first = agent(&db, free_port(), &dir);
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(first.pid() as i32, libc::SIGKILL) };
    // Reaped as it drops.
    drop(first);
    let store = dir.join("history.sqlite");
    let db_file = rusqlite::Connection::open(&store).unwrap();
    let check: String = db_file
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    drop(db_file);
    let r = history(&["--store", store.to_str().unwrap(), "--from", "-1m"]);
    assert!(!r["points"].as_array().unwrap().is_empty(), "{r}");
    let again = agent(&db, free_port(), &dir);
    let (_, err) = again.stop();
    assert!(history_warnings(&err).is_empty(), "{err}");

    // A file that is not a database.
    let corrupt = tempdir("history-corrupt");
    std::fs::write(corrupt.join("history.sqlite"), vec![0x5a; 64 * 1024]).unwrap();
    goes_on_without_history(&db, &corrupt, "not a database");

    // Another process holding the store.
    let locked = tempdir("history-locked");
    let holder = rusqlite::Connection::open(locked.join("history.sqlite")).unwrap();
    holder
        .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE mine (x); BEGIN EXCLUSIVE; INSERT INTO mine VALUES (1);")
        .unwrap();
    goes_on_without_history(&db, &locked, "locked");
    drop(holder);

    // A full disk: a file system of 2 MiB filled to its last pages.
    let full = tempdir("history-full");
    let size = format!("size={}", 2 << 20);
    assert!(std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
        .arg(&*full)
        .status()
        .unwrap()
        .success());
    let _ = std::fs::write(full.join("filler"), vec![0u8; (2 << 20) - 8192]);
    goes_on_without_history(&db, &full, "full");
    let _ = std::process::Command::new("umount").arg(&*full).status();
}
