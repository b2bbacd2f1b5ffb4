//! Stacks as users paste them (`myprobe stacks --resolve`): the crash section of a MariaDB/MySQL error log,
//! gdb's `thread apply all bt`, pstack, eu-stack, or a bare list of addresses. Parsed into threads of frames
//! (addresses, modules, offsets and names as the text gives them) and a crash's own facts (signal, assertion,
//! statement); and named by the elements that identify a crash (signal handler, stored routine depth,
//! prepared statement, engine, `Item_func_*` classes). Pure functions of the text: resolving addresses
//! against binaries and rendering are the caller's.
//!
//! One file per text format, each a `Format`; the helpers they share are here, the order they are tried in
//! formats.rs.

mod addresses;
mod crash_log;
mod elements;
mod eu_stack;
mod formats;
mod gdb;
#[cfg(test)]
mod test_support;

use std::str::FromStr;

use serde::Serialize;

use crate::symbolize::clean_name;

pub use elements::{crash_site, identify, summary_line, Elements};
pub use formats::parse;
pub use gdb::strip_gdb_arguments;

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

    /// A frame known so far by its address alone.
    fn at(addr: u64) -> Self {
        TextFrame {
            addr: Some(addr),
            ..TextFrame::default()
        }
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

impl TextThread {
    /// A thread the text gives no header for: labelled by its order of appearance, `n` from 1.
    fn nth(n: usize, frames: Vec<TextFrame>) -> Self {
        TextThread {
            label: n.to_string(),
            frames,
            ..TextThread::default()
        }
    }
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
    /// The program that crashed, as the `got signal` line names it (`mysqld`, `mariadbd`).
    pub program: Option<String>,
    /// MySQL's `BuildID[sha1]=...`: the build-id of the server binary that crashed.
    pub build_id: Option<String>,
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

/// One text format.
trait Format {
    /// The threads, innermost frame first, when `lines` (see [`clean_line`]) hold a stack in this format;
    /// None when they hold none.
    fn parse(&self, lines: &[&str]) -> Option<Found>;
}

/// What a format found in the text.
struct Found {
    threads: Vec<TextThread>,
    /// As [`CrashInfo::format`] names it: one format may tell variants apart (gdb and pstack).
    format: &'static str,
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

/// `pthread_cond_wait@@GLIBC_2.3.2` → `pthread_cond_wait` (eu-stack prints versioned dynamic symbols).
pub(crate) fn strip_symbol_version(s: &str) -> &str {
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

/// The decimal number `s` starts with (`11 ;` → 11); None when it starts with no digit.
fn leading_number<T: FromStr>(s: &str) -> Option<T> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s[..end].parse().ok()
}

/// What follows the first `key` in `line`.
fn after<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.find(key).map(|i| &line[i + key.len()..])
}

/// A function name as the text writes it; None for an empty one and for `??`, the unknown name's mark.
fn named(function: &str) -> Option<String> {
    Some(function)
        .filter(|f| !f.is_empty() && *f != "??")
        .map(str::to_string)
}

/// `file.cc:123`, `??:0`: a source location as addr2line and gdb print it.
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

/// `#12 ...` (gdb's and eu-stack's frames) → (12, the rest).
fn numbered_frame(line: &str) -> Option<(usize, &str)> {
    let rest = line.trim_start().strip_prefix('#')?;
    let number = leading_number(rest)?;
    let body = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    if !body.starts_with(' ') {
        return None;
    }
    Some((number, body.trim()))
}

fn is_signal_trampoline(function: Option<&str>) -> bool {
    function.is_some_and(|f| {
        f == SIGNAL_HANDLER_CALLED || f.contains("__restore_rt") || f.contains("sigreturn")
    })
}

/// For unwinders' listings (gdb, eu-stack, bare addresses): the innermost frame's address is the pc; so is
/// the signal trampoline's and the interrupted frame's after it; a frame at the address of the one before
/// it is an inlined function of it. Every other address is a return address. `exact_marks`: eu-stack
/// `-a`'s own verdict per frame, which wins.
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

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

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
}
