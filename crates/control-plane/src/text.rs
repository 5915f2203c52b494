//! Bounding text that came from outside: user input echoed in messages
//! and agents' error strings that are stored and served.
//!
//! Imports nothing of this crate.

/// Most characters of user input quoted in an error message.
pub const MAX_ECHO_CHARS: usize = 64;
/// Longest error string stored per agent failure (bytes).
pub const MAX_STORED_ERROR_BYTES: usize = 1024;

/// `s` cut to at most `max` bytes on a character boundary, with
/// `… (N bytes)` appended when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

/// User input for quoting in a message: at most [`MAX_ECHO_CHARS`]
/// characters, control characters escaped.
pub fn echo(s: &str) -> String {
    let count = s.chars().count();
    let mut out: String = s
        .chars()
        .take(MAX_ECHO_CHARS)
        .flat_map(char::escape_debug)
        .collect();
    if count > MAX_ECHO_CHARS {
        out.push_str(&format!("… ({count} characters)"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_and_says_so() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("ééé", 3), "é… (6 bytes)");
        let long = "x".repeat(5000);
        let e = echo(&long);
        assert!(e.len() < 100 && e.ends_with("(5000 characters)"), "{e}");
        assert_eq!(echo("a\nb"), "a\\nb");
    }
}
