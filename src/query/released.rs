//! Who let a lock wait go, however short: the server's thread that woke the waiter (queries.bpf.c's `on_waking`,
//! `WaitSlot::waker`). A lock's release grants it to its waiter and wakes it from the releasing thread (InnoDB's
//! `lock_grant` at the holder's COMMIT or ROLLBACK, a metadata or table lock's release), so that thread's connection
//! held what was waited for. The server's tables, read only for waits of `holders::LONG_WAIT` or more, name the
//! object too; this names the holder of the rest.

// Keyed by thread ids, which no client chooses: hashed the fast way.
use rustc_hash::FxHashMap as HashMap;

use super::{
    recent::Recent,
    record::{realtime_offset_ns, Holder, QueryRecord, Ran, Text},
};

/// The threads whose connection is kept; past it, all are forgotten (a server has as many as its connections).
const MAX_THREADS: usize = 100_000;

/// Each of the server's threads' connection and user, as its last statement's record gave them.
#[derive(Default)]
pub struct Releasers {
    threads: HashMap<u32, (u32, Option<Text>)>,
}

impl Releasers {
    /// Learns `record`'s thread's connection.
    pub fn see(&mut self, record: &QueryRecord) {
        let Some(conn) = record.conn else { return };
        if self.threads.len() >= MAX_THREADS && !self.threads.contains_key(&record.tid) {
            self.threads.clear();
        }
        self.threads.insert(record.tid, (conn, record.user.clone()));
    }

    /// Gives each lock wait of `record` the server did not name a holder: the connection whose thread woke it, with
    /// what its transaction had run by then where its statements were followed.
    pub fn name(&self, record: &mut QueryRecord, recent: &Recent) {
        // The record's own, which the times `recent` keeps were made with: a wait's release and the statement its
        // releaser ran just before are microseconds apart.
        let offset = match record.start_ns {
            0 => realtime_offset_ns(),
            start => record.ts.0 - i128::from(start),
        };
        for w in record
            .waits
            .iter_mut()
            .filter(|w| w.cause.has_holder() && w.holder.is_none())
        {
            let Some(&(_, tid, woken_ns)) = record.wakers.iter().find(|(c, ..)| *c == w.cause)
            else {
                continue;
            };
            let Some((conn, user)) = self.threads.get(&tid) else {
                continue;
            };
            if Some(*conn) == record.conn {
                continue;
            }
            let woken_at = (i128::from(woken_ns) + offset) as i64;
            let ran = recent
                .transaction_until(u64::from(*conn), woken_at)
                .into_iter()
                .rev()
                .map(|(at, text)| Ran::new(at, &text))
                .collect();
            w.holder = Some(Holder {
                conn: u64::from(*conn),
                user: user.as_ref().map(|u| u.to_string()),
                released: true,
                ran,
                seen_at_ns: woken_at,
                ..Holder::default()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{query::recent::SECOND_NS, query::CauseWait, server::Cause};

    #[test]
    fn a_wait_s_holder_is_the_connection_that_woke_it_with_what_it_had_run() {
        let recent = Recent::default();
        for (i, text) in ["BEGIN", "UPDATE t SET v = v + 1 WHERE id = 1", "COMMIT"]
            .into_iter()
            .enumerate()
        {
            recent.add(42, text, (100 + i as i64) * SECOND_NS);
        }
        let mut releasers = Releasers::default();
        releasers.see(&QueryRecord {
            tid: 7,
            conn: Some(42),
            user: Some("app".into()),
            ..QueryRecord::default()
        });
        let row_lock = CauseWait {
            cause: Cause::RowLock,
            us: 30_000,
            site: None,
            object: None,
            holder: None,
        };
        // Woken by thread 7 during its COMMIT: its transaction had run the UPDATE, after its BEGIN. (The record's
        // clocks alike: the monotonic clock is the epoch's.)
        let mut waiter = QueryRecord {
            ts: crate::query::Timestamp(1),
            start_ns: 1,
            tid: 8,
            conn: Some(43),
            waits: vec![row_lock.clone()],
            wakers: vec![(Cause::RowLock, 7, (101 * SECOND_NS + 5) as u64)],
            ..QueryRecord::default()
        };
        releasers.name(&mut waiter, &recent);
        let h = waiter.waits[0].holder.as_ref().expect("a holder");
        assert_eq!((h.conn, h.released), (42, true));
        assert_eq!(
            h.describe(),
            "connection 42 (app), which let it go; its transaction ran, newest first: \
             UPDATE t SET v = v + ? WHERE id = ? (ended 00:01:41), BEGIN (ended 00:01:40)"
        );
        // A waker that is no connection's thread, or the waiter's own, names none.
        for tid in [9, 8] {
            let mut other = QueryRecord {
                tid: 8,
                conn: Some(43),
                waits: vec![row_lock.clone()],
                wakers: vec![(Cause::RowLock, tid, 0)],
                ..QueryRecord::default()
            };
            releasers.see(&other.clone());
            releasers.name(&mut other, &recent);
            assert_eq!(other.waits[0].holder, None);
        }
    }
}
