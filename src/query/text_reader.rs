//! The thread that reads the server's tables for the texts of statements prepared before tracing and the users of
//! connections opened before it ([`PreparedTexts`](super::texts::PreparedTexts) asks and takes in what it found):
//! the process list sampled, the table of prepared statements, myprobe's own statements run for the calibration
//! of the execution probe (`executed.rs`).

use rustc_hash::FxHashMap as HashMap;
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use super::{
    executed::CALIBRATION_TEXTS,
    finder::{Sample, SampleRow},
};
use crate::{
    client::{self, ConnectArgs},
    collect,
    process::tids::TidMap,
};

/// How often the server's table of prepared statements is read while texts are wanted.
const TABLE_INTERVAL: Duration = Duration::from_millis(250);
/// The least time between two reads of the same kind asked for by records (`threads_wanted`, `table_wanted`).
const ASKED_INTERVAL: Duration = Duration::from_millis(20);

/// The process list's executing prepared statements, by host thread (rows of threads that ended are left out).
fn read_sample(client: &mut client::Client, tids: &mut TidMap) -> anyhow::Result<Sample> {
    // Each row's time since its statement began, and the own row's, in µs.
    let us = |ms: f64| (ms * 1000.0).round() as u64;
    let list = client.executing_prepared()?;
    let mut host = |tid: Option<u32>| tids.host(tid?);
    Ok(Sample {
        before_ns: list.sent_ns,
        after_ns: list.received_ns,
        own: list.own.and_then(|o| Some((host(o.tid)?, us(o.time_ms)))),
        rows: list
            .rows
            .into_iter()
            .filter_map(|r| {
                Some(SampleRow {
                    tid: host(r.tid)?,
                    time_us: us(r.time_ms),
                    text: r.info?,
                })
            })
            .collect(),
    })
}

/// The server's connections, by host thread.
fn read_threads(client: &mut client::Client, tids: &mut TidMap) -> anyhow::Result<ThreadsRead> {
    let read_ns = collect::monotonic_ns();
    let list = client.processlist()?;
    let rows = list
        .rows
        .into_iter()
        // A connection still in its handshake has no user yet.
        .filter(|r| !r.user.is_empty())
        .filter_map(|r| {
            let row = ThreadRow {
                id: u32::try_from(r.id).ok()?,
                user: r.user,
                db: r.db,
            };
            Some((tids.host(r.tid?)?, row))
        })
        .collect();
    Ok(ThreadsRead { read_ns, rows })
}

/// Every prepared statement the server keeps, by host thread and id.
fn read_prepared(client: &mut client::Client, tids: &mut TidMap) -> anyhow::Result<PreparedTable> {
    let read_ns = collect::monotonic_ns();
    let statements = client
        .prepared_statements()?
        .into_iter()
        .filter_map(|p| Some(((tids.host(p.tid)?, p.id), (p.text, p.truncated))))
        .collect();
    Ok(PreparedTable {
        read_ns,
        statements,
    })
}

/// What the reader of the server's tables sends: a sample of the process list (MariaDB), or every prepared
/// statement with its text (MySQL's performance_schema), by host thread and statement id.
pub(super) enum Found {
    /// Where texts are looked for, and where if that fails: said once connected.
    Source(TextSource, TextSource),
    Sample(Sample),
    Prepared(PreparedTable),
    Threads(ThreadsRead),
    /// myprobe's own statements ran (`CALIBRATION_TEXTS`): their ids.
    OwnStatements(Result<Vec<(u32, &'static str)>, String>),
}

/// Where the texts of statements prepared before tracing come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum TextSource {
    /// The server's table of prepared statements (performance_schema on).
    Table = 1,
    /// The executions themselves, at the server's statement objects ([`ExecutedTexts`]).
    Executions,
    /// Samples of the process list, joined with the executions traced ([`TextFinder`]): the last resort.
    ProcessList,
}

impl TextSource {
    fn of(n: u8) -> Option<TextSource> {
        [
            TextSource::Table,
            TextSource::Executions,
            TextSource::ProcessList,
        ]
        .into_iter()
        .find(|s| *s as u8 == n)
    }
}

/// The whole process list, by host thread: what the server says of connections whose handshake went by unseen.
pub(super) struct ThreadsRead {
    pub(super) read_ns: u64,
    pub(super) rows: HashMap<u32, ThreadRow>,
}

pub(super) struct ThreadRow {
    pub(super) id: u32,
    pub(super) user: String,
    pub(super) db: Option<String>,
}

/// The server's table of prepared statements, read whole: (host thread, id) → (text, cut).
#[derive(Default)]
pub(super) struct PreparedTable {
    /// CLOCK_MONOTONIC before the table was asked for: it holds what was prepared before then.
    pub(super) read_ns: u64,
    pub(super) statements: HashMap<(u32, u32), (String, bool)>,
}

/// The thread that reads the server's tables ([`PreparedTexts::start`]): what it shares with [`PreparedTexts`],
/// and when it last read what was asked for.
pub(super) struct Reader {
    pub(super) args: ConnectArgs,
    pub(super) pid: u32,
    /// The server's function that runs executions was found: texts can be read there.
    pub(super) can_execute: bool,
    pub(super) tx: mpsc::Sender<Result<Found, String>>,
    pub(super) wanted: Arc<AtomicBool>,
    pub(super) threads_wanted: Arc<AtomicBool>,
    pub(super) table_wanted: Arc<AtomicBool>,
    pub(super) paused: Arc<AtomicBool>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) interval_us: Arc<AtomicU64>,
    pub(super) source: Arc<AtomicU8>,
    pub(super) calibrate: Arc<AtomicBool>,
    /// Reads asked for (a connection's user, a prepare's statement) at most once an interval each: records
    /// keep asking while they wait.
    pub(super) last_threads: Option<Instant>,
    pub(super) last_table: Option<Instant>,
}

impl Reader {
    /// Connects, says where texts are looked for, and reads until stopped, or until a read fails or nobody
    /// listens any more.
    pub(super) fn run(mut self) {
        let mut client = match client::connect(&self.args, Some(self.pid)) {
            Ok(c) => c,
            Err(e) => {
                let _ = self.tx.send(Err(format!("{e:#}")));
                return;
            }
        };
        // The server's ids of its threads, mapped to the host's (a server in a container).
        let mut tids = TidMap::new(self.pid);
        if !self.choose_source(&mut client) {
            return;
        }
        while !self.stop.load(Ordering::Relaxed) {
            let from = TextSource::of(self.source.load(Ordering::Relaxed));
            let from_table = from == Some(TextSource::Table);
            let mut found = self.read_asked(&mut client, &mut tids, from_table);
            let sampling = self.wanted.load(Ordering::Relaxed)
                && !self.paused.load(Ordering::Relaxed)
                && from != Some(TextSource::Executions);
            if sampling {
                found.push(if from_table {
                    self.last_table = Some(Instant::now());
                    read_prepared(&mut client, &mut tids).map(Found::Prepared)
                } else {
                    read_sample(&mut client, &mut tids).map(Found::Sample)
                });
            }
            for f in found {
                let failed = f.is_err();
                if self.tx.send(f.map_err(|e| format!("{e:#}"))).is_err() || failed {
                    return;
                }
            }
            self.wait(sampling, from_table);
        }
    }

    /// Where texts are looked for first, and where if that fails: stored for [`PreparedTexts`] and sent. False
    /// when nobody listens any more.
    fn choose_source(&self, client: &mut client::Client) -> bool {
        // The server's table of prepared statements where it keeps one (performance_schema on); else (MariaDB's
        // default) the executions themselves, or, failing those, samples of its process list.
        let server = client.server();
        let has_table = server.prepared_statements_sql().is_some()
            && client.performance_schema_on().unwrap_or(false);
        let last_resort = match server.process_list_samples_texts() {
            true => TextSource::ProcessList,
            // Its error says what is missing.
            false => TextSource::Table,
        };
        let first = match (has_table, self.can_execute) {
            (true, _) => TextSource::Table,
            (false, true) => TextSource::Executions,
            (false, false) => last_resort,
        };
        self.source.store(first as u8, Ordering::Relaxed);
        self.tx.send(Ok(Found::Source(first, last_resort))).is_ok()
    }

    /// What was asked for since the last round: myprobe's own statements run, the whole process list, the
    /// table of prepared statements (where it is the source).
    fn read_asked(
        &mut self,
        client: &mut client::Client,
        tids: &mut TidMap,
        from_table: bool,
    ) -> Vec<anyhow::Result<Found>> {
        let mut found = Vec::new();
        if self.calibrate.swap(false, Ordering::Relaxed) {
            let ran = CALIBRATION_TEXTS
                .iter()
                .map(|&text| Ok((client.execute_own(text)?, text)))
                .collect::<anyhow::Result<Vec<_>>>();
            found.push(Ok(Found::OwnStatements(ran.map_err(|e| format!("{e:#}")))));
        }
        if self.threads_wanted.load(Ordering::Relaxed) && due(self.last_threads) {
            self.threads_wanted.store(false, Ordering::Relaxed);
            self.last_threads = Some(Instant::now());
            found.push(read_threads(client, tids).map(Found::Threads));
        }
        if from_table && self.table_wanted.load(Ordering::Relaxed) && due(self.last_table) {
            self.table_wanted.store(false, Ordering::Relaxed);
            self.last_table = Some(Instant::now());
            found.push(read_prepared(client, tids).map(Found::Prepared));
        }
        found
    }

    /// Waits for the next round: the sampler's interval while it samples the process list; else `ASKED_INTERVAL`
    /// while reads are asked for, `TABLE_INTERVAL` while the table is read, and until woken (or a second) when
    /// nothing is wanted.
    fn wait(&self, sampling: bool, from_table: bool) {
        let asked = self.threads_wanted.load(Ordering::Relaxed)
            || (from_table && self.table_wanted.load(Ordering::Relaxed));
        if sampling && !from_table {
            std::thread::sleep(Duration::from_micros(
                self.interval_us.load(Ordering::Relaxed),
            ));
        } else if asked {
            std::thread::park_timeout(ASKED_INTERVAL);
        } else if sampling {
            // The table is whole at each read: it is read again for statements prepared since, at once when an
            // execution of one comes (`wake_sampler`), while its connection still holds it.
            std::thread::park_timeout(TABLE_INTERVAL);
        } else {
            // Woken when texts are wanted again (`wake_sampler`): a sleep of 2 ms in a loop would cost about 1%
            // of a CPU for nothing.
            std::thread::park_timeout(Duration::from_secs(1));
        }
    }
}

/// Whether a read asked for may run again: never run, or last run at least `ASKED_INTERVAL` ago.
fn due(last: Option<Instant>) -> bool {
    last.is_none_or(|t| t.elapsed() >= ASKED_INTERVAL)
}
