//! MySQL (and Percona Server): its `PROCESSLIST` has no OS thread; `performance_schema.threads` has it
//! (`THREAD_OS_ID`, 8.0.19 on) by connection (`PROCESSLIST_ID`), with the time in its state in whole seconds.
//! performance_schema is on by default, and `prepared_statements_instances` holds every prepared statement's text
//! by its connection's thread and the id the protocol gives it (`STATEMENT_ID`), cut at 1024 bytes.

use super::{
    causes::*, common_status_counters, counter, CrashReport, Dispatch, DispatchArgs, LockNames,
    Server, SessionList, Sessions, StatusCounter, TextAccessor, WaitCauses, WaitKind,
};

pub struct MySql;

/// Every prepared statement with its connection's OS thread: MySQL's and MariaDB's performance_schema alike.
pub(super) const PREPARED_STATEMENTS_SQL: &str =
    "SELECT t.THREAD_OS_ID, p.STATEMENT_ID, p.SQL_TEXT \
     FROM performance_schema.prepared_statements_instances p \
     JOIN performance_schema.threads t ON t.THREAD_ID = p.OWNER_THREAD_ID";

macro_rules! threads_select {
    () => {
        "SELECT PROCESSLIST_ID, THREAD_OS_ID, PROCESSLIST_USER, PROCESSLIST_DB, PROCESSLIST_COMMAND, \
         PROCESSLIST_TIME * 1000, PROCESSLIST_STATE, PROCESSLIST_INFO FROM performance_schema.threads \
         WHERE PROCESSLIST_ID IS NOT NULL"
    };
}

impl Server for MySql {
    fn name(&self) -> &'static str {
        "MySQL"
    }

    fn processlist_sql(&self) -> &'static str {
        threads_select!()
    }

    fn executing_prepared_sql(&self) -> &'static str {
        concat!(
            threads_select!(),
            " AND (PROCESSLIST_COMMAND = 'Execute' OR PROCESSLIST_ID = CONNECTION_ID())"
        )
    }

    fn prepared_statements_sql(&self) -> Option<&'static str> {
        Some(PREPARED_STATEMENTS_SQL)
    }

    fn prepared_statement_text_max(&self) -> usize {
        1024
    }

    fn query_attributes(&self) -> bool {
        true
    }

    fn process_list_samples_texts(&self) -> bool {
        false
    }

    fn status_counters(&self) -> &'static [StatusCounter] {
        // The redo log's own fsyncs, seed 001's figure.
        const COUNTERS: &[StatusCounter] =
            &common_status_counters!(counter("Innodb_os_log_fsyncs", "redofs"));
        COUNTERS
    }

    fn crash_report(&self) -> CrashReport {
        // sql/signal_handler.cc: `2026-11-27T03:23:32Z UTC - mysqld got signal 11 ;`.
        CrashReport {
            format: "MySQL crash report",
            signal_line_marks: &["UTC - "],
            line_starts: &["Server Version: ", "Most likely, you have hit"],
            start_marks: &["starting as process", "mysqld_safe Starting"],
        }
    }

    fn lock_names(&self) -> &'static LockNames {
        // InnoDB's latches wait in its sync array on an os_event (storage/innobase/sync/, os/os0event.cc).
        &LockNames {
            primitives: &[
                ("os_event", None),
                ("sync_array_wait_event", None),
                ("TTASEventMutex", Some(WaitKind::Mutex)),
                ("PolicyMutex", Some(WaitKind::Mutex)),
                ("mutex_enter_inline", Some(WaitKind::Mutex)),
                ("pfs_rw_lock_", Some(WaitKind::RwLock)),
                ("rw_lock_", Some(WaitKind::RwLock)),
            ],
            sites: &[
                ("lock_wait_suspend_thread", "a row lock"),
                ("log_wait_for_flush", "the redo log's sync"),
                ("log_wait_for_write", "the redo log's write"),
            ],
            causes: WaitCauses {
                // Besides causes::COMMON_ASKED and COMMON_AROUND.
                asked: &[("ReplSemiSyncMaster::commitTrx", Cause::SemiSyncAck)],
                around: &[
                    ("lock_wait_suspend_thread", Cause::RowLock),
                    ("log_wait_for_flush", Cause::RedoLog),
                    ("log_wait_for_write", Cause::RedoLog),
                    // sql/rpl_commit_stage_manager.cc: a follower of the binlog's group commit.
                    ("Commit_stage_manager::enroll_for", Cause::BinlogGroupCommit),
                    ("srv_conc_enter_innodb", Cause::ConcurrencyQueue),
                    ("buf_flush_wait_batch_end", Cause::PageFlush),
                    ("Relay_log_info::wait_for_gtid_set", Cause::ReplicationWait),
                ],
                wait_begin: "_Z14thd_wait_beginP3THDi",
                wait_types: &[
                    (THD_WAIT_SLEEP, Cause::Sleep),
                    (THD_WAIT_DISKIO, Cause::PageRead),
                    (THD_WAIT_ROW_LOCK, Cause::RowLock),
                    (THD_WAIT_GLOBAL_LOCK, Cause::GlobalLock),
                    (THD_WAIT_META_DATA_LOCK, Cause::MetadataLock),
                    (THD_WAIT_TABLE_LOCK, Cause::TableLock),
                    // srv0conc.cc is its only caller.
                    (THD_WAIT_USER_LOCK, Cause::ConcurrencyQueue),
                    (THD_WAIT_BINLOG, Cause::ReplicationWait),
                    // log0write.cc's log_wait_for_flush.
                    (THD_WAIT_GROUP_COMMIT, Cause::RedoLog),
                    (THD_WAIT_SYNC, Cause::FileSync),
                ],
            },
        }
    }

    fn lock_holders_sql(&self) -> &'static [&'static str] {
        // performance_schema's data locks (InnoDB's, 8.0 and later) and metadata locks (on by default).
        &[
            "SELECT rt.PROCESSLIST_ID, bt.PROCESSLIST_ID, 'row', l.LOCK_TYPE, \
             CONCAT(l.OBJECT_SCHEMA, '.', l.OBJECT_NAME), l.INDEX_NAME, l.LOCK_MODE, NULL, \
             TIMESTAMPDIFF(SECOND, trx.trx_started, NOW()), bt.PROCESSLIST_COMMAND, bt.PROCESSLIST_TIME, \
             bt.PROCESSLIST_USER, bt.PROCESSLIST_HOST, bt.PROCESSLIST_INFO \
             FROM performance_schema.data_lock_waits w \
             JOIN performance_schema.threads rt ON rt.THREAD_ID = w.REQUESTING_THREAD_ID \
             JOIN performance_schema.threads bt ON bt.THREAD_ID = w.BLOCKING_THREAD_ID \
             JOIN performance_schema.data_locks l ON l.ENGINE_LOCK_ID = w.BLOCKING_ENGINE_LOCK_ID \
             LEFT JOIN information_schema.INNODB_TRX trx ON trx.trx_mysql_thread_id = bt.PROCESSLIST_ID",
            "SELECT wt.PROCESSLIST_ID, ht.PROCESSLIST_ID, 'metadata', h.OBJECT_TYPE, \
             CONCAT_WS('.', h.OBJECT_SCHEMA, h.OBJECT_NAME), NULL, h.LOCK_TYPE, h.LOCK_DURATION, \
             TIMESTAMPDIFF(SECOND, trx.trx_started, NOW()), ht.PROCESSLIST_COMMAND, ht.PROCESSLIST_TIME, \
             ht.PROCESSLIST_USER, ht.PROCESSLIST_HOST, ht.PROCESSLIST_INFO \
             FROM performance_schema.metadata_locks w \
             JOIN performance_schema.metadata_locks h ON h.OBJECT_TYPE = w.OBJECT_TYPE \
             AND h.OBJECT_SCHEMA <=> w.OBJECT_SCHEMA AND h.OBJECT_NAME <=> w.OBJECT_NAME \
             AND h.LOCK_STATUS = 'GRANTED' AND h.OWNER_THREAD_ID <> w.OWNER_THREAD_ID \
             JOIN performance_schema.threads wt ON wt.THREAD_ID = w.OWNER_THREAD_ID \
             JOIN performance_schema.threads ht ON ht.THREAD_ID = h.OWNER_THREAD_ID \
             LEFT JOIN information_schema.INNODB_TRX trx ON trx.trx_mysql_thread_id = ht.PROCESSLIST_ID \
             WHERE w.LOCK_STATUS = 'PENDING'",
        ]
    }

    fn dispatch(&self) -> Dispatch {
        // sql/sql_parse.cc, 5.7 to 9.x; COM_DATA in include/mysql/com_data.h.
        Dispatch {
            signature: "dispatch_command(THD*, COM_DATA const*, enum_server_command)",
            args: DispatchArgs::ComData,
        }
    }

    fn statement_execute(&self) -> &'static str {
        // sql/sql_prepare.cc, 8.0 to 9.x; called by execute_loop.
        "Prepared_statement::execute(THD*, String*, bool)"
    }

    fn sessions(&self) -> &'static Sessions {
        // sql/mysqld_thd_manager.h: `static Global_THD_manager *thd_manager`, whose first member is
        // `THD_array thd_list[NUM_PARTITIONS]` (8), each a Prealloced_array<THD*, 60> (include/prealloced_array.h);
        // as `Global_THD_manager::do_for_all_thd` walks them in 9.x.
        &Sessions {
            list: SessionList::Partitioned {
                manager: "_ZN18Global_THD_manager11thd_managerE",
                partitions: 8,
                stride: 0x1e8,
                inline: 60,
            },
            vtable: "_ZTV3THD",
            id: "thd_get_thread_id",
            query: "_Z16thd_query_unsafeP3THD",
            // THD::set_command stores the field first.
            command: "_ZN3THD11set_commandE19enum_server_command",
            // db_is_default_db(const char *, size_t, const THD *) compares with the THD's m_db, which it reads first.
            db: Some(("_Z16db_is_default_dbPKcmPK3THD", 2)),
            // start_time, a timeval
            started: "_ZN3THD25query_start_timeval_truncEj",
            // m_security_ctx, then its m_user and m_host (Strings: the pointer, then the length)
            user: TextAccessor::Through(
                "_Z24thd_get_security_contextP3THDPP16Security_context",
                "_ZN16Security_context12set_user_ptrEPKcm",
            ),
            host: TextAccessor::Through(
                "_Z24thd_get_security_contextP3THDPP16Security_context",
                "_ZN16Security_context12set_host_ptrEPKcm",
            ),
            // THD::store_globals, as each thread takes a connection: real_id = my_thread_self()
            thread: ("_ZN3THD13store_globalsEv", "pthread_self"),
            // sql/current_thd.cc: `THD *thd_get_current_thd() { return current_thd; }`, a thread_local.
            current: "_Z19thd_get_current_thdv",
            // server_status & SERVER_STATUS_IN_TRANS: a multi-statement transaction under way.
            transaction: ("_Z36thd_in_active_multi_stmt_transactionPK3THD", 1),
        }
    }
}
