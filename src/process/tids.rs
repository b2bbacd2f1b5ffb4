//! Thread ids across PID namespaces. A server in a container reports its threads by its own namespace's ids
//! (MariaDB's PROCESSLIST `TID`, MySQL's `THREAD_OS_ID`), while BPF and /proc give the host's; each thread's
//! `NSpid` line in /proc (the ids from this namespace down to the thread's own) joins the two.

use std::{
    collections::HashMap,
    fs,
    time::{Duration, Instant},
};

/// A server's threads: its namespace's id → the host's (this namespace's).
#[derive(Debug)]
pub struct TidMap {
    pid: u32,
    to_host: HashMap<u32, u32>,
    /// The server shares this PID namespace: its ids are the host's.
    same_namespace: bool,
    read_at: Option<Instant>,
}

/// How often the threads are read again for an id not known (a connection made since).
const REREAD_AFTER: Duration = Duration::from_millis(50);

impl TidMap {
    pub fn new(pid: u32) -> TidMap {
        let mut map = TidMap {
            pid,
            to_host: HashMap::new(),
            same_namespace: true,
            read_at: None,
        };
        map.read();
        map
    }

    /// Whether the server runs in a PID namespace of its own (below this one).
    pub fn namespaced(&self) -> bool {
        !self.same_namespace
    }

    /// The host's id of the thread the server calls `tid`; None when no thread of the server has that id (it
    /// ended, or the id is not a thread's).
    pub fn host(&mut self, tid: u32) -> Option<u32> {
        if self.same_namespace {
            return Some(tid);
        }
        if let Some(&host) = self.to_host.get(&tid) {
            return Some(host);
        }
        if self.read_at.is_none_or(|t| t.elapsed() >= REREAD_AFTER) {
            self.read();
        }
        self.to_host.get(&tid).copied()
    }

    fn read(&mut self) {
        self.read_at = Some(Instant::now());
        let Ok(tasks) = fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return;
        };
        self.to_host.clear();
        for task in tasks.flatten() {
            let path = task.path().join("status");
            let Some(ids) = fs::read_to_string(path).ok().as_deref().and_then(ns_pids) else {
                continue;
            };
            if let (Some(&host), Some(&own)) = (ids.first(), ids.last()) {
                self.to_host.insert(own, host);
                self.same_namespace = ids.len() == 1;
            }
        }
    }
}

/// The ids of a /proc status file's `NSpid:` line, this namespace's first.
pub fn ns_pids(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let ids: Option<Vec<u32>> = line.split_whitespace().map(|id| id.parse().ok()).collect();
    ids.filter(|ids| !ids.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_lines_give_each_namespace_id() {
        assert_eq!(
            ns_pids("Name:\tx\nNSpid:\t19807\t10\nNSpgid:\t1\n"),
            Some(vec![19807, 10])
        );
        assert_eq!(ns_pids("NSpid:\t42\n"), Some(vec![42]));
        assert_eq!(ns_pids("NSpid:\t4x2\n"), None);
        assert_eq!(ns_pids("NSpid:\n"), None);
        assert_eq!(ns_pids("Name:\tx\n"), None);
    }

    #[test]
    fn this_process_shares_this_namespace() {
        let me = std::process::id();
        let mut map = TidMap::new(me);
        assert!(!map.namespaced());
        assert_eq!(map.host(me), Some(me));
    }
}
