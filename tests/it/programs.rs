//! Every BPF program of every collector loads into this kernel with room to spare (`myprobe programs` on every
//! server the tests start, and on MariaDB 10.11 in each way the kernels of `make kernels` differ: without
//! uprobe_multi links or sessions, without the socket, futex and scheduler counts, without bpf_loop: the compat
//! build); and a program the verifier refuses is one line, its log in a file.

use std::io::Write;

use myprobe::collect::load::{self, Refused, VERIFIER_LIMIT};

use crate::common::*;

/// The configurations `myprobe programs` loads, as its table names them.
const CONFIGURATIONS: &[&str] = &[
    "profile cpu",
    "profile offcpu",
    "agent, off-CPU, one set for its servers",
    "profile locks",
    "agent, lock waits, one set for its servers",
    "profile syscalls",
    "profile alloc",
    "profile alloc --sample 10",
    "profile alloc --frame-pointers",
    "profile memleak",
    "trace",
    "stacks",
    "queries",
    "queries --syscall-cpu",
];

#[test]
fn every_program_loads_with_room_to_spare() {
    // Every way the kernels differ, on the host's MariaDB; and each other server's own functions and
    // dispatch_command's arguments (the statements' programs read them), on this kernel's features.
    let disabled_sets = [
        "",
        "uprobe_session",
        "uprobe_multi,uprobe_session",
        "socket_tracepoints,sched_info,futex_tracepoints",
        "bpf_loop",
    ];
    for (kind, db) in every_server() {
        let sets = if kind == "mariadb-10.11" {
            &disabled_sets[..]
        } else {
            &disabled_sets[..1]
        };
        for disabled in sets {
            loads_with_room_to_spare(kind, db.pid, disabled);
        }
    }
}

/// `myprobe programs` on server `pid` with the features `disabled` turned off: every program loaded (or, without
/// bpf_loop, said in one line why it cannot be) under half the verifier's limit.
fn loads_with_room_to_spare(kind: &str, pid: u32, disabled: &str) {
    let out = myprobe()
        .args(["programs", "-p", &pid.to_string()])
        .env("MYPROBE_DISABLE", disabled)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Into every log, passed or not (libtest keeps only what the print macros write).
    let _ = writeln!(
        std::io::stderr(),
        "myprobe programs on {kind}, MYPROBE_DISABLE={disabled:?}:\n{table}"
    );
    assert!(
        out.status.success(),
        "{kind}, MYPROBE_DISABLE={disabled:?}: {stderr}\n{table}"
    );
    let rows: Vec<(&str, u32)> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let insns = words.get(words.len().checked_sub(2)?)?.parse().ok()?;
            Some((l, insns))
        })
        .collect();
    assert!(!rows.is_empty(), "{table}");
    for (line, insns) in &rows {
        assert!(
            *insns > 0 && *insns <= VERIFIER_LIMIT / 2,
            "{kind}, MYPROBE_DISABLE={disabled:?}: {line}"
        );
    }
    // Each configuration loaded, or (the compat build) said in one line why it cannot here.
    for c in CONFIGURATIONS {
        let said = table.lines().filter(|l| {
            l.strip_prefix(c)
                .is_some_and(|rest| rest.starts_with("  ") || rest.starts_with(' '))
        });
        let loaded = said.clone().any(|l| rows.iter().any(|(r, _)| *r == l));
        let refused_here = disabled == "bpf_loop"
            && said
                .clone()
                .any(|l| l.contains("this kernel has no bpf_loop"));
        assert!(
            loaded || refused_here,
            "{kind}, MYPROBE_DISABLE={disabled:?}: {c} neither loaded nor refused:\n{table}"
        );
    }
}

#[test]
fn a_program_the_verifier_refuses_is_one_line_with_its_log_in_a_file() {
    let dir = tempdir("verifier");
    let object = dir.join("refused.bpf.o");
    let built = std::process::Command::new("clang")
        .args(["-O2", "-g", "-target", "bpf", "-c"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/verifier/refused.bpf.c"
        ))
        .arg("-o")
        .arg(&object)
        .status()
        .unwrap();
    assert!(built.success());
    let open = libbpf_rs::ObjectBuilder::default()
        .open_file(&object)
        .unwrap();
    let e = match load::loading("the fixture", || open.load()) {
        Ok(_) => panic!("the verifier let a map value be used without a check"),
        Err(e) => e,
    };
    let refused = e
        .downcast_ref::<Refused>()
        .expect("a refusal by the verifier");
    assert_eq!(refused.program.as_deref(), Some("unchecked_lookup"));
    assert!(
        refused.reason.contains("invalid mem access"),
        "{}",
        refused.reason
    );
    let line = e.to_string();
    assert!(!line.contains('\n'), "{line}");
    assert!(
        line.starts_with("the kernel's verifier refused the fixture's programs (unchecked_lookup)"),
        "{line}"
    );
    let log = refused.log.clone().expect("the log kept");
    assert!(line.contains(&log.display().to_string()), "{line}");
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    assert!(
        text.contains("-- BEGIN PROG LOAD LOG --") && text.contains("invalid mem access"),
        "{text}"
    );
}
