//! Tracing for one period in N: probes attached for a period, then detached for the rest of the cycle, and what
//! they found scaled up by the time traced over the time probed. memleak samples its allocation functions so
//! (100 ms in N); the agent its off-CPU, lock and statement collectors (`Duty`, 1 s in N), whose in-kernel cost
//! is then paid for that share of the time only.

use std::time::{Duration, Instant};

/// Collectors probed for `length` in each cycle of `every` periods (`CollectOptions::duty`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Duty {
    pub length: Duration,
    pub every: u32,
}

/// When the probes are attached, and for how long they were so far.
pub struct SamplePeriods {
    length: Duration,
    every: u32,
    started: Instant,
    open_since: Option<Instant>,
    open_for: Duration,
    ended: Option<Instant>,
    /// No more periods (attaching failed).
    stopped: bool,
}

impl SamplePeriods {
    /// Periods of `length`, one in `every` (1: always attached), the first from now.
    pub fn new(length: Duration, every: u64) -> Self {
        let now = Instant::now();
        SamplePeriods {
            length,
            every: every.clamp(1, u32::MAX as u64) as u32,
            started: now,
            open_since: Some(now),
            open_for: Duration::ZERO,
            ended: None,
            stopped: false,
        }
    }

    pub fn of(duty: Duty) -> Self {
        SamplePeriods::new(duty.length, duty.every.into())
    }

    /// The probes were attached just now: periods count from here.
    pub fn restart(&mut self) {
        *self = SamplePeriods::new(self.length, self.every.into());
    }

    /// Whether now is within a period probed.
    fn in_period(&self) -> bool {
        let cycle = self.length * self.every;
        self.started.elapsed().as_nanos() % cycle.as_nanos().max(1) < self.length.as_nanos()
    }

    /// `Some(open)` when the probes must be attached (true) or detached (false) now.
    pub fn due(&self) -> Option<bool> {
        if self.every == 1 || self.stopped {
            return None;
        }
        let open = self.in_period();
        (open != self.open_since.is_some()).then_some(open)
    }

    /// Whether the probes are attached.
    pub fn open(&self) -> bool {
        self.open_since.is_some()
    }

    /// The probes are attached (`open`) or detached, from now.
    pub fn set(&mut self, open: bool) {
        let now = Instant::now();
        if let Some(since) = self.open_since.take() {
            self.open_for += now - since;
        }
        if open {
            self.open_since = Some(now);
        }
    }

    /// No more periods: the scale is that of the time so far.
    pub fn stop_sampling(&mut self) {
        self.stopped = true;
        self.end();
    }

    /// Tracing ended (the probes are detached).
    pub fn end(&mut self) {
        self.set(false);
        self.ended.get_or_insert_with(Instant::now);
    }

    /// Time traced over time probed, so far.
    pub fn scale(&self) -> f64 {
        if self.every == 1 {
            return 1.0;
        }
        let (open, total) = self.probed();
        total.as_secs_f64() / open.as_secs_f64().max(1e-3)
    }

    /// The time the probes were attached, and the time traced, so far.
    pub fn probed(&self) -> (Duration, Duration) {
        let now = self.ended.unwrap_or_else(Instant::now);
        let open = self.open_for + self.open_since.map_or(Duration::ZERO, |since| now - since);
        (open, now - self.started)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_period_in_every_is_due_open_then_closed() {
        let mut p = SamplePeriods::new(Duration::from_millis(40), 3);
        assert_eq!(
            p.due(),
            None,
            "attached from the start, in the first period"
        );
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(p.due(), Some(false));
        p.set(false);
        assert_eq!(p.due(), None);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(p.due(), Some(true), "the next cycle's period");
        p.set(true);
        p.end();
        let (open, total) = p.probed();
        assert!(open < total && p.scale() > 1.0, "{open:?} of {total:?}");
        assert_eq!(SamplePeriods::new(Duration::from_millis(40), 1).due(), None);
    }
}
