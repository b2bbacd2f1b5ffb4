//! gdb's `bt` and `thread apply all bt`, and pstack (gdb's frames without its preamble).

use super::{
    after, is_source_location, leading_number, mark_unwound_return_addresses, named,
    numbered_frame, parse_hex, Format, Found, TextFrame, TextThread, SIGNAL_HANDLER_CALLED,
};
use crate::symbolize::clean::matching_open_paren;

pub(super) struct Gdb;

impl Format for Gdb {
    /// The threads, as "gdb" or "pstack": pstack is named when every line is a thread header or a frame,
    /// as gstack's filter leaves it.
    fn parse(&self, lines: &[&str]) -> Option<Found> {
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
                .get_or_insert_with(|| TextThread::nth(threads.len() + 1, Vec::new()))
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
        Some(Found {
            threads,
            format: if only_headers_and_frames {
                "pstack"
            } else {
                "gdb"
            },
        })
    }
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

/// `Thread 3 (Thread 0x7f... (LWP 1234) "mariadbd"):`, `Thread 1 (process 1234):` → (number, tid, name).
fn gdb_thread_header(line: &str) -> Option<(String, Option<u32>, Option<String>)> {
    let rest = line.strip_prefix("Thread ")?;
    let (number, rest) = rest.split_once(' ')?;
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let rest = rest.trim_end().strip_prefix('(')?.strip_suffix("):")?;
    let id_after = |key: &str| after(rest, key).and_then(leading_number::<u32>);
    let tid = id_after("(LWP ")
        .or_else(|| id_after("LWP "))
        .or_else(|| id_after("process "));
    let name = rest
        .strip_suffix('"')
        .and_then(|r| r.rfind('"').map(|q| r[q + 1..].to_string()));
    Some((number.to_string(), tid, name))
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
        let (addr, tail) = rest.split_once(' ')?;
        frame.addr = Some(parse_hex(addr)?);
        rest = tail.strip_prefix("in ")?;
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
    frame.function = named(function);
    Some(frame)
}

#[cfg(test)]
mod tests {
    use super::strip_gdb_arguments;
    use crate::stacks::text::{parse, summary_line, test_support::*, TextFrame};

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
}
