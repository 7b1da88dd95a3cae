//! Every refusal `lockctl` prints is one line on stderr: clap's argument errors (which clap
//! spreads over a message, tips, a usage line and a `--help` hint) and the store's errors.
//! Text a user or a store supplied never breaks the line: control characters in it (newlines,
//! carriage returns, escape sequences) are printed escaped.

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// The one line for an argument error clap refused, without the `lockctl: ` prefix.
///
/// `subcommands` names the subcommands, for the refusal of a bare `lockctl` (for which clap
/// would print the whole help).
pub(crate) fn argument_error(mut error: clap::Error, subcommands: &[&str]) -> String {
    if error.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        return format!(
            "a command is required: {} (see 'lockctl --help')",
            subcommands.join(", ")
        );
    }
    // Escape what the user typed before clap lays out its lines around it, so that every
    // newline left in the rendering is clap's own.
    let escaped: Vec<(ContextKind, ContextValue)> = error
        .context()
        .filter_map(|(kind, value)| escape_value(value).map(|value| (kind, value)))
        .collect();
    for (kind, value) in escaped {
        error.insert(kind, value);
    }
    error.remove(ContextKind::Usage);
    let rendered = error.render().to_string();
    let rendered = rendered.strip_prefix("error: ").unwrap_or(&rendered);
    let mut line = String::new();
    for piece in rendered.lines().map(str::trim) {
        if piece.is_empty() || piece.starts_with("For more information, try '") {
            continue;
        }
        if !line.is_empty() {
            line.push_str(if piece.starts_with("tip:") {
                "; "
            } else if line.ends_with(':') || piece.starts_with('[') {
                " "
            } else {
                ", "
            });
        }
        line.push_str(piece);
    }
    escape_controls(&line)
}

/// `text` (an error's rendering) on one line: its lines joined by `"; "`, control characters
/// escaped.
pub(crate) fn one_line(text: &str) -> String {
    let joined = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    escape_controls(&joined)
}

/// `value` with its text escaped, or `None` if it holds nothing to escape.
fn escape_value(value: &ContextValue) -> Option<ContextValue> {
    let needs = |text: &str| text.chars().any(breaks_the_line);
    match value {
        ContextValue::String(text) if needs(text) => {
            Some(ContextValue::String(escape_controls(text)))
        }
        ContextValue::Strings(texts) if texts.iter().any(|t| needs(t)) => Some(
            ContextValue::Strings(texts.iter().map(|t| escape_controls(t)).collect()),
        ),
        ContextValue::StyledStr(text) if needs(&text.to_string()) => Some(ContextValue::StyledStr(
            escape_controls(&text.to_string()).into(),
        )),
        ContextValue::StyledStrs(texts) if texts.iter().any(|t| needs(&t.to_string())) => {
            Some(ContextValue::StyledStrs(
                texts
                    .iter()
                    .map(|t| escape_controls(&t.to_string()).into())
                    .collect(),
            ))
        }
        _ => None,
    }
}

/// Control characters (newline, carriage return, escape, …) and the Unicode line and
/// paragraph separators.
fn breaks_the_line(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if breaks_the_line(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_becomes_one_line_with_controls_escaped() {
        assert_eq!(one_line("a\n  b\r\n\nc"), "a; b; c");
        assert_eq!(one_line("x\u{1b}[31my\u{2028}z"), "x\\u{1b}[31my\\u{2028}z");
        assert_eq!(one_line("é ok"), "é ok");
    }
}
