//! The crash section of a MariaDB/MySQL error log: the facts the signal handler prints (signal, assertion,
//! statement, connection, server version) and backtrace_symbols' frames, MariaDB's
//! `mariadbd(handle_fatal_signal+0x1c7)[0x...]` and MySQL 8's demangled
//! `/usr/sbin/mysqld(dispatch_command(THD*, COM_DATA const*, enum_server_command)+0x1a6f) [0x...]` alike; and
//! the frames of MySQL builds with libbacktrace (Debian's 9.x): ` #8 0x557ff45105e2 _ZN15Item_func_sleep7val_intEv`,
//! absolute addresses with no module, `<unknown>` for a function without a dynamic symbol.

use super::{
    after, clean_function, is_signal_trampoline, is_source_location, leading_number, named,
    parse_hex, CrashInfo, Format, Found, TextFrame, TextThread,
};

pub(super) struct CrashLog;

impl Format for CrashLog {
    fn parse(&self, lines: &[&str]) -> Option<Found> {
        let section = crash_section(lines)?;
        let frames = backtrace_frames(&lines[section.stack_from..section.end]);
        // Without a `got signal` line, backtrace_symbols' form alone must show it is a crash report: bare
        // `[0x...]` lines are an address list.
        let crash_report = frames
            .iter()
            .any(|f| f.function.is_some() || f.module.is_some())
            || (section.header.is_some() && !frames.is_empty());
        crash_report.then(|| Found {
            threads: vec![TextThread::nth(1, frames)],
            format: section.format,
        })
    }
}

/// What the last crash of an error log says besides the stack, whichever format the stack is in; its
/// `format` is left for the caller.
pub(super) fn facts(lines: &[&str]) -> CrashInfo {
    let mut crash = CrashInfo::default();
    if let Some(section) = crash_section(lines) {
        read_crash_info(lines, &section, &mut crash);
    }
    crash
}

/// Where the last crash of an error log is.
#[derive(Clone, Copy, Debug)]
struct CrashSection {
    /// The `got signal` line.
    header: Option<usize>,
    /// Just after the crash before it: assertions printed before this crash's signal line start here.
    previous_end: usize,
    /// Where its backtrace starts (`Attempting backtrace`, `stack_bottom = `, or the header).
    stack_from: usize,
    /// The next server start, or the end of the text.
    end: usize,
    format: &'static str,
}

/// `[ERROR] mariadbd got signal 11 ;`, `UTC - mysqld got signal 6 ;`, `got exception 0xc0000005 ;` →
/// the signal's name.
fn signal_of(line: &str) -> Option<String> {
    if let Some(rest) = after(line, "got signal ") {
        return leading_number(rest).map(crate::process::signal_name);
    }
    if let Some(rest) = after(line, "got exception ") {
        let code = rest.split_whitespace().next()?;
        parse_hex(code)?;
        return Some(format!("exception {code}"));
    }
    None
}

/// `... UTC - mysqld got signal 11 ;`, `[ERROR] mariadbd got signal 6 ;` → the program's name.
fn program_of(line: &str) -> Option<String> {
    let before = &line[..line
        .find(" got signal ")
        .or_else(|| line.find(" got exception "))?];
    let name = before.rsplit([' ', '/']).next()?;
    (!name.is_empty() && !name.ends_with(']')).then(|| name.to_string())
}

fn is_stack_marker(line: &str) -> bool {
    line.starts_with("Attempting backtrace") || line.starts_with("stack_bottom = ")
}

fn crash_section(lines: &[&str]) -> Option<CrashSection> {
    let headers: Vec<usize> = (0..lines.len())
        .filter(|&i| signal_of(lines[i]).is_some())
        .collect();
    let header = headers.last().copied();
    let previous_end = match headers.len() {
        0 | 1 => 0,
        n => headers[n - 2] + 1,
    };
    let start = header.unwrap_or(0);
    let end = (start + 1..lines.len())
        .find(|&i| crate::server::is_start_in_log(lines[i]))
        .unwrap_or(lines.len());
    let stack_from = (start..end)
        .rev()
        .find(|&i| is_stack_marker(lines[i]))
        .unwrap_or(start);
    if header.is_none() && lines.is_empty() {
        return None;
    }
    let report = crate::server::crash_report_of(header.map(|h| lines[h]), &lines[start..end]);
    Some(CrashSection {
        header,
        previous_end,
        stack_from,
        end,
        format: report.format,
    })
}

/// Lines the report prints after the statement: the statement (which may span lines) ends before them.
const AFTER_QUERY: &[&str] = &[
    "Connection ID (thread ID):",
    "Status: ",
    "Optimizer switch:",
    "Writing a core file",
    "Working directory at",
    "Resource Limits",
    "Core pattern:",
    "Kernel version:",
    "The manual page at",
    "information that should help",
    "Trying to get some variables",
    "We think the query pointer is invalid",
    "Fatal signal",
    "Query (",
];

fn read_crash_info(lines: &[&str], section: &CrashSection, crash: &mut CrashInfo) {
    if let Some(h) = section.header {
        crash.signal = signal_of(lines[h]);
        crash.program = program_of(lines[h]);
    }
    let start = section.header.unwrap_or(0);
    let mut fallback_query = None;
    let mut i = start;
    while i < section.end {
        let line = lines[i];
        if let Some(v) = line
            .strip_prefix("Server version: ")
            .or_else(|| line.strip_prefix("Server Version: "))
        {
            let v = v.split(" source revision").next().unwrap_or(v).trim();
            crash.server_version = (!v.is_empty()).then(|| v.to_string());
        } else if let Some(v) = line.strip_prefix("BuildID[sha1]=") {
            let v = v.trim();
            crash.build_id = (!v.is_empty() && v.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| v.to_ascii_lowercase());
        } else if let Some(v) = line.strip_prefix("Connection ID (thread ID): ") {
            crash.connection_id = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("Status: ") {
            crash.status = Some(v.trim().to_string()).filter(|s| !s.is_empty());
        } else if let Some((first, pointer_read)) = statement_start(line) {
            let (query, next) = statement(lines, i, section.end, first);
            if pointer_read {
                crash.query = query;
            } else {
                fallback_query = query;
            }
            i = next;
            continue;
        }
        i += 1;
    }
    if crash.query.is_none() {
        crash.query = fallback_query;
    }
    // Assertions are printed before the signal line; a crash before this one ends their search.
    crash.assertion = lines[section.previous_end..section.end]
        .iter()
        .filter_map(|l| assertion_of(l))
        .next_back();
}

/// The statement's first line, and whether the handler could read its pointer: `Query (0x...): ...`, or
/// `Query: ...`, printed after "We think the query pointer is invalid, but we will try to print it
/// anyway." and taken only when there is no other.
fn statement_start(line: &str) -> Option<(&str, bool)> {
    if let Some(rest) = line.strip_prefix("Query (") {
        let close = rest
            .find("): ")
            .or_else(|| rest.strip_suffix("):").map(str::len))?;
        return Some((rest.get(close + 3..).unwrap_or(""), true));
    }
    line.strip_prefix("Query: ").map(|first| (first, false))
}

/// The statement starting with `first` on line `at`, continued on the next lines up to a known line;
/// and the index of the line after it.
fn statement(lines: &[&str], at: usize, end: usize, first: &str) -> (Option<String>, usize) {
    let mut text = first.to_string();
    let mut i = at + 1;
    while i < end && !AFTER_QUERY.iter().any(|p| lines[i].starts_with(p)) {
        text.push('\n');
        text.push_str(lines[i]);
        i += 1;
    }
    let text = text.trim();
    let query = match text {
        "" | "(null)" => None,
        t if t.starts_with("is an invalid") => None,
        t => Some(t.to_string()),
    };
    (query, i)
}

fn assertion_of(line: &str) -> Option<String> {
    if let Some(rest) = after(line, "Assertion `") {
        let end = rest.rfind("' failed").unwrap_or(rest.len());
        return Some(rest[..end].to_string());
    }
    if let Some(rest) = after(line, "Failing assertion: ") {
        return Some(rest.trim().to_string());
    }
    // MariaDB/MySQL 5.x InnoDB, when the condition is not printed: `Assertion failure in file F line N`.
    if let Some(rest) = after(line, "Assertion failure in ") {
        return Some(rest.trim().to_string());
    }
    // MySQL 8: `[InnoDB] Assertion failure: buf0lru.cc:1264:ib::fatal triggered thread 126861602342464`.
    if let Some(rest) = after(line, "Assertion failure: ") {
        let rest = rest.trim();
        let rest = match rest.rsplit_once(" thread ") {
            Some((cond, id)) if id.bytes().all(|b| b.is_ascii_digit()) => cond,
            _ => rest,
        };
        return Some(rest.to_string());
    }
    None
}

/// The frames of a backtrace_symbols(_fd) listing, innermost first. Stops at the lines the report prints
/// after the stack, so that later `[0x...]` text is not taken for frames.
fn backtrace_frames(lines: &[&str]) -> Vec<TextFrame> {
    let mut frames = Vec::new();
    for line in lines {
        if !frames.is_empty() && AFTER_QUERY.iter().any(|p| line.starts_with(p)) {
            break;
        }
        if let Some(frame) = backtrace_frame(line.trim()) {
            frames.push(frame);
        }
    }
    mark_backtrace_return_addresses(&mut frames);
    if frames.is_empty() {
        let from = lines
            .iter()
            .position(|l| l.trim_start().starts_with("#0 "))
            .unwrap_or(lines.len());
        frames = lines[from..]
            .iter()
            .map_while(|l| libbacktrace_frame(l.trim()))
            // The unwinder's end mark, past the thread's first function.
            .filter(|f| f.addr != Some(u64::MAX))
            .collect();
    }
    frames
}

/// libbacktrace's ` #7 0x557ff45102cf _ZN18Interruptible_wait4waitEP12mysql_cond_tP13mysql_mutex_t`, with
/// ` at sql/item_func.cc:4305` when the build has line tables, and `<unknown>` for a function that is not in
/// the dynamic symbols. libbacktrace has already taken 1 from return addresses: each is exact.
fn libbacktrace_frame(line: &str) -> Option<TextFrame> {
    let rest = line.strip_prefix('#')?;
    let (index, rest) = rest.split_once(' ')?;
    index.parse::<u32>().ok()?;
    let (addr, rest) = rest.split_once(' ').unwrap_or((rest, ""));
    let mut frame = TextFrame::at(parse_hex(addr)?);
    let (function, source) = match rest.rsplit_once(" at ") {
        Some((f, at)) if is_source_location(at) => (f, Some(at)),
        _ => (rest, None),
    };
    let function = function.trim();
    frame.function = (function != "<unknown>").then(|| named(function)).flatten();
    frame.source = source.map(str::to_string);
    Some(frame)
}

/// `mariadbd(my_print_stacktrace+0x2e)[0x55..]`, `mariadbd(+0xd3a2be)[0x55..]`, `[0x55..]`,
/// `/usr/sbin/mysqld(my_print_stacktrace(unsigned char const*, unsigned long)+0x41) [0x..]` (MySQL 8
/// demangles and puts a space), and addr2line's `sql/item_func.cc:4305(Item_func_sleep::val_int())[0x..]`.
fn backtrace_frame(line: &str) -> Option<TextFrame> {
    let body = line.strip_suffix(']')?;
    let open = body.rfind('[')?;
    let addr = parse_hex(&body[open + 1..])?;
    let head = body[..open].trim_end();
    let mut frame = TextFrame::at(addr);
    if head.is_empty() {
        return Some(frame);
    }
    let inner_end = head.strip_suffix(')')?.len();
    let paren = head.find('(')?;
    let before = &head[..paren];
    let inner = &head[paren + 1..inner_end];
    if before.is_empty() || before.contains(' ') {
        return None;
    }
    if is_source_location(before) {
        if !before.starts_with("??") {
            frame.source = Some(before.to_string());
        }
        frame.function = named(inner);
        return Some(frame);
    }
    frame.module = Some(before.to_string());
    match inner.rfind("+0x") {
        Some(plus) if parse_hex(&inner[plus + 1..]).is_some() => {
            let offset = parse_hex(&inner[plus + 1..]);
            if plus == 0 {
                frame.module_offset = offset;
            } else {
                frame.function = Some(inner[..plus].to_string());
                frame.function_offset = offset;
            }
        }
        _ => frame.function = Some(inner.to_string()).filter(|f| !f.is_empty()),
    }
    Some(frame)
}

fn is_fatal_signal_handler(function: Option<&str>) -> bool {
    function
        .and_then(clean_function)
        .is_some_and(|f| f == "handle_fatal_signal")
}

/// backtrace() lists return addresses, its first one included, except the signal trampoline's (the
/// handler returns to its first byte) and the interrupted frame's (the exact faulting pc). The trampoline
/// is known by name, or as the frame after `handle_fatal_signal` when libc printed no name for it.
fn mark_backtrace_return_addresses(frames: &mut [TextFrame]) {
    let mut exact = vec![false; frames.len()];
    for i in 0..frames.len() {
        let trampoline = is_signal_trampoline(frames[i].function.as_deref())
            || (i > 0 && is_fatal_signal_handler(frames[i - 1].function.as_deref()));
        if trampoline {
            exact[i] = true;
            if i + 1 < frames.len() {
                exact[i + 1] = true;
            }
        }
    }
    for (frame, exact) in frames.iter_mut().zip(exact) {
        frame.is_return_address = frame.addr.is_some() && !exact;
    }
}

#[cfg(test)]
mod tests {
    use crate::stacks::text::{identify, parse, summary_line, test_support::*, TextFrame};

    fn frame(
        function: Option<&str>,
        function_offset: Option<u64>,
        module: Option<&str>,
        module_offset: Option<u64>,
        addr: u64,
        is_return_address: bool,
    ) -> TextFrame {
        TextFrame {
            function: function.map(str::to_string),
            function_offset,
            module: module.map(str::to_string),
            module_offset,
            addr: Some(addr),
            is_return_address,
            ..TextFrame::default()
        }
    }

    #[test]
    fn mariadb_crash_on_the_main_thread_has_no_statement() {
        // `kill -SEGV`: the kernel gave the signal to the main thread, in poll(); no THD, so no Query line.
        let p = parse(SEGV_KILL, "error.log").unwrap();
        assert_eq!(p.crash.format, "MariaDB crash report");
        assert_eq!(p.crash.signal.as_deref(), Some("SIGSEGV"));
        assert_eq!(
            p.crash.server_version.as_deref(),
            Some("10.11.19-MariaDB-0+deb12u1")
        );
        assert_eq!(p.crash.query, None);
        assert_eq!(p.crash.connection_id, None);
        assert_eq!(p.crash.status, None);
        assert_eq!(p.crash.assertion, None);
        assert_eq!(p.threads.len(), 1);
        let t = &p.threads[0];
        assert_eq!((t.tid, t.label.as_str()), (None, "1"));
        assert_eq!(t.frames.len(), 9);
        assert_eq!(
            t.frames[0],
            frame(
                Some("my_print_stacktrace"),
                Some(0x2e),
                Some("mariadbd"),
                None,
                0x55f648d2087e,
                true
            )
        );
        // addr2line resolved libc (libc6-dbg is installed) but not `mariadbd` (a relative argv[0]).
        assert_eq!(t.frames[2].function.as_deref(), Some("__restore_rt"));
        assert_eq!(t.frames[2].source.as_deref(), Some("libc_sigaction.c:0"));
        assert_eq!(t.frames[2].module, None);
        assert_eq!(t.frames[2].addr, Some(0x7f8c9ba5a050));
        assert!(!t.frames[2].is_return_address);
        assert_eq!(t.frames[3].function.as_deref(), Some("__GI___poll"));
        assert_eq!(t.frames[3].source.as_deref(), Some("linux/poll.c:29"));
        assert!(
            !t.frames[3].is_return_address,
            "the interrupted frame's pc is exact"
        );
        assert_eq!(
            t.frames[4],
            frame(
                Some("_Z26handle_connections_socketsv"),
                Some(0x27f),
                Some("mariadbd"),
                None,
                0x55f64856194f,
                true
            )
        );
        assert_eq!(t.frames[8].function.as_deref(), Some("_start"));
        let (e, site) = elements(t);
        assert!(e.signal_handler);
        assert_eq!(site.as_deref(), Some("__poll"));
        assert_eq!(e.engine, None);
        assert_eq!(e.command, None);
        assert_eq!(
            summary_line(&e, &p.crash, site.as_deref()),
            "SIGSEGV in __poll"
        );
    }

    #[test]
    fn mariadb_crash_on_the_sleeping_connection() {
        let p = parse(SEGV_SLEEP, "error.log").unwrap();
        assert_eq!(p.crash.signal.as_deref(), Some("SIGSEGV"));
        assert_eq!(p.crash.query.as_deref(), Some("SELECT SLEEP(60)"));
        assert_eq!(p.crash.connection_id, Some(5));
        assert_eq!(p.crash.status.as_deref(), Some("NOT_KILLED"));
        let t = &p.threads[0];
        assert_eq!(t.frames.len(), 25);
        assert_eq!(
            t.frames[1],
            frame(
                Some("handle_fatal_signal"),
                Some(0x1c7),
                Some("mariadbd"),
                None,
                0x564b86b26057,
                true
            )
        );
        assert_eq!(
            t.frames[6],
            frame(
                None,
                None,
                Some("mariadbd"),
                Some(0xaed67e),
                0x564b86b9d67e,
                true
            )
        );
        assert_eq!(
            t.frames[7].function.as_deref(),
            Some("_ZN15Item_func_sleep7val_intEv")
        );
        assert_eq!(t.frames[24].function.as_deref(), Some("clone3"));
        assert_eq!(t.frames[24].source.as_deref(), Some("x86_64/clone3.S:83"));
        let names = clean_names(t);
        assert_eq!(names[7], "Item_func_sleep::val_int");
        assert_eq!(names[16], "mysql_execute_command");
        let (e, site) = elements(t);
        assert_eq!(site.as_deref(), Some("__futex_abstimed_wait_common64"));
        assert_eq!(e.item_funcs, vec!["Item_func_sleep"]);
        assert_eq!(e.command.as_deref(), Some("handle_select"));
        assert_eq!((e.stored_routine_depth, e.prepared_statement), (0, false));
        assert_eq!(
            summary_line(&e, &p.crash, site.as_deref()),
            "SIGSEGV in __futex_abstimed_wait_common64, Item_func_sleep, query: SELECT SLEEP(60)"
        );
    }

    #[test]
    fn mariadb_crash_in_a_nested_procedure() {
        // CALL p() → CALL q() → SELECT SLEEP(60); SIGABRT sent to that connection's thread.
        let p = parse(ABRT_PROCEDURE, "error.log").unwrap();
        assert_eq!(p.crash.signal.as_deref(), Some("SIGABRT"));
        assert_eq!(p.crash.query.as_deref(), Some("SELECT SLEEP(60)"));
        assert_eq!(p.crash.connection_id, Some(6));
        let t = &p.threads[0];
        assert_eq!(t.frames.len(), 41);
        let (e, _) = elements(t);
        assert_eq!(e.stored_routine_depth, 2);
        assert!(!e.prepared_statement);
        assert_eq!(e.command.as_deref(), Some("handle_select"));
    }

    #[test]
    fn mariadb_crash_in_a_prepared_statement() {
        let p = parse(SEGV_PREPARED, "error.log").unwrap();
        assert_eq!(p.crash.query.as_deref(), Some("SELECT SLEEP(60)"));
        let (e, site) = elements(&p.threads[0]);
        assert!(e.prepared_statement);
        assert_eq!(e.stored_routine_depth, 0);
        assert_eq!(
            summary_line(&e, &p.crash, site.as_deref()),
            "SIGSEGV in __futex_abstimed_wait_common64, prepared statement, Item_func_sleep, \
             query: SELECT SLEEP(60)"
        );
    }

    #[test]
    fn a_statement_over_several_lines_is_kept_whole() {
        let p = parse(SEGV_MULTILINE, "error.log").unwrap();
        assert_eq!(
            p.crash.query.as_deref(),
            Some("SELECT 1 AS a,\n  SLEEP(60) AS b\nFROM DUAL WHERE 'x' <> 'y\nz'")
        );
        assert_eq!(p.crash.status.as_deref(), Some("NOT_KILLED"));
        let e = identify(&[]);
        let mut crash = p.crash.clone();
        crash.signal = None;
        assert_eq!(
            summary_line(&e, &crash, None),
            "query: SELECT 1 AS a, SLEEP(60) AS b FROM DUAL WHERE 'x' <> 'y z'"
        );
    }

    /// Debian's MySQL 9.7, built with libbacktrace: absolute addresses, dynamic symbols mangled, `<unknown>` for
    /// the rest, no modules.
    #[test]
    fn mysql_9_7_libbacktrace_crash_report() {
        let p = parse(MYSQL_9_7_PROCEDURE, "error.log").unwrap();
        assert_eq!(p.crash.format, "MySQL crash report");
        assert_eq!(p.crash.signal.as_deref(), Some("SIGSEGV"));
        assert_eq!(p.crash.program.as_deref(), Some("mysqld"));
        assert_eq!(
            p.crash.build_id.as_deref(),
            Some("cc8a18826385d7182761a4a8f41044748267244d")
        );
        assert_eq!(p.crash.connection_id, Some(10));
        assert_eq!(
            p.crash.query.as_deref(),
            Some("SELECT SLEEP(60) INTO @slept")
        );
        let f = &p.threads[0].frames;
        // #36, the unwinder's end mark (0xffffffffffffffff), is no frame.
        assert_eq!(f.len(), 36);
        assert_eq!(f[0], TextFrame::at(0x557ff42d5e84));
        assert_eq!(
            f[8],
            TextFrame {
                function: Some("_ZN15Item_func_sleep7val_intEv".into()),
                ..TextFrame::at(0x557ff45105e2)
            }
        );
        assert!(f.iter().all(|f| !f.is_return_address && f.module.is_none()));
        let (e, site) = elements(&p.threads[0]);
        assert_eq!(site.as_deref(), Some("??"));
        assert_eq!(e.stored_routine_depth, 1);
        assert!(e.prepared_statement);
        assert_eq!(
            summary_line(&e, &p.crash, None),
            "SIGSEGV, stored routine depth 1, prepared statement, Item_func_sleep, Item_func_set_user_var, \
             query: SELECT SLEEP(60) INTO @slept"
        );
        let with_source =
            super::libbacktrace_frame("#3 0x55aa Foo::bar() at sql/foo.cc:12").unwrap();
        assert_eq!(with_source.function.as_deref(), Some("Foo::bar()"));
        assert_eq!(with_source.source.as_deref(), Some("sql/foo.cc:12"));
    }

    /// MariaDB 10.4's layout, from its sql/signal_handler.cc: `mysqld got signal`, the statement before the
    /// connection id, a frame backtrace_symbols_fd could place in no module.
    const MARIADB_10_4: &str = "\
200101 12:00:00 [ERROR] mysqld got signal 11 ;
This could be because you hit a bug. It is also possible that this binary
or one of the libraries it was linked against is corrupt, improperly built,
or misconfigured. This error can also be caused by malfunctioning hardware.

To report this bug, see https://mariadb.com/kb/en/reporting-bugs

Server version: 10.4.32-MariaDB-log
key_buffer_size=134217728
Hope that's ok; if not, decrease some variables in the equation.

Thread pointer: 0x7f2a3c000c08
Attempting backtrace. You can use the following information to find out
where mysqld died. If you see no messages after this, something went
terribly wrong...
stack_bottom = 0x7f2a5c0b5e88 thread_stack 0x49000
/usr/sbin/mysqld(my_print_stacktrace+0x2e)[0x55d0a8f1c27e]
/usr/sbin/mysqld(handle_fatal_signal+0x30f)[0x55d0a89b4b1f]
/lib/x86_64-linux-gnu/libpthread.so.0(+0x12730)[0x7f2a6a3c0730]
[0x7f2a3c0a8d70]
/usr/sbin/mysqld(_Z21mysql_execute_commandP3THD+0x1a57)[0x55d0a87a3e57]

Trying to get some variables.
Some pointers may be invalid and cause the dump to abort.
Query (0x0): (null)
Connection ID (thread ID): 3
Status: KILL_CONNECTION

Optimizer switch: index_merge=on,index_merge_union=on

The manual page at https://mariadb.com/kb/en/how-to-produce-a-full-stack-trace-for-mysqld/ contains
information that should help you find out what is causing the crash.
Writing a core file...
";

    #[test]
    fn mariadb_10_4_crash_report() {
        let p = parse(MARIADB_10_4, "error.log").unwrap();
        assert_eq!(p.crash.format, "MariaDB crash report");
        assert_eq!(
            p.crash.server_version.as_deref(),
            Some("10.4.32-MariaDB-log")
        );
        assert_eq!(p.crash.query, None);
        assert_eq!(p.crash.connection_id, Some(3));
        assert_eq!(p.crash.status.as_deref(), Some("KILL_CONNECTION"));
        let f = &p.threads[0].frames;
        assert_eq!(f.len(), 5);
        assert_eq!(f[2].module_offset, Some(0x12730));
        assert!(!f[2].is_return_address);
        assert_eq!(
            f[3],
            TextFrame {
                addr: Some(0x7f2a3c0a8d70),
                ..TextFrame::default()
            }
        );
        assert!(f[4].is_return_address);

        // A statement pointer the handler could not read first, then printed at the end anyway.
        let invalid = MARIADB_10_4
            .replace("Query (0x0): (null)", "Query (0x7f2a3c0a1000): ")
            .replace(
                "Writing a core file...",
                "\nWe think the query pointer is invalid, but we will try to print it anyway. \n\
                 Query: SELECT 1\n\nWriting a core file...",
            );
        let p = parse(&invalid, "error.log").unwrap();
        assert_eq!(p.crash.query.as_deref(), Some("SELECT 1"));
    }

    #[test]
    fn the_last_of_several_crashes_is_taken() {
        let both = format!("{SEGV_KILL}{SEGV_SLEEP}");
        let p = parse(&both, "error.log").unwrap();
        assert_eq!(p.crash.query.as_deref(), Some("SELECT SLEEP(60)"));
        assert_eq!(p.threads[0].frames.len(), 25);
        let both = format!("{SEGV_SLEEP}{SEGV_KILL}");
        let p = parse(&both, "error.log").unwrap();
        assert_eq!(p.crash.query, None);
        assert_eq!(p.crash.connection_id, None);
        assert_eq!(p.threads[0].frames.len(), 9);
    }

    #[test]
    fn assertions_before_the_signal_line() {
        let glibc = SEGV_SLEEP.replace(
            "[ERROR] mariadbd got signal 11 ;",
            "mariadbd: /build/mariadb/sql/sql_select.cc:1234: int JOIN::optimize(): Assertion \
             `!thd->is_error()' failed.\n261124 12:52:25 [ERROR] mariadbd got signal 6 ;",
        );
        let p = parse(&glibc, "error.log").unwrap();
        assert_eq!(p.crash.assertion.as_deref(), Some("!thd->is_error()"));
        assert_eq!(p.crash.signal.as_deref(), Some("SIGABRT"));

        let innodb = SEGV_SLEEP.replace(
            "261124 12:52:25 [ERROR] mariadbd got signal 11 ;",
            "2026-11-24 12:52:25 0x7f155ee5a6c0  InnoDB: Assertion failure in file \
             ./storage/innobase/btr/btr0cur.cc line 4100\n\
             InnoDB: Failing assertion: !cursor->index()->is_committed()\n\
             InnoDB: We intentionally generate a memory trap.\n\
             261124 12:52:25 [ERROR] mariadbd got signal 6 ;",
        );
        let p = parse(&innodb, "error.log").unwrap();
        assert_eq!(
            p.crash.assertion.as_deref(),
            Some("!cursor->index()->is_committed()")
        );
        // An assertion of an earlier crash is not this crash's.
        let p = parse(&format!("{innodb}{SEGV_KILL}"), "error.log").unwrap();
        assert_eq!(p.crash.assertion, None);
    }

    /// MySQL 8.0's form, built from sql/signal_handler.cc's and mysys/stacktrace.cc's formats (`%p` without
    /// `0x`, demangled names, a space before `[`) and a public report's first lines.
    const MYSQL8: &str = "\
2024-07-25T12:52:05.429738Z 10624 [ERROR] [MY-013183] [InnoDB] Assertion failure: buf0lru.cc:1264:ib::fatal triggered thread 126861602342464
InnoDB: We intentionally generate a memory trap.
2024-07-25T12:52:05Z UTC - mysqld got signal 6 ;
Most likely, you have hit a bug, but this error can also be caused by malfunctioning hardware.
BuildID[sha1]=773726723fa9c27f49de3c5134e0c9f687afbc56
Server Version: 8.0.36-28 Percona Server (GPL), Release 28, Revision 47601f19

Thread pointer: 0x73616c1a9690
Attempting backtrace. You can use the following information to find out
where mysqld died. If you see no messages after this, something went
terribly wrong...
stack_bottom = 736144be3b70 thread_stack 0x100000
/usr/sbin/mysqld(my_print_stacktrace(unsigned char const*, unsigned long)+0x41) [0x590354397391]
/usr/sbin/mysqld(print_fatal_signal(int)+0x39f) [0x5903532b5c2f]
/usr/sbin/mysqld(handle_fatal_signal+0xc8) [0x5903532b5cf8]
/lib/x86_64-linux-gnu/libc.so.6(+0x42520) [0x7361a4442520]
/lib/x86_64-linux-gnu/libc.so.6(pthread_kill+0x12c) [0x7361a44969fc]
/lib/x86_64-linux-gnu/libc.so.6(raise+0x16) [0x7361a4442476]
/lib/x86_64-linux-gnu/libc.so.6(abort+0xd3) [0x7361a44287f3]
/usr/sbin/mysqld(ut_dbg_assertion_failed(char const*, char const*, unsigned long)+0x2a2) [0x5903536fd1a2]
/usr/sbin/mysqld(ib::fatal::~fatal()+0xd1) [0x5903536ff9e1]
/usr/sbin/mysqld(buf_LRU_get_free_block(buf_pool_t*)+0x5a1) [0x590353762d11]
/usr/sbin/mysqld(+0x23b8a41) [0x59035463ba41]
/usr/sbin/mysqld(row_search_mvcc(unsigned char*, page_cur_mode_t, row_prebuilt_t*, unsigned long, unsigned long)+0x4c2) [0x5903535e7b02]
/usr/sbin/mysqld(ha_innobase::index_read(unsigned char*, unsigned char const*, unsigned int, ha_rkey_function)+0x339) [0x5903534a2a29]
/usr/sbin/mysqld(handler::ha_index_read_map(unsigned char*, unsigned char const*, unsigned long, ha_rkey_function)+0x1a1) [0x590352b5d821]
/usr/sbin/mysqld(mysql_execute_command(THD*, bool)+0x1f1a) [0x590352f4d6ba]
/usr/sbin/mysqld(dispatch_command(THD*, COM_DATA const*, enum_server_command)+0x1a6f) [0x590352f5232f]
/lib/x86_64-linux-gnu/libc.so.6(+0x94ac3) [0x7361a4494ac3]
/lib/x86_64-linux-gnu/libc.so.6(+0x126850) [0x7361a4526850]

Trying to get some variables.
Some pointers may be invalid and cause the dump to abort.
Query (7360e40212a8): SELECT c FROM sbtest1 WHERE id = 42
Connection ID (thread ID): 8
Status: NOT_KILLED

The manual page at http://dev.mysql.com/doc/mysql/en/crashing.html contains
information that should help you find out what is causing the crash.
";

    #[test]
    fn mysql_8_crash_report() {
        let p = parse(MYSQL8, "mysqld.err").unwrap();
        assert_eq!(p.crash.format, "MySQL crash report");
        assert_eq!(p.crash.signal.as_deref(), Some("SIGABRT"));
        assert_eq!(
            p.crash.server_version.as_deref(),
            Some("8.0.36-28 Percona Server (GPL), Release 28, Revision 47601f19")
        );
        assert_eq!(
            p.crash.assertion.as_deref(),
            Some("buf0lru.cc:1264:ib::fatal triggered")
        );
        assert_eq!(
            p.crash.query.as_deref(),
            Some("SELECT c FROM sbtest1 WHERE id = 42")
        );
        assert_eq!(p.crash.connection_id, Some(8));
        let t = &p.threads[0];
        assert_eq!(t.frames.len(), 18);
        assert_eq!(
            t.frames[0],
            frame(
                Some("my_print_stacktrace(unsigned char const*, unsigned long)"),
                Some(0x41),
                Some("/usr/sbin/mysqld"),
                None,
                0x590354397391,
                true
            )
        );
        // The unnamed trampoline after handle_fatal_signal, and the frame it interrupted.
        assert_eq!(
            t.frames[3],
            frame(
                None,
                None,
                Some("/lib/x86_64-linux-gnu/libc.so.6"),
                Some(0x42520),
                0x7361a4442520,
                false
            )
        );
        assert!(!t.frames[4].is_return_address);
        assert!(t.frames[5].is_return_address);
        let (e, site) = elements(t);
        assert_eq!(site.as_deref(), Some("buf_LRU_get_free_block"));
        assert_eq!(e.engine.as_deref(), Some("InnoDB"));
        assert_eq!(e.command.as_deref(), Some("handler::ha_index_read_map"));
        assert_eq!(
            summary_line(&e, &p.crash, site.as_deref()),
            "SIGABRT in buf_LRU_get_free_block, assertion failed: buf0lru.cc:1264:ib::fatal \
             triggered, InnoDB, query: SELECT c FROM sbtest1 WHERE id = 42"
        );
    }
}
