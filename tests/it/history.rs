//! The agent's session history, read after the fact: an incident replayed on every server while the agent runs (a
//! hot row held by a connection idle in its transaction, a metadata-lock pile-up behind an ALTER, a client slow to
//! read its result), the agent restarted, and then `myprobe history` asked what happened at each moment and over
//! each range, from the store's file and from the running agent.

use std::{
    net::TcpListener,
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use crate::common::*;

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The agent tracing `db` on `port`, its history in `dir`; every statement traced (`--sample-every 1`), so that
/// what a holder ran is known. Ready once it samples.
fn agent(db: &TestDb, port: u16, dir: &Path) -> Background {
    agent_with(db, port, dir, &[])
}

/// As [`agent`], with more of the agent's options.
pub(crate) fn agent_with(db: &TestDb, port: u16, dir: &Path, more: &[&str]) -> Background {
    let (pid, listen) = (db.pid.to_string(), format!("127.0.0.1:{port}"));
    let args = [
        &[
            "agent",
            "-p",
            &pid,
            "--listen",
            &listen,
            "--dir",
            dir.to_str().unwrap(),
            "--sample-every",
            "1",
        ][..],
        more,
    ]
    .concat();
    let agent = Background::start(&args, "myprobe: agent: tracing");
    agent.wait_for_stderr("myprobe: agent: sampling the sessions of");
    agent
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

/// The state that took the most load over `from..to`.
fn first_state(store: &Path, from: i64, to: i64) -> String {
    let r = history(&[
        "--store",
        store.to_str().unwrap(),
        "--from",
        &from.to_string(),
        "--to",
        &to.to_string(),
    ]);
    r["states"][0]["key"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Waits until `sql` counts `n`, then long enough for a few seconds to be sampled; the second it returns.
fn held(db: &TestDb, sql: &str, n: u32) -> i64 {
    db.wait_until(&format!("{n} of {sql}"), || {
        db.sql(sql).trim().parse::<u32>().unwrap_or(0) >= n
    });
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

/// A row of `schema`.t held by a connection idle in its transaction, two others waiting for it for a few seconds
/// (a schema of each test's own, as tests run two at a time).
pub(crate) fn hot_row(db: &TestDb, schema: &str) -> HotRow {
    db.sql(&format!(
        "CREATE DATABASE IF NOT EXISTS {schema}; CREATE TABLE IF NOT EXISTS {schema}.t (id INT PRIMARY KEY, k INT) \
         ENGINE=InnoDB; REPLACE INTO {schema}.t VALUES (1, 0)"
    ));
    let mut holder = db.session();
    let holder_id = holder.connection_id();
    holder.exec(&format!(
        "BEGIN; UPDATE {schema}.t SET k = k + 1 WHERE id = 1"
    ));
    let mut waiters: Vec<Session> = (0..2).map(|_| db.session()).collect();
    let ids = waiters.iter_mut().map(Session::connection_id).collect();
    for w in &mut waiters {
        w.send(&format!(
            "UPDATE {schema}.t SET k = k + 2 WHERE id = 1 AND 'hot-row' <> ''"
        ));
    }
    let at = held(
        db,
        &format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'UPDATE {schema}.t SET k = k + 2%'"
        ),
        2,
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
    let mut queued: Vec<Session> = (0..2).map(|_| db.session()).collect();
    let ids = queued.iter_mut().map(Session::connection_id).collect();
    for q in &mut queued {
        q.send("SELECT COUNT(*) FROM hist.ddl WHERE 'pile-up' <> ''");
    }
    let at = held(
        db,
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '%pile-up%' AND STATE LIKE \
         '%metadata lock%'",
        3,
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

/// t3: a client that reads its large result only once released.
fn slow_client(db: &TestDb) -> (i64, u64) {
    db.sql(
        "CREATE TABLE IF NOT EXISTS hist.ten (n INT) ENGINE=InnoDB; DELETE FROM hist.ten; \
         INSERT INTO hist.ten VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)",
    );
    let mut s = db.session_with(&["--quick"]);
    let conn = s.connection_id();
    s.send(
        "SELECT a.n, REPEAT('x', 4000), 'slow-client' FROM hist.ten a, hist.ten b, hist.ten c, hist.ten d; \
         SELECT 'slow-done'",
    );
    std::thread::sleep(Duration::from_secs(4));
    let at = now_s();
    std::thread::sleep(Duration::from_millis(1500));
    s.read_until("slow-done");
    (at, conn)
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
        first_state(store, t1.at - 3, t1.at + 1),
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
        first_state(store, t2.at - 3, t2.at + 1),
        "metadata lock",
        "{kind}"
    );
}

fn slow_client_is_read_back(kind: &str, store: &Path, (at, conn): (i64, u64)) {
    let sessions = sessions_at(store, at);
    let s = session(&sessions, conn);
    assert_eq!(s["state"], "client", "{kind}: {s}");
    assert!(
        s["statement"]
            .as_str()
            .unwrap()
            .starts_with("SELECT a.n, REPEAT("),
        "{kind}: {s}"
    );
    assert_eq!(first_state(store, at - 2, at + 1), "client", "{kind}");
}

#[test]
fn an_incident_is_read_back_after_the_agent_restarted_on_every_server() {
    for (kind, db) in every_server() {
        let dir = tempdir(&format!("history-{kind}"));
        let port = free_port();
        let first = agent(&db, port, &dir);
        let t1 = hot_row(&db, "hist");
        let t2 = metadata_pile_up(&db);
        let t3 = slow_client(&db);
        let (_, err) = first.stop();
        assert!(!err.contains("no session history"), "{kind}: {err}");
        // Restarted: what the first kept is read from the file and from the new agent alike.
        let again = agent(&db, port, &dir);
        let store = dir.join("history.sqlite");
        hot_row_is_read_back(kind, &store, &t1);
        pile_up_is_read_back(kind, &store, &t2);
        slow_client_is_read_back(kind, &store, t3);
        let url = format!("http://127.0.0.1:{port}");
        let served = history(&["--agent", &url, "--at", &t1.at.to_string()]);
        let from_file = history(&[
            "--store",
            store.to_str().unwrap(),
            "--at",
            &t1.at.to_string(),
        ]);
        assert_eq!(served, from_file, "{kind}");
        let text = history_text(&[
            "--store",
            store.to_str().unwrap(),
            "--at",
            &t1.at.to_string(),
        ]);
        assert!(
            text.contains(&format!("connection {} (", t1.holder)),
            "{kind}: {text}"
        );
        assert!(text.contains("idle in its transaction"), "{kind}: {text}");
        again.stop();
    }
}
