//! Reading a collector's ring buffer until the duration ends, Ctrl-C, or the traced process exits, with
//! progress on a terminal.

use std::{
    io::IsTerminal,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, RingBuffer, RingBufferBuilder};

use super::STOP;

/// Whether [`poll`] shows its progress line on a terminal: off while a command runs several collectors at once
/// and shows one line for all of them (`myprobe report`).
pub static SHOW_PROGRESS: AtomicBool = AtomicBool::new(true);

/// Whether [`poll`] says that the traced process exited: off where the command says it once for all its
/// collectors.
pub static SAY_EXIT: AtomicBool = AtomicBool::new(true);

/// The longest [`poll`] waits between ticks, in ms: 100 where records are written as they come and progress is
/// shown; the agent, which answers in seconds, sets 1 s, so that its readers wake a busy server's CPUs less
/// (every wakeup of a tracer thread there takes a CPU from a server thread).
static POLL_INTERVAL_MS: AtomicU64 = AtomicU64::new(100);

/// Sets how long [`poll`] waits at most between ticks (see [`POLL_INTERVAL_MS`]).
pub fn set_poll_interval(interval: Duration) {
    POLL_INTERVAL_MS.store(interval.as_millis().max(1) as u64, Ordering::Relaxed);
}

/// What a tick of [`poll`] returns: its status line, and when the next tick is due if sooner than the poll
/// interval (a sampled period's edge, a slice).
pub struct Tick {
    pub status: String,
    pub due: Option<Instant>,
}

static TRACING_ENDED: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);

/// When the last tracing of this process ended (the end of `poll_ring`): what "results within N ms after
/// tracing ended" counts from, maps read after it included. Now, if no tracing ended.
pub fn tracing_ended() -> Instant {
    TRACING_ENDED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or_else(Instant::now)
}

/// A reader of a ring buffer calling `on_event` for every record.
pub fn reader<'cb>(
    events: &dyn MapCore,
    mut on_event: impl FnMut(&[u8]) + 'cb,
) -> Result<RingBuffer<'cb>> {
    let mut builder = RingBufferBuilder::new();
    builder
        .add(events, move |data: &[u8]| {
            on_event(data);
            0
        })
        .context("setting up the ring buffer reader")?;
    builder.build().context("setting up the ring buffer reader")
}

/// Reads `ring` until `duration` passes, Ctrl-C, or the traced process exits, then what is left. `tick` runs after
/// every poll (at least every poll interval, 100 ms unless [`set_poll_interval`], and by the time it asks) and
/// returns a status line, shown once a second on a terminal. Returns the time traced. The programs stay attached
/// until the caller drops them.
pub fn poll(
    ring: &RingBuffer<'_>,
    duration: Duration,
    mut tick: impl FnMut(Duration) -> Result<Tick>,
) -> Result<Duration> {
    let started = Instant::now();
    let show_progress = std::io::stderr().is_terminal() && SHOW_PROGRESS.load(Ordering::Relaxed);
    let mut last_progress = started;
    let mut last_check = started;
    let interval = Duration::from_millis(POLL_INTERVAL_MS.load(Ordering::Relaxed));
    let mut due: Option<Instant> = None;
    while !STOP.load(Ordering::SeqCst) {
        let left = duration.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        if last_check.elapsed() >= Duration::from_millis(500) {
            last_check = Instant::now();
            if let Some(pid) = crate::process::target_exited() {
                if SAY_EXIT.load(Ordering::Relaxed) {
                    if show_progress {
                        say!();
                    }
                    say!(
                        "myprobe: the traced process (PID {pid}) exited (a restart?): tracing ends with the results until then; run myprobe again to trace its successor"
                    );
                }
                break;
            }
        }
        // The BPF side wakes us only once a batch has accumulated; otherwise what it sent without a wakeup is
        // read when the timeout expires, so nothing waits more than the interval.
        let wait = due.map_or(interval, |d| {
            d.saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), interval)
        });
        match ring.poll(left.min(wait)) {
            Ok(()) => {}
            Err(e) if e.kind() == libbpf_rs::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("reading the ring buffer"),
        }
        ring.consume().context("reading the ring buffer")?;
        let t = tick(started.elapsed())?;
        due = t.due;
        if show_progress && last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            say_part!("\r{}   ", t.status);
        }
    }
    let traced = started.elapsed();
    *TRACING_ENDED.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    ring.consume().context("reading the ring buffer")?;
    if show_progress {
        say!();
    }
    Ok(traced)
}
