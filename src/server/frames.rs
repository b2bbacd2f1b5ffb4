//! What the servers' function names say, as stacks and crash reports show them (MariaDB's and MySQL's share
//! most; a stack is read without knowing which server it came from): signal handling, what turns a failure
//! into SIGABRT, the storage engines, prepared statements and stored routines being run, the statement's
//! handler.

/// The signal handler every server installs for fatal signals.
pub const FATAL_SIGNAL_HANDLER: &str = "handle_fatal_signal";

/// The function that runs a parsed statement: the frame it calls names the statement's handler.
pub const EXECUTE_COMMAND: &str = "mysql_execute_command";

/// One frame of it per stored routine run (unless inlined away, where [`ROUTINE_ENTRIES`] count).
pub const ROUTINE_EXECUTE: &str = "sp_head::execute";

/// The entries of a stored procedure, function, trigger or aggregate function.
pub const ROUTINE_ENTRIES: &[&str] = &[
    "sp_head::execute_procedure",
    "sp_head::execute_function",
    "sp_head::execute_trigger",
    "sp_head::execute_aggregate_function",
];

/// The query cache's class (MariaDB; MySQL before 8.0).
pub const QUERY_CACHE: &str = "Query_cache::";

/// The classes of SQL functions.
pub const ITEM_FUNC: &str = "Item_func_";

/// Whether a frame runs a prepared statement: `Prepared_statement::execute*`, the protocol's COM_STMT_EXECUTE
/// (`mysqld_stmt_execute`, MariaDB's bulk execute) or SQL's `EXECUTE` (`mysql_sql_stmt_execute`).
pub fn runs_prepared_statement(name: &str) -> bool {
    name.starts_with("Prepared_statement::execute")
        || matches!(
            name,
            "mysqld_stmt_execute"
                | "mysqld_stmt_bulk_execute"
                | "mysql_sql_stmt_execute"
                | "mysql_stmt_execute"
        )
}

/// Frames of a stack's signal handling, innermost first as they appear (with the kernel's trampoline, which
/// each parser of stack text names its own way).
pub const SIGNAL_HANDLER: &[&str] = &[
    FATAL_SIGNAL_HANDLER,
    "my_print_stacktrace",
    "print_fatal_signal",
    "__restore_rt",
];

/// What turns an assertion or a kill into SIGABRT: between the signal handler and the code that failed.
pub const ABORT: &[&str] = &[
    "__pthread_kill_implementation",
    "__pthread_kill_internal",
    "__pthread_kill",
    "pthread_kill",
    "raise",
    "gsignal",
    "abort",
    "__assert_fail_base",
    "__assert_fail",
    "__assert_perror_fail",
    "ut_dbg_assertion_failed",
    "my_abort",
    "ib::fatal::~fatal",
    "std::terminate",
    "__cxxabiv1::__terminate",
    "__gnu_cxx::__verbose_terminate_handler",
];

/// Storage engines by the names of their handler classes and internal functions, checked in order.
pub const ENGINES: &[(&str, &[&str])] = &[
    (
        "InnoDB",
        &[
            "ha_innobase::",
            "ha_innopart::",
            "innobase_",
            "innodb_",
            "row_",
            "btr_",
            "buf_",
            "fil_",
            "fsp_",
            "fseg_",
            "trx_",
            "dict_",
            "que_",
            "page_",
            "rec_",
            "ibuf_",
            "srv_",
            "fts_",
            "rtr_",
            "mtr_",
            "log_t::",
            "log_write",
            "log_free_check",
            "log_checkpoint",
            "os_file_",
            "os_aio",
            "os_event_",
            "purge_",
            "ib::",
            "ut_dbg_assertion_failed",
            // The SQL layer has lock_tables and lock_table_names: only InnoDB's lock_ families.
            "lock_rec_",
            "lock_clust_rec_",
            "lock_sec_rec_",
            "lock_sys_t::",
            "lock_wait",
            "lock_trx_",
            "lock_release",
            "lock_update_",
            "lock_move_",
            "lock_prdt_",
            "lock_table_create",
            "lock_table_enqueue",
            "lock_table_other",
            "lock_table_for_trx",
            "lock_table_dequeue",
            "lock_table_x_unlock",
            "lock_table_resurrect",
            "Deadlock::",
        ],
    ),
    (
        "Aria",
        &[
            "ha_maria::",
            "maria_",
            "_ma_",
            "translog_",
            "trnman_",
            "pagecache_",
        ],
    ),
    ("MRG_MyISAM", &["ha_myisammrg::", "myrg_"]),
    (
        "MyISAM",
        &[
            "ha_myisam::",
            "mi_",
            "_mi_",
            "key_cache_",
            "simple_key_cache_",
        ],
    ),
    ("MEMORY", &["ha_heap::", "heap_", "hp_"]),
    ("Spider", &["ha_spider::", "spider_"]),
    ("RocksDB", &["ha_rocksdb::", "myrocks::", "rocksdb::"]),
    ("CONNECT", &["ha_connect::"]),
    ("S3", &["ha_s3::", "s3_"]),
    ("ARCHIVE", &["ha_archive::"]),
    ("CSV", &["ha_tina::"]),
    ("SEQUENCE", &["ha_sequence::"]),
    ("FederatedX", &["ha_federatedx::"]),
    ("FEDERATED", &["ha_federated::"]),
    ("BLACKHOLE", &["ha_blackhole::"]),
    ("Mroonga", &["ha_mroonga::"]),
    ("OQGRAPH", &["ha_oqgraph::"]),
    ("TempTable", &["temptable::"]),
    ("partition", &["ha_partition::"]),
];

/// The storage engine a function belongs to, by its name.
pub fn engine_of(name: &str) -> Option<&'static str> {
    if name == "lock_table" {
        return Some("InnoDB");
    }
    ENGINES
        .iter()
        .find(|(_, prefixes)| prefixes.iter().any(|p| name.starts_with(p)))
        .map(|(engine, _)| *engine)
}
