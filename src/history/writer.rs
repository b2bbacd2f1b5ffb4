//! The store the agent's samplers write to. A store that cannot be written (a full disk, another process holding
//! it, a corrupt file) is said in one line and the agent goes on without history, trying again each minute.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::{
    store::{Retention, Store},
    Second,
};

/// How long after a failure the store is opened again.
const RETRY: Duration = Duration::from_secs(60);

/// The store the agent's samplers write to, while it can.
pub struct Writer {
    path: PathBuf,
    retention: Retention,
    store: Option<Store>,
    /// When to try again, after a failure (said once, until the store works again).
    retry_at: Option<Instant>,
}

impl Writer {
    /// Opens the store at `path`; one that cannot be opened is said, and tried again later.
    pub fn open(path: &Path, retention: Retention) -> Writer {
        let mut w = Writer {
            path: path.to_path_buf(),
            retention,
            store: None,
            retry_at: None,
        };
        w.reopen();
        w
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn reopen(&mut self) {
        match Store::open(&self.path, self.retention.clone()) {
            Ok(s) => {
                if self.retry_at.take().is_some() {
                    say!(
                        "myprobe: agent: the history is kept again in {}",
                        self.path.display()
                    );
                }
                self.store = Some(s);
            }
            Err(e) => self.failed(&e),
        }
    }

    fn failed(&mut self, e: &anyhow::Error) {
        if self.retry_at.is_none() {
            say!(
                "myprobe: agent: warning: no session history is kept: {e:#} (the agent goes on; tried again each \
                 minute)"
            );
        }
        self.store = None;
        self.retry_at = Some(Instant::now() + RETRY);
    }

    /// Writes a second, if the store works (or works again).
    pub fn write(&mut self, second: &Second) {
        if self.store.is_none() && self.retry_at.is_some_and(|at| Instant::now() >= at) {
            self.reopen();
        }
        if let Some(store) = self.store.as_mut() {
            if let Err(e) = store.write(second) {
                let e = e.context(format!("writing to {}", self.path.display()));
                self.failed(&e);
            }
        }
    }
}
