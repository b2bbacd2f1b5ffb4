//! The thread that reads the server's tables for the texts of statements prepared before tracing and the users of
//! connections opened before it (texts.rs's `PreparedTexts` asks, [`Ask`], and takes in what it found, [`Found`],
//! through a [`Reader`](super::reader::Reader)): the process list sampled, the table of prepared statements,
//! myprobe's own statements run for the calibration of the execution probe (`executed.rs`).

use rustc_hash::FxHashMap as HashMap;
use std::time::{Duration, Instant};

use super::{
    executed::CALIBRATION_TEXTS,
    finder::{Sample, SampleRow},
    reader::{Asked, Ended, OwnConnections},
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
pub(super) enum TextSource {
    /// The server's table of prepared statements (performance_schema on).
    Table,
    /// The executions themselves, at the server's statement objects ([`ExecutedTexts`]).
    Executions,
    /// Samples of the process list, joined with the executions traced ([`TextFinder`]): the last resort.
    ProcessList,
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

/// What texts.rs asks of the reader; each changes what it reads from then on, and some wake it at once.
pub(super) enum Ask {
    /// Texts are wanted (statements were seen without one), or no longer: the process list is sampled only then.
    Wanted(bool),
    /// No statement is traced for a while (between sampled periods), or they are again: nothing is sampled
    /// meanwhile.
    Paused(bool),
    /// A statement was newly wanted: sampled at `SAMPLE_INTERVAL` from now on, and at once.
    NewlyWanted(Duration),
    /// None was newly wanted for a while: sampled at `SLOW_SAMPLE_INTERVAL`.
    Slowly(Duration),
    /// A record waits for its connection's user: the whole process list is read, once.
    Threads,
    /// A prepare seen at dispatch_command (TLS: its reply with the id is encrypted): the server's table of
    /// prepared statements is read at once, while the statement is likely still there.
    Table,
    /// The execution probe was first attached: myprobe's own statements are run, for its calibration.
    Calibrate,
    /// The execution probe failed: texts are looked for there instead.
    Source(TextSource),
}

/// What the reader was asked, as last told.
struct Wants {
    texts: bool,
    paused: bool,
    interval: Duration,
    source: Option<TextSource>,
    threads: bool,
    table: bool,
    calibrate: bool,
    /// An ask came that ends the next wait at once, whenever it comes (as an unpark before a park does).
    woken: bool,
}

impl Wants {
    /// Takes in `ask`; true if it wakes the reader: what it asks for was not asked already.
    fn take(&mut self, ask: Ask) -> bool {
        let wakes = match ask {
            Ask::Wanted(wanted) => !std::mem::replace(&mut self.texts, wanted) && wanted,
            Ask::Paused(paused) => std::mem::replace(&mut self.paused, paused) && !paused,
            Ask::NewlyWanted(interval) => {
                self.interval = interval;
                true
            }
            Ask::Slowly(interval) => {
                self.interval = interval;
                false
            }
            Ask::Threads => !std::mem::replace(&mut self.threads, true),
            Ask::Table => !std::mem::replace(&mut self.table, true),
            Ask::Calibrate => {
                self.calibrate = true;
                true
            }
            Ask::Source(source) => {
                self.source = Some(source);
                true
            }
        };
        self.woken |= wakes;
        wakes
    }
}

/// The thread that reads the server's tables (`PreparedTexts::start`): what it was asked, and when it last read
/// what was asked for.
pub(super) struct TextReader {
    args: ConnectArgs,
    pid: u32,
    /// The server's function that runs executions was found: texts can be read there.
    can_execute: bool,
    asked: Asked<Ask, Result<Found, String>>,
    /// Where the connection it opens is registered.
    own: OwnConnections,
    wants: Wants,
    /// Reads asked for (a connection's user, a prepare's statement) at most once an interval each: records
    /// keep asking while they wait.
    last_threads: Option<Instant>,
    last_table: Option<Instant>,
}

impl TextReader {
    /// The reader of the server `pid`, connecting as `args` (its connection one of the run's `own`), sampling at
    /// `interval` once texts are wanted.
    pub(super) fn new(
        args: ConnectArgs,
        pid: u32,
        can_execute: bool,
        interval: Duration,
        own: OwnConnections,
        asked: Asked<Ask, Result<Found, String>>,
    ) -> TextReader {
        TextReader {
            args,
            pid,
            can_execute,
            asked,
            own,
            wants: Wants {
                texts: false,
                paused: false,
                interval,
                source: None,
                threads: false,
                table: false,
                calibrate: false,
                woken: false,
            },
            last_threads: None,
            last_table: None,
        }
    }

    /// Connects, says where texts are looked for, and reads until the pipeline ends, or until a read fails or
    /// nobody listens any more.
    pub(super) fn run(mut self) {
        let mut client = match self.own.connect(&self.args, self.pid) {
            Ok(c) => c,
            Err(e) => {
                let _ = self.asked.send(Err(format!("{e:#}")));
                return;
            }
        };
        // The server's ids of its threads, mapped to the host's (a server in a container).
        let mut tids = TidMap::new(self.pid);
        if !self.choose_source(&mut client) {
            return;
        }
        while self.take_asks().is_ok() {
            let from = self.wants.source;
            let from_table = from == Some(TextSource::Table);
            let mut found = self.read_asked(&mut client, &mut tids, from_table);
            if self.take_asks().is_err() {
                return;
            }
            let sampling =
                self.wants.texts && !self.wants.paused && from != Some(TextSource::Executions);
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
                if !self.asked.send(f.map_err(|e| format!("{e:#}"))) || failed {
                    return;
                }
            }
            if self.wait(sampling, from_table).is_err() {
                return;
            }
        }
    }

    /// Takes in what was asked since.
    fn take_asks(&mut self) -> Result<(), Ended> {
        let wants = &mut self.wants;
        self.asked.take(|ask| wants.take(ask)).map(|_| ())
    }

    /// Where texts are looked for first, and where if that fails: kept, and sent. False when nobody listens any
    /// more.
    fn choose_source(&mut self, client: &mut client::Client) -> bool {
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
        self.wants.source = Some(first);
        self.asked.send(Ok(Found::Source(first, last_resort)))
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
        if std::mem::take(&mut self.wants.calibrate) {
            let ran = CALIBRATION_TEXTS
                .iter()
                .map(|&text| Ok((client.execute_own(text)?, text)))
                .collect::<anyhow::Result<Vec<_>>>();
            found.push(Ok(Found::OwnStatements(ran.map_err(|e| format!("{e:#}")))));
        }
        if self.wants.threads && due(self.last_threads) {
            self.wants.threads = false;
            self.last_threads = Some(Instant::now());
            found.push(read_threads(client, tids).map(Found::Threads));
        }
        if from_table && self.wants.table && due(self.last_table) {
            self.wants.table = false;
            self.last_table = Some(Instant::now());
            found.push(read_prepared(client, tids).map(Found::Prepared));
        }
        found
    }

    /// Waits for the next round: the sampler's interval while it samples the process list; else `ASKED_INTERVAL`
    /// while reads are asked for, `TABLE_INTERVAL` while the table is read, and until woken (or a second) when
    /// nothing is wanted.
    fn wait(&mut self, sampling: bool, from_table: bool) -> Result<(), Ended> {
        self.take_asks()?;
        let asked = self.wants.threads || (from_table && self.wants.table);
        let timeout = if sampling && !from_table {
            // Not woken: an ask waits for the end of the interval, as it comes within one of the next.
            std::thread::sleep(self.wants.interval);
            return Ok(());
        } else if asked {
            ASKED_INTERVAL
        } else if sampling {
            // The table is whole at each read: it is read again for statements prepared since, at once when an
            // execution of one comes (`Ask::NewlyWanted`), while its connection still holds it.
            TABLE_INTERVAL
        } else {
            // Woken when texts are wanted again: a sleep of 2 ms in a loop would cost about 1% of a CPU for
            // nothing.
            Duration::from_secs(1)
        };
        if std::mem::take(&mut self.wants.woken) {
            return Ok(());
        }
        let wants = &mut self.wants;
        let waited = self.asked.wait(timeout, |ask| wants.take(ask));
        self.wants.woken = false;
        waited
    }
}

/// Whether a read asked for may run again: never run, or last run at least `ASKED_INTERVAL` ago.
fn due(last: Option<Instant>) -> bool {
    last.is_none_or(|t| t.elapsed() >= ASKED_INTERVAL)
}
