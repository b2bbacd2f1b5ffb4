//! Loading a collector's BPF object into the kernel, whose verifier checks every program. What the verifier said
//! of a program it refused goes to a file that one line names, never to the terminal; what it needed for each
//! program it accepted is read back (`verified_insns`, Linux 5.16): `myprobe programs` prints it, and `make test`
//! holds every program under half the verifier's limit, since what a program needs changes from one kernel release
//! to the next.

use std::{cell::RefCell, fmt, io::Write, os::fd::AsFd, path::PathBuf, sync::mpsc::Sender};

use anyhow::{Context, Result};
use libbpf_rs::{
    libbpf_sys as sys,
    skel::{OpenSkel, Skel},
    PrintLevel,
};

/// The instructions the verifier processes at most for one program (BPF_COMPLEXITY_LIMIT_INSNS) before it refuses
/// it as too large.
pub const VERIFIER_LIMIT: u32 = 1_000_000;

/// What the verifier needed to check one program it accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub program: String,
    /// Instructions processed, paths and loop iterations counted each time (`verified_insns`; 0 where the
    /// kernel does not say).
    pub insns: u32,
}

/// A program the kernel's verifier refused: `collector` is missing from what is traced.
#[derive(Debug)]
pub struct Refused {
    pub collector: String,
    pub program: Option<String>,
    /// The verifier's last word on it (`BPF program is too large. Processed 1000001 insn`).
    pub reason: String,
    /// The whole log, where it could be kept.
    pub log: Option<PathBuf>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the kernel's verifier refused {}'s programs",
            self.collector
        )?;
        if let Some(p) = &self.program {
            write!(f, " ({p})")?;
        }
        write!(f, ": {}", self.reason)?;
        match &self.log {
            Some(path) => write!(f, " (the verifier's log: {})", path.display()),
            None => write!(f, " (its log could not be kept)"),
        }
    }
}

impl std::error::Error for Refused {}

thread_local! {
    /// libbpf's messages while this thread loads an object: libbpf has one print callback for the process, and
    /// the collectors of `report` and the agent load theirs from threads of their own.
    static CAPTURED: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// libbpf's messages: kept while the thread loads an object, else on stderr as libbpf prints them by default (its
/// debug messages, asked for only to read the verifier's statistics, not at all).
fn print(level: PrintLevel, message: String) {
    let kept = CAPTURED.with(|c| match c.borrow_mut().as_mut() {
        Some(log) => {
            log.push_str(&message);
            true
        }
        None => false,
    });
    if !kept && level != PrintLevel::Debug {
        say_part!("{message}");
    }
}

/// Routes libbpf's messages through [`print`]; once for the process.
pub fn install_print() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        libbpf_rs::set_print(Some((PrintLevel::Info, print)));
    });
}

/// Loads `open`, the object of `collector` (as commands name it: `profile alloc`); with `verified`, tells it what
/// the verifier needed for each program. A program refused is a [`Refused`] error.
pub fn load<'o, O: OpenSkel<'o>>(
    mut open: O,
    collector: &str,
    verified: Option<&Sender<Verified>>,
) -> Result<O::Output> {
    if verified.is_some() {
        // Kernels before 5.16 do not count verified_insns: the verifier's statistics say it (BPF_LOG_STATS), which
        // libbpf passes on as a debug message.
        libbpf_rs::set_print(Some((PrintLevel::Debug, print)));
        for mut prog in open.open_object_mut().progs_mut() {
            prog.set_log_level(LOG_STATS);
        }
    }
    let (skel, messages) = loading(collector, || open.load())?;
    if let Some(to) = verified {
        for prog in skel.object().progs().filter(|p| p.autoload()) {
            let program = prog.name().to_string_lossy().into_owned();
            let insns = match verified_insns(prog.as_fd()) {
                0 => processed_insns(&messages, &program).unwrap_or(0),
                n => n,
            };
            let _ = to.send(Verified { program, insns });
        }
    }
    Ok(skel)
}

/// BPF_LOG_STATS: the verifier's log holds only its statistics.
const LOG_STATS: u32 = 4;

/// The instructions the verifier processed for `program`, from its statistics in libbpf's messages.
fn processed_insns(messages: &str, program: &str) -> Option<u32> {
    let log =
        &messages[messages.find(&format!("prog '{program}': -- BEGIN PROG LOAD LOG --"))?..];
    let log = &log[..log.find("-- END PROG LOAD LOG --")?];
    let line = log
        .lines()
        .find_map(|l| l.trim().strip_prefix("processed "))?;
    line.split_whitespace().next()?.parse().ok()
}

/// Runs `load`, which loads an object of `collector`, with libbpf's messages kept rather than printed, and returns
/// what it loaded with those messages: a program refused is a [`Refused`] error, the verifier's log in a file it
/// names; another failure says libbpf's last word.
pub fn loading<T>(
    collector: &str,
    load: impl FnOnce() -> libbpf_rs::Result<T>,
) -> Result<(T, String)> {
    install_print();
    CAPTURED.with(|c| *c.borrow_mut() = Some(String::new()));
    let loaded = load();
    let messages = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    match loaded {
        Ok(t) => Ok((t, messages)),
        Err(e) => Err(refusal(collector, &messages, e)),
    }
}

/// What the verifier processed to accept the program of `fd`; 0 where the kernel does not count it (before 5.16).
fn verified_insns(fd: std::os::fd::BorrowedFd<'_>) -> u32 {
    let mut info = sys::bpf_prog_info::default();
    let mut len = std::mem::size_of::<sys::bpf_prog_info>() as u32;
    // SAFETY: info is a bpf_prog_info of len bytes, which the kernel fills up to what it knows.
    let rc = unsafe {
        sys::bpf_prog_get_info_by_fd(std::os::fd::AsRawFd::as_raw_fd(&fd), &mut info, &mut len)
    };
    if rc == 0 {
        info.verified_insns
    } else {
        0
    }
}

/// The error of a load that failed: the verifier's refusal when libbpf's messages hold its log (kept in a file),
/// else the failure with libbpf's last words.
fn refusal(collector: &str, messages: &str, e: libbpf_rs::Error) -> anyhow::Error {
    let Some(reason) = verifier_reason(messages) else {
        let last = messages.lines().rev().find(|l| !l.trim().is_empty());
        let e = anyhow::Error::new(e);
        let e = match last {
            Some(line) => e.context(line.trim().trim_start_matches("libbpf: ").to_string()),
            None => e,
        };
        return e.context(format!("loading {collector}'s programs into the kernel"));
    };
    let log = keep_log(collector, messages)
        .map_err(|e| say!("myprobe: warning: the verifier's log is not kept: {e:#}"))
        .ok();
    anyhow::Error::new(Refused {
        collector: collector.to_string(),
        program: refused_program(messages),
        reason,
        log,
    })
}

/// The verifier's last word in the log libbpf printed (between its `-- BEGIN PROG LOAD LOG --` and `-- END PROG
/// LOAD LOG --`), its statistics left out; `None` where there is no log.
pub fn verifier_reason(messages: &str) -> Option<String> {
    let begin = messages.find("-- BEGIN PROG LOAD LOG --")?;
    let log = &messages[begin..];
    let log = &log[log.find('\n')? + 1..log.find("-- END PROG LOAD LOG --").unwrap_or(log.len())];
    let statistics = [
        "processed ",
        "verification time",
        "stack depth",
        "mark_read",
    ];
    let reason = log
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && !statistics.iter().any(|s| l.starts_with(s)))?;
    let processed = log.lines().rev().find(|l| l.starts_with("processed "));
    Some(match processed {
        Some(p) if !reason.to_lowercase().contains("processed") => {
            format!("{reason}; {}", p.trim())
        }
        _ => reason.to_string(),
    })
}

/// The program libbpf names in its message of a failed load (`prog 'on_alloc_multi': BPF program load failed`).
pub fn refused_program(messages: &str) -> Option<String> {
    messages.lines().find_map(|l| {
        let rest = &l[l.find("prog '")? + 6..];
        let name = &rest[..rest.find('\'')?];
        rest.contains("load failed").then(|| name.to_string())
    })
}

/// Writes the messages of a failed load to a new file of their own (the temporary directory, readable by its
/// owner only), named after the collector.
fn keep_log(collector: &str, messages: &str) -> Result<PathBuf> {
    let name: String = collector
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let (mut file, path) = tempfile::Builder::new()
        .prefix(&format!("myprobe-verifier-{name}-"))
        .suffix(".log")
        .tempfile()
        .context("creating a file in the temporary directory")?
        .keep()
        .context("keeping the log file")?;
    file.write_all(messages.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const E2BIG: &str = "libbpf: prog 'on_alloc_multi': BPF program load failed: -E2BIG\n\
        libbpf: prog 'on_alloc_multi': -- BEGIN PROG LOAD LOG --\n\
        0: R1=ctx() R10=fp0\n\
        BPF program is too large. Processed 1000001 insn\n\
        processed 1000001 insns (limit 1000000) max_states_per_insn 31 total_states 73354 peak_states 5187 mark_read 0\n\
        -- END PROG LOAD LOG --\n\
        libbpf: prog 'on_alloc_multi': failed to load: -E2BIG\n";

    #[test]
    fn a_refusal_is_named_by_its_program_and_the_verifiers_last_word() {
        assert_eq!(refused_program(E2BIG).as_deref(), Some("on_alloc_multi"));
        assert_eq!(
            verifier_reason(E2BIG).as_deref(),
            Some("BPF program is too large. Processed 1000001 insn")
        );
        let access = "libbpf: prog 'x': BPF program load failed: -EACCES\n\
            libbpf: prog 'x': -- BEGIN PROG LOAD LOG --\n\
            12: (61) r2 = *(u32 *)(r1 +0)\n\
            R1 invalid mem access 'scalar'\n\
            processed 13 insns (limit 1000000) max_states_per_insn 0 total_states 1 peak_states 1 mark_read 1\n\
            -- END PROG LOAD LOG --\n";
        assert_eq!(
            verifier_reason(access).as_deref(),
            Some(
                "R1 invalid mem access 'scalar'; processed 13 insns (limit 1000000) max_states_per_insn 0 \
                 total_states 1 peak_states 1 mark_read 1"
            )
        );
        assert_eq!(
            verifier_reason("libbpf: map 'x': failed to create: -ENOMEM\n"),
            None
        );
    }
    #[test]
    fn the_statistics_of_each_program_are_read_from_its_own_log() {
        let messages =
            "libbpf: prog 'a': -- BEGIN PROG LOAD LOG --\nprocessed 12 insns (limit 1000000)\n\
            -- END PROG LOAD LOG --\nlibbpf: prog 'ab': -- BEGIN PROG LOAD LOG --\n\
            processed 345 insns (limit 1000000) max_states_per_insn 1\n-- END PROG LOAD LOG --\n";
        assert_eq!(processed_insns(messages, "a"), Some(12));
        assert_eq!(processed_insns(messages, "ab"), Some(345));
        assert_eq!(processed_insns(messages, "b"), None);
    }
}
