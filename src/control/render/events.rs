//! `sluicectl events` as text.
use crate::control::report::EventsReport;
use std::fmt::Write as _;

/// `sluicectl events`: one line per event, oldest first, stamped in UTC.
pub fn render_events(report: &EventsReport) -> String {
    let mut out = String::new();
    for e in &report.events {
        let _ = writeln!(out, "{} {}", utc(e.unix_ms), e.line);
    }
    if out.is_empty() {
        out.push_str("no events\n");
    }
    out
}

/// `2026-11-30T11:55:27.123Z` for milliseconds since the Unix epoch (proleptic
/// Gregorian calendar, Howard Hinnant's days-to-civil).
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::report::EventLine;

    #[test]
    fn events_are_stamped_in_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc(1_796_039_727_123), "2026-11-30T11:55:27.123Z");
        let events = EventsReport {
            events: vec![EventLine {
                unix_ms: 1_796_039_727_123,
                line: "lb=config op=clear".into(),
            }],
        };
        assert_eq!(
            render_events(&events),
            "2026-11-30T11:55:27.123Z lb=config op=clear\n"
        );
        assert_eq!(render_events(&EventsReport::default()), "no events\n");
    }
}
