//! `strftime_now(format)` of chat templates: transformers' `datetime.now().strftime(format)`
//! (`utils/chat_template_utils.py`), in the host's local time as Python's naive `now()` is
//! ([`local_offset`]; UTC in most containers).
//!
//! The directives are those of C89's `strftime` that Python documents, in the C locale
//! (English names): `%a %A %w %d %b %B %m %y %Y %H %I %p %M %S %f %j %e %u %%`; `%z` and
//! `%Z` are empty, as for Python's naive datetimes. Any other `%x` is written as it is, as
//! glibc does with a directive it does not know.

const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// The civil date (year, month 1-12, day 1-31) of `days` since 1970-01-01, in the
/// proleptic Gregorian calendar (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// The host's offset from UTC at `unix_seconds`, in seconds east (`tm_gmtoff` of libc's
/// `localtime_r`, which reads `TZ` and `/etc/localtime` as Python's `datetime.now()` does,
/// daylight saving included); 0 where libc cannot tell or off Unix.
pub(crate) fn local_offset(unix_seconds: i64) -> i64 {
    #[cfg(unix)]
    {
        // `time_t` and `c_long` are i64 on the 64-bit targets flm builds for.
        let t = unix_seconds as libc::time_t;
        // SAFETY: `tm` is plain data that localtime_r fills; both pointers are to locals
        // that outlive the call. localtime_r is thread-safe (no static buffer).
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
            return 0;
        }
        tm.tm_gmtoff as i64
    }
    #[cfg(not(unix))]
    {
        let _ = unix_seconds;
        0
    }
}

/// `format` with its directives replaced by the fields of `unix_seconds` (seconds since
/// 1970-01-01 00:00 UTC) in UTC. Never fails: an unknown directive, or a `%` at the end,
/// is written as it is.
pub(crate) fn strftime(format: &str, unix_seconds: i64) -> String {
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cumulative[month as usize - 1] + day + u32::from(month > 2 && is_leap(year));
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let field = match d {
            'a' => DAYS[weekday][..3].to_owned(),
            'A' => DAYS[weekday].to_owned(),
            'w' => ((weekday + 1) % 7).to_string(),
            'u' => (weekday + 1).to_string(),
            'd' => format!("{day:02}"),
            'e' => format!("{day:2}"),
            'b' | 'h' => MONTHS[month as usize - 1][..3].to_owned(),
            'B' => MONTHS[month as usize - 1].to_owned(),
            'm' => format!("{month:02}"),
            'y' => format!("{:02}", year.rem_euclid(100)),
            'Y' => year.to_string(),
            'H' => format!("{hour:02}"),
            'I' => format!("{hour12:02}"),
            'p' => if hour < 12 { "AM" } else { "PM" }.to_owned(),
            'M' => format!("{minute:02}"),
            'S' => format!("{second:02}"),
            'f' => "000000".to_owned(),
            'j' => format!("{yday:03}"),
            'z' | 'Z' => String::new(),
            '%' => "%".to_owned(),
            other => format!("%{other}"),
        };
        out.push_str(&field);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected: Python's `datetime.fromtimestamp(t, timezone.utc).strftime(f)`.
    #[test]
    fn formats_as_python() {
        // 2025-08-05 17:04:09 UTC, a Tuesday (gpt-oss's release).
        let t = 1_754_413_449;
        assert_eq!(strftime("%Y-%m-%d", t), "2025-08-05");
        assert_eq!(strftime("%d %b %Y", t), "05 Aug 2025");
        assert_eq!(
            strftime("%A %a %B %j %H:%M:%S %I%p %y %e %w %u %% %Q", t),
            "Tuesday Tue August 217 17:04:09 05PM 25  5 2 2 % %Q"
        );
        assert_eq!(strftime("%Y-%m-%d %H:%M", 0), "1970-01-01 00:00");
        // A leap day, the last day of a leap year, and a time before 1970.
        assert_eq!(strftime("%Y-%m-%d %j", 951_782_400), "2000-02-29 060");
        assert_eq!(strftime("%Y-%m-%d %j", 1_735_603_200), "2024-12-31 366");
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %A", -1),
            "1969-12-31 23:59:59 Wednesday"
        );
        assert_eq!(strftime("100%", 0), "100%");
    }
}
