//! `profile locks` on a fixture with a known contended mutex, and on the throwaway MariaDB under load.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use crate::common::*;

#[test]
fn contended_mutex_is_named_with_its_waiters_and_wakers() {
    contended_mutex_named(&[], &[], true);
}

#[test]
fn without_bpf_loop_the_compat_build_names_the_same_lock_by_frame_pointers() {
    // Kernels before 5.17 run the compat build: hash maps by thread for task storage, no atomic OR, and stacks
    // by frame pointers, which the fixture keeps, from the frames of glibc's lock functions (which have none)
    // unwound by rows user space looks up for their addresses. The workers are on the stacks but for the waits
    // that came before user space answered (within half a second of the 2 s traced).
    contended_mutex_named(
        &["-fno-omit-frame-pointer"],
        &[("MYPROBE_DISABLE", "bpf_loop")],
        true,
    );
}

/// `profile locks` of the contended fixture (built with `cflags`), myprobe run with `env`; `callers`: whether
/// the workers that call into glibc are on the stacks.
fn contended_mutex_named(cflags: &[&str], env: &[(&str, &str)], callers: bool) {
    let dir = tempdir("locks-fixture");
    let flags: Vec<&str> = ["-pthread"].iter().chain(cflags).copied().collect();
    let exe = compile_fixture(&dir, "contended", &["locks/contended.c"], &flags);
    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let folded = dir.join("locks.folded");
    let profile = |extra: &[&str]| {
        myprobe()
            .envs(env.iter().copied())
            .args([
                "profile",
                "locks",
                "--any-process",
                "-p",
                &child.id().to_string(),
                "-d",
                "2",
                "-o",
            ])
            .arg(&folded)
            .args(extra)
            .output()
            .unwrap()
    };
    let all = profile(&["--all"]);
    let out = profile(&[]);
    drop(child.stdin.take());
    let _ = child.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");

    let stacks = read_folded(&folded);
    let on_big_lock: Vec<_> = stacks
        .iter()
        .filter(|(f, _)| f[0] == "lock big_lock")
        .cloned()
        .collect();
    let workers: &[&str] = if callers {
        &["first_worker", "second_worker"]
    } else {
        &[]
    };
    for worker in workers {
        let waited = value_with_frame(&on_big_lock, |f| f == *worker);
        assert!(
            waited > 100_000,
            "{worker} waited only {waited} us on big_lock: {stacks:?}"
        );
    }
    let waited: u64 = on_big_lock.iter().map(|(_, us)| us).sum();
    assert!(
        waited > 200_000,
        "{waited} us waited on big_lock: {stacks:?}"
    );
    // The table names the lock and the stacks that released it, contention first; the idle worker's condition
    // waits are counted apart, and listed with --all.
    let contended = stderr.split("not contention").next().unwrap_or_default();
    assert!(
        contended.contains("contended locks") && contended.contains("  big_lock (0x"),
        "{stderr}"
    );
    assert!(contended.contains(", mutex): "), "{stderr}");
    assert!(!contended.contains("no_work"), "{stderr}");
    assert!(
        stderr.contains("not contention: ") && stderr.contains("--all lists them"),
        "{stderr}"
    );
    let all = String::from_utf8_lossy(&all.stderr);
    assert!(
        all.lines()
            .any(|l| l.starts_with("  no_work") && l.contains("condition/event")),
        "{all}"
    );
    let wakers: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("woken") && l.contains("by:"))
        .collect();
    assert!(!wakers.is_empty(), "no waker stack:\n{stderr}");
    for worker in workers {
        assert!(
            wakers
                .iter()
                .any(|l| l.contains(worker) && l.contains("unlock")),
            "no waker stack of {worker} releasing big_lock:\n{stderr}"
        );
    }
}

#[test]
fn server_lock_waits_under_load() {
    let db = testdb();
    let dir = tempdir("locks-server");
    let load = db.running_load();
    let folded = dir.join("locks.folded");
    let svg = dir.join("locks.svg");
    let pid = db.pid.to_string();
    let stderr = run_ok(
        myprobe()
            .args(["profile", "locks", "-p", &pid, "-d", "3", "-o"])
            .arg(&folded),
    );
    load.finish();
    run_ok(
        myprobe()
            .args(["flame"])
            .arg(&folded)
            .args(["--colors", "io", "--countname", "us", "-o"])
            .arg(&svg),
    );
    let stacks = read_folded(&folded);
    // A lock in the server's own memory is named by its symbol, or by the binary and offset where it has none.
    let in_server = value_with_frame(&stacks, |f| {
        f.strip_prefix("lock ")
            .is_some_and(|name| !name.starts_with('[') && !name.contains(".so"))
    });
    assert!(
        in_server > 0,
        "no lock of the server binary itself:\n{stderr}"
    );
    assert!(
        stacks.iter().all(|(f, _)| f[0].starts_with("lock ")),
        "every stack starts at its lock"
    );
    assert!(std::fs::read_to_string(&svg).unwrap().contains("lock "));
    assert!(
        stderr.contains("top ") && stderr.contains("woken"),
        "{stderr}"
    );
    // The table leads with contention (or says there was none); idle workers' waits are not in it.
    let table: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.contains("contended locks") && !l.starts_with("no lock contention"))
        .take_while(|l| !l.starts_with("not contention"))
        .collect();
    assert!(!table.is_empty(), "{stderr}");
    for lock in table
        .iter()
        .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
    {
        // Idle pool workers' condition waits are not here (their taking the pool's mutex again once woken is).
        assert!(!lock.contains("condition/event"), "{lock}\n{stderr}");
    }
}
