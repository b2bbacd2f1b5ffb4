//! Shared test helpers: the throwaway MariaDB that `make test` (scripts/run-tests) started, and the binary.
#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio},
};

/// The throwaway server described by the MYPROBE_TEST_* variables.
pub struct TestDb {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub pid: u32,
    testdb: PathBuf,
}

/// Tests run two at a time (scripts/run-tests) against the same servers. Those that use a server take it shared;
/// those that need it to themselves (they stop it, change a global setting, or measure what every connection
/// moves) take it alone, and wait for the others to end. Held until the test's thread ends.
static SERVERS: std::sync::RwLock<()> = std::sync::RwLock::new(());

enum Hold {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] std::sync::RwLockWriteGuard<'static, ()>),
}

thread_local! {
    static HELD: std::cell::RefCell<Option<Hold>> = const { std::cell::RefCell::new(None) };
}

/// Takes the servers shared (or `alone`) for the rest of the calling test, once. libtest runs each test on a
/// thread of its own when it runs several at once (the guard goes with the thread); on one thread, in turn,
/// there is nothing to hold.
fn hold_servers(alone: bool) {
    if std::thread::current().name() == Some("main") {
        return;
    }
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        match (&*held, alone) {
            (Some(Hold::Alone(_)), _) | (Some(Hold::Shared(_)), false) => {}
            (Some(Hold::Shared(_)), true) => {
                panic!("a test takes the servers alone before it uses them (servers_alone first)")
            }
            (None, false) => {
                *held = Some(Hold::Shared(
                    SERVERS.read().unwrap_or_else(|e| e.into_inner()),
                ))
            }
            (None, true) => {
                // scripts/run-tests runs the tests it found calling `servers_alone` apart, before the others.
                if std::env::var("MYPROBE_TEST_PASS").as_deref() == Ok("shared") {
                    panic!(
                        "a test that takes the servers alone calls servers_alone() first in its body, \
                         where scripts/run-tests finds it"
                    )
                }
                *held = Some(Hold::Alone(
                    SERVERS.write().unwrap_or_else(|e| e.into_inner()),
                ))
            }
        }
    });
}

/// The calling test has the test servers to itself (see `SERVERS`): call it first.
pub fn servers_alone() {
    hold_servers(true);
}

pub fn testdb() -> TestDb {
    hold_servers(false);
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} is not set: run the tests with `make test`, which starts a throwaway MariaDB for them")
        })
    };
    TestDb {
        dir: var("MYPROBE_TEST_DIR").into(),
        socket: var("MYPROBE_TEST_SOCKET").into(),
        pid: var("MYPROBE_TEST_PID")
            .parse()
            .expect("MYPROBE_TEST_PID is a number"),
        testdb: var("MYPROBE_TESTDB").into(),
    }
}

/// Every server the tests start, by kind: the host's MariaDB 10.11, then the others `make test` started.
pub fn every_server() -> Vec<(&'static str, TestDb)> {
    let mut servers = vec![("mariadb-10.11", testdb())];
    for kind in ["mariadb-11.8", "mysql-9.7"] {
        servers.extend(other_server(kind).map(|db| (kind, db)));
    }
    servers
}

/// The other servers `make test` started (`MYPROBE_TEST_SERVERS`: `KIND=DIR ...`, scripts/run-tests), by kind:
/// `mariadb-11.8`, `mysql-9.7`. None when the run was asked to start none of that kind; a panic when the
/// variable is not set at all.
pub fn other_server(kind: &str) -> Option<TestDb> {
    hold_servers(false);
    let servers = std::env::var("MYPROBE_TEST_SERVERS").unwrap_or_else(|_| {
        panic!("MYPROBE_TEST_SERVERS is not set: run the tests with `make test`, which starts the other servers")
    });
    let dir = servers
        .split_whitespace()
        .find_map(|s| s.strip_prefix(kind)?.strip_prefix('='))?;
    let env = std::fs::read_to_string(Path::new(dir).join("env"))
        .unwrap_or_else(|e| panic!("{kind}'s server in {dir} has no env file: {e}"));
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{dir}/env has no {name}: {env}"))
            .to_string()
    };
    Some(TestDb {
        dir: dir.into(),
        socket: var("MYPROBE_TEST_SOCKET").into(),
        pid: var("MYPROBE_TEST_PID").parse().unwrap(),
        testdb: testdb().testdb,
    })
}

/// The transactions a second of the tests' sysbench loads: a busy server, and CPU left for the tests that run
/// beside it (flat out, four threads took both of a 2-CPU host's CPUs, and a test's own work waited for them).
const LOAD_RATE: u32 = 200;

impl TestDb {
    /// Starts another throwaway server in `dir` with extra mariadbd options; it is stopped and removed on drop.
    pub fn start_another(&self, dir: &Path, options: &[&str]) -> OtherServer {
        self.start_another_binary(dir, None, options)
    }

    /// Stops this server (its directory stays; [`OtherServer`] removes it when dropped).
    pub fn stop(&self) {
        let out = Command::new(&self.testdb)
            .arg("stop")
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "stopping the server: {out:?}");
    }

    /// As [`TestDb::start_another`], running the server binary `binary` (default: the installed one).
    pub fn start_another_binary(
        &self,
        dir: &Path,
        binary: Option<&Path>,
        options: &[&str],
    ) -> OtherServer {
        let binary = binary.map(|b| ("MYPROBE_TESTDB_MARIADBD", b.to_str().unwrap()));
        self.start_another_with(dir, binary.as_slice(), options)
    }

    /// As [`TestDb::start_another`], with testdb's settings in `env` (`MYPROBE_TESTDB_SERVER`, …).
    pub fn start_another_with(
        &self,
        dir: &Path,
        env: &[(&str, &str)],
        options: &[&str],
    ) -> OtherServer {
        let out = Command::new(&self.testdb)
            .envs(env.iter().copied())
            .arg("start")
            .arg(dir)
            .args(options)
            .output()
            .expect("running testdb start");
        assert!(
            out.status.success(),
            "testdb start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env = String::from_utf8_lossy(&out.stdout).into_owned();
        let var = |name: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("testdb start printed no {name}: {env}"))
                .to_string()
        };
        OtherServer(TestDb {
            dir: dir.to_path_buf(),
            socket: var("MYPROBE_TEST_SOCKET").into(),
            pid: var("MYPROBE_TEST_PID").parse().unwrap(),
            testdb: self.testdb.clone(),
        })
    }

    /// Creates the sysbench tables (`tables` × `rows`), once.
    pub fn prepare(&self, tables: u32, rows: u32) {
        let out = Command::new(&self.testdb)
            .arg("prepare")
            .arg(&self.dir)
            .arg(tables.to_string())
            .arg(rows.to_string())
            .output()
            .unwrap();
        assert!(out.status.success(), "preparing sbtest: {out:?}");
    }

    /// Starts sysbench oltp_read_write against the server for `secs` seconds, in the background.
    pub fn load(&self, secs: u32) -> Load {
        self.load_workload(secs, "oltp_read_write")
    }

    /// Starts sysbench oltp_read_write for as long as the test needs (`Load::finish` ends it), and waits until
    /// it runs: however slow the host, its load covers what the test measures.
    pub fn running_load(&self) -> Load {
        self.running_workload("oltp_read_write")
    }

    /// The same with the sysbench test `workload`.
    pub fn running_workload(&self, workload: &str) -> Load {
        let mut load = self.load_workload(600, workload);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let running = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'sbtest' AND COMMAND = 'Execute'";
        while self.sql(running).trim() == "0" {
            assert!(
                load.running() && std::time::Instant::now() < deadline,
                "sysbench did not start: {}",
                load.end()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        load
    }

    /// Starts the sysbench test `workload` (`oltp_write_only`, …) for `secs` seconds, in the background, at
    /// `LOAD_RATE`.
    pub fn load_workload(&self, secs: u32, workload: &str) -> Load {
        let child = Command::new(&self.testdb)
            .env("MYPROBE_TESTDB_WORKLOAD", workload)
            .env("MYPROBE_TESTDB_RATE", LOAD_RATE.to_string())
            .arg("load")
            .arg(&self.dir)
            .arg(secs.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting sysbench load");
        Load(Some(child))
    }

    /// The mariadb client, connecting to this server's socket as root, without TLS (every test server speaks
    /// it, and MariaDB's client would use it even over the socket; a test that wants it passes `--ssl`);
    /// options and statements to be added.
    pub fn client(&self) -> Command {
        let mut cmd = Command::new("mariadb");
        cmd.arg("-S")
            .arg(&self.socket)
            .arg("-uroot")
            .arg("--skip-ssl");
        cmd
    }

    /// Runs SQL through the mariadb client as root; returns its tab-separated output.
    pub fn sql(&self, sql: &str) -> String {
        let out = self
            .client()
            .args(["-N", "-B", "-e", sql])
            .output()
            .expect("running the mariadb client");
        assert!(
            out.status.success(),
            "SQL failed: {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// A line of the env file `testdb start` wrote for this server (`MYPROBE_TEST_PORT`, `MYPROBE_TEST_ROOT`, …).
    pub fn env(&self, name: &str) -> Option<String> {
        let env = std::fs::read_to_string(self.dir.join("env")).ok()?;
        let value = env
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='));
        value.map(String::from)
    }

    /// The server's TCP port.
    pub fn port(&self) -> String {
        self.env("MYPROBE_TEST_PORT")
            .unwrap_or_else(|| panic!("{}/env has no MYPROBE_TEST_PORT", self.dir.display()))
    }

    /// Waits until `count_sql` (a `SELECT COUNT(*) …`) counts at least one row: a session's statement begun,
    /// blocked where the test wants it. A minute at most, then fails.
    pub fn wait_for(&self, count_sql: &str) {
        self.wait_until(count_sql, || self.sql(count_sql).trim() != "0");
    }

    /// Waits until `check` holds, polling. A minute at most, then fails, saying `what` never held.
    pub fn wait_until(&self, what: &str, check: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !check() {
            assert!(std::time::Instant::now() < deadline, "never true: {what}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Whether a transaction waits for a row lock, its block in `SHOW ENGINE INNODB STATUS` holding `needle`
    /// (`thread id 12,`, or a word of its statement). Not INNODB_TRX: it is a cache refreshed only when no one
    /// read it for 0.1 s, so that polled it can show the same stale rows for ever.
    pub fn waits_for_row_lock(&self, needle: &str) -> bool {
        self.sql("SHOW ENGINE INNODB STATUS")
            .replace("\\n", "\n")
            .split("---TRANSACTION")
            .any(|trx| trx.contains("\nLOCK WAIT ") && trx.contains(needle))
    }

    /// Waits until a transaction that `needle` picks out waits for a row lock (see `waits_for_row_lock`).
    pub fn wait_for_row_lock_wait(&self, needle: &str) {
        self.wait_until(&format!("a row lock wait of {needle:?}"), || {
            self.waits_for_row_lock(needle)
        });
    }

    /// Waits until the server's thread `tid` runs its statement in `state` (`User sleep`, `Waiting for table
    /// metadata lock`, …).
    pub fn wait_for_state(&self, tid: u32, state: &str) {
        self.wait_for(&format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE TID = {tid} AND STATE = '{state}'"
        ));
    }

    /// The statements the server has been sent (`Questions`, its clients' and myprobe's own).
    pub fn questions(&self) -> u64 {
        self.sql("SHOW GLOBAL STATUS LIKE 'Questions'")
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// A client connection kept open by a `mariadb` process reading statements from a pipe.
    pub fn session(&self) -> Session {
        self.session_in(None)
    }

    /// A session whose default database is `db` (set by the client at connect time, in the handshake).
    pub fn session_in(&self, db: Option<&str>) -> Session {
        self.session_with(db.map(|d| format!("--database={d}")).as_slice())
    }

    /// A session with extra client options (e.g. `--ssl`).
    pub fn session_with<S: AsRef<std::ffi::OsStr>>(&self, options: &[S]) -> Session {
        let mut child = self
            .client()
            .args(["-N", "-B", "--unbuffered"])
            .args(options)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the mariadb client");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Session {
            child,
            stdin,
            stdout,
        }
    }
}

/// Runs `check` on every server at once, each in a thread of its own: a test that has the servers alone, whose
/// reports of one server see nothing of the others'.
pub fn on_every_server_at_once(check: impl Fn(&'static str, &TestDb) + Sync) {
    let servers = every_server();
    std::thread::scope(|s| {
        for (kind, db) in &servers {
            let check = &check;
            s.spawn(move || check(kind, db));
        }
    });
}

/// `myprobe queries --json` of every statement of `db` for up to a minute, running once it traces.
pub fn every_statement(db: &TestDb) -> Background {
    let pid = db.pid.to_string();
    let args = [
        "queries",
        "-p",
        &pid,
        "--json",
        "--sample-every",
        "1",
        "-d",
        "60",
    ];
    Background::start(&args, "tracing the statements")
}

/// `myprobe report` of `db` for `secs`, its page in `dir`, running once it traces: the run, and the page.
pub fn report_in_background(db: &TestDb, secs: u32, dir: &Path) -> (Background, PathBuf) {
    let page = dir.join("report.html");
    let (pid, secs) = (db.pid.to_string(), secs.to_string());
    let args = [
        "report",
        "-p",
        &pid,
        "-d",
        &secs,
        "-o",
        page.to_str().unwrap(),
    ];
    (Background::start(&args, "Ctrl-C ends early"), page)
}

/// The findings of the report at `page` (a `report -o page.html`), at least one, their text unescaped.
pub fn report_findings(kind: &str, page: &std::path::Path) -> Vec<String> {
    let html = std::fs::read_to_string(page).unwrap();
    let section = html
        .split("<section id=\"findings\">")
        .nth(1)
        .and_then(|s| s.split("</section>").next())
        .unwrap_or_else(|| panic!("{kind}: no findings:\n{html}"));
    let findings: Vec<String> = section
        .split("<li>")
        .skip(1)
        .filter_map(|f| f.split("</li>").next())
        .map(|f| {
            f.replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&")
        })
        .collect();
    assert!(!findings.is_empty(), "{kind}: no finding:\n{section}");
    findings
}

/// The JSON objects of `stdout`, one a line (`--json` output); panics on a line that is not JSON.
pub fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l}"))
        })
        .collect()
}

/// The events myprobe said it dropped because its ring buffer was full (its stderr's warning), 0 if none.
pub fn dropped_events(stderr: &str) -> usize {
    stderr
        .lines()
        .find_map(|l| l.split_once("events dropped: ring buffer full: "))
        .map(|(_, rest)| {
            let n = rest.split_whitespace().next().unwrap_or_default();
            n.parse()
                .unwrap_or_else(|_| panic!("no count of dropped events in: {rest}"))
        })
        .unwrap_or(0)
}

/// A server of a test's own (see [`TestDb::start_another`]).
pub struct OtherServer(pub TestDb);

impl Drop for OtherServer {
    fn drop(&mut self) {
        let _ = Command::new(&self.0.testdb)
            .arg("stop")
            .arg(&self.0.dir)
            .arg("--clean")
            .output();
    }
}

/// A running sysbench load; `wait` asserts that it ran, so a broken load never passes for a tracer bug.
pub struct Load(Option<Child>);

impl Load {
    /// Whether sysbench still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.0.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Stops the load if it still runs, and says whether it did, with what sysbench printed.
    pub fn end(mut self) -> String {
        let mut child = self.0.take().unwrap();
        let running = matches!(child.try_wait(), Ok(None));
        stop_load(&child);
        let out = child.wait_with_output().unwrap();
        format!(
            "sysbench {}:\n{}{}",
            if running {
                "was still running"
            } else {
                "had ended"
            },
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Ends a load started by `running_load`, which must still be running: it covered the whole test.
    pub fn finish(mut self) {
        assert!(
            self.running(),
            "the load ended before the test did: {}",
            self.end()
        );
        self.end();
    }

    pub fn wait(mut self) {
        let out = self.0.take().unwrap().wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "sysbench load failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// SIGTERM, which `timeout` (what `testdb load` execs) passes on to sysbench: a SIGKILL would leave sysbench
/// running without it.
fn stop_load(child: &Child) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
}

impl Drop for Load {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            stop_load(&c);
            let _ = c.wait();
        }
    }
}

pub struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Session {
    /// Sends one statement that returns one row, and reads that row.
    pub fn query_row(&mut self, sql: &str) -> String {
        writeln!(self.stdin, "{sql};").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    }

    /// Runs statements that return no rows, and waits until the server has answered them.
    pub fn exec(&mut self, sql: &str) {
        writeln!(self.stdin, "{sql}; SELECT 'myprobe-done';").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        while line.trim_end() != "myprobe-done" {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the client exited while running: {sql}"
            );
        }
    }

    /// Its connection's id (`CONNECTION_ID()`), for KILL.
    pub fn connection_id(&mut self) -> u64 {
        self.query_row("SELECT CONNECTION_ID()")
            .parse()
            .expect("CONNECTION_ID() is a number")
    }

    /// Sends statements without waiting for their answer.
    pub fn send(&mut self, sql: &str) {
        writeln!(self.stdin, "{sql};").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Reads one line of output (the answer to something sent).
    pub fn read_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    }

    /// Reads its output up to a line that holds `needle`; panics where the client exits first (an error ends it).
    pub fn read_until(&mut self, needle: &str) {
        let mut line = String::new();
        while !line.contains(needle) {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the client exited before answering {needle}"
            );
        }
    }

    /// The OS thread id serving this connection (MariaDB's processlist TID column).
    pub fn server_tid(&mut self) -> u32 {
        self.query_row("SELECT TID FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()")
            .parse()
            .expect("TID is a number")
    }

    /// The thread serving this connection on `kind`'s server `db`, as the host numbers it (a server in a PID
    /// namespace of its own numbers its threads in it).
    pub fn host_tid(&mut self, db: &TestDb, kind: &str) -> u32 {
        let sql = if kind.starts_with("mysql") {
            "SELECT THREAD_OS_ID FROM performance_schema.threads WHERE PROCESSLIST_ID = CONNECTION_ID()"
        } else {
            "SELECT TID FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()"
        };
        let tid: u32 = self
            .query_row(sql)
            .parse()
            .expect("a thread id is a number");
        let tasks = std::fs::read_dir(format!("/proc/{}/task", db.pid)).unwrap();
        tasks
            .flatten()
            .find_map(|task| {
                let status = std::fs::read_to_string(task.path().join("status")).ok()?;
                let ids = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
                let ids: Vec<u32> = ids
                    .split_whitespace()
                    .filter_map(|i| i.parse().ok())
                    .collect();
                (ids.last() == Some(&tid)).then(|| ids[0])
            })
            .unwrap_or_else(|| panic!("{kind}: no thread {tid} in process {}", db.pid))
    }
}

/// One server thread's reads from the disk behind the server's data slowed to a few a second: a slow disk, for
/// one connection only (cgroup v1's blkio throttle, which moves single threads). Lifted when dropped.
pub struct SlowReads(InCgroup);

impl SlowReads {
    pub fn start(db: &TestDb, tid: u32, per_second: u32) -> SlowReads {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(db.dir.join("data")).unwrap().dev();
        let block =
            Path::new("/sys/dev/block").join(format!("{}:{}", libc::major(dev), libc::minor(dev)));
        // Throttles apply to whole disks: a partition's is its parent's.
        let disk = if block.join("partition").exists() {
            std::fs::canonicalize(&block)
                .unwrap()
                .parent()
                .unwrap()
                .to_path_buf()
        } else {
            block.clone()
        };
        let disk = std::fs::read_to_string(disk.join("dev")).unwrap_or_else(|e| {
            panic!(
                "{} is no block device ({e}): cannot slow its reads",
                block.display()
            )
        });
        let limit = (
            "blkio.throttle.read_iops_device",
            format!("{} {per_second}", disk.trim()),
        );
        SlowReads(InCgroup::enter(
            "blkio",
            &format!("myprobe-slow-reads-{tid}"),
            &[limit],
            Member::Thread(tid),
        ))
    }
}

/// A thread, or a process with all its threads, in a cgroup v1 group of their own.
#[derive(Clone, Copy)]
pub enum Member {
    Thread(u32),
    Process(u32),
}

/// A thread or process moved into cgroup v1's `hierarchy`, in a group at `path` below its root, made with
/// `settings` (file, value); moved back to its group before, and the group removed, when dropped.
pub struct InCgroup {
    group: PathBuf,
    member: Member,
    back: PathBuf,
}

impl InCgroup {
    pub fn enter(
        hierarchy: &str,
        path: &str,
        settings: &[(&str, String)],
        member: Member,
    ) -> InCgroup {
        let root = Path::new("/sys/fs/cgroup").join(hierarchy);
        assert!(
            root.join("tasks").exists(),
            "this test needs cgroup v1's {hierarchy} hierarchy at {}",
            root.display()
        );
        let (Member::Thread(id) | Member::Process(id)) = member;
        let current = std::fs::read_to_string(format!("/proc/{id}/cgroup")).unwrap();
        let current = current
            .lines()
            .find_map(|l| {
                l.split_once(&format!(":{hierarchy}:"))
                    .map(|(_, p)| p.trim_start_matches('/').to_string())
            })
            .unwrap_or_else(|| panic!("{id} has no {hierarchy} group"));
        let group = root.join(path);
        std::fs::create_dir_all(&group).unwrap();
        let in_group = InCgroup {
            group,
            member,
            back: root.join(current),
        };
        for (file, value) in settings {
            in_group.write(&in_group.group.join(file), value);
        }
        in_group.write(&in_group.members(&in_group.group), &id.to_string());
        in_group
    }

    fn members(&self, group: &Path) -> PathBuf {
        match self.member {
            Member::Thread(_) => group.join("tasks"),
            Member::Process(_) => group.join("cgroup.procs"),
        }
    }

    fn write(&self, file: &Path, what: &str) {
        std::fs::write(file, what)
            .unwrap_or_else(|e| panic!("writing {what} to {}: {e}", file.display()))
    }
}

impl Drop for InCgroup {
    fn drop(&mut self) {
        let (Member::Thread(id) | Member::Process(id)) = self.member;
        let _ = std::fs::write(self.members(&self.back), id.to_string());
        let _ = std::fs::remove_dir(&self.group);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lets the server dump a core of any size (`--core-file` asks it to).
pub fn allow_cores(pid: u32) {
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit with a valid pid and a limit to set, none to read.
    let set = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_CORE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(set, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// Sends SIGSEGV to thread `tid` (the host's id) of the throwaway server `pid`, and waits for it to exit.
pub fn crash_server(pid: u32, tid: u32) {
    // SAFETY: tgkill of a thread of the throwaway server, which is what the test crashes.
    let sent = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGSEGV) };
    assert_eq!(sent, 0, "tgkill: {}", std::io::Error::last_os_error());
    for _ in 0..600 {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("the server did not exit after SIGSEGV");
}

/// Starts, in `s`, the statement the crash tests crash: a prepared statement calling a stored procedure that
/// sleeps.
pub fn start_crashing_statement(s: &mut Session) {
    s.exec("CREATE DATABASE crash; CREATE PROCEDURE crash.nap() SELECT SLEEP(60) INTO @slept");
    s.send("PREPARE napping FROM 'CALL crash.nap()'; EXECUTE napping");
}

/// What a DBA meets in an incident, on the database `crash` that [`start_crashing_statement`] made: a connection
/// sleeping, one holding a row lock in its open transaction, one waiting for that lock, and one idle in its
/// transaction. Their sessions stay open while it lives.
pub struct Incident {
    _sessions: Vec<Session>,
    /// The connections running a statement, and its text as `stacks` shows it (normalized).
    pub running: Vec<(u64, String)>,
    /// The connections idle in an open transaction.
    pub idle_in_transaction: Vec<u64>,
}

impl Incident {
    pub fn start(db: &TestDb) -> Incident {
        db.sql("CREATE TABLE crash.t (id INT PRIMARY KEY, k INT) ENGINE=InnoDB; INSERT INTO crash.t VALUES (1, 0)");
        let mut sleeper = db.session_in(Some("crash"));
        let sleeper_id = sleeper.connection_id();
        sleeper.send("SELECT SLEEP(60), 'incident'");
        let mut holder = db.session_in(Some("crash"));
        let holder_id = holder.connection_id();
        holder.query_row("BEGIN; UPDATE t SET k = k + 1 WHERE id = 1; SELECT 'held'");
        let mut waiter = db.session_in(Some("crash"));
        let waiter_id = waiter.connection_id();
        waiter.send("UPDATE t SET k = k + 1 WHERE id = 1 AND 'incident' <> ''");
        let mut idle = db.session_in(Some("crash"));
        let idle_id = idle.connection_id();
        idle.query_row("BEGIN; SELECT COUNT(*) FROM t");
        db.wait_for_row_lock_wait("incident");
        db.wait_for(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP(60), %' \
             AND STATE = 'User sleep'",
        );
        Incident {
            _sessions: vec![sleeper, holder, waiter, idle],
            running: vec![
                (sleeper_id, "SELECT SLEEP(60), 'incident'"),
                (
                    waiter_id,
                    "UPDATE t SET k = k + 1 WHERE id = 1 AND 'incident' <> ''",
                ),
            ]
            .into_iter()
            .map(|(id, text)| (id, myprobe::wire::fingerprint::normalize(text)))
            .collect(),
            idle_in_transaction: vec![holder_id, idle_id],
        }
    }

    /// Checks that `out`, what `stacks` printed, shows each of its connections as it is: its user, database,
    /// command and statement, or idle in its transaction.
    pub fn assert_shown(&self, out: &str) {
        for (id, text) in &self.running {
            let line = connection_line(out, *id);
            assert!(
                line.contains(" root@localhost (crash, Query, ")
                    && line.ends_with(&format!(": {text}")),
                "{line}"
            );
        }
        for id in &self.idle_in_transaction {
            let line = connection_line(out, *id);
            assert!(
                line.contains(" root@localhost (crash, Sleep, ")
                    && line.contains(" s, in a transaction)")
                    && line.ends_with(": idle in its transaction"),
                "{line}"
            );
        }
    }
}

/// The line `stacks` gives connection `id` among the connections it read from a server's memory, in `out`.
pub fn connection_line(out: &str, id: u64) -> &str {
    out.lines()
        .find(|l| l.starts_with(&format!("  connection {id} ")))
        .unwrap_or_else(|| panic!("no connection {id} in:\n{out}"))
}

/// `stacks --resolve`'s output for the crash of [`start_crashing_statement`]: its first line names what
/// identifies it, and the frames are named from the signal handler to the command loop. Returns stdout.
pub fn assert_crash_resolved(run: &std::process::Output) -> String {
    let out = String::from_utf8_lossy(&run.stdout).into_owned();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    let summary = out.lines().next().unwrap_or_default();
    for element in [
        "SIGSEGV",
        "prepared statement",
        "stored routine depth 1",
        "Item_func_sleep",
        // The statement the procedure runs, as the report's Query line gives it.
        "query: SELECT SLEEP(60) INTO @slept",
    ] {
        assert!(
            summary.contains(element),
            "no {element} in: {summary}\n{out}"
        );
    }
    for frame in [
        "handle_fatal_signal",
        "Item_func_sleep::val_int",
        "sp_head::execute_procedure",
        "dispatch_command",
        "do_command",
    ] {
        assert!(
            out.lines().any(|l| l.trim() == frame),
            "no frame {frame}:\n{out}"
        );
    }
    out
}

/// The file the kernel writes a core to in `cwd`, by `kernel.core_pattern` (a plain name, `core` by default;
/// with the PID appended when `kernel.core_uses_pid` says so).
pub fn core_file_in(cwd: &Path, pid: u32) -> PathBuf {
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap();
    let pattern = pattern.trim();
    assert!(
        !pattern.starts_with('|') && !pattern.contains('%') && !pattern.contains('/'),
        "kernel.core_pattern is `{pattern}`: this test reads the core the kernel writes in the server's \
         directory (`core`, the kernel's default)"
    );
    let uses_pid =
        std::fs::read_to_string("/proc/sys/kernel/core_uses_pid").is_ok_and(|v| v.trim() == "1");
    cwd.join(if uses_pid {
        format!("{pattern}.{pid}")
    } else {
        pattern.to_string()
    })
}

pub fn myprobe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_myprobe"))
}

/// Runs myprobe, asserting success; returns stderr for inspection.
pub fn run_ok(cmd: &mut Command) -> String {
    let out: Output = cmd.output().expect("running myprobe");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "myprobe failed: {cmd:?}\nstderr:\n{stderr}"
    );
    stderr
}

/// A fresh temporary directory for one test's files, removed when the test passes (kept for a look when
/// it fails).
pub fn tempdir(name: &str) -> TempDir {
    // Private (0700) and unpredictable: fixtures are compiled and run there as root.
    let dir = tempfile::Builder::new()
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .prefix(&format!("myprobe-test-{name}-"))
        .tempdir()
        .expect("creating a temporary directory")
        .keep();
    TempDir(dir)
}

pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TempDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Parses folded text into (frames root first, value).
pub fn read_folded(path: &Path) -> Vec<(Vec<String>, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (stack, value) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad folded line {l:?}"));
            (
                stack.split(';').map(str::to_string).collect(),
                value.parse().unwrap(),
            )
        })
        .collect()
}

/// Sum of the values of stacks that contain a frame for which `pred` holds.
pub fn value_with_frame(stacks: &[(Vec<String>, u64)], pred: impl Fn(&str) -> bool) -> u64 {
    stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|x| pred(x)))
        .map(|(_, v)| v)
        .sum()
}

/// A myprobe run in the background, e.g. `queries`: stdout and stderr are read as they come.
pub struct Background {
    child: Child,
    /// myprobe's PID where `child` is strace ([`Background::myprobe_pid`]).
    under: Option<u32>,
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    stderr_thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    /// Starts myprobe with `args` and waits until its stderr has a line containing `ready`.
    pub fn start(args: &[&str], ready: &str) -> Background {
        Background::start_with_env(args, &[], ready)
    }

    /// The same, with variables in myprobe's environment (e.g. MYPROBE_DISABLE).
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)], ready: &str) -> Background {
        let mut cmd = myprobe();
        cmd.envs(env.iter().copied()).args(args);
        Background::start_command(cmd, ready)
    }

    /// The same with a command of the caller's (myprobe under strace: [`closes_watched`]).
    pub fn start_command(mut cmd: Command, ready: &str) -> Background {
        let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting myprobe");
        let mut out = child.stdout.take().unwrap();
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut out, &mut s).unwrap();
            s
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let err = BufReader::new(child.stderr.take().unwrap());
        let shared = stderr.clone();
        let stderr_thread = std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                shared.lock().unwrap().push_str(&line);
                shared.lock().unwrap().push('\n');
                let _ = tx.send(line);
            }
        });
        let mut bg = Background {
            child,
            under: None,
            stdout: Some(stdout),
            stderr,
            stderr_thread: Some(stderr_thread),
        };
        // Only a guard against a hang: loading a server's unwind tables on a busy host takes its time.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(ready) => return bg,
                Ok(_) => {}
                Err(_) => {
                    let _ = bg.child.kill();
                    let _ = bg.child.wait();
                    panic!(
                        "myprobe {args:?} did not get ready; stderr:\n{}",
                        bg.stderr.lock().unwrap()
                    );
                }
            }
        }
    }

    /// What the run wrote on stderr so far.
    pub fn stderr_so_far(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until the run has written `text` on stderr (a minute at most, then fails).
    pub fn wait_for_stderr(&self, text: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !self.stderr_so_far().contains(text) {
            assert!(
                std::time::Instant::now() < deadline,
                "myprobe did not say `{text}`; stderr:\n{}",
                self.stderr_so_far()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The PID of the myprobe run.
    pub fn pid(&self) -> u32 {
        self.under.unwrap_or(self.child.id())
    }

    /// The PID of myprobe run under strace ([`closes_watched`]): the one [`Background::stop`] interrupts, and
    /// [`Background::pid`] says, from now on.
    pub fn myprobe_pid(&mut self) -> u32 {
        *self.under.get_or_insert_with(|| child_of(self.child.id()))
    }

    /// Ends the run with SIGINT (as Ctrl-C does) and waits for it; asserts success; returns (stdout, stderr).
    pub fn stop(self) -> (String, String) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.pid() as i32, libc::SIGINT) };
        self.wait()
    }

    /// As [`Background::wait`], for a run that must end by itself within `secs` seconds because of `why`.
    pub fn wait_within(mut self, secs: u64, why: &str) -> (String, String) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while self.child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.stderr_thread.take().unwrap().join().unwrap();
                let stderr = self.stderr.lock().unwrap().clone();
                panic!("myprobe went on for {secs} s after {why}; stderr:\n{stderr}");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.wait()
    }

    /// Waits for the run to end by itself; asserts success; returns (stdout, stderr).
    pub fn wait(mut self) -> (String, String) {
        let status = self.child.wait().unwrap();
        let stdout = self.stdout.take().unwrap().join().unwrap();
        self.stderr_thread.take().unwrap().join().unwrap();
        let stderr = self.stderr.lock().unwrap().clone();
        assert!(
            status.success(),
            "myprobe failed ({status}); stderr:\n{stderr}"
        );
        (stdout, stderr)
    }
}

/// myprobe with `args` under strace, which writes to `log` only the close(2) calls that fail (seccomp-bpf: no
/// other call stops the run). A descriptor closed by two owners fails the second close, or, when its number was
/// given to somebody else meanwhile, makes that one's own close fail. The run's PID is [`child_of`] strace's;
/// strace, which blocks fatal signals when it started the command, exits as the run does.
pub fn closes_watched(log: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-qq", "--seccomp-bpf", "-e", "trace=close"])
        .args(["-e", "status=failed", "-e", "signal=none", "-o"])
        .arg(log)
        .arg(env!("CARGO_BIN_EXE_myprobe"))
        .args(args);
    cmd
}

/// The closes that failed, as [`closes_watched`] had strace write them.
pub fn failed_closes(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_else(|e| panic!("reading {}: {e}", log.display()))
}

/// The one child of `pid` (waited for, a few seconds at most).
pub fn child_of(pid: u32) -> u32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(child) = children.split_whitespace().next() {
            return child.parse().unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{pid} started no process"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The BPF objects a process holds: (kind, id) from its fdinfo.
pub fn bpf_objects(pid: u32) -> Vec<(String, u32)> {
    let mut ids = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        let info = std::fs::read_to_string(fd.path()).unwrap_or_default();
        for line in info.lines() {
            for kind in ["prog", "map", "link"] {
                if let Some(id) = line.strip_prefix(&format!("{kind}_id:")) {
                    ids.push((kind.to_string(), id.trim().parse().unwrap()));
                }
            }
        }
    }
    ids.sort();
    ids.dedup();
    ids
}

/// How many of the BPF maps `pid` holds are named `name`.
pub fn bpf_maps_named(pid: u32, name: &str) -> usize {
    let held: Vec<u32> = bpf_objects(pid)
        .into_iter()
        .filter(|(kind, _)| kind == "map")
        .map(|(_, id)| id)
        .collect();
    libbpf_rs::query::MapInfoIter::default()
        .filter(|m| held.contains(&m.id) && m.name == name)
        .count()
}

/// How many descriptors `pid` has open, and its resident anonymous memory in KiB (`RssAnon`: what it allocated;
/// the pages of the files it maps, its own binary and the symbols it reads, are the page cache's, resident as far
/// as they were read, which the symbols of each window vary).
pub fn descriptors_and_rss(pid: u32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"))
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no RssAnon in /proc/{pid}/status"));
    (fds, rss)
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(pid) = self.under {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Compiles C fixtures of tests/fixtures/ (paths below it; the first is the main one) into `dir/exe` with
/// `flags` (after `-O1 -g` and the sources, where libraries go).
pub fn compile_fixture(dir: &Path, exe: &str, sources: &[&str], flags: &[&str]) -> PathBuf {
    let out = dir.join(exe);
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let cc = Command::new("cc")
        .args(["-O1", "-g"])
        .arg("-o")
        .arg(&out)
        .args(sources.iter().map(|s| fixtures.join(s)))
        .args(flags)
        .output()
        .expect("running cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    out
}

/// Compiles a C fixture of tests/fixtures/ that is a client of the server (MariaDB's Connector/C, which speaks
/// to every test server) into `dir/exe`.
pub fn compile_client_fixture(dir: &Path, exe: &str, source: &str) -> PathBuf {
    let config = Command::new("mariadb_config")
        .args(["--cflags", "--libs"])
        .output()
        .expect("running mariadb_config (libmariadb-dev)");
    assert!(config.status.success(), "{config:?}");
    let flags = String::from_utf8_lossy(&config.stdout).into_owned();
    compile_fixture(
        dir,
        exe,
        &[source],
        &flags.split_whitespace().collect::<Vec<_>>(),
    )
}

/// A fixture process that prints "ready", then does its known work on each line of stdin ("go") and prints
/// "done"; it is killed on drop.
pub struct Fixture {
    pub child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Fixture {
    /// Starts `cmd` and waits for its "ready".
    pub fn start(cmd: &mut Command) -> Fixture {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting a fixture");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        Fixture { child, stdout }
    }

    /// Has it do its work, and waits until it is done.
    pub fn go(&mut self) {
        writeln!(self.child.stdin.as_mut().unwrap(), "go").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "done");
    }
}

impl Fixture {
    /// Runs `myprobe profile <what> … -d 3 -o <dir>/<what>.folded [extra]` on the fixture, has it do its work
    /// once the probes are in place, and returns the folded stacks and myprobe's stderr. `tracer_env`: for
    /// myprobe (e.g. MYPROBE_DISABLE).
    pub fn profile(
        &mut self,
        dir: &Path,
        what: &str,
        extra: &[&str],
        tracer_env: &[(&str, &str)],
    ) -> (Vec<(Vec<String>, u64)>, String) {
        self.profile_while(dir, what, extra, tracer_env, false)
    }

    /// The same, ended (as by Ctrl-C) once the fixture has done its work rather than after 3 s: however long a
    /// busy host makes it take, the profile covers it.
    pub fn profile_until_done(
        &mut self,
        dir: &Path,
        what: &str,
        extra: &[&str],
        tracer_env: &[(&str, &str)],
    ) -> (Vec<(Vec<String>, u64)>, String) {
        self.profile_while(dir, what, extra, tracer_env, true)
    }

    fn profile_while(
        &mut self,
        dir: &Path,
        what: &str,
        extra: &[&str],
        tracer_env: &[(&str, &str)],
        until_done: bool,
    ) -> (Vec<(Vec<String>, u64)>, String) {
        let folded = dir.join(format!("{what}.folded"));
        let pid = self.child.id().to_string();
        let mut tracer = myprobe()
            .envs(tracer_env.iter().copied())
            .args([
                "profile",
                what,
                "--any-process",
                "-p",
                &pid,
                "-d",
                if until_done { "600" } else { "3" },
                "-o",
            ])
            .arg(&folded)
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The work starts once the probes are in place: myprobe says so ("… for 3 s; Ctrl-C ends early") after
        // attaching, however long loading took on a busy machine.
        let stderr = tracer.stderr.take().unwrap();
        let (announced, said) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.ends_with("; Ctrl-C ends early") {
                    let _ = announced.send(());
                }
                all += &line;
                all.push('\n');
            }
            all
        });
        let in_place = said
            .recv_timeout(std::time::Duration::from_secs(60))
            .is_ok();
        if in_place {
            self.go();
            if until_done {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
            }
        }
        let status = tracer.wait().unwrap();
        let stderr = reader.join().unwrap();
        assert!(
            in_place,
            "myprobe never said its probes were in place: {stderr}"
        );
        assert!(status.success(), "{stderr}");
        (read_folded(&folded), stderr)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
