//! `myprobe programs`: every BPF program of every collector, loaded into this kernel in each configuration the
//! commands use and checked by its verifier, nothing attached; what the verifier needed for each, against its limit.
//! A program past half of it is an error: the same program needs more on another kernel release.

use std::sync::{mpsc, Arc};

use anyhow::{bail, Result};
use clap::Args;

use crate::{
    collect::{
        self,
        alloc::AllocOptions,
        features::Features,
        load::{Refused, Verified, VERIFIER_LIMIT},
        offcpu,
        targets::Targets,
        trace::{ArgKind, ErrVal, TraceOptions},
        unwind_store::UnwindStore,
        CollectOptions,
    },
    process::Target,
    query::follow::{self, FollowOptions},
};

use super::TargetArgs;

#[derive(Args, Debug)]
pub struct ProgramsArgs {
    #[command(flatten)]
    pub target: TargetArgs,
}

/// A program needs at most this share of the verifier's limit here: what it needs varies by kernel release.
pub const ROOM: u32 = VERIFIER_LIMIT / 2;

/// One configuration of a collector, as a command uses it.
struct Configuration {
    /// How a command line asks for it.
    label: &'static str,
    /// Its object (src/bpf/NAME.bpf.c).
    object: &'static str,
    /// One set of programs for several servers (the agent's), which needs bpf_loop.
    set: bool,
    load: fn(&Context<'_>, CollectOptions) -> Result<()>,
}

/// What every configuration is loaded against.
struct Context<'a> {
    target: &'a Target,
    args: &'a TargetArgs,
    tables: Option<Arc<UnwindStore>>,
}

impl Context<'_> {
    /// The statements' tracing, through the pipeline `queries`, `report` and the agent share.
    fn follow(&self, opts: CollectOptions, options: FollowOptions) -> Result<()> {
        let functions = follow::server_functions(options.uprobes, self.target)?;
        let options = FollowOptions {
            btf: self.args.btf.clone(),
            max_kernel_mem_mib: self.args.max_kernel_mem,
            verify_only: opts.verify_only,
            ..options
        };
        follow::follow(
            &options,
            self.target,
            functions,
            self.tables.clone(),
            || {},
            |_| {},
            |_| {},
        )?;
        Ok(())
    }
}

fn alloc(opts: CollectOptions, sample_every: u64, leaks: bool) -> Result<()> {
    let alloc = AllocOptions {
        sample_every,
        min_size: 0,
        max_size: u64::MAX,
        outstanding_older_than: leaks.then_some(0),
        interval: None,
    };
    collect::alloc::collect(&opts, &alloc, |_| {}).map(drop)
}

fn trace(opts: CollectOptions, everything: bool) -> Result<()> {
    let trace = TraceOptions {
        probes: Vec::new(),
        arg: everything.then_some((0, ArgKind::ARG_STR_KIND)),
        errval: if everything {
            ErrVal::ERRVAL_NEGATIVE
        } else {
            ErrVal::ERRVAL_NONE
        },
        by_thread: everything,
        by_stack: everything,
        inside: everything,
        max_rate: 0,
    };
    collect::trace::collect(&opts, &trace).map(drop)
}

fn statements(no_wait_sites: bool, syscall_cpu: bool, min_ms: u64) -> FollowOptions {
    FollowOptions {
        wait_sites: !no_wait_sites,
        syscall_cpu,
        min_statement_ns: min_ms * 1_000_000,
        ..FollowOptions::new(None)
    }
}

/// The agent's off-CPU: a preempted thread at a new site keeps its leaf alone.
fn agent_offcpu(opts: CollectOptions) -> Result<()> {
    let settings = offcpu::Options {
        preempted_leaf_only: true,
        ..Default::default()
    };
    offcpu::collect(&opts, settings).map(drop)
}

/// The agent's off-CPU and lock waits: one set of programs for its servers.
fn as_set(mut opts: CollectOptions) -> CollectOptions {
    let (send, _) = mpsc::channel();
    opts.targets = Some(Arc::new(Targets::of(opts.pid, send)));
    opts
}

const CONFIGURATIONS: &[Configuration] = &[
    Configuration {
        label: "profile cpu",
        object: "cpu",
        set: false,
        load: |_, o| collect::cpu::collect(&o, 99).map(drop),
    },
    Configuration {
        label: "profile cpu --kernel",
        object: "cpu",
        set: false,
        load: |_, o| {
            let o = CollectOptions {
                kernel_stacks: true,
                ..o
            };
            collect::cpu::collect(&o, 99).map(drop)
        },
    },
    Configuration {
        label: "profile cpu --frame-pointers",
        object: "cpu",
        set: false,
        load: |_, o| {
            let o = CollectOptions { unwind: None, ..o };
            collect::cpu::collect(&o, 99).map(drop)
        },
    },
    Configuration {
        label: "profile offcpu",
        object: "offcpu",
        set: false,
        load: |_, o| offcpu::collect(&o, offcpu::Options::default()).map(drop),
    },
    Configuration {
        label: "profile offcpu --kernel --preemptors --per-thread",
        object: "offcpu",
        set: false,
        load: |_, o| {
            let settings = offcpu::Options {
                per_thread: true,
                preemptors: true,
                ..Default::default()
            };
            let o = CollectOptions {
                kernel_stacks: true,
                ..o
            };
            offcpu::collect(&o, settings).map(drop)
        },
    },
    Configuration {
        label: "agent, off-CPU, a set per server",
        object: "offcpu",
        set: false,
        load: |_, o| agent_offcpu(o),
    },
    Configuration {
        label: "agent, off-CPU, one set for its servers",
        object: "offcpu",
        set: true,
        load: |_, o| agent_offcpu(as_set(o)),
    },
    Configuration {
        label: "profile locks",
        object: "locks",
        set: false,
        load: |_, o| collect::locks::collect(&o).map(drop),
    },
    Configuration {
        label: "agent, lock waits, one set for its servers",
        object: "locks",
        set: true,
        load: |_, o| collect::locks::collect(&as_set(o)).map(drop),
    },
    Configuration {
        label: "profile syscalls",
        object: "syscalls",
        set: false,
        load: |_, o| collect::syscalls::collect(&o, 0, &[]).map(drop),
    },
    Configuration {
        label: "profile alloc",
        object: "alloc",
        set: false,
        load: |_, o| alloc(o, 1, false),
    },
    Configuration {
        label: "profile alloc --sample 10",
        object: "alloc",
        set: false,
        load: |_, o| alloc(o, 10, false),
    },
    Configuration {
        label: "profile alloc --frame-pointers",
        object: "alloc",
        set: false,
        load: |_, o| alloc(CollectOptions { unwind: None, ..o }, 1, false),
    },
    Configuration {
        label: "profile memleak",
        object: "alloc",
        set: false,
        load: |_, o| alloc(o, 1, true),
    },
    Configuration {
        label: "trace",
        object: "trace",
        set: false,
        load: |_, o| trace(o, false),
    },
    Configuration {
        label: "trace --inside --by-stack --by-thread --arg --errors",
        object: "trace",
        set: false,
        load: |_, o| trace(o, true),
    },
    Configuration {
        label: "stacks",
        object: "threads",
        set: false,
        load: |_, o| collect::threads::snapshot(&o).map(drop),
    },
    Configuration {
        label: "queries",
        object: "queries",
        set: false,
        load: |c, o| c.follow(o, statements(false, false, 0)),
    },
    Configuration {
        label: "queries --syscall-cpu",
        object: "queries",
        set: false,
        load: |c, o| c.follow(o, statements(false, true, 0)),
    },
    Configuration {
        label: "queries --min-ms 1 --no-wait-sites",
        object: "queries",
        set: false,
        load: |c, o| c.follow(o, statements(true, false, 1)),
    },
    // The cost model's (bench/statement-cost): each run timed.
    Configuration {
        label: "queries --run-costs",
        object: "queries",
        set: false,
        load: |c, o| c.follow(o, measured(statements(false, false, 0))),
    },
    Configuration {
        label: "queries --run-costs --syscall-cpu",
        object: "queries",
        set: false,
        load: |c, o| c.follow(o, measured(statements(false, true, 0))),
    },
];

fn measured(options: FollowOptions) -> FollowOptions {
    FollowOptions {
        run_costs: true,
        ..options
    }
}

/// One line of the table: a program a configuration loaded, or what kept it from loading.
enum Outcome {
    Loaded(Verified),
    /// The kernel lacks what the configuration needs (said, not a failure).
    Unavailable(String),
    Failed(String),
}

pub fn run(a: ProgramsArgs) -> Result<()> {
    let target = a.target.resolve()?;
    let features = Features::of_kernel(a.target.btf.as_deref());
    let context = Context {
        target: &target,
        args: &a.target,
        tables: UnwindStore::for_tracing(target.pid, false)?,
    };
    say!(
        "myprobe: loading every program, in each configuration, for {target}: nothing is attached"
    );
    println!(
        "{:<52} {:<18} {:>12} {:>9}",
        "configuration", "program", "instructions", "of limit"
    );
    let mut failed = Vec::new();
    for c in CONFIGURATIONS {
        for outcome in load(c, &context, &features) {
            match outcome {
                // The kernel counted nothing it could say.
                Outcome::Loaded(v) if v.insns == 0 => {
                    println!(
                        "{:<52} {:<18} {:>12} {:>9}",
                        c.label, v.program, "n/a", "n/a"
                    );
                }
                Outcome::Loaded(v) => {
                    let share = f64::from(v.insns) * 100.0 / f64::from(VERIFIER_LIMIT);
                    println!(
                        "{:<52} {:<18} {:>12} {:>8.1}%",
                        c.label, v.program, v.insns, share
                    );
                    if v.insns > ROOM {
                        failed.push(format!(
                            "{} ({}): {} instructions, past half of the verifier's limit of {VERIFIER_LIMIT}",
                            v.program, c.label, v.insns
                        ));
                    }
                }
                Outcome::Unavailable(why) => println!("{:<52} {why}", c.label),
                Outcome::Failed(e) => {
                    println!("{:<52} FAILED: {e}", c.label);
                    failed.push(format!("{}: {e}", c.label));
                }
            }
        }
    }
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

/// Loads one configuration and says what came of it, program by program.
fn load(c: &Configuration, context: &Context<'_>, features: &Features) -> Vec<Outcome> {
    if (features.compat() && c.set) || features.require_build_for(c.object).is_err() {
        return vec![Outcome::Unavailable(
            "not loaded: this kernel has no bpf_loop, which it needs (the command says so in one line)".into(),
        )];
    }
    let (send, verified) = mpsc::channel();
    // Samples labelled by statement, as every command that can label them does by default (memleak's, syscalls'
    // and trace's programs cannot, and ignore it).
    let opts = CollectOptions {
        unwind: context.tables.clone(),
        verify_only: Some(send),
        statements: Some(collect::labels::StatementLabels::new(
            crate::sessions::statements::StatementsInMemory::boxed(),
        )),
        ..context.args.collect_options(context.target)
    };
    let result = (c.load)(context, opts);
    let mut outcomes: Vec<Outcome> = verified.try_iter().map(Outcome::Loaded).collect();
    match result {
        Err(e) => {
            let e = match e.downcast_ref::<Refused>() {
                Some(r) => r.to_string(),
                None => format!("{e:#}"),
            };
            outcomes.push(Outcome::Failed(e));
        }
        Ok(()) if outcomes.is_empty() => {
            outcomes.push(Outcome::Failed("no program was loaded".into()))
        }
        Ok(()) => {}
    }
    outcomes
}
