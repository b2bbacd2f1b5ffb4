//! The text formats in the order they are tried, and [`parse`], which tries them.

use anyhow::{bail, Result};

use super::{addresses, clean_line, crash_log, eu_stack, gdb, CrashInfo, Format, ParsedText};

/// Tried in this order, the first that finds a stack wins: a crash report's own backtrace over gdb or
/// eu-stack text pasted with it, and bare addresses, which the others' lines may also be, last.
const FORMATS: &[&dyn Format] = &[
    &crash_log::CrashLog,
    &gdb::Gdb,
    &eu_stack::EuStack,
    &addresses::Addresses,
];

/// Parses pasted stack text. An error log may hold several crashes: the LAST crash section is taken (the
/// one nearest the end of the text, up to the next server start). Crash facts are read even when the stack
/// comes from gdb or eu-stack text pasted along with the log. `name` names the text in messages (a file
/// name, or `-` for standard input).
///
/// Errors when the text holds no stack, with one line telling what was expected.
pub fn parse(text: &str, name: &str) -> Result<ParsedText> {
    let lines: Vec<&str> = text.lines().map(clean_line).collect();
    let crash = crash_log::facts(&lines);
    if let Some(found) = FORMATS.iter().find_map(|f| f.parse(&lines)) {
        return Ok(ParsedText {
            threads: found.threads,
            crash: CrashInfo {
                format: found.format,
                ..crash
            },
        });
    }
    // Only a crash report's `got signal` (or `got exception`) line gives a signal: its backtrace is missing.
    if crash.signal.is_some() {
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
