//! Tracing for one period in N: probes attached for a period, then detached for the rest of the cycle, and what
//! they found scaled up by the time traced over the time probed. memleak samples its allocation functions so
//! (100 ms in N); the agent its off-CPU, lock and statement collectors (`Duty`, 1 s in N), whose in-kernel cost
//! is then paid for that share of the time only. `myprobe queries` and the agent's statements choose N
//! themselves after each period, from the rate of statements traced in it (`Duty::max_rate`): a quiet server's
//! statements are all traced (or one second in the agent's `--sample-every`), a busy one's for as many periods as
//! keep the cost within budget. A cycle so chosen begins once the cycle under way has ended, so that what a period
//! finds stands for the cycle it opened (`SamplePeriods::every` then), whatever is chosen at its end.

use std::{
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

/// Collectors probed for `length` in each cycle of `every` periods (`CollectOptions::duty`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Duty {
    pub length: Duration,
    pub every: u32,
    /// Adaptive: `every` is where the cycle starts and the fewest it chooses, then chosen at the end of each
    /// period so that at most this many events a second (`SamplePeriods::count`) would have been traced.
    pub max_rate: Option<u64>,
    /// Adaptive by cost: `max_rate` (the first guess) is chosen again at the end of each period as the rate that
    /// keeps tracing within this budget, at the cost an event was measured to have.
    pub budget: Option<CpuBudget>,
}

/// What tracing may cost, all in: a share of one CPU, each event traced costing `kernel_ns_per_event` in the
/// kernel (bench/overhead's figure; its own programs' cost is not measured while tracing, as that would turn on
/// the kernel's BPF statistics for every program of the host) and what this process spends on it (its CPU time
/// over each period traced: reading and joining the events; not its work between periods, which tracing fewer
/// would not save).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuBudget {
    pub per_mille_of_cpu: u32,
    pub kernel_ns_per_event: u64,
    /// Whose CPU time is this process's part: all its threads', or only the one that reads the events (the
    /// agent's statements, whose process runs other collectors too).
    pub own: OwnCpu,
    /// Split evenly between as many as these say now (the agent's servers, as they come and go).
    pub shares: BudgetShares,
}

/// Between how many a budget is split: kept by whoever splits it (the agent, set to the servers it finds) and
/// given to each share's tracing, which reads it at the end of each period. One until set.
#[derive(Clone, Debug, Default)]
pub struct BudgetShares(Arc<AtomicU32>);

impl BudgetShares {
    pub fn set(&self, shares: u32) {
        self.0.store(shares, Ordering::Relaxed);
    }

    fn now(&self) -> u32 {
        self.0.load(Ordering::Relaxed).max(1)
    }
}

/// The same shares: the same splitter's.
impl PartialEq for BudgetShares {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for BudgetShares {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnCpu {
    Process,
    Thread,
}

impl CpuBudget {
    /// Events a second that stay within the budget when each costs `ns`.
    pub fn max_rate(&self, ns: f64) -> u64 {
        let shares = self.shares.now();
        (f64::from(self.per_mille_of_cpu) / f64::from(shares) * 1e6 / ns.max(1.0)).max(1.0) as u64
    }
}

/// CPU time so far (user and system) of this process, or of the calling thread.
fn own_cpu_time(own: OwnCpu) -> Duration {
    let who = match own {
        OwnCpu::Process => libc::RUSAGE_SELF,
        OwnCpu::Thread => libc::RUSAGE_THREAD,
    };
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(who, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The longest cycle an adaptive duty chooses, in periods.
const MAX_EVERY: u32 = 3600;

/// When the probes are attached, and for how long they were so far.
pub struct SamplePeriods {
    length: Duration,
    every: u32,
    max_rate: Option<u64>,
    budget: Option<CpuBudget>,
    /// This process's CPU time when the period under way began (after the probes were attached).
    cpu_mark: Duration,
    /// What an event was measured to cost, smoothed over the periods (ns; 0: not yet measured).
    ns_per_event: f64,
    /// The first period is under way: it holds this process's start (the texts' calibration, the process list read
    /// whole), not what a statement costs, so its cost is not measured.
    first_period: bool,
    /// Adaptive duties: the fewest periods a cycle has, and the cycle chosen at the end of the last period, from
    /// the next cycle on.
    floor: u32,
    next_every: u32,
    /// Events counted since the period began (adaptive duties), and their rate in the last period that ended.
    counted: u64,
    rate: f64,
    period_began: Instant,
    /// Where the cycle's phase counts from (an adaptive duty starts a new cycle when it changes `every`).
    cycle_began: Instant,
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
        let now = now();
        let every = every.clamp(1, u32::MAX as u64) as u32;
        SamplePeriods {
            length,
            every,
            max_rate: None,
            budget: None,
            cpu_mark: Duration::ZERO,
            ns_per_event: 0.0,
            first_period: true,
            floor: every,
            next_every: every,
            counted: 0,
            rate: 0.0,
            period_began: now,
            cycle_began: now,
            started: now,
            open_since: Some(now),
            open_for: Duration::ZERO,
            ended: None,
            stopped: false,
        }
    }

    /// Called by the thread that reads the events (an `OwnCpu::Thread` budget measures its CPU time).
    pub fn of(duty: Duty) -> Self {
        SamplePeriods {
            max_rate: duty.max_rate,
            cpu_mark: duty
                .budget
                .as_ref()
                .map_or(Duration::ZERO, |b| own_cpu_time(b.own)),
            budget: duty.budget,
            ..SamplePeriods::new(duty.length, duty.every.into())
        }
    }

    /// The probes were attached just now: periods count from here.
    pub fn restart(&mut self) {
        *self = SamplePeriods {
            max_rate: self.max_rate,
            cpu_mark: self
                .budget
                .as_ref()
                .map_or(Duration::ZERO, |b| own_cpu_time(b.own)),
            budget: self.budget.take(),
            floor: self.floor,
            ..SamplePeriods::new(self.length, self.every.into())
        };
    }

    /// Events traced (adaptive duties choose their cycle from their rate within a period).
    pub fn count(&mut self, events: u64) {
        if self.open_since.is_some() {
            self.counted += events;
        }
    }

    /// The cycle's periods now: one in `every` is probed, and what a period finds stands for `every` periods.
    pub fn every(&self) -> u32 {
        self.every
    }

    /// Events a second in the last period that ended (adaptive duties).
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Whether now is within a period probed.
    fn in_period(&self) -> bool {
        self.phase(now()) < self.length.as_nanos()
    }

    /// Where `now` falls in the cycle, in ns from its start (`in_period` and `next_change` read the same).
    fn phase(&self, now: Instant) -> u128 {
        (now - self.cycle_began).as_nanos() % self.cycle_ns()
    }

    fn cycle_ns(&self) -> u128 {
        (self.length * self.every).as_nanos().max(1)
    }

    /// `Some(open)` when the probes must be attached (true) or detached (false) now.
    pub fn due(&mut self) -> Option<bool> {
        if self.stopped {
            return None;
        }
        if let Some(max_rate) = self.max_rate.filter(|_| self.open_since.is_some()) {
            let probed = now().saturating_duration_since(self.period_began);
            if probed < self.length {
                return None;
            }
            // A period ended: as many in the next cycle as bring its rate within max_rate, itself from the cost of
            // an event over the cycle that ended, where a budget is set.
            self.rate = self.counted as f64 / probed.as_secs_f64();
            if let Some(budget) = &self.budget {
                let cpu = own_cpu_time(budget.own);
                let spent = cpu.saturating_sub(self.cpu_mark).as_nanos() as f64;
                self.cpu_mark = cpu;
                if self.counted > 0 && !std::mem::replace(&mut self.first_period, false) {
                    // Smoothed, so that one period's noise does not move the cycle back and forth.
                    let measured = budget.kernel_ns_per_event as f64 + spent / self.counted as f64;
                    self.ns_per_event = match self.ns_per_event {
                        0.0 => measured,
                        before => 0.5 * (before + measured),
                    };
                    self.max_rate = Some(budget.max_rate(self.ns_per_event));
                }
            }
            let max_rate = self.max_rate.unwrap_or(max_rate).max(1) as f64;
            let needed = self.rate / max_rate;
            // Fewer periods only once the rate is a fifth below what the fewer allow: a rate near the threshold
            // keeps its cycle instead of going back and forth at each period.
            let shorter = (needed * 1.25).ceil();
            let wanted = match needed.ceil() < self.next_every as f64 {
                true => shorter.min(self.next_every as f64),
                false => needed.ceil(),
            };
            self.next_every =
                wanted.clamp(self.floor.clamp(1, MAX_EVERY) as f64, MAX_EVERY as f64) as u32;
            let now = now();
            (self.period_began, self.counted) = (now, 0);
            if self.every > 1 {
                return Some(false);
            }
            // A cycle of one period ended with it: the next begins now, with a period.
            (self.every, self.cycle_began) = (self.next_every, now);
            return None;
        }
        if self.every == 1 && self.max_rate.is_none() {
            return None;
        }
        let open = self.in_period();
        if open && self.max_rate.is_some() {
            // The cycle under way ended: the one chosen since begins.
            (self.every, self.cycle_began) = (self.next_every, now());
        }
        (open != self.open_since.is_some()).then_some(open)
    }

    /// When [`SamplePeriods::due`] may next say a change: the end of the period under way or the start of the
    /// next one (`None`: never, attached all the time or stopped).
    pub fn next_change(&self) -> Option<Instant> {
        if self.stopped {
            return None;
        }
        if self.max_rate.is_some() && self.open_since.is_some() {
            return Some(self.period_began + self.length);
        }
        if self.every == 1 && self.max_rate.is_none() {
            return None;
        }
        let length = self.length.as_nanos();
        let now = now();
        let phase = self.phase(now);
        let left = if phase < length {
            length - phase
        } else {
            self.cycle_ns() - phase
        };
        Some(now + Duration::from_nanos(left.min(u64::MAX as u128) as u64))
    }

    /// Whether the probes are attached.
    pub fn open(&self) -> bool {
        self.open_since.is_some()
    }

    /// The probes are attached (`open`) or detached, from now.
    pub fn set(&mut self, open: bool) {
        let now = now();
        self.close(now);
        if open {
            self.open_since = Some(now);
            (self.period_began, self.counted) = (now, 0);
            // A period's cost is what it spent tracing: between periods this process's CPU goes on other work,
            // which following fewer statements would not save.
            if let Some(budget) = &self.budget {
                self.cpu_mark = own_cpu_time(budget.own);
            }
        }
    }

    /// No more periods: the scale is that of the time so far.
    pub fn stop_sampling(&mut self) {
        self.stopped = true;
        self.end();
    }

    /// Tracing ended (the probes are detached).
    pub fn end(&mut self) {
        let now = now();
        self.close(now);
        self.ended.get_or_insert(now);
    }

    fn close(&mut self, now: Instant) {
        if let Some(since) = self.open_since.take() {
            self.open_for += now - since;
        }
    }

    /// Time traced over time probed, so far.
    pub fn scale(&self) -> f64 {
        let (open, total) = self.probed();
        if open >= total {
            return 1.0;
        }
        total.as_secs_f64() / open.as_secs_f64().max(1e-3)
    }

    /// The time the probes were attached, and the time traced, so far.
    pub fn probed(&self) -> (Duration, Duration) {
        let now = self.ended.unwrap_or_else(Instant::now);
        let open = self.open_for + self.open_since.map_or(Duration::ZERO, |since| now - since);
        (open, now - self.started)
    }
}

/// The clock: the real one, or in unit tests one each test moves itself (`tests::advance`), so that what they
/// assert does not turn on how promptly a busy host runs them.
fn now() -> Instant {
    #[cfg(test)]
    if let Some(t) = tests::FAKE_NOW.with(std::cell::Cell::get) {
        return t;
    }
    Instant::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// This test's clock, once it has set one.
        pub(super) static FAKE_NOW: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
    }

    /// Moves this test's clock on (setting it first).
    fn advance(by: Duration) {
        FAKE_NOW.with(|c| c.set(Some(c.get().unwrap_or_else(Instant::now) + by)));
    }

    #[test]
    fn one_period_in_every_is_due_open_then_closed() {
        advance(Duration::ZERO);
        let mut p = SamplePeriods::new(Duration::from_millis(40), 3);
        assert_eq!(
            p.due(),
            None,
            "attached from the start, in the first period"
        );
        advance(Duration::from_millis(50));
        assert_eq!(p.due(), Some(false));
        p.set(false);
        assert_eq!(p.due(), None);
        advance(Duration::from_millis(80));
        assert_eq!(p.due(), Some(true), "the next cycle's period");
        p.set(true);
        p.end();
        let (open, total) = p.probed();
        assert!(open < total && p.scale() > 1.0, "{open:?} of {total:?}");
        assert_eq!(SamplePeriods::new(Duration::from_millis(40), 1).due(), None);
        assert_eq!(
            SamplePeriods::new(Duration::from_millis(40), 1).next_change(),
            None
        );
    }

    #[test]
    fn the_next_change_is_where_due_says_it() {
        advance(Duration::ZERO);
        let ms = Duration::from_millis;
        let mut p = SamplePeriods::new(ms(200), 4);
        let end = p.next_change().expect("sampled");
        assert!(end <= now() + ms(200));
        advance(end.saturating_duration_since(now()) + ms(5));
        assert_eq!(p.due(), Some(false), "the period ended at its next change");
        p.set(false);
        let start = p.next_change().expect("sampled");
        let left = start.saturating_duration_since(now());
        assert!(left <= ms(600), "the next cycle's period in {left:?}");
        assert_eq!(p.due(), None, "not yet");
        advance(left + ms(5));
        assert_eq!(
            p.due(),
            Some(true),
            "the next period began at its next change"
        );
    }

    #[test]
    fn an_adaptive_duty_chooses_its_next_cycle_from_the_rate_of_each_period() {
        advance(Duration::ZERO);
        let ms = Duration::from_millis;
        let mut p = SamplePeriods::of(Duty {
            length: ms(100),
            every: 1,
            max_rate: Some(30),
            budget: None,
        });
        p.count(10);
        assert_eq!(p.due(), None, "within the first period");
        advance(ms(120));
        // 10 in 120 ms: 83/s, less than thrice the rate wanted (more than twice, unless the clock is late). A
        // cycle of one period ended: the next begins at once, attached.
        assert_eq!(p.due(), None);
        let every = p.every();
        assert!((2..=3).contains(&every), "{every}");
        advance(ms(120));
        // Nothing counted in this one: the cycle after next is of one period, this one goes on detached.
        assert_eq!(p.due(), Some(false));
        p.set(false);
        assert_eq!(p.every(), every, "the cycle under way");
        advance(ms(50));
        assert_eq!(p.due(), None, "detached until the next cycle's period");
        advance(ms(100) * (every - 1) - ms(25));
        assert_eq!(p.due(), Some(true));
        p.set(true);
        assert_eq!(p.every(), 1, "the cycle chosen began");
        p.end();
        assert!(p.scale() > 1.0);
    }

    #[test]
    fn an_adaptive_duty_keeps_to_its_fewest_periods() {
        advance(Duration::ZERO);
        let ms = Duration::from_millis;
        let mut p = SamplePeriods::of(Duty {
            length: ms(50),
            every: 3,
            max_rate: Some(1000),
            budget: None,
        });
        p.count(5);
        advance(ms(60));
        assert_eq!(
            p.due(),
            Some(false),
            "a period of the first cycle of 3 ended"
        );
        p.set(false);
        assert_eq!(p.every(), 3);
        advance(ms(110));
        assert_eq!(p.due(), Some(true));
        p.set(true);
        assert_eq!(p.every(), 3, "at least 3, however few were counted");
        p.count(1000);
        advance(ms(60));
        // 1,000 in 60 ms: 16,667/s, over the rate of 1,000/s wanted.
        assert_eq!(p.due(), Some(false));
        p.set(false);
        assert_eq!(
            p.every(),
            3,
            "what this period found stands for its own cycle"
        );
        advance(ms(110));
        assert_eq!(p.due(), Some(true));
        assert!((16..=17).contains(&p.every()), "{}", p.every());
    }

    #[test]
    fn a_rate_near_the_threshold_keeps_its_cycle() {
        advance(Duration::ZERO);
        let ms = Duration::from_millis;
        let mut p = SamplePeriods::of(Duty {
            length: ms(100),
            every: 1,
            max_rate: Some(1_000),
            budget: None,
        });
        // Periods of one cycle each: 100 ms traced, then `every - 1` detached.
        let period = |p: &mut SamplePeriods, counted: u64| {
            p.count(counted);
            advance(ms(100));
            if p.due() == Some(false) {
                p.set(false);
                advance(ms(100) * (p.every() - 1));
                assert_eq!(p.due(), Some(true));
                p.set(true);
            }
            p.every()
        };
        // 1,100 a second: one in 2, from the next period on.
        assert_eq!(period(&mut p, 110), 2);
        assert_eq!(period(&mut p, 110), 2);
        // 950 a second would allow every one, but it is within a fifth of the rate: one in 2 still.
        assert_eq!(period(&mut p, 95), 2);
        assert_eq!(period(&mut p, 95), 2);
        // 750 a second: every one.
        assert_eq!(period(&mut p, 75), 1);
        assert_eq!(period(&mut p, 75), 1);
    }

    #[test]
    fn a_budget_sets_the_rate_from_the_cost_of_an_event() {
        let budget = CpuBudget {
            per_mille_of_cpu: 30,
            kernel_ns_per_event: 2_000,
            own: OwnCpu::Process,
            shares: BudgetShares::default(),
        };
        // 3% of a CPU at 3 µs an event: 10,000 a second.
        assert_eq!(budget.max_rate(3_000.0), 10_000);
        // Shared: split between as many as its splitter says share it now.
        let splitter = BudgetShares::default();
        let shared = CpuBudget {
            shares: splitter.clone(),
            ..budget.clone()
        };
        splitter.set(4);
        assert_eq!(shared.max_rate(3_000.0), 2_500);
        assert_eq!(
            budget.max_rate(3_000.0),
            10_000,
            "another budget's shares are its own"
        );
        splitter.set(1);
        assert_eq!(shared.max_rate(3_000.0), 10_000);
        advance(Duration::ZERO);
        let ms = Duration::from_millis;
        let mut p = SamplePeriods::of(Duty {
            length: ms(100),
            every: 1,
            max_rate: Some(u64::MAX),
            budget: Some(budget),
        });
        // The first period holds the start: its cost is not measured.
        p.count(1_000);
        advance(ms(120));
        assert_eq!(p.due(), None, "a cycle of one period goes on at once");
        assert_eq!(p.max_rate, Some(u64::MAX), "the first period measured");
        // This process's own CPU (other tests' included) adds to the kernel's 2 µs an event: 3% of a CPU allows
        // 15,000 a second at most.
        p.count(1_000);
        advance(ms(120));
        assert_eq!(p.due(), None, "a cycle of one period goes on at once");
        let rate = p.max_rate.expect("chosen");
        assert!(rate <= 15_000, "{rate}");
        p.count(100_000);
        advance(ms(120));
        p.due();
        // 833,000 a second at 2 µs or more each: 1.67 CPUs, within 3% one second in 56 or more.
        assert!(p.next_every >= 56, "{}", p.next_every);
    }
}
