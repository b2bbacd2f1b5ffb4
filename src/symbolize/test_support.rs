//! Test helpers shared by the symbolizers' tests: C fixtures compiled at test time, run as child processes
//! that print `label 0xADDR` lines then `ready`, and an independent reading of `/proc/PID/maps`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// A fixture source under `tests/fixtures/`.
pub fn fixture_source(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// A directory for builds, one per test process and prefix (private, `<prefix><pid>-<random>` in the temporary
/// directory); those of test processes that are gone are removed.
pub fn build_dir(prefix: &str) -> PathBuf {
    // Per test process: its tests run on threads of one process, and each prefix's directory is made once.
    static DIRS: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, dir)) = dirs.iter().find(|(p, _)| p == prefix) {
        return dir.clone();
    }
    let tmp = std::env::temp_dir();
    for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let dir = tempfile::Builder::new()
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .prefix(&format!("{prefix}{}-", std::process::id()))
        .tempdir()
        .expect("creating a temporary directory")
        .keep();
    dirs.push((prefix.to_string(), dir.clone()));
    dir
}

/// Runs `cmd` (compiler, then flags) `-o out source libs…`; whether it succeeded.
pub fn compile(cmd: &[&str], source: &Path, out: &Path, libs: &[&str]) -> bool {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .arg("-o")
        .arg(out)
        .arg(source)
        .args(libs)
        .status()
        .is_ok_and(|s| s.success())
}

/// A stripped copy of `from` at `to`.
pub fn strip(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap();
    let status = Command::new("strip")
        .arg(to)
        .status()
        .expect("running strip");
    assert!(status.success(), "strip failed");
}

/// `nm` of a binary: symbol name → ELF virtual address.
pub fn nm(path: &Path) -> HashMap<String, u64> {
    let out = Command::new("nm").arg(path).output().expect("running nm");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            let _kind = f.next()?;
            Some((f.next()?.to_owned(), addr))
        })
        .collect()
}

/// A running fixture, killed on drop; `addrs` holds the addresses it printed.
pub struct Running {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addrs: HashMap<String, u64>,
}

impl Running {
    /// Starts `path` and reads what it prints up to `ready`; `expected` is a label it must have printed.
    pub fn start(path: &Path, expected: &str) -> Running {
        let mut child = Command::new(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting fixture");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut running = Running {
            child,
            stdin,
            stdout,
            addrs: HashMap::new(),
        };
        running.read_until_ready();
        assert!(
            running.addrs.contains_key(expected),
            "fixture did not report: {:?}",
            running.addrs
        );
        running
    }

    fn read_until_ready(&mut self) {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "fixture ended early");
            let line = line.trim_end();
            if line == "ready" {
                return;
            }
            let (name, addr) = line.split_once(' ').unwrap();
            // glibc prints a null pointer as "(nil)".
            let addr = u64::from_str_radix(addr.trim_start_matches("0x"), 16).unwrap_or(0);
            self.addrs.insert(name.to_owned(), addr);
        }
    }

    /// Sends a command line and reads the addresses printed in answer.
    pub fn command(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        self.read_until_ready();
    }

    /// Kills the fixture and waits for its end.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn addr(&self, name: &str) -> u64 {
        self.addrs[name]
    }

    /// The mappings of the fixture.
    pub fn maps(&self) -> Vec<MapLine> {
        maps_of(self.pid())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One line of `/proc/PID/maps`, read without the code under test.
#[derive(Debug)]
pub struct MapLine {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub offset: u64,
    /// "" for an anonymous mapping.
    pub path: String,
}

pub fn maps_of(pid: u32) -> Vec<MapLine> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.splitn(6, ' ').collect();
            let (s, e) = f[0].split_once('-').unwrap();
            MapLine {
                start: u64::from_str_radix(s, 16).unwrap(),
                end: u64::from_str_radix(e, 16).unwrap(),
                perms: f[1].to_owned(),
                offset: u64::from_str_radix(f[2], 16).unwrap(),
                path: f.get(5).map_or("", |p| p.trim()).to_owned(),
            }
        })
        .collect()
}
