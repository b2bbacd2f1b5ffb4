//! The texts of statements prepared before tracing, and the users of connections opened before it, from what the
//! server says of them ([`PreparedTexts`]): where performance_schema is on, its table of prepared statements names
//! each exactly; where it is off, the executions themselves do (`executed.rs`, read from the server's statement
//! objects); failing those, the process list does, sampled (`finder.rs`). A thread of its own reads the server
//! (`text_reader.rs`); here, the records wait for what it finds, for a while, and are released in order.

use rustc_hash::FxHashMap as HashMap;
use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use super::{
    executed::{Calibrated, ExecutedTexts, CALIBRATION_TEXTS},
    finder::{Execution, TextFinder, MAX_EXECUTIONS},
    reader::{OwnConnections, Reader},
    record::{Learned, QueryRecord, Text},
    text_reader::{Ask, Found, PreparedTable, TextReader, TextSource},
};
use crate::{
    client::{self, ConnectArgs},
    collect::{
        self,
        queries::{ExecuteWish, Executed},
    },
    wire::fingerprint::fingerprint,
};

impl PreparedTexts {
    /// A record whose connection's user went by unseen (its handshake before tracing, or under TLS), and that
    /// began after the latest read of the process list: the next read says it.
    fn awaits_user(&self, r: &QueryRecord) -> bool {
        self.reader.is_some() && r.user.is_none() && r.start_ns > self.threads_read_ns
    }
}

/// An execution whose text is looked for.
fn awaits_text(r: &QueryRecord) -> bool {
    r.prepared.is_some() && r.query.is_none()
}

/// How often the process list is read while texts are wanted (each read takes about a millisecond here), and
/// once no statement has been newly wanted for `SLOW_AFTER` (those left are rare, and may never be named).
const SAMPLE_INTERVAL: Duration = Duration::from_millis(2);
const SLOW_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);
const SLOW_AFTER: Duration = Duration::from_secs(5);
/// How long a record waits for its statement's text before it is written without.
const HOLD: Duration = Duration::from_secs(2);
/// How long it waits for an execution probe that is not ready yet (attached, its offset known), at most: it
/// fails within this time when it fails (`executed::CALIBRATION_WAIT`), and the text is then looked for elsewhere.
const UNREADY_HOLD: Duration = Duration::from_secs(30);
/// How long the execution probe is wanted after an execution of unknown text: its statement's next execution
/// names it, unless it was closed meanwhile (a close is not followed), when the probe would cost for nothing.
const EXECUTE_PROBE_FOR: Duration = Duration::from_secs(10);
/// How often what the reader found is taken in, at most.
const JOIN_INTERVAL: Duration = Duration::from_millis(50);
/// Records held at most (a busy server runs tens of thousands of statements a second).
const MAX_HELD: usize = 200_000;

/// The texts of statements prepared before tracing, looked up in the server's process list while tracing
/// ([`TextFinder`]): a thread of its own reads the list while texts are wanted; a record of an execution whose
/// text is unknown waits for it, for at most `HOLD`, and the later records of its thread wait behind it (each
/// thread's records stay in order; the records of other threads go at once).
pub struct PreparedTexts {
    pub finder: TextFinder,
    /// Literals shown as they were sent (`FollowOptions::raw_sql`), in the texts given to records.
    raw_sql: bool,
    /// The thread that reads the server's tables, asked what to read; `None` until started, or if it could not be.
    reader: Option<Reader<Ask, Result<Found, String>>>,
    /// Whether what it finds is taken in: not once it failed.
    listening: bool,
    /// Where texts are looked for if the executions fail.
    fallback: Option<TextSource>,
    /// The server's function that runs executions, where texts are read (`Server::statement_execute`), if found.
    execute_function: Option<String>,
    /// The traced server.
    pid: u32,
    /// Texts read at the executions themselves, where that is the source.
    executed: Option<ExecutedTexts>,
    /// The server's own table of prepared statements, where it has one, as last read.
    prepared: PreparedTable,
    /// When each thread last prepared a statement: an id it was given may stand for another statement in a table
    /// read before (a connection that ended, whose thread serves another that counts its ids anew).
    last_prepare: HashMap<u32, u64>,
    /// Whether texts are wanted, and whether tracing is paused, as the reader was last told (`Ask::Wanted`,
    /// `Ask::Paused`: it samples the list only while wanted and not paused).
    wanted: bool,
    paused: bool,
    /// CLOCK_MONOTONIC before the latest read of the whole process list: what began before it was there to see.
    threads_read_ns: u64,
    /// Whether the reader samples slowly (`Ask::Slowly`); and when a statement was last newly wanted.
    slowly: bool,
    last_new: Instant,
    /// When an execution of unknown text last came (the execution probe is wanted for a while after).
    last_unknown: Option<Instant>,
    /// Whether the execution probe is attached, and since when it is ready (attached, its offset known).
    probe_attached: bool,
    probe_ready: Option<Instant>,
    /// The same, on the kernel's clock (CLOCK_MONOTONIC ns), to compare with the statements' times.
    probe_ready_ns: u64,
    /// The latest start of a statement read: how far the records read have come, whatever the reader's lag.
    events_ns: u64,
    /// The calibration's line, said at the next tick.
    found_offset: Option<String>,
    /// Per thread, the records waiting, from one whose text is looked for.
    held: HashMap<u32, VecDeque<(QueryRecord, Instant)>>,
    held_count: usize,
    /// The reader's own statements, whichever server it reads.
    own_fingerprints: Vec<String>,
    /// Why the sampler stopped, said once texts are wanted.
    error: Option<String>,
    last_join: Instant,
    /// The same, in the statements' time (CLOCK_MONOTONIC ns): records are joined every JOIN_INTERVAL of their
    /// own time, with no read of the clock for each.
    last_join_ns: u64,
    /// Statements named, and whether the process list could not be read.
    pub named: u64,
    pub failed: bool,
    /// The reader's own statements, traced and not reported.
    pub own_statements: u64,
}

impl Default for PreparedTexts {
    fn default() -> Self {
        PreparedTexts {
            finder: TextFinder::default(),
            raw_sql: false,
            reader: None,
            listening: false,
            fallback: None,
            execute_function: None,
            pid: 0,
            executed: None,
            prepared: PreparedTable::default(),
            last_prepare: HashMap::default(),
            wanted: false,
            paused: false,
            threads_read_ns: 0,
            slowly: false,
            last_new: Instant::now(),
            last_unknown: None,
            probe_attached: false,
            probe_ready: None,
            probe_ready_ns: 0,
            events_ns: 0,
            found_offset: None,
            held: HashMap::default(),
            held_count: 0,
            own_fingerprints: crate::server::ALL
                .iter()
                .flat_map(|s| {
                    [s.executing_prepared_sql(), s.processlist_sql()]
                        .into_iter()
                        .chain(s.prepared_statements_sql())
                })
                .chain([client::PERFORMANCE_SCHEMA_ON_SQL])
                .chain(CALIBRATION_TEXTS)
                .map(fingerprint)
                .collect(),
            error: None,
            last_join: Instant::now(),
            last_join_ns: 0,
            named: 0,
            failed: false,
            own_statements: 0,
        }
    }
}

impl PreparedTexts {
    /// Nothing read yet: [`PreparedTexts::start`] starts the reader; until then, records go as they come.
    pub fn new(raw_sql: bool) -> Self {
        PreparedTexts {
            raw_sql,
            ..PreparedTexts::default()
        }
    }

    /// Starts reading the server's tables, through a connection of a thread of its own (whose failure is said
    /// once: the texts then stay unknown). `execute_function`: the server's function that runs executions, where
    /// the texts are read when the server has no table of them (`Server::statement_execute`), if it has it. Its
    /// connection is one of the run's `own`.
    pub fn start(
        &mut self,
        args: &ConnectArgs,
        pid: u32,
        execute_function: Option<String>,
        own: &OwnConnections,
    ) {
        self.pid = pid;
        let can_execute = execute_function.is_some();
        self.execute_function = execute_function;
        let (args, own) = (args.clone(), own.clone());
        let reader = Reader::spawn("myprobe-processlist", move |asked| {
            TextReader::new(args, pid, can_execute, SAMPLE_INTERVAL, own, asked).run()
        });
        match reader {
            Ok(reader) => {
                self.reader = Some(reader);
                self.listening = true;
            }
            Err(e) => self.fail(&format!("cannot start a thread: {e}")),
        }
    }

    /// No statement is traced for a while (between sampled periods): the list is not read meanwhile, and the
    /// records held for their texts are written now (the samples taken joined first), not when the next
    /// period's come.
    pub fn pause(&mut self, emit: &mut impl FnMut(QueryRecord)) -> Vec<Learned> {
        if !std::mem::replace(&mut self.paused, true) {
            self.ask(Ask::Paused(true));
        }
        let mut learned = Vec::new();
        self.join(&mut learned, true);
        self.release(true, true, emit);
        learned
    }

    pub fn resume(&mut self) {
        if std::mem::replace(&mut self.paused, false) {
            self.ask(Ask::Paused(false));
        }
    }

    fn ask(&self, ask: Ask) {
        if let Some(reader) = &self.reader {
            reader.ask(ask);
        }
    }

    fn fail(&mut self, why: &str) {
        if !self.failed {
            self.failed = true;
            say!(
                "myprobe: warning: the texts of statements prepared before tracing cannot be read from the \
                 server's process list (--no-sql does without): {why}"
            );
        }
        self.listening = false;
    }

    /// Takes a record and writes (`emit`) those ready: a record whose text is still looked for waits for it;
    /// the others go at once. The reader's own statements are not the server's: they are kept for dating
    /// the samples, and not written. Returns what was learned meanwhile, for the tracker.
    pub fn add(
        &mut self,
        mut record: QueryRecord,
        emit: &mut impl FnMut(QueryRecord),
    ) -> Vec<Learned> {
        let mut learned = Vec::new();
        if self.reader.is_none() {
            emit(record);
            return learned;
        }
        // Named first: a tracer's own statements prepared before this one began are known by their texts.
        self.name_from_table(&mut learned, &mut record);
        self.name_from_execution(&mut learned, &mut record);
        if record
            .fingerprint
            .as_ref()
            .is_some_and(|f| self.own_fingerprints.iter().any(|o| **o == **f))
        {
            self.finder.own_statement(record.tid, record.start_ns);
            self.own_statements += 1;
            return learned;
        }
        if record.command == "Prepare" {
            if self.last_prepare.len() >= MAX_EXECUTIONS {
                self.last_prepare.clear();
            }
            self.last_prepare.insert(record.tid, record.start_ns);
            if record.socket < -1 {
                self.ask(Ask::Table);
            }
        }
        if let Some(key) = record.prepared {
            let e = Execution {
                tid: record.tid,
                start_ns: record.start_ns,
                end_ns: record.end_ns,
                key,
            };
            let known = record.query.as_ref().and(record.fingerprint.as_ref());
            if self.finder.execution(e, known) {
                // Sampled often from now on; slowly again once none is new for SLOW_AFTER (at a tick).
                self.last_new = Instant::now();
                self.slowly = false;
                self.ask(Ask::NewlyWanted(SAMPLE_INTERVAL));
            }
            let wanted = self.finder.wants_texts();
            if wanted != std::mem::replace(&mut self.wanted, wanted) {
                self.ask(Ask::Wanted(wanted));
            }
            if wanted {
                if let Some(why) = self.error.take() {
                    self.fail(&why);
                }
            }
        }
        self.events_ns = self.events_ns.max(record.start_ns);
        if awaits_text(&record) {
            self.last_unknown = Some(Instant::now());
        }
        let behind = self.held.get(&record.tid).is_some_and(|q| !q.is_empty());
        let awaits_user = self.awaits_user(&record);
        if awaits_user {
            // The reader reads the list once, however many ask: it wakes at the first ask since its last read.
            self.ask(Ask::Threads);
        }
        if behind || (self.listening && (awaits_text(&record) || awaits_user)) {
            self.held
                .entry(record.tid)
                .or_default()
                .push_back((record, Instant::now()));
            self.held_count += 1;
        } else {
            emit(record);
        }
        let join_ns = JOIN_INTERVAL.as_nanos() as u64;
        if self.events_ns.saturating_sub(self.last_join_ns) >= join_ns
            || self.held_count >= MAX_HELD
        {
            self.join_and_release(&mut learned, false, emit);
        }
        learned
    }

    /// Takes in what the reader found and writes the records that no longer wait (`caught_up`: at a tick, when
    /// the reader's clock may end a wait).
    fn join_and_release(
        &mut self,
        learned: &mut Vec<Learned>,
        caught_up: bool,
        emit: &mut impl FnMut(QueryRecord),
    ) {
        self.last_join = Instant::now();
        self.last_join_ns = self.events_ns;
        self.join(learned, false);
        self.release(false, caught_up, emit);
    }

    /// What the execution probe is to do: be attached while executions of statements of unknown text come (or
    /// `always`: statements are seen at dispatch_command, whose prepares' ids are in encrypted replies), and
    /// read the texts where the calibration found them.
    pub fn execute_wish(&self, always: bool) -> ExecuteWish {
        match &self.executed {
            Some(x) if !x.failed() => ExecuteWish {
                // Not for ever: a statement closed before its next execution stays unknown.
                wanted: always
                    || (self.finder.wants_texts()
                        && self
                            .last_unknown
                            .is_some_and(|t| t.elapsed() < EXECUTE_PROBE_FOR)),
                text_offset: x.offset(),
            },
            _ => ExecuteWish::default(),
        }
    }

    /// The execution probe was attached (or detached): the first time, myprobe's own statements are run for the
    /// calibration.
    pub fn execute_probe(&mut self, attached: bool) {
        self.probe_attached = attached;
        self.probe_ready = None;
        let Some(executed) = self.executed.as_mut().filter(|_| attached) else {
            return;
        };
        if executed.offset() != 0 {
            self.probe_ready = Some(Instant::now());
            self.probe_ready_ns = collect::monotonic_ns();
        } else if executed.attached() {
            self.ask(Ask::Calibrate);
        }
    }

    /// The execution probe could not be attached: the texts are looked for elsewhere.
    pub fn execute_probe_failed(&mut self, why: &str) {
        let failed = self
            .executed
            .as_mut()
            .map(|x| x.fail(format!("its uprobe could not be attached: {why}")));
        self.calibrated(failed);
    }

    /// The execution probe reads the texts from now on: said (not before, or executions right after the line
    /// would still come without their text).
    pub fn execute_texts(&mut self) {
        if let Some(line) = self.found_offset.take() {
            say!("{line}");
        }
        if self.probe_attached {
            self.probe_ready = Some(Instant::now());
            self.probe_ready_ns = collect::monotonic_ns();
        }
    }

    /// An execution seen by the execution probe.
    pub fn executed(&mut self, e: Executed) {
        let calibrated = self.executed.as_mut().and_then(|x| x.event(e));
        self.calibrated(calibrated);
    }

    /// The calibration's conclusion, if it came: said; on failure the texts are looked for where the server
    /// offers them otherwise.
    fn calibrated(&mut self, calibrated: Option<Calibrated>) {
        let function = self.execute_function.as_deref().unwrap_or("?");
        match calibrated {
            None => {}
            // Said, and the probe ready, once the collector has given the probe the offset (`execute_texts`).
            Some(Calibrated::Offset(offset)) => {
                self.found_offset = Some(format!(
                    "myprobe: the texts of statements prepared before tracing are read at their executions, from \
                     the statement objects of {function} (the text at +{offset:#x}, found on statements of myprobe's \
                     own)"
                ))
            }
            Some(Calibrated::Failed(why)) => {
                let fallback = self.fallback.unwrap_or(TextSource::ProcessList);
                say!(
                    "myprobe: warning: the texts of statements prepared before tracing cannot be read at {function}: \
                     {why}; {}",
                    match fallback {
                        TextSource::ProcessList =>
                            "they are looked for in the process list instead, which names only the executions it \
                             catches running",
                        _ => "they are looked for in performance_schema instead",
                    }
                );
                self.ask(Ask::Source(fallback));
            }
        }
    }

    /// Names `r`, an execution, from the text its probe event gave, and every record held for the same statement.
    fn name_from_execution(&mut self, learned: &mut Vec<Learned>, r: &mut QueryRecord) {
        let (Some(executed), Some(key)) = (self.executed.as_mut(), r.prepared) else {
            return;
        };
        if !matches!(r.command, "Execute" | "Bulk_execute") {
            return;
        }
        let Some((text, cut)) = executed.take(r.tid, key.1) else {
            return;
        };
        if !awaits_text(r) {
            return;
        }
        // Named once, whether or not it was wanted yet (its first execution is this one).
        self.named += self.finder.text(&key).is_none() as u64;
        self.finder.found_elsewhere(key, &text);
        r.name_statement(&text, self.raw_sql);
        r.truncated |= cut;
        for (held, _) in self.held.values_mut().flatten() {
            if held.prepared == Some(key) && held.query.is_none() {
                held.name_statement(&text, self.raw_sql);
                held.truncated |= cut;
            }
        }
        learned.push(Learned::Prepared { key, text });
    }

    /// Time passes: what the reader found is taken in, and the records that waited long enough are written,
    /// whether or not statements come.
    pub fn tick(&mut self, emit: &mut impl FnMut(QueryRecord)) -> Vec<Learned> {
        if !self.slowly && self.last_new.elapsed() >= SLOW_AFTER {
            self.slowly = true;
            self.ask(Ask::Slowly(SLOW_SAMPLE_INTERVAL));
        }
        let mut learned = Vec::new();
        if self.reader.is_some() && self.last_join.elapsed() >= JOIN_INTERVAL {
            self.join_and_release(&mut learned, true, emit);
        }
        learned
    }

    /// Joins the samples read so far; the records waiting for the statements they name get their text.
    fn join(&mut self, learned: &mut Vec<Learned>, done: bool) {
        let mut error = None;
        let found: Vec<_> = match &self.reader {
            Some(reader) if self.listening => reader.found().collect(),
            _ => Vec::new(),
        };
        for found in found {
            match found {
                Ok(Found::Source(first, fallback)) => {
                    self.fallback = Some(fallback);
                    if first == TextSource::Executions {
                        self.executed = Some(ExecutedTexts::new(self.pid));
                    }
                }
                Ok(Found::OwnStatements(ran)) => {
                    let calibrated = self
                        .executed
                        .as_mut()
                        .and_then(|x| x.own_statements_ran(ran));
                    self.calibrated(calibrated);
                }
                Ok(Found::Sample(s)) => self.finder.sample(s),
                // Each table names what it holds: a later one may no longer (the connection closed).
                Ok(Found::Prepared(table)) => {
                    self.prepared = table;
                    let mut held = std::mem::take(&mut self.held);
                    for (r, _) in held.values_mut().flatten() {
                        self.name_from_table(learned, r);
                    }
                    self.held = held;
                }
                Ok(Found::Threads(threads)) => {
                    self.threads_read_ns = threads.read_ns;
                    for (r, _) in self.held.values_mut().flatten() {
                        let Some(row) = threads.rows.get(&r.tid).filter(|_| r.user.is_none())
                        else {
                            continue;
                        };
                        learned.push(Learned::Connection {
                            socket: r.socket,
                            id: row.id,
                            user: Some(row.user.clone()),
                            db: row.db.clone(),
                        });
                        r.conn = r.conn.or(Some(row.id));
                        r.user = Some(row.user.as_str().into());
                        r.db = row.db.as_deref().map(Text::from);
                    }
                }
                Err(e) => error = Some(e),
            }
        }
        if let Some(e) = error {
            self.listening = false;
            if self.finder.wants_texts() {
                self.fail(&e);
            } else {
                self.error = Some(e);
            }
        }
        let overdue = self.executed.as_mut().and_then(ExecutedTexts::overdue);
        self.calibrated(overdue);
        for (key, text) in self.finder.join(collect::monotonic_ns(), done) {
            self.named += 1;
            for (r, _) in self.held.values_mut().flatten() {
                if r.prepared == Some(key) && r.query.is_none() {
                    r.name_statement(&text, self.raw_sql);
                }
            }
            learned.push(Learned::Prepared { key, text });
        }
    }

    /// Names `r` from the server's table of prepared statements, if it awaits its text and the table has it.
    fn name_from_table(&mut self, learned: &mut Vec<Learned>, r: &mut QueryRecord) {
        let Some(key) = r.prepared.filter(|_| awaits_text(r)) else {
            return;
        };
        let table = &self.prepared;
        if self
            .last_prepare
            .get(&r.tid)
            .is_some_and(|&at| at >= table.read_ns)
        {
            return;
        }
        let Some((text, cut)) = table.statements.get(&(r.tid, key.1)) else {
            return;
        };
        if self.finder.found_elsewhere(key, text) {
            self.named += 1;
            learned.push(Learned::Prepared {
                key,
                text: text.clone(),
            });
        }
        r.name_statement(text, self.raw_sql);
        r.truncated |= *cut;
    }

    /// Writes, thread by thread, the records at the front that have their text or waited long enough (all of
    /// them when done, or when too many wait). A wait is counted in the statements' own time as the records read
    /// show it, so that a reader behind a busy server does not give up on the texts still to be read; and, when
    /// `caught_up` (nothing is left to read), in the reader's time too, for a server that went quiet.
    fn release(&mut self, done: bool, caught_up: bool, emit: &mut impl FnMut(QueryRecord)) {
        let looking = self.listening && !done && self.held_count < MAX_HELD;
        // Read at the executions, a text comes with the statement's next execution once the probe is ready: a
        // record waits for that, however long the probe took to attach and find its offset.
        let probe = self.executed.as_ref().is_some_and(|x| !x.failed());
        let (events_ns, ready_ns) = (self.events_ns, self.probe_ready_ns);
        let hold_ns = HOLD.as_nanos() as u64;
        let waited = |from_ns: u64, from: Instant| {
            events_ns.saturating_sub(from_ns) >= hold_ns || (caught_up && from.elapsed() >= HOLD)
        };
        for queue in self.held.values_mut() {
            while let Some((r, since)) = queue.front() {
                let awaits_user = r.user.is_none() && r.start_ns > self.threads_read_ns;
                let text_due = match (probe, self.probe_ready) {
                    (true, Some(ready)) => waited(r.start_ns.max(ready_ns), (*since).max(ready)),
                    (true, None) => since.elapsed() >= UNREADY_HOLD,
                    (false, _) => waited(r.start_ns, *since),
                };
                let waits =
                    (awaits_text(r) && !text_due) || (awaits_user && since.elapsed() < HOLD);
                if looking && waits {
                    break;
                }
                if let Some((r, _)) = queue.pop_front() {
                    self.held_count -= 1;
                    emit(r);
                }
            }
        }
        self.held.retain(|_, queue| !queue.is_empty());
    }

    /// How many statements prepared before tracing were named, and from where, if any was or the source failed.
    pub fn summary(&self) -> Option<String> {
        let named = self.named;
        let execute_failed = self.executed.as_ref().is_some_and(ExecutedTexts::failed);
        let implausible = self.executed.as_ref().map_or(0, |x| x.implausible);
        // A busy host may not run myprobe's own statements within a short trace: what is unknown is said why.
        if self
            .executed
            .as_ref()
            .is_some_and(ExecutedTexts::calibrating)
        {
            say!(
                "myprobe: the texts of statements prepared before tracing were still being looked for in the \
                 server's statement objects when tracing ended (its executions on myprobe's own statements had not \
                 all been seen): trace longer to have them"
            );
        }
        if implausible > 0 {
            say!(
                "myprobe: warning: {implausible} texts read at executions had an impossible length, and were not \
                 used: the server's statement object is not laid out as calibrated"
            );
        }
        if self.finder.samples_joined > 0 || (self.failed && named == 0) {
            Some(format!(
                "{named} statements prepared before tracing named from the server's process list ({} samples, {} of \
                 one statement)",
                self.finder.samples_joined, self.finder.samples_named
            ))
        } else if named == 0 {
            None
        } else if self.executed.is_some() && !execute_failed {
            Some(format!(
                "{named} statements prepared before tracing named at their executions ({})",
                self.execute_function.as_deref().unwrap_or("?")
            ))
        } else {
            Some(format!(
                "{named} statements prepared before tracing named from performance_schema.prepared_statements_instances"
            ))
        }
    }

    /// Tracing ended: the last samples are joined, the sampler stopped, every record written.
    pub fn finish(&mut self, emit: &mut impl FnMut(QueryRecord)) -> Vec<Learned> {
        if let Some(reader) = &mut self.reader {
            reader.stop();
        }
        let mut learned = Vec::new();
        self.join(&mut learned, true);
        self.release(true, true, emit);
        learned
    }
}
