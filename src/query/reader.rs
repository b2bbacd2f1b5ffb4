//! A thread of its own that reads the server for the statements' pipeline, so that the pipeline never waits for
//! the server ([`Reader`]): asked through one channel, it answers through another. The texts' reader
//! (text_reader.rs) and the holders' (holders.rs) are both one; what they share besides with the pipeline is the
//! set of the run's own connections ([`OwnConnections`]), each registered as it is opened.

use std::{
    sync::{
        mpsc::{self, RecvTimeoutError, TryRecvError},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use crate::client::{self, Client, ConnectArgs};

/// The pipeline's end of a reader thread: what it asks goes to the thread, what the thread found comes back.
/// Dropped, the thread ends at its next wait for asks, unwaited for; [`Reader::stop`] waits for it.
pub struct Reader<Ask, Found> {
    asks: Option<mpsc::Sender<Ask>>,
    found: mpsc::Receiver<Found>,
    thread: Option<JoinHandle<()>>,
}

/// The thread's end: the asks as they come, and where what it found goes.
pub struct Asked<Ask, Found> {
    asks: mpsc::Receiver<Ask>,
    found: mpsc::Sender<Found>,
}

/// The pipeline ended (its end dropped, or the reader stopped): the thread is to return.
#[derive(Debug)]
pub struct Ended;

impl<Ask: Send + 'static, Found: Send + 'static> Reader<Ask, Found> {
    /// Runs `read` in a thread of its own named `name`, given the thread's end.
    pub fn spawn(
        name: &str,
        read: impl FnOnce(Asked<Ask, Found>) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (ask, asks) = mpsc::channel();
        let (send, found) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(name.into())
            .spawn(move || read(Asked { asks, found: send }))?;
        Ok(Reader {
            asks: Some(ask),
            found,
            thread: Some(thread),
        })
    }
}

impl<Ask, Found> Reader<Ask, Found> {
    /// Asks the thread; nothing once it returned (a failure it sent, or stopped).
    pub fn ask(&self, ask: Ask) {
        if let Some(asks) = &self.asks {
            let _ = asks.send(ask);
        }
    }

    /// What the thread found since last taken, without waiting.
    pub fn found(&self) -> mpsc::TryIter<'_, Found> {
        self.found.try_iter()
    }

    /// Ends the thread and waits for it: it returns at its next wait for asks, after the read under way. What it
    /// found before is still there to take.
    pub fn stop(&mut self) {
        self.asks = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<Ask, Found> Asked<Ask, Found> {
    /// Sends what was found; false once the pipeline takes nothing more.
    pub fn send(&self, found: Found) -> bool {
        self.found.send(found).is_ok()
    }

    /// The next ask, waited for.
    pub fn next(&self) -> Result<Ask, Ended> {
        self.asks.recv().map_err(|_| Ended)
    }

    /// Every ask come since, each given to `take`, without waiting; whether one of them wakes the reader (as
    /// `take` says).
    pub fn take(&self, mut take: impl FnMut(Ask) -> bool) -> Result<bool, Ended> {
        let mut woken = false;
        loop {
            match self.asks.try_recv() {
                Ok(ask) => woken |= take(ask),
                Err(TryRecvError::Empty) => return Ok(woken),
                Err(TryRecvError::Disconnected) => return Err(Ended),
            }
        }
    }

    /// Waits `timeout`, or until an ask wakes the reader (as `take`, given each ask as it comes, says).
    pub fn wait(&self, timeout: Duration, mut take: impl FnMut(Ask) -> bool) -> Result<(), Ended> {
        let deadline = Instant::now() + timeout;
        loop {
            match self
                .asks
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(ask) => {
                    if take(ask) {
                        return Ok(());
                    }
                }
                Err(RecvTimeoutError::Timeout) => return Ok(()),
                Err(RecvTimeoutError::Disconnected) => return Err(Ended),
            }
        }
    }
}

/// The connections a run opened to the server it traces: their statements are the run's own, not the server's
/// load. Made by the run (`follow`), cloned into each reader that connects, asked of each record.
#[derive(Clone, Debug, Default)]
pub struct OwnConnections(Arc<Mutex<Vec<u64>>>);

impl OwnConnections {
    /// Connects to the server `pid` as `args` (`client::connect`), the connection counted as the run's own from
    /// before its first statement.
    pub fn connect(&self, args: &ConnectArgs, pid: u32) -> anyhow::Result<Client> {
        let client = client::connect(args, Some(pid))?;
        if let Ok(mut own) = self.0.lock() {
            // A run opens a few; a reader that connects again and again stays bounded.
            if own.len() >= 64 {
                own.remove(0);
            }
            own.push(client.connection_id());
        }
        Ok(client)
    }

    /// Whether the server's connection `id` is one the run opened.
    pub fn contains(&self, id: u64) -> bool {
        self.0.lock().is_ok_and(|own| own.contains(&id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_go_one_way_and_what_was_found_the_other_until_stopped() {
        let mut reader = Reader::spawn("myprobe-test", |asked: Asked<u32, u32>| {
            while let Ok(n) = asked.next() {
                // Asks come in order; those queued meanwhile are taken at once.
                let mut last = n;
                let _ = asked.take(|m| {
                    last = m;
                    false
                });
                if !asked.send(last * 10) {
                    return;
                }
            }
        })
        .unwrap();
        reader.ask(1);
        let first = loop {
            if let Some(f) = reader.found().next() {
                break f;
            }
            thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(first, 10);
        reader.stop();
        reader.ask(2); // the thread ended: nothing
        assert_eq!(reader.found().count(), 0);
    }

    #[test]
    fn a_wait_ends_early_only_for_an_ask_that_wakes() {
        let (ask, asks) = mpsc::channel();
        let (found, _found) = mpsc::channel::<()>();
        let asked = Asked { asks, found };
        ask.send(false).unwrap();
        let started = Instant::now();
        asked
            .wait(Duration::from_millis(50), |wakes| wakes)
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(50));
        ask.send(true).unwrap();
        let started = Instant::now();
        asked.wait(Duration::from_secs(10), |wakes| wakes).unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(ask);
        assert!(asked.wait(Duration::from_secs(10), |_| true).is_err());
        assert!(asked.take(|_| true).is_err());
    }
}
