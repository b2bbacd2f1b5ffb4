//! Every target/environment error is one clear line on stderr and a non-zero exit, before anything is loaded.

use std::process::{Command, Stdio};

use crate::common::*;

/// Runs a command expected to fail; returns its only stderr line.
fn one_error_line(cmd: &mut Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().expect("running myprobe");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "expected failure: {cmd:?}\nstderr:\n{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing belongs on stdout on error: {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one error line, got:\n{stderr}");
    assert!(lines[0].starts_with("myprobe: error: "), "{stderr}");
    lines[0].to_string()
}

/// A process named `mariadbd` that is not a server: a copy of sleep(1).
fn fake_server_binary(dir: &std::path::Path) -> std::path::PathBuf {
    let fake = dir.join("mariadbd");
    std::fs::copy("/bin/sleep", &fake).unwrap();
    fake
}

/// Runs myprobe in a fresh PID namespace, where only the processes `setup` starts are visible: once `servers`
/// of them are named mariadbd (the shells it forks have exec'd).
fn in_pid_namespace(setup: &str, servers: usize, args: &str) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "sh", "-c"])
        .arg(format!(
            "{setup} while [ $(cat /proc/[0-9]*/comm 2>/dev/null | grep -cx mariadbd) -lt {servers} ]; do \
             sleep 0.05; done; exec {} {args}",
            env!("CARGO_BIN_EXE_myprobe")
        ));
    cmd
}

#[test]
fn no_server_running() {
    let line = one_error_line(&mut in_pid_namespace("", 0, "profile cpu -d 1"));
    assert!(line.contains("no MySQL or MariaDB server"), "{line}");
    assert!(line.contains("-p PID"), "the error says what to do: {line}");
}

#[test]
fn several_servers_running() {
    let dir = tempdir("several");
    let fake = fake_server_binary(&dir);
    let f = fake.display();
    let line = one_error_line(&mut in_pid_namespace(
        &format!("{f} 30 & {f} 30 &"),
        2,
        "profile offcpu -d 1",
    ));
    assert!(line.contains("2 servers are running"), "{line}");
    assert!(line.contains("pick one with -p PID"), "{line}");
}

#[test]
fn pid_that_does_not_exist() {
    let line = one_error_line(myprobe().args(["profile", "cpu", "-p", "999999999", "-d", "1"]));
    assert!(line.contains("no process with PID 999999999"), "{line}");
}

#[test]
fn pid_that_is_not_a_server() {
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let line = one_error_line(myprobe().args([
        "profile",
        "cpu",
        "-d",
        "1",
        "-p",
        &sleeper.id().to_string(),
    ]));
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    assert!(
        line.contains("is `sleep`, not a MySQL or MariaDB server"),
        "{line}"
    );
    assert!(line.contains("--any-process"), "{line}");
}

#[test]
fn not_root() {
    let db = testdb();
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        env!("CARGO_BIN_EXE_myprobe"),
    ])
    .args(["profile", "cpu", "-d", "1", "-p", &db.pid.to_string()]);
    let line = one_error_line(&mut cmd);
    assert!(line.contains("needs root"), "{line}");
    assert!(line.contains("sudo"), "{line}");
}

#[test]
fn kernel_btf_missing() {
    let db = testdb();
    let line = one_error_line(myprobe().args([
        "profile",
        "offcpu",
        "-d",
        "1",
        "--btf",
        "/nonexistent/vmlinux.btf",
        "-p",
        &db.pid.to_string(),
    ]));
    assert!(
        line.contains("BTF file /nonexistent/vmlinux.btf does not exist"),
        "{line}"
    );
}

#[test]
fn unknown_output_extension() {
    let db = testdb();
    let line = one_error_line(myprobe().args([
        "profile",
        "cpu",
        "-d",
        "1",
        "-o",
        "/tmp/x.png",
        "-p",
        &db.pid.to_string(),
    ]));
    assert!(
        line.contains(".svg"),
        "the error lists the accepted extensions: {line}"
    );
}

#[test]
fn a_pfs_duration_that_is_no_number_of_seconds() {
    // Checked before any server is looked for: infinity once panicked in Duration::from_secs_f64.
    for d in ["inf", "NaN", "0", "1e30"] {
        let line = one_error_line(myprobe().args(["pfs", "stages", "-p", "999999999", "-d", d]));
        assert!(
            line.contains("-d: a number of seconds above 0"),
            "-d {d}: {line}"
        );
    }
}

#[test]
fn queries_without_a_server() {
    let line = one_error_line(&mut in_pid_namespace("", 0, "queries -d 1"));
    assert!(line.contains("no MySQL or MariaDB server"), "{line}");
}

#[test]
fn queries_uprobes_on_a_binary_without_dispatch_command() {
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let line = one_error_line(myprobe().args([
        "queries",
        "-d",
        "1",
        "--uprobes",
        "--any-process",
        "-p",
        &sleeper.id().to_string(),
    ]));
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    assert!(line.contains("has no dispatch_command symbol"), "{line}");
    assert!(line.contains("--uprobes"), "{line}");
}

#[test]
fn a_kernel_memory_budget_too_small_for_the_maps() {
    let db = testdb();
    let line = one_error_line(myprobe().args([
        "profile",
        "memleak",
        "-d",
        "1",
        "--max-kernel-mem",
        "2",
        "-p",
        &db.pid.to_string(),
    ]));
    // What takes the memory, and the two ways out.
    assert!(
        line.contains("more than --max-kernel-mem 2 MiB")
            && line.contains("unwind_rows")
            && line.contains("--frame-pointers"),
        "{line}"
    );
}
