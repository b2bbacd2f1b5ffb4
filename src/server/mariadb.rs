//! MariaDB: `information_schema.PROCESSLIST` has each connection's OS thread (`TID`) and the time in its state in
//! milliseconds (`TIME_MS`); prepared statements' texts are in performance_schema's `prepared_statements_instances`
//! (MySQL 5.7's columns) only when it is on, which is not MariaDB's default: otherwise they are found from the
//! process list (`query::texts`).

use super::{
    causes::*, common_status_counters, counter, CrashReport, Dispatch, DispatchArgs, LockNames,
    Server, SessionList, Sessions, StatusCounter, TextAccessor, WaitCauses, WaitKind,
};

pub struct MariaDb;

macro_rules! processlist_select {
    () => {
        "SELECT ID, TID, USER, DB, COMMAND, TIME_MS, STATE, INFO FROM information_schema.PROCESSLIST"
    };
}

impl Server for MariaDb {
    fn name(&self) -> &'static str {
        "MariaDB"
    }

    fn processlist_sql(&self) -> &'static str {
        processlist_select!()
    }

    fn executing_prepared_sql(&self) -> &'static str {
        concat!(
            processlist_select!(),
            " WHERE COMMAND = 'Execute' OR ID = CONNECTION_ID()"
        )
    }

    fn prepared_statements_sql(&self) -> Option<&'static str> {
        Some(super::mysql::PREPARED_STATEMENTS_SQL)
    }

    fn prepared_statement_text_max(&self) -> usize {
        1024
    }

    fn query_attributes(&self) -> bool {
        false
    }

    fn process_list_samples_texts(&self) -> bool {
        true
    }

    fn status_counters(&self) -> &'static [StatusCounter] {
        const COUNTERS: &[StatusCounter] = &common_status_counters!();
        COUNTERS
    }

    fn crash_report(&self) -> CrashReport {
        // sql/signal_handler.cc: `[ERROR] mariadbd got signal 11 ;`, and a link to its bug reports. Older
        // reports without either are taken for MariaDB's too.
        CrashReport {
            format: "MariaDB crash report",
            signal_line_marks: &["[ERROR] mariadbd got signal"],
            line_starts: &["To report this bug, see https://mariadb.com"],
            start_marks: &[
                "starting as process",
                "Starting MariaDB",
                "mysqld_safe Starting",
            ],
        }
    }

    fn lock_names(&self) -> &'static LockNames {
        // InnoDB's latches from 10.6 (storage/innobase/include/srw_lock.h).
        &LockNames {
            primitives: &[
                ("srw_mutex_impl", Some(WaitKind::Mutex)),
                ("srw_lock_impl", Some(WaitKind::RwLock)),
                ("ssux_lock", Some(WaitKind::RwLock)),
                ("srw_lock", Some(WaitKind::RwLock)),
                ("sux_lock", Some(WaitKind::RwLock)),
            ],
            sites: &[
                // THD::async_state: a commit's reply waits until the redo log write that another thread does
                // is durable.
                (
                    "net_real_write",
                    "the redo log to be written and synced before replying",
                ),
                ("group_commit_lock::acquire", "the redo log's group commit"),
                ("lock_wait", "a row lock"),
                ("tc_acquire_table", "the table cache"),
                (
                    "tpool::thread_pool_generic::wait_for_tasks",
                    "work (an idle pool worker)",
                ),
            ],
            causes: WaitCauses {
                // Besides causes::COMMON_ASKED and COMMON_AROUND.
                asked: &[
                    ("run_backup_stage", Cause::GlobalLock),
                    ("Repl_semi_sync_master::commit_trx", Cause::SemiSyncAck),
                ],
                around: &[
                    ("lock_wait", Cause::RowLock),
                    // storage/innobase/log/log0sync.cc: the redo log's write and flush locks.
                    ("group_commit_lock::acquire", Cause::RedoLog),
                    ("net_real_write", Cause::RedoLog),
                    // sql/log.cc: a follower waits for the leader to write and sync its transaction.
                    (
                        "MYSQL_BIN_LOG::queue_for_group_commit",
                        Cause::BinlogGroupCommit,
                    ),
                    (
                        "MYSQL_BIN_LOG::write_transaction_to_binlog",
                        Cause::BinlogGroupCommit,
                    ),
                    ("gtid_waiting::wait_for_gtid", Cause::ReplicationWait),
                ],
                wait_begin: "thd_wait_begin",
                // lock_wait's THD_WAIT_TABLE_LOCK is InnoDB's table lock (`causes_of_types`).
                wait_types: &[
                    (THD_WAIT_SLEEP, Cause::Sleep),
                    (THD_WAIT_DISKIO, Cause::PageRead),
                    (THD_WAIT_ROW_LOCK, Cause::RowLock),
                    (THD_WAIT_GLOBAL_LOCK, Cause::GlobalLock),
                    (THD_WAIT_META_DATA_LOCK, Cause::MetadataLock),
                    (THD_WAIT_TABLE_LOCK, Cause::TableLock),
                    (THD_WAIT_USER_LOCK, Cause::UserLock),
                    (THD_WAIT_BINLOG, Cause::ReplicationWait),
                    // log0sync.cc's group_commit_lock: the redo log's group commit.
                    (THD_WAIT_GROUP_COMMIT, Cause::RedoLog),
                    (THD_WAIT_SYNC, Cause::FileSync),
                    // THD_WAIT_NET: vio_io_wait, a socket that would block.
                    (11, Cause::Client),
                ],
            },
        }
    }

    // Without the METADATA_LOCK_INFO plugin (not loaded by default), no table lists them.
    fn metadata_locks_in_memory(&self) -> bool {
        true
    }

    fn lock_holders_sql(&self) -> &'static [&'static str] {
        // InnoDB's lock waits (information_schema's INNODB_LOCK_WAITS, 10.x and 11.x). Metadata locks have no table
        // without the METADATA_LOCK_INFO plugin, which is not loaded by default.
        &["SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id, 'row', l.lock_type, l.lock_table, l.lock_index, \
           l.lock_mode, NULL, TIMESTAMPDIFF(SECOND, b.trx_started, NOW()), p.COMMAND, p.TIME, p.USER, p.HOST, \
           p.INFO \
           FROM information_schema.INNODB_LOCK_WAITS w \
           JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
           JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id \
           JOIN information_schema.INNODB_LOCKS l ON l.lock_id = w.blocking_lock_id \
           LEFT JOIN information_schema.PROCESSLIST p ON p.ID = b.trx_mysql_thread_id"]
    }

    fn dispatch(&self) -> Dispatch {
        // sql/sql_parse.cc, 10.x and 11.x (followed by `bool is_com_multi, bool is_next_command` in 10.2–10.5,
        // `bool blocking` from 10.6).
        Dispatch {
            signature: "dispatch_command(enum_server_command, THD*, char*, unsigned int",
            args: DispatchArgs::Packet,
        }
    }

    fn statement_execute(&self) -> &'static str {
        // sql/sql_prepare.cc, 10.x and 11.x; called by execute_loop and execute_bulk_loop.
        "Prepared_statement::execute(String*, bool)"
    }

    fn sessions(&self) -> &'static Sessions {
        // sql/sql_class.h: `THD_list server_threads` (an I_List<THD>, sql_list.h's base_ilist: `first`, then the
        // end marker `last`, an ilink); THD's first base is Statement, an ilink (vptr, prev, next); 10.x, 11.x.
        &Sessions {
            list: SessionList::Linked {
                head: "server_threads",
                next: 0x10,
                // THD_count::count, THD's first base's (10.5 on).
                count: Some("_ZN9THD_count5countE"),
            },
            vtable: "_ZTV3THD",
            id: "thd_get_thread_id",
            query: "thd_query_string",
            command: "thd_current_command",
            db: Some(("thd_current_db", 0)),
            // start_time * 1000000 + start_time_sec_part
            started: "thd_start_utime",
            // security_ctx->user, security_ctx->host
            user: TextAccessor::CString("thd_user_name"),
            host: TextAccessor::CString("thd_client_host"),
            // THD::store_globals, as each thread takes a connection: real_id= pthread_self()
            thread: ("_ZN3THD13store_globalsEv", "pthread_self"),
            // sql/sql_class.cc: `THD *_current_thd() { return THR_THD; }`, a thread_local.
            current: "_current_thd",
            // variables.option_bits & OPTION_BEGIN (sql_priv.h: 1 << 20): from BEGIN or START TRANSACTION to the
            // transaction's end.
            transaction: ("thd_test_options", 1 << 20),
        }
    }
}
