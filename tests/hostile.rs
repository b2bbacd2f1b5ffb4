//! What a client writes cannot forge, hide or garble a statement record. The framing cases run against a C
//! fixture whose server thread reads as MariaDB does, so that every record expected is known exactly.

mod common;
use std::process::Command;

use common::*;
use serde_json::Value;

/// The statements `queries --raw-sql` reports for the fixture's work, in order.
fn statements_of(fixture: &mut Fixture, extra: &[&str]) -> (Vec<String>, String) {
    let pid = fixture.child.id().to_string();
    let mut args = vec![
        "queries",
        "--any-process",
        "--raw-sql",
        "--json",
        "-p",
        &pid,
    ];
    args.extend_from_slice(extra);
    let tracer = Background::start(&args, "tracing the statements");
    fixture.go();
    let (out, err) = tracer.stop();
    let records: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let queries = records
        .iter()
        .map(|r| r["query"].as_str().unwrap_or("<none>").to_string())
        .collect();
    (queries, err)
}

#[test]
fn split_headers_empty_packets_and_msghdr_calls_are_framed_exactly() {
    let dir = tempdir("fake-wire");
    let exe = compile_fixture(&dir, "fake_wire", &["protocol/fake_wire.c"], &["-pthread"]);
    let mut fixture = Fixture::start(&mut Command::new(&exe));
    let (queries, err) = statements_of(&mut fixture, &[]);
    assert_eq!(
        queries,
        ["SELECT 1", "SELECT 2", "SELECT 3"],
        "stderr:\n{err}"
    );
}
