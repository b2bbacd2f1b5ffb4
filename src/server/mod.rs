//! What differs between the servers myprobe traces, one module per flavor behind [`Server`], chosen from what the
//! running server says of itself (its version string, [`Flavor`]), never by `if mysql` elsewhere; and the words
//! they share for what a thread waits on ([`WaitKind`]). A leaf: it imports nothing else of myprobe's.

pub mod causes;
mod flavor;
pub mod frames;
mod mariadb;
mod mysql;

pub use causes::Cause;
pub use flavor::{all_lock_names, crash_report_of, is_start_in_log, of_version, Flavor, ALL};
pub use mariadb::MariaDb;
pub use mysql::MySql;

/// A server's ways, as far as myprobe needs them.
pub trait Server: Sync {
    /// `MariaDB`, `MySQL`.
    fn name(&self) -> &'static str;

    /// The SQL that lists the connections and server threads, with the OS thread serving each, as the columns
    /// `ID, TID, USER, DB, COMMAND, TIME_MS, STATE, INFO` in that order (`TID` as the server's own PID
    /// namespace numbers it).
    fn processlist_sql(&self) -> &'static str;

    /// As [`Server::processlist_sql`], only the connections executing a prepared statement (command `Execute`,
    /// whose `INFO` is the statement's text with its placeholders) and the own connection.
    fn executing_prepared_sql(&self) -> &'static str;

    /// The SQL that lists every prepared statement with its text, as the columns `TID, STATEMENT_ID, SQL_TEXT`
    /// (the OS thread of its connection, the id the protocol gives it), while performance_schema is on: None
    /// where the server keeps no such table.
    fn prepared_statements_sql(&self) -> Option<&'static str>;

    /// The longest `SQL_TEXT` of [`Server::prepared_statements_sql`]: a text this long may have been cut.
    fn prepared_statement_text_max(&self) -> usize;

    /// Whether the texts of executing prepared statements can be sampled from the process list, dated to the
    /// millisecond (`TIME_MS`), where performance_schema is off.
    fn process_list_samples_texts(&self) -> bool;

    /// Whether clients may send query attributes before a statement's text (`CLIENT_QUERY_ATTRIBUTES`).
    fn query_attributes(&self) -> bool;

    /// The counters of `SHOW GLOBAL STATUS` that `myprobe stat` shows, in its columns' order.
    fn status_counters(&self) -> &'static [StatusCounter];

    /// How its crash reports are known.
    fn crash_report(&self) -> CrashReport;

    /// Its own locking primitives and the wait sites that need saying, as stacks name them.
    fn lock_names(&self) -> &'static LockNames;

    /// The `dispatch_command` it runs each request through, as the uprobe that follows statements under TLS
    /// reads it.
    fn dispatch(&self) -> Dispatch;
    /// The demangled signature of the member function that runs each execution of a prepared statement, with the
    /// statement object as `this` (which keeps the text it was prepared with): where `query::executed` reads the
    /// texts of statements prepared before tracing.
    fn statement_execute(&self) -> &'static str;

    /// The SQL that lists the lock waits under way with the connection holding each lock, as the columns
    /// `WAITING_ID, HOLDER_ID, KIND ('row' or 'metadata'), LOCK_TYPE, OBJECT, INDEX, MODE, DURATION,
    /// TRANSACTION_SECONDS, COMMAND, TIME, USER, HOST, INFO` (the last five the holder's; `causes::holder_cause` reads
    /// KIND, LOCK_TYPE and MODE), one statement each.
    fn lock_holders_sql(&self) -> &'static [&'static str];

    /// Its metadata locks (and the table and user locks taken as such) are read from its memory
    /// (`sessions::mdl`): no table lists them by default.
    fn metadata_locks_in_memory(&self) -> bool {
        false
    }

    /// Where its connections' objects (`THD`) are in its memory, and the exported functions whose code says
    /// where their fields are.
    fn sessions(&self) -> &'static Sessions;
}

/// How a server's connections are found in its memory: the list it keeps of them, the vtable each one's first
/// word points into, and its accessors (exported for plugins) of each field read.
#[derive(Debug)]
pub struct Sessions {
    pub list: SessionList,
    /// The symbol of the connection class's vtable: an object's first word is its address plus 16 (the
    /// Itanium ABI's offset-to-top and type info come first).
    pub vtable: &'static str,
    /// The accessor of the connection id (`mov eax|rax, [rdi+OFFSET]`: its width is the field's).
    pub id: &'static str,
    /// The accessor of the statement's text, a `{ const char *str; size_t length; }` at the offset it reads.
    pub query: &'static str,
    /// The accessor (or setter) of the command the connection runs, a 32-bit `enum_server_command` (the protocol's
    /// command numbers: 0, Sleep, when idle).
    pub command: &'static str,
    /// A function that reads the connection's default database, a `{ const char *str; size_t length; }`, and which
    /// of its arguments is the connection (0: the first); `None` where the server exports none.
    pub db: Option<(&'static str, usize)>,
    /// A function whose first read of its argument is the start of the connection's command on the wall clock,
    /// 64-bit seconds since the epoch, followed by its 64-bit microseconds.
    pub started: &'static str,
    /// Where the connection's user and client host are, as the server's exported functions read them.
    pub user: TextAccessor,
    pub host: TextAccessor,
    /// The thread that serves the connection: a method that stores its `pthread_self()` in the object (the
    /// thread's TLS base, as a core's registers and the kernel's task give it), and the function it calls.
    pub thread: (&'static str, &'static str),
    /// Whether the connection is in a transaction: a function whose first read of its argument is a field in
    /// which these bits say so.
    pub transaction: (&'static str, u64),
    /// The exported function that returns the calling thread's connection, which it reads from a thread-local
    /// (`memory::thread_local_pointer`): where a thread's connection is, from its thread pointer alone.
    pub current: &'static str,
}

/// How a server's functions reach a text of a connection.
#[derive(Debug)]
pub enum TextAccessor {
    /// A function of the connection that returns the text's `char *` (NUL-terminated), through the pointers it
    /// follows (MariaDB's `thd_user_name`: the security context's, then its `user`).
    CString(&'static str),
    /// A function that reads a pointer of the connection (its first read), then a function of the object pointed
    /// to whose first read is a `{ const char *str; size_t length; }` (MySQL's security context and its
    /// `m_user`).
    Through(&'static str, &'static str),
}

/// The list of connections a server keeps.
#[derive(Debug)]
pub enum SessionList {
    /// An intrusive doubly linked list (MariaDB's `I_List<THD>`) at the variable `head`: the first element's
    /// address at its +0, the end marker at its +8 (an ilink: vptr, then `prev`, where the last element's `next`
    /// is); each element's address is the object's, and its next is at `next` from it. `count`: a variable (a
    /// `u32`) that counts the objects made and not yet destroyed, where the server has one.
    Linked {
        head: &'static str,
        next: u64,
        count: Option<&'static str>,
    },
    /// `partitions` arrays of object pointers, `stride` bytes apart, at the address the variable `manager`
    /// holds (MySQL's `Global_THD_manager::thd_list`, each a `Prealloced_array<THD*, inline>`: an `i32` at +4
    /// that is the inline count when not negative, the pointers inline from +8; else a pointer at +8 and a
    /// count at +16).
    Partitioned {
        manager: &'static str,
        partitions: u64,
        stride: u64,
        inline: u64,
    },
}

/// How a server's crash report (what its fatal signal handler writes to the error log) is told from another
/// server's: text that only its reports hold, in the `got signal` line or at the start of a line of the report.
#[derive(Clone, Copy, Debug)]
pub struct CrashReport {
    /// The format's name, as `stacks --resolve` says it.
    pub format: &'static str,
    pub signal_line_marks: &'static [&'static str],
    pub line_starts: &'static [&'static str],
    /// What its error log says when it starts: a crash report ends there.
    pub start_marks: &'static [&'static str],
}

impl CrashReport {
    /// Whether the report whose `got signal` line is `signal_line` and whose lines are `lines` is this one's.
    pub fn is_of(&self, signal_line: Option<&str>, lines: &[&str]) -> bool {
        signal_line.is_some_and(|l| self.signal_line_marks.iter().any(|m| l.contains(m)))
            || lines
                .iter()
                .any(|l| self.line_starts.iter().any(|m| l.starts_with(m)))
    }
}

/// The kind of a wait, by its primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WaitKind {
    /// A mutex held by another thread: pthread mutexes (also re-taken after a condition wait), InnoDB's
    /// `srw_mutex`.
    Mutex,
    /// A reader-writer lock held by another thread: pthread rw-locks, InnoDB's `ssux_lock`/`srw_lock`.
    RwLock,
    /// A metadata lock held by another connection (`MDL_wait`).
    MetadataLock,
    /// A futex wait of no known primitive with the plain wait operation (as InnoDB's latches and its group
    /// commit wait without symbols): a lock word, most likely held.
    OtherLock,
    /// A condition variable or an event waited on by a statement (its thread is in `dispatch_command`): for
    /// something another thread does for it or holds (a row lock, the redo log's write, `SLEEP`).
    StatementWait,
    /// A condition variable or an event outside statements: a thread waiting for work (idle pool workers,
    /// cached connection threads) or for a timer (background threads).
    Condition,
}

impl WaitKind {
    /// Whether a thread waits for another to release something it wants (as opposed to waiting for work).
    pub fn is_contention(self) -> bool {
        self != WaitKind::Condition
    }

    pub fn label(self) -> &'static str {
        match self {
            WaitKind::Mutex => "mutex",
            WaitKind::RwLock => "rw-lock",
            WaitKind::MetadataLock => "metadata lock",
            WaitKind::OtherLock => "lock word",
            WaitKind::StatementWait => "condition in a statement",
            WaitKind::Condition => "condition/event",
        }
    }
}

/// A server's locking primitives, as frames name them (by the start of their clean names), each with the kind
/// of wait it is (None: it tells none by itself, as an event wraps a condition variable); and the sites whose
/// name does not say what they wait for, with what they wait for.
pub struct LockNames {
    pub primitives: &'static [(&'static str, Option<WaitKind>)],
    pub sites: &'static [(&'static str, &'static str)],
    /// The causes of waits, by functions: `asked` where a frame of the wait's stack is any of them (what the
    /// statement asked for: `GET_LOCK`'s wait is also a metadata lock's), else `around` by its innermost frame that
    /// is one (a leader's redo log write within the binlog's group commit is the redo log's).
    pub causes: WaitCauses,
}

/// Functions whose frames in a wait's stack name its cause, and the waits `thd_wait_begin` announces.
pub struct WaitCauses {
    pub asked: &'static [(&'static str, Cause)],
    pub around: &'static [(&'static str, Cause)],
    /// The symbol of `thd_wait_begin(THD *, int type)`, which the server calls before the waits a thread pool
    /// must know of, and the cause of each type (`causes::THD_WAIT_*`): the functions that call it with a
    /// constant type name the waits within them, even in a build without their names.
    pub wait_begin: &'static str,
    pub wait_types: &'static [(u32, Cause)],
}

/// A server's `dispatch_command`: its signature as its symbol demangles (checked against the running binary:
/// another one is not read), and how it takes the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch {
    /// The start of the demangled signature.
    pub signature: &'static str,
    pub args: DispatchArgs,
}

/// How `dispatch_command` takes the request it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DispatchArgs {
    /// The command, then the packet's body and its length (arguments 0, 2 and 3): MariaDB's.
    Packet,
    /// `COM_DATA`, the union the server parsed the packet into (argument 1: a text's pointer at 0 and its
    /// length at 8, a statement's id at 0), and the command (argument 2): MySQL's, from 5.7.
    ComData,
}

/// A counter of `SHOW GLOBAL STATUS`, as `myprobe stat` shows it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StatusCounter {
    /// Its `Variable_name`.
    pub name: &'static str,
    /// A level (`Threads_running`), shown as read, rather than a count shown per second.
    pub gauge: bool,
    /// The column's heading.
    pub column: &'static str,
    /// What the column shows is the value divided by this (bytes as KiB).
    pub unit: f64,
}

const fn counter(name: &'static str, column: &'static str) -> StatusCounter {
    StatusCounter {
        name,
        gauge: false,
        column,
        unit: 1.0,
    }
}

/// What every server counts alike. `Innodb_data_fsyncs` holds the redo log's fsyncs on MariaDB 10.11 and MySQL;
/// MariaDB 11's redo log is memory-mapped by default (`innodb_log_file_mmap`) and synced without them.
macro_rules! common_status_counters {
    ($($more:expr),*) => {
        [
            counter("Questions", "qps"),
            StatusCounter { gauge: true, ..counter("Threads_running", "run") },
            counter("Innodb_data_reads", "rd"),
            counter("Innodb_data_writes", "wr"),
            counter("Innodb_data_fsyncs", "fsync"),
            StatusCounter { unit: 1024.0, ..counter("Innodb_os_log_written", "redoKiB") },
            $($more,)*
            counter("Innodb_row_lock_waits", "lockw"),
            counter("Slow_queries", "slow"),
        ]
    };
}
pub(crate) use common_status_counters;

/// Debian's package of the debug symbols of a server's binary, by the binary's name, where it is known.
pub fn debug_package(binary: &str) -> Option<&'static str> {
    (binary == "mariadbd").then_some("mariadb-server-core-dbgsym")
}

/// The static probes (USDT) a server built with `--enable-dtrace` has at each statement's start and end:
/// (provider, start, done), MySQL's names, which MariaDB kept.
pub const STATEMENT_PROBES: (&str, &str, &str) = ("mysql", "query__start", "query__done");

/// Process names of the servers myprobe knows.
pub const PROCESS_NAMES: [&str; 2] = ["mariadbd", "mysqld"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_processlist_reads_the_same_columns() {
        for server in ALL {
            for sql in [server.processlist_sql(), server.executing_prepared_sql()] {
                let columns = sql.split(" FROM ").next().unwrap();
                assert_eq!(columns.matches(',').count(), 7, "{sql}");
            }
        }
    }
}
