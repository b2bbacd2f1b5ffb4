//! Why a statement's time goes where it goes, in a DBA's words: the vocabulary every output shares (the queries'
//! why column and JSON, the report's findings). What names each cause in a server's stacks is its module's
//! (`LockNames`); the words are here, one set for every server.

use std::fmt;

/// What a statement's time went to: on a CPU, or waiting, and for what.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// Running on a CPU, in the server's code or in its syscalls.
    Cpu,
    /// Runnable, waiting for a CPU.
    RunQueue,
    /// An InnoDB row lock another transaction holds.
    RowLock,
    /// An InnoDB table lock (LOCK TABLES with innodb_table_locks, AUTO-INC).
    InnodbTableLock,
    /// A metadata lock on a table or another object (DDL against open transactions, LOCK TABLES).
    MetadataLock,
    /// A table lock of the server's own (thr_lock: MyISAM, Aria, MEMORY).
    TableLock,
    /// A user lock, `GET_LOCK()`.
    UserLock,
    /// The global read lock or backup lock (`FLUSH TABLES WITH READ LOCK`, `BACKUP STAGE`).
    GlobalLock,
    /// Rolled back in a deadlock (error 1213): the time of the wait that ended so.
    Deadlock,
    /// Gave up waiting for a lock (error 1205, `innodb_lock_wait_timeout`, `lock_wait_timeout`).
    LockWaitTimeout,
    /// The redo log written and synced at commit, by this thread or the group commit's leader.
    RedoLog,
    /// The binary log's group commit: another thread writes and syncs the group's transactions.
    BinlogGroupCommit,
    /// A page read from disk into the buffer pool.
    PageRead,
    /// Dirty pages flushed before the redo log can go on (checkpoint age, flush throttling).
    PageFlush,
    /// `innodb_thread_concurrency`'s queue.
    ConcurrencyQueue,
    /// A replica's acknowledgement (semi-synchronous replication).
    SemiSyncAck,
    /// A replication position or GTID (`MASTER_POS_WAIT`, `MASTER_GTID_WAIT`, `WAIT_FOR_EXECUTED_GTID_SET`).
    ReplicationWait,
    /// `SLEEP()`: asked for, not a wait on anything.
    Sleep,
    /// A mutex, rw-lock or latch of the server's own, held by another thread.
    InternalLock,
    /// A wait whose cause is not known (its site says where).
    UnknownWait,
    /// Reading a file (not a page read the server names as such).
    FileRead,
    /// Writing a file.
    FileWrite,
    /// Syncing a file to disk.
    FileSync,
    /// A temporary file: a sort's, an on-disk temporary table's, InnoDB's temporary tablespace.
    TempFile,
    /// A statement whose internal temporary table went to disk (outgrew `tmp_table_size`): its time on a CPU and
    /// in its temporary files.
    TempTableOnDisk,
    /// A statement whose sort outgrew `sort_buffer_size` and was merged from temporary files: its time on a CPU
    /// and in those files.
    SortOnDisk,
    /// The client's socket: a reply the client is slow to read, a request's data the client is slow to send.
    Client,
    /// Blocked in another syscall, or a page fault.
    Other,
    /// Before tracing began (or within the statement before it, read ahead).
    Unseen,
}

impl Cause {
    /// Every cause, in the order of the enum.
    pub const ALL: [Cause; 29] = [
        Cause::Cpu,
        Cause::RunQueue,
        Cause::RowLock,
        Cause::InnodbTableLock,
        Cause::MetadataLock,
        Cause::TableLock,
        Cause::UserLock,
        Cause::GlobalLock,
        Cause::Deadlock,
        Cause::LockWaitTimeout,
        Cause::RedoLog,
        Cause::BinlogGroupCommit,
        Cause::PageRead,
        Cause::PageFlush,
        Cause::ConcurrencyQueue,
        Cause::SemiSyncAck,
        Cause::ReplicationWait,
        Cause::Sleep,
        Cause::InternalLock,
        Cause::UnknownWait,
        Cause::FileRead,
        Cause::FileWrite,
        Cause::FileSync,
        Cause::TempFile,
        Cause::TempTableOnDisk,
        Cause::SortOnDisk,
        Cause::Client,
        Cause::Other,
        Cause::Unseen,
    ];

    /// Its name in a few words, as a column and a label show it (bounded: a metric's label takes it).
    pub fn label(self) -> &'static str {
        match self {
            Cause::Cpu => "CPU",
            Cause::RunQueue => "run queue",
            Cause::RowLock => "row lock",
            Cause::InnodbTableLock => "InnoDB table lock",
            Cause::MetadataLock => "metadata lock",
            Cause::TableLock => "table lock",
            Cause::UserLock => "user lock",
            Cause::GlobalLock => "global read lock",
            Cause::Deadlock => "deadlock",
            Cause::LockWaitTimeout => "lock wait timeout",
            Cause::RedoLog => "redo log",
            Cause::BinlogGroupCommit => "binlog group commit",
            Cause::PageRead => "page read",
            Cause::PageFlush => "page flush",
            Cause::ConcurrencyQueue => "InnoDB queue",
            Cause::SemiSyncAck => "semi-sync ack",
            Cause::ReplicationWait => "replication wait",
            Cause::Sleep => "sleep",
            Cause::InternalLock => "internal lock",
            Cause::UnknownWait => "unknown wait",
            Cause::FileRead => "file read",
            Cause::FileWrite => "file write",
            Cause::FileSync => "file sync",
            Cause::TempFile => "temporary file",
            Cause::TempTableOnDisk => "disk tmp table",
            Cause::SortOnDisk => "sort on disk",
            Cause::Client => "client",
            Cause::Other => "other",
            Cause::Unseen => "before tracing",
        }
    }

    /// What the time did, after "N% of its time": `waits for a row lock`.
    pub fn phrase(self) -> &'static str {
        match self {
            Cause::Cpu => "runs on a CPU",
            Cause::RunQueue => "waits for a CPU (more runnable threads than CPUs)",
            Cause::RowLock => "waits for a row lock",
            Cause::InnodbTableLock => "waits for an InnoDB table lock",
            Cause::MetadataLock => "waits for a metadata lock",
            Cause::TableLock => "waits for a table lock",
            Cause::UserLock => "waits for a user lock (GET_LOCK)",
            Cause::GlobalLock => "waits for the global read lock",
            Cause::Deadlock => "is rolled back in a deadlock over a lock",
            Cause::LockWaitTimeout => "times out waiting for a lock",
            Cause::RedoLog => "waits for the redo log to be written and synced",
            Cause::BinlogGroupCommit => "waits for the binlog's group commit",
            Cause::PageRead => "waits for pages read from disk",
            Cause::PageFlush => "waits for dirty pages to be flushed",
            Cause::ConcurrencyQueue => "waits in InnoDB's concurrency queue",
            Cause::SemiSyncAck => "waits for a replica's acknowledgement",
            Cause::ReplicationWait => "waits for replication to reach a position",
            Cause::Sleep => "sleeps in SLEEP()",
            Cause::InternalLock => "waits for an internal lock of the server",
            Cause::UnknownWait => "waits for something unknown",
            Cause::FileRead => "waits for file reads",
            Cause::FileWrite => "waits for file writes",
            Cause::FileSync => "waits for files to be synced",
            Cause::TempFile => "waits for temporary files (sorts, temporary tables)",
            Cause::TempTableOnDisk => {
                "works on a temporary table on disk (it outgrew tmp_table_size or max_heap_table_size)"
            }
            Cause::SortOnDisk => {
                "sorts on disk (the sort outgrew sort_buffer_size and is merged from temporary files)"
            }
            Cause::Client => "waits for the client",
            Cause::Other => "waits in other syscalls or page faults",
            Cause::Unseen => "was not seen (before tracing began, or within the statement before)",
        }
    }

    /// A lock another connection holds: who holds it is worth asking.
    pub fn has_holder(self) -> bool {
        matches!(
            self,
            Cause::RowLock
                | Cause::InnodbTableLock
                | Cause::MetadataLock
                | Cause::TableLock
                | Cause::UserLock
                | Cause::GlobalLock
        )
    }

    /// A lock wait that ended in an error: a deadlock, a lock wait timeout.
    pub fn is_lock_error(self) -> bool {
        matches!(self, Cause::Deadlock | Cause::LockWaitTimeout)
    }

    /// A wait for a lock (as opposed to the CPU, I/O, the client, or a sleep asked for).
    pub fn is_lock(self) -> bool {
        self.has_holder()
            || self.is_lock_error()
            || matches!(self, Cause::InternalLock | Cause::UnknownWait)
    }
}

/// Written as its label, in JSON as on the terminal.
impl serde::Serialize for Cause {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.label())
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Functions every server has, and the causes of the waits they frame (`WaitCauses::asked`): what the statement asked
/// for (sql/item_func.cc: a user lock is a metadata lock of its own namespace).
pub const COMMON_ASKED: &[(&str, Cause)] = &[
    ("Item_func_sleep::val_int", Cause::Sleep),
    ("Item_func_get_lock::val_int", Cause::UserLock),
    ("Global_read_lock::lock_global_read_lock", Cause::GlobalLock),
    // A wait while rows go into an internal temporary table, or while it is copied to disk: the on-disk table's (an
    // in-memory one takes no lock of its own to write).
    ("handler::ha_write_tmp_row", Cause::TempTableOnDisk),
    (
        "create_internal_tmp_table_from_heap",
        Cause::TempTableOnDisk,
    ),
    ("create_ondisk_from_heap", Cause::TempTableOnDisk),
];

/// The same, by the innermost frame (`WaitCauses::around`).
pub const COMMON_AROUND: &[(&str, Cause)] = &[
    ("MDL_wait::timed_wait", Cause::MetadataLock),
    ("MDL_context::acquire_lock", Cause::MetadataLock),
    ("thr_multi_lock", Cause::TableLock),
    ("log_write_up_to", Cause::RedoLog),
    ("buf_flush_wait_flushed", Cause::PageFlush),
    ("Relay_log_info::wait_for_pos", Cause::ReplicationWait),
];

/// What a lock wait the server lists is (`Server::lock_holders_sql`'s KIND, LOCK_TYPE and MODE): InnoDB's
/// record lock, its table lock; a metadata lock, a table's taken by `LOCK TABLES` (SHARED_NO_READ_WRITE for WRITE,
/// SHARED_READ_ONLY for READ), a user lock, the global read lock or backup lock.
pub fn holder_cause(kind: &str, lock_type: &str, mode: &str) -> Cause {
    match (kind, lock_type) {
        ("row", "TABLE") => Cause::InnodbTableLock,
        ("row", _) => Cause::RowLock,
        (_, "USER LEVEL LOCK") => Cause::UserLock,
        (_, "GLOBAL" | "BACKUP" | "BACKUP LOCK") => Cause::GlobalLock,
        (_, "TABLE") if matches!(mode, "SHARED_NO_READ_WRITE" | "SHARED_READ_ONLY") => {
            Cause::TableLock
        }
        _ => Cause::MetadataLock,
    }
}

/// The waits `thd_wait_begin` announces (include/mysql/service_thd_wait.h: the numbers MariaDB and MySQL share
/// up to 10; MariaDB's 11 is THD_WAIT_NET), each as the cause it is where the server's module has no better
/// word for its site.
pub const THD_WAIT_SLEEP: u32 = 1;
pub const THD_WAIT_DISKIO: u32 = 2;
pub const THD_WAIT_ROW_LOCK: u32 = 3;
pub const THD_WAIT_GLOBAL_LOCK: u32 = 4;
pub const THD_WAIT_META_DATA_LOCK: u32 = 5;
pub const THD_WAIT_TABLE_LOCK: u32 = 6;
pub const THD_WAIT_USER_LOCK: u32 = 7;
pub const THD_WAIT_BINLOG: u32 = 8;
pub const THD_WAIT_GROUP_COMMIT: u32 = 9;
pub const THD_WAIT_SYNC: u32 = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_has_its_own_label() {
        let mut labels: Vec<&str> = Cause::ALL.iter().map(|c| c.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Cause::ALL.len());
        assert!(Cause::ALL.windows(2).all(|w| w[0] < w[1]));
        assert!(!Cause::Sleep.is_lock() && Cause::RowLock.has_holder());
    }
}
