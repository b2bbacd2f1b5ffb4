//! MySQL (and Percona Server): its `PROCESSLIST` has no OS thread; `performance_schema.threads` has it
//! (`THREAD_OS_ID`, 8.0.19 on) by connection (`PROCESSLIST_ID`), with the time in its state in whole seconds.
//! performance_schema is on by default, and `prepared_statements_instances` holds every prepared statement's text
//! by its connection's thread and the id the protocol gives it (`STATEMENT_ID`), cut at 1024 bytes.

use super::{common_status_counters, counter, Server, StatusCounter};

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
}
