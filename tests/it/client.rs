//! The connection layer against the throwaway MariaDB: how it finds the server, whom it connects as, what it
//! says when it cannot, and the process list it reads.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use myprobe::client::{Client, ConnectArgs, Endpoint, Environment};

const USER: &str = "myprobe_conn";
// Quotes, a `#` and a space: what an option file must quote and unescape.
const PASSWORD: &str = "p#w \"q\" x";

/// A user with a password and the PROCESS privilege (to see the other connections), made once.
fn password_user(db: &crate::common::TestDb) {
    let quoted = PASSWORD.replace('\\', "\\\\").replace('\'', "\\'");
    db.sql(&format!(
        "CREATE USER IF NOT EXISTS '{USER}'@'localhost' IDENTIFIED BY '{quoted}';
         ALTER USER '{USER}'@'localhost' IDENTIFIED BY '{quoted}';
         GRANT PROCESS ON *.* TO '{USER}'@'localhost';"
    ));
}

/// The process's environment, with an empty home of the test's own (no ~/.my.cnf) and no MYSQL_PWD.
fn clean_env(home: &Path) -> Environment {
    Environment {
        home: Some(home.to_path_buf()),
        mysql_pwd: None,
        os_user: Environment::current().os_user,
    }
}

fn connect(args: &ConnectArgs, env: &Environment, pid: u32) -> anyhow::Result<Client> {
    Client::connect(&args.settings_in(env, Some(pid))?)
}

fn current_user(client: &mut Client) -> String {
    let rows = client.query("SELECT CURRENT_USER()").unwrap();
    rows[0][0].clone().unwrap()
}

fn password_file(dir: &Path, password: &str) -> PathBuf {
    let path = dir.join("password");
    std::fs::write(&path, format!("{password}\n")).unwrap();
    path
}

#[test]
fn finds_the_servers_socket_and_connects_as_the_os_user() {
    let db = crate::common::testdb();
    let home = crate::common::tempdir("client-home");
    let settings = ConnectArgs::default()
        .settings_in(&clean_env(&home), Some(db.pid))
        .unwrap();
    // The throwaway server listens elsewhere than the default socket: only its PID tells where.
    assert_eq!(
        settings.endpoint,
        Endpoint::Socket {
            path: db.socket.clone(),
            origin: format!("listening in PID {}", db.pid)
        }
    );
    assert_eq!(settings.user, "root");
    let mut client = Client::connect(&settings).unwrap();
    assert!(
        client.server_version().contains("MariaDB"),
        "{}",
        client.server_version()
    );
    assert_eq!(client.server().name(), "MariaDB");
    assert_eq!(current_user(&mut client), "root@localhost");
    let id = client.query("SELECT CONNECTION_ID()").unwrap();
    assert_eq!(
        id[0][0].as_deref(),
        Some(client.connection_id().to_string().as_str())
    );
    assert_eq!(
        client.query("SELECT 1, NULL, 'x'").unwrap(),
        vec![vec![Some("1".to_string()), None, Some("x".to_string())]]
    );
    let err = format!("{:#}", client.query("SELECT no_such_column").unwrap_err());
    assert!(
        err.contains("query `SELECT no_such_column` failed") && err.contains("1054"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
}

#[test]
fn password_from_a_file_the_environment_or_an_option_file() {
    let db = crate::common::testdb();
    password_user(&db);
    let home = crate::common::tempdir("client-home");
    let env = clean_env(&home);
    let expected = format!("{USER}@localhost");

    let args = ConnectArgs {
        user: Some(USER.into()),
        password_file: Some(password_file(&home, PASSWORD)),
        ..Default::default()
    };
    assert_eq!(
        current_user(&mut connect(&args, &env, db.pid).unwrap()),
        expected
    );

    let with_pwd = Environment {
        mysql_pwd: Some(PASSWORD.into()),
        ..env.clone()
    };
    let args = ConnectArgs {
        user: Some(USER.into()),
        ..Default::default()
    };
    assert_eq!(
        current_user(&mut connect(&args, &with_pwd, db.pid).unwrap()),
        expected
    );
    // Without it, the same user is refused.
    assert!(connect(&args, &env, db.pid).is_err());

    let escaped = PASSWORD.replace('"', "\\\"");
    let cnf = format!("# as a user writes it\n[client]\nuser = {USER}\npassword = \"{escaped}\"  # quoted: # and spaces\n");
    std::fs::write(home.join(".my.cnf"), &cnf).unwrap();
    let settings = ConnectArgs::default()
        .settings_in(&env, Some(db.pid))
        .unwrap();
    assert_eq!(
        settings.password_source,
        Some(home.join(".my.cnf").display().to_string())
    );
    assert_eq!(
        current_user(&mut Client::connect(&settings).unwrap()),
        expected
    );
    std::fs::remove_file(home.join(".my.cnf")).unwrap();

    let defaults = home.join("other.cnf");
    std::fs::write(&defaults, cnf.replace("[client]", "[client-mariadb]")).unwrap();
    let args = ConnectArgs {
        defaults_file: Some(defaults),
        ..Default::default()
    };
    assert_eq!(
        current_user(&mut connect(&args, &env, db.pid).unwrap()),
        expected
    );

    // Over TCP too, to the port the server listens on.
    let port: u16 = std::env::var("MYPROBE_TEST_PORT").unwrap().parse().unwrap();
    let args = ConnectArgs {
        host: Some("127.0.0.1".into()),
        port: Some(port),
        user: Some(USER.into()),
        password_file: Some(password_file(&home, PASSWORD)),
        ..Default::default()
    };
    let mut client = connect(&args, &env, db.pid).unwrap();
    assert_eq!(current_user(&mut client), expected);
    let host = client
        .query("SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()")
        .unwrap();
    // A TCP client's host has its port; a unix socket's is `localhost`.
    assert!(host[0][0].as_deref().unwrap().contains(':'), "{host:?}");
}

#[test]
fn a_wrong_password_says_what_was_tried_and_what_to_do() {
    let db = crate::common::testdb();
    password_user(&db);
    let home = crate::common::tempdir("client-home");
    let args = ConnectArgs {
        user: Some(USER.into()),
        password_file: Some(password_file(&home, "wrong-secret")),
        ..Default::default()
    };
    let err = format!(
        "{:#}",
        connect(&args, &clean_env(&home), db.pid).unwrap_err()
    );
    for part in [
        "cannot connect",
        &db.socket.display().to_string(),
        &format!("'{USER}'"),
        "--password-file",
        "Access denied",
        "(error 1045)",
        "give the right --user",
    ] {
        assert!(err.contains(part), "no `{part}` in: {err}");
    }
    assert!(
        !err.contains("wrong-secret") && !err.contains('\n'),
        "{err}"
    );

    let args = ConnectArgs {
        socket: Some(home.join("no.sock")),
        ..Default::default()
    };
    let err = format!(
        "{:#}",
        connect(&args, &clean_env(&home), db.pid).unwrap_err()
    );
    assert!(
        err.contains("no.sock (--socket)") && err.contains("no server listens there"),
        "{err}"
    );
}

#[test]
fn flags_win_over_the_option_file() {
    let db = crate::common::testdb();
    password_user(&db);
    let home = crate::common::tempdir("client-home");
    std::fs::write(
        home.join(".my.cnf"),
        "[client]\nuser=no_such_user\npassword=wrong\nsocket=/nonexistent/mysqld.sock\n",
    )
    .unwrap();
    let env = clean_env(&home);
    // The file alone fails: it is read.
    let err = format!(
        "{:#}",
        connect(&ConnectArgs::default(), &env, db.pid).unwrap_err()
    );
    assert!(
        err.contains("/nonexistent/mysqld.sock") && err.contains(".my.cnf"),
        "{err}"
    );
    let args = ConnectArgs {
        socket: Some(db.socket.clone()),
        user: Some(USER.into()),
        password_file: Some(password_file(&home, PASSWORD)),
        ..Default::default()
    };
    assert_eq!(
        current_user(&mut connect(&args, &env, db.pid).unwrap()),
        format!("{USER}@localhost")
    );
}

/// SIGSTOP for a test's duration; SIGCONT when dropped, also when the test fails.
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        // SAFETY: kill has no memory preconditions.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

#[test]
fn a_server_that_does_not_answer_is_an_error_within_the_timeout() {
    crate::common::servers_alone();
    let db = crate::common::testdb();
    let home = crate::common::tempdir("client-home");
    let env = clean_env(&home);
    let args = ConnectArgs {
        connect_timeout: 1.0,
        ..Default::default()
    };
    let mut connected = connect(&args, &env, db.pid).unwrap();
    {
        let _stopped = Stopped::new(db.pid);
        let started = Instant::now();
        let err = format!("{:#}", connect(&args, &env, db.pid).unwrap_err());
        let took = started.elapsed();
        // Within the timeout, not at once; a busy host answers late, never 10 times late.
        assert!(took < Duration::from_secs(10), "took {took:?}");
        assert!(
            took >= Duration::from_millis(900),
            "an error before the timeout: {err}"
        );
        assert!(
            err.contains("the server did not answer within 1 s")
                && err.contains("--connect-timeout"),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");

        let started = Instant::now();
        let err = format!("{:#}", connected.processlist().unwrap_err());
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "took {:?}",
            started.elapsed()
        );
        assert!(err.contains("did not answer within 1 s"), "{err}");
    }
    // Continued, it answers again.
    let mut again = connect(&args, &env, db.pid).unwrap();
    assert_eq!(current_user(&mut again), "root@localhost");
}

#[test]
fn the_processlist_shows_another_connections_statement_and_its_thread() {
    let db = crate::common::testdb();
    let home = crate::common::tempdir("client-home");
    let mut client = connect(&ConnectArgs::default(), &clean_env(&home), db.pid).unwrap();
    let mut session = db.session();
    let tid = session.server_tid();
    let id: u64 = session.query_row("SELECT CONNECTION_ID()").parse().unwrap();
    session.send("SELECT SLEEP(60)");

    let deadline = Instant::now() + Duration::from_secs(50);
    let (list, before, after) = loop {
        let before = myprobe::collect::monotonic_ns();
        let list = client.processlist().unwrap();
        let after = myprobe::collect::monotonic_ns();
        let running = list
            .rows
            .iter()
            .any(|r| r.id == id && r.info.as_deref() == Some("SELECT SLEEP(60)"));
        if running {
            break (list, before, after);
        }
        assert!(
            Instant::now() < deadline,
            "the SLEEP never showed: {:?}",
            list.rows
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(before <= list.sent_ns && list.sent_ns < list.received_ns && list.received_ns <= after);
    let row = list.rows.iter().find(|r| r.id == id).unwrap();
    assert_eq!(row.tid, Some(tid));
    assert!(
        Path::new(&format!("/proc/{}/task/{tid}", db.pid)).exists(),
        "TID {tid} is not a thread of the server"
    );
    assert_eq!((row.user.as_str(), row.command.as_str()), ("root", "Query"));
    assert!(row.time_ms >= 0.0 && row.time_ms < 60_000.0, "{row:?}");
    assert!(
        list.rows.iter().all(|r| r.id != client.connection_id()),
        "its own connection is left out"
    );
    // Every thread named is one of the server's (that of a connection that ended since may be gone).
    for r in list.rows.iter().filter(|r| r.tid.is_some()) {
        let path = format!("/proc/{}/task/{}", db.pid, r.tid.unwrap());
        assert!(Path::new(&path).exists() || r.id != id, "{r:?}");
    }
    // Interrupted (the client, in batch mode, then exits on the error).
    db.sql(&format!("KILL QUERY {id}"));
}
