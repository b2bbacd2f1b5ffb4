//! Stacks as users paste them (`myprobe stacks --resolve`): the crash section of a MariaDB/MySQL error log,
//! gdb's `thread apply all bt`, pstack, eu-stack, or a bare list of addresses. Parsed into threads of frames
//! (addresses, modules, offsets and names as the text gives them) and a crash's own facts (signal, assertion,
//! statement); and named by the elements that identify a crash (signal handler, stored routine depth,
//! prepared statement, engine, `Item_func_*` classes). Pure functions of the text: resolving addresses
//! against binaries and rendering are the caller's.

use anyhow::{bail, Result};
use serde::Serialize;

use crate::symbolize::{clean::matching_open_paren, clean_name};

/// One frame as the text gives it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TextFrame {
    /// The function as written, without gdb's argument values and without a `+0x..` offset (kept in
    /// `function_offset`); may be mangled (`_ZN15Item_func_sleep7val_intEv`) or carry a signature
    /// (`Item_func_sleep::val_int()`): see [`clean_function`]. None when only an address is known.
    pub function: Option<String>,
    /// `function+0x5a`: the offset from the function's start, as backtrace_symbols prints it: resolvable
    /// against the module's symbol table even when the address is not (another build, ASLR).
    pub function_offset: Option<u64>,
    /// The module (binary or library path or file name) the text names, e.g. `mariadbd`,
    /// `/lib/x86_64-linux-gnu/libc.so.6`.
    pub module: Option<String>,
    /// The offset from the module's load bias, i.e. the module's ELF virtual address: `module(+0x1234)`
    /// (backtrace_symbols' form), or eu-stack `-b`'s `@base+offset` recomputed from the absolute address.
    pub module_offset: Option<u64>,
    /// The absolute address (`[0x...]`, gdb's `#3  0x... in`, eu-stack's `#3  0x...`).
    pub addr: Option<u64>,
    /// Whether the address is a return address (the caller subtracts 1 before symbolizing): false for the
    /// innermost frame of gdb and eu-stack threads, for a signal trampoline and for the frame it interrupted,
    /// and for eu-stack `-a` frames without the ` - 1` mark. backtrace() (crash reports) starts at a return
    /// address, so there only the trampoline and the interrupted frame are exact. False without an address.
    pub is_return_address: bool,
    /// `file:line` as the text gives it (addr2line in a crash report, gdb's ` at `, eu-stack `-s`).
    pub source: Option<String>,
    /// eu-stack `-b`'s build id of the module: the key to debuginfod and to the right binary.
    pub build_id: Option<String>,
}

impl TextFrame {
    /// The name to show and to classify with: demangled, no signature, no symbol version.
    pub fn clean_function(&self) -> Option<String> {
        self.function.as_deref().and_then(clean_function)
    }
}

/// One thread's stack.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TextThread {
    /// A thread id (LWP/TID) when the text gives one (gdb's `Thread 0x7f.. (LWP 1234)`, eu-stack's
    /// `TID 1234:`), else None.
    pub tid: Option<u32>,
    /// gdb's thread number, eu-stack's TID, or the order of appearance (from 1).
    pub label: String,
    /// The thread's name where gdb prints it (`"mariadbd"`).
    pub name: Option<String>,
    /// Innermost first.
    pub frames: Vec<TextFrame>,
}

/// What a crash report says besides the stack.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CrashInfo {
    /// `SIGSEGV` from `got signal 11`; `signal 42` for numbers without a usual name.
    pub signal: Option<String>,
    /// The failed condition: glibc's ``Assertion `...' failed``, InnoDB's `Failing assertion: ...`,
    /// MySQL 8's `Assertion failure: file:line:...`.
    pub assertion: Option<String>,
    /// The statement of the `Query (0x...): ` line and the lines after it up to the next line the report is
    /// known to print; None for `(null)`, an empty statement or an invalid pointer. In a stored routine it is
    /// the routine's statement that ran, not the `CALL`.
    pub query: Option<String>,
    /// `Connection ID (thread ID): 42`.
    pub connection_id: Option<u64>,
    /// `Status: NOT_KILLED`.
    pub status: Option<String>,
    /// `Server version: 10.11.19-MariaDB-0+deb12u1` (without the source revision).
    pub server_version: Option<String>,
    /// Where the stack came from: "MariaDB crash report", "MySQL crash report", "gdb", "pstack",
    /// "eu-stack", "addresses".
    pub format: &'static str,
}

/// A parsed text: its threads and, for a crash report, what it says about the crash.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ParsedText {
    pub threads: Vec<TextThread>,
    pub crash: CrashInfo,
}

/// Parses pasted stack text. An error log may hold several crashes: the LAST crash section is taken (the
/// one nearest the end of the text, up to the next server start). Crash facts are read even when the stack
/// comes from gdb or eu-stack text pasted along with the log. `name` names the text in messages (a file
/// name, or `-` for standard input).
///
/// Errors when the text holds no stack, with one line telling what was expected.
pub fn parse(text: &str, name: &str) -> Result<ParsedText> {
    let lines: Vec<&str> = text.lines().map(clean_line).collect();
    let mut crash = CrashInfo::default();
    let section = crash_section(&lines);
    if let Some(section) = &section {
        read_crash_info(&lines, section, &mut crash);
        let frames = backtrace_frames(&lines[section.stack_from..section.end]);
        // Without a `got signal` line, backtrace_symbols' form alone must show it is a crash report: bare
        // `[0x...]` lines are an address list.
        if frames
            .iter()
            .any(|f| f.function.is_some() || f.module.is_some())
            || (section.header.is_some() && !frames.is_empty())
        {
            crash.format = section.format;
            let thread = TextThread {
                tid: None,
                label: "1".to_string(),
                name: None,
                frames,
            };
            return Ok(ParsedText {
                threads: vec![thread],
                crash,
            });
        }
    }
    if let Some((threads, format)) = gdb_threads(&lines) {
        crash.format = format;
        return Ok(ParsedText { threads, crash });
    }
    if let Some(threads) = eu_stack_threads(&lines) {
        crash.format = "eu-stack";
        return Ok(ParsedText { threads, crash });
    }
    if let Some(thread) = address_list(&lines) {
        crash.format = "addresses";
        return Ok(ParsedText {
            threads: vec![thread],
            crash,
        });
    }
    if section.is_some_and(|s| s.header.is_some()) {
        bail!(
            "no stack found in {name}: the crash report has no backtrace lines (expected lines such as \
             `mariadbd(handle_fatal_signal+0x269)[0x55f64889b0f9]` after \"Attempting backtrace\")"
        );
    }
    bail!(
        "no stack found in {name}: expected a MariaDB/MySQL crash report, gdb `thread apply all bt`, \
         eu-stack or pstack text, or a list of addresses"
    )
}

/// A frame name cleaned for showing and classifying: demangled (`_ZN15Item_func_sleep7val_intEv` →
/// `Item_func_sleep::val_int`), without signature, return type, clone suffix or symbol version
/// (`pthread_cond_wait@@GLIBC_2.3.2`). None for `??` and empty names.
pub fn clean_function(raw: &str) -> Option<String> {
    let s = raw.trim();
    if s.is_empty() || s == "??" {
        return None;
    }
    if s == SIGNAL_HANDLER_CALLED {
        return Some(s.to_string());
    }
    let s = strip_symbol_version(s);
    if s.starts_with("_Z") {
        if let Some(d) = cpp_demangle::Symbol::new(s)
            .ok()
            .and_then(|sym| sym.demangle().ok())
        {
            return clean_name(&d);
        }
    }
    clean_name(s)
}

/// gdb's function text without its argument values: `Item_func_sleep::val_int (this=0x7f..)` →
/// `Item_func_sleep::val_int`; `Item_func_sleep::val_int() ()` → `Item_func_sleep::val_int()` (the
/// signature of a function without debug info is part of its name); ` at file:line` and ` from lib` are
/// expected to be split off before.
pub fn strip_gdb_arguments(s: &str) -> &str {
    let s = s.trim_end();
    if !s.ends_with(')') {
        return s;
    }
    match matching_open_paren(s) {
        // gdb puts one space between the name and its arguments; C++ names' own parentheses
        // (`operator()`, `(anonymous namespace)::f`, `f(int)`) have none before them.
        Some(open) if open > 0 && s.as_bytes()[open - 1] == b' ' => s[..open].trim_end(),
        _ => s,
    }
}

/// `pthread_cond_wait@@GLIBC_2.3.2` → `pthread_cond_wait` (eu-stack prints versioned dynamic symbols).
fn strip_symbol_version(s: &str) -> &str {
    match s.find('@') {
        Some(at) if at > 0 => {
            let version = s[at..].trim_start_matches('@');
            if version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            {
                &s[..at]
            } else {
                s
            }
        }
        _ => s,
    }
}

const SIGNAL_HANDLER_CALLED: &str = "<signal handler called>";

/// A line without its line ending and without a syslog/journal prefix (`Nov 24 12:51:39 host
/// mariadbd[1234]: `), which `journalctl -u mariadb` puts before every line of a crash report.
fn clean_line(line: &str) -> &str {
    let line = line.trim_end_matches('\r');
    strip_journal_prefix(line).unwrap_or(line)
}

fn strip_journal_prefix(line: &str) -> Option<&str> {
    const MONTHS: &[&str] = &[
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = line.get(..3)?;
    if !MONTHS.contains(&month) {
        return None;
    }
    let mut rest = line[3..].trim_start_matches(' ');
    let day_end = rest.find(' ')?;
    if !rest[..day_end].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest = &rest[day_end + 1..];
    let time_end = rest.find(' ')?;
    let time = &rest[..time_end];
    if time.len() != 8 || time.bytes().filter(|&b| b == b':').count() != 2 {
        return None;
    }
    rest = &rest[time_end + 1..];
    let host_end = rest.find(' ')?;
    rest = &rest[host_end + 1..];
    let ident_end = rest
        .find(": ")
        .or_else(|| rest.strip_suffix(':').map(|r| r.len()))?;
    if rest[..ident_end].contains(' ') {
        return None;
    }
    Some(rest.get(ident_end + 2..).unwrap_or(""))
}

fn parse_hex(s: &str) -> Option<u64> {
    let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

// ---------------------------------------------------------------------------------------------------------
// Crash reports

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
    if let Some(i) = line.find("got signal ") {
        let digits: String = line[i + "got signal ".len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        return digits.parse().ok().map(crate::process::signal_name);
    }
    if let Some(i) = line.find("got exception ") {
        let code = line[i + "got exception ".len()..]
            .split_whitespace()
            .next()?;
        parse_hex(code)?;
        return Some(format!("exception {code}"));
    }
    None
}

fn is_server_start(line: &str) -> bool {
    line.contains("starting as process")
        || line.contains("Starting MariaDB")
        || line.contains("mysqld_safe Starting")
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
        .find(|&i| is_server_start(lines[i]))
        .unwrap_or(lines.len());
    let stack_from = (start..end)
        .rev()
        .find(|&i| is_stack_marker(lines[i]))
        .unwrap_or(start);
    if header.is_none() && lines.is_empty() {
        return None;
    }
    let mysql = header.is_some_and(|h| lines[h].contains("UTC - "))
        || lines[start..end].iter().any(|l| {
            l.starts_with("Server Version: ") || l.starts_with("Most likely, you have hit")
        });
    Some(CrashSection {
        header,
        previous_end,
        stack_from,
        end,
        format: if mysql {
            "MySQL crash report"
        } else {
            "MariaDB crash report"
        },
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
        } else if let Some(v) = line.strip_prefix("Connection ID (thread ID): ") {
            crash.connection_id = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("Status: ") {
            crash.status = Some(v.trim().to_string()).filter(|s| !s.is_empty());
        } else if let Some(rest) = line.strip_prefix("Query (") {
            if let Some(close) = rest
                .find("): ")
                .or_else(|| rest.strip_suffix("):").map(str::len))
            {
                let first = rest.get(close + 3..).unwrap_or("");
                let (query, next) = statement(lines, i, section.end, first);
                crash.query = query;
                i = next;
                continue;
            }
        } else if let Some(first) = line.strip_prefix("Query: ") {
            // Printed after "We think the query pointer is invalid, but we will try to print it anyway."
            let (query, next) = statement(lines, i, section.end, first);
            fallback_query = query;
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
    if let Some(i) = line.find("Assertion `") {
        let rest = &line[i + "Assertion `".len()..];
        let end = rest.rfind("' failed").unwrap_or(rest.len());
        return Some(rest[..end].to_string());
    }
    if let Some(i) = line.find("Failing assertion: ") {
        return Some(line[i + "Failing assertion: ".len()..].trim().to_string());
    }
    // MariaDB/MySQL 5.x InnoDB, when the condition is not printed: `Assertion failure in file F line N`.
    if let Some(i) = line.find("Assertion failure in ") {
        return Some(line[i + "Assertion failure in ".len()..].trim().to_string());
    }
    // MySQL 8: `[InnoDB] Assertion failure: buf0lru.cc:1264:ib::fatal triggered thread 126861602342464`.
    if let Some(i) = line.find("Assertion failure: ") {
        let rest = line[i + "Assertion failure: ".len()..].trim();
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
    frames
}

/// `mariadbd(my_print_stacktrace+0x2e)[0x55..]`, `mariadbd(+0xd3a2be)[0x55..]`, `[0x55..]`,
/// `/usr/sbin/mysqld(my_print_stacktrace(unsigned char const*, unsigned long)+0x41) [0x..]` (MySQL 8
/// demangles and puts a space), and addr2line's `sql/item_func.cc:4305(Item_func_sleep::val_int())[0x..]`.
fn backtrace_frame(line: &str) -> Option<TextFrame> {
    let body = line.strip_suffix(']')?;
    let open = body.rfind('[')?;
    let addr = parse_hex(&body[open + 1..])?;
    let head = body[..open].trim_end();
    let mut frame = TextFrame {
        addr: Some(addr),
        ..TextFrame::default()
    };
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
        frame.function = Some(inner.to_string()).filter(|f| !f.is_empty() && f != "??");
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

/// `file.cc:123`, `??:0`: what addr2line puts where backtrace_symbols puts the module.
fn is_source_location(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((file, line)) => {
            !file.is_empty()
                && !line.is_empty()
                && (line.bytes().all(|b| b.is_ascii_digit()) || line == "?")
        }
        None => false,
    }
}

fn is_signal_trampoline(function: Option<&str>) -> bool {
    function.is_some_and(|f| {
        f == SIGNAL_HANDLER_CALLED || f.contains("__restore_rt") || f.contains("sigreturn")
    })
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

// ---------------------------------------------------------------------------------------------------------
// gdb and pstack

/// `Thread 3 (Thread 0x7f... (LWP 1234) "mariadbd"):`, `Thread 1 (process 1234):` → (number, tid, name).
fn gdb_thread_header(line: &str) -> Option<(String, Option<u32>, Option<String>)> {
    let rest = line.strip_prefix("Thread ")?;
    let (number, rest) = rest.split_once(' ')?;
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let rest = rest.trim_end().strip_prefix('(')?.strip_suffix("):")?;
    let id_after = |key: &str| -> Option<u32> {
        let i = rest.find(key)?;
        let digits: String = rest[i + key.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    let tid = id_after("(LWP ")
        .or_else(|| id_after("LWP "))
        .or_else(|| id_after("process "));
    let name = rest
        .strip_suffix('"')
        .and_then(|r| r.rfind('"').map(|q| r[q + 1..].to_string()));
    Some((number.to_string(), tid, name))
}

/// `#12 ...` → (12, the rest).
fn numbered_frame(line: &str) -> Option<(usize, &str)> {
    let rest = line.trim_start().strip_prefix('#')?;
    let digits_end = rest.find(|c: char| !c.is_ascii_digit())?;
    let number = rest[..digits_end].parse().ok()?;
    let body = &rest[digits_end..];
    if !body.starts_with(' ') {
        return None;
    }
    Some((number, body.trim()))
}

/// A gdb frame: `0x000055d5 in Item_func_sleep::val_int (this=0x7f..) at ./sql/item_func.cc:4305`,
/// `0x... in ?? () from /lib/x86_64-linux-gnu/libc.so.6`, `<signal handler called>`, or an inlined frame
/// without address `foo (x=1) at f.c:3`. None for eu-stack's `0x... name`.
fn gdb_frame(body: &str) -> Option<TextFrame> {
    let mut frame = TextFrame::default();
    if body == SIGNAL_HANDLER_CALLED {
        frame.function = Some(body.to_string());
        return Some(frame);
    }
    let mut rest = body;
    if rest.starts_with("0x") {
        let (addr, after) = rest.split_once(' ')?;
        frame.addr = Some(parse_hex(addr)?);
        rest = after.strip_prefix("in ")?;
    }
    if let Some((before, lib)) = rest.rsplit_once(" from ") {
        if !lib.is_empty() && !lib.contains(' ') {
            frame.module = Some(lib.to_string());
            rest = before;
        }
    }
    if let Some((before, location)) = rest.rsplit_once(" at ") {
        if !location.contains(' ') && is_source_location(location) {
            frame.source = Some(location.to_string());
            rest = before;
        }
    }
    let function = strip_gdb_arguments(rest);
    if function.is_empty() || (function.starts_with('(') && !function.starts_with("(anonymous")) {
        return None;
    }
    frame.function = Some(function.to_string()).filter(|f| f != "??");
    Some(frame)
}

/// gdb `bt` / `thread apply all bt` text, and pstack's (gdb's frames, its preamble filtered out): the
/// threads and "gdb" or "pstack". pstack is named when every line is a thread header or a frame, as
/// gstack's filter leaves it.
fn gdb_threads(lines: &[&str]) -> Option<(Vec<TextThread>, &'static str)> {
    let mut threads: Vec<TextThread> = Vec::new();
    let mut current: Option<TextThread> = None;
    let mut only_headers_and_frames = true;
    for line in lines {
        if let Some((label, tid, name)) = gdb_thread_header(line) {
            threads.extend(current.take().filter(|t| !t.frames.is_empty()));
            current = Some(TextThread {
                tid,
                label,
                name,
                frames: Vec::new(),
            });
            continue;
        }
        let Some((number, body)) = numbered_frame(line) else {
            only_headers_and_frames &= line.trim().is_empty();
            continue;
        };
        let Some(frame) = gdb_frame(body) else {
            only_headers_and_frames = false;
            continue;
        };
        // A plain `bt` (or a second one) has no thread header: `#0` starts another thread.
        if number == 0 && current.as_ref().is_some_and(|t| !t.frames.is_empty()) {
            threads.extend(current.take());
        }
        current
            .get_or_insert_with(|| TextThread {
                label: (threads.len() + 1).to_string(),
                ..TextThread::default()
            })
            .frames
            .push(frame);
    }
    threads.extend(current.filter(|t| !t.frames.is_empty()));
    if threads.is_empty() {
        return None;
    }
    for thread in &mut threads {
        mark_unwound_return_addresses(&mut thread.frames, None);
    }
    Some((
        threads,
        if only_headers_and_frames {
            "pstack"
        } else {
            "gdb"
        },
    ))
}

/// For unwinders' listings (gdb, eu-stack): the innermost frame's address is the pc; so is the signal
/// trampoline's and the interrupted frame's after it; a frame at the address of the one before it is an
/// inlined function of it. Every other address is a return address. `exact_marks`: eu-stack `-a`'s own
/// verdict per frame, which wins.
fn mark_unwound_return_addresses(frames: &mut [TextFrame], exact_marks: Option<&[bool]>) {
    let mut previous_addr = None;
    let mut previous_return = false;
    let mut after_trampoline = false;
    for (i, frame) in frames.iter_mut().enumerate() {
        let trampoline = is_signal_trampoline(frame.function.as_deref());
        let is_return = match (frame.addr, exact_marks) {
            (None, _) => false,
            (Some(_), Some(marks)) => !marks[i],
            (Some(addr), None) if previous_addr == Some(addr) => previous_return,
            (Some(_), None) => i > 0 && !trampoline && !after_trampoline,
        };
        frame.is_return_address = is_return;
        if frame.addr.is_some() {
            previous_addr = frame.addr;
            previous_return = is_return;
        }
        // gdb's inlined frames have no address: the interrupted frame is the next one that has one.
        if trampoline {
            after_trampoline = true;
        } else if frame.addr.is_some() {
            after_trampoline = false;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// eu-stack

/// eu-stack's threads (`TID 1234:` headers; `-a`, `-m`, `-b`, `-s`, `-i` output too).
fn eu_stack_threads(lines: &[&str]) -> Option<Vec<TextThread>> {
    let mut threads: Vec<TextThread> = Vec::new();
    let mut marks: Vec<Vec<Option<bool>>> = Vec::new();
    for line in lines {
        if let Some(tid) = line
            .strip_prefix("TID ")
            .and_then(|r| r.trim_end().strip_suffix(':'))
        {
            if let Ok(tid) = tid.parse::<u32>() {
                threads.push(TextThread {
                    tid: Some(tid),
                    label: tid.to_string(),
                    ..TextThread::default()
                });
                marks.push(Vec::new());
                continue;
            }
        }
        if let Some((_, body)) = numbered_frame(line) {
            if let Some((frame, exact)) = eu_stack_frame(body) {
                if threads.is_empty() {
                    threads.push(TextThread {
                        label: "1".to_string(),
                        ..TextThread::default()
                    });
                    marks.push(Vec::new());
                }
                let last = threads.len() - 1;
                threads[last].frames.push(frame);
                marks[last].push(exact);
            }
            continue;
        }
        // `-b` and `-s` add an indented line under the frame.
        if line.starts_with("    ") {
            if let Some(frame) = threads.last_mut().and_then(|t| t.frames.last_mut()) {
                eu_stack_detail(line.trim(), frame);
            }
        }
    }
    let mut found = false;
    for (thread, marks) in threads.iter_mut().zip(&marks) {
        found |= !thread.frames.is_empty();
        // `-a` marks every frame, exact ones with padding where the others have ` - 1`.
        let exact: Option<Vec<bool>> = marks.iter().copied().collect();
        mark_unwound_return_addresses(&mut thread.frames, exact.as_deref());
    }
    threads.retain(|t| !t.frames.is_empty());
    found.then_some(threads)
}

/// `0x00007f.. __futex_abstimed_wait_common64`, `-a`'s `0x.. - 1 name` and `0x..     name`, `-m`'s
/// `... name - /usr/lib/libc.so.6` → the frame, and whether `-a` called its address exact.
fn eu_stack_frame(body: &str) -> Option<(TextFrame, Option<bool>)> {
    let addr_end = body.find(' ').unwrap_or(body.len());
    let addr = parse_hex(&body[..addr_end])?;
    let mut rest = &body[addr_end..];
    if rest.starts_with(" in ") {
        return None;
    }
    let exact = if let Some(r) = rest.strip_prefix(" - 1") {
        if r.is_empty() || r.starts_with(' ') {
            rest = r;
            Some(false)
        } else {
            None
        }
    } else if rest.starts_with("     ") {
        Some(true)
    } else {
        None
    };
    let rest = rest.trim();
    let mut frame = TextFrame {
        addr: Some(addr),
        ..TextFrame::default()
    };
    let (function, module) = if let Some(module) = rest.strip_prefix("- ") {
        ("", Some(module))
    } else {
        match rest.rsplit_once(" - ") {
            Some((f, m)) if !m.contains(' ') => (f, Some(m)),
            _ => (rest, None),
        }
    };
    frame.function = Some(function.trim().to_string()).filter(|f| !f.is_empty() && f != "??");
    frame.module = module.map(str::to_string);
    Some((frame, exact))
}

/// `[build-id]@0xbase+0xoffset` (`-b`) or `file:line:column` (`-s`).
fn eu_stack_detail(detail: &str, frame: &mut TextFrame) {
    if let Some(rest) = detail.strip_prefix('[') {
        let Some((build_id, location)) = rest.split_once("]@") else {
            return;
        };
        frame.build_id = Some(build_id.to_string()).filter(|b| !b.is_empty());
        // The printed offset is of the pc eu-stack looked up (pc - 1 for return addresses): the base
        // gives the address's own.
        let base = location.split('+').next().and_then(parse_hex);
        if let (Some(base), Some(addr)) = (base, frame.addr) {
            frame.module_offset = addr.checked_sub(base);
        }
    } else if detail.contains(':') && !detail.contains(' ') {
        frame.source = Some(detail.to_string());
    }
}

// ---------------------------------------------------------------------------------------------------------
// Address lists

/// Lines that are only `0x...` or `[0x...]`: one thread, innermost first.
fn address_list(lines: &[&str]) -> Option<TextThread> {
    let mut frames: Vec<TextFrame> = lines
        .iter()
        .filter_map(|l| {
            let l = l.trim();
            let l = l
                .strip_prefix('[')
                .and_then(|r| r.strip_suffix(']'))
                .unwrap_or(l);
            parse_hex(l)
        })
        .map(|addr| TextFrame {
            addr: Some(addr),
            ..TextFrame::default()
        })
        .collect();
    if frames.is_empty() {
        return None;
    }
    mark_unwound_return_addresses(&mut frames, None);
    Some(TextThread {
        tid: None,
        label: "1".to_string(),
        name: None,
        frames,
    })
}

// ---------------------------------------------------------------------------------------------------------
// Identifying elements

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

/// Frames of a stack's signal handling, innermost first as they appear.
const SIGNAL_HANDLER_FRAMES: &[&str] = &[
    "handle_fatal_signal",
    "my_print_stacktrace",
    "print_fatal_signal",
    "__restore_rt",
    SIGNAL_HANDLER_CALLED,
];

/// What turns an assertion or a kill into SIGABRT: between the signal handler and the code that failed.
const ABORT_FRAMES: &[&str] = &[
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
const ENGINES: &[(&str, &[&str])] = &[
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

/// Function names that do not name anything: the caller's placeholders for unresolved frames.
fn is_unnamed(name: &str) -> bool {
    let name = name.trim();
    name.is_empty()
        || name == "??"
        || name.starts_with("0x")
        || name.starts_with("+0x")
        || name.starts_with('[')
}

fn engine_of(name: &str) -> Option<&'static str> {
    if name == "lock_table" {
        return Some("InnoDB");
    }
    ENGINES
        .iter()
        .find(|(_, prefixes)| prefixes.iter().any(|p| name.starts_with(p)))
        .map(|(engine, _)| *engine)
}

/// Names a thread's stack by what identifies a crash, from its clean frame names (see [`clean_function`]),
/// innermost first. Unnamed frames may be given as "", "??" or an address.
pub fn identify(frames: &[&str]) -> Elements {
    let mut e = Elements::default();
    let mut sp_head_execute = 0;
    let mut routine_entries = 0;
    for &raw in frames {
        let name = raw.trim();
        if is_unnamed(name) {
            continue;
        }
        e.signal_handler |= SIGNAL_HANDLER_FRAMES.contains(&name);
        e.prepared_statement |= name.starts_with("Prepared_statement::execute")
            || matches!(
                name,
                "mysqld_stmt_execute"
                    | "mysqld_stmt_bulk_execute"
                    | "mysql_sql_stmt_execute"
                    | "mysql_stmt_execute"
            );
        if name == "sp_head::execute" {
            sp_head_execute += 1;
        }
        if matches!(
            name,
            "sp_head::execute_procedure"
                | "sp_head::execute_function"
                | "sp_head::execute_trigger"
                | "sp_head::execute_aggregate_function"
        ) {
            routine_entries += 1;
        }
        if e.engine.is_none() {
            e.engine = engine_of(name).map(str::to_string);
        }
        e.query_cache |= name.starts_with("Query_cache::");
        if let Some(class) = item_func_class(name) {
            if !e.item_funcs.iter().any(|c| c == class) {
                e.item_funcs.push(class.to_string());
            }
        }
    }
    e.stored_routine_depth = sp_head_execute.max(routine_entries);
    e.command = frames
        .iter()
        .position(|f| f.trim() == "mysql_execute_command")
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
    let suffix = class.strip_prefix("Item_func_")?;
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
    } else if let Some(h) = names.iter().rposition(|n| *n == "handle_fatal_signal") {
        // The trampoline unnamed (libc without symbols): the frame after the handler.
        at = h + 2;
    }
    while at < names.len() && ABORT_FRAMES.contains(&names[at]) {
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

    const SEGV_KILL: &str =
        include_str!("../../tests/fixtures/stacks/text/mariadb-10.11-sigsegv-kill.log");
    const SEGV_SLEEP: &str =
        include_str!("../../tests/fixtures/stacks/text/mariadb-10.11-sigsegv-sleep-thread.log");
    const ABRT_PROCEDURE: &str =
        include_str!("../../tests/fixtures/stacks/text/mariadb-10.11-sigabrt-procedure-thread.log");
    const SEGV_PREPARED: &str =
        include_str!("../../tests/fixtures/stacks/text/mariadb-10.11-sigsegv-prepared-thread.log");
    const SEGV_MULTILINE: &str =
        include_str!("../../tests/fixtures/stacks/text/mariadb-10.11-sigsegv-multiline-query.log");
    const GDB_TWO_THREADS: &str =
        include_str!("../../tests/fixtures/stacks/text/gdb-twothreads.txt");
    const GDB_IN_SIGNAL: &str = include_str!("../../tests/fixtures/stacks/text/gdb-insignal.txt");
    const GDB_MARIADBD: &str = include_str!("../../tests/fixtures/stacks/text/gdb-mariadbd.txt");
    const EU_STACK_MARIADBD: &str =
        include_str!("../../tests/fixtures/stacks/text/eu-stack-mariadbd.txt");
    const EU_STACK_M_MARIADBD: &str =
        include_str!("../../tests/fixtures/stacks/text/eu-stack-m-mariadbd.txt");
    const EU_STACK_AM_IN_SIGNAL: &str =
        include_str!("../../tests/fixtures/stacks/text/eu-stack-am-insignal.txt");
    const EU_STACK_VB_TWO_THREADS: &str =
        include_str!("../../tests/fixtures/stacks/text/eu-stack-vb-twothreads.txt");

    fn clean_names(thread: &TextThread) -> Vec<String> {
        thread
            .frames
            .iter()
            .map(|f| f.clean_function().unwrap_or_else(|| "??".to_string()))
            .collect()
    }

    fn elements(thread: &TextThread) -> (Elements, Option<String>) {
        let names = clean_names(thread);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let site = crash_site(&names).map(|i| names[i].to_string());
        (identify(&names), site)
    }

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
    fn crlf_line_endings_parse_the_same() {
        for text in [SEGV_SLEEP, GDB_MARIADBD, EU_STACK_VB_TWO_THREADS] {
            let crlf = text.replace('\n', "\r\n");
            assert_eq!(parse(&crlf, "x").unwrap(), parse(text, "x").unwrap());
        }
        let p = parse(&SEGV_MULTILINE.replace('\n', "\r\n"), "x").unwrap();
        assert!(!p.crash.query.unwrap().contains('\r'));
    }

    #[test]
    fn journal_prefixes_are_ignored() {
        let journal: String = SEGV_SLEEP
            .lines()
            .map(|l| format!("Nov 24 12:52:25 db1 mariadbd[14231]: {l}\n"))
            .collect();
        assert_eq!(
            parse(&journal, "-").unwrap(),
            parse(SEGV_SLEEP, "-").unwrap()
        );
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

    #[test]
    fn gdb_two_threads_with_inlined_frames() {
        let p = parse(GDB_TWO_THREADS, "bt.txt").unwrap();
        assert_eq!(p.crash.format, "gdb");
        assert_eq!(p.crash.signal, None);
        let ids: Vec<(&str, Option<u32>, Option<&str>, usize)> = p
            .threads
            .iter()
            .map(|t| (t.label.as_str(), t.tid, t.name.as_deref(), t.frames.len()))
            .collect();
        assert_eq!(
            ids,
            vec![
                ("2", Some(18502), Some("twothreads"), 11),
                ("1", Some(18500), Some("twothreads"), 4)
            ]
        );
        let t = &p.threads[0].frames;
        // Inlined at the innermost pc: gdb prints no address.
        assert_eq!(
            t[0].function.as_deref(),
            Some("__futex_abstimed_wait_common64")
        );
        assert_eq!(t[0].source.as_deref(), Some("./nptl/futex-internal.c:57"));
        assert_eq!((t[0].addr, t[0].is_return_address), (None, false));
        assert_eq!(
            t[2].function.as_deref(),
            Some("__GI___futex_abstimed_wait_cancelable64")
        );
        assert_eq!(
            (t[2].addr, t[2].is_return_address),
            (Some(0x7feab2a33f7b), true)
        );
        assert_eq!(t[5].function.as_deref(), Some("wait_forever"));
        assert_eq!(t[5].source.as_deref(), Some("twothreads.c:11"));
        assert_eq!(t[10].function.as_deref(), Some("clone3"));
        let main = &p.threads[1].frames;
        assert_eq!(main[0].function.as_deref(), Some("__GI___clock_nanosleep"));
        assert_eq!(
            (main[0].addr, main[0].is_return_address),
            (Some(0x7feab2a7d545), false)
        );
        assert_eq!(main[3].function.as_deref(), Some("main"));
        assert!(main[3].is_return_address);
    }

    #[test]
    fn gdb_signal_handler_frame() {
        let p = parse(GDB_IN_SIGNAL, "bt.txt").unwrap();
        let main = &p.threads[1];
        assert_eq!((main.label.as_str(), main.tid), ("1", Some(18958)));
        let f = &main.frames;
        assert_eq!(f[1].function.as_deref(), Some("on_usr1"));
        assert!(f[1].is_return_address);
        assert_eq!(f[2].function.as_deref(), Some("<signal handler called>"));
        assert_eq!(f[2].addr, None);
        assert_eq!(f[3].addr, Some(0x7fa71c610545));
        assert!(
            !f[3].is_return_address,
            "interrupted by the signal: exact pc"
        );
        assert!(f[4].is_return_address);
        let (e, site) = elements(main);
        assert!(e.signal_handler);
        assert_eq!(site.as_deref(), Some("__clock_nanosleep"));
        assert_eq!(
            summary_line(&e, &p.crash, site.as_deref()),
            "in __clock_nanosleep, in a signal handler"
        );
    }

    #[test]
    fn gdb_against_mariadbd_without_debug_info() {
        let p = parse(GDB_MARIADBD, "bt.txt").unwrap();
        assert_eq!(p.crash.format, "gdb");
        assert_eq!(p.threads.len(), 14);
        let sleeping = &p.threads[0];
        assert_eq!(
            (
                sleeping.label.as_str(),
                sleeping.tid,
                sleeping.name.as_deref()
            ),
            ("14", Some(18724), Some("mariadbd"))
        );
        assert_eq!(sleeping.frames.len(), 25);
        let f = &sleeping.frames;
        assert_eq!(
            (f[6].function.as_deref(), f[6].addr),
            (None, Some(0x557a0bf7467e))
        );
        assert_eq!(f[7].function.as_deref(), Some("Item_func_sleep::val_int()"));
        assert_eq!(
            f[13].function.as_deref(),
            Some(
                "mysql_select(THD*, TABLE_LIST*, List<Item>&, Item*, unsigned int, st_order*, \
                 st_order*, Item*, st_order*, unsigned long long, select_result*, \
                 st_select_lex_unit*, st_select_lex*)"
            )
        );
        let (e, _) = elements(sleeping);
        assert_eq!(e.item_funcs, vec!["Item_func_sleep"]);
        assert_eq!(e.command.as_deref(), Some("handle_select"));
        // liburing has no symbols for its first frame; libstdc++ none at all.
        let uring = p.threads.iter().find(|t| t.tid == Some(18713)).unwrap();
        assert_eq!(
            uring.frames[0],
            TextFrame {
                addr: Some(0x7fabbca339f7),
                module: Some("/lib/x86_64-linux-gnu/liburing.so.2".into()),
                ..TextFrame::default()
            }
        );
        assert_eq!(
            uring.frames[1].function.as_deref(),
            Some("__io_uring_get_cqe")
        );
        assert!(uring.frames[1].is_return_address);
        let main = p.threads.last().unwrap();
        assert_eq!((main.label.as_str(), main.tid), ("1", Some(18709)));
        assert_eq!(main.frames[0].function.as_deref(), Some("__GI___poll"));
    }

    #[test]
    fn pstack_is_gdb_frames_without_the_preamble() {
        let pstack: String = GDB_TWO_THREADS
            .lines()
            .filter(|l| l.starts_with("Thread ") || l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        let p = parse(&pstack, "pstack.txt").unwrap();
        assert_eq!(p.crash.format, "pstack");
        assert_eq!(p.threads, parse(GDB_TWO_THREADS, "x").unwrap().threads);
    }

    #[test]
    fn plain_bt_without_thread_headers() {
        let text = "#0  0x00007f0000001000 in poll () from /lib/x86_64-linux-gnu/libc.so.6\n\
                    #1  0x0000555500002000 in main ()\n\
                    #0  foo (x=1) at f.c:3\n\
                    #1  0x0000555500003000 in bar (s=0x1 \"a(b\") at f.c:9\n";
        let p = parse(text, "bt").unwrap();
        assert_eq!(p.threads.len(), 2);
        assert_eq!((p.threads[0].label.as_str(), p.threads[0].tid), ("1", None));
        assert_eq!(p.threads[1].label, "2");
        assert_eq!(
            p.threads[0].frames[0].module.as_deref(),
            Some("/lib/x86_64-linux-gnu/libc.so.6")
        );
        let inlined = &p.threads[1].frames[0];
        assert_eq!(
            (
                inlined.function.as_deref(),
                inlined.source.as_deref(),
                inlined.addr
            ),
            (Some("foo"), Some("f.c:3"), None)
        );
        assert_eq!(p.threads[1].frames[1].function.as_deref(), Some("bar"));
    }

    #[test]
    fn gdb_arguments_are_dropped_not_cpp_parentheses() {
        for (gdb, name) in [
            (
                "std::thread::_State_impl<std::thread::_Invoker<std::tuple<void (*)(int), int> > >::_M_run() ()",
                "std::thread::_State_impl<std::thread::_Invoker<std::tuple<void (*)(int), int> > >::_M_run()",
            ),
            ("Foo::operator() (this=0x7f0000001000)", "Foo::operator()"),
            ("Foo::operator()() const ()", "Foo::operator()() const"),
            ("(anonymous namespace)::foo (x=1)", "(anonymous namespace)::foo"),
            ("(anonymous namespace)::foo(int) ()", "(anonymous namespace)::foo(int)"),
            ("foo (s=0x1 \"a(b\", t=0x2 \"c)\")", "foo"),
            ("?? ()", "??"),
            ("main", "main"),
        ] {
            assert_eq!(strip_gdb_arguments(gdb), name, "{gdb}");
        }
    }

    #[test]
    fn function_names_are_cleaned() {
        for (raw, clean) in [
            (
                "_ZN15Item_func_sleep7val_intEv",
                Some("Item_func_sleep::val_int"),
            ),
            (
                "_ZN7sp_head17execute_procedureEP3THDP4ListI4ItemE",
                Some("sp_head::execute_procedure"),
            ),
            ("pthread_cond_wait@@GLIBC_2.3.2", Some("pthread_cond_wait")),
            ("clock_nanosleep@GLIBC_2.2.5", Some("clock_nanosleep")),
            (
                "my_print_stacktrace(unsigned char const*, unsigned long)",
                Some("my_print_stacktrace"),
            ),
            (
                "Type_handler::Item_send_long(Item*, Protocol*, st_value*) const",
                Some("Type_handler::Item_send_long"),
            ),
            ("__GI___poll", Some("__poll")),
            ("<signal handler called>", Some("<signal handler called>")),
            ("??", None),
            ("", None),
        ] {
            assert_eq!(clean_function(raw).as_deref(), clean, "{raw}");
        }
    }

    #[test]
    fn eu_stack_of_mariadbd() {
        let p = parse(EU_STACK_MARIADBD, "eu-stack.txt").unwrap();
        assert_eq!(p.crash.format, "eu-stack");
        assert_eq!(p.threads.len(), 14);
        let main = &p.threads[0];
        assert_eq!((main.label.as_str(), main.tid), ("18709", Some(18709)));
        assert_eq!(
            main.frames[0],
            TextFrame {
                function: Some("__poll".into()),
                addr: Some(0x7fabbc11a26f),
                ..TextFrame::default()
            }
        );
        assert_eq!(
            main.frames[1].function.as_deref(),
            Some("handle_connections_sockets()")
        );
        assert!(main.frames[1].is_return_address);
        let t = &p.threads[1];
        assert_eq!(t.tid, Some(18711));
        assert_eq!(
            (t.frames[2].function.as_deref(), t.frames[2].addr),
            (None, Some(0x557a0c385f8d))
        );
        let sleeping = p.threads.iter().find(|t| t.tid == Some(18724)).unwrap();
        let (e, _) = elements(sleeping);
        assert_eq!(e.item_funcs, vec!["Item_func_sleep"]);
    }

    #[test]
    fn eu_stack_with_modules() {
        let p = parse(EU_STACK_M_MARIADBD, "eu-stack.txt").unwrap();
        assert_eq!(p.threads.len(), 14);
        let main = &p.threads[0].frames;
        assert_eq!(main[0].function.as_deref(), Some("__poll"));
        assert_eq!(
            main[0].module.as_deref(),
            Some("/usr/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert_eq!(
            main[2].function.as_deref(),
            Some("mysqld_main(int, char**)")
        );
        assert_eq!(main[2].module.as_deref(), Some("/usr/sbin/mariadbd"));
        let unnamed = &p.threads[1].frames[2];
        assert_eq!(
            (
                unnamed.function.as_deref(),
                unnamed.module.as_deref(),
                unnamed.addr
            ),
            (None, Some("/usr/sbin/mariadbd"), Some(0x557a0c385f8d))
        );
    }

    #[test]
    fn eu_stack_activation_marks_and_signal_frame() {
        let p = parse(EU_STACK_AM_IN_SIGNAL, "eu-stack.txt").unwrap();
        let f = &p.threads[0].frames;
        let marks: Vec<(&str, bool)> = f
            .iter()
            .map(|f| (f.function.as_deref().unwrap(), f.is_return_address))
            .collect();
        assert_eq!(
            marks,
            vec![
                ("pause", false),
                ("on_usr1", true),
                ("__restore_rt", false),
                ("clock_nanosleep@GLIBC_2.2.5", false),
                ("__nanosleep", true),
                ("sleep", true),
                ("main", true),
                ("__libc_start_call_main", true),
                ("__libc_start_main@@GLIBC_2.34", true),
                ("_start", true),
            ]
        );
        assert_eq!(f[1].module.as_deref(), Some("/tmp/cprog/insignal"));
        // Without `-a` the same verdicts follow from the frame order and the trampoline's name.
        let plain = EU_STACK_AM_IN_SIGNAL
            .replace(" - 1 ", " ")
            .replace("     ", " ");
        let q = parse(&plain, "eu-stack.txt").unwrap();
        assert_eq!(q.threads, p.threads);
    }

    #[test]
    fn eu_stack_build_ids_sources_and_inlines() {
        let p = parse(EU_STACK_VB_TWO_THREADS, "eu-stack.txt").unwrap();
        assert_eq!(p.threads.len(), 2);
        let f = &p.threads[0].frames[1];
        assert_eq!(
            *f,
            TextFrame {
                function: Some("__GI___nanosleep".into()),
                module: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
                module_offset: Some(0xd3e53),
                addr: Some(0x7f9af9848e53),
                is_return_address: true,
                source: Some("../sysdeps/unix/sysv/linux/nanosleep.c:25:13".into()),
                build_id: Some("93ac61ec5a8eb1396f9fbd350e3169a558528a40".into()),
                ..TextFrame::default()
            }
        );
        let main = &p.threads[0].frames[3];
        assert_eq!(
            (main.function.as_deref(), main.module_offset),
            (Some("main"), Some(0x125c))
        );
        let worker = &p.threads[1];
        assert_eq!(worker.tid, Some(19459));
        // An inlined frame shares the innermost pc: exact too.
        assert_eq!(worker.frames[0].addr, worker.frames[1].addr);
        assert!(!worker.frames[0].is_return_address && !worker.frames[1].is_return_address);
        assert!(worker.frames[2].is_return_address);
    }

    #[test]
    fn bare_address_lists() {
        let p = parse("0x55d5f3a2c1af\n  [0x7f1e5e842520]\r\n0x10\n", "addrs").unwrap();
        assert_eq!(p.crash.format, "addresses");
        let frames: Vec<(Option<u64>, bool)> = p.threads[0]
            .frames
            .iter()
            .map(|f| (f.addr, f.is_return_address))
            .collect();
        assert_eq!(
            frames,
            vec![
                (Some(0x55d5f3a2c1af), false),
                (Some(0x7f1e5e842520), true),
                (Some(0x10), true)
            ]
        );
    }

    #[test]
    fn text_without_a_stack_is_an_error_of_one_line() {
        for text in [
            "",
            "hello\nworld\n",
            "2026-11-24 12:51:38 0 [Note] InnoDB: Completed\n",
        ] {
            let err = parse(text, "notes.txt").unwrap_err().to_string();
            assert!(
                err.starts_with("no stack found in notes.txt: expected"),
                "{err}"
            );
            assert!(!err.contains('\n'));
        }
        let err = parse(
            "261124 12:51:39 [ERROR] mariadbd got signal 11 ;\nFatal signal 11 while backtracing\n",
            "error.log",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("no stack found in error.log: the crash report has no backtrace"));
        assert!(!err.contains('\n'));
    }

    #[test]
    fn two_hundred_gdb_threads_parse_fast() {
        let mut text = String::new();
        for t in (1..=200u32).rev() {
            text.push_str(&format!(
                "\nThread {t} (Thread 0x7f00{t:08x} (LWP {}) \"mariadbd\"):\n",
                10_000 + t
            ));
            for f in 0..30u64 {
                text.push_str(&format!(
                    "#{f:<2} 0x0000557a0bf7{:04x} in Item_func_sleep::val_int (this=0x7f0000{f:04x}) at ./sql/item_func.cc:{}\n",
                    f * 16,
                    4000 + f
                ));
            }
        }
        let start = std::time::Instant::now();
        let p = parse(&text, "bt").unwrap();
        let elapsed = start.elapsed();
        assert_eq!(p.threads.len(), 200);
        assert_eq!(p.threads[0].tid, Some(10_200));
        assert!(p.threads.iter().all(|t| t.frames.len() == 30));
        assert!(elapsed.as_millis() < 500, "{elapsed:?}");
    }

    fn ids(frames: &[&str]) -> Elements {
        identify(frames)
    }

    #[test]
    fn nested_routines_in_a_prepared_statement() {
        // EXECUTE s, s = CALL p(), p calls q, q runs SELECT SLEEP(): MariaDB's own frame names.
        let frames = [
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
            "mysql_execute_command",
            "sp_instr_stmt::exec_core",
            "sp_lex_keeper::reset_lex_and_exec_core",
            "sp_instr_stmt::execute",
            "sp_head::execute",
            "sp_head::execute_procedure",
            "Sql_cmd_call::execute",
            "mysql_execute_command",
            "sp_instr_stmt::exec_core",
            "sp_lex_keeper::reset_lex_and_exec_core",
            "sp_instr_stmt::execute",
            "sp_head::execute",
            "sp_head::execute_procedure",
            "Sql_cmd_call::execute",
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
        ];
        let e = ids(&frames);
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
        let e = ids(&[
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
            assert_eq!(ids(frames).engine.as_deref(), engine, "{frames:?}");
        }
    }

    #[test]
    fn query_cache_item_funcs_and_signal_frames() {
        let e = ids(&[
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
        assert!(ids(&["foo", "<signal handler called>", "bar"]).signal_handler);
        assert!(!ids(&["foo", "bar"]).signal_handler);
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
