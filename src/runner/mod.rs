//! Several collectors on one server at once: on-CPU, off-CPU and lock waits (each in a thread of its own with its
//! own BPF object, all sharing one copy of the unwind tables in the kernel) and the statements (`query::follow`), under one [`Stop`].
//! `myprobe report` runs them for a time and reads what they found when they end; the agent runs them until the
//! server exits, and reads their sums as they go ([`Plan::slices`]).

use std::{
    sync::{mpsc, Arc},
    thread::{Scope, ScopedJoinHandle},
    time::Duration,
};

use anyhow::Result;

use crate::{
    collect::{
        self,
        periods::Duty,
        targets::Targets,
        unwind_store::{Stores, UnwindStore},
        CollectOptions, Collected, Kind, Lost, Slices, Stop,
    },
    process::Target,
    query::{
        follow::{self, FollowOptions, Followed, ServerFunctions},
        QueryRecord,
    },
};

/// What to run, and how.
pub struct Plan<'a> {
    pub target: &'a Target,
    /// On-CPU sampling frequency, Hz.
    pub frequency: u64,
    pub min_block_us: u64,
    /// Off-CPU: a preempted thread at a new site keeps its instruction alone, not unwound (the agent's choice,
    /// bench/README.md).
    pub preempted_leaf_only: bool,
    /// Off-CPU and lock waits attached one period in N.
    pub duty: Option<Duty>,
    /// The statements' options; their `btf`, `max_kernel_mem_mib`, `stop` and `ring` are every collector's.
    pub statements: FollowOptions,
    /// The stack collectors' sums moved out while they trace; `None`: read when they end.
    pub slices: Option<Slices>,
    /// Told each collector once its probes are in place.
    pub attached: Option<mpsc::Sender<Kind>>,
    /// Where the unwind tables join those of other servers (the agent's); `None`: tables of its own.
    pub stores: Option<&'a Stores>,
    /// The collectors that a set of programs shared with other servers runs for this one, rather than this run
    /// ([`Plan::shared_options`]).
    pub shared: Vec<Kind>,
    /// The stack collectors' samples labelled by statement (src/bpf/statement.h), where they can be.
    pub labels: Option<Arc<collect::labels::StatementLabels>>,
}

/// What the collectors share, read before any starts: an error here leaves nothing running.
pub struct Prepared {
    pub tables: Option<Arc<UnwindStore>>,
    pub functions: ServerFunctions,
}

/// Reads the unwind tables (one copy in the kernel for every collector) and finds the functions the statements'
/// tracing probes.
pub fn prepare(plan: &Plan<'_>) -> Result<Prepared> {
    let pid = plan.target.pid;
    let tables = match plan.stores {
        Some(stores) if cfg!(target_arch = "x86_64") => Some(stores.for_process(pid)?),
        _ => UnwindStore::for_tracing(pid, false)?,
    };
    Ok(Prepared {
        tables,
        functions: follow::server_functions(plan.statements.uprobes, plan.target)?,
    })
}

/// The collectors' threads.
pub struct Running<'scope> {
    pub profiles: Vec<(Kind, ScopedJoinHandle<'scope, Result<Collected>>)>,
    pub statements: ScopedJoinHandle<'scope, Result<Followed>>,
}

impl Running<'_> {
    /// How many collectors still run.
    pub fn running(&self) -> usize {
        let profiles = self.profiles.iter().filter(|(_, h)| !h.is_finished());
        profiles.count() + usize::from(!self.statements.is_finished())
    }
}

/// What a collector's thread returned; its panic as an error.
pub fn joined<T>(handle: ScopedJoinHandle<'_, Result<T>>, what: Kind) -> Result<T> {
    handle
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the {} collector panicked", what.label())))
}

impl Plan<'_> {
    fn collect_options(
        &self,
        tables: Option<&Arc<UnwindStore>>,
        duty: Option<Duty>,
    ) -> CollectOptions {
        CollectOptions {
            unwind: tables.cloned(),
            attached: self.attached.clone(),
            slices: self.slices.clone(),
            duty,
            statements: self.labels.clone(),
            ..self.statements.collect_options(self.target.pid)
        }
    }

    /// The options of a sampled collector (off-CPU, lock waits) for the processes of `targets` (in their store
    /// `tables`), under a stop of their own.
    pub fn shared_options(
        &self,
        tables: &Arc<UnwindStore>,
        targets: Arc<Targets>,
    ) -> CollectOptions {
        CollectOptions {
            stop: Stop::new(),
            attached: None,
            targets: Some(targets),
            ..self.collect_options(Some(tables), self.duty.clone())
        }
    }

    /// The off-CPU collector's settings.
    pub fn offcpu_settings(&self) -> collect::offcpu::Options {
        collect::offcpu::Options {
            min_block_us: self.min_block_us,
            preempted_leaf_only: self.preempted_leaf_only,
            ..Default::default()
        }
    }

    /// The run's stop: every collector of it ends when it is stopped.
    pub fn stop(&self) -> &Stop {
        &self.statements.stop
    }
}

/// Starts every collector of `plan` in a thread of its own in `scope`: the statements' records go to `emit`
/// as they end, their losses to `on_lost` as they are counted.
pub fn start<'scope, 'env>(
    scope: &'scope Scope<'scope, 'env>,
    plan: &'env Plan<'env>,
    tables: Option<&Arc<UnwindStore>>,
    functions: ServerFunctions,
    emit: impl FnMut(QueryRecord) + Send + 'scope,
    on_lost: impl FnMut(Lost) + Send + 'scope,
) -> Running<'scope> {
    let cpu = plan.collect_options(tables, None);
    let offcpu = plan.collect_options(tables, plan.duty.clone());
    let locks = plan.collect_options(tables, plan.duty.clone());
    let mut profiles = vec![(
        Kind::Cpu,
        scope.spawn(move || collect::cpu::collect(&cpu, plan.frequency)),
    )];
    if !plan.shared.contains(&Kind::Offcpu) {
        let settings = plan.offcpu_settings();
        profiles.push((
            Kind::Offcpu,
            scope.spawn(move || collect::offcpu::collect(&offcpu, settings).map(|(c, _)| c)),
        ));
    }
    if !plan.shared.contains(&Kind::Locks) {
        profiles.push((
            Kind::Locks,
            scope.spawn(move || collect::locks::collect(&locks)),
        ));
    }
    let attached = plan.attached.clone();
    let tables = tables.cloned();
    let statements = scope.spawn(move || {
        let attached = || {
            if let Some(a) = attached {
                let _ = a.send(Kind::Statements);
            }
        };
        follow::follow(
            &plan.statements,
            plan.target,
            functions,
            tables,
            attached,
            emit,
            on_lost,
        )
    });
    Running {
        profiles,
        statements,
    }
}

/// How long to wait for each collector to attach before looking again whether some ended.
pub const ATTACH_POLL: Duration = Duration::from_millis(100);
