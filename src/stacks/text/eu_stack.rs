//! eu-stack's threads (`TID 1234:` headers; `-a`, `-m`, `-b`, `-s`, `-i` output too).

use super::{
    mark_unwound_return_addresses, named, numbered_frame, parse_hex, Format, Found, TextFrame,
    TextThread,
};

pub(super) struct EuStack;

impl Format for EuStack {
    fn parse(&self, lines: &[&str]) -> Option<Found> {
        // Each thread with `-a`'s verdict on each of its frames.
        let mut threads: Vec<(TextThread, Vec<Option<bool>>)> = Vec::new();
        for line in lines {
            if let Some(tid) = line
                .strip_prefix("TID ")
                .and_then(|r| r.trim_end().strip_suffix(':'))
            {
                if let Ok(tid) = tid.parse::<u32>() {
                    let thread = TextThread {
                        tid: Some(tid),
                        label: tid.to_string(),
                        ..TextThread::default()
                    };
                    threads.push((thread, Vec::new()));
                    continue;
                }
            }
            if let Some((_, body)) = numbered_frame(line) {
                if let Some((frame, exact)) = eu_stack_frame(body) {
                    if threads.is_empty() {
                        threads.push((TextThread::nth(1, Vec::new()), Vec::new()));
                    }
                    if let Some((thread, marks)) = threads.last_mut() {
                        thread.frames.push(frame);
                        marks.push(exact);
                    }
                }
                continue;
            }
            // `-b` and `-s` add an indented line under the frame.
            if line.starts_with("    ") {
                if let Some(frame) = threads.last_mut().and_then(|(t, _)| t.frames.last_mut()) {
                    eu_stack_detail(line.trim(), frame);
                }
            }
        }
        let threads: Vec<TextThread> = threads
            .into_iter()
            .filter(|(thread, _)| !thread.frames.is_empty())
            .map(|(mut thread, marks)| {
                // `-a` marks every frame, exact ones with padding where the others have ` - 1`.
                let exact: Option<Vec<bool>> = marks.into_iter().collect();
                mark_unwound_return_addresses(&mut thread.frames, exact.as_deref());
                thread
            })
            .collect();
        (!threads.is_empty()).then_some(Found {
            threads,
            format: "eu-stack",
        })
    }
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
    let mut frame = TextFrame::at(addr);
    let (function, module) = if let Some(module) = rest.strip_prefix("- ") {
        ("", Some(module))
    } else {
        match rest.rsplit_once(" - ") {
            Some((f, m)) if !m.contains(' ') => (f, Some(m)),
            _ => (rest, None),
        }
    };
    frame.function = named(function.trim());
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

#[cfg(test)]
mod tests {
    use crate::stacks::text::{parse, test_support::*, TextFrame};

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
}
