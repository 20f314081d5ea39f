//! A fast path for scans: the wanted top-level fields of a metadata
//! object, found without tokenizing the rest (see [`fast_meta`]).

use serde_json::{Map, Value};

use crate::query::QueryNeeds;

/// The wanted fields of the metadata object at the start of `bytes`,
/// found by a byte scanner that tokenizes only what it must (settled as
/// [`QueryNeeds::settle`] says): keys are
/// compared as bytes, unwanted values are skipped by their extent (strings
/// to their closing quote, containers to their matching bracket), and only
/// wanted values are parsed, by serde_json. `None` when the scanner meets
/// anything it does not handle (an escaped key, a malformed object): the
/// caller then decodes with serde_json, which is exact about errors.
/// Skipped values are checked for well-formed strings and balanced
/// brackets only; `Store::verify` checks every record in full.
pub(crate) fn fast_meta(bytes: &[u8], needs: &QueryNeeds) -> Option<Map<String, Value>> {
    let mut meta = Map::new();
    let mut keys = 0;
    let mut pos = skip_ws(bytes, 0);
    if bytes.get(pos) != Some(&b'{') {
        return None;
    }
    pos = skip_ws(bytes, pos + 1);
    if bytes.get(pos) == Some(&b'}') {
        return Some(meta);
    }
    loop {
        if bytes.get(pos) != Some(&b'"') {
            return None;
        }
        let key_end = pos + 1 + memchr::memchr2(b'"', b'\\', &bytes[pos + 1..])?;
        if bytes[key_end] != b'"' {
            return None; // an escaped key: serde_json decodes it
        }
        let key = &bytes[pos + 1..key_end];
        pos = skip_ws(bytes, key_end + 1);
        if bytes.get(pos) != Some(&b':') {
            return None;
        }
        let start = skip_ws(bytes, pos + 1);
        let end = skip_value(bytes, start)?;
        let key = std::str::from_utf8(key).ok()?;
        keys += 1;
        if needs.wants(key) {
            let value: Value = serde_json::from_slice(&bytes[start..end]).ok()?;
            meta.insert(key.to_owned(), value);
        }
        pos = skip_ws(bytes, end);
        match bytes.get(pos) {
            Some(b',') => pos = skip_ws(bytes, pos + 1),
            Some(b'}') => return Some(needs.settle(meta, keys)),
            _ => return None,
        }
    }
}

fn skip_ws(bytes: &[u8], mut pos: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\r' | b'\t') = bytes.get(pos) {
        pos += 1;
    }
    pos
}

/// The end of the string whose opening quote is at `pos` (one past its
/// closing quote); `None` if it does not close or has a bad escape.
fn skip_string(bytes: &[u8], mut pos: usize) -> Option<usize> {
    pos += 1;
    loop {
        pos += memchr::memchr2(b'"', b'\\', bytes.get(pos..)?)?;
        if bytes[pos] == b'"' {
            return Some(pos + 1);
        }
        match bytes.get(pos + 1)? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => pos += 2,
            b'u' => {
                let hex = bytes.get(pos + 2..pos + 6)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                pos += 6;
            }
            _ => return None,
        }
    }
}

/// The end of the JSON value starting at `pos` (one past it).
fn skip_value(bytes: &[u8], pos: usize) -> Option<usize> {
    match *bytes.get(pos)? {
        b'"' => skip_string(bytes, pos),
        b'{' | b'[' => {
            // Containers: to the matching bracket, strings skipped whole.
            let mut stack = vec![bytes[pos]];
            let mut pos = pos + 1;
            while let Some(&open) = stack.last() {
                match *bytes.get(pos)? {
                    b'"' => {
                        pos = skip_string(bytes, pos)?;
                        continue;
                    }
                    b @ (b'{' | b'[') => stack.push(b),
                    b'}' if open == b'{' => {
                        stack.pop();
                    }
                    b']' if open == b'[' => {
                        stack.pop();
                    }
                    b'}' | b']' => return None,
                    _ => {}
                }
                pos += 1;
            }
            Some(pos)
        }
        b't' => bytes[pos..].starts_with(b"true").then_some(pos + 4),
        b'f' => bytes[pos..].starts_with(b"false").then_some(pos + 5),
        b'n' => bytes[pos..].starts_with(b"null").then_some(pos + 4),
        b'-' | b'0'..=b'9' => {
            let len = bytes[pos..]
                .iter()
                .take_while(|b| matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                .count();
            Some(pos + len)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(fields: &[&str]) -> QueryNeeds {
        QueryNeeds {
            fields: fields.iter().map(|f| f.to_string()).collect(),
            arrays: false,
        }
    }

    /// What serde_json decodes for the same wanted fields.
    fn reference(text: &str, fields: &[&str]) -> Map<String, Value> {
        let all: Map<String, Value> = serde_json::from_str(text).unwrap();
        all.into_iter()
            .filter(|(k, _)| fields.contains(&k.as_str()))
            .collect()
    }

    #[test]
    fn agrees_with_serde_json_on_tricky_objects() {
        let cases = [
            r#"{}"#,
            r#" { } "#,
            r#"{"a":1,"b":"x"}"#,
            r#"{ "a" : 1 , "b" : [1, {"c": "]}"}], "d": null }"#,
            r#"{"s":"quote \" and \\ and \u00e9 and \/","a":-1.5e3}"#,
            r#"{"n":{"a":{"a":[[],{}]}},"a":{"x":"}"},"t":true,"f":false}"#,
            r#"{"é":"ü","a":"\ud83e\udd80"}"#,
            "{\"a\":\n[1,\t2],\r\"b\":0}",
        ];
        for text in cases {
            for fields in [&["a"][..], &["a", "b", "n", "s", "t", "é"][..], &["zz"][..]] {
                let got = fast_meta(text.as_bytes(), &needs(fields));
                assert_eq!(got, Some(reference(text, fields)), "{text} {fields:?}");
            }
        }
    }

    #[test]
    fn hands_unusual_or_malformed_input_to_serde_json() {
        let fields = needs(&["a"]);
        for text in [
            r#"{"\u0061":1}"#, // escaped key: serde_json decodes it
            r#"{"a":1"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{"a":[1,2}"#,
            r#"{"b":"unterminated}"#,
            r#"{"b":"bad \q escape","a":1}"#,
            r#"{"b":"\u12g4","a":1}"#,
            r#"{"b":tru,"a":1}"#,
            r#"{"a":01x}"#,
            r#"["a",1]"#,
            "",
        ] {
            assert_eq!(fast_meta(text.as_bytes(), &fields), None, "{text}");
        }
    }

    #[test]
    fn stops_at_the_end_of_the_object() {
        let text = br#"{"a":1},"arrays":{"x": not even json"#;
        assert_eq!(
            fast_meta(text, &needs(&["a"])),
            Some(reference(r#"{"a":1}"#, &["a"]))
        );
    }
}
