//! The agent's side of the session history: one sampler per server traced (a thread of its own, beside its
//! collectors), writing to the one store of the agent (`history::writer::Writer`) and adding each second to the
//! server's DB load in the metrics.

use std::sync::Arc;

use anyhow::Result;

use super::shared::{locked, Shared};
use crate::{
    collect::{CollectOptions, Stop},
    history::sampler::{self, Sampler},
    process::Target,
    query::follow::FollowOptions,
    query::recent::Recent,
};

/// Samples `target` until `stop`, into the agent's store and its metrics; `opts`: its threads' iterator's (the
/// unwind tables the server's collectors share). Its statements seen (`recent`) name what a holder ran.
pub fn sample(
    target: &Target,
    opts: &CollectOptions,
    queries: &FollowOptions,
    shared: &Shared,
    recent: Arc<Recent>,
    stop: &Stop,
) -> Result<()> {
    let Some(writer) = shared.history.as_ref() else {
        return Ok(());
    };
    let brackets = {
        let mut symbolizer = crate::symbolize::Symbolizer::new(target.pid)?;
        crate::query::follow::wait_begins(queries.wait_sites, target)
            .brackets(target.pid, &mut symbolizer)
    };
    let sampler = Sampler::new(
        target,
        server_name(target),
        queries.connect.clone(),
        recent,
        brackets,
    )?;
    sampler::run(opts, sampler, stop, |second| {
        // The metrics first: a store slow to write does not hold the DB load back.
        if let Some(s) = shared.metrics().server(target.pid) {
            s.add_second(&second);
        }
        locked(writer).write(&second);
    })
}

/// A server as the store names it: what it is and where it listens, which stay across its restarts (its PID
/// where it listens on no TCP port).
fn server_name(target: &Target) -> String {
    match crate::client::socket::listening_port(target.pid) {
        Some(port) => format!(
            "{} {} on port {port}",
            target.flavor.db_system(),
            target.version
        ),
        None => format!(
            "{} {} (PID {})",
            target.flavor.db_system(),
            target.version,
            target.pid
        ),
    }
}

/// The sampler's thread of one server, until ended.
pub struct Sampling<'scope> {
    stop: Arc<Stop>,
    thread: Option<std::thread::ScopedJoinHandle<'scope, ()>>,
}

impl Sampling<'_> {
    /// Stops the sampler and waits for its thread.
    pub fn end(self) {
        self.stop.stop();
        if let Some(t) = self.thread {
            let _ = t.join();
        }
    }
}

/// Starts `target`'s sampler in a thread of `scope` (named, so that its CPU is told apart from the collectors':
/// bench/history).
pub fn start<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    target: &'env Target,
    opts: &'env CollectOptions,
    queries: &'env FollowOptions,
    shared: &'env Shared,
    recent: &Arc<Recent>,
) -> Sampling<'scope> {
    let stop = Arc::new(Stop::new());
    let (recent, until) = (Arc::clone(recent), Arc::clone(&stop));
    let thread = std::thread::Builder::new()
        .name(format!("history-{}", target.pid))
        .spawn_scoped(scope, move || {
            if let Err(e) = sample(target, opts, queries, shared, recent, &until) {
                say!("myprobe: agent: warning: no session history of {target}: {e:#}");
            }
        })
        .map_err(|e| say!("myprobe: agent: warning: no session history of {target}: {e}"))
        .ok();
    Sampling { stop, thread }
}
