//! The unix socket of a running server, found from its PID: the one it listens on, else the one its command
//! line names, else the packaged default.

use std::{
    collections::HashSet,
    fs,
    os::unix::{ffi::OsStrExt, fs::MetadataExt},
    path::{Path, PathBuf},
};

/// Where Debian's and most distributions' servers listen.
pub const DEFAULT_SOCKET: &str = "/run/mysqld/mysqld.sock";

/// A socket path, and how it was found (said when connecting through it fails).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundSocket {
    pub path: PathBuf,
    pub origin: String,
}

/// The socket to reach the server with PID `pid` (or, without a PID, the default).
pub fn server_socket(pid: Option<u32>) -> FoundSocket {
    if let Some(pid) = pid {
        if let Some(path) = listening_socket(pid) {
            return FoundSocket {
                path: through_root(pid, &path),
                origin: format!("listening in PID {pid}"),
            };
        }
        if let Some(path) = socket_option(pid) {
            return FoundSocket {
                path: through_root(pid, &path),
                origin: format!("from PID {pid}'s --socket"),
            };
        }
    }
    FoundSocket {
        path: DEFAULT_SOCKET.into(),
        origin: "the default".into(),
    }
}

/// The path of a listening unix stream socket that the process holds open. Test servers and second instances
/// listen elsewhere than the default, and a server started with a relative or no `--socket` names none.
fn listening_socket(pid: u32) -> Option<PathBuf> {
    listening_socket_among(pid, &socket_inodes(pid))
}

/// [`listening_socket`], of the process's socket `inodes`.
fn listening_socket_among(pid: u32, inodes: &HashSet<u64>) -> Option<PathBuf> {
    if inodes.is_empty() {
        return None;
    }
    // The server's network namespace: its sockets are listed there, not necessarily in ours.
    let table = fs::read_to_string(format!("/proc/{pid}/net/unix")).ok()?;
    listening_paths(&table)
        .into_iter()
        .find(|(inode, _)| inodes.contains(inode))
        .map(|(_, path)| path)
}

fn socket_inodes(pid: u32) -> HashSet<u64> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    dir.filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// Whether the server with PID `pid` takes connections: it listens on a TCP port or a unix socket.
pub fn listens(pid: u32) -> bool {
    // Its descriptors read once: a busy server holds thousands.
    let inodes = socket_inodes(pid);
    listening_port_among(pid, &inodes).is_some() || listening_socket_among(pid, &inodes).is_some()
}

/// The TCP port the server with PID `pid` listens on (the lowest, where it listens on several: MySQL's X
/// protocol and admin ports are above its classic one), read in its own network namespace.
pub fn listening_port(pid: u32) -> Option<u16> {
    listening_port_among(pid, &socket_inodes(pid))
}

/// [`listening_port`], of the process's socket `inodes`.
fn listening_port_among(pid: u32, inodes: &HashSet<u64>) -> Option<u16> {
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok())
        .flat_map(|table| listening_ports(&table))
        .filter(|(inode, _)| inodes.contains(inode))
        .map(|(_, port)| port)
        .min()
}

/// (inode, port) of the listening sockets in a `/proc/net/tcp` or `tcp6` table.
pub fn listening_ports(table: &str) -> Vec<(u64, u16)> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = fields.get(1)?.rsplit_once(':')?.1;
            (*fields.get(3)? == LISTEN).then_some(())?;
            Some((
                fields.get(9)?.parse().ok()?,
                u16::from_str_radix(port, 16).ok()?,
            ))
        })
        .collect()
}

/// (inode, path) of the listening stream sockets with a path in a `/proc/net/unix` table.
pub fn listening_paths(table: &str) -> Vec<(u64, PathBuf)> {
    const SO_ACCEPTCON: u32 = 0x10000;
    const SOCK_STREAM: u32 = 1;
    let mut found = Vec::new();
    for line in table.lines().skip(1) {
        // Num RefCount Protocol Flags Type St Inode [Path]; the path is the rest of the line and may hold spaces.
        let mut rest = line.trim_start();
        let mut fields = [""; 7];
        for field in fields.iter_mut() {
            let end = rest.find(' ').unwrap_or(rest.len());
            *field = &rest[..end];
            rest = rest[end..].trim_start_matches(' ');
        }
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        let (Some(flags), Some(kind), Ok(inode)) =
            (hex(fields[3]), hex(fields[4]), fields[6].parse::<u64>())
        else {
            continue;
        };
        // An abstract socket (`@name`) has no file to connect to by path.
        if flags & SO_ACCEPTCON != 0 && kind == SOCK_STREAM && rest.starts_with('/') {
            found.push((inode, PathBuf::from(rest)));
        }
    }
    found
}

/// The `--socket` of the server's command line (the last one wins, as in the server's own parsing).
fn socket_option(pid: u32) -> Option<PathBuf> {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let mut found = None;
    for (i, arg) in args.iter().enumerate() {
        let value = if let Some(v) = arg.strip_prefix(b"--socket=".as_slice()) {
            Some(v)
        } else if *arg == b"--socket" {
            args.get(i + 1).copied()
        } else {
            None
        };
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            let path = PathBuf::from(std::ffi::OsStr::from_bytes(v));
            // A relative socket is in the server's working directory (its datadir, usually).
            found = Some(if path.is_absolute() {
                path
            } else {
                fs::read_link(format!("/proc/{pid}/cwd")).ok()?.join(path)
            });
        }
    }
    found
}

/// `path` as seen from here: through `/proc/PID/root` when the server has another root (a container).
fn through_root(pid: u32, path: &Path) -> PathBuf {
    let root = format!("/proc/{pid}/root");
    let same_root = match (fs::metadata(&root), fs::metadata("/")) {
        (Ok(theirs), Ok(ours)) => theirs.dev() == ours.dev() && theirs.ino() == ours.ino(),
        _ => true,
    };
    if same_root {
        path.to_path_buf()
    } else {
        Path::new(&root).join(path.strip_prefix("/").unwrap_or(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_stream_sockets_with_paths() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000003 00000000 00000000 0001 03  1092\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 1961788 /tmp/exp/mysqld.sock\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 1961790 @abstract\n\
            0000000000000000: 00000002 00000000 00010000 0002 01 1961791 /dgram.sock\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 1961792 /tmp/exp/mysqld.sock\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 1961793 /tmp/a dir/s.sock\n\
            garbage line\n";
        assert_eq!(
            listening_paths(table),
            vec![
                (1961788, PathBuf::from("/tmp/exp/mysqld.sock")),
                (1961793, PathBuf::from("/tmp/a dir/s.sock"))
            ]
        );
        assert!(listening_paths("").is_empty());
    }

    #[test]
    fn listening_tcp_ports() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1961800 1 0\n\
            1: 0100007F:0CEA 0100007F:B0C2 01 00000000:00000000 00:00000000 00000000     0        0 1961801 1 0\n\
            garbage\n";
        assert_eq!(listening_ports(table), vec![(1961800, 3306)]);
        let table6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 00000000000000000000000001000000:84D2 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1961802 1 0\n";
        assert_eq!(listening_ports(table6), vec![(1961802, 34002)]);
        // This process listens on no TCP port.
        assert_eq!(listening_port(std::process::id()), None);
    }

    #[test]
    fn no_process_falls_back_to_the_default() {
        // PID 0 has no /proc entry.
        assert_eq!(server_socket(Some(0)).path, Path::new(DEFAULT_SOCKET));
        assert_eq!(server_socket(None).origin, "the default");
    }
}
