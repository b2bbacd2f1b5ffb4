//! Every command once on the servers beside Debian 12's MariaDB, as users run them: MariaDB 11.8 (Debian 13's) and
//! Oracle MySQL 9.7 (Debian unstable's), each under its own root and in its own mount and PID namespace, as a
//! container runtime runs them (scripts/testdb), under sysbench started before tracing.

use crate::common::*;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

/// The ids of the process or thread of `/proc/…` directory `dir`, from this PID namespace's down to its own.
fn ns_pids(dir: &Path) -> Vec<u32> {
    let status = std::fs::read_to_string(dir.join("status")).unwrap();
    myprobe::process::tids::ns_pids(&status).expect("an NSpid line")
}

/// The server's own PID namespace numbers its threads from 1: the ids it reports are not the host's.
fn assert_in_own_pid_namespace(db: &TestDb) {
    let ids = ns_pids(Path::new(&format!("/proc/{}", db.pid)));
    assert_eq!(
        ids.len(),
        2,
        "the server is not in a PID namespace of its own: {ids:?}"
    );
}

fn server_or_skip(kind: &str) -> Option<TestDb> {
    let db = other_server(kind);
    if db.is_none() {
        eprintln!("{kind} was not started (MYPROBE_OTHER_SERVERS): nothing to test");
    }
    db
}

fn pid_args(db: &TestDb, command: &[&str], secs: &str) -> Vec<String> {
    command
        .iter()
        .map(|s| s.to_string())
        .chain(["-p".into(), db.pid.to_string(), "-d".into(), secs.into()])
        .collect()
}

/// `profile KIND` for `secs` seconds: its folded stacks.
fn profile(db: &TestDb, kind: &str, secs: &str) -> Vec<(Vec<String>, u64)> {
    let dir = tempdir(&format!("servers-{kind}"));
    let folded = dir.join("out.folded");
    run_ok(
        myprobe()
            .args(pid_args(db, &["profile", kind], secs))
            .arg("-o")
            .arg(&folded),
    );
    read_folded(&folded)
}

/// `queries --json` for `secs` seconds: the records, and stderr.
fn queries(db: &TestDb, secs: &str) -> (Vec<serde_json::Value>, String) {
    let out = myprobe()
        .args(pid_args(db, &["queries", "--json"], secs))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "queries failed:\n{stderr}");
    let records = json_lines(&String::from_utf8_lossy(&out.stdout))
        .into_iter()
        .filter(|r| r.get("lost").is_none())
        .collect();
    (records, stderr)
}

/// Executions of statements prepared before tracing, and those of them with their own text.
fn prepared_named(records: &[serde_json::Value]) -> (usize, usize) {
    let executions: Vec<_> = records
        .iter()
        .filter(|r| r["command"] == "Execute")
        .collect();
    let named = executions.iter().filter(|r| r["query"].is_string()).count();
    (executions.len(), named)
}

/// `stacks` while the load runs: the statements threads run, as `statement:` lines (a few tries: at one instant
/// every connection may be between statements, as the load's mostly are; a SLEEP beside it is one that runs).
fn stacks_show_statements(db: &TestDb) -> String {
    let mut sleeper = db.session();
    sleeper.send("SELECT SLEEP(3)");
    let mut last = String::new();
    for _ in 0..5 {
        let out = myprobe()
            .args(["stacks", "-p", &db.pid.to_string()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "stacks failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if stdout.contains("statement: ") {
            return stdout;
        }
        last = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!("no thread shown with its statement in 5 snapshots; the last:\n{last}");
}

/// What every server gives alike: stacks through the command loop, waits, statements, the threads' statements,
/// stat's server columns (`counting`: those of its counters that the load must move), a traced function, a report;
/// then `own`, the server's own checks, still under load.
/// Returns `queries`' records and what it said on stderr.
fn every_command(
    db: &TestDb,
    counting: &[&str],
    own: impl FnOnce(),
) -> (Vec<serde_json::Value>, String) {
    assert_in_own_pid_namespace(db);
    let load = db.running_load();

    // A second at a time, up to three: on a busy host the server may barely run in one.
    let mut cpu = Vec::new();
    for _ in 0..3 {
        cpu = profile(db, "cpu", "1");
        if value_with_frame(&cpu, |f| f == "do_command") > 0 {
            break;
        }
    }
    assert!(
        value_with_frame(&cpu, |f| f == "do_command") > 0,
        "no on-CPU sample in do_command in 3 s: {cpu:?}"
    );
    let offcpu = profile(db, "offcpu", "1");
    assert!(!offcpu.is_empty(), "no off-CPU stack");
    for kind in ["locks", "alloc", "syscalls"] {
        profile(db, kind, "1");
    }

    let (records, stderr) = queries(db, "2");
    assert!(
        records.len() > 100,
        "too few statements traced ({}):\n{stderr}",
        records.len()
    );

    let stacks = stacks_show_statements(db);
    assert!(stacks.contains("do_command"), "{stacks}");

    // Each counter must be seen moving; on a starved host a server may do no fsync in two seconds, so stat runs
    // again (up to three times) for those not seen yet.
    let mut unseen: Vec<&str> = counting.to_vec();
    let mut seen_lines = Vec::new();
    for _ in 0..3 {
        let out = myprobe()
            .args(["stat", "-p", &db.pid.to_string(), "-c", "2", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "stat: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
        unseen.retain(|counter| {
            !lines
                .iter()
                .any(|l| l["status"][*counter].as_f64() > Some(0.0))
        });
        seen_lines.extend(lines);
        if unseen.is_empty() {
            break;
        }
    }
    assert!(
        unseen.is_empty(),
        "stat's {unseen:?} did not move: {seen_lines:?}"
    );

    let out = myprobe()
        .args(pid_args(
            db,
            &["trace", "dispatch_command", "--max-rate", "0"],
            "1",
        ))
        .output()
        .unwrap();
    let trace =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "trace: {trace}");
    assert!(trace.contains("dispatch_command"), "{trace}");

    let dir = tempdir("servers-report");
    let html = dir.join("report.html");
    run_ok(
        myprobe()
            .args(pid_args(db, &["report"], "1"))
            .arg("-o")
            .arg(&html),
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("sbtest"),
        "the report names no statement of the load"
    );

    agent_exports_the_load(db);

    own();
    load.finish();
    (records, stderr)
}

/// The agent, tracing every statement: /metrics counts those of the load by fingerprint.
fn agent_exports_the_load(db: &TestDb) {
    let dir = tempdir("servers-agent");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (pid, listen) = (db.pid.to_string(), format!("127.0.0.1:{port}"));
    let agent = Background::start(
        &[
            "agent",
            "-p",
            &pid,
            "--listen",
            &listen,
            "--window",
            "2s",
            "--sample-every",
            "1",
            "--dir",
            dir.to_str().unwrap(),
        ],
        "myprobe: agent: tracing",
    );
    let url = format!("http://{listen}/metrics");
    let mut metrics = String::new();
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(500));
        metrics = ureq::get(&url)
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .unwrap_or_default();
        if metrics
            .lines()
            .any(|l| l.starts_with("myprobe_statements_total") && l.contains("sbtest"))
        {
            break;
        }
    }
    let (_, stderr) = agent.stop();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("myprobe_statements_total") && l.contains("sbtest")),
        "no statement of the load in /metrics:\n{metrics}\nagent's stderr:\n{stderr}"
    );
}

/// `pfs waits` for a second.
fn pfs_waits(db: &TestDb) -> std::process::Output {
    myprobe()
        .args(["pfs", "waits", "-p", &db.pid.to_string(), "-d", "1"])
        .output()
        .unwrap()
}

#[test]
fn mariadb_11_8_in_its_own_pid_namespace() {
    let Some(db) = server_or_skip("mariadb-11.8") else {
        return;
    };
    // Its redo log is memory-mapped: written without fsyncs (innodb_log_file_mmap).
    let (records, stderr) = every_command(&db, &["Questions", "Innodb_os_log_written"], || {
        // performance_schema is off, MariaDB's default: one line says so.
        let out = pfs_waits(&db);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains("performance_schema is OFF"), "{stderr}");
    });
    tls_clients_are_followed(&db);
    // Texts from its process list, whose thread ids are its namespace's: joined through NSpid.
    let (executions, named) = prepared_named(&records);
    assert!(
        named > 0 && named * 2 > executions,
        "{named} of {executions} executions of statements prepared before tracing named; queries said:\n{stderr}"
    );
}

#[test]
fn mysql_9_7() {
    let Some(db) = server_or_skip("mysql-9.7") else {
        return;
    };
    let (records, stderr) = every_command(&db, &["Questions", "Innodb_os_log_fsyncs"], || {
        // performance_schema is on, MySQL's default.
        let out = pfs_waits(&db);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "pfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("wait;io;file;innodb;innodb_log_file"),
            "{stdout}"
        );
    });
    tls_clients_are_followed(&db);
    // Texts from performance_schema.prepared_statements_instances: exact, not sampled.
    let (executions, named) = prepared_named(&records);
    assert!(executions > 100, "too few executions: {executions}");
    assert!(
        named as f64 >= 0.999 * executions as f64,
        "{named} of {executions} executions of statements prepared before tracing named; queries said:\n{stderr}"
    );
}

/// Seed 001 on the server it was written for: under write load, performance_schema's wait on the redo log file
/// grows when every commit flushes it (innodb_flush_log_at_trx_commit 0, then 1), and the diff shows it.
#[test]
fn mysql_9_7_redo_log_waits_grow_when_commits_flush() {
    crate::common::servers_alone();
    let Some(db) = server_or_skip("mysql-9.7") else {
        return;
    };
    let dir = tempdir("servers-seed-001");
    let mut redo = Vec::new();
    for flush in [0, 1] {
        db.sql(&format!(
            "SET GLOBAL innodb_flush_log_at_trx_commit = {flush}"
        ));
        let load = db.running_workload("oltp_write_only");
        let folded = dir.join(format!("waits-{flush}.folded"));
        run_ok(
            myprobe()
                .args(["pfs", "waits", "-p", &db.pid.to_string(), "-d", "2", "-o"])
                .arg(&folded),
        );
        load.finish();
        let log_file = value_with_frame(&read_folded(&folded), |f| f == "innodb_log_file");
        redo.push((folded, log_file));
    }
    db.sql("SET GLOBAL innodb_flush_log_at_trx_commit = 1");
    let (zero, one) = (redo[0].1, redo[1].1);
    assert!(
        one > 2 * zero && one > 0,
        "wait/io/file/innodb/innodb_log_file: {zero} us at 0, {one} us at 1"
    );
    let svg = dir.join("redo.diff.svg");
    run_ok(
        myprobe()
            .arg("diff")
            .arg(&redo[0].0)
            .arg(&redo[1].0)
            .arg("-o")
            .arg(&svg),
    );
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(
        drawn.contains("innodb_log_file"),
        "the diff does not draw the redo log file"
    );
}

/// The Python of the client libraries (scripts/setup installs it).
fn python() -> PathBuf {
    let env =
        std::env::var("MYPROBE_PYTHON_ENV").unwrap_or_else(|_| "/var/cache/myprobe/python".into());
    let python = Path::new(&env).join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup",
        python.display()
    );
    python
}

/// Real client libraries over TLS on TCP, connected while tracing (tests/fixtures/servers/tls_clients.py): every
/// statement once, with its exact text and its connection's user, the executions of its prepared statements by
/// their text: followed in their plaintext, at the server's vio_ssl_read and vio_ssl_write.
fn tls_clients_are_followed(db: &TestDb) {
    let tag = format!("tls{}", std::process::id());
    let pid = db.pid.to_string();
    let tracer = Background::start(
        &[
            "queries",
            "-p",
            &pid,
            "--json",
            "--raw-sql",
            "--sample-every",
            "1",
        ],
        "myprobe: tracing the statements",
    );
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/servers/tls_clients.py");
    let out = Command::new(python())
        .arg(&fixture)
        .arg(db.port())
        .arg(&tag)
        .output()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let (stdout, stderr) = tracer.stop();
    assert!(
        out.status.success(),
        "the clients failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records = json_lines(&stdout);
    let sent = String::from_utf8_lossy(&out.stdout).into_owned();
    let texts: Vec<&str> = sent
        .lines()
        .filter_map(|l| l.strip_prefix("text\t"))
        .collect();
    let prepared: Vec<&str> = sent
        .lines()
        .filter_map(|l| l.strip_prefix("prepared\t"))
        .collect();
    let context = format!("records: {records:#?}\nmyprobe's stderr:\n{stderr}");
    for text in &texts {
        let seen: Vec<_> = records.iter().filter(|r| r["query"] == *text).collect();
        assert_eq!(seen.len(), 1, "`{text}` not recorded once; {context}");
        assert_eq!(seen[0]["user"], "sbtest", "{context}");
        assert_eq!(seen[0]["db"], "sbtest", "{context}");
    }
    let statement = prepared[0];
    let prepares: Vec<_> = records
        .iter()
        .filter(|r| r["command"] == "Prepare" && r["query"] == statement)
        .collect();
    assert_eq!(prepares.len(), 1, "the prepare of `{statement}`; {context}");
    assert_eq!(prepares[0]["user"], "sbtest", "{context}");
    let on_its_thread: Vec<_> = records
        .iter()
        .filter(|r| r["command"] == "Execute" && r["tid"] == prepares[0]["tid"])
        .collect();
    assert_eq!(on_its_thread.len(), prepared.len(), "{context}");
    for e in &on_its_thread {
        assert_eq!(e["user"], "sbtest", "{context}");
        assert_eq!(e["query"], statement, "{context}");
    }
}

/// A crash of MySQL 9.7 in its own root and PID namespace, under an init as `docker run --init` runs it (a
/// server that is its namespace's PID 1 cannot dump a core: the kernel drops its own signal to itself). Its
/// crash report (libbacktrace's frames: addresses and dynamic symbols, no modules) and its core, read with the
/// filesystem it ran in (`--root`), name the statement and its frames.
#[test]
fn mysql_9_7_crash_report_and_core_name_the_statement_and_its_frames() {
    let Some(db) = server_or_skip("mysql-9.7") else {
        return;
    };
    let root = db
        .env("MYPROBE_TEST_ROOT")
        .expect("MYPROBE_TEST_ROOT in the server's env");
    let dir = tempdir("servers-crash");
    let server = db.start_another_with(
        &dir.join("db"),
        &[
            ("MYPROBE_TESTDB_SERVER", "mysql-9.7"),
            ("MYPROBE_TESTDB_INIT", "1"),
        ],
        // A small core: the buffer pool is most of it.
        &["--core-file", "--innodb-buffer-pool-size=16M"],
    );
    let pid = server.0.pid;
    allow_cores(pid);
    let mut s = server.0.session();
    let tid: u32 = s
        .query_row(
            "SELECT THREAD_OS_ID FROM performance_schema.threads WHERE PROCESSLIST_ID = CONNECTION_ID()",
        )
        .parse()
        .unwrap();
    let id = s.connection_id();
    start_crashing_statement(&mut s);
    let incident = Incident::start(&server.0);
    let mut watch = server.0.session();
    for _ in 0..200 {
        let sleeping = watch.query_row(&format!(
            "SELECT COUNT(*) FROM performance_schema.threads WHERE THREAD_OS_ID = {tid} \
             AND PROCESSLIST_STATE = 'User sleep'"
        ));
        if sleeping == "1" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let ns_pid = *ns_pids(Path::new(&format!("/proc/{pid}"))).last().unwrap();
    let host_tid = myprobe::process::tids::TidMap::new(pid)
        .host(tid)
        .unwrap_or_else(|| panic!("no thread of {pid} is {tid} in its namespace"));
    crash_server(pid, host_tid);
    let error_log = dir.join("db/error.log");
    let core = core_file_in(&dir.join("db/data"), ns_pid);
    assert!(core.exists(), "no core at {}", core.display());
    mysql_s_report_is_resolved_under_its_root(&error_log, &root);
    mysql_s_core_names_the_statement_s_frames(&dir, &core, &root, tid);
    mysql_s_core_names_the_connections(&core, &root, tid, id, &incident);
}

/// The error log's report, resolved with the server's filesystem (`--root`) and, saying so, without it.
fn mysql_s_report_is_resolved_under_its_root(error_log: &Path, root: &str) {
    // The report without the server's filesystem: the host's mysqld is another binary, and it says so.
    let run = myprobe()
        .args(["stacks", "--resolve"])
        .arg(error_log)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(err.contains("--root"), "{err}");

    let run = myprobe()
        .args(["stacks", "--resolve"])
        .arg(error_log)
        .args(["--root", root])
        .output()
        .unwrap();
    let out = assert_crash_resolved(&run);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("MySQL crash report"), "{err}");
    // The addresses libbacktrace could not name are placed in their binaries: none is left bare.
    assert!(
        !out.lines().skip(1).any(|l| l.trim().starts_with("0x")),
        "{out}"
    );
    assert!(
        out.contains("mysqld+0x") && out.contains("libc.so.6+0x"),
        "{out}"
    );
}

/// The core: the same thread (as its namespace numbers it), unwound through the signal handler to the statement
/// and the thread's start.
fn mysql_s_core_names_the_statement_s_frames(dir: &Path, core: &Path, root: &str, tid: u32) {
    let json = dir.join("core.json");
    let run = myprobe()
        .args(["stacks", "--core"])
        .arg(core)
        .args(["--root", root, "-o"])
        .arg(&json)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(
        err.contains(&format!("dumped on SIGSEGV (thread {tid})")),
        "{err}"
    );
    assert!(!err.contains("warning"), "{err}");
    let threads: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let crashed: Vec<&str> = threads
        .iter()
        .find(|t| t["tid"] == tid)
        .unwrap_or_else(|| panic!("no thread {tid}: {threads:?}"))["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    let at = |name: &str| {
        crashed
            .iter()
            .position(|f| *f == name)
            .unwrap_or_else(|| panic!("no {name} in {crashed:?}"))
    };
    assert!(at("handle_fatal_signal") < at("Item_func_sleep::val_int"));
    assert!(at("Item_func_sleep::val_int") < at("sp_head::execute_procedure"));
    assert!(at("sp_head::execute_procedure") < at("do_command"));
    // Most threads wait in InnoDB or the server's own loops: named through the root's libraries.
    let named_threads = threads
        .iter()
        .filter(|t| {
            t["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f == "do_command" || f == "fil_aio_wait")
        })
        .count();
    assert!(named_threads >= 2, "{threads:?}");
}

/// The connections, read from the core's memory (and from the root's binary, what the core left out): the crashed
/// one's statement, the procedure's, by its user from its host, in the procedure's database, on the thread that
/// crashed (by its id in the server's namespace, as the core has it).
fn mysql_s_core_names_the_connections(
    core: &Path,
    root: &str,
    tid: u32,
    id: u64,
    incident: &Incident,
) {
    let run = myprobe()
        .args(["stacks", "--core"])
        .arg(core)
        .args(["--root", root])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    let line = connection_line(&out, id);
    assert!(
        line.contains(" root@localhost (crash, Query, ")
            && line.ends_with(&format!(
                ", thread {tid}, which crashed: SELECT SLEEP(?) INTO @slept"
            )),
        "{line}"
    );
    // And the others, as the server held them when it crashed.
    incident.assert_shown(&out);
}

#[test]
fn mysql_with_performance_schema_off_shows_its_statements_from_memory() {
    // Its process list names no thread for a statement: `stacks` reads the statements from the server's memory,
    // and `queries` the one running when tracing began, as with performance_schema on.
    let Some(db) = server_or_skip("mysql-9.7") else {
        return;
    };
    let dir = tempdir("servers-pfs-off");
    let server = db.start_another_with(
        &dir.join("db"),
        &[
            ("MYPROBE_TESTDB_SERVER", "mysql-9.7"),
            ("MYPROBE_TESTDB_INIT", "1"),
        ],
        &["--performance-schema=OFF", "--innodb-buffer-pool-size=16M"],
    );
    let pid = server.0.pid.to_string();
    let mut s = server.0.session();
    let id = s.connection_id();
    s.send("SELECT SLEEP(30), 'performance_schema off'");
    server.0.wait_for(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP(30), %' \
         AND STATE = 'User sleep'",
    );
    let run = myprobe().args(["stacks", "-p", &pid]).output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(run.status.success(), "{err}");
    assert!(err.contains("performance_schema off"), "{err}");
    let line = connection_line(&out, id);
    assert!(
        line.starts_with(&format!("  connection {id} root@localhost (Query, "))
            && line.ends_with(": SELECT SLEEP(?), ?"),
        "{line}"
    );
    assert!(out.contains("statement: SELECT SLEEP(?), ?"), "{out}");
    let tracer = Background::start(
        &["queries", "-p", &pid, "--json", "-d", "2"],
        "tracing the statements",
    );
    let (out, err) = tracer.wait();
    let records = json_lines(&out);
    let mine: Vec<_> = records.iter().filter(|r| r["conn"] == id).collect();
    assert_eq!(mine.len(), 1, "{records:?}\n{err}");
    assert_eq!(
        (
            &mine[0]["query"],
            &mine[0]["before_tracing"],
            &mine[0]["in_flight"]
        ),
        (
            &serde_json::json!("SELECT SLEEP(?), ?"),
            &serde_json::json!(true),
            &serde_json::json!(true)
        ),
        "{}",
        mine[0]
    );
}

#[test]
fn with_several_servers_report_and_stacks_say_which_they_read_and_all_reads_every_one() {
    // Alone: the servers running are the ones the tests started, no other test's coming or going.
    servers_alone();
    let servers = every_server();
    if servers.len() < 2 {
        eprintln!("skipped: one server runs");
        return;
    }
    let run = |args: &[&str]| {
        let out = myprobe().args(args).output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(out.status.success(), "{args:?}: {stderr}");
        (stdout, stderr)
    };
    let (_, stderr) = run(&["stacks", "--no-sql"]);
    assert!(
        stderr.contains(" servers run; reading ")
            && stderr.contains("the busiest")
            && stderr.contains("--all every one"),
        "{stderr}"
    );
    let (out, _) = run(&["stacks", "--all", "--no-sql"]);
    for (kind, db) in &servers {
        assert!(
            out.lines()
                .any(|l| l.starts_with("== ") && l.contains(&format!("(PID {},", db.pid))),
            "{kind}: no heading for PID {} in:\n{out}",
            db.pid
        );
    }
    let dir = tempdir("report-all");
    let page = dir.join("r.html");
    run_ok(myprobe().args(["report", "--all", "-d", "2", "-o", page.to_str().unwrap()]));
    for (kind, db) in &servers {
        let html = std::fs::read_to_string(dir.join(format!("r-{}.html", db.pid)))
            .unwrap_or_else(|e| panic!("{kind}: no report of PID {}: {e}", db.pid));
        assert!(html.contains(&format!("PID {}", db.pid)), "{kind}");
    }
}
