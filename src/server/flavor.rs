//! Which server a process or a text is: its [`Flavor`], from what the running server says of itself (its version,
//! and for Percona Server its binary), each flavor's [`Server`]; and what is read without knowing which server it
//! came from: every server's lock names, whose crash report a text is.

use super::{CrashReport, LockNames, MariaDb, MySql, Server, PROCESS_NAMES};

/// What Percona Server's binary holds, in its compilation comment, and MySQL's does not.
const PERCONA_MARK: &[u8] = b"Percona Server";

/// What a traced process is, from the version it reports (`process::resolve`).
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

impl Flavor {
    /// MariaDB says so in its version; Percona Server in its binary's compilation comment (`binary_holds` tells
    /// whether the binary holds the bytes it is given, asked only when needed); where the version could not be
    /// read, the process's name tells MariaDB's. `comm`: the process's name where known; one that is no server's
    /// is [`Flavor::Other`].
    pub fn of(
        version: &str,
        comm: Option<&str>,
        binary_holds: impl FnOnce(&[u8]) -> bool,
    ) -> Flavor {
        if comm.is_some_and(|c| !PROCESS_NAMES.contains(&c)) {
            Flavor::Other
        } else if version.contains("MariaDB") {
            Flavor::MariaDb
        } else if version.is_empty() {
            match comm {
                Some("mariadbd") => Flavor::MariaDb,
                _ => Flavor::MySql,
            }
        } else if binary_holds(PERCONA_MARK) {
            Flavor::Percona
        } else {
            Flavor::MySql
        }
    }

    /// The server's ways: MySQL's for its forks, and for a process that is no server.
    pub fn server(self) -> &'static dyn Server {
        match self {
            Flavor::MariaDb => &MariaDb,
            _ => &MySql,
        }
    }

    /// A database server, whose connections its memory holds (not a process traced with `--any-process`).
    pub fn is_server(self) -> bool {
        self != Flavor::Other
    }

    /// The database system as OpenTelemetry's `db.system` names it.
    pub fn db_system(self) -> &'static str {
        match self {
            Flavor::MySql | Flavor::Percona => "mysql",
            _ => "mariadb",
        }
    }
}

/// The servers known, for what must be recognized whichever one runs (a tracer's own statements).
pub const ALL: [&dyn Server; 2] = [&MariaDb, &MySql];

/// The server whose `VERSION()` (or `server_version`) is `version`: MariaDB says so in it, MySQL and its forks
/// (Percona Server) do not.
pub fn of_version(version: &str) -> &'static dyn Server {
    Flavor::of(version, None, |_| false).server()
}

/// Every server's lock names: a stack is read without asking which server it came from (a core, a process
/// given by PID), and their names do not collide.
pub fn all_lock_names() -> impl Iterator<Item = &'static LockNames> {
    ALL.into_iter().map(|s| s.lock_names())
}

/// Whose crash report a text is (its `got signal` line and its lines): the server whose marks it holds, else
/// MariaDB's (older reports hold none).
pub fn crash_report_of(signal_line: Option<&str>, lines: &[&str]) -> CrashReport {
    ALL.iter()
        .map(|s| s.crash_report())
        .find(|r| r.is_of(signal_line, lines))
        .unwrap_or(MariaDb.crash_report())
}

/// Whether an error log's line is a server's start (any server's: a log is read without knowing whose it is).
pub fn is_start_in_log(line: &str) -> bool {
    ALL.iter()
        .flat_map(|s| s.crash_report().start_marks)
        .any(|m| line.contains(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flavors_from_the_version_and_the_binary() {
        let mariadb = Flavor::of("10.11.19-MariaDB-0+deb12u1", Some("mysqld"), |_| {
            panic!("a MariaDB version needs no search of the binary")
        });
        assert_eq!(mariadb, Flavor::MariaDb);
        assert_eq!(
            Flavor::of("8.0.36", Some("mariadbd"), |_| false),
            Flavor::MySql
        );
        assert_eq!(
            Flavor::of("8.0.35-27", Some("mysqld"), |bytes| bytes
                == b"Percona Server"),
            Flavor::Percona
        );
        assert_eq!(Flavor::of("", Some("mariadbd"), |_| true), Flavor::MariaDb);
        assert_eq!(Flavor::of("", Some("mysqld"), |_| true), Flavor::MySql);
        assert_eq!(Flavor::of("", Some("fixture"), |_| true), Flavor::Other);
    }

    #[test]
    fn versions_choose_the_server() {
        assert_eq!(of_version("10.11.19-MariaDB-0+deb12u1").name(), "MariaDB");
        assert_eq!(
            of_version("11.8.9-MariaDB-0+deb13u1 from Debian").name(),
            "MariaDB"
        );
        assert_eq!(of_version("10.11.6-MariaDB-0+deb12u1").name(), "MariaDB");
        assert_eq!(of_version("9.7.4-2").name(), "MySQL");
        assert_eq!(of_version("8.0.36").name(), "MySQL");
        assert_eq!(of_version("8.0.35-27").name(), "MySQL");
    }
}
