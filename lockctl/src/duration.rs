//! Durations as people write them: `500ms`, `30s`, `5m`, `1h`.

use std::time::Duration;

/// Parses `<number><unit>` with unit `ms`, `s`, `m` or `h`; a bare number is seconds. Zero is
/// rejected: a zero TTL or grace is always a mistake on the command line.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    match parse_wait(text)? {
        Duration::ZERO => Err(format!("{:?} must be greater than zero", text.trim())),
        duration => Ok(duration),
    }
}

/// Like [`parse`], but zero is accepted: a zero `--wait` means one attempt.
pub(crate) fn parse_wait(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 30s, 5m or 1h"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {unit:?}; use ms, s, m or h"
            ))
        }
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(format!(
            "{text:?} is not a duration like 500ms, 30s, 5m or 1h"
        ));
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_written() {
        let ok = [
            ("500ms", Duration::from_millis(500)),
            ("30s", Duration::from_secs(30)),
            ("30", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("1h", Duration::from_secs(3600)),
            ("1.5s", Duration::from_millis(1500)),
        ];
        for (text, expected) in ok {
            assert_eq!(parse(text), Ok(expected), "{text}");
        }
        for bad in ["", "0", "0s", "-1s", "5 parsecs", "s", "1d", "1e400s", "ms"] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn a_wait_may_be_zero_in_any_unit() {
        for zero in ["0", "0s", "0ms", "0.0m"] {
            assert_eq!(parse_wait(zero), Ok(Duration::ZERO), "{zero}");
            assert!(parse(zero).is_err(), "{zero:?} was accepted as a TTL");
        }
        assert_eq!(parse_wait("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["", "-1s", "soon", "1d"] {
            assert!(parse_wait(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
