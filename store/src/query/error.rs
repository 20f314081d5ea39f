//! [`QueryError`]: where a query failed to parse, and its display with a
//! caret under the offending column.

use std::fmt;

/// A query that could not be parsed.
///
/// `column` is the 1-based column, counted in characters (not bytes), of the offending
/// token; one past the last character when the expression ended too early. `Display`
/// shows the message, the expression and a caret under the column:
///
/// ```text
/// unexpected token '>'; expected a value ... at column 14
///   temperature >> 3
///                ^
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct QueryError {
    /// 1-based column, in characters, of the offending token.
    pub column: usize,
    /// What is wrong, without the position.
    pub message: String,
    /// The whole query source.
    pub expression: String,
}

impl QueryError {
    /// A new error at `column` (1-based, in characters) of `expression`.
    pub fn new(column: usize, message: impl Into<String>, expression: impl Into<String>) -> Self {
        QueryError {
            column,
            message: message.into(),
            expression: expression.into(),
        }
    }
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Characters shown around the column when the expression is long.
        const HALF: usize = 60;
        write!(f, "{} at column {}", self.message, self.column)?;
        // One displayed character per source character, so the caret lines up.
        let shown: Vec<char> = self
            .expression
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let at = self.column.saturating_sub(1).min(shown.len());
        let (start, end) = if shown.len() <= 2 * HALF {
            (0, shown.len())
        } else {
            let start = at.saturating_sub(HALF).min(shown.len() - 2 * HALF);
            (start, start + 2 * HALF)
        };
        let lead = if start > 0 { "..." } else { "" };
        let tail = if end < shown.len() { "..." } else { "" };
        let text: String = shown[start..end].iter().collect();
        let pad = " ".repeat(lead.len() + at - start);
        write!(f, "\n  {lead}{text}{tail}\n  {pad}^")
    }
}

#[cfg(test)]
mod tests {
    use super::QueryError;
    use crate::query::test_support::parse_err;

    /// The character of `expression` above the caret of the displayed error.
    fn char_above_caret(e: &QueryError) -> Option<char> {
        let shown = e.to_string();
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 3, "{shown}");
        let caret = lines[2].chars().count() - 1;
        assert!(lines[2].ends_with('^') && lines[2].trim() == "^", "{shown}");
        lines[1].chars().nth(caret)
    }

    #[test]
    fn error_display_points_at_the_column() {
        let e = parse_err("temperature >> 3");
        let shown = e.to_string();
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(
            lines[0],
            "unexpected token '>'; expected a value (number, string, list, true, false, null \
             or field path) at column 14"
        );
        assert_eq!(lines[1], "  temperature >> 3");
        assert_eq!(lines[2], format!("  {}^", " ".repeat(13)));

        assert_eq!(char_above_caret(&parse_err("温度 == 1 ü")), Some('ü'));
        assert_eq!(char_above_caret(&parse_err("a ==\n\t$ ")), Some('$'));
        // At the end of the expression the caret is one past the last character.
        let e = parse_err("a ==");
        assert_eq!(char_above_caret(&e), None);
        assert!(e.to_string().ends_with("\n  a ==\n      ^"));
    }

    #[test]
    fn error_display_windows_long_expressions() {
        let src = format!(
            "{}a == 1 $ {}",
            "b == 1 and ".repeat(40),
            "c == 2 and ".repeat(40)
        );
        let e = parse_err(&src);
        assert_eq!(e.column, 40 * 11 + 8);
        let shown = e.to_string();
        let line = shown.lines().nth(1).unwrap();
        assert!(
            line.starts_with("  ...") && line.ends_with("..."),
            "{shown}"
        );
        assert!(line.chars().count() < 140, "{shown}");
        assert_eq!(char_above_caret(&e), Some('$'));
        // Near the start and the end.
        let e = parse_err(&format!("$ {}", "c == 2 and ".repeat(40)));
        assert_eq!(char_above_caret(&e), Some('$'));
        let e = parse_err(&format!("{}a ==", "c == 2 and ".repeat(40)));
        assert_eq!(char_above_caret(&e), None);
        assert!(e.to_string().lines().nth(1).unwrap().ends_with("a =="));
    }

    #[test]
    fn error_is_a_std_error() {
        let e: Box<dyn std::error::Error + Send + Sync> = Box::new(parse_err("a"));
        assert!(e.to_string().contains("at column 1"));
    }
}
