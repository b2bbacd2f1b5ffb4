//! `myprobe stacks`: every thread read from BPF while the process runs on; a C fixture with threads in known
//! states (and a deadlock), and a real server with waits of each kind.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use crate::common::*;
use myprobe::client::{Client, ConnectArgs, Environment};
use serde_json::Value;

/// The fixture of tests/fixtures/stacks/states.c, started: its process and the thread ids it printed (holder,
/// deadlocked a and b, waiter).
fn states_fixture(dir: &std::path::Path) -> (std::process::Child, [u32; 4]) {
    let exe = compile_fixture(dir, "states", &["stacks/states.c"], &["-pthread"]);
    let mut child = Command::new(&exe)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the fixture");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"ready"), "{line}");
    let tids: Vec<u32> = words[1..].iter().map(|w| w.parse().unwrap()).collect();
    (child, tids.try_into().unwrap())
}

/// Runs `cmd`, which must fail with one line on stderr that says `says`.
fn fails_in_one_line(cmd: &mut Command, says: &str) {
    let run = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{cmd:?} succeeded");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(says), "{err}");
}

fn threads_json(pid: u32, extra: &[&str], env: &[(&str, &str)]) -> (Vec<Value>, String) {
    let dir = tempdir("stacks-json");
    let out = dir.join("threads.json");
    let run = myprobe()
        .envs(env.iter().copied())
        .args([
            "stacks",
            "--any-process",
            "--no-sql",
            "-p",
            &pid.to_string(),
            "-o",
        ])
        .arg(&out)
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "{err}");
    let threads: Vec<Value> = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    (threads, err)
}

fn with_frame<'a>(threads: &'a [Value], function: &str) -> Vec<&'a Value> {
    threads
        .iter()
        .filter(|t| {
            t["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f.as_str().unwrap_or_default() == function)
        })
        .collect()
}

fn of_tid(threads: &[Value], tid: u32) -> &Value {
    threads
        .iter()
        .find(|t| t["tid"] == tid)
        .unwrap_or_else(|| panic!("no thread {tid}: {threads:?}"))
}

#[test]
fn threads_in_known_states_are_read_without_stopping_them() {
    threads_in_known_states(&[]);
}

#[test]
fn without_bpf_loop_the_compat_build_reads_the_same_threads() {
    // Kernels before 5.18 have no sleepable iterators: the compat build's iterator reads each thread's registers,
    // and myprobe its stack and futex words from /proc/PID/mem, unwound by the same tables.
    threads_in_known_states(&[("MYPROBE_DISABLE", "bpf_loop")]);
}

fn threads_in_known_states(env: &[(&str, &str)]) {
    let dir = tempdir("stacks-states");
    let started = std::time::Instant::now();
    let (mut child, [holder, a, b, waiter]) = states_fixture(&dir);
    let (threads, err) = threads_json(child.id(), &[], env);
    // main, and seven threads.
    assert_eq!(threads.len(), 8, "{threads:?}\n{err}");
    assert!(err.contains("none stopped"), "{err}");

    let spinning = with_frame(&threads, "spin_forever");
    assert_eq!(spinning.len(), 1, "{threads:?}");
    assert_eq!(spinning[0]["state"], "R", "{}", spinning[0]);

    let sleeping = with_frame(&threads, "sleep_forever");
    assert_eq!(sleeping.len(), 1, "{threads:?}");
    assert_eq!(sleeping[0]["state"], "S");
    assert_eq!(
        sleeping[0]["syscall"], "clock_nanosleep()",
        "{}",
        sleeping[0]
    );
    // It has slept since the fixture started, and not for longer.
    let idle_ms = sleeping[0]["idle_ms"].as_f64().unwrap();
    assert!(
        (100.0..started.elapsed().as_secs_f64() * 1000.0).contains(&idle_ms),
        "{}",
        sleeping[0]
    );

    let reading = with_frame(&threads, "read_pipe_forever");
    assert_eq!(reading.len(), 1, "{threads:?}");
    assert!(
        reading[0]["syscall"]
            .as_str()
            .unwrap()
            .starts_with("read(fd "),
        "{}",
        reading[0]
    );

    // Who holds what, from the glibc mutexes' owner field.
    let w = of_tid(&threads, waiter);
    assert_eq!(w["waits"]["kind"], "mutex", "{w}");
    assert_eq!(w["waits"]["owner"], holder, "{w}");
    assert_eq!(w["waits"]["lock"], "held", "the mutex's variable: {w}");
    assert!(with_frame(&threads, "wait_for_held")
        .iter()
        .any(|t| t["tid"] == waiter));
    assert_eq!(of_tid(&threads, a)["waits"]["owner"], b);
    assert_eq!(of_tid(&threads, b)["waits"]["owner"], a);
    assert!(of_tid(&threads, holder)["waits"].is_null());

    // The text view: the deadlock with both threads, and the waiter's line.
    let text = myprobe()
        .envs(env.iter().copied())
        .args([
            "stacks",
            "--any-process",
            "--no-sql",
            "-p",
            &child.id().to_string(),
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    let deadlock = out
        .split("DEADLOCK: 2 threads wait for each other:")
        .nth(1)
        .unwrap_or_else(|| panic!("no deadlock reported:\n{out}"));
    for (t, function) in [(a, "take_first_then_second"), (b, "take_second_then_first")] {
        assert!(deadlock.contains(&format!("thread {t} ")), "{out}");
        assert!(deadlock.contains(function), "{out}");
    }
    assert!(out.contains(&format!("held by thread {holder}")), "{out}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_server_s_waits_are_shown_with_their_statements() {
    let db = testdb();
    db.sql(
        "CREATE TABLE IF NOT EXISTS sbtest.stackrow (id INT PRIMARY KEY, v INT) ENGINE=InnoDB; \
         REPLACE INTO sbtest.stackrow VALUES (1, 0); \
         CREATE TABLE IF NOT EXISTS sbtest.stackmdl (id INT PRIMARY KEY) ENGINE=InnoDB",
    );
    let mut sleeper = db.session();
    let mut row_holder = db.session();
    let mut row_waiter = db.session();
    let mut mdl_holder = db.session();
    let mut mdl_waiter = db.session();
    let _idle: Vec<_> = (0..5).map(|_| db.session()).collect();
    let (sleep_tid, row_tid, mdl_tid) = (
        sleeper.server_tid(),
        row_waiter.server_tid(),
        mdl_waiter.server_tid(),
    );
    let row_connection = row_waiter.connection_id();
    let (row_holder_id, mdl_holder_id) = (row_holder.connection_id(), mdl_holder.connection_id());
    sleeper.send("SELECT SLEEP(30)");
    row_holder.exec("BEGIN; SELECT v FROM sbtest.stackrow WHERE id = 1 FOR UPDATE");
    row_waiter.send("UPDATE sbtest.stackrow SET v = v + 1 WHERE id = 1; SELECT 'updated'");
    mdl_holder.exec("LOCK TABLES sbtest.stackmdl WRITE");
    mdl_waiter.send("SELECT COUNT(*) FROM sbtest.stackmdl");
    // Each where the test wants it, however long it took to get there.
    db.wait_for_state(sleep_tid, "User sleep");
    db.wait_for_state(mdl_tid, "Waiting for table metadata lock");
    db.wait_for_row_lock_wait(&format!("thread id {row_connection},"));

    let pid = db.pid.to_string();
    let socket = db.socket.to_str().unwrap().to_string();
    let run = myprobe()
        .args(["stacks", "-p", &pid, "--socket", &socket, "--user", "root"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout).into_owned();
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "{err}");
    let dir = tempdir("stacks-server");
    let json = dir.join("threads.json");
    let run = myprobe()
        .args([
            "stacks", "-p", &pid, "--socket", &socket, "--user", "root", "-o",
        ])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let threads: Vec<Value> = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();

    row_holder.exec("COMMIT");
    mdl_holder.exec("UNLOCK TABLES");
    assert_eq!(row_waiter.read_line(), "updated");
    assert_eq!(mdl_waiter.read_line(), "0");
    drop(sleeper);

    let s = of_tid(&threads, sleep_tid);
    assert_eq!(s["statement"], "SELECT SLEEP(?)", "{s}");
    assert!(
        s["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str().unwrap().contains("sleep")),
        "{s}"
    );
    let r = of_tid(&threads, row_tid);
    assert_eq!(
        r["statement"], "UPDATE sbtest.stackrow SET v = v + ? WHERE id = ?",
        "{r}"
    );
    assert!(!r["waits"].is_null(), "{r}");
    let m = of_tid(&threads, mdl_tid);
    assert_eq!(
        m["statement"], "SELECT COUNT(*) FROM sbtest.stackmdl",
        "{m}"
    );
    assert_eq!(m["waits"]["kind"], "metadata lock", "{m}");
    // Why each waits, and who holds it: InnoDB's lock waits, and LOCK TABLES's metadata lock read from the
    // server's memory.
    assert_eq!(r["cause"]["cause"], "row lock", "{r}");
    assert_eq!(r["cause"]["holder"]["conn"], row_holder_id, "{r}");
    assert_eq!(m["cause"]["cause"], "table lock", "{m}");
    assert_eq!(m["cause"]["holder"]["conn"], mdl_holder_id, "{m}");
    // The merged view names the three statements and the waits, in a DBA's words.
    for needle in [
        "statement: SELECT SLEEP(?)",
        "statement: UPDATE sbtest.stackrow SET v = v + ? WHERE id = ?",
        "statement: SELECT COUNT(*) FROM sbtest.stackmdl",
        "sleeps in SLEEP()",
        &format!("waits for a row lock on sbtest.stackrow (PRIMARY, X) held by connection {row_holder_id} "),
        &format!(
            "waits for a table lock on sbtest.stackmdl (SHARED_NO_READ_WRITE) held by connection {mdl_holder_id} "
        ),
    ] {
        assert!(out.contains(needle), "{needle:?} not in:\n{out}");
    }
}

#[test]
fn bad_input_is_one_clear_line() {
    let run = myprobe()
        .args(["stacks", "-p", "999999", "--no-sql"])
        .output()
        .unwrap();
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("no process with PID 999999"), "{err}");
    let run = myprobe()
        .args(["stacks", "--no-sql", "-o", "x.svg"])
        .output()
        .unwrap();
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains(".folded, .txt or .json"));
    // Text without a stack, from a file and from stdin.
    let dir = tempdir("stacks-bad");
    let text = dir.join("notes.txt");
    std::fs::write(&text, "The server was slow on Monday.\nNothing crashed.\n").unwrap();
    fails_in_one_line(
        myprobe().args(["stacks", "--resolve"]).arg(&text),
        "no stack found",
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_myprobe"))
        .args(["stacks", "--resolve", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdin.take());
    let run = child.wait_with_output().unwrap();
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("no stack found in stdin"));
}

#[test]
fn gdb_text_is_named_and_merged_like_pt_pmp() {
    crate::common::servers_alone();
    // gdb's `thread apply all bt` of the fixture, through stdin: its threads merged by stack, named as gdb named
    // them without arguments, offsets or inlined-frame duplicates of gdb's own.
    let dir = tempdir("stacks-gdb-text");
    let (mut child, [holder, a, b, waiter]) = states_fixture(&dir);
    let gdb = Command::new("gdb")
        .args(["-batch", "-nx", "-p"])
        .arg(child.id().to_string())
        .args(["-ex", "thread apply all bt"])
        .output()
        .expect("running gdb");
    let _ = child.kill();
    let _ = child.wait();
    let mut resolve = Command::new(env!("CARGO_BIN_EXE_myprobe"))
        .args(["stacks", "--resolve", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut resolve.stdin.take().unwrap(), &gdb.stdout).unwrap();
    let run = resolve.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(err.contains("8 threads of stdin (gdb)"), "{err}");
    for tid in [holder, a, b, waiter] {
        assert!(out.contains(&format!(" {tid}")), "no thread {tid}:\n{out}");
    }
    for f in STATES_FUNCTIONS {
        assert!(out.lines().any(|l| l.trim() == f), "no frame {f}:\n{out}");
    }
    assert!(!out.contains("(arg="), "{out}");
    assert!(!out.contains(" at "), "{out}");

    // The real server's idle connections: one stack, counted.
    let db = testdb();
    let mut sessions: Vec<Session> = (0..3).map(|_| db.session()).collect();
    let tids: Vec<u32> = sessions.iter_mut().map(|s| s.server_tid()).collect();
    let gdb = Command::new("gdb")
        .args(["-batch", "-nx", "-p"])
        .arg(db.pid.to_string())
        .args(["-ex", "thread apply all bt"])
        .output()
        .expect("running gdb");
    let text = dir.join("server.txt");
    std::fs::write(&text, &gdb.stdout).unwrap();
    let folded = dir.join("server.folded");
    let run = myprobe()
        .args(["stacks", "--resolve"])
        .arg(&text)
        .arg("-o")
        .arg(&folded)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stacks = read_folded(&folded);
    let idle = value_with_frame(&stacks, |f| f == "do_command");
    assert!(
        stacks.iter().any(|(frames, n)| *n >= tids.len() as u64 && frames.iter().any(|f| f == "do_command")),
        "the {} idle connections ({tids:?}) are not one stack ({idle} threads in do_command): {stacks:?}",
        tids.len()
    );
    drop(sessions);
}

#[test]
fn a_thousand_idle_connections_are_one_stack() {
    let db = testdb();
    let dir = tempdir("stacks-thousand");
    let server = db.start_another(&dir, &["--max-connections=1100", "--open-files-limit=4000"]);
    // The test's own descriptors: one per connection.
    let limit = libc::rlimit {
        rlim_cur: 4096,
        rlim_max: 4096,
    };
    // SAFETY: setrlimit reads the struct only.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    let opts = mysql::OptsBuilder::new()
        .socket(Some(server.0.socket.to_str().unwrap()))
        .user(Some("root"));
    let connections: Vec<mysql::Conn> = (0..1000)
        .map(|i| mysql::Conn::new(opts.clone()).unwrap_or_else(|e| panic!("connection {i}: {e}")))
        .collect();
    let started = std::time::Instant::now();
    let run = myprobe()
        .args(["stacks", "--no-sql", "-p", &server.0.pid.to_string()])
        .output()
        .unwrap();
    let took = started.elapsed();
    drop(connections);
    let out = String::from_utf8_lossy(&run.stdout).into_owned();
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "{err}");
    // Every connection's thread waits for its client at the same place: the first stack, with all of them.
    let first = out.split("\n\n").next().unwrap();
    assert!(first.starts_with("1000 threads: "), "{out}\n{err}");
    assert!(first.contains("do_command"), "{first}");
    eprintln!("1,000 idle connections read in {took:?}, symbolization included: {err}");
}

/// The fixture's own functions: the frames of its binary that gdb and myprobe must both give.
const STATES_FUNCTIONS: [&str; 8] = [
    "main",
    "spin_forever",
    "sleep_forever",
    "read_pipe_forever",
    "hold_and_sleep",
    "wait_for_held",
    "take_first_then_second",
    "take_second_then_first",
];

/// gdb's `thread apply all bt` of `core`: per thread id, its function names innermost first.
fn gdb_backtraces(exe: &std::path::Path, core: &std::path::Path) -> Vec<(u32, Vec<String>)> {
    let out = Command::new("gdb")
        .args(["-batch", "-nx", "-ex", "thread apply all bt"])
        .arg(exe)
        .arg(core)
        .output()
        .expect("running gdb");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut threads: Vec<(u32, Vec<String>)> = Vec::new();
    for line in text.lines() {
        // Thread 8 (Thread 0x7f… (LWP 2647)):
        let header = line
            .starts_with("Thread ")
            .then(|| line.split("(LWP ").nth(1));
        if let Some(lwp) = header.flatten() {
            let tid = lwp.split(')').next().unwrap().parse().unwrap();
            threads.push((tid, Vec::new()));
        } else if let (Some(rest), Some(t)) = (line.strip_prefix('#'), threads.last_mut()) {
            // #4  0x0000558cb41833b2 in wait_for_held (arg=…) at …   or   #0  spin_forever (arg=0x0) at …
            let words: Vec<&str> = rest.split_whitespace().collect();
            let name = match words.iter().position(|&w| w == "in") {
                Some(i) if words[1].starts_with("0x") => words[i + 1],
                _ => words[1],
            };
            t.1.push(name.to_string());
        }
    }
    assert!(!threads.is_empty(), "gdb printed no threads:\n{text}");
    threads
}

fn frames_of(thread: &Value) -> Vec<String> {
    thread["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_core_file_gives_the_frames_gdb_gives_and_the_deadlock() {
    let dir = tempdir("stacks-core");
    let (mut child, [holder, a, b, waiter]) = states_fixture(&dir);
    let pid = child.id();
    let gcore = Command::new("gcore")
        .arg("-o")
        .arg(dir.join("core"))
        .arg(pid.to_string())
        .output()
        .expect("running gcore");
    let _ = child.kill();
    let _ = child.wait();
    let core = dir.join(format!("core.{pid}"));
    assert!(
        gcore.status.success() && core.exists(),
        "gcore failed: {}",
        String::from_utf8_lossy(&gcore.stderr)
    );
    let exe = dir.join("states");

    let json = dir.join("core.json");
    let run = myprobe()
        .args(["stacks", "--any-process", "--core"])
        .arg(&core)
        .arg("-o")
        .arg(&json)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(!err.contains("warning"), "{err}");
    let threads: Vec<Value> = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();

    let gdb = gdb_backtraces(&exe, &core);
    assert_eq!(threads.len(), gdb.len(), "threads in the core");
    let own = |frames: &[String]| -> Vec<String> {
        frames
            .iter()
            .filter(|f| STATES_FUNCTIONS.contains(&f.as_str()))
            .cloned()
            .collect()
    };
    for (tid, gdb_frames) in &gdb {
        let ours = frames_of(of_tid(&threads, *tid));
        assert!(!own(gdb_frames).is_empty(), "gdb: {gdb_frames:?}");
        assert_eq!(own(&ours), own(gdb_frames), "thread {tid}: ours {ours:?}");
        // Unwound to the thread's first frame.
        let root = ours.last().map(String::as_str);
        assert!(
            matches!(root, Some("_start" | "__clone3")),
            "thread {tid}: {ours:?}"
        );
    }
    let waiting = of_tid(&threads, waiter);
    assert_eq!(waiting["waits"]["owner"], holder, "{waiting}");
    assert_eq!(waiting["waits"]["lock"], "held", "{waiting}");
    assert!(waiting["state"].is_null(), "no scheduler state in a core");

    let text = myprobe()
        .args(["stacks", "--any-process", "--core"])
        .arg(&core)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&text.stdout);
    let deadlock = out
        .split("DEADLOCK: 2 threads wait for each other:")
        .nth(1)
        .unwrap_or_else(|| panic!("no deadlock:\n{out}"));
    for tid in [a, b] {
        assert!(deadlock.contains(&format!("thread {tid} ")), "{deadlock}");
    }

    // The core's binary given again, and another binary instead: checked by build-id.
    let same = myprobe()
        .args(["stacks", "--any-process", "--core"])
        .arg(&core)
        .arg("--exe")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        same.status.success(),
        "{}",
        String::from_utf8_lossy(&same.stderr)
    );
    let other = compile_fixture(&dir, "other", &["unwind/replay_threads.c"], &["-pthread"]);
    fails_in_one_line(
        myprobe()
            .args(["stacks", "--any-process", "--core"])
            .arg(&core)
            .arg("--exe")
            .arg(&other),
        "is not the binary this core was dumped from",
    );
    // Without --any-process: the core of a program that is no server.
    fails_in_one_line(
        myprobe().args(["stacks", "--core"]).arg(&core),
        "not of a MySQL or MariaDB server",
    );

    // Truncated, and not a core at all.
    let bytes = std::fs::read(&core).unwrap();
    let cut = dir.join("core.cut");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    for (file, says) in [
        (cut.as_path(), "the core is truncated"),
        (exe.as_path(), "not a core file"),
        (dir.join("core.json").as_path(), "not an ELF file"),
    ] {
        fails_in_one_line(
            myprobe()
                .args(["stacks", "--any-process", "--core"])
                .arg(file),
            says,
        );
    }
}

#[test]
fn a_crashed_server_s_report_and_core_name_the_statement_and_its_frames() {
    let db = testdb();
    let dir = tempdir("stacks-crash");
    let server = db.start_another(&dir.join("db"), &["--core-file"]);
    let pid = server.0.pid;
    allow_cores(pid);

    // A prepared statement calling a stored procedure that sleeps: the crash is in that thread.
    let mut s = server.0.session();
    let tid = s.server_tid();
    let id = s.connection_id();
    start_crashing_statement(&mut s);
    let incident = Incident::start(&server.0);
    let mut watch = server.0.session();
    for _ in 0..200 {
        let state = watch.query_row(&format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE TID = {tid} AND STATE = 'User sleep'"
        ));
        if state == "1" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    crash_server(pid, tid);
    let error_log = dir.join("db/error.log");
    let core = core_file_in(&dir.join("db/data"), pid);
    assert!(core.exists(), "no core at {}", core.display());

    the_error_log_s_report_is_resolved(&error_log);
    the_core_s_crashed_thread_is_unwound_to_the_statement(&dir, &core, tid);
    the_core_s_summary_and_connections_name_the_crash(&core, tid, id, &incident);
    a_cut_core_is_refused_or_shows_only_what_ran(&dir, &core);
}

/// The error log's crash report, resolved.
fn the_error_log_s_report_is_resolved(error_log: &Path) {
    let run = myprobe()
        .args(["stacks", "--resolve"])
        .arg(error_log)
        .output()
        .unwrap();
    let out = assert_crash_resolved(&run);
    // No offsets left but the places of functions without a symbol in the stripped server.
    for line in out.lines().skip(1).filter(|l| l.contains("+0x")) {
        assert!(line.trim().starts_with("mariadbd+0x"), "{line}\n{out}");
    }
}

/// The core: the same thread, unwound through the signal handler's frame to the statement's.
fn the_core_s_crashed_thread_is_unwound_to_the_statement(dir: &Path, core: &Path, tid: u32) {
    let json = dir.join("core.json");
    let run = myprobe()
        .args(["stacks", "--core"])
        .arg(core)
        .arg("-o")
        .arg(&json)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(
        err.contains(&format!("dumped on SIGSEGV (thread {tid})")),
        "{err}"
    );
    let threads: Vec<Value> = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let crashed = frames_of(of_tid(&threads, tid));
    let at = |name: &str| {
        crashed
            .iter()
            .position(|f| f == name)
            .unwrap_or_else(|| panic!("no {name} in {crashed:?}"))
    };
    assert!(
        at("handle_fatal_signal") < at("__restore_rt"),
        "{crashed:?}"
    );
    assert!(
        at("__restore_rt") < at("Item_func_sleep::val_int"),
        "{crashed:?}"
    );
    assert!(at("Item_func_sleep::val_int") < at("sp_head::execute_procedure"));
    assert!(at("sp_head::execute_procedure") < at("do_command"));
}

/// The core's summary line names the crash and where it happened; its connections are the server's.
fn the_core_s_summary_and_connections_name_the_crash(
    core: &Path,
    tid: u32,
    id: u64,
    incident: &Incident,
) {
    let run = myprobe()
        .args(["stacks", "--core"])
        .arg(core)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    let summary = out.lines().next().unwrap_or_default();
    for element in [
        "SIGSEGV in ",
        "stored routine depth 1",
        "prepared statement",
        "Item_func_sleep",
    ] {
        assert!(summary.contains(element), "no {element} in: {summary}");
    }
    assert!(summary.ends_with(&format!("(thread {tid})")), "{summary}");
    // The connections, read from the core's memory as seed 003's gdb macro reads them: the crashed one's
    // statement, the procedure's, as the server held it, by the user and in the database it runs in, on the
    // thread that crashed.
    let line = connection_line(&out, id);
    assert!(
        line.contains("root@localhost (crash, Query, ")
            && line.ends_with(&format!(
                ", thread {tid}, which crashed: SELECT SLEEP(?) INTO @slept"
            )),
        "{line}"
    );
    // And the others, as the server held them when it crashed.
    incident.assert_shown(&out);
}

/// The same core cut short (a disk that filled, a copy stopped), at points from its end to its headers: refused
/// in a line that says so, never a panic, and never a statement the server did not run.
fn a_cut_core_is_refused_or_shows_only_what_ran(dir: &Path, core: &Path) {
    let cut = dir.join("cut.core");
    std::fs::copy(core, &cut).unwrap();
    let len = std::fs::metadata(&cut).unwrap().len();
    for fraction in [0.999, 0.9, 0.6, 0.3, 0.05, 0.001] {
        let file = std::fs::OpenOptions::new().write(true).open(&cut).unwrap();
        file.set_len((len as f64 * fraction) as u64).unwrap();
        drop(file);
        let run = myprobe()
            .args(["stacks", "--core"])
            .arg(&cut)
            .output()
            .unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr),
        );
        assert!(!err.contains("panicked"), "{fraction}: {err}");
        if !run.status.success() {
            // Refused as a whole, saying why: its threads' stacks would be missing, not empty.
            assert!(err.contains("the core is truncated"), "{fraction}: {err}");
            continue;
        }
        for line in out.lines().filter(|l| l.starts_with("  connection ")) {
            assert!(
                line.ends_with(": SELECT SLEEP(?) INTO @slept")
                    || line.ends_with(": idle in its transaction"),
                "{fraction}: {line}\n{err}"
            );
        }
    }
}

#[test]
fn a_process_that_exits_during_the_snapshot_is_one_clear_line() {
    // Processes that exit at times spread over a snapshot's run (about 300 ms, mostly loading the program): every
    // run either shows the threads or says in one line that the process is gone, and never hangs.
    let mut gone = 0;
    for ms in (0..600).step_by(40) {
        let mut child = Command::new("sleep")
            .arg(format!("{}", ms as f64 / 1000.0))
            .spawn()
            .unwrap();
        let pid = child.id();
        // Reaped as soon as it exits: gone, not a zombie.
        let reaper = std::thread::spawn(move || child.wait());
        let run = myprobe()
            .args(["stacks", "--any-process", "--no-sql", "-p"])
            .arg(pid.to_string())
            .output()
            .unwrap();
        let _ = reaper.join();
        let err = String::from_utf8_lossy(&run.stderr);
        if run.status.success() {
            assert!(
                String::from_utf8_lossy(&run.stdout).contains("1 thread: "),
                "{err}"
            );
            continue;
        }
        gone += 1;
        assert_eq!(err.lines().count(), 1, "after {ms} ms: {err}");
        assert!(
            err.contains("exited during the snapshot")
                || err.contains("no process with PID")
                || err.contains("exited"),
            "after {ms} ms: {err}"
        );
    }
    assert!(gone > 0, "no process exited before its snapshot ended");
}

/// SIGSTOP for a test's part; SIGCONT when dropped, also when the test fails.
struct Stopped(u32);

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

#[test]
fn a_stopped_server_s_statements_are_read_from_its_memory() {
    // A hung server answers no SQL: the statements its connections run are read from its memory, on each server,
    // whatever else its connections do: one sleeps, one holds a row lock in its open transaction, one waits for
    // that lock, one is idle in a transaction, and 200 are idle.
    servers_alone();
    let servers = crate::common::every_server();
    for (kind, db) in &servers {
        let connections = Connections::open(kind, db);
        let out = {
            // SAFETY: as in Stopped's drop.
            assert_eq!(unsafe { libc::kill(db.pid as i32, libc::SIGSTOP) }, 0);
            let _stopped = Stopped(db.pid);
            myprobe()
                .args(["stacks", "-p", &db.pid.to_string(), "--no-sql"])
                .output()
                .unwrap()
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{kind}: {stderr}");
        let section = stdout
            .split_once("connections read from the server's memory: ")
            .unwrap_or_else(|| panic!("{kind}: no connections read: {stdout}\n{stderr}"))
            .1;
        memory_counts_the_connections(kind, section, &stderr);
        memory_shows_the_idle_in_transaction(kind, section, &connections);
        memory_shows_the_running_statements(kind, db, &stdout, section, &stderr, &connections);
        connections.close(db);
    }
}

/// The connections of `a_stopped_server_s_statements_are_read_from_its_memory`, each doing what it says.
struct Connections {
    /// (its session, its id, its statement, who it is as PROCESSLIST says).
    running: Vec<(Session, u64, String, String)>,
    holder: Session,
    holder_id: u64,
    in_transaction: Session,
    in_transaction_id: u64,
    idle: Vec<Client>,
    max_connections: String,
}

impl Connections {
    fn open(kind: &str, db: &TestDb) -> Connections {
        let mut running = Vec::new();
        for i in 0..3 {
            let mut session = db.session_in(Some("sbtest"));
            let id = session.connection_id();
            let text = format!("SELECT SLEEP(30), 'myprobe-memory-{kind}-{i}'");
            session.send(&text);
            running.push((session, id, text));
        }
        let mut holder = db.session_in(Some("sbtest"));
        let holder_id = holder.connection_id();
        holder.query_row("BEGIN; UPDATE sbtest1 SET k = k + 1 WHERE id = 7; SELECT 'held'");
        let mut waiter = db.session_in(Some("sbtest"));
        let waiter_id = waiter.connection_id();
        let wait =
            "UPDATE sbtest1 SET k = k + 1 WHERE id = 7 AND 'myprobe-waiter' <> ''".to_string();
        waiter.send(&wait);
        running.push((waiter, waiter_id, wait));
        let mut in_transaction = db.session_in(Some("sbtest"));
        let in_transaction_id = in_transaction.connection_id();
        in_transaction.query_row("BEGIN; SELECT COUNT(*) FROM sbtest1 WHERE id < 10");
        let settings = ConnectArgs {
            socket: Some(db.socket.clone()),
            user: Some("root".into()),
            ..ConnectArgs::default()
        }
        .settings_in(&Environment::current(), Some(db.pid))
        .unwrap();
        let max_connections = db.sql("SELECT @@GLOBAL.max_connections");
        db.sql("SET GLOBAL max_connections = 400");
        let idle: Vec<Client> = (0..200)
            .map(|_| Client::connect(&settings).unwrap())
            .collect();
        let count = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP(30), %' OR \
                     INFO LIKE 'UPDATE sbtest1 SET k = k + 1 WHERE id = 7 AND %'";
        db.wait_until(count, || db.sql(count).trim() == "4");
        // Who each is, as PROCESSLIST says: its user and host (`localhost`, over the socket).
        let who = |id: u64| {
            db.sql(&format!(
                "SELECT CONCAT(USER, '@', HOST) FROM information_schema.PROCESSLIST WHERE ID = {id}"
            ))
            .trim()
            .to_string()
        };
        let running: Vec<_> = running
            .into_iter()
            .map(|(session, id, text)| (session, id, text, who(id)))
            .collect();
        Connections {
            running,
            holder,
            holder_id,
            in_transaction,
            in_transaction_id,
            idle,
            max_connections,
        }
    }

    fn close(self, db: &TestDb) {
        for (_, id, _, _) in &self.running {
            db.sql(&format!("KILL {id}"));
        }
        drop((self.holder, self.in_transaction, self.idle));
        db.sql(&format!(
            "SET GLOBAL max_connections = {}",
            self.max_connections.trim()
        ));
    }
}

/// These 4 running (myprobe's none: it asked nothing; an earlier test's statement may still run, its client
/// gone), the rest idle: the 200, the holder, the one in its transaction, and whatever else the server serves.
fn memory_counts_the_connections(kind: &str, section: &str, stderr: &str) {
    let (counts, _) = section.split_once('\n').unwrap_or((section, ""));
    let counted = counts
        .split_once(" running a statement, ")
        .and_then(|(running, idle)| {
            let (idle, in_transaction) = idle.split_once(" idle (")?;
            let in_transaction = in_transaction.strip_suffix(" in an open transaction)")?;
            Some((
                running.parse::<usize>().ok()?,
                idle.parse::<usize>().ok()?,
                in_transaction.parse::<usize>().ok()?,
            ))
        });
    assert!(
        counted.is_some_and(|(running, idle, in_transaction)| running >= 4
            && idle >= 202
            && in_transaction >= 2),
        "{kind}: {counts}\n{stderr}"
    );
}

/// The holder of the row lock, and the other in its transaction: idle, which is how a DBA finds who holds what
/// others wait for.
fn memory_shows_the_idle_in_transaction(kind: &str, section: &str, connections: &Connections) {
    for id in [connections.holder_id, connections.in_transaction_id] {
        let line = section
            .lines()
            .find(|l| l.starts_with(&format!("  connection {id} ")))
            .unwrap_or_else(|| panic!("{kind}: connection {id} not shown: {section}"));
        assert!(
            line.contains(" (sbtest, Sleep, ")
                && line.contains(" s, in a transaction), thread ")
                && line.ends_with(": idle in its transaction"),
            "{kind}: {line}"
        );
    }
}

/// Beside each statement, its user and host, database and command, as PROCESSLIST says them.
fn memory_shows_the_running_statements(
    kind: &str,
    db: &TestDb,
    stdout: &str,
    section: &str,
    stderr: &str,
    connections: &Connections,
) {
    let context = "sbtest, Query, ";
    // Its time in the command: whole seconds since it began, which is less than 30 s ago; then the server's
    // thread that serves it.
    let seconds = |line: &str| -> Option<u64> {
        let rest = line.strip_prefix(context)?;
        let (n, rest) = rest.split_once(" s), thread ")?;
        let (tid, _) = rest.split_once(": ")?;
        let tid: u32 = tid.parse().ok()?;
        std::path::Path::new(&format!("/proc/{}/task/{tid}", db.pid))
            .exists()
            .then_some(())?;
        n.parse().ok()
    };
    for (_, id, text, who) in &connections.running {
        let (prefix, statement) = (
            format!("  connection {id} {who} ("),
            format!(": {}", myprobe::wire::fingerprint::normalize(text)),
        );
        let line = section
            .lines()
            .find(|l| l.starts_with(&prefix) && l.ends_with(&statement))
            .unwrap_or_else(|| panic!("{kind}: no `{prefix}…{statement}` in {section}\n{stderr}"));
        assert!(
            seconds(&line[prefix.len()..]).is_some_and(|s| s < 30),
            "{kind}: `{line}` says no database, command, time and thread {context}N s), thread TID"
        );
        // And its thread's stack has it beside.
        assert!(
            stdout.contains(&format!("statement{statement}")),
            "{kind}: no thread runs `{statement}`: {stdout}"
        );
    }
}
