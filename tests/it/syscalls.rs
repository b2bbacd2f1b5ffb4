//! `profile syscalls` on a fixture making known syscalls from known functions, and on the throwaway MariaDB
//! under load.

use std::process::Command;

use crate::common::*;

/// tests/fixtures/syscalls/known_calls.c, running and waiting for its go.
fn start_known_calls(dir: &std::path::Path) -> Fixture {
    start_known_calls_built(dir, &[])
}

fn start_known_calls_built(dir: &std::path::Path, cflags: &[&str]) -> Fixture {
    let exe = compile_fixture(dir, "known_calls", &["syscalls/known_calls.c"], cflags);
    Fixture::start(Command::new(exe).arg(dir.join("records")))
}

/// Traces the fixture's syscalls with `extra` options; returns the folded stacks and stderr.
fn traced(name: &str, extra: &[&str]) -> (Vec<(Vec<String>, u64)>, String) {
    let dir = tempdir(name);
    start_known_calls(&dir).profile(&dir, "syscalls", extra, &[])
}

/// The value of the stacks that pass through `function` and end in the leaf `[syscall] <syscall>`.
fn calls_from(stacks: &[(Vec<String>, u64)], function: &str, syscall: &str) -> u64 {
    let leaf = format!("[syscall] {syscall}");
    stacks
        .iter()
        .filter(|(frames, _)| frames.last() == Some(&leaf) && frames.iter().any(|f| f == function))
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn known_syscalls_are_counted_exactly_on_their_stacks() {
    let (stacks, stderr) = traced("syscalls-calls", &["--calls"]);
    assert_eq!(
        calls_from(&stacks, "write_records", "pwrite64"),
        40,
        "{stacks:?}\n{stderr}"
    );
    assert_eq!(
        calls_from(&stacks, "sync_records", "fsync"),
        10,
        "{stacks:?}"
    );
    assert_eq!(
        calls_from(&stacks, "nap", "clock_nanosleep"),
        5,
        "{stacks:?}"
    );
    assert_eq!(
        calls_from(&stacks, "close_nothing", "close"),
        7,
        "{stacks:?}"
    );
    // Each function's calls are on its own stack, below main.
    for (frames, _) in stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f == "write_records"))
    {
        assert!(frames.iter().any(|f| f == "main"), "{frames:?}");
        assert_eq!(
            frames.last().map(String::as_str),
            Some("[syscall] pwrite64"),
            "{frames:?}"
        );
    }
    // The table: the failed closes by errno, and nothing else of close (the fixture closes nothing else).
    let close = stderr
        .lines()
        .find(|l| l.trim_start().starts_with("close "))
        .unwrap_or_else(|| panic!("no table line for close:\n{stderr}"));
    let fields: Vec<&str> = close.split_whitespace().collect();
    assert_eq!(fields[1], "7", "{close}");
    assert_eq!(fields.last(), Some(&"EBADF:7"), "{close}");
}

#[test]
fn without_bpf_loop_the_compat_build_counts_the_same_calls() {
    // Kernels before 5.17 run the compat build: each thread's syscall in a hash by thread id, an entry from the
    // call's entry to its exit, and stacks by frame pointers. glibc's wrappers have none, so the function that
    // called them is not on the stack, and its caller is.
    let dir = tempdir("syscalls-compat");
    let (stacks, stderr) = start_known_calls_built(&dir, &["-fno-omit-frame-pointer"]).profile(
        &dir,
        "syscalls",
        &["--calls"],
        &[("MYPROBE_DISABLE", "bpf_loop")],
    );
    assert!(stderr.contains("has no bpf_loop helper"), "{stderr}");
    for (syscall, calls) in [
        ("pwrite64", 40),
        ("fsync", 10),
        ("clock_nanosleep", 5),
        ("close", 7),
    ] {
        assert_eq!(
            calls_from(&stacks, "main", syscall),
            calls,
            "{syscall}: {stacks:?}\n{stderr}"
        );
    }
}

#[test]
fn time_in_syscalls_and_the_filters() {
    // Microseconds: the five naps of 2 ms sleep at least 10 ms in all.
    let (stacks, stderr) = traced("syscalls-time", &[]);
    let napped = calls_from(&stacks, "nap", "clock_nanosleep");
    assert!(
        napped >= 10_000,
        "{napped} µs in nap's clock_nanosleep:\n{stderr}"
    );
    // --syscall: only those.
    let (stacks, stderr) = traced("syscalls-only", &["--calls", "--syscall", "fsync,close"]);
    assert_eq!(
        calls_from(&stacks, "sync_records", "fsync"),
        10,
        "{stacks:?}\n{stderr}"
    );
    assert_eq!(
        calls_from(&stacks, "close_nothing", "close"),
        7,
        "{stacks:?}"
    );
    let others: Vec<_> = stacks
        .iter()
        .filter(|(f, _)| {
            !matches!(
                f.last().map(String::as_str),
                Some("[syscall] fsync" | "[syscall] close")
            )
        })
        .collect();
    assert!(others.is_empty(), "{others:?}");
    // --min-us: the naps pass, each 2 ms long.
    let (stacks, stderr) = traced("syscalls-min", &["--calls", "--min-us", "1500"]);
    assert_eq!(
        calls_from(&stacks, "nap", "clock_nanosleep"),
        5,
        "{stacks:?}\n{stderr}"
    );
}

#[test]
fn an_unknown_syscall_name_is_a_clear_error() {
    let out = myprobe()
        .args(["profile", "syscalls", "--syscall", "fsink"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no syscall \"fsink\""), "{stderr}");
}

#[test]
fn mariadb_under_load_spends_its_syscall_time_in_known_places() {
    let db = testdb();
    let load = db.running_load();
    let dir = tempdir("syscalls-mariadb");
    let folded = dir.join("syscalls.folded");
    let pid = db.pid.to_string();
    let stderr = run_ok(
        myprobe()
            .args(["profile", "syscalls", "-p", &pid, "-d", "3", "-o"])
            .arg(&folded),
    );
    load.finish();
    let stacks = read_folded(&folded);
    // The clients' statements arrive and their results leave through the socket syscalls, from the server's
    // network layer.
    let net = |syscall: &str| {
        let leaf = format!("[syscall] {syscall}");
        stacks
            .iter()
            .filter(|(f, _)| {
                f.last() == Some(&leaf)
                    && f.iter()
                        .any(|f| f.starts_with("my_net_") || f.starts_with("vio_"))
            })
            .count()
    };
    assert!(
        net("recvfrom") + net("read") + net("recvmsg") > 0,
        "no request reads:\n{stderr}"
    );
    assert!(
        net("sendto") + net("write") + net("sendmsg") > 0,
        "no result sends:\n{stderr}"
    );
    assert!(
        stderr.contains("top ") && stderr.contains("syscalls by time"),
        "{stderr}"
    );
}
