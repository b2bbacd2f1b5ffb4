//! The history kept on the node: one SQLite file (WAL: the agent writes while `myprobe history` and the page read;
//! a commit is on disk before the next second, so an agent killed mid-write loses at most that second). Every
//! sample for `Retention::samples_s`, per-minute sums for `Retention::minutes_s`, the whole file within
//! `Retention::max_bytes` (the oldest samples go first). Statements' texts are kept once, by fingerprint.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use super::{Second, SessionSample};

/// How long and how much is kept.
#[derive(Clone, Debug)]
pub struct Retention {
    pub samples_s: i64,
    pub minutes_s: i64,
    pub max_bytes: u64,
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            samples_s: 24 * 3600,
            minutes_s: 30 * 86_400,
            max_bytes: 256 << 20,
        }
    }
}

/// The file's name in the agent's directory.
pub const FILE_NAME: &str = "history.sqlite";

const SCHEMA_VERSION: i64 = 2;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS servers (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS statements (
    id INTEGER PRIMARY KEY, fingerprint TEXT NOT NULL UNIQUE, text TEXT NOT NULL, last_ts INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS samples (
    ts INTEGER NOT NULL, server INTEGER NOT NULL, conn INTEGER NOT NULL,
    user TEXT, host TEXT, db TEXT, statement INTEGER,
    statement_ms INTEGER, transaction_ms INTEGER,
    state TEXT NOT NULL, object TEXT, blocker INTEGER, root_blocker INTEGER,
    holder_statements TEXT,
    PRIMARY KEY (ts, server, conn)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS minutes (
    minute INTEGER NOT NULL, server INTEGER NOT NULL, state TEXT NOT NULL, statement INTEGER NOT NULL,
    user TEXT NOT NULL, host TEXT NOT NULL, root_blocker INTEGER NOT NULL, samples INTEGER NOT NULL,
    PRIMARY KEY (minute, server, state, statement, user, host, root_blocker)) WITHOUT ROWID;
";

/// The store, open for writing (the agent) or reading.
pub struct Store {
    db: Connection,
    path: PathBuf,
    retention: Retention,
    servers: HashMap<String, i64>,
    /// Each statement's id by its fingerprint, and the second its `last_ts` was last written.
    statements: HashMap<String, (i64, i64)>,
    last_retention: i64,
}

/// How long a write waits for another process holding the file before it fails (and says so).
const BUSY_WAIT: Duration = Duration::from_secs(2);

impl Store {
    /// Opens (or makes) the store at `path` to write to it: a file another process holds, or that is not a
    /// SQLite database, or whose disk is full, is an error in one line.
    pub fn open(path: &Path, retention: Retention) -> Result<Store> {
        let db = Connection::open(path)
            .with_context(|| format!("opening the history store {}", path.display()))?;
        let what = || format!("the history store {}", path.display());
        db.busy_timeout(BUSY_WAIT).with_context(what)?;
        // WAL: readers never block the writer; NORMAL: a commit survives the agent's crash (not the machine's
        // power loss, which loses at most the last commits); incremental vacuum: deleted pages go back to the
        // file system as the size cap asks.
        db.pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .with_context(what)?;
        let mode: String = db
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .with_context(|| format!("{}: is another process holding it?", what()))?;
        anyhow::ensure!(
            mode.eq_ignore_ascii_case("wal"),
            "{}: its journal cannot be a write-ahead log ({mode})",
            what()
        );
        db.pragma_update(None, "synchronous", "NORMAL")
            .with_context(what)?;
        check(&db).with_context(what)?;
        db.execute_batch(SCHEMA).with_context(what)?;
        let version: Option<i64> = db
            .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
                r.get(0)
            })
            .optional()
            .with_context(what)?;
        match version {
            None => {
                db.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema', ?1)",
                    [SCHEMA_VERSION],
                )
                .with_context(what)?;
            }
            Some(v) if v == SCHEMA_VERSION => {}
            Some(v) => anyhow::bail!(
                "{} was written by another version of myprobe (schema {v}, this one reads {SCHEMA_VERSION}): \
                 move it away",
                what()
            ),
        }
        Ok(Store {
            db,
            path: path.to_path_buf(),
            retention,
            servers: HashMap::new(),
            statements: HashMap::new(),
            last_retention: 0,
        })
    }

    /// Opens the store at `path` to read it, never making or changing it.
    pub fn open_read(path: &Path) -> Result<Connection> {
        anyhow::ensure!(
            path.exists(),
            "no history store at {} (the agent keeps one in its --dir; give its file with --store, or a \
             running agent with --agent)",
            path.display()
        );
        let db = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .with_context(|| format!("opening the history store {}", path.display()))?;
        db.busy_timeout(BUSY_WAIT)?;
        check(&db).with_context(|| format!("the history store {}", path.display()))?;
        Ok(db)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one second of one server, in one transaction, and its sums into its minute.
    pub fn write(&mut self, second: &Second) -> Result<()> {
        let server = self.server_id(&second.server)?;
        let tx = self.db.transaction()?;
        {
            // A second written again (an agent restarted within it) replaces its rows.
            let mut sample = tx.prepare_cached(
                "INSERT OR REPLACE INTO samples (ts, server, conn, user, host, db, statement, statement_ms, \
                 transaction_ms, state, object, blocker, root_blocker, holder_statements) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
            )?;
            let mut minute = tx.prepare_cached(
                "INSERT INTO minutes (minute, server, state, statement, user, host, root_blocker, samples) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
                 ON CONFLICT DO UPDATE SET samples = samples + excluded.samples",
            )?;
            // The second's active sessions counted by the minute's key first: a row written once for each.
            let mut counted: HashMap<(&str, i64, &str, &str, i64), i64> = HashMap::new();
            for s in &second.sessions {
                let statement = match (&s.fingerprint, &s.statement) {
                    (Some(f), Some(text)) => {
                        Some(statement_id(&tx, &mut self.statements, f, text, second.ts)?)
                    }
                    _ => None,
                };
                let holder_statements = (!s.holder_statements.is_empty())
                    .then(|| serde_json::to_string(&s.holder_statements))
                    .transpose()?;
                sample.execute(params![
                    second.ts,
                    server,
                    s.conn as i64,
                    s.user,
                    s.host,
                    s.db,
                    statement,
                    s.statement_s.map(|v| (v * 1000.0) as i64),
                    s.transaction_s.map(|v| (v * 1000.0) as i64),
                    s.state,
                    s.object,
                    s.blocker.map(|c| c as i64),
                    s.root_blocker.map(|c| c as i64),
                    holder_statements,
                ])?;
                if s.is_active() {
                    *counted
                        .entry((
                            &*s.state,
                            statement.unwrap_or(0),
                            s.user.as_deref().unwrap_or(""),
                            s.host.as_deref().unwrap_or(""),
                            s.root_blocker.map_or(0, |c| c as i64),
                        ))
                        .or_default() += 1;
                }
            }
            for ((state, statement, user, host, root_blocker), samples) in counted {
                minute.execute(params![
                    second.ts - second.ts.rem_euclid(60),
                    server,
                    state,
                    statement,
                    user,
                    host,
                    root_blocker,
                    samples,
                ])?;
            }
        }
        tx.commit()?;
        if second.ts - self.last_retention >= 60 {
            self.last_retention = second.ts;
            let retention = self.retention.clone();
            self.retain(second.ts, &retention)?;
        }
        Ok(())
    }

    /// Deletes what is past its age, then the oldest samples until the file is within its size.
    pub fn retain(&mut self, now: i64, r: &Retention) -> Result<()> {
        self.db
            .execute("DELETE FROM samples WHERE ts < ?1", [now - r.samples_s])?;
        self.db
            .execute("DELETE FROM minutes WHERE minute < ?1", [now - r.minutes_s])?;
        for _ in 0..20 {
            if self.bytes()? <= r.max_bytes {
                break;
            }
            // A tenth of the samples' span at a time, oldest first; then the oldest minutes.
            let span: Option<(i64, i64)> =
                self.db
                    .query_row("SELECT min(ts), max(ts) FROM samples", [], |row| {
                        Ok(row
                            .get::<_, Option<i64>>(0)?
                            .zip(row.get::<_, Option<i64>>(1)?))
                    })?;
            match span {
                Some((first, last)) if last > first => {
                    let cut = first + (last - first) / 10 + 1;
                    self.db
                        .execute("DELETE FROM samples WHERE ts < ?1", [cut])?;
                }
                _ => {
                    self.db.execute(
                        "DELETE FROM minutes WHERE minute <= (SELECT min(minute) FROM minutes)",
                        [],
                    )?;
                }
            }
            self.vacuum()?;
        }
        // The statements no sample or minute kept refers to: last seen before the oldest of them (their `last_ts`
        // is at most `STATEMENT_SEEN_EVERY` behind).
        self.db.execute(
            "DELETE FROM statements WHERE last_ts < min(\
             coalesce((SELECT min(ts) FROM samples), ?1), coalesce((SELECT min(minute) FROM minutes), ?1)) - ?2",
            [now, STATEMENT_SEEN_EVERY],
        )?;
        self.vacuum()?;
        // What was freed leaves the file once the log is written back into it.
        self.db
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        self.statements.clear();
        Ok(())
    }

    /// Gives the free pages back to the file system: the pragma frees a page at each step, run to its end.
    fn vacuum(&self) -> Result<()> {
        let mut q = self.db.prepare("PRAGMA incremental_vacuum")?;
        let mut rows = q.query([])?;
        while rows.next()?.is_some() {}
        Ok(())
    }

    /// The file's size in use, in bytes (its pages less those free).
    fn bytes(&self) -> Result<u64> {
        let pages: i64 = self.db.query_row("PRAGMA page_count", [], |r| r.get(0))?;
        let free: i64 = self
            .db
            .query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
        let size: i64 = self.db.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        Ok(((pages - free).max(0) * size) as u64)
    }

    fn server_id(&mut self, name: &str) -> Result<i64> {
        if let Some(&id) = self.servers.get(name) {
            return Ok(id);
        }
        self.db.execute(
            "INSERT INTO servers (name) VALUES (?1) ON CONFLICT DO NOTHING",
            [name],
        )?;
        let id = self
            .db
            .query_row("SELECT id FROM servers WHERE name = ?1", [name], |r| {
                r.get(0)
            })?;
        self.servers.insert(name.to_string(), id);
        Ok(id)
    }
}

/// The id of the statement of `fingerprint` (made with `text` if new), seen at `ts`: when it was last seen is
/// written at most once in `STATEMENT_SEEN_EVERY` seconds, with the second's samples, so that the retention knows
/// which statements nothing refers to without reading every sample.
fn statement_id(
    tx: &rusqlite::Transaction<'_>,
    known: &mut HashMap<String, (i64, i64)>,
    fingerprint: &str,
    text: &str,
    ts: i64,
) -> Result<i64> {
    if let Some(&(id, written)) = known.get(fingerprint) {
        if ts - written < STATEMENT_SEEN_EVERY {
            return Ok(id);
        }
    }
    tx.execute(
        "INSERT INTO statements (fingerprint, text, last_ts) VALUES (?1, ?2, ?3) \
         ON CONFLICT DO UPDATE SET last_ts = max(last_ts, excluded.last_ts)",
        params![fingerprint, text, ts],
    )?;
    let id = tx.query_row(
        "SELECT id FROM statements WHERE fingerprint = ?1",
        [fingerprint],
        |r| r.get(0),
    )?;
    if known.len() > 10_000 {
        known.clear();
    }
    known.insert(fingerprint.to_string(), (id, ts));
    Ok(id)
}

/// How often a statement's `last_ts` is written while it is seen, in seconds: less than the retention's step.
const STATEMENT_SEEN_EVERY: i64 = 30;

/// That the file is a SQLite database whose pages hold together (the header and the schema read; a file cut
/// short or overwritten fails here, not at the first write).
fn check(db: &Connection) -> Result<()> {
    let result: String = db
        .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
        .context("not a SQLite database, or corrupt")?;
    anyhow::ensure!(result == "ok", "corrupt: {result}");
    Ok(())
}

/// A sample as read back from a row of `samples` joined with its statement.
pub(super) fn sample_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<SessionSample> {
    let holder: Option<String> = row.get("holder_statements")?;
    Ok(SessionSample {
        conn: row.get::<_, i64>("conn")? as u64,
        user: row.get("user")?,
        host: row.get("host")?,
        db: row.get("db")?,
        statement: row.get("text")?,
        fingerprint: row.get("fingerprint")?,
        statement_s: row
            .get::<_, Option<i64>>("statement_ms")?
            .map(|v| v as f64 / 1000.0),
        transaction_s: row
            .get::<_, Option<i64>>("transaction_ms")?
            .map(|v| v as f64 / 1000.0),
        state: row.get("state")?,
        object: row.get("object")?,
        blocker: row.get::<_, Option<i64>>("blocker")?.map(|c| c as u64),
        root_blocker: row.get::<_, Option<i64>>("root_blocker")?.map(|c| c as u64),
        holder_statements: holder
            .and_then(|h| serde_json::from_str(&h).ok())
            .unwrap_or_default(),
    })
}
