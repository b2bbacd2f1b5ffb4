//! Finding the server process to trace, its flavor and version, and checking that this machine can trace it.

pub mod container;
pub mod maps;
pub mod memory;
pub mod probes;
pub mod tids;

use std::{fs, path::PathBuf};

use anyhow::{bail, Context, Result};

use crate::server::{Flavor, PROCESS_NAMES};

#[derive(Clone, Debug)]
pub struct Target {
    pub pid: u32,
    pub comm: String,
    /// The executable's path, as the process's memory map names it (for people).
    pub exe: PathBuf,
    /// Where the running executable is read and probed: `/proc/PID/exe`, the file that runs even when its path
    /// now names another (an upgrade) or none (deleted), or lives in another mount namespace (a container).
    pub binary: PathBuf,
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

/// The process to trace: `pid` if given (it must be a server unless `any_process`), else the one running server.
pub fn resolve(pid: Option<u32>, any_process: bool) -> Result<Target> {
    let pid = match pid {
        Some(pid) => {
            let comm = comm_of(pid).with_context(|| format!("no process with PID {pid}"))?;
            if !any_process && !PROCESS_NAMES.contains(&comm.as_str()) {
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
    let exe = exe_of(pid).with_context(|| format!("process {pid} has exited (or is a zombie)"))?;
    if let Some(started) = start_time(pid) {
        watched().insert(pid, started);
    }
    let (flavor, version) = server_version(pid, &comm);
    Ok(Target {
        pid,
        comm,
        exe,
        binary: PathBuf::from(format!("/proc/{pid}/exe")),
        flavor,
        version,
    })
}

/// The processes [`resolve`] found, by PID, and their start times: what [`exited`] checks. The agent traces
/// several; bounded by the PIDs the system has.
static WATCHED: std::sync::Mutex<std::collections::BTreeMap<u32, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn watched() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<u32, u64>> {
    WATCHED.lock().unwrap_or_else(|e| e.into_inner())
}

/// When the process with this PID started (clock ticks after boot): with the PID, it names one process even
/// when the PID is reused.
fn start_time(pid: u32) -> Option<u64> {
    Stat::of(&pid.to_string()).map(|s| s.start_time)
}

/// What /proc/PID/stat says of a process, as far as myprobe reads it: the one parse of that file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// CPU time in user and kernel mode, clock ticks.
    pub utime: u64,
    pub stime: u64,
    pub threads: u64,
    /// When it started, clock ticks after boot.
    pub start_time: u64,
    /// Resident memory, pages.
    pub rss_pages: u64,
}

impl Stat {
    /// Parses a /proc/PID/stat line; None if a field is missing.
    pub fn parse(stat: &str) -> Option<Stat> {
        let n = |field: usize| stat_field(stat, field)?.parse::<u64>().ok();
        Some(Stat {
            utime: n(14)?,
            stime: n(15)?,
            threads: n(20)?,
            start_time: n(22)?,
            rss_pages: n(24)?,
        })
    }

    /// The process `pid` (a number, or `self`) as it is now.
    pub fn of(pid: &str) -> Option<Stat> {
        Stat::parse(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }
}

/// Field `n` (from 1, as proc(5) numbers them) of a /proc/PID/stat or /proc/PID/task/TID/stat line; counted after
/// the name in parentheses, which may hold anything, spaces and parentheses too. `n` is 3 (the state) or more.
pub fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(n.checked_sub(3)?)
}

/// How long ago the process `pid` started; `None` if it is gone.
pub fn running_for(pid: u32) -> Option<std::time::Duration> {
    let started = start_time(pid)?;
    let uptime: f64 = fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(std::time::Duration::from_secs_f64(
        (uptime - started as f64 / ticks).max(0.0),
    ))
}

/// Whether the process [`resolve`] found with this PID exited since (a server restarted has a new PID, and a PID
/// reused names another process).
pub fn exited(pid: u32) -> bool {
    let started = watched().get(&pid).copied();
    started.is_some_and(|started| start_time(pid) != Some(started))
}

/// The executable of a process, as its memory map names it (without the ` (deleted)` of a replaced file).
pub fn exe_of(pid: u32) -> Result<PathBuf> {
    let link = fs::read_link(format!("/proc/{pid}/exe"))
        .with_context(|| format!("reading /proc/{pid}/exe"))?;
    Ok(
        match link.to_str().and_then(|l| l.strip_suffix(" (deleted)")) {
            Some(path) => PathBuf::from(path),
            None => link,
        },
    )
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

/// A signal's name, as `kill -l` gives it: `SIGSEGV`.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {signal}"),
    };
    name.to_string()
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
        .filter(|&pid| comm_of(pid).is_ok_and(|c| PROCESS_NAMES.contains(&c.as_str())))
        .collect();
    pids.sort_unstable();
    pids
}

/// The servers a command that reads a picture of one (`report`, `stacks`) reads: `pid`'s; else the one running;
/// of several, `all`, or the busiest over a moment, which is said with the others.
pub fn servers_to_read(pid: Option<u32>, any_process: bool, all: bool) -> Result<Vec<Target>> {
    if pid.is_some() {
        return Ok(vec![resolve(pid, any_process)?]);
    }
    let servers = find_servers();
    if let [one] = servers.as_slice() {
        return Ok(vec![resolve(Some(*one), any_process)?]);
    }
    if servers.is_empty() {
        // Its error says so, and what to do.
        return Ok(vec![resolve(None, any_process)?]);
    }
    if all {
        // A server that exited since it was listed is left out.
        return Ok(servers
            .into_iter()
            .filter_map(|p| resolve(Some(p), false).ok())
            .collect());
    }
    let cpu = |p: u32| Stat::of(&p.to_string()).map_or(0, |s| s.utime + s.stime);
    let before: Vec<u64> = servers.iter().map(|&p| cpu(p)).collect();
    let moment = std::time::Duration::from_millis(300);
    std::thread::sleep(moment);
    let busiest = servers
        .iter()
        .zip(before)
        .map(|(&p, before)| (cpu(p).saturating_sub(before), p))
        .max_by_key(|&(ticks, p)| (ticks, std::cmp::Reverse(p)))
        .map(|(_, p)| p)
        .expect("several servers");
    let target = resolve(Some(busiest), false)?;
    let others: Vec<String> = servers
        .iter()
        .filter(|&&p| p != busiest)
        .map(|&p| describe(p))
        .collect();
    say!(
        "myprobe: {} servers run; reading {target}, the busiest over {} ms (the others: {}); -p PID reads \
         another, --all every one",
        servers.len(),
        moment.as_millis(),
        others.join("; ")
    );
    Ok(vec![target])
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

/// Flavor and version as the server reports them to its clients: its `server_version` variable, read from its
/// memory at the address its binary's symbol table gives. Nothing of the target is executed (its name is
/// chosen by whoever started it, and its PID may be reused meanwhile); the binary is read through
/// `/proc/PID/exe`, the file that runs even when it was deleted (upgraded) or lives in a container.
fn server_version(pid: u32, comm: &str) -> (Flavor, String) {
    let binary = PROCESS_NAMES
        .contains(&comm)
        .then(|| fs::File::open(format!("/proc/{pid}/exe")).ok())
        .flatten();
    let version = binary
        .as_ref()
        .and_then(|file| version_in_memory(pid, file))
        .unwrap_or_default();
    let flavor = Flavor::of(&version, Some(comm), |bytes| {
        binary
            .as_ref()
            .is_some_and(|file| file_contains(file, bytes).unwrap_or(false))
    });
    (flavor, version)
}

/// Longest `server_version` read (MariaDB's and MySQL's SERVER_VERSION_LENGTH is 60).
const SERVER_VERSION_MAX: usize = 64;

/// The NUL-terminated string at the runtime address of the binary's `server_version` symbol.
fn version_in_memory(pid: u32, binary: &fs::File) -> Option<String> {
    let mapped = memory::mapped_start(pid, binary)?;
    server_version_at(&memory::ProcMemory::open(pid).ok()?, binary, mapped)
}

/// The server's `server_version` in `mem`, a process's or a core's that maps `binary` from `mapped`.
pub fn server_version_at(
    mem: &impl memory::Memory,
    binary: &fs::File,
    mapped: u64,
) -> Option<String> {
    let address = memory::symbol_addresses(binary, mapped, &["server_version"])
        .ok()?
        .pop()??;
    let mut bytes = [0u8; SERVER_VERSION_MAX];
    let n = mem.read(address, &mut bytes);
    let text = bytes[..n].split(|&b| b == 0).next()?;
    // Printable ASCII, spaces too: `11.8.9-MariaDB-0+deb13u1 from Debian`.
    let printable = !text.is_empty() && text.iter().all(|b| (b' '..=b'~').contains(b));
    printable.then(|| String::from_utf8_lossy(text).into_owned())
}

/// Whether `needle` occurs in the file, read a chunk at a time (chunks overlap by the needle's length, so a match
/// across a boundary is found).
fn file_contains(file: &fs::File, needle: &[u8]) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    const CHUNK: usize = 1 << 20;
    let finder = memchr::memmem::Finder::new(needle);
    let overlap = needle.len().saturating_sub(1);
    let mut buf = vec![0u8; CHUNK + overlap];
    let (mut kept, mut offset) = (0usize, 0u64);
    loop {
        let n = file.read_at(&mut buf[kept..], offset)?;
        if n == 0 {
            return Ok(false);
        }
        let filled = kept + n;
        if finder.find(&buf[..filled]).is_some() {
            return Ok(true);
        }
        offset += n as u64;
        kept = overlap.min(filled);
        buf.copy_within(filled - kept..filled, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_names_this_process() {
        let me = std::process::id();
        let t = start_time(me).expect("a start time");
        assert_eq!(start_time(me), Some(t));
        assert!(start_time(u32::MAX).is_none());
    }

    #[test]
    fn stat_fields_count_past_a_name_with_spaces_and_parentheses() {
        let stat = "42 (a) b (c)) S 1 42 0 0 -1";
        assert_eq!(stat_field(stat, 3), Some("S"));
        assert_eq!(stat_field(stat, 5), Some("42"));
        assert_eq!(stat_field(stat, 8), Some("-1"));
        assert_eq!(stat_field(stat, 9), None);
        assert_eq!(stat_field(stat, 2), None);
        assert_eq!(stat_field("no name", 3), None);
    }

    #[test]
    fn a_needle_across_a_chunk_boundary_is_found() {
        use std::io::Write;
        let needle = b"compilation comment";
        for at in [0usize, (1 << 20) - 7, (1 << 20) - 1, 1 << 20, (3 << 20) + 5] {
            let mut file = tempfile::tempfile().unwrap();
            let mut bytes = vec![b'x'; (4 << 20) + 100];
            bytes[at..at + needle.len()].copy_from_slice(needle);
            file.write_all(&bytes).unwrap();
            assert!(file_contains(&file, needle).unwrap(), "needle at {at}");
        }
        let mut absent = tempfile::tempfile().unwrap();
        absent.write_all(&vec![b'x'; 3 << 20]).unwrap();
        assert!(!file_contains(&absent, needle).unwrap());
    }
}
