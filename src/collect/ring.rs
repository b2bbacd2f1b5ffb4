//! Reading a collector's ring buffer until the duration ends, Ctrl-C, or the traced process exits, with
//! progress on a terminal.

use std::{
    io::IsTerminal,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, RingBuffer, RingBufferBuilder};

use super::CollectOptions;

/// What a tick of [`poll`] returns: its status line, and when the next tick is due if sooner than the poll
/// interval (a sampled period's edge, a slice).
pub struct Tick {
    pub status: String,
    pub due: Option<Instant>,
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

/// Reads `ring` until the run's duration passes, it stops (Ctrl-C included), or the traced process exits, then what
/// is left; notes when tracing ended in its `stop`. `tick` runs after every poll (at least every
/// `opts.ring.interval`, and by the time it asks) and returns a status line, shown once a second on a terminal.
/// Returns the time traced. The programs stay attached until the caller drops them.
pub fn poll(
    ring: &RingBuffer<'_>,
    opts: &CollectOptions,
    mut tick: impl FnMut(Duration) -> Result<Tick>,
) -> Result<Duration> {
    let (duration, stop, pid, options) = (opts.duration, &opts.stop, opts.pid, opts.ring);
    let started = Instant::now();
    let show_progress = std::io::stderr().is_terminal() && options.progress;
    let mut last_progress = started;
    let mut last_check = started;
    let interval = options.interval;
    let mut due: Option<Instant> = None;
    while !stop.is_stopped() {
        let left = duration.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        if last_check.elapsed() >= Duration::from_millis(500) {
            last_check = Instant::now();
            if crate::process::exited(pid) {
                if options.say_exit {
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
    stop.mark_ended();
    ring.consume().context("reading the ring buffer")?;
    if show_progress {
        say!();
    }
    Ok(traced)
}
