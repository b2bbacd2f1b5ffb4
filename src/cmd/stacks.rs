//! `myprobe stacks`: what every thread of the server is doing right now, read from BPF without stopping it.

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::{
    client::ConnectArgs,
    collect::{threads, unwind_store::UnwindStore, CollectOptions},
    process, stacks,
};

#[derive(Args)]
pub struct StacksArgs {
    #[command(flatten)]
    pub target: crate::cmd::TargetArgs,
    /// Read the threads of a core file (the kernel's or gdb's gcore) instead of a running process
    #[arg(long, value_name = "FILE", conflicts_with_all = ["pid", "kernel", "frame_pointers", "btf"])]
    pub core: Option<PathBuf>,
    /// Read stack text instead (`-` for stdin): a server's crash report (its error log), gdb `thread apply all
    /// bt`, eu-stack or pstack output; raw addresses are resolved, names cleaned, the crash summarized
    #[arg(long, value_name = "FILE", conflicts_with_all = ["pid", "core", "kernel", "frame_pointers", "btf"])]
    pub resolve: Option<PathBuf>,
    /// The server binary of a core or a crash report, when not at the path it names (a core checks it by
    /// build-id)
    #[arg(long, value_name = "PATH")]
    pub exe: Option<PathBuf>,
    /// The filesystem the server of a core or a crash report ran in, where the files they name are: a
    /// container's (its image unpacked, or /proc/PID/root of a container of the same image)
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// List each thread on its own instead of merging identical stacks
    #[arg(long)]
    pub threads: bool,
    /// Also the kernel stacks
    #[arg(long)]
    pub kernel: bool,
    /// Write to FILE instead: folded stacks (`.folded`, `.txt`: one line per distinct stack with its thread
    /// count) or JSON (`.json`: every thread)
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Never connect to the server: its connections' statements are read from its memory instead
    #[arg(long)]
    pub no_sql: bool,
    /// Walk stacks by frame pointers only, without loading the process's .eh_frame tables into the kernel
    #[arg(long)]
    pub frame_pointers: bool,
    /// Of several servers running, read every one, one after the other (each under a heading, or with -o each
    /// into a file of its own, `FILE-PID.EXT`); without it, the busiest is read
    #[arg(long, conflicts_with_all = ["pid", "core", "resolve"])]
    pub all: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

pub fn run(a: StacksArgs) -> Result<()> {
    let format = output_format(&a)?;
    if let Some(file) = &a.resolve {
        return resolve_text(&a, file, format);
    }
    if let Some(core) = &a.core {
        return read_core(&a, core, format);
    }
    if a.root.is_some() {
        bail!("--root is for --core and --resolve: a running server's files are read through /proc/PID/root");
    }
    let targets = a.target.servers_to_read(a.all)?;
    if let [target] = targets.as_slice() {
        return read_running(&a, format, target, a.output.as_deref());
    }
    // A server that cannot be read (it exited meanwhile) is said; the others are read all the same.
    let mut failed = Vec::new();
    for target in &targets {
        let output = a
            .output
            .as_deref()
            .map(|o| crate::cmd::per_server(o, target.pid));
        if output.is_none() {
            println!("== {target} ==");
        }
        if let Err(e) = read_running(&a, format, target, output.as_deref()) {
            say!("myprobe: warning: {target} not read: {e:#}");
            failed.push(target.pid);
        }
    }
    if failed.len() == targets.len() {
        bail!("no server could be read");
    }
    Ok(())
}

/// The format `-o`'s extension names, text on stdout without it.
fn output_format(a: &StacksArgs) -> Result<Format> {
    let format = match a
        .output
        .as_ref()
        .and_then(|p| p.extension())
        .and_then(|e| e.to_str())
    {
        None if a.output.is_none() => Format::Text,
        Some("folded" | "txt") => Format::Folded,
        Some("json") => Format::Json,
        _ => bail!("-o: name the file .folded, .txt or .json (for folded stacks or JSON)"),
    };
    Ok(format)
}

/// `--resolve`: the threads of stack text, with the crash's summary first on text output.
fn resolve_text(a: &StacksArgs, file: &Path, format: Format) -> Result<()> {
    let (text, name) = if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading the stack text from stdin")?;
        (text, "stdin".to_string())
    } else {
        let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        // Error logs hold whatever clients sent; the stacks are ASCII.
        (
            String::from_utf8_lossy(&bytes).into_owned(),
            file.display().to_string(),
        )
    };
    let r = stacks::resolve::resolve(&text, &name, a.exe.as_deref(), a.root.as_deref())?;
    for w in &r.warnings {
        say!("myprobe: warning: {w}");
    }
    say!(
        "myprobe: {} threads of {name} ({})",
        r.threads.len(),
        r.crash.format
    );
    if format == Format::Text && !r.summary.is_empty() {
        println!("{}", crate::render::terminal_safe(&r.summary));
    }
    write_output(a, format, &r.threads, None, a.output.as_deref())
}

/// `--core`: the threads of a core file, with a line identifying the crash first on text output.
fn read_core(a: &StacksArgs, core: &Path, format: Format) -> Result<()> {
    let mut c = stacks::core::read(
        core,
        a.exe.as_deref(),
        a.root.as_deref(),
        a.target.any_process,
    )?;
    for w in &c.warnings {
        say!("myprobe: warning: {w}");
    }
    // A core's waits are named by their functions' names (not by the calls that announce them, read in a live
    // process's memory map).
    let brackets = crate::profile::waits::Brackets::new();
    let mut named = stacks::name_threads_with(
        Some(&mut c.symbolizer),
        Some(&mut c.data),
        &c.records,
        &brackets,
    );
    // Each connection's thread, by the thread pointer the connection keeps: its statement beside its stack.
    let served = (c.sessions.as_deref())
        .map(|s| stacks::link_sessions(s, &c.records, &mut named))
        .unwrap_or_default();
    say!(
        "myprobe: {} threads of the core {}: {}",
        named.len(),
        core.display(),
        c.description
    );
    // What identifies the crash, from the stack of the thread that got the signal.
    let crashed = c
        .crash
        .as_ref()
        .and_then(|(signal, tid)| Some((signal, named.iter().find(|t| t.tid == *tid)?)));
    if let (Some((signal, t)), Format::Text) = (crashed, &format) {
        let frames: Vec<&str> = t.frames.iter().map(String::as_str).collect();
        let info = stacks::text::CrashInfo {
            signal: Some(signal.clone()),
            ..Default::default()
        };
        let site = stacks::text::crash_site(&frames).and_then(|i| frames.get(i).copied());
        let elements = stacks::text::identify(&frames);
        println!(
            "{} (thread {})",
            crate::render::terminal_safe(&stacks::text::summary_line(&elements, &info, site)),
            t.tid
        );
    }
    let crashed_tid = c.crash.as_ref().map(|(_, tid)| *tid);
    let sessions = (c.sessions.as_deref())
        .map(|s| sessions_text(s, format, "the core", c.dumped_us, &served, crashed_tid));
    write_output(a, format, &named, sessions.as_deref(), a.output.as_deref())
}

/// A running server: a snapshot of its threads' stacks read from BPF, with their statements when it answers.
fn read_running(
    a: &StacksArgs,
    format: Format,
    target: &process::Target,
    output: Option<&Path>,
) -> Result<()> {
    let target = target.clone();
    // Asked first: a server that does not answer is said, and the threads are read all the same.
    let statements = statements_unless_no_sql(a, &target);
    // What the tables lack is said after the snapshot: of a process that exited meanwhile, only that.
    let mut warnings = Vec::new();
    let unwind = unwind_tables(a, target.pid, &mut warnings);
    let opts = CollectOptions {
        duration: std::time::Duration::ZERO,
        kernel_stacks: a.kernel,
        unwind,
        ..a.target.collect_options(&target)
    };
    let started = Instant::now();
    let snapshot = threads::snapshot(&opts)?;
    let took = started.elapsed();
    let wait_begins = crate::query::follow::wait_begins(true, &target);
    let mut named = stacks::name_threads(target.pid, &snapshot.threads, &wait_begins);
    // Threads of a process that was exiting, named from maps that may be gone: not a picture of it.
    let zombie = |t: &threads::ThreadRecord| matches!(t.state, Some('Z' | 'X'));
    if snapshot.threads.is_empty()
        || process::exited(target.pid)
        || snapshot.threads.iter().all(zombie)
    {
        bail!(
            "the process (PID {}) exited during the snapshot: nothing to show",
            target.pid
        );
    }
    for w in &warnings {
        say!("myprobe: warning: {w}");
    }
    if let Some(word) = &statements {
        word.name(&mut named);
    }
    // Without the server's word, what its memory says its connections run.
    let sessions_started = Instant::now();
    let sessions = if statements.is_none() {
        sessions_from_memory(&target)
    } else {
        None
    };
    let sessions_took = sessions.as_ref().map(|s| {
        format!(
            "; its {} connections from its memory in {} ms",
            s.len(),
            sessions_started.elapsed().as_millis()
        )
    });
    let served = (sessions.as_deref())
        .map(|s| stacks::link_sessions(s, &snapshot.threads, &mut named))
        .unwrap_or_default();
    say!(
        "myprobe: {} threads of {target} read in {} ms, none stopped{}",
        named.len(),
        took.as_millis(),
        sessions_took.unwrap_or_default()
    );
    for line in snapshot.lost.report(named.len() as u64) {
        say!("myprobe: warning: {line}");
    }
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let sessions = (sessions.as_deref()).map(|s| {
        sessions_text(
            s,
            format,
            "the server's memory",
            Some(now_us),
            &served,
            None,
        )
    });
    write_output(a, format, &named, sessions.as_deref(), output)
}

/// The connections read `from` (the server's memory, a core), as text after the stacks, with their times at
/// `now_us` and their threads (`served`; the `crashed` one marked); only said on stderr where the stacks go to a
/// file in another format.
fn sessions_text(
    sessions: &[crate::sessions::Session],
    format: Format,
    from: &str,
    now_us: Option<u64>,
    served: &std::collections::HashMap<u64, u32>,
    crashed: Option<u32>,
) -> String {
    if format != Format::Text {
        say!(
            "myprobe: {} connections read from {from}, {} running a statement: shown on stdout, without -o",
            sessions.len(),
            sessions.iter().filter(|s| s.query.is_some()).count()
        );
    }
    stacks::render_sessions(sessions, now_us, served, crashed)
}

/// The server's connections read from its memory; what failed is said, and leaves none.
fn sessions_from_memory(target: &process::Target) -> Option<Vec<crate::sessions::Session>> {
    let read = || -> Result<Vec<crate::sessions::Session>> {
        let layout = crate::sessions::Layout::of_process(
            target.pid,
            &target.binary,
            target.flavor.server(),
        )?;
        if let Some(unknown) = layout.unknown() {
            say!("myprobe: {unknown}");
        }
        crate::sessions::read_process(target.pid, &layout)
    };
    match read() {
        Ok(s) => Some(s),
        Err(e) => {
            say!("myprobe: the connections could not be read from the server's memory: {e:#}");
            None
        }
    }
}

/// Each thread's current statement, by thread id, unless `--no-sql`; a server that does not answer (or names no
/// thread for its statements) is said and leaves none: its statements are then read from its memory.
fn statements_unless_no_sql(
    a: &StacksArgs,
    target: &process::Target,
) -> Option<stacks::ServerWord> {
    if a.no_sql {
        return None;
    }
    match stacks::statements(&a.connect, target.pid, &target.binary) {
        Ok(s) => Some(s),
        Err(e) => {
            say!("myprobe: the statements are read from the server's memory: {e:#}");
            None
        }
    }
}

/// The process's .eh_frame tables to unwind with, unless `--frame-pointers` (or not on x86-64); what they lack,
/// or why there are none, goes to `warnings`.
fn unwind_tables(
    a: &StacksArgs,
    pid: u32,
    warnings: &mut Vec<String>,
) -> Option<std::sync::Arc<UnwindStore>> {
    if a.frame_pointers || !cfg!(target_arch = "x86_64") {
        return None;
    }
    match UnwindStore::of(pid) {
        Ok((store, mut lacks)) => {
            warnings.append(&mut lacks);
            Some(store)
        }
        Err(e) => {
            warnings.push(format!("stacks are walked by frame pointers: {e:#}"));
            None
        }
    }
}

/// The threads, as `-o` and `--threads` ask, to stdout or the file; in text, followed by `sessions` (the
/// connections read from memory).
fn write_output(
    a: &StacksArgs,
    format: Format,
    named: &[stacks::ThreadStack],
    sessions: Option<&str>,
    output: Option<&Path>,
) -> Result<()> {
    let with_sessions = |text: String| match sessions {
        Some(s) => format!("{text}\n{s}"),
        None => text,
    };
    let text = match format {
        Format::Text if a.threads => with_sessions(stacks::render_threads(named)),
        Format::Text => with_sessions(stacks::render_groups(named)),
        Format::Folded => stacks::folded(named),
        Format::Json => serde_json::to_string_pretty(named)? + "\n",
    };
    match output {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                r => r.context("writing the stacks")?,
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Text,
    Folded,
    Json,
}
