//! Finding the server process to trace, its flavor and version, and checking that this machine can trace it.

pub mod maps;
pub mod probes;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context, Result};

/// Process names of the servers myprobe knows.
const SERVER_NAMES: [&str; 2] = ["mariadbd", "mysqld"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    MariaDb,
    MySql,
    Percona,
    /// Not a database server: traced on request (`--any-process`), e.g. a test fixture.
    Other,
}

impl std::fmt::Display for Flavor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Flavor::MariaDb => "MariaDB",
            Flavor::MySql => "MySQL",
            Flavor::Percona => "Percona Server",
            Flavor::Other => "process",
        })
    }
}

#[derive(Clone, Debug)]
pub struct Target {
    pub pid: u32,
    pub comm: String,
    pub exe: PathBuf,
    pub flavor: Flavor,
    /// As the binary reports it, e.g. `10.11.19-MariaDB-0+deb12u1`; empty if unknown.
    pub version: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (PID {}", self.comm, self.pid)?;
        if !self.version.is_empty() {
            write!(f, ", {} {}", self.flavor, self.version)?;
        }
        write!(f, ")")
    }
}

/// Checks what tracing needs before anything is loaded: root, and BTF for CO-RE.
pub fn check_environment(btf: Option<&Path>) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("myprobe needs root to load BPF programs and open perf events: run it with sudo");
    }
    match btf {
        Some(path) if !path.is_file() => {
            bail!(
                "BTF file {} does not exist: pass the BTF of the running kernel with --btf",
                path.display()
            )
        }
        Some(_) => {}
        None if !Path::new("/sys/kernel/btf/vmlinux").exists() => bail!(
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing): use a kernel built with \
             CONFIG_DEBUG_INFO_BTF=y, or pass a BTF file for it with --btf"
        ),
        None => {}
    }
    Ok(())
}

/// The process to trace: `pid` if given (it must be a server unless `any_process`), else the one running server.
pub fn resolve(pid: Option<u32>, any_process: bool) -> Result<Target> {
    let pid = match pid {
        Some(pid) => {
            let comm = comm_of(pid).with_context(|| format!("no process with PID {pid}"))?;
            if !any_process && !SERVER_NAMES.contains(&comm.as_str()) {
                bail!(
                    "PID {pid} is `{comm}`, not a MySQL or MariaDB server (mariadbd/mysqld); \
                     pass --any-process to trace it anyway"
                );
            }
            pid
        }
        None => {
            let servers = find_servers();
            match servers.as_slice() {
                [] => bail!("no MySQL or MariaDB server (mariadbd/mysqld) is running: start one, or pass -p PID"),
                [one] => *one,
                several => {
                    let list: Vec<String> = several.iter().map(|&p| describe(p)).collect();
                    bail!("{} servers are running, pick one with -p PID: {}", several.len(), list.join("; "))
                }
            }
        }
    };
    let comm = comm_of(pid).with_context(|| format!("process {pid} exited"))?;
    let exe = exe_of(pid)?;
    let (flavor, version) = if SERVER_NAMES.contains(&comm.as_str()) {
        server_version(pid)
    } else {
        (Flavor::Other, String::new())
    };
    Ok(Target {
        pid,
        comm,
        exe,
        flavor,
        version,
    })
}

/// The executable of a process, as its memory map names it.
pub fn exe_of(pid: u32) -> Result<PathBuf> {
    fs::read_link(format!("/proc/{pid}/exe")).with_context(|| format!("reading /proc/{pid}/exe"))
}

/// The file names of the libraries in a process's `LD_PRELOAD` (`mysqld_safe --malloc-lib` puts its
/// allocator there).
pub fn preloaded_libraries(pid: u32) -> Vec<String> {
    let environ = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    environ
        .split(|&b| b == 0)
        .filter_map(|v| v.strip_prefix(b"LD_PRELOAD="))
        .flat_map(|v| {
            let v = String::from_utf8_lossy(v);
            v.split([':', ' '])
                .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
                .collect::<Vec<_>>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

/// The name of a thread (`/proc/PID/task/TID/comm`); empty when it exited.
pub fn thread_name(pid: u32, tid: u32) -> String {
    let name = fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default();
    name.trim().to_string()
}

fn comm_of(pid: u32) -> Result<String> {
    Ok(fs::read_to_string(format!("/proc/{pid}/comm"))?
        .trim_end()
        .to_string())
}

/// PIDs of every running mariadbd/mysqld, in PID order.
pub fn find_servers() -> Vec<u32> {
    let mut pids: Vec<u32> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| comm_of(pid).is_ok_and(|c| SERVER_NAMES.contains(&c.as_str())))
        .collect();
    pids.sort_unstable();
    pids
}

/// "PID (comm --datadir=… --socket=…)" so that a user can tell servers apart.
fn describe(pid: u32) -> String {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .filter(|a| {
            a.starts_with("--datadir") || a.starts_with("--socket") || a.starts_with("--port")
        })
        .collect();
    let comm = comm_of(pid).unwrap_or_default();
    if args.is_empty() {
        format!("{pid} ({comm})")
    } else {
        format!("{pid} ({comm} {})", args.join(" "))
    }
}

/// Flavor and version from the server binary's `--version` (it only prints and exits); bounded in time.
fn server_version(pid: u32) -> (Flavor, String) {
    let fallback = |comm: &str| {
        if comm == "mariadbd" {
            Flavor::MariaDb
        } else {
            Flavor::MySql
        }
    };
    let comm = comm_of(pid).unwrap_or_default();
    let Ok(mut child) = Command::new(format!("/proc/{pid}/exe"))
        .arg("--no-defaults")
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        return (fallback(&comm), String::new());
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            let mut out = String::new();
            if let Some(mut stdout) = child.stdout.take() {
                let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
            }
            return parse_version(&out, fallback(&comm));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    (fallback(&comm), String::new())
}

/// Parses `mariadbd  Ver 10.11.19-MariaDB-0+deb12u1 for debian-linux-gnu on x86_64 (Debian 12)`.
fn parse_version(out: &str, fallback: Flavor) -> (Flavor, String) {
    let version = out
        .split_whitespace()
        .skip_while(|w| *w != "Ver")
        .nth(1)
        .unwrap_or("")
        .to_string();
    let flavor = if out.contains("MariaDB") {
        Flavor::MariaDb
    } else if out.contains("Percona") {
        Flavor::Percona
    } else if version.is_empty() {
        fallback
    } else {
        Flavor::MySql
    };
    (flavor, version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_server_versions() {
        let (f, v) = parse_version(
            "mariadbd  Ver 10.11.19-MariaDB-0+deb12u1 for debian-linux-gnu on x86_64 (Debian 12)\n",
            Flavor::MySql,
        );
        assert_eq!(
            (f, v.as_str()),
            (Flavor::MariaDb, "10.11.19-MariaDB-0+deb12u1")
        );
        let (f, v) = parse_version(
            "/usr/sbin/mysqld  Ver 8.0.36 for Linux on x86_64 (MySQL Community Server - GPL)\n",
            Flavor::MariaDb,
        );
        assert_eq!((f, v.as_str()), (Flavor::MySql, "8.0.36"));
        let (f, v) = parse_version(
            "mysqld  Ver 8.0.35-27 for Linux on x86_64 (Percona Server (GPL), Release '27')",
            Flavor::MySql,
        );
        assert_eq!((f, v.as_str()), (Flavor::Percona, "8.0.35-27"));
        assert_eq!(
            parse_version("", Flavor::MariaDb),
            (Flavor::MariaDb, String::new())
        );
    }
}
