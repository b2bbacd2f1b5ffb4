//! What identifies a crash, read from one thread's clean frame names: the signal handler, stored routine
//! depth, prepared statement, engine, query cache and `Item_func_*` classes; where the crash happened; and
//! the one line that says it all.

use serde::Serialize;

use super::{CrashInfo, SIGNAL_HANDLER_CALLED};
use crate::server::frames;

/// The identifying elements seed texts ask for, read from one thread's frames.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Elements {
    /// A fatal-signal handler or signal frame is on the stack: handle_fatal_signal, my_print_stacktrace,
    /// `<signal handler called>`, __restore_rt.
    pub signal_handler: bool,
    /// Running a prepared statement: Prepared_statement::execute*, mysqld_stmt_execute,
    /// mysql_sql_stmt_execute (SQL `EXECUTE`).
    pub prepared_statement: bool,
    /// How many stored routines (procedures, functions, triggers) deep: one sp_head::execute per routine
    /// (or, where that was inlined away, one execute_procedure/execute_function/execute_trigger). 0 = none.
    pub stored_routine_depth: usize,
    /// The storage engine of the innermost engine frame: "InnoDB", "Aria", "MyISAM", "MEMORY", "partition",
    /// "Spider", "RocksDB", "CONNECT", "S3", ...
    pub engine: Option<String>,
    /// The query cache is on the stack (Query_cache::).
    pub query_cache: bool,
    /// `Item_func_*` classes on the stack, unique, innermost first, e.g. "Item_func_sleep".
    pub item_funcs: Vec<String>,
    /// The statement's handler: the first named frame called by the innermost mysql_execute_command
    /// (handle_select, mysql_update, Sql_cmd_call::execute, ...).
    pub command: Option<String>,
}

/// Function names that do not name anything: the caller's placeholders for unresolved frames.
fn is_unnamed(name: &str) -> bool {
    let name = name.trim();
    name.is_empty()
        || name == "??"
        || name.starts_with("0x")
        || name.starts_with("+0x")
        || name.starts_with('[')
}

/// Names a thread's stack by what identifies a crash, from its clean frame names (see
/// [`clean_function`](super::clean_function)), innermost first. Unnamed frames may be given as "", "??"
/// or an address.
pub fn identify(frames: &[&str]) -> Elements {
    let mut e = Elements::default();
    let mut sp_head_execute = 0;
    let mut routine_entries = 0;
    for &raw in frames {
        let name = raw.trim();
        if is_unnamed(name) {
            continue;
        }
        e.signal_handler |= frames::SIGNAL_HANDLER.contains(&name) || name == SIGNAL_HANDLER_CALLED;
        e.prepared_statement |= frames::runs_prepared_statement(name);
        if name == frames::ROUTINE_EXECUTE {
            sp_head_execute += 1;
        }
        if frames::ROUTINE_ENTRIES.contains(&name) {
            routine_entries += 1;
        }
        if e.engine.is_none() {
            e.engine = frames::engine_of(name).map(str::to_string);
        }
        e.query_cache |= name.starts_with(frames::QUERY_CACHE);
        if let Some(class) = item_func_class(name) {
            if !e.item_funcs.iter().any(|c| c == class) {
                e.item_funcs.push(class.to_string());
            }
        }
    }
    e.stored_routine_depth = sp_head_execute.max(routine_entries);
    e.command = frames
        .iter()
        .position(|f| f.trim() == frames::EXECUTE_COMMAND)
        .and_then(|at| {
            frames[..at]
                .iter()
                .rev()
                .map(|f| f.trim())
                .find(|f| !is_unnamed(f))
        })
        .map(str::to_string);
    e
}

/// `Item_func_sleep::val_int` → `Item_func_sleep`.
fn item_func_class(name: &str) -> Option<&str> {
    let class = name.split("::").next()?;
    let suffix = class.strip_prefix(frames::ITEM_FUNC)?;
    (!suffix.is_empty()).then_some(class)
}

/// The index of the frame where the thread was when the signal came: past the signal handler's frames
/// and the trampoline, and past the abort machinery of an assertion or `abort()`. 0 when the stack has no
/// signal handling; None for an empty stack. `frames`: clean names, innermost first.
pub fn crash_site(frames: &[&str]) -> Option<usize> {
    if frames.is_empty() {
        return None;
    }
    let names: Vec<&str> = frames.iter().map(|f| f.trim()).collect();
    let mut at = 0;
    if let Some(t) = names
        .iter()
        .rposition(|n| *n == "__restore_rt" || *n == SIGNAL_HANDLER_CALLED)
    {
        at = t + 1;
    } else if let Some(h) = names
        .iter()
        .rposition(|n| *n == frames::FATAL_SIGNAL_HANDLER)
    {
        // The trampoline unnamed (libc without symbols): the frame after the handler.
        at = h + 2;
    }
    while at < names.len() && frames::ABORT.contains(&names[at]) {
        at += 1;
    }
    Some(at.min(names.len() - 1))
}

/// One summary line: "SIGSEGV in Item_func_sleep::val_int, stored routine depth 2, prepared statement,
/// InnoDB, query: SELECT ..." — only the elements present, in this order: signal and the function
/// (`innermost_function`, typically the frame at [`crash_site`]), assertion, stored routine depth, prepared
/// statement, query cache, engine, `Item_func_*` classes not named already, query (on one line, shortened).
/// Empty when nothing is known.
pub fn summary_line(e: &Elements, crash: &CrashInfo, innermost_function: Option<&str>) -> String {
    let function = innermost_function.map(str::trim).filter(|f| !is_unnamed(f));
    let mut parts: Vec<String> = Vec::new();
    match (&crash.signal, function) {
        (Some(signal), Some(f)) => parts.push(format!("{signal} in {f}")),
        (Some(signal), None) => parts.push(signal.clone()),
        (None, Some(f)) => parts.push(format!("in {f}")),
        (None, None) => {}
    }
    if crash.signal.is_none() && e.signal_handler {
        parts.push("in a signal handler".to_string());
    }
    if let Some(assertion) = &crash.assertion {
        parts.push(format!("assertion failed: {}", one_line(assertion, 120)));
    }
    if e.stored_routine_depth > 0 {
        parts.push(format!("stored routine depth {}", e.stored_routine_depth));
    }
    if e.prepared_statement {
        parts.push("prepared statement".to_string());
    }
    if e.query_cache {
        parts.push("query cache".to_string());
    }
    if let Some(engine) = &e.engine {
        parts.push(engine.clone());
    }
    let named_class = function.and_then(item_func_class);
    let items: Vec<&str> = e
        .item_funcs
        .iter()
        .map(String::as_str)
        .filter(|c| Some(*c) != named_class)
        .collect();
    if !items.is_empty() {
        parts.push(items.join(", "));
    }
    if let Some(query) = &crash.query {
        parts.push(format!("query: {}", one_line(query, 160)));
    }
    parts.join(", ")
}

/// `text` on one line (whitespace runs and control characters as one space), at most `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect();
    let joined = words.join(" ");
    if joined.chars().count() <= max {
        return joined;
    }
    let mut cut: String = joined.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_routines_in_a_prepared_statement() {
        // EXECUTE s, s = CALL p(), p calls q, q runs SELECT SLEEP(): MariaDB's own frame names.
        let routine = [
            "mysql_execute_command",
            "sp_instr_stmt::exec_core",
            "sp_lex_keeper::reset_lex_and_exec_core",
            "sp_instr_stmt::execute",
            "sp_head::execute",
            "sp_head::execute_procedure",
            "Sql_cmd_call::execute",
        ];
        let frames: Vec<&str> = [
            &[
                "__futex_abstimed_wait_common64",
                "Interruptible_wait::wait",
                "Item_func_sleep::val_int",
                "Type_handler::Item_send_long",
                "Protocol::send_result_set_row",
                "select_send::send_data",
                "JOIN::exec_inner",
                "JOIN::exec",
                "mysql_select",
                "handle_select",
                "??",
            ][..],
            &routine,
            &routine,
            &[
                "mysql_execute_command",
                "Prepared_statement::execute",
                "Prepared_statement::execute_loop",
                "mysql_sql_stmt_execute",
                "mysql_execute_command",
                "mysql_parse",
                "dispatch_command",
                "do_command",
                "do_handle_one_connection",
                "handle_one_connection",
            ],
        ]
        .concat();
        let e = identify(&frames);
        assert_eq!(
            e,
            Elements {
                signal_handler: false,
                prepared_statement: true,
                stored_routine_depth: 2,
                engine: None,
                query_cache: false,
                item_funcs: vec!["Item_func_sleep".into()],
                command: Some("handle_select".into()),
            }
        );
        let crash = CrashInfo {
            signal: Some("SIGSEGV".into()),
            query: Some("SELECT SLEEP(60)".into()),
            ..CrashInfo::default()
        };
        let e = Elements {
            engine: Some("InnoDB".into()),
            ..e
        };
        assert_eq!(
            summary_line(&e, &crash, Some("Item_func_sleep::val_int")),
            "SIGSEGV in Item_func_sleep::val_int, stored routine depth 2, prepared statement, \
             InnoDB, query: SELECT SLEEP(60)"
        );
    }

    #[test]
    fn stored_functions_and_triggers_count_once_per_routine() {
        // A function whose sp_head::execute was inlined, called from a trigger that kept it.
        let e = identify(&[
            "Item_func_sp::execute",
            "sp_head::execute_function",
            "Item_func_sp::val_int",
            "sp_head::execute",
            "sp_head::execute_trigger",
            "Table_triggers_list::process_triggers",
            "mysql_insert",
            "mysql_execute_command",
            "mysqld_stmt_execute",
        ]);
        assert_eq!(e.stored_routine_depth, 2);
        assert!(e.prepared_statement);
        assert_eq!(e.item_funcs, vec!["Item_func_sp"]);
        assert_eq!(e.command.as_deref(), Some("mysql_insert"));
    }

    #[test]
    fn the_innermost_engine_wins() {
        for (frames, engine) in [
            (
                &[
                    "row_search_mvcc",
                    "ha_innobase::index_read",
                    "ha_partition::index_read_map",
                    "handler::ha_index_read_map",
                ][..],
                Some("InnoDB"),
            ),
            (
                &["ha_partition::rnd_next", "handler::ha_rnd_next"][..],
                Some("partition"),
            ),
            (
                &[
                    "_ma_read_block_record",
                    "maria_rnext",
                    "ha_maria::index_next",
                ][..],
                Some("Aria"),
            ),
            (
                &[
                    "mi_rnext",
                    "ha_myisam::index_next",
                    "ha_partition::index_next",
                ][..],
                Some("MyISAM"),
            ),
            (&["heap_scan", "ha_heap::rnd_next"][..], Some("MEMORY")),
            (&["ha_myisammrg::rnd_next"][..], Some("MRG_MyISAM")),
            (
                &["spider_db_query", "ha_spider::rnd_next"][..],
                Some("Spider"),
            ),
            (
                &["myrocks::ha_rocksdb::index_next", "ha_rocksdb::rnd_next"][..],
                Some("RocksDB"),
            ),
            (&["ha_connect::rnd_next"][..], Some("CONNECT")),
            (&["ha_s3::open"][..], Some("S3")),
            (
                &["lock_rec_lock", "row_ins_clust_index_entry_low"][..],
                Some("InnoDB"),
            ),
            (&["lock_table", "row_lock_table"][..], Some("InnoDB")),
            (
                &["buf_page_get_gen", "btr_cur_t::search_leaf"][..],
                Some("InnoDB"),
            ),
            // The SQL layer's table locking is no engine's.
            (
                &[
                    "lock_tables",
                    "lock_table_names",
                    "mysql_lock_tables",
                    "open_and_lock_tables",
                ][..],
                None,
            ),
            (&["Item_func_sleep::val_int", "JOIN::exec"][..], None),
        ] {
            assert_eq!(identify(frames).engine.as_deref(), engine, "{frames:?}");
        }
    }

    #[test]
    fn query_cache_item_funcs_and_signal_frames() {
        let e = identify(&[
            "my_print_stacktrace",
            "handle_fatal_signal",
            "__restore_rt",
            "Item_func_plus::val_int",
            "Item_func_sleep::val_int",
            "Item_func_plus::val_int",
            "Item_func::fix_fields",
            "Query_cache::send_result_to_client",
            "dispatch_command",
        ]);
        assert!(e.signal_handler && e.query_cache);
        assert_eq!(e.item_funcs, vec!["Item_func_plus", "Item_func_sleep"]);
        assert_eq!(e.command, None);
        assert!(identify(&["foo", "<signal handler called>", "bar"]).signal_handler);
        assert!(!identify(&["foo", "bar"]).signal_handler);
    }

    #[test]
    fn crash_site_skips_signal_and_abort_frames() {
        assert_eq!(crash_site(&[]), None);
        assert_eq!(crash_site(&["poll", "main"]), Some(0));
        let abort = [
            "my_print_stacktrace",
            "handle_fatal_signal",
            "__restore_rt",
            "__pthread_kill_implementation",
            "raise",
            "abort",
            "__assert_fail_base",
            "__assert_fail",
            "JOIN::optimize",
        ];
        assert_eq!(crash_site(&abort), Some(8));
        // libc printed no name for the trampoline.
        assert_eq!(
            crash_site(&[
                "my_print_stacktrace",
                "handle_fatal_signal",
                "??",
                "Item_func_sleep::val_int"
            ]),
            Some(3)
        );
    }

    #[test]
    fn summary_line_without_anything_is_empty_and_long_queries_are_cut() {
        assert_eq!(
            summary_line(&Elements::default(), &CrashInfo::default(), None),
            ""
        );
        let crash = CrashInfo {
            query: Some(format!("SELECT {}", "x, ".repeat(100))),
            ..CrashInfo::default()
        };
        let line = summary_line(&Elements::default(), &crash, Some("??"));
        assert!(line.starts_with("query: SELECT x, x,"));
        assert!(line.ends_with('…'));
        assert_eq!(line.chars().count(), "query: ".len() + 160);
    }
}
