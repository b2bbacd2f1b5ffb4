//! `myprobe pfs`: performance_schema's view of a real server (started with performance_schema=ON) under
//! sysbench: the seed's experiment (innodb_flush_log_at_trx_commit 0 against 1), the settings put back exactly,
//! and what is said when performance_schema or the server is not there.

use std::{process::Stdio, time::Duration};

use crate::common::*;

/// Every instrument's and consumer's setting, one line each.
fn settings(db: &TestDb) -> String {
    db.sql(
        "SELECT NAME, ENABLED, TIMED FROM performance_schema.setup_instruments ORDER BY NAME; \
         SELECT NAME, ENABLED FROM performance_schema.setup_consumers ORDER BY NAME",
    )
}

/// `myprobe pfs ARGS -o FILE` against `db`; its stderr.
fn pfs(db: &TestDb, args: &[&str], out: &std::path::Path) -> String {
    run_ok(
        myprobe()
            .arg("pfs")
            .args(args)
            .args(["-p", &db.pid.to_string(), "-o"])
            .arg(out),
    )
}

/// The value of `stack` in a differential folded file (`stack BEFORE AFTER`).
fn diff_values(path: &std::path::Path, stack: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .filter_map(|l| {
            let mut w = l.rsplitn(3, ' ');
            let (after, before, s) = (w.next()?, w.next()?, w.next()?);
            (s == stack || s.ends_with(&format!(";{stack}"))).then(|| {
                (
                    before.parse::<u64>().unwrap(),
                    after.parse::<u64>().unwrap(),
                )
            })
        })
        .fold((0, 0), |a, v| (a.0 + v.0, a.1 + v.1))
}

fn diff(before: &std::path::Path, after: &std::path::Path, out: &std::path::Path) {
    let run = myprobe()
        .arg("diff")
        .arg(before)
        .arg(after)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn commits_that_flush_the_redo_log_grow_the_commit_stage() {
    crate::common::servers_alone();
    let db = testdb();
    let dir = tempdir("pfs-flush");
    let server = db.start_another(&dir.join("db"), &["--performance-schema=ON"]);
    let pfs_db = &server.0;
    pfs_db.prepare(2, 10_000);
    let before = settings(pfs_db);
    let mut profiles = Vec::new();
    for flush in [0, 1] {
        pfs_db.sql(&format!(
            "SET GLOBAL innodb_flush_log_at_trx_commit = {flush}"
        ));
        let load = pfs_db.running_workload("oltp_write_only");
        let stages = dir.join(format!("stages-{flush}.folded"));
        pfs(pfs_db, &["stages", "-d", "4"], &stages);
        let nested = dir.join(format!("nested-{flush}.folded"));
        let err = pfs(pfs_db, &["stages", "--nest", "-d", "4"], &nested);
        load.finish();
        profiles.push((stages, nested, err));
    }
    // What flush=1 adds is the commit's log flush: the Commit stage grows (red in the diff).
    let summary_diff = dir.join("stages.diff.folded");
    diff(&profiles[0].0, &profiles[1].0, &summary_diff);
    let (zero, one) = diff_values(&summary_diff, "stage;sql;Commit");
    assert!(
        one > zero,
        "stage/sql/Commit: {zero} us at 0, {one} us at 1"
    );
    assert!(one > 0, "no stage/sql/Commit time at 1");
    let nested_diff = dir.join("nested.diff.folded");
    diff(&profiles[0].1, &profiles[1].1, &nested_diff);
    let (zero, one) = diff_values(&nested_diff, "stage;sql;Commit");
    assert!(
        one > zero,
        "nested stage/sql/Commit: {zero} us at 0, {one} us at 1"
    );
    // performance_schema records no wait inside the stages on MariaDB: the largest such stage said in one line
    // (Commit on a quiet host; on a busy one, where the CPU is short, it may be another).
    let said = &profiles[1].2;
    assert!(
        said.lines()
            .any(|l| l.contains("stage/sql/") && l.contains("that no wait explains")),
        "{said}"
    );
    assert!(said.contains("history ring gave"), "{said}");
    assert_eq!(settings(pfs_db), before, "settings not put back");
}

#[test]
fn settings_are_put_back_exactly_also_after_sigterm_and_when_denied() {
    let db = testdb();
    let dir = tempdir("pfs-restore");
    let server = db.start_another(&dir.join("db"), &["--performance-schema=ON"]);
    let pfs_db = &server.0;
    // A setting of each kind that a run changes: an instrument enabled but not timed, one off, a consumer off.
    pfs_db.sql(
        "UPDATE performance_schema.setup_instruments SET ENABLED = 'YES', TIMED = 'NO' \
         WHERE NAME = 'wait/io/file/innodb/innodb_data_file'; \
         UPDATE performance_schema.setup_instruments SET ENABLED = 'NO', TIMED = 'NO' \
         WHERE NAME LIKE 'stage/sql/%' AND NAME LIKE '%lock%'",
    );
    let before = settings(pfs_db);
    let out = dir.join("x.folded");
    pfs(pfs_db, &["waits", "-d", "1"], &out);
    assert_eq!(settings(pfs_db), before, "after a whole run");

    let mut child = myprobe()
        .args(["pfs", "stages", "--nest", "-d", "60", "-p"])
        .arg(pfs_db.pid.to_string())
        .arg("-o")
        .arg(&out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait (a bound, not a measure) until the run has switched things on.
    for _ in 0..100 {
        if settings(pfs_db) != before {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_ne!(settings(pfs_db), before, "the run switched nothing on");
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(settings(pfs_db), before, "after SIGTERM");
    assert!(std::fs::metadata(&out).unwrap().len() > 0, "no profile");

    // A user who may read performance_schema but not change its setup: one line, nothing changed.
    pfs_db.sql(
        "CREATE USER watcher@localhost IDENTIFIED BY 'w4tch'; \
         GRANT SELECT ON performance_schema.* TO watcher@localhost",
    );
    let password = dir.join("password");
    std::fs::write(&password, "w4tch\n").unwrap();
    let run = myprobe()
        .args([
            "pfs",
            "waits",
            "-d",
            "1",
            "--user",
            "watcher",
            "--password-file",
        ])
        .arg(&password)
        .args(["-p", &pfs_db.pid.to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("needs UPDATE on performance_schema"), "{err}");
    assert_eq!(settings(pfs_db), before, "after a denied run");
    // Wrong credentials.
    std::fs::write(&password, "wrong\n").unwrap();
    let run = myprobe()
        .args([
            "pfs",
            "waits",
            "-d",
            "1",
            "--user",
            "watcher",
            "--password-file",
        ])
        .arg(&password)
        .args(["-p", &pfs_db.pid.to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("Access denied"), "{err}");

    // The server gone mid-run.
    let child = myprobe()
        .args(["pfs", "waits", "-d", "30", "-p"])
        .arg(pfs_db.pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    pfs_db.stop();
    let run = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains("the server stopped answering during the run"),
        "{err}"
    );
}

#[test]
fn a_server_without_performance_schema_is_one_line() {
    // The tests' server runs with MariaDB's default: performance_schema OFF.
    let db = testdb();
    let run = myprobe()
        .args(["pfs", "stages", "-d", "1", "-p"])
        .arg(db.pid.to_string())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("performance_schema is OFF"), "{err}");
    assert!(err.contains("performance_schema=ON"), "{err}");
}
