//! Temporary tables and sorts on disk, on every server: a `GROUP BY` whose temporary table outgrows
//! `tmp_table_size`, and a sort that outgrows `sort_buffer_size`, each named so in `queries` (with what it spilled,
//! counted at the server's own status counters) and in `report`'s first finding.

use serde_json::Value;

use crate::common::*;

/// A GROUP BY of 5,000 groups (a temporary table of about 2 MB) and a sort of 20,000 keys of 64 characters,
/// run with a 16 KiB temporary table and a 32 KiB sort buffer.
const GROUP_BY: &str = "SELECT g, COUNT(*), MAX(c) FROM spills.t GROUP BY g";
const SORT: &str = "SELECT id FROM spills.t ORDER BY c";
const SMALL_BUFFERS: &str = "SET SESSION tmp_table_size = 16384, max_heap_table_size = 16384, \
                             sort_buffer_size = 32768";

fn fill(db: &TestDb) {
    db.sql(
        "CREATE DATABASE IF NOT EXISTS spills; USE spills; \
         CREATE TABLE IF NOT EXISTS spills.d (n INT) ENGINE=InnoDB; \
         CREATE TABLE IF NOT EXISTS spills.t (id INT PRIMARY KEY, g INT, c VARCHAR(100)) ENGINE=InnoDB; \
         DELETE FROM spills.d; INSERT INTO spills.d VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9); \
         REPLACE INTO spills.t SELECT n, n % 5000, SHA2(n, 256) FROM \
           (SELECT a.n + 10 * b.n + 100 * c.n + 1000 * d.n + 10000 * e.n AS n \
            FROM spills.d a, spills.d b, spills.d c, spills.d d, spills.d e) s WHERE n < 20000",
    );
}

/// Runs `statement` over and over for 2.5 s under a 2-s `report`: the report's findings.
fn reported(kind: &str, db: &TestDb, statement: &str) -> Vec<String> {
    let dir = tempdir("spills");
    let (report, page) = report_in_background(db, 2, &dir);
    let mut s = db.session();
    s.exec(SMALL_BUFFERS);
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_millis(2500) {
        s.exec(statement);
    }
    report.wait();
    report_findings(kind, &page)
}

/// The records of `statement` each spilled (`counter` at least 1) and are named `cause`; the report's first finding
/// says `phrase`, and one of its findings counts the spills of the statement.
fn check(
    kind: &str,
    records: &[Value],
    findings: &[String],
    statement: &str,
    counter: &str,
    cause: &str,
    phrase: &str,
) {
    let records: Vec<&Value> = records.iter().filter(|r| r["query"] == statement).collect();
    assert!(
        records.len() >= 3,
        "{kind}: {} records of {statement}",
        records.len()
    );
    // A statement that waited for a CPU longer than it ran (a busy host) is the run queue's.
    let mut named = 0;
    for r in &records {
        assert!(r[counter].as_u64() >= Some(1), "{kind}: {r}");
        if r["cause"] != "run queue" {
            assert_eq!(r["cause"], cause, "{kind}: {r}");
            named += 1;
        }
    }
    assert!(named * 2 >= records.len(), "{kind}: {records:#?}");
    assert!(
        findings[0].contains(phrase),
        "{kind}: the first finding does not say {phrase:?}: {findings:#?}"
    );
    let fingerprint = statement.to_lowercase();
    assert!(
        findings
            .iter()
            .any(|f| f.starts_with(&fingerprint) && f.contains(" executions spilled to disk (")),
        "{kind}: no finding counts the spills of {statement}: {findings:#?}"
    );
}

#[test]
fn temporary_tables_and_sorts_on_disk_are_named_on_every_server() {
    // The report traces the whole server: another test's statements could be its first finding.
    servers_alone();
    // One server at a time: three CPU-bound loops on two CPUs would wait for a CPU more than they run.
    for (kind, db) in &every_server() {
        fill(db);
        let tracer = every_statement(db);
        let grouped = reported(kind, db, GROUP_BY);
        let sorted = reported(kind, db, SORT);
        let (out, err) = tracer.stop();
        let records = json_lines(&out);
        eprintln!("{kind}: {} records\n{err}", records.len());
        check(
            kind,
            &records,
            &grouped,
            GROUP_BY,
            "tmp_disk_tables",
            "disk tmp table",
            "works on a temporary table on disk",
        );
        check(
            kind,
            &records,
            &sorted,
            SORT,
            "sort_merge_passes",
            "sort on disk",
            "sorts on disk",
        );
    }
}
