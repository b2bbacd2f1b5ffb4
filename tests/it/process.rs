//! What myprobe learns of the process it traces, and how: nothing of the target is ever run (its name is
//! chosen by whoever starts it), and a binary replaced or deleted since it started is still read and probed.

use std::process::Command;

use crate::common::*;

#[test]
fn the_version_comes_from_memory_and_nothing_of_the_target_runs_even_when_deleted() {
    let dir = tempdir("fake-server");
    let exe = compile_fixture(&dir, "mysqld", &["process/fake_server.c"], &[]);
    let mut fixture = Fixture::start(&mut Command::new(&exe));
    // Upgraded while it runs: the file it runs is no longer at its path.
    std::fs::remove_file(&exe).unwrap();
    let mark = dir.join("it-ran");
    let pid = fixture.child.id().to_string();
    let out = myprobe()
        .env("FAKE_SERVER_MARK", &mark)
        .args(["profile", "cpu", "-p", &pid, "-d", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !mark.exists(),
        "myprobe ran the target's binary (`--version`):\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("mysqld (PID {pid}, MySQL 8.0.36-set-at-start)")),
        "the version the process holds at run time:\n{stderr}"
    );
    drop(fixture.child.stdin.take());
}

#[test]
fn fixtures_are_built_in_private_unpredictable_directories() {
    use std::os::unix::fs::PermissionsExt;
    let (a, b) = (tempdir("private"), tempdir("private"));
    assert_ne!(
        a.as_ref() as &std::path::Path,
        b.as_ref() as &std::path::Path
    );
    let mode = std::fs::metadata(&*a).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{}", a.display());
}
