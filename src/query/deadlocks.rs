//! Deadlocks and lock wait timeouts in words. A statement that ends with error 1213 was rolled back in a deadlock:
//! the other side is read from the server's latest deadlock, which InnoDB writes (every server: MariaDB's and
//! MySQL's `lock_latest_err_file`, SHOW ENGINE INNODB STATUS's LATEST DETECTED DEADLOCK) to a deleted temporary
//! file through a C stdio stream. Its unflushed part is in the stream's buffer, and the streams are glibc's list
//! (`_IO_list_all`): read from the server's memory, it needs no symbol of the server's, no login, and no query that
//! takes InnoDB's lock system. A statement that ends with error 1205 timed out waiting for a lock: its longest
//! wait for a lock another connection holds is named so.

use std::{fs, os::unix::fs::FileExt};

use anyhow::{Context, Result};

use super::record::{CauseWait, Holder, QueryRecord};
use crate::{
    process::{
        maps::ProcMaps,
        memory::{self, Memory, ProcMemory},
    },
    server::Cause,
};

/// ER_LOCK_DEADLOCK and ER_LOCK_WAIT_TIMEOUT, the same on MariaDB and MySQL.
pub const DEADLOCK: u16 = 1213;
pub const LOCK_WAIT_TIMEOUT: u16 = 1205;

/// A deadlock InnoDB resolved, as it wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deadlock {
    /// When, in the server's words (`2026-12-07 11:33:12`).
    pub at: String,
    /// The transactions of the cycle, in its order: each waits for a lock the next holds, the last for the first's.
    pub transactions: Vec<Transaction>,
    /// Which of them was rolled back.
    pub rolled_back: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transaction {
    /// Its connection (the server's thread id).
    pub conn: u64,
    /// How long it had been open, in seconds (`ACTIVE 2 sec`).
    pub active_s: Option<u64>,
    /// The statement it was running.
    pub query: Option<String>,
    /// The lock it waited for: `dl.t (PRIMARY, X,REC_NOT_GAP)`, and whether a row's or a table's.
    pub waits_for: Option<(Cause, String)>,
}

impl Deadlock {
    /// The transaction rolled back, and the one holding the lock it waited for.
    pub fn sides(&self) -> Option<(&Transaction, &Transaction)> {
        let n = self.transactions.len();
        let victim = self.transactions.get(self.rolled_back)?;
        let other = self.transactions.get((self.rolled_back + 1) % n.max(1))?;
        (n > 1).then_some((victim, other))
    }
}

/// Names a statement that ended in a deadlock or a lock wait timeout: its cause, and for a deadlock the lock and
/// the other side, where `latest` (the server's latest deadlock) is the one that rolled it back.
pub fn name(record: &mut QueryRecord, latest: Option<&Deadlock>) {
    let cause = match record.error {
        Some(DEADLOCK) => Cause::Deadlock,
        Some(LOCK_WAIT_TIMEOUT) => Cause::LockWaitTimeout,
        _ => return,
    };
    // The wait that ended in the error: its longest for a lock another connection holds.
    let at = record
        .waits
        .iter()
        .enumerate()
        .filter(|(_, w)| w.cause.has_holder())
        .max_by_key(|(_, w)| w.us)
        .map(|(i, _)| i);
    // First of its waits, whatever its length: what the statement ended in.
    match at {
        Some(i) => record.waits[..=i].rotate_right(1),
        None => record.waits.insert(
            0,
            CauseWait {
                cause,
                us: 0,
                site: None,
                object: None,
                holder: None,
            },
        ),
    }
    let ended = record.ended_ns();
    let wait = &mut record.waits[0];
    wait.cause = cause;
    record.cause = Some(cause);
    let sides = latest
        .filter(|_| cause == Cause::Deadlock)
        .and_then(Deadlock::sides);
    let Some((victim, other)) = sides.filter(|(v, _)| record.conn.map(u64::from) == Some(v.conn))
    else {
        // The other side is the deadlock's alone: a holder the server's lock tables listed while this one waited
        // was read a moment later, running what came after (its COMMIT).
        if cause == Cause::Deadlock {
            wait.holder = None;
        }
        return;
    };
    if let Some((_, object)) = &victim.waits_for {
        wait.object = Some(object.clone());
    }
    wait.holder = Some(Holder {
        conn: other.conn,
        command: Some("Query".into()),
        transaction_s: other.active_s,
        statement: other.query.clone(),
        // Waiting still when this statement was rolled back: what it ran up to then.
        seen_at_ns: ended,
        ..Holder::default()
    });
}

/// Names the statements that end in a deadlock or a lock wait timeout; the server's memory is read from the first
/// deadlock on (one that cannot be is said once, and its deadlocks are named without their other side).
pub struct Deadlocks {
    pid: u32,
    latest: Option<Option<LatestDeadlock>>,
}

impl Deadlocks {
    pub fn new(pid: u32) -> Deadlocks {
        Deadlocks { pid, latest: None }
    }

    pub fn name(&mut self, record: &mut QueryRecord) {
        let latest = match record.error {
            Some(DEADLOCK) => {
                let pid = self.pid;
                let reader = self.latest.get_or_insert_with(|| {
                    LatestDeadlock::open(pid)
                        .map_err(|e| {
                            say!(
                                "myprobe: note: the other side of each deadlock is not read from the server's \
                                 memory: {e:#}"
                            )
                        })
                        .ok()
                });
                reader.as_mut().and_then(LatestDeadlock::read)
            }
            Some(LOCK_WAIT_TIMEOUT) => None,
            _ => return,
        };
        name(record, latest.as_ref());
    }
}

/// The server's latest deadlock, read from its memory.
pub struct LatestDeadlock {
    pid: u32,
    mem: ProcMemory,
    /// Where glibc's `_IO_list_all` is in the process.
    list: u64,
    /// The stream found to hold a deadlock, once one was.
    stream: Option<u64>,
}

/// glibc's `struct _IO_FILE` on x86-64 and aarch64 (its ABI since 2.1): the fields read, by offset.
mod stream {
    pub const SIZE: usize = 120;
    pub const FLAGS: usize = 0;
    pub const READ_PTR: usize = 8;
    pub const READ_END: usize = 16;
    pub const WRITE_BASE: usize = 32;
    pub const WRITE_PTR: usize = 40;
    pub const CHAIN: usize = 104;
    pub const FILENO: usize = 112;
    /// `_IO_MAGIC` in the high half of the flags; `_IO_CURRENTLY_PUTTING`: the buffer holds writes.
    pub const MAGIC_MASK: u32 = 0xFFFF_0000;
    pub const MAGIC: u32 = 0xFBAD_0000;
    pub const PUTTING: u32 = 0x800;
}

/// A report longer than this is not a deadlock's (InnoDB prints a few KB), and is not read.
const MAX_TEXT: u64 = 256 * 1024;
/// The streams a server has open are a handful: a list longer than this is not walked further.
const MAX_STREAMS: usize = 256;

impl LatestDeadlock {
    /// The reader of process `pid`'s latest deadlock; an error names what could not be found (a server not on
    /// glibc).
    pub fn open(pid: u32) -> Result<LatestDeadlock> {
        let maps = ProcMaps::read(pid)?;
        let libc = maps
            .files_in_address_order()
            .into_iter()
            .find(|f| f.basename.starts_with("libc.so") || f.basename.starts_with("libc-"))
            .context("the server does not map glibc's libc.so")?;
        let file = fs::File::open(&libc.open_path)
            .with_context(|| format!("opening {}", libc.open_path.display()))?;
        let mapped = memory::mapped_start(pid, &file).context("finding where libc is mapped")?;
        let list = memory::symbol_addresses(&file, mapped, &["_IO_list_all"])?[0]
            .context("libc defines no _IO_list_all")?;
        Ok(LatestDeadlock {
            pid,
            mem: ProcMemory::open(pid)?,
            list,
            stream: None,
        })
    }

    /// The latest deadlock the server keeps, if it has one and it reads whole.
    pub fn read(&mut self) -> Option<Deadlock> {
        if let Some(d) = self.stream.and_then(|s| self.read_stream(s)) {
            return Some(d);
        }
        // Before the first deadlock no stream holds one; a server restarted has others.
        self.stream = None;
        let mut at = self.mem.u64_at(self.list)?;
        for _ in 0..MAX_STREAMS {
            if at == 0 {
                break;
            }
            if let Some(d) = self.read_stream(at) {
                self.stream = Some(at);
                return Some(d);
            }
            at = self.mem.u64_at(at + stream::CHAIN as u64)?;
        }
        None
    }

    /// The deadlock stream `at` holds, read twice: the server may rewrite it while it is read (each deadlock of a
    /// storm as long as the one before), and a text read half before and half after is no deadlock's.
    fn read_stream(&self, at: u64) -> Option<Deadlock> {
        let text = self.read_text(at)?;
        let deadlock = parse(&String::from_utf8_lossy(&text))?;
        (self.read_text(at)? == text).then_some(deadlock)
    }

    /// The text of stream `at`: the part written to its file, then what its buffer holds yet.
    fn read_text(&self, at: u64) -> Option<Vec<u8>> {
        let f = self.mem.bytes(at, stream::SIZE)?;
        let word = |o: usize| u64::from_le_bytes(f[o..o + 8].try_into().expect("8 bytes"));
        let flags = u32::from_le_bytes(f[stream::FLAGS..4].try_into().expect("4 bytes"));
        let fd = i32::from_le_bytes(f[stream::FILENO..stream::FILENO + 4].try_into().ok()?);
        if flags & stream::MAGIC_MASK != stream::MAGIC || fd < 0 {
            return None;
        }
        let path = format!("/proc/{}/fd/{fd}", self.pid);
        // InnoDB's temporary files are deleted at once: a named file is another stream's (the error log).
        if !fs::read_link(&path)
            .ok()?
            .to_string_lossy()
            .ends_with(" (deleted)")
        {
            return None;
        }
        let pos = fd_position(self.pid, fd)?;
        let (flushed, pending) = if flags & stream::PUTTING != 0 {
            let (base, ptr) = (word(stream::WRITE_BASE), word(stream::WRITE_PTR));
            (pos, ptr.checked_sub(base).filter(|&n| n <= MAX_TEXT)?)
        } else {
            // Read back (SHOW ENGINE INNODB STATUS copies it): the text ends where the stream's position is.
            let unread = word(stream::READ_END).checked_sub(word(stream::READ_PTR))?;
            (pos.checked_sub(unread)?, 0)
        };
        if flushed + pending > MAX_TEXT || flushed + pending == 0 {
            return None;
        }
        let mut text = vec![0u8; flushed as usize];
        fs::File::open(&path)
            .ok()?
            .read_exact_at(&mut text, 0)
            .ok()?;
        if pending > 0 {
            text.extend(self.mem.bytes(word(stream::WRITE_BASE), pending as usize)?);
        }
        Some(text)
    }
}

/// The file position of process `pid`'s descriptor `fd`.
fn fd_position(pid: u32, fd: i32) -> Option<u64> {
    let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("pos:"))?
        .trim()
        .parse()
        .ok()
}

/// A deadlock as InnoDB writes it (lock0lock.cc: a timestamp, then `*** (N) TRANSACTION:` sections, each with its
/// `thread id`, its statement and the lock it waits for, then `*** WE ROLL BACK TRANSACTION (N)`); `None` for any
/// other text, or one cut short (read while the server rewrote it).
pub fn parse(text: &str) -> Option<Deadlock> {
    let mut lines = text.lines();
    let first = lines.next()?;
    let at = first.get(..19).filter(|t| t.as_bytes()[4] == b'-')?;
    let mut transactions: Vec<Transaction> = Vec::new();
    let mut rolled_back = None;
    let mut in_query = false;
    let mut wanted_next = false;
    for line in lines {
        if let Some(n) = line.strip_prefix("*** WE ROLL BACK TRANSACTION (") {
            rolled_back = n.trim_end_matches(')').parse::<usize>().ok();
            break;
        }
        if line.starts_with("*** (") && line.ends_with(") TRANSACTION:") {
            transactions.push(Transaction {
                conn: 0,
                active_s: None,
                query: None,
                waits_for: None,
            });
            in_query = false;
            continue;
        }
        // Text before the first transaction is no deadlock's.
        let t = transactions.last_mut()?;
        if line.starts_with("***") {
            in_query = false;
            wanted_next = line.ends_with("WAITING FOR THIS LOCK TO BE GRANTED:");
            continue;
        }
        if wanted_next {
            wanted_next = false;
            t.waits_for = wanted_lock(line);
        } else if let Some((_, active)) = line
            .split_once(", ACTIVE ")
            .filter(|(head, _)| head.starts_with("TRANSACTION "))
        {
            t.active_s = active.split(' ').next().and_then(|n| n.parse().ok());
        } else if let Some((_, rest)) = line.split_once(" thread id ").filter(|_| t.conn == 0) {
            t.conn = rest.split(',').next()?.trim().parse().ok()?;
            in_query = true;
        } else if in_query && !line.is_empty() {
            let q = t.query.get_or_insert_with(String::new);
            if !q.is_empty() {
                q.push('\n');
            }
            q.push_str(line);
        } else {
            in_query = false;
        }
    }
    let rolled_back = rolled_back?.checked_sub(1)?;
    // Each connection once: a text read as the server rewrote it can join two deadlocks' halves.
    let mut conns: Vec<u64> = transactions.iter().map(|t| t.conn).collect();
    conns.sort_unstable();
    conns.dedup();
    let whole = conns.len() == transactions.len() && conns.first().is_some_and(|&c| c != 0);
    (rolled_back < transactions.len() && whole).then(|| Deadlock {
        at: at.to_string(),
        transactions,
        rolled_back,
    })
}

/// The lock a `RECORD LOCKS … index I of table `db`.`t` trx id N lock_mode X locks rec but not gap waiting` or
/// `TABLE LOCK table `db`.`t` trx id N lock mode IX waiting` line asks for, in performance_schema's words:
/// `db.t (I, X,REC_NOT_GAP)`, `db.t (IX)`.
fn wanted_lock(line: &str) -> Option<(Cause, String)> {
    let table = |s: &str| -> Option<String> {
        let name = s.split(" trx id ").next()?;
        Some(name.replace('`', ""))
    };
    let mode = {
        let (_, m) = line
            .split_once("lock_mode ")
            .or_else(|| line.split_once("lock mode "))?;
        let mut mode = m.split(' ').next()?.to_string();
        for (words, flag) in [
            ("locks gap before rec", ",GAP"),
            ("locks rec but not gap", ",REC_NOT_GAP"),
            ("insert intention", ",INSERT_INTENTION"),
        ] {
            if m.contains(words) {
                mode.push_str(flag);
            }
        }
        mode
    };
    if let Some(rest) = line.strip_prefix("RECORD LOCKS ") {
        let (_, rest) = rest.split_once(" index ")?;
        let (index, rest) = rest.split_once(" of table ")?;
        Some((
            Cause::RowLock,
            format!("{} ({}, {mode})", table(rest)?, index.replace('`', "")),
        ))
    } else {
        let rest = line.strip_prefix("TABLE LOCK table ")?;
        Some((Cause::InnodbTableLock, format!("{} ({mode})", table(rest)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As MariaDB 10.11 wrote it (the record dumps shortened).
    const MARIADB: &str = "2026-12-07 11:33:12 0x7fbbe9ccf6c0
*** (1) TRANSACTION:
TRANSACTION 24, ACTIVE 1 sec starting index read
mysql tables in use 1, locked 1
LOCK WAIT 3 lock struct(s), heap size 1128, 2 row lock(s), undo log entries 1
MariaDB thread id 7, OS thread handle 140445058135744, query id 24 localhost root Updating
update t set v=v+1 where id=1
*** WAITING FOR THIS LOCK TO BE GRANTED:
RECORD LOCKS space id 5 page no 3 n bits 320 index PRIMARY of table `dl`.`t` trx id 24 lock_mode X locks rec but not gap waiting
Record lock, heap no 2 PHYSICAL RECORD: n_fields 4; compact format; info bits 0
 0: len 4; hex 80000001; asc     ;;

*** CONFLICTING WITH:
RECORD LOCKS space id 5 page no 3 n bits 320 index PRIMARY of table `dl`.`t` trx id 23 lock_mode X locks rec but not gap
Record lock, heap no 2 PHYSICAL RECORD: n_fields 4; compact format; info bits 0


*** (2) TRANSACTION:
TRANSACTION 23, ACTIVE 2 sec starting index read
mysql tables in use 1, locked 1
LOCK WAIT 3 lock struct(s), heap size 1128, 2 row lock(s), undo log entries 1
MariaDB thread id 6, OS thread handle 140445058442944, query id 23 localhost root Updating
update t set v=v+1
 where id=2
*** WAITING FOR THIS LOCK TO BE GRANTED:
RECORD LOCKS space id 5 page no 3 n bits 320 index PRIMARY of table `dl`.`t` trx id 23 lock_mode X locks rec but not gap waiting
Record lock, heap no 3 PHYSICAL RECORD: n_fields 4; compact format; info bits 0

*** CONFLICTING WITH:
RECORD LOCKS space id 5 page no 3 n bits 320 index PRIMARY of table `dl`.`t` trx id 24 lock_mode X locks rec but not gap

*** WE ROLL BACK TRANSACTION (1)
";

    /// As MySQL 9.7 wrote it: a blank line after the statement, the locks held before the one waited for.
    const MYSQL: &str = "2026-12-07 11:34:42 139920066283200
*** (1) TRANSACTION:
TRANSACTION 1580, ACTIVE 2 sec starting index read
mysql tables in use 1, locked 1
LOCK WAIT 3 lock struct(s), heap size 1128, 2 row lock(s), undo log entries 1
MySQL thread id 12, OS thread handle 139919980242624, query id 26 localhost root updating
update t set v=v+1 where id=2

*** (1) HOLDS THE LOCK(S):
RECORD LOCKS space id 2 page no 4 n bits 72 index PRIMARY of table `dl`.`t` trx id 1580 lock_mode X locks rec but not gap
Record lock, heap no 2 PHYSICAL RECORD: n_fields 4; compact format; info bits 0


*** (1) WAITING FOR THIS LOCK TO BE GRANTED:
RECORD LOCKS space id 2 page no 4 n bits 72 index PRIMARY of table `dl`.`t` trx id 1580 lock_mode X locks rec but not gap waiting
Record lock, heap no 3 PHYSICAL RECORD: n_fields 4; compact format; info bits 0


*** (2) TRANSACTION:
TRANSACTION 1582, ACTIVE 1 sec starting index read
mysql tables in use 1, locked 1
LOCK WAIT 3 lock struct(s), heap size 1128, 2 row lock(s), undo log entries 1
MySQL thread id 13, OS thread handle 139919979185856, query id 27 localhost root updating
update t set v=v+1 where id=1

*** (2) HOLDS THE LOCK(S):
RECORD LOCKS space id 2 page no 4 n bits 72 index PRIMARY of table `dl`.`t` trx id 1582 lock_mode X locks rec but not gap
Record lock, heap no 3 PHYSICAL RECORD: n_fields 4; compact format; info bits 0


*** (2) WAITING FOR THIS LOCK TO BE GRANTED:
TABLE LOCK table `dl`.`t` trx id 1582 lock mode AUTO-INC waiting

*** WE ROLL BACK TRANSACTION (2)
";

    #[test]
    fn both_servers_deadlocks_are_read_with_their_sides() {
        let d = parse(MARIADB).expect("MariaDB's");
        assert_eq!(d.at, "2026-12-07 11:33:12");
        let (victim, other) = d.sides().expect("two sides");
        assert_eq!((victim.conn, other.conn), (7, 6));
        assert_eq!((victim.active_s, other.active_s), (Some(1), Some(2)));
        assert_eq!(
            victim.query.as_deref(),
            Some("update t set v=v+1 where id=1")
        );
        assert_eq!(
            other.query.as_deref(),
            Some("update t set v=v+1\n where id=2")
        );
        assert_eq!(
            victim.waits_for,
            Some((Cause::RowLock, "dl.t (PRIMARY, X,REC_NOT_GAP)".into()))
        );
        let d = parse(MYSQL).expect("MySQL's");
        let (victim, other) = d.sides().expect("two sides");
        assert_eq!((victim.conn, other.conn), (13, 12));
        assert_eq!(
            victim.query.as_deref(),
            Some("update t set v=v+1 where id=1")
        );
        assert_eq!(
            victim.waits_for,
            Some((Cause::InnodbTableLock, "dl.t (AUTO-INC)".into()))
        );
    }

    #[test]
    fn a_text_cut_short_or_of_another_kind_is_no_deadlock() {
        let cut = &MARIADB[..MARIADB.find("*** WE ROLL").expect("in it")];
        assert_eq!(parse(cut), None);
        assert_eq!(parse(""), None);
        assert_eq!(parse("\n=====================================\n"), None);
        assert_eq!(parse(&MYSQL.replace("thread id 13", "thread id x")), None);
        // Halves of two deadlocks of the same two connections, read as the server rewrote the text.
        assert_eq!(parse(&MYSQL.replace("thread id 13", "thread id 12")), None);
    }

    #[test]
    fn a_victim_is_named_with_the_other_side_only_by_its_own_deadlock() {
        let d = parse(MARIADB).expect("MariaDB's");
        let victim = |conn: u32, error: u16| QueryRecord {
            conn: Some(conn),
            error: Some(error),
            waits: vec![CauseWait {
                cause: Cause::RowLock,
                us: 300,
                site: None,
                object: None,
                holder: None,
            }],
            ..QueryRecord::default()
        };
        let mut r = victim(7, DEADLOCK);
        name(&mut r, Some(&d));
        assert_eq!(r.cause, Some(Cause::Deadlock));
        assert_eq!(
            r.waits[0].phrase(),
            "is rolled back in a deadlock over a lock on dl.t (PRIMARY, X,REC_NOT_GAP) held by connection 6, \
             running: update t set v=v+? where id=?"
        );
        // Another connection's deadlock (the server's latest was a later one): no other side is made up, nor
        // taken from the lock tables.
        let mut r = victim(9, DEADLOCK);
        r.waits[0].holder = Some(Holder {
            conn: 6,
            command: Some("Query".into()),
            statement: Some("COMMIT".into()),
            ..Holder::default()
        });
        name(&mut r, Some(&d));
        assert_eq!(
            (r.cause, r.waits[0].holder.is_none()),
            (Some(Cause::Deadlock), true)
        );
        let mut r = victim(7, LOCK_WAIT_TIMEOUT);
        name(&mut r, Some(&d));
        assert_eq!(r.cause, Some(Cause::LockWaitTimeout));
        assert_eq!((r.waits[0].us, r.waits[0].holder.is_none()), (300, true));
        let mut r = victim(7, 1062);
        name(&mut r, Some(&d));
        assert_eq!(r.waits[0].cause, Cause::RowLock);
    }
}
