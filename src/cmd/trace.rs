//! `myprobe trace FUNC[,FUNC…]`: any function or static probe of the server, timed (DTrace's pid and usdt
//! providers, bcc's funclatency and funccount).

use std::{collections::HashMap, path::PathBuf, time::Duration};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::{
    collect::{
        self,
        trace::{ArgKind, ErrVal, Place, ProbePoint, TraceOptions, Traced},
        unwind_store::UnwindStore,
        CollectOptions,
    },
    process::{self, Target},
    profile::{
        stacks::{self, Part, StackNamer, StackOptions},
        Unit,
    },
    render::{self, Palette, RenderOptions},
    symbolize::{data::DataSymbolizer, Symbolizer},
    trace::{
        self,
        functions::{self, Modules, Spec},
        usdt, ArgShow, By,
    },
};

#[derive(Args)]
pub struct TraceArgs {
    /// Functions by demangled name or glob, comma-separated: `ha_innobase::write_row`, `'row_ins_*'`,
    /// `libc:pthread_setschedparam` (a library by its short name); or a static probe, `usdt:PROVIDER:NAME`
    #[arg(value_name = "FUNC[,FUNC…]", required_unless_present = "list")]
    pub functions: Option<String>,
    /// List the functions a pattern matches (`[LIB:]GLOB`), or with `usdt` the static probes of the server
    /// and its libraries, and exit
    #[arg(long, value_name = "PATTERN")]
    pub list: Option<String>,
    #[command(flatten)]
    pub target: crate::cmd::TargetArgs,
    /// Tracing duration in seconds (Ctrl-C ends early and still writes results)
    #[arg(short = 'd', long = "duration", default_value_t = 10)]
    pub duration: u64,
    /// What the rows are per, beside the function: `func`, `thread`, `stack` (the callers' stacks, as a profile:
    /// folded on stdout, or -o FILE of any format; the table goes to stderr), `argN` (argument N, from 0)
    #[arg(long, value_name = "KEY", default_value = "func")]
    pub by: String,
    /// Read argument N (from 0, as DTrace's arg0) as `int` (32-bit signed), `long`, `ptr` or `str` (a C
    /// string, as copyinstr), and key the rows by it
    #[arg(long, value_name = "N:TYPE")]
    pub arg: Option<String>,
    /// Count a call as failed when its return value is: `negative` (int < 0), `nonzero` (int != 0), `zero`
    /// (int == 0) or `null` (a NULL pointer)
    #[arg(long, value_name = "RULE")]
    pub errval: Option<String>,
    /// Also count and time the syscalls, lock (futex) waits and time off CPU of each thread while it is inside
    /// a traced function (the outermost one), and nowhere else
    #[arg(long)]
    pub inside: bool,
    /// Refuse to trace when the functions are called more often than this, in calls a second over all of them,
    /// measured for 200 ms first (each traced call costs the server about 1.5 µs, 11.6 µs where the kernel
    /// single-steps the probed instruction); 0: no check
    #[arg(long, value_name = "CALLS", default_value_t = 20_000)]
    pub max_rate: u64,
    /// With --by stack: count calls instead of time
    #[arg(long)]
    pub calls: bool,
    /// Rows in the table
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,
    /// Output file: `.json` for the tables as JSON; with --by stack, the profile (`.folded`, `.svg`, `.pb.gz`,
    /// `.json`)
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// With --by stack: walk stacks by frame pointers only
    #[arg(long)]
    pub frame_pointers: bool,
}

/// What the rows are keyed by, the argument read (its number and kind) and the error rule.
struct Keys {
    by: By,
    arg: Option<(u32, ArgKind)>,
    errval: ErrVal,
}

/// The [`Keys`] the arguments ask for, checked against the output asked for.
fn keys(a: &TraceArgs) -> Result<Keys> {
    let by = parse_by(&a.by)?;
    let arg = a.arg.as_deref().map(parse_arg).transpose()?;
    let errval = a
        .errval
        .as_deref()
        .map_or(Ok(ErrVal::ERRVAL_NONE), parse_errval)?;
    let (by, arg) = match (by, arg) {
        (By::Arg(n), None) => (by, Some((n, ArgKind::ARG_INT))),
        (By::Arg(n), Some((m, _))) if n != m => {
            bail!("--by arg{n} and --arg {m}:…: the rows can be keyed by one argument")
        }
        (By::Function, Some((n, _))) => (By::Arg(n), arg),
        (By::Thread | By::Stack, Some(_)) => {
            bail!("--arg keys the rows by the argument: it does not go with --by thread or stack")
        }
        other => other,
    };
    if let Some(out) = &a.output {
        let format = render::format_for(out)?;
        if by != By::Stack && !matches!(format, render::Format::Json) {
            bail!(
                "-o {}: without --by stack the output is a table, written as .json",
                out.display()
            );
        }
    }
    anyhow::ensure!(a.duration > 0, "-d must be at least 1 second");
    Ok(Keys { by, arg, errval })
}

pub fn run(a: TraceArgs) -> Result<()> {
    let keys = keys(&a)?;
    let (by, arg) = (keys.by, keys.arg);
    let target = a.target.resolve()?;
    let mut modules = Modules::of_process(target.pid, &target.exe, &target.binary)?;
    if let Some(pattern) = &a.list {
        return list(&target, &mut modules, pattern);
    }
    let options = trace_options(&a, &target, &mut modules, keys)?;
    let unwind = if by == By::Stack {
        UnwindStore::for_tracing(target.pid, a.frame_pointers)?
    } else {
        None
    };
    let mut symbolizer = if by == By::Stack {
        let mut s = Symbolizer::new(target.pid).context("preparing symbolization")?;
        s.preload(false);
        Some(s)
    } else {
        None
    };
    let what = if options.probes.len() == 1 {
        options.probes[0].label.clone()
    } else {
        format!("{} probes", options.probes.len())
    };
    let opts = CollectOptions {
        duration: Duration::from_secs(a.duration),
        unwind,
        announce: format!(
            "myprobe: tracing {what} in {target}{} for {} s; Ctrl-C ends early",
            if a.inside {
                ", and what happens inside"
            } else {
                ""
            },
            a.duration
        ),
        ..a.target.collect_options(&target)
    };
    if options.probes.len() > 1 {
        say!(
            "myprobe: {} probes: {}",
            options.probes.len(),
            short_list(&options.probes)
        );
    }
    let traced = collect::trace::collect(&opts, &options)?;
    if let Some(rate) = &traced.rate {
        say!(
            "myprobe: {:.0} calls a second before tracing (measured over {} ms)",
            rate.total(),
            rate.measured.as_millis()
        );
    }
    let secs = traced.collected.traced.as_secs_f64();
    let timed = options.timed();
    let show = arg.map(|(_, kind)| match kind {
        ArgKind::ARG_STR_KIND => ArgShow::Str,
        ArgKind::ARG_PTR => ArgShow::Ptr,
        _ => ArgShow::Int,
    });
    let text = tables(&a, &target, &traced, &options, by, show);
    let calls = traced
        .stats
        .iter()
        .map(|s| s.calls)
        .fold(0, u64::saturating_add);
    say!("myprobe: {calls} calls traced in {secs:.1} s");
    let ended = opts.stop.ended();
    if traced.too_deep > 0 {
        say!(
            "myprobe: note: {} calls nested more than 8 deep in traced functions were not timed",
            traced.too_deep
        );
    }
    for line in traced.collected.lost.report(calls) {
        say!("myprobe: warning: {line}");
    }
    if by == By::Stack {
        let symbolizer = symbolizer.as_mut().expect("made for --by stack");
        write_callers(&a, &target, &traced, symbolizer, timed, &what)?;
        say!(
            "myprobe: results written in {:.0} ms after tracing ended",
            ended.elapsed().as_secs_f64() * 1000.0
        );
        say_part!("{text}");
        return Ok(());
    }
    match &a.output {
        Some(path) => {
            let json = trace::to_json(&traced, &options.probes, by, show, secs);
            std::fs::write(path, serde_json::to_string_pretty(&json)? + "\n")
                .with_context(|| format!("writing {}", path.display()))?;
            say!("myprobe: wrote {}", path.display());
            say_part!("{text}");
        }
        None => write_stdout(&text)?,
    }
    say!(
        "myprobe: results written in {:.0} ms after tracing ended",
        ended.elapsed().as_secs_f64() * 1000.0
    );
    Ok(())
}

/// The probes and how to trace them; the notes of what they cost.
fn trace_options(
    a: &TraceArgs,
    target: &Target,
    modules: &mut Modules,
    Keys { by, arg, errval }: Keys,
) -> Result<TraceOptions> {
    let probes = trace::points::resolve(target, modules, a.functions.as_deref().unwrap_or(""))?;
    let stepped: Vec<&str> = probes
        .iter()
        .filter(|p| matches!(&p.place, Place::Function(e) if !e.emulated))
        .map(|p| p.label.as_str())
        .take(5)
        .collect();
    if !stepped.is_empty() {
        say!(
            "myprobe: note: the kernel single-steps the first instruction of {}: each of their calls costs \
             ~11.6 µs traced, not ~1.5 µs, and their times include it",
            stepped.join(", ")
        );
    }
    let options = TraceOptions {
        probes,
        arg,
        errval,
        by_thread: by == By::Thread,
        by_stack: by == By::Stack,
        inside: a.inside,
        max_rate: a.max_rate,
    };
    if a.inside && !options.timed() {
        bail!("--inside needs a function: a static probe has no inside");
    }
    Ok(options)
}

/// The tables: per function and key, the latency histograms, what happened inside.
fn tables(
    a: &TraceArgs,
    target: &Target,
    traced: &Traced,
    options: &TraceOptions,
    by: By,
    show: Option<ArgShow>,
) -> String {
    let timed = options.timed();
    let mut names = HashMap::new();
    let pid = target.pid;
    let mut thread_name = |tid: u32| {
        names
            .entry(tid)
            .or_insert_with(|| process::thread_name(pid, tid))
            .clone()
    };
    let mut text = trace::table(
        traced,
        &options.probes,
        by,
        show,
        timed,
        &mut thread_name,
        a.top,
    );
    if timed {
        text += &trace::histograms(traced, &options.probes, 10);
    }
    if a.inside {
        let mut locks = DataSymbolizer::new(target.pid).ok();
        // A lock in no variable (on the heap, in an anonymous mapping) is told apart by its address.
        let mut lock_name = |addr: u64| match locks.as_mut().map(|l| l.name(addr)) {
            Some(name) if !name.starts_with('[') => name,
            Some(name) => format!("{name} {addr:#x}"),
            None => format!("{addr:#x}"),
        };
        text += &trace::inside(traced, &options.probes, &mut lock_name, a.top);
    }
    text
}

/// `--by stack`: the callers of the probes as a flame graph.
fn write_callers(
    a: &TraceArgs,
    target: &Target,
    traced: &Traced,
    symbolizer: &mut Symbolizer,
    timed: bool,
    what: &str,
) -> Result<()> {
    let mut namer = StackNamer::new(
        symbolizer,
        StackOptions {
            pid: target.pid,
            per_thread: false,
            addresses: false,
            by_statement: false,
        },
    );
    let (unit, column, scale) = if a.calls || !timed {
        (Unit::Count, "calls", 1)
    } else {
        (Unit::Microseconds, "total_ns", 1000)
    };
    let profile = stacks::build(&traced.collected, &mut namer, unit, |c, row| {
        vec![Part::value(c.value(row, column) / scale)]
    });
    let opts = RenderOptions {
        title: format!("Callers of {what}: {target}"),
        palette: Palette::Hot,
        ..RenderOptions::default()
    };
    render::write_profile(&profile, a.output.as_deref(), &opts)
}

fn write_stdout(text: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing the table"),
    }
}

fn short_list(probes: &[ProbePoint]) -> String {
    let mut names: Vec<&str> = probes.iter().take(8).map(|p| p.label.as_str()).collect();
    if probes.len() > 8 {
        names.push("…");
    }
    names.join(", ")
}

fn parse_by(s: &str) -> Result<By> {
    Ok(match s {
        "func" | "function" => By::Function,
        "thread" | "tid" => By::Thread,
        "stack" => By::Stack,
        _ => match s.strip_prefix("arg").and_then(|n| n.parse::<u32>().ok()) {
            Some(n) if n < 6 => By::Arg(n),
            _ => bail!("--by {s:?}: one of func, thread, stack, arg0 … arg5"),
        },
    })
}

fn parse_arg(s: &str) -> Result<(u32, ArgKind)> {
    let (n, kind) = s.split_once(':').unwrap_or((s, "int"));
    let n: u32 = n
        .trim_start_matches("arg")
        .parse()
        .ok()
        .filter(|&n| n < 6)
        .with_context(|| format!("--arg {s:?}: N is an argument from 0 to 5 (in registers)"))?;
    let kind = match kind {
        "int" => ArgKind::ARG_INT,
        "long" => ArgKind::ARG_LONG,
        "ptr" => ArgKind::ARG_PTR,
        "str" => ArgKind::ARG_STR_KIND,
        _ => bail!("--arg {s:?}: TYPE is int, long, ptr or str"),
    };
    Ok((n, kind))
}

fn parse_errval(s: &str) -> Result<ErrVal> {
    Ok(match s {
        "negative" | "neg" => ErrVal::ERRVAL_NEGATIVE,
        "nonzero" => ErrVal::ERRVAL_NONZERO,
        "zero" => ErrVal::ERRVAL_ZERO,
        "null" => ErrVal::ERRVAL_NULL,
        _ => bail!("--errval {s:?}: one of negative, nonzero, zero, null"),
    })
}

/// `--list PATTERN`: functions, or `usdt` for static probes, one a line on stdout.
fn list(target: &Target, modules: &mut Modules, pattern: &str) -> Result<()> {
    let mut out = String::new();
    if pattern == "usdt" || pattern.starts_with("usdt:") {
        let wanted = pattern.strip_prefix("usdt:").unwrap_or("*");
        let matcher = functions::Pattern::new(wanted)?;
        for (basename, path) in trace::points::probe_files(target)? {
            for p in usdt::probes(&path).unwrap_or_default() {
                let full = format!("{}:{}", p.provider, p.name);
                let as_function = functions::Function {
                    name: full.clone(),
                    address: p.address,
                    size: 0,
                };
                if matcher.matches(&as_function) {
                    out += &format!(
                        "usdt:{full}  {basename}  {:#x}  args: {}{}\n",
                        p.address,
                        if p.args.is_empty() { "(none)" } else { &p.args },
                        if p.semaphore != 0 {
                            "  (semaphore)"
                        } else {
                            ""
                        }
                    );
                }
            }
        }
        if out.is_empty() {
            say!("myprobe: {target} has no static probes matching {wanted:?} (Debian's MariaDB has none)");
        }
        return write_stdout(&out);
    }
    let s = Spec::parse(pattern);
    let module = modules.module(s.module)?;
    let found = functions::matching(module, s.pattern)?;
    for f in &found {
        out += &format!("{}  {:#x}  {}\n", module.basename, f.address, f.name);
    }
    say!("myprobe: {} functions match {pattern:?}", found.len());
    write_stdout(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_and_keys_parse() {
        assert_eq!(parse_arg("1:str").unwrap(), (1, ArgKind::ARG_STR_KIND));
        assert_eq!(parse_arg("0").unwrap(), (0, ArgKind::ARG_INT));
        assert!(parse_arg("7:int").is_err());
        assert!(parse_arg("1:float").is_err());
        assert_eq!(parse_by("arg2").unwrap(), By::Arg(2));
        assert!(parse_by("args").is_err());
        assert!(parse_errval("sometimes").is_err());
    }
}
