//! The files behind a statement's blocked reads, writes and syncs, named by what they are to the server: a table's
//! tablespace (a page read), the redo log, the binary log, a temporary file. The kernel side keeps the descriptor
//! of each I/O part's longest syscall (`query_counters.io_fd`); its file is the process's `/proc/PID/fd` link.

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use crate::server::Cause;

/// How long a descriptor's file is taken as known: a descriptor closed and reopened names another file.
const FRESH: Duration = Duration::from_secs(2);

/// Most descriptors remembered.
const MAX_REMEMBERED: usize = 4096;

/// The files behind the server's descriptors, read as statements need them.
pub struct Files {
    fd_dir: std::path::PathBuf,
    known: HashMap<i32, (Option<String>, Instant)>,
}

impl Files {
    pub fn new(pid: u32) -> Files {
        Files {
            fd_dir: format!("/proc/{pid}/fd").into(),
            known: HashMap::new(),
        }
    }

    /// The path of descriptor `fd` (as the server sees it: a container's own), if it is open.
    pub fn path(&mut self, fd: i32) -> Option<String> {
        let now = Instant::now();
        if let Some((path, at)) = self.known.get(&fd) {
            if now.duration_since(*at) < FRESH {
                return path.clone();
            }
        }
        if self.known.len() >= MAX_REMEMBERED {
            self.known
                .retain(|_, (_, at)| now.duration_since(*at) < FRESH);
        }
        let path = std::fs::read_link(self.fd_dir.join(fd.to_string()))
            .ok()
            .map(|p| p.to_string_lossy().into_owned());
        self.known.insert(fd, (path.clone(), now));
        path
    }

    /// The cause and object of a blocked syscall of `part` (0 read, 1 write, 2 sync) on descriptor `fd`.
    pub fn cause(&mut self, part: usize, fd: i32) -> Option<(Cause, Option<String>)> {
        let path = self.path(fd)?;
        Some(file_cause(&path, part))
    }
}

/// What a blocked syscall of `part` (0 read, 1 write, 2 sync) on the file at `path` waits for, and on what, by the
/// names InnoDB and the binary log give their files (MariaDB's and MySQL's alike): a tablespace's read is a page
/// read, its write or sync a page flush; the redo log; the binlog's write and sync, its group commit.
pub fn file_cause(path: &str, part: usize) -> (Cause, Option<String>) {
    let plain = [Cause::FileRead, Cause::FileWrite, Cause::FileSync][part.min(2)];
    let (path, deleted) = match path.strip_suffix(" (deleted)") {
        Some(p) => (p, true),
        None => (path, false),
    };
    let file = Path::new(path);
    let name = file
        .file_name()
        .map_or(path.into(), |n| n.to_string_lossy());
    let dir = file
        .parent()
        .and_then(|d| d.file_name())
        .map(|d| d.to_string_lossy());
    let pages = if part == 0 {
        Cause::PageRead
    } else {
        Cause::PageFlush
    };
    // What each temporary file is, where its name says: MariaDB's on-disk internal temporary tables (Aria's
    // #sql*.MAD and .MAI), InnoDB's temporary tablespaces (MariaDB's ibtmp1, MySQL's #innodb_temp/temp_N.ibt, where
    // MySQL's internal temporary tables spill). The rest are unlinked as soon as made, most with O_TMPFILE, whose
    // name (`#<inode>`) says nothing of what they hold: a sort's merge files, the binlog cache, InnoDB's own.
    if name.starts_with("#sql") {
        return (
            Cause::TempFile,
            Some(format!("an on-disk temporary table, {name}")),
        );
    }
    if name == "ibtmp1" || name.ends_with(".ibt") {
        return (
            Cause::TempFile,
            Some(format!("InnoDB's temporary tablespace, {name}")),
        );
    }
    if deleted {
        return (Cause::TempFile, Some(path.to_string()));
    }
    if let Some(table) = name.strip_suffix(".ibd") {
        let object = match dir {
            Some(db) => format!("{db}.{table}"),
            None => table.to_string(),
        };
        return (pages, Some(object));
    }
    // Pages written twice, first to the doublewrite buffer (MySQL's #ib_16384_0.dblwr; MariaDB's is in ibdata1).
    if name.ends_with(".dblwr") {
        return (pages, Some(name.to_string()));
    }
    if name.starts_with("ibdata") {
        return (pages, Some(name.to_string()));
    }
    if name.starts_with("undo") || name.ends_with(".ibu") {
        return (pages, Some(name.to_string()));
    }
    // MariaDB's ib_logfile0, MySQL's #innodb_redo/#ib_redoN.
    if name.starts_with("ib_logfile") || name.starts_with("#ib_redo") {
        return (Cause::RedoLog, Some(name.to_string()));
    }
    // The binlog's files: BASENAME.000001 (binlog., mysql-bin., HOST-bin.); a replica's relay log likewise.
    let numbered = name
        .rsplit_once('.')
        .is_some_and(|(_, n)| n.len() == 6 && n.bytes().all(|b| b.is_ascii_digit()));
    if numbered && !name.contains("relay") {
        let cause = if part == 0 {
            plain
        } else {
            Cause::BinlogGroupCommit
        };
        return (cause, Some(name.to_string()));
    }
    (plain, Some(path.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_file_of_the_server_is_named_by_what_it_is() {
        let cause = |path: &str, part: usize| {
            let (c, o) = file_cause(path, part);
            (c.label(), o.unwrap_or_default())
        };
        assert_eq!(
            cause("/var/lib/mysql/sbtest/sbtest1.ibd", 0),
            ("page read", "sbtest.sbtest1".into())
        );
        assert_eq!(
            cause("/var/lib/mysql/sbtest/sbtest1.ibd", 2),
            ("page flush", "sbtest.sbtest1".into())
        );
        assert_eq!(
            cause("/var/lib/mysql/ib_logfile0", 2),
            ("redo log", "ib_logfile0".into())
        );
        assert_eq!(
            cause("/var/lib/mysql/#innodb_redo/#ib_redo10", 1).0,
            "redo log"
        );
        assert_eq!(
            cause("/var/lib/mysql/binlog.000002", 2),
            ("binlog group commit", "binlog.000002".into())
        );
        assert_eq!(cause("/var/lib/mysql/binlog.000002", 0).0, "file read");
        assert_eq!(cause("/var/lib/mysql/relay-bin.000002", 1).0, "file write");
        assert_eq!(cause("/tmp/MYfd=42 (deleted)", 0).0, "temporary file");
        assert_eq!(
            cause("/var/lib/mysql/ibtmp1", 1),
            (
                "temporary file",
                "InnoDB's temporary tablespace, ibtmp1".into()
            )
        );
        assert_eq!(
            cause("/var/lib/mysql/#innodb_temp/temp_3.ibt", 1),
            (
                "temporary file",
                "InnoDB's temporary tablespace, temp_3.ibt".into()
            )
        );
        assert_eq!(
            cause("/tmp/#sql-temptable-2b1e-4-0.MAD (deleted)", 0),
            (
                "temporary file",
                "an on-disk temporary table, #sql-temptable-2b1e-4-0.MAD".into()
            )
        );
        assert_eq!(
            cause("/var/lib/mysql/ibdata1", 0),
            ("page read", "ibdata1".into())
        );
        assert_eq!(
            cause("/var/lib/mysql/db/t.MYD", 0),
            ("file read", "/var/lib/mysql/db/t.MYD".into())
        );
        assert_eq!(cause("ib_logfile0", 5).0, "redo log");
        assert_eq!(
            cause("/var/lib/mysql/#ib_16384_1.dblwr", 1),
            ("page flush", "#ib_16384_1.dblwr".into())
        );
    }
}
