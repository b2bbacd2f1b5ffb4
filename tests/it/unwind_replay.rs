//! The BPF unwinder's walk, replayed in Rust (myprobe::unwind::replay) over the tables myprobe builds, on a
//! core file of a fixture whose threads block at known stacks: frame for frame what eu-stack reads from the
//! same core. No kernel tracing, no database.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::common::tempdir;
use myprobe::{
    stacks::core_file::Core,
    unwind::{
        replay::{unwind, MAX_USER_FRAMES},
        ProcessTables,
    },
};

/// The fixture's threads: the chain of its own functions each one blocks under (innermost first), and the
/// syscall it blocks in.
const THREADS: [(&[&str], u64); 4] = [
    (&["main_wait", "main"], 202),              // futex (pthread_join)
    (&["a_inner", "a_middle", "a_outer"], 34),  // pause
    (&["b_inner", "b_middle", "b_outer"], 230), // clock_nanosleep
    (&["c_inner", "c_middle", "c_outer"], 0),   // read
];

/// The outermost frames of a complete stack: the main thread's and the other threads'.
const ROOTS: [&str; 2] = ["_start", "__clone3"];

/// The fixture, killed on drop.
struct Fixture(Child);

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The syscall numbers the threads of `pid` are blocked in (None for one that is running).
fn blocked_syscalls(pid: u32) -> Vec<Option<u64>> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| {
            let text = std::fs::read_to_string(t.unwrap().path().join("syscall")).unwrap();
            text.split(' ').next()?.parse().ok()
        })
        .collect()
}

/// One frame as eu-stack prints it: the address (the instruction pointer of the first frame, return
/// addresses as they are, not minus 1, for the others) and the function name.
type Frame = (u64, String);

/// eu-stack's frames of each thread in `core`, by thread id, innermost first.
fn eu_stack(core: &Path, exe: &Path) -> HashMap<u32, Vec<Frame>> {
    let out = Command::new("eu-stack")
        .arg(format!("--core={}", core.display()))
        .arg("-e")
        .arg(exe)
        .output()
        .expect("running eu-stack");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut threads: HashMap<u32, Vec<Frame>> = HashMap::new();
    let mut tid = None;
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("TID ") {
            tid = Some(t.trim_end_matches(':').parse().unwrap());
        } else if let (Some(t), Some(rest)) = (tid, line.strip_prefix('#')) {
            let mut f = rest.split_whitespace().skip(1);
            let addr = f.next().and_then(|a| a.strip_prefix("0x")).unwrap();
            let name = f.next().unwrap_or("").to_owned();
            threads
                .entry(t)
                .or_default()
                .push((u64::from_str_radix(addr, 16).unwrap(), name));
        }
    }
    assert!(
        !threads.is_empty(),
        "eu-stack printed no frames:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    threads
}

fn hex(v: &[u64]) -> String {
    v.iter()
        .map(|a| format!("{a:#x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn replayed_unwind_of_a_core_equals_eu_stack() {
    let dir = tempdir("unwind-replay");
    let exe = dir.join("replay_threads");
    let src = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/unwind/replay_threads.c"
    );
    let cc = Command::new("cc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-pthread", "-o"])
        .arg(&exe)
        .arg(src)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let mut fixture = Fixture(Command::new(&exe).stdout(Stdio::piped()).spawn().unwrap());
    let pid = fixture.0.id();
    let mut line = String::new();
    BufReader::new(fixture.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    // Wait (not a measure: a bound on waiting) until every thread blocks in its syscall.
    let mut want: Vec<Option<u64>> = THREADS.iter().map(|t| Some(t.1)).collect();
    want.sort();
    for _ in 0..500 {
        let mut now = blocked_syscalls(pid);
        now.sort();
        if now == want {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    let gcore = Command::new("gcore")
        .arg("-o")
        .arg(dir.join("core"))
        .arg(pid.to_string())
        .output()
        .expect("running gcore");
    let core_path = dir.join(format!("core.{pid}"));
    assert!(
        gcore.status.success() && core_path.exists(),
        "gcore failed: {}",
        String::from_utf8_lossy(&gcore.stderr)
    );
    drop(fixture);

    let eu = eu_stack(&core_path, &exe);
    let core = Core::read(&core_path).unwrap();
    assert_eq!(core.threads.len(), THREADS.len(), "threads in the core");
    let mut tables = ProcessTables::default();
    let code = core.code_mappings(&|p: &Path| p.to_path_buf());
    for m in &code {
        tables.add_mapping(m);
    }
    assert!(
        tables.process.warnings.is_empty(),
        "{:?}",
        tables.process.warnings
    );
    for lib in ["replay_threads", "libc.so.6"] {
        assert!(
            code.iter().any(|m| m.path.ends_with(lib)),
            "no code mapping of {lib}: {code:?}"
        );
    }

    let mut chains_seen = Vec::new();
    for t in &core.threads {
        let ours = unwind(
            tables.tables(),
            t.regs,
            |a| core.read_u64(a),
            MAX_USER_FRAMES,
        );
        let frames = eu
            .get(&t.tid)
            .unwrap_or_else(|| panic!("eu-stack printed no thread {}", t.tid));
        let names: Vec<&str> = frames.iter().map(|f| f.1.as_str()).collect();
        let theirs: Vec<u64> = frames.iter().map(|f| f.0).collect();
        // eu-stack's names, not our symbolizer's: the stack is the fixture's and complete.
        assert!(
            names.last().is_some_and(|n| ROOTS.contains(n)),
            "eu-stack did not reach the root of thread {}: {names:?}",
            t.tid
        );
        let chain = THREADS
            .iter()
            .position(|(chain, _)| names.windows(chain.len()).any(|w| w == *chain))
            .unwrap_or_else(|| panic!("thread {}: no known chain in {names:?}", t.tid));
        chains_seen.push(chain);
        assert!(
            ours == theirs,
            "thread {} ({:?}): frames differ\n  replay:   {}\n  eu-stack: {}\n  names:    {names:?}",
            t.tid,
            THREADS[chain].0,
            hex(&ours),
            hex(&theirs)
        );
    }
    chains_seen.sort();
    assert_eq!(
        chains_seen,
        (0..THREADS.len()).collect::<Vec<_>>(),
        "each known stack on one thread"
    );
}
