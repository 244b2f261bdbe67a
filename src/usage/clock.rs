//! The time usage days and budget windows are read in: the system's, or, for tests that
//! need a month to end, one that starts where `A2A_GATEWAY_CLOCK_START` (RFC 3339) says
//! and runs at the system's pace. Nothing else in the gateway reads it.

use std::sync::OnceLock;

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Timelike, Utc};
use chrono_tz::Tz;

use crate::config::Window;

/// The test variable; unset in production.
pub(crate) const START_VAR: &str = "A2A_GATEWAY_CLOCK_START";

/// Milliseconds the clock is ahead of the system's (0 unless the variable is set).
fn offset_ms() -> i64 {
    static OFFSET: OnceLock<i64> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        let Ok(start) = std::env::var(START_VAR) else {
            return 0;
        };
        match DateTime::parse_from_rfc3339(&start) {
            Ok(start) => {
                tracing::warn!(start = %start, "{START_VAR} is set: usage days and budget windows follow a clock that starts there (for tests)");
                start.timestamp_millis() - Utc::now().timestamp_millis()
            }
            Err(e) => {
                tracing::warn!(error = %e, "{START_VAR} is not RFC 3339; the system clock is used");
                0
            }
        }
    })
}

/// Sets the clock's start (once, when usage is made).
pub(crate) fn start() {
    offset_ms();
}

pub(crate) fn now_ms() -> i64 {
    Utc::now().timestamp_millis() + offset_ms()
}

/// The time as of the kernel's last tick (a few milliseconds old): enough to tell which day a
/// call counts in, for a fraction of a full read (chrono's `Utc::now` is about 176
/// instructions, and every counted call read it twice).
#[cfg(target_os = "linux")]
pub(crate) fn coarse_now_ms() -> i64 {
    use nix::time::{clock_gettime, ClockId};
    match clock_gettime(ClockId::CLOCK_REALTIME_COARSE) {
        Ok(t) => t.tv_sec() * 1000 + t.tv_nsec() / 1_000_000 + offset_ms(),
        Err(_) => now_ms(),
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn coarse_now_ms() -> i64 {
    now_ms()
}

/// The window of `window`'s kind holding `at`, in `zone`: its label (what its counters are
/// kept under), its start and its end (milliseconds).
pub(crate) fn window_of(window: Window, zone: Tz, at_ms: i64) -> (String, i64, i64) {
    let at = DateTime::from_timestamp_millis(at_ms)
        .unwrap_or_default()
        .with_timezone(&zone);
    let date = at.date_naive();
    match window {
        Window::Minute => {
            let start_ms =
                at_ms - (at.second() as i64 * 1000 + at.timestamp_subsec_millis() as i64);
            let label = format!("m{}", at.format("%Y%m%d%H%M"));
            (label, start_ms, start_ms + 60_000)
        }
        Window::Day => {
            let next = date.succ_opt().unwrap_or(date);
            let label = format!("d{}", date.format("%Y%m%d"));
            (label, midnight(zone, date), midnight(zone, next))
        }
        Window::Month => {
            let first = date.with_day(1).unwrap_or(date);
            let next = match first.month() {
                12 => NaiveDate::from_ymd_opt(first.year() + 1, 1, 1),
                m => NaiveDate::from_ymd_opt(first.year(), m + 1, 1),
            }
            .unwrap_or(first);
            let label = format!("M{}", first.format("%Y%m"));
            (label, midnight(zone, first), midnight(zone, next))
        }
    }
}

/// The day (in `zone`) holding `at_ms`: the date and when it ends.
pub(crate) fn day_of(zone: Tz, at_ms: i64) -> (NaiveDate, i64) {
    let at = DateTime::from_timestamp_millis(at_ms)
        .unwrap_or_default()
        .with_timezone(&zone);
    let date = at.date_naive();
    (date, midnight(zone, date.succ_opt().unwrap_or(date)))
}

/// The first instant of `date` in `zone` (a day that starts in a DST gap starts at the
/// gap's end).
fn midnight(zone: Tz, date: NaiveDate) -> i64 {
    let naive = date.and_hms_opt(0, 0, 0).unwrap_or_default();
    let local = zone.from_local_datetime(&naive);
    match local.earliest() {
        Some(t) => t.timestamp_millis(),
        // No midnight that day (a DST jump at 00:00): an hour later exists.
        None => zone
            .from_local_datetime(&(naive + chrono::TimeDelta::hours(1)))
            .earliest()
            .map_or(naive.and_utc().timestamp_millis(), |t| t.timestamp_millis()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> i64 {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .timestamp_millis()
    }

    #[test]
    fn windows_are_calendar_ones_in_the_zone() {
        let utc: Tz = "UTC".parse().unwrap();
        let (label, start, end) = window_of(Window::Month, utc, ms("2026-01-31T23:59:59Z"));
        assert_eq!(label, "M202601");
        assert_eq!(
            (start, end),
            (ms("2026-01-01T00:00:00Z"), ms("2026-02-01T00:00:00Z"))
        );
        let (label, _, end) = window_of(Window::Month, utc, ms("2026-12-15T10:00:00Z"));
        assert_eq!(
            (label.as_str(), end),
            ("M202612", ms("2027-01-01T00:00:00Z"))
        );
        // 23:30 UTC on the 31st is already February 1st in Paris.
        let paris: Tz = "Europe/Paris".parse().unwrap();
        let (label, start, _) = window_of(Window::Month, paris, ms("2026-01-31T23:30:00Z"));
        assert_eq!(
            (label.as_str(), start),
            ("M202602", ms("2026-01-31T23:00:00Z"))
        );
        let (label, start, end) = window_of(Window::Day, paris, ms("2026-03-29T12:00:00Z"));
        // The day summer time starts has 23 hours.
        assert_eq!(label, "d20260329");
        assert_eq!(end - start, 23 * 3600 * 1000);
        let (label, start, end) = window_of(Window::Minute, utc, ms("2026-05-05T10:11:12.5Z"));
        assert_eq!(label, "m202605051011");
        assert_eq!(
            (start, end),
            (ms("2026-05-05T10:11:00Z"), ms("2026-05-05T10:12:00Z"))
        );
    }
}
