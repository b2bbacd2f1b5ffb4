//! MariaDB: `information_schema.PROCESSLIST` has each connection's OS thread (`TID`) and the time in its state in
//! milliseconds (`TIME_MS`); prepared statements' texts are in performance_schema's `prepared_statements_instances`
//! (MySQL 5.7's columns) only when it is on, which is not MariaDB's default: otherwise they are found from the
//! process list (`query::texts`).

use super::{common_status_counters, counter, Server, StatusCounter};

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
}
