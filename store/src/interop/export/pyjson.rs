//! JSON text exactly as CPython's `json.dumps` writes it, so that the files
//! export writes are byte for byte those of the former Python writer (and
//! of any Python tool that re-encodes our metadata): `", "`/`": "`
//! separators or compact ones, optional indentation, `ensure_ascii`, and
//! floats as `repr(float)` writes them (`1e-05`, `1e+16`, `300.0`), which
//! differs from serde_json's shortest form (`1e-5`, `1e16`).

use serde_json::{Map, Value};

/// How to lay the text out (the arguments of `json.dumps` that matter here).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Style {
    /// `indent=n`: newlines and `n` spaces per level; items end in `","`.
    pub indent: Option<usize>,
    /// `separators=(",", ":")` instead of Python's default `(", ", ": ")`.
    pub compact: bool,
    /// `ensure_ascii=True`: everything outside printable ASCII as `\uXXXX`.
    pub ensure_ascii: bool,
}

impl Style {
    /// `json.dumps(v, ensure_ascii=False)`.
    pub(super) const DEFAULT: Style = Style {
        indent: None,
        compact: false,
        ensure_ascii: false,
    };
}

/// `json.dumps(value, ...)` with `style`. Non-finite floats cannot occur: a
/// `serde_json::Value` never holds one.
pub(crate) fn to_string(value: &Value, style: Style) -> String {
    let mut out = String::new();
    write_value(&mut out, value, style, 0);
    out
}

fn write_value(out: &mut String, value: &Value, style: Style, level: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else {
                push_float(out, n.as_f64().unwrap_or(f64::NAN));
            }
        }
        Value::String(s) => push_str(out, s, style.ensure_ascii),
        Value::Array(items) => write_seq(
            out,
            items.iter(),
            items.len(),
            ('[', ']'),
            style,
            level,
            |o, v, l| write_value(o, v, style, l),
        ),
        Value::Object(map) => write_object(out, map, style, level),
    }
}

fn write_object(out: &mut String, map: &Map<String, Value>, style: Style, level: usize) {
    let key_sep = if style.compact { ":" } else { ": " };
    write_seq(
        out,
        map.iter(),
        map.len(),
        ('{', '}'),
        style,
        level,
        |o, (k, v), l| {
            push_str(o, k, style.ensure_ascii);
            o.push_str(key_sep);
            write_value(o, v, style, l);
        },
    )
}

/// The shared layout of arrays and objects: brackets, separators, indent.
fn write_seq<T>(
    out: &mut String,
    items: impl Iterator<Item = T>,
    len: usize,
    (open, close): (char, char),
    style: Style,
    level: usize,
    mut item: impl FnMut(&mut String, T, usize),
) {
    out.push(open);
    if len == 0 {
        out.push(close);
        return;
    }
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = style.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    // Python: "," between items when indenting (the newline follows), else
    // ", " or the compact ",".
    let sep = if style.indent.is_some() || style.compact {
        ","
    } else {
        ", "
    };
    for (i, v) in items.enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        newline(out, level + 1);
        item(out, v, level + 1);
    }
    newline(out, level);
    out.push(close);
}

/// Appends `s` as a JSON string literal with Python's escapes: `\"`, `\\`,
/// `\n`, `\r`, `\t`, `\b`, `\f`, other control characters as `\u00XX`;
/// with `ascii` (`ensure_ascii=True`), also DEL and everything past it,
/// astral characters as surrogate pairs.
pub fn push_str(out: &mut String, s: &str, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ascii && (c as u32) > 0x7e) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Whether the shortest digits of a finite `x` are the only digits of that
/// length that read back as `x`. When the string with the last digit one
/// up or one down reads back too, Python's `repr` takes the one closer to
/// `x`'s exact value, ties to an even digit (`562949953421312.2`, exactly
/// ...312.25), where Rust's `{:e}` may take the other (`...312.3`); a
/// caller that must match Python byte for byte asks Python then.
pub fn shortest_is_unique(x: f64) -> bool {
    let sci = format!("{x:e}");
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return false;
    };
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: Vec<u8> = mantissa.bytes().filter(|&b| b != b'.').collect();
    for up in [false, true] {
        let mut d = digits.clone();
        // the neighbour at the last digit, with carry or borrow; none when
        // it would change the number of digits
        let mut i = d.len();
        let changed = loop {
            if i == 0 {
                break false;
            }
            i -= 1;
            match (up, d[i]) {
                (true, b'9') => d[i] = b'0',
                (false, b'0') => d[i] = b'9',
                (true, c) => {
                    d[i] = c + 1;
                    break true;
                }
                (false, c) => {
                    d[i] = c - 1;
                    break true;
                }
            }
        };
        if !changed || d[0] == b'0' && d.len() > 1 {
            continue;
        }
        let rest = std::str::from_utf8(&d[1..]).unwrap_or_default();
        let text = format!("{sign}{}.{rest}0e{exp}", d[0] as char);
        if text.parse::<f64>() == Ok(x) {
            return false;
        }
    }
    true
}

/// `repr(x)` of a finite float: the shortest digits that round-trip (Rust's
/// `{:e}` finds the same ones as Python's dtoa), laid out as Python does:
/// positional when the decimal exponent is in `-4..16`, else `d.ddde±XX`.
pub fn push_float(out: &mut String, x: f64) {
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|&c| c != '.').collect();
    out.push_str(sign);
    // Python's "decpt": the value is 0.<digits> x 10^decpt.
    let decpt = exp + 1;
    if decpt <= -4 || decpt > 16 {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = decpt - 1;
        out.push_str(&format!("e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs()));
    } else if decpt <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-decpt) as usize));
        out.push_str(&digits);
    } else {
        let point = decpt as usize;
        if point >= digits.len() {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point]);
            out.push('.');
            out.push_str(&digits[point..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn float(x: f64) -> String {
        let mut s = String::new();
        push_float(&mut s, x);
        s
    }

    #[test]
    fn a_float_halfway_between_two_shortest_strings_is_not_unique() {
        // a fresh clone's hypothesis run: 2**49 + 0.25, repr() '562949953421312.2'
        assert!(!shortest_is_unique(562949953421312.2));
        for x in [0.0, -0.0, 0.1, 277.097, 1e16, 1.5e-5, 123456789012345680.0] {
            assert!(shortest_is_unique(x), "{x:e}");
        }
    }

    #[test]
    fn floats_as_python_repr() {
        // expected values: repr() in CPython 3.11
        for (x, want) in [
            (300.0, "300.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (0.1, "0.1"),
            (-2.5e-7, "-2.5e-07"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (std::f64::consts::PI, "3.141592653589793"),
            (123456789.125, "123456789.125"),
            (1.5e300, "1.5e+300"),
            (12345678901234567.0, "1.2345678901234568e+16"),
        ] {
            assert_eq!(float(x), want, "{x}");
        }
    }

    #[test]
    fn layouts_as_json_dumps() {
        let v = json!({"a": [1, 2.5, "é\n\"\u{1}"], "b": {}, "c": [], "d": {"e": null}});
        assert_eq!(
            to_string(&v, Style::DEFAULT),
            "{\"a\": [1, 2.5, \"é\\n\\\"\\u0001\"], \"b\": {}, \"c\": [], \"d\": {\"e\": null}}"
        );
        let compact = Style {
            compact: true,
            ..Style::DEFAULT
        };
        assert_eq!(
            to_string(&v, compact),
            "{\"a\":[1,2.5,\"é\\n\\\"\\u0001\"],\"b\":{},\"c\":[],\"d\":{\"e\":null}}"
        );
        let indented = Style {
            indent: Some(1),
            ..Style::DEFAULT
        };
        assert_eq!(
            to_string(&json!({"a": [1, {}], "b": {"c": true}}), indented),
            "{\n \"a\": [\n  1,\n  {}\n ],\n \"b\": {\n  \"c\": true\n }\n}"
        );
        let ascii = Style {
            ensure_ascii: true,
            ..Style::DEFAULT
        };
        assert_eq!(
            to_string(&json!(["é😀\u{7f}~"]), ascii),
            "[\"\\u00e9\\ud83d\\ude00\\u007f~\"]"
        );
        assert_eq!(
            to_string(&json!([u64::MAX, i64::MIN]), Style::DEFAULT),
            "[18446744073709551615, -9223372036854775808]"
        );
    }
}
