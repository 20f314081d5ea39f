//! Tagged metadata values (FORMAT.md, "Tagged values"): a JSON object with
//! exactly one member whose name starts with `$` stands for a value JSON
//! cannot hold (`{"$float": "nan"}`, `{"$int": "123..."}`,
//! `{"$datetime": "2024-03-01T12:30:00+01:00"}`, `{"$tuple": [...]}`, ...).
//! This module reads them: [`tag`] classifies an object, and the ISO 8601
//! readers turn date and datetime text into a [`Time`].
//!
//! A one-member `$` object that is not a well-formed tag (an unknown name,
//! a payload of the wrong shape) is seen as the plain object it is, so
//! metadata written before tags existed keeps its meaning.

use serde_json::{Map, Value};

/// An integer written in decimal, as `$int` holds it: no sign in `digits`,
/// no leading zeros (`"0"` for zero, which is never negative).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BigInt<'a> {
    pub(crate) negative: bool,
    pub(crate) digits: &'a str,
}

impl<'a> BigInt<'a> {
    /// Reads `-?[0-9]+` (leading zeros allowed and dropped).
    pub(crate) fn parse(text: &'a str) -> Option<BigInt<'a>> {
        let (negative, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let trimmed = digits.trim_start_matches('0');
        let digits = if trimmed.is_empty() { "0" } else { trimmed };
        Some(BigInt {
            negative: negative && digits != "0",
            digits,
        })
    }

    /// The nearest f64 (infinite past f64's range), rounding monotonically.
    pub(crate) fn to_f64(self) -> f64 {
        let magnitude: f64 = self.digits.parse().unwrap_or(f64::INFINITY);
        if self.negative {
            -magnitude
        } else {
            magnitude
        }
    }
}

/// A point in time: nanoseconds since 1970-01-01T00:00:00, counted in UTC
/// for an aware value (one with an offset), and on the wall clock, as if it
/// were UTC, for a naive one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Time {
    pub(crate) nanos: i128,
    pub(crate) aware: bool,
}

/// What a tagged object stands for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Tag<'a> {
    /// `$float` (NaN, inf, -inf); also a float `$numpy` value.
    Float(f64),
    /// `$int`: an integer beyond 64 bits.
    Int(BigInt<'a>),
    /// A `$numpy` number, boolean, or timedelta count: the JSON value
    /// itself (itself maybe a `$float` tag).
    Plain(&'a Value),
    /// `$datetime`, `$date`, a `$numpy` datetime64.
    Time(Time),
    /// A `$numpy` datetime64 or timedelta64 that is NaT.
    NotATime,
    /// A `$numpy` timedelta64 NaT: a count that is not a number (like NaN).
    NotANumber,
    /// `$tuple`: the list.
    Tuple(&'a [Value]),
    /// `$dict`: the object (whose one `$` member is a plain field).
    Dict(&'a Map<String, Value>),
}

/// The tag `map` is, if it is a well-formed one.
pub(crate) fn tag(map: &Map<String, Value>) -> Option<Tag<'_>> {
    if map.len() != 1 {
        return None;
    }
    let (name, body) = map.iter().next()?;
    if !name.starts_with('$') {
        return None;
    }
    Some(match (name.as_str(), body) {
        ("$float", Value::String(s)) => Tag::Float(match s.as_str() {
            "nan" => f64::NAN,
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            _ => return None,
        }),
        ("$int", Value::String(s)) => Tag::Int(BigInt::parse(s)?),
        ("$datetime", Value::String(s)) => Tag::Time(parse_iso(s)?),
        ("$date", Value::String(s)) => Tag::Time(parse_date_only(s)?),
        ("$tuple", Value::Array(items)) => Tag::Tuple(items),
        ("$dict", Value::Object(inner)) => Tag::Dict(inner),
        ("$numpy", Value::Array(pair)) => numpy(pair)?,
        _ => return None,
    })
}

/// `["<f4", 1.5]`, `["<M8[s]", "2024-03-01T00:00:00"]`, `["<m8[s]", 5]`...
fn numpy(pair: &[Value]) -> Option<Tag<'_>> {
    let [Value::String(dtype), value] = pair else {
        return None;
    };
    let kind = dtype
        .trim_start_matches(['<', '>', '|', '='])
        .bytes()
        .next()?;
    Some(match (kind, value) {
        (b'b', Value::Bool(_)) | (b'i' | b'u' | b'm', Value::Number(_)) => Tag::Plain(value),
        (b'f', Value::Number(_)) => Tag::Plain(value),
        (b'f', Value::Object(inner)) => match tag(inner)? {
            Tag::Float(f) => Tag::Float(f),
            _ => return None,
        },
        (b'M', Value::String(s)) if s == "NaT" => Tag::NotATime,
        (b'M', Value::String(s)) => Tag::Time(parse_numpy(s)?),
        (b'm', Value::String(s)) if s == "NaT" => Tag::NotANumber,
        _ => return None,
    })
}

/// The metadata fields of a record: `meta` itself, or the object inside
/// when the whole metadata is escaped as `{"$dict": {...}}` (a dict whose
/// only field's name starts with `$`).
pub(crate) fn fields(meta: &Map<String, Value>) -> &Map<String, Value> {
    match tag(meta) {
        Some(Tag::Dict(inner)) => inner,
        _ => meta,
    }
}

const NANOS_PER_SEC: i128 = 1_000_000_000;

fn is_leap(year: i64) -> bool {
    year.rem_euclid(4) == 0 && (year.rem_euclid(100) != 0 || year.rem_euclid(400) == 0)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A cursor over ASCII text.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn eat(&mut self, b: u8) -> bool {
        let hit = self.bytes.get(self.pos) == Some(&b);
        self.pos += usize::from(hit);
        hit
    }

    fn eat_any(&mut self, set: &[u8]) -> bool {
        match self.bytes.get(self.pos) {
            Some(b) if set.contains(b) => {
                self.pos += 1;
                true
            }
            _ => false,
        }
    }

    /// Exactly `n` digits.
    fn fixed(&mut self, n: usize) -> Option<u32> {
        let digits = self.bytes.get(self.pos..self.pos + n)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        self.pos += n;
        Some(
            digits
                .iter()
                .fold(0, |acc, d| acc * 10 + u32::from(d - b'0')),
        )
    }

    /// Between `min` and `max` digits, as many as there are.
    fn run(&mut self, min: usize, max: usize) -> Option<&[u8]> {
        let start = self.pos;
        while self.pos - start < max && self.bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
        (self.pos - start >= min).then(|| &self.bytes[start..self.pos])
    }

    /// `.f...`: the fraction of a second in nanoseconds (digits past the
    /// ninth, from numpy's finer units, are dropped); 0 without a dot.
    fn fraction(&mut self, max_digits: usize) -> Option<i128> {
        if !self.eat(b'.') {
            return Some(0);
        }
        let digits = self.run(1, max_digits)?;
        let mut nanos = 0i128;
        for i in 0..9 {
            nanos = nanos * 10 + digits.get(i).map_or(0, |d| i128::from(d - b'0'));
        }
        Some(nanos)
    }

    fn done(&self) -> bool {
        self.pos == self.bytes.len()
    }
}

/// `MM-DD` after the year: the day's start in nanoseconds.
fn month_day(c: &mut Cursor<'_>, year: i64) -> Option<i128> {
    let month = c.fixed(2)?;
    if !(1..=12).contains(&month) || !c.eat(b'-') {
        return None;
    }
    let day = c.fixed(2)?;
    if day < 1 || day > days_in_month(year, month) {
        return None;
    }
    Some(i128::from(days_from_civil(year, month, day)) * 86_400 * NANOS_PER_SEC)
}

/// `HH:MM[:SS[.f]]` (the minutes optional when `numpy`), in nanoseconds.
fn time_of_day(c: &mut Cursor<'_>, numpy: bool) -> Option<i128> {
    let hour = c.fixed(2)?;
    let (mut minute, mut second, mut fraction) = (0, 0, 0);
    if c.eat(b':') {
        minute = c.fixed(2)?;
        if c.eat(b':') {
            second = c.fixed(2)?;
            fraction = c.fraction(if numpy { 18 } else { 9 })?;
        }
    } else if !numpy {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let seconds = i128::from(hour * 3600 + minute * 60 + second);
    Some(seconds * NANOS_PER_SEC + fraction)
}

/// `Z` or `+HH:MM[:SS[.f]]` / `-...`: the offset east of UTC in
/// nanoseconds; `None` inside when there is none.
fn offset(c: &mut Cursor<'_>) -> Option<Option<i128>> {
    if c.eat_any(b"Zz") {
        return Some(Some(0));
    }
    let negative = match c.bytes.get(c.pos) {
        Some(b'+') => false,
        Some(b'-') => true,
        _ => return Some(None),
    };
    c.pos += 1;
    let hours = c.fixed(2)?;
    if !c.eat(b':') {
        return None;
    }
    let minutes = c.fixed(2)?;
    let (mut seconds, mut fraction) = (0, 0);
    if c.eat(b':') {
        seconds = c.fixed(2)?;
        fraction = c.fraction(6)?;
    }
    if hours > 23 || minutes > 59 || seconds > 59 {
        return None;
    }
    let total = i128::from(hours * 3600 + minutes * 60 + seconds) * NANOS_PER_SEC + fraction;
    Some(Some(if negative { -total } else { total }))
}

/// RFC 9557 suffixes (`[Europe/Paris]`, `[u-ca=iso8601]`) to the end.
fn suffixes(c: &mut Cursor<'_>) -> Option<()> {
    while c.eat(b'[') {
        let len = c.bytes[c.pos..]
            .iter()
            .take_while(|&&b| b != b']' && b != b'[')
            .count();
        if len == 0 {
            return None;
        }
        c.pos += len;
        if !c.eat(b']') {
            return None;
        }
    }
    Some(())
}

/// ISO 8601 text as queries read it: `YYYY-MM-DD` (midnight, naive), or
/// `YYYY-MM-DD` then `T`, `t` or a space, then `HH:MM[:SS[.f]]` (up to nine
/// fraction digits), optionally `Z` or an offset `+HH:MM` / `-HH:MM`
/// (seconds allowed, as Python writes them), and after an offset RFC 9557
/// suffixes such as `[Europe/Paris]`, ignored since the offset fixes the
/// instant. `None` for anything else, including impossible dates.
pub(crate) fn parse_iso(text: &str) -> Option<Time> {
    let c = &mut Cursor {
        bytes: text.as_bytes(),
        pos: 0,
    };
    let year = i64::from(c.fixed(4)?);
    if !c.eat(b'-') {
        return None;
    }
    let day = month_day(c, year)?;
    if c.done() {
        return Some(Time {
            nanos: day,
            aware: false,
        });
    }
    if !c.eat_any(b"Tt ") {
        return None;
    }
    let local = day + time_of_day(c, false)?;
    let offset = offset(c)?;
    if offset.is_some() {
        suffixes(c)?;
    }
    c.done().then_some(Time {
        nanos: local - offset.unwrap_or(0),
        aware: offset.is_some(),
    })
}

/// `YYYY-MM-DD` only (a `$date`): midnight, naive.
fn parse_date_only(text: &str) -> Option<Time> {
    if text.len() != 10 {
        return None;
    }
    parse_iso(text)
}

/// A numpy datetime64 as `np.datetime_as_string` writes it, naive, at any
/// unit: `2024`, `2024-03`, `2024-03-01`, `2024-03-01T12`,
/// `...T12:30`, `...T12:30:45.123456789012` (past nanoseconds, truncated);
/// years may be signed and of any width up to ten digits (`-001`, `10000`).
fn parse_numpy(text: &str) -> Option<Time> {
    let c = &mut Cursor {
        bytes: text.as_bytes(),
        pos: 0,
    };
    let negative = c.eat(b'-');
    let digits = c.run(1, 10)?;
    let year: i64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let year = if negative { -year } else { year };
    let nanos = if c.done() {
        month_start(year, 1)
    } else {
        if !c.eat(b'-') {
            return None;
        }
        let save = c.pos;
        let month = c.fixed(2)?;
        if c.done() {
            if !(1..=12).contains(&month) {
                return None;
            }
            month_start(year, month)
        } else {
            c.pos = save;
            let day = month_day(c, year)?;
            if c.done() {
                day
            } else if c.eat(b'T') {
                day + time_of_day(c, true)?
            } else {
                return None;
            }
        }
    };
    c.done().then_some(Time {
        nanos,
        aware: false,
    })
}

fn month_start(year: i64, month: u32) -> i128 {
    i128::from(days_from_civil(year, month, 1)) * 86_400 * NANOS_PER_SEC
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const H: i128 = 3600 * NANOS_PER_SEC;
    const DAY: i128 = 24 * H;
    /// 2024-03-01T00:00:00 in nanoseconds since the epoch.
    const MARCH_1: i128 = 19_783 * DAY;

    fn naive(nanos: i128) -> Option<Time> {
        Some(Time {
            nanos,
            aware: false,
        })
    }

    fn aware(nanos: i128) -> Option<Time> {
        Some(Time { nanos, aware: true })
    }

    #[test]
    fn iso_dates_and_datetimes() {
        assert_eq!(parse_iso("1970-01-01"), naive(0));
        assert_eq!(parse_iso("2024-03-01"), naive(MARCH_1));
        assert_eq!(parse_iso("2024-02-29"), naive(MARCH_1 - DAY));
        assert_eq!(
            parse_iso("1969-12-31T23:59:59.5"),
            naive(-NANOS_PER_SEC / 2)
        );
        assert_eq!(
            parse_iso("2024-03-01T12:30"),
            naive(MARCH_1 + 12 * H + 30 * 60 * NANOS_PER_SEC)
        );
        assert_eq!(parse_iso("2024-03-01 12:00:00"), naive(MARCH_1 + 12 * H));
        assert_eq!(parse_iso("2024-03-01t12:00:00"), naive(MARCH_1 + 12 * H));
        assert_eq!(
            parse_iso("2024-03-01T00:00:00.000000001"),
            naive(MARCH_1 + 1)
        );
        assert_eq!(
            parse_iso("2024-03-01T00:00:00.123456"),
            naive(MARCH_1 + 123_456_000)
        );
        assert_eq!(parse_iso("2024-03-01T12:00:00Z"), aware(MARCH_1 + 12 * H));
        assert_eq!(parse_iso("2024-03-01T12:00z"), aware(MARCH_1 + 12 * H));
        assert_eq!(
            parse_iso("2024-03-01T12:00:00+00:00"),
            aware(MARCH_1 + 12 * H)
        );
        assert_eq!(
            parse_iso("2024-03-01T12:00:00+01:00"),
            aware(MARCH_1 + 11 * H)
        );
        assert_eq!(
            parse_iso("2024-03-01T00:00-05:30"),
            aware(MARCH_1 + 5 * H + H / 2)
        );
        assert_eq!(
            parse_iso("2024-03-01T12:30:00+01:00[Europe/Paris]"),
            aware(MARCH_1 + 11 * H + H / 2)
        );
        assert_eq!(
            parse_iso("2024-03-01T12:00:00+01:00[!Europe/Paris][u-ca=iso8601]"),
            aware(MARCH_1 + 11 * H)
        );
        // Python's offsets with seconds.
        assert_eq!(
            parse_iso("2024-03-01T12:30:00+00:00:30.000005"),
            aware(MARCH_1 + 12 * H + 30 * 60 * NANOS_PER_SEC - 30 * NANOS_PER_SEC - 5_000)
        );
        assert_eq!(parse_iso("0001-01-01"), naive(-719_162 * DAY));
        assert_eq!(parse_iso("2000-02-29"), naive(11_016 * DAY));
    }

    #[test]
    fn not_iso() {
        for text in [
            "",
            "2024",
            "2024-03",
            "2024-3-01",
            "24-03-01",
            "2024-03-01T",
            "2024-03-01T12",
            "2024-03-01T12:3",
            "2024-03-01T12:30:",
            "2024-03-01T12:30:00.",
            "2024-03-01T12:30:00.1234567890",
            "2024-03-01T24:00",
            "2024-03-01T12:60",
            "2024-03-01T12:00:60",
            "2024-02-30",
            "2023-02-29",
            "1900-02-29",
            "2024-13-01",
            "2024-00-01",
            "2024-03-00",
            "2024-03-01X12:00",
            "2024-03-01T12:00+01",
            "2024-03-01T12:00+0100",
            "2024-03-01T12:00+24:00",
            "2024-03-01T12:00[Europe/Paris]",
            "2024-03-01T12:00+01:00[]",
            "2024-03-01T12:00+01:00[Europe/Paris",
            "2024-03-01T12:00+01:00 ",
            " 2024-03-01",
            "2024-03-01Z",
            "２０２４-03-01",
        ] {
            assert_eq!(parse_iso(text), None, "{text:?}");
        }
    }

    #[test]
    fn numpy_datetimes_at_every_unit() {
        assert_eq!(parse_numpy("2024"), parse_iso("2024-01-01"));
        assert_eq!(parse_numpy("2024-03"), parse_iso("2024-03-01"));
        assert_eq!(parse_numpy("2024-03-01"), parse_iso("2024-03-01"));
        assert_eq!(parse_numpy("2024-03-01T12"), parse_iso("2024-03-01T12:00"));
        assert_eq!(
            parse_numpy("2024-03-01T12:30"),
            parse_iso("2024-03-01T12:30")
        );
        assert_eq!(
            parse_numpy("2024-03-01T12:30:45.123456789012"),
            parse_iso("2024-03-01T12:30:45.123456789")
        );
        assert_eq!(parse_numpy("10000-01-01"), naive(2_932_897 * DAY));
        assert_eq!(parse_numpy("-001-01-01"), naive(-719_893 * DAY));
        for bad in [
            "NaT",
            "",
            "-",
            "2024-13",
            "2024-03-01T",
            "2024-03-01 12",
            "2024-03-01T12Z",
        ] {
            assert_eq!(parse_numpy(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn big_ints() {
        let b = |s| BigInt::parse(s).map(|b| (b.negative, b.digits));
        assert_eq!(b("123"), Some((false, "123")));
        assert_eq!(b("-0042"), Some((true, "42")));
        assert_eq!(b("-0"), Some((false, "0")));
        assert_eq!(b("000"), Some((false, "0")));
        for bad in ["", "-", "+1", "1.0", "1e3", " 1", "١"] {
            assert_eq!(b(bad), None, "{bad:?}");
        }
        assert_eq!(BigInt::parse("-1").unwrap().to_f64(), -1.0);
        assert_eq!(
            BigInt::parse(&"9".repeat(400)).unwrap().to_f64(),
            f64::INFINITY
        );
    }

    fn tag_of(v: Value) -> Option<String> {
        tag(v.as_object().unwrap()).map(|t| format!("{t:?}"))
    }

    #[test]
    fn tags_and_what_is_not_a_tag() {
        assert!(tag_of(json!({"$float": "nan"})).unwrap().contains("NaN"));
        assert!(tag_of(json!({"$float": "-inf"})).unwrap().contains("-inf"));
        assert!(tag_of(json!({"$int": "-123"})).unwrap().starts_with("Int"));
        assert!(tag_of(json!({"$date": "2024-03-01"}))
            .unwrap()
            .starts_with("Time"));
        assert!(tag_of(json!({"$datetime": "2024-03-01T00:00:00+01:00"})).is_some());
        assert!(tag_of(json!({"$tuple": [1]})).unwrap().starts_with("Tuple"));
        assert!(tag_of(json!({"$dict": {"$x": 1}}))
            .unwrap()
            .starts_with("Dict"));
        assert!(tag_of(json!({"$numpy": ["<f4", 1.5]}))
            .unwrap()
            .starts_with("Plain"));
        assert!(tag_of(json!({"$numpy": ["|b1", true]}))
            .unwrap()
            .starts_with("Plain"));
        assert!(tag_of(json!({"$numpy": ["<f8", {"$float": "nan"}]}))
            .unwrap()
            .starts_with("Float"));
        assert!(tag_of(json!({"$numpy": ["<M8[s]", "2024-03-01T00:00:00"]}))
            .unwrap()
            .starts_with("Time"));
        assert_eq!(
            tag_of(json!({"$numpy": ["<M8[s]", "NaT"]})).as_deref(),
            Some("NotATime")
        );
        assert_eq!(
            tag_of(json!({"$numpy": ["<m8[s]", "NaT"]})).as_deref(),
            Some("NotANumber")
        );
        assert!(tag_of(json!({"$numpy": ["<m8[s]", 5]}))
            .unwrap()
            .starts_with("Plain"));
        for plain in [
            json!({}),
            json!({"float": "nan"}),
            json!({"$float": "NaN"}),
            json!({"$float": 1.0}),
            json!({"$float": "nan", "x": 1}),
            json!({"$int": "1.5"}),
            json!({"$int": 5}),
            json!({"$date": "2024-03-01T00:00"}),
            json!({"$datetime": "yesterday"}),
            json!({"$tuple": {"a": 1}}),
            json!({"$dict": [1]}),
            json!({"$numpy": ["<c16", 1.0]}),
            json!({"$numpy": ["<f4", "1.5"]}),
            json!({"$numpy": ["<i8"]}),
            json!({"$numpy": ["|b1", 1]}),
            json!({"$numpy": ["<f8", {"$int": "1"}]}),
            json!({"$other": 1}),
        ] {
            assert_eq!(tag_of(plain.clone()), None, "{plain}");
        }
    }

    #[test]
    fn escaped_metadata_fields() {
        let escaped = json!({"$dict": {"$x": 1}});
        let inner = json!({"$x": 1});
        assert_eq!(
            fields(escaped.as_object().unwrap()),
            inner.as_object().unwrap()
        );
        let plain = json!({"$dict": {"$x": 1}, "y": 2});
        assert_eq!(
            fields(plain.as_object().unwrap()),
            plain.as_object().unwrap()
        );
    }
}
