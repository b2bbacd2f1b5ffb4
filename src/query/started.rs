//! The statements a server runs when tracing begins, read from its memory (`sessions`, nothing asked of the
//! server): each one's text, connection and real start. The collector follows them from then on as if traced from
//! their start ([`StartedBefore`]); their records come back with the command byte alone, and get their text and
//! connection here. A statement still running when tracing ends is checked against the server's memory again:
//! one that ended between its read and its seeding, unseen, is not shown.

use anyhow::{Context, Result};
use rustc_hash::FxHashMap;

use crate::{
    collect::{
        self,
        queries::{RawStatement, StartedBefore},
        CollectOptions,
    },
    process::Target,
    query::record::{dispatch_fd, realtime_offset_ns, Learned},
    sessions::{self, Layout, Query, Session},
    wire::protocol,
};

/// The statements running when tracing began, by the thread that runs each.
#[derive(Default)]
pub struct Started {
    by_tid: FxHashMap<u32, Session>,
    /// Where the server keeps its connections, to read them again when tracing ends.
    layout: Option<(u32, Layout)>,
    /// Its connections as read again at the end (once: `None` where they could not be).
    at_end: Option<Option<Vec<Session>>>,
}

impl Started {
    /// Reads `target`'s connections from its memory, and the threads serving those that run a statement (with the
    /// stack each waits on: `opts`'s unwinding): what the collector is to follow from now on.
    pub fn read(target: &Target, opts: &CollectOptions) -> Result<(Started, Vec<StartedBefore>)> {
        if !target.flavor.is_server() {
            return Ok((Started::default(), Vec::new()));
        }
        let server = target.flavor.server();
        let layout = Layout::of_process(target.pid, &target.binary, server)?;
        let running: Vec<Session> = sessions::read_process(target.pid, &layout)?
            .into_iter()
            .filter(runs_a_statement)
            .collect();
        let mut started = Started {
            by_tid: FxHashMap::default(),
            layout: Some((target.pid, layout)),
            at_end: None,
        };
        if running.is_empty() {
            return Ok((started, Vec::new()));
        }
        let threads = collect::threads::snapshot(opts)
            .context("reading the threads that run statements")?
            .threads;
        let serving = sessions::serving_threads(&running, &threads);
        let offset_ns = realtime_offset_ns();
        let now = collect::monotonic_ns();
        let mut seeds = Vec::new();
        for s in running {
            let (Some(thread), Some(us)) = (serving.get(&s.thd), s.started_us) else {
                continue;
            };
            let start_ns = (i128::from(us) * 1000 - offset_ns).clamp(0, i128::from(now)) as u64;
            seeds.push(StartedBefore {
                tid: thread.tid,
                start_ns,
                command: command_code(s.command.unwrap_or("Query")),
                wait_stack: thread.futex.is_some().then(|| thread.stack.clone()),
            });
            started.by_tid.insert(thread.tid, s);
        }
        Ok((started, seeds))
    }

    /// Gives `s`, a statement that ran when tracing began, its text, and returns its connection as the server
    /// holds it, for the tracker; `None` if it is not one of those read, or, still running at the end, it is no
    /// longer the statement its thread runs (it ended unseen between its read and its seeding).
    pub fn join(&mut self, s: &mut RawStatement) -> Option<Learned> {
        let session = self.by_tid.remove(&s.tid)?;
        if s.in_flight && !self.still_runs(&session) {
            return None;
        }
        let (text, truncated) = match &session.query {
            Some(Query::Text(t)) => (t.as_str(), false),
            Some(Query::Truncated(t)) => (t.as_str(), true),
            _ => return None,
        };
        // An execution's text is its statement's: shown as a query's is.
        s.request = std::iter::once(protocol::COM_QUERY)
            .chain(text.bytes())
            .collect();
        s.packet_len = (s.request.len() + truncated as usize) as u32;
        Some(Learned::Connection {
            socket: if s.fd >= 0 { s.fd } else { dispatch_fd(s.tid) },
            id: session.id as u32,
            user: session.user.as_deref().map(str::to_owned),
            db: session.db.as_deref().map(str::to_owned),
        })
    }

    /// Whether the connection of `session` still runs the statement read then (the same start), as its memory
    /// says now; true where that cannot be read.
    fn still_runs(&mut self, session: &Session) -> bool {
        let layout = &self.layout;
        let at_end = self.at_end.get_or_insert_with(|| {
            let (pid, layout) = layout.as_ref()?;
            sessions::read_process(*pid, layout).ok()
        });
        let Some(now) = at_end else {
            return true;
        };
        now.iter()
            .find(|n| n.thd == session.thd && n.id == session.id)
            .is_some_and(|n| runs_a_statement(n) && n.started_us == session.started_us)
    }
}

/// Whether a connection runs a statement: a text, and a command that runs one (where the command is known).
fn runs_a_statement(s: &Session) -> bool {
    matches!(s.query, Some(Query::Text(_) | Query::Truncated(_)))
        && s.command
            .is_none_or(|c| matches!(c, "Query" | "Execute" | "Fetch"))
}

/// The protocol's code of a command named as `protocol::command_name` names it.
fn command_code(name: &str) -> u8 {
    (0..=u8::MAX)
        .find(|&c| protocol::command_name(c) == name)
        .unwrap_or(protocol::COM_QUERY)
}
