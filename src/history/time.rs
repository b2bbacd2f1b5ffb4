//! The times `history` takes: `now`, `-2h` (before now: s, m, h, d), `03:10` or `03:10:30` (the last such time of
//! day, local time), an ISO date (`2026-12-06T03:10:00Z`, with an offset, or local without one; `2026-12-06
//! 03:10`), or seconds since the epoch. Written back as local time with its offset.

use anyhow::{bail, Context, Result};
use chrono::{DateTime, Local, NaiveDate, NaiveDateTime, NaiveTime, TimeZone};

/// `text` as seconds since the epoch, `now` being now.
pub fn parse(text: &str, now: i64) -> Result<i64> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("now") {
        return Ok(now);
    }
    if let Some(ago) = t.strip_prefix('-') {
        return Ok(now - duration_s(ago)?);
    }
    if let Ok(epoch) = t.parse::<i64>() {
        if epoch > 100_000_000 {
            return Ok(epoch);
        }
    }
    if let Ok(d) = DateTime::parse_from_rfc3339(t) {
        return Ok(d.timestamp());
    }
    for format in [
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(n) = NaiveDateTime::parse_from_str(t, format) {
            return local(n);
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        return local(d.and_time(NaiveTime::MIN));
    }
    for format in ["%H:%M:%S", "%H:%M"] {
        if let Ok(time) = NaiveTime::parse_from_str(t, format) {
            // The last such time of day: today's, or yesterday's if today's is still to come.
            let today = Local
                .timestamp_opt(now, 0)
                .single()
                .context("the clock's time is not a local time")?
                .date_naive();
            let at = local(today.and_time(time))?;
            return Ok(if at > now { at - 86_400 } else { at });
        }
    }
    bail!(
        "{text:?} is not a time: give one as 03:10, -2h (s, m, h, d before now), 2026-12-06T03:10:00Z or now"
    )
}

/// `30s`, `15m`, `2h`, `7d` (a number alone: seconds), in seconds.
pub fn duration_s(text: &str) -> Result<i64> {
    let t = text.trim();
    let (number, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: i64 = number
        .parse()
        .with_context(|| format!("{text:?} is not a duration: give one as 90s, 15m, 2h or 7d"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => bail!("{text:?} is not a duration: give one as 90s, 15m, 2h or 7d"),
    };
    Ok(n * scale)
}

fn local(n: NaiveDateTime) -> Result<i64> {
    Ok(Local
        .from_local_datetime(&n)
        .earliest()
        .with_context(|| format!("{n} does not exist in the local time zone"))?
        .timestamp())
}

/// `ts` as local time with its offset: `2026-12-06 03:10:00 +00:00`.
pub fn format(ts: i64) -> String {
    Local.timestamp_opt(ts, 0).single().map_or_else(
        || ts.to_string(),
        |d| d.format("%Y-%m-%d %H:%M:%S %:z").to_string(),
    )
}

/// `ts`'s time of day alone: `03:10:00`.
pub fn clock(ts: i64) -> String {
    Local
        .timestamp_opt(ts, 0)
        .single()
        .map_or_else(|| ts.to_string(), |d| d.format("%H:%M:%S").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_before_now_and_absolute() {
        let now = 1_796_000_000;
        assert_eq!(parse("now", now).unwrap(), now);
        assert_eq!(parse("-2h", now).unwrap(), now - 7200);
        assert_eq!(parse("-90s", now).unwrap(), now - 90);
        assert_eq!(parse("-15m", now).unwrap(), now - 900);
        assert_eq!(parse("2026-12-06T03:10:00Z", now).unwrap(), 1_796_526_600);
        assert_eq!(
            parse("2026-12-06T05:10:00+02:00", now).unwrap(),
            1_796_526_600
        );
        assert_eq!(parse("1796526600", now).unwrap(), 1_796_526_600);
        assert!(parse("yesterday", now).is_err());
        assert!(parse("-2 weeks", now).is_err());
    }

    #[test]
    fn a_time_of_day_is_the_last_one() {
        let now = 1_796_526_600; // a 03:10 somewhere
        let t = parse(&clock(now - 60), now).unwrap();
        assert_eq!(t, now - 60);
        // A time later in the day than now: yesterday's.
        let later = parse(&clock(now + 3600), now).unwrap();
        assert_eq!(later, now + 3600 - 86_400);
    }
}
