//! Property tests of the whole query language: generated queries, spelled
//! in every accepted style, parse and agree with a reference evaluator
//! written independently of the module; arbitrary and mutated text never
//! makes the parser or the evaluator panic.

use std::cmp::Ordering;

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::test_support::*;
use super::Query;

/// A path in a generated query.
#[derive(Debug, Clone)]
struct RPath {
    root: &'static str,
    segs: Vec<RSeg>,
}

#[derive(Debug, Clone)]
enum RSeg {
    Field(&'static str, bool),
    Index(i64),
}

#[derive(Debug, Clone, Copy)]
enum ROp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, Copy)]
enum RMethod {
    StartsWith,
    EndsWith,
    Contains,
}

/// A generated query, evaluated by the reference evaluator below.
#[derive(Debug, Clone)]
enum RExpr {
    Cmp(RPath, ROp, Value, bool),
    CmpPaths(RPath, ROp, RPath),
    In(RPath, Vec<Value>, bool),
    Exists(RPath),
    IsNan(RPath),
    Method(RPath, RMethod, Value),
    Not(Box<RExpr>),
    And(Vec<RExpr>),
    Or(Vec<RExpr>),
    Paren(Box<RExpr>),
}

fn string_strategy() -> impl Strategy<Value = String> {
    let chars = vec![
        'a', 'b', 'Z', '\'', '"', '\\', '\n', 'é', '😀', '\u{ffff}', ' ',
    ];
    prop::collection::vec(prop::sample::select(chars), 0..4).prop_map(|v| v.into_iter().collect())
}

fn scalar_strategy() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-3i64..=3).prop_map(Value::from),
        prop::sample::select(vec![
            9_007_199_254_740_992i64,
            9_007_199_254_740_993,
            -9_007_199_254_740_993,
            i64::MIN,
            i64::MAX,
        ])
        .prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        (-6i32..=6).prop_map(|k| Value::from(f64::from(k) / 2.0)),
        prop::sample::select(vec![
            9_007_199_254_740_992.0f64,
            1e20,
            -1e20,
            18_446_744_073_709_551_616.0,
            -0.0,
        ])
        .prop_map(Value::from),
        string_strategy().prop_map(Value::String),
        iso_literal_strategy().prop_map(Value::String),
    ]
}

/// A wall-clock time near 2024-03-01 and maybe an offset, in minutes.
#[derive(Debug, Clone, Copy)]
struct TimeSpec {
    /// -2 (2024-02-28) to 2 (2024-03-03): the leap day in between.
    day: i64,
    hour: i64,
    minute: i64,
    /// Minutes east of UTC.
    offset: Option<i64>,
}

const DATES: [&str; 5] = [
    "2024-02-28",
    "2024-02-29",
    "2024-03-01",
    "2024-03-02",
    "2024-03-03",
];

impl TimeSpec {
    /// Minutes since 2024-03-01T00:00 UTC (naive: as if UTC).
    fn minutes(self) -> i64 {
        self.day * 1440 + self.hour * 60 + self.minute - self.offset.unwrap_or(0)
    }

    fn date(self) -> &'static str {
        DATES[(self.day + 2) as usize]
    }

    fn offset_text(self, z: bool) -> String {
        match self.offset {
            None => String::new(),
            Some(0) if z => "Z".into(),
            Some(o) => format!(
                "{}{:02}:{:02}",
                if o < 0 { '-' } else { '+' },
                o.abs() / 60,
                o.abs() % 60
            ),
        }
    }

    /// The ways a query may write it (`form` picks one).
    fn literal(self, form: u8) -> String {
        let (d, h, m) = (self.date(), self.hour, self.minute);
        match form % 4 {
            0 if self.offset.is_none() && h == 0 && m == 0 => d.to_owned(),
            0 | 1 => format!("{d}T{h:02}:{m:02}{}", self.offset_text(true)),
            2 => format!("{d} {h:02}:{m:02}:00{}", self.offset_text(false)),
            _ if self.offset.is_some() => {
                format!(
                    "{d}T{h:02}:{m:02}:00{}[Europe/Paris]",
                    self.offset_text(false)
                )
            }
            _ => format!("{d}T{h:02}:{m:02}:00.000000"),
        }
    }

    /// The tagged value Python writes for it (`form` picks one).
    fn stored(self, form: u8) -> Value {
        let (d, h, m) = (self.date(), self.hour, self.minute);
        let iso = format!("{d}T{h:02}:{m:02}:00");
        match (form % 3, self.offset) {
            (0, None) if h == 0 && m == 0 => json!({ "$date": d }),
            (1, None) => json!({"$numpy": ["<M8[m]", format!("{d}T{h:02}:{m:02}")]}),
            (2, Some(_)) => {
                json!({ "$datetime": format!("{iso}{}[Europe/Paris]", self.offset_text(false)) })
            }
            _ => json!({ "$datetime": format!("{iso}{}", self.offset_text(false)) }),
        }
    }
}

fn time_spec_strategy() -> impl Strategy<Value = TimeSpec> {
    (
        -2i64..=2,
        prop::sample::select(vec![0i64, 1, 12, 23]),
        prop::sample::select(vec![0i64, 30]),
        prop::option::of(prop::sample::select(vec![-330i64, 0, 60])),
    )
        .prop_map(|(day, hour, minute, offset)| TimeSpec {
            day,
            hour,
            minute,
            offset,
        })
}

/// ISO 8601 text, in the forms a query may write (plus one that is not).
fn iso_literal_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => (time_spec_strategy(), any::<u8>()).prop_map(|(t, form)| t.literal(form)),
        1 => Just("2024-03-01x".to_owned()),
    ]
}

/// Tagged values as the Python writer stores them.
fn tagged_strategy() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec!["nan", "inf", "-inf"]).prop_map(|f| json!({ "$float": f })),
        prop::sample::select(vec![
            "18446744073709551616",
            "-9223372036854775809",
            "100000000000000000000",
            "-100000000000000000000",
            "9007199254740993",
            "0",
        ])
        .prop_map(|i| json!({ "$int": i })),
        (-6i32..=6).prop_map(|k| json!({"$numpy": ["<f4", f64::from(k) / 2.0]})),
        (-3i64..=3).prop_map(|i| json!({"$numpy": ["<i8", i]})),
        Just(json!({"$numpy": ["<f8", {"$float": "nan"}]})),
        Just(json!({"$numpy": ["<M8[s]", "NaT"]})),
        (time_spec_strategy(), any::<u8>()).prop_map(|(t, form)| t.stored(form)),
        prop::collection::vec(scalar_strategy(), 0..3).prop_map(|v| json!({ "$tuple": v })),
        scalar_strategy().prop_map(|v| json!({"$dict": {"$x": v}})),
        (scalar_strategy(), tagged_leaf_strategy())
            .prop_map(|(v, t)| json!({"$dict": {"$x": {"$tuple": [v, t]}}})),
        // Not tags: plain objects.
        Just(json!({"$float": "NaN"})),
        Just(json!({"$x": 1})),
    ]
}

fn tagged_leaf_strategy() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"$float": "nan"})),
        Just(json!({"$int": "-100000000000000000000"})),
        time_spec_strategy().prop_map(|t| t.stored(0)),
    ]
}

fn value_strategy() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => scalar_strategy(),
        2 => tagged_strategy(),
        1 => prop::collection::vec(scalar_strategy(), 0..3).prop_map(Value::Array),
        1 => (scalar_strategy(), scalar_strategy()).prop_map(|(x, y)| json!({"x": x, "y z": y})),
        1 => (tagged_strategy(), scalar_strategy()).prop_map(|(x, y)| json!({"x": x, "y z": y})),
    ]
}

fn literal_strategy() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => scalar_strategy(),
        1 => prop::collection::vec(scalar_strategy(), 0..3).prop_map(Value::Array),
    ]
}

const FIELDS: [&str; 4] = ["a", "b", "c", "d"];

fn record_strategy() -> impl Strategy<Value = TestRecord> {
    prop::collection::vec(prop::option::of(value_strategy()), 4).prop_map(|values| {
        let mut meta = Map::new();
        for (name, value) in FIELDS.iter().zip(values) {
            if let Some(value) = value {
                meta.insert((*name).to_owned(), value);
            }
        }
        TestRecord::new(Value::Object(meta))
    })
}

fn path_strategy() -> impl Strategy<Value = RPath> {
    let seg = prop_oneof![
        any::<bool>().prop_map(|b| RSeg::Field("x", b)),
        Just(RSeg::Field("y z", true)),
        Just(RSeg::Field("$x", true)),
        (-2i64..=2).prop_map(RSeg::Index),
    ];
    (
        prop::sample::select(FIELDS.to_vec()),
        prop::collection::vec(seg, 0..2),
    )
        .prop_map(|(root, segs)| RPath { root, segs })
}

fn op_strategy() -> impl Strategy<Value = ROp> {
    prop::sample::select(vec![ROp::Eq, ROp::Ne, ROp::Lt, ROp::Le, ROp::Gt, ROp::Ge])
}

fn expr_strategy() -> impl Strategy<Value = RExpr> {
    let leaf = prop_oneof![
        4 => (path_strategy(), op_strategy(), literal_strategy(), any::<bool>())
            .prop_map(|(p, op, v, flip)| RExpr::Cmp(p, op, v, flip)),
        1 => (path_strategy(), op_strategy(), path_strategy())
            .prop_map(|(p, op, q)| RExpr::CmpPaths(p, op, q)),
        2 => (path_strategy(), prop::collection::vec(scalar_strategy(), 0..3), any::<bool>())
            .prop_map(|(p, items, neg)| RExpr::In(p, items, neg)),
        1 => path_strategy().prop_map(RExpr::Exists),
        1 => path_strategy().prop_map(RExpr::IsNan),
        1 => (
            path_strategy(),
            prop::sample::select(vec![RMethod::StartsWith, RMethod::EndsWith, RMethod::Contains]),
            literal_strategy(),
        )
            .prop_map(|(p, m, v)| RExpr::Method(p, m, v)),
    ];
    leaf.prop_recursive(4, 32, 3, |inner| {
        prop_oneof![
            inner.clone().prop_map(|e| RExpr::Not(Box::new(e))),
            prop::collection::vec(inner.clone(), 2..4).prop_map(RExpr::And),
            prop::collection::vec(inner.clone(), 2..4).prop_map(RExpr::Or),
            inner.prop_map(|e| RExpr::Paren(Box::new(e))),
        ]
    })
}

/// How a generated query is spelled: spacing, quotes, keyword spellings.
#[derive(Debug, Clone, Copy)]
struct Style {
    tight: bool,
    double_quotes: bool,
    python_words: bool,
    escape_unicode: bool,
}

fn style_strategy() -> impl Strategy<Value = Style> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(a, b, c, d)| Style {
        tight: a,
        double_quotes: b,
        python_words: c,
        escape_unicode: d,
    })
}

fn render_value(v: &Value, style: Style, out: &mut String) {
    match v {
        Value::Null => out.push_str(if style.python_words { "None" } else { "null" }),
        Value::Bool(b) => out.push_str(match (b, style.python_words) {
            (true, false) => "true",
            (true, true) => "True",
            (false, false) => "false",
            (false, true) => "False",
        }),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => out.push_str(&u.to_string()),
            (_, Some(i), _) => out.push_str(&i.to_string()),
            (_, _, Some(f)) => out.push_str(&format!("{f:?}")),
            _ => unreachable!(),
        },
        Value::String(s) => {
            let quote = if style.double_quotes { '"' } else { '\'' };
            out.push(quote);
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    c if c == quote => {
                        out.push('\\');
                        out.push(c);
                    }
                    c if style.escape_unicode && !c.is_ascii() => {
                        let mut units = [0u16; 2];
                        for unit in c.encode_utf16(&mut units) {
                            out.push_str(&format!("\\u{unit:04x}"));
                        }
                    }
                    c => out.push(c),
                }
            }
            out.push(quote);
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render_value(item, style, out);
            }
            out.push(']');
        }
        Value::Object(_) => unreachable!("no object literals"),
    }
}

fn render_path(p: &RPath, out: &mut String) {
    out.push_str(p.root);
    for seg in &p.segs {
        match seg {
            RSeg::Field(name, true) => out.push_str(&format!("[{name:?}]")),
            RSeg::Field(name, false) => {
                out.push('.');
                out.push_str(name);
            }
            RSeg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
}

fn op_text(op: ROp) -> &'static str {
    match op {
        ROp::Eq => "==",
        ROp::Ne => "!=",
        ROp::Lt => "<",
        ROp::Le => "<=",
        ROp::Gt => ">",
        ROp::Ge => ">=",
    }
}

fn precedence(e: &RExpr) -> u8 {
    match e {
        RExpr::Or(_) => 1,
        RExpr::And(_) => 2,
        RExpr::Not(_) => 3,
        _ => 4,
    }
}

/// Renders `e` with the fewest parentheses the precedence rules allow (plus the
/// explicit `Paren` nodes).
fn render(e: &RExpr, style: Style, out: &mut String) {
    let sp = if style.tight { "" } else { " " };
    let child = |c: &RExpr, min: u8, out: &mut String| {
        if precedence(c) < min {
            out.push('(');
            render(c, style, out);
            out.push(')');
        } else {
            render(c, style, out);
        }
    };
    match e {
        RExpr::Cmp(p, op, v, flip) => {
            if *flip {
                render_value(v, style, out);
                out.push_str(&format!("{sp}{}{sp}", op_text(*op)));
                render_path(p, out);
            } else {
                render_path(p, out);
                out.push_str(&format!("{sp}{}{sp}", op_text(*op)));
                render_value(v, style, out);
            }
        }
        RExpr::CmpPaths(p, op, q) => {
            render_path(p, out);
            out.push_str(&format!("{sp}{}{sp}", op_text(*op)));
            render_path(q, out);
        }
        RExpr::In(p, items, negated) => {
            render_path(p, out);
            out.push_str(if *negated { " not in " } else { " in " });
            render_value(&Value::Array(items.clone()), style, out);
        }
        RExpr::Exists(p) => {
            out.push_str("exists(");
            render_path(p, out);
            out.push(')');
        }
        RExpr::IsNan(p) => {
            out.push_str("isnan(");
            render_path(p, out);
            out.push(')');
        }
        RExpr::Method(p, m, v) => {
            render_path(p, out);
            out.push_str(match m {
                RMethod::StartsWith => ".startswith(",
                RMethod::EndsWith => ".endswith(",
                RMethod::Contains => ".contains(",
            });
            render_value(v, style, out);
            out.push(')');
        }
        RExpr::Not(inner) => {
            out.push_str("not ");
            child(inner, 3, out);
        }
        RExpr::And(items) | RExpr::Or(items) => {
            let (word, min) = if matches!(e, RExpr::And(_)) {
                ("and", 2)
            } else {
                ("or", 1)
            };
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&format!(" {word} "));
                }
                child(item, min, out);
            }
        }
        RExpr::Paren(inner) => {
            out.push('(');
            render(inner, style, out);
            out.push(')');
        }
    }
}

// The reference evaluator: written for clarity, independently of the module.

/// A number as the reference sees it: twice its value (the generated
/// floats are multiples of 0.5), or an infinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum RNum {
    NegInf,
    Doubled(i128),
    PosInf,
}

/// A metadata value as the reference sees it, tags decoded.
#[derive(Debug, Clone)]
enum RV<'a> {
    Null,
    Bool(bool),
    Num(RNum),
    NaN,
    Str(&'a str),
    /// Minutes since 2024-03-01T00:00 (UTC for aware values).
    Time(i64, bool),
    NaT,
    List(Vec<RV<'a>>),
    Obj(Vec<(&'a str, RV<'a>)>),
}

/// Every ISO 8601 text the generators write, with what it stands for:
/// (minutes, aware). Text not in here is not ISO 8601.
fn ref_iso() -> &'static std::collections::HashMap<String, (i64, bool)> {
    static ISO: std::sync::OnceLock<std::collections::HashMap<String, (i64, bool)>> =
        std::sync::OnceLock::new();
    ISO.get_or_init(|| {
        let mut map = std::collections::HashMap::new();
        for day in -2..=2 {
            for hour in [0, 1, 12, 23] {
                for minute in [0, 30] {
                    for offset in [None, Some(-330), Some(0), Some(60)] {
                        let t = TimeSpec {
                            day,
                            hour,
                            minute,
                            offset,
                        };
                        for form in 0..12 {
                            let mut texts = vec![t.literal(form)];
                            if let Some(Value::String(s)) =
                                t.stored(form).as_object().unwrap().values().next()
                            {
                                texts.push(s.clone());
                            }
                            for text in texts {
                                map.insert(text, (t.minutes(), offset.is_some()));
                            }
                        }
                    }
                }
            }
        }
        map
    })
}

fn ref_num(n: &serde_json::Number) -> RNum {
    RNum::Doubled(if let Some(u) = n.as_u64() {
        i128::from(u) * 2
    } else if let Some(i) = n.as_i64() {
        i128::from(i) * 2
    } else {
        let f = n.as_f64().unwrap() * 2.0;
        assert_eq!(f.fract(), 0.0);
        f as i128
    })
}

fn ref_value(v: &Value) -> RV<'_> {
    match v {
        Value::Null => RV::Null,
        Value::Bool(b) => RV::Bool(*b),
        Value::Number(n) => RV::Num(ref_num(n)),
        Value::String(s) => RV::Str(s),
        Value::Array(items) => RV::List(items.iter().map(ref_value).collect()),
        Value::Object(map) => {
            let plain = || {
                RV::Obj(
                    map.iter()
                        .map(|(k, v)| (k.as_str(), ref_value(v)))
                        .collect(),
                )
            };
            if map.len() != 1 {
                return plain();
            }
            let (name, body) = map.iter().next().unwrap();
            match (name.as_str(), body) {
                ("$float", Value::String(s)) if s == "nan" => RV::NaN,
                ("$float", Value::String(s)) if s == "inf" => RV::Num(RNum::PosInf),
                ("$float", Value::String(s)) if s == "-inf" => RV::Num(RNum::NegInf),
                ("$int", Value::String(s)) => {
                    RV::Num(RNum::Doubled(s.parse::<i128>().unwrap() * 2))
                }
                ("$tuple", Value::Array(items)) => RV::List(items.iter().map(ref_value).collect()),
                ("$dict", Value::Object(inner)) => RV::Obj(
                    inner
                        .iter()
                        .map(|(k, v)| (k.as_str(), ref_value(v)))
                        .collect(),
                ),
                ("$datetime" | "$date", Value::String(s)) => {
                    let (minutes, aware) = ref_iso()[s];
                    RV::Time(minutes, aware)
                }
                ("$numpy", Value::Array(pair)) => match (pair[0].as_str().unwrap(), &pair[1]) {
                    (_, Value::String(s)) if s == "NaT" => RV::NaT,
                    ("<M8[m]", Value::String(s)) => RV::Time(ref_iso()[s].0, false),
                    (_, inner) => ref_value(inner),
                },
                _ => plain(),
            }
        }
    }
}

fn ref_get<'a>(meta: &'a Map<String, Value>, p: &RPath) -> Option<RV<'a>> {
    let mut v = ref_value(meta.get(p.root)?);
    for seg in &p.segs {
        v = match (seg, v) {
            (RSeg::Field(name, _), RV::Obj(fields)) => {
                fields.into_iter().find(|(k, _)| k == name)?.1
            }
            (RSeg::Index(i), RV::List(mut items)) => {
                let i = if *i < 0 { items.len() as i64 + i } else { *i };
                if i < 0 || i as usize >= items.len() {
                    return None;
                }
                items.swap_remove(i as usize)
            }
            _ => return None,
        };
    }
    Some(v)
}

/// How two values relate: ordered, unequal and unordered (NaN, NaT, naive
/// against aware: only `!=` holds), or not comparable (every operator false).
enum Rel {
    Ordered(Option<Ordering>),
    Unordered,
    Incomparable,
}

fn ref_rel(a: &RV, b: &RV) -> Rel {
    let iso = |s: &str| ref_iso().get(s).copied();
    match (a, b) {
        (RV::Null, RV::Null) => Rel::Ordered(None),
        (RV::Bool(x), RV::Bool(y)) if x == y => Rel::Ordered(None),
        (RV::Bool(_), RV::Bool(_)) => Rel::Unordered,
        (RV::Num(x), RV::Num(y)) => Rel::Ordered(Some(x.cmp(y))),
        (RV::NaN, RV::Num(_) | RV::NaN) | (RV::Num(_), RV::NaN) => Rel::Unordered,
        (RV::Str(x), RV::Str(y)) => Rel::Ordered(Some(x.chars().cmp(y.chars()))),
        (RV::Time(x, p), RV::Time(y, q)) if p == q => Rel::Ordered(Some(x.cmp(y))),
        (RV::Time(..) | RV::NaT, RV::Time(..) | RV::NaT) => Rel::Unordered,
        (RV::Time(x, _), RV::Str(s)) => match iso(s) {
            Some((y, _)) => Rel::Ordered(Some(x.cmp(&y))),
            None => Rel::Incomparable,
        },
        (RV::Str(_), RV::Time(..) | RV::NaT) => match ref_rel(b, a) {
            Rel::Ordered(o) => Rel::Ordered(o.map(Ordering::reverse)),
            other => other,
        },
        (RV::NaT, RV::Str(s)) if iso(s).is_some() => Rel::Unordered,
        (RV::List(x), RV::List(y)) => {
            if x.len() == y.len() && x.iter().zip(y).all(|(p, q)| ref_eq(p, q)) {
                Rel::Ordered(None)
            } else {
                Rel::Unordered
            }
        }
        (RV::Obj(x), RV::Obj(y)) => {
            let same = x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.iter().any(|(j, w)| j == k && ref_eq(v, w)));
            if same {
                Rel::Ordered(None)
            } else {
                Rel::Unordered
            }
        }
        _ => Rel::Incomparable,
    }
}

fn ref_eq(a: &RV, b: &RV) -> bool {
    matches!(ref_rel(a, b), Rel::Ordered(None | Some(Ordering::Equal)))
}

fn ref_cmp(a: &RV, op: ROp, b: &RV) -> bool {
    match (ref_rel(a, b), op) {
        (Rel::Incomparable, _) => false,
        (rel, ROp::Eq) => matches!(rel, Rel::Ordered(None | Some(Ordering::Equal))),
        (rel, ROp::Ne) => !matches!(rel, Rel::Ordered(None | Some(Ordering::Equal))),
        (Rel::Ordered(Some(o)), ROp::Lt) => o == Ordering::Less,
        (Rel::Ordered(Some(o)), ROp::Le) => o != Ordering::Greater,
        (Rel::Ordered(Some(o)), ROp::Gt) => o == Ordering::Greater,
        (Rel::Ordered(Some(o)), ROp::Ge) => o != Ordering::Less,
        _ => false,
    }
}

fn ref_eval(e: &RExpr, meta: &Map<String, Value>) -> bool {
    match e {
        RExpr::Cmp(p, op, v, flip) => match ref_get(meta, p) {
            None => false,
            Some(x) if *flip => ref_cmp(&ref_value(v), *op, &x),
            Some(x) => ref_cmp(&x, *op, &ref_value(v)),
        },
        RExpr::CmpPaths(p, op, q) => match (ref_get(meta, p), ref_get(meta, q)) {
            (Some(x), Some(y)) => ref_cmp(&x, *op, &y),
            _ => false,
        },
        RExpr::In(p, items, negated) => match ref_get(meta, p) {
            None => false,
            Some(x) => items.iter().any(|i| ref_eq(&x, &ref_value(i))) != *negated,
        },
        RExpr::Exists(p) => ref_get(meta, p).is_some(),
        RExpr::IsNan(p) => matches!(ref_get(meta, p), Some(RV::NaN | RV::NaT)),
        RExpr::Method(p, m, arg) => match (ref_get(meta, p), m, arg) {
            (Some(RV::Str(s)), RMethod::StartsWith, Value::String(a)) => s.starts_with(a.as_str()),
            (Some(RV::Str(s)), RMethod::EndsWith, Value::String(a)) => s.ends_with(a.as_str()),
            (Some(RV::Str(s)), RMethod::Contains, Value::String(a)) => s.contains(a.as_str()),
            (Some(RV::List(items)), RMethod::Contains, a) => {
                items.iter().any(|i| ref_eq(i, &ref_value(a)))
            }
            _ => false,
        },
        RExpr::Not(inner) => !ref_eval(inner, meta),
        RExpr::And(items) => items.iter().all(|i| ref_eval(i, meta)),
        RExpr::Or(items) => items.iter().any(|i| ref_eval(i, meta)),
        RExpr::Paren(inner) => ref_eval(inner, meta),
    }
}

/// Parses arbitrary text; on success evaluates it, on failure checks the error.
fn parse_never_panics(src: &str) {
    match Query::parse(src) {
        Ok(q) => {
            assert_eq!(q.source(), src);
            for rec in [sample(), TestRecord::new(json!({}))] {
                q.matches(&rec);
            }
        }
        Err(e) => {
            let n = src.chars().count();
            assert!(
                (1..=n + 1).contains(&e.column),
                "column {} of {src:?}",
                e.column
            );
            assert!(e.to_string().contains(&e.message));
            assert_eq!(e.expression, src);
        }
    }
}

const TOKENS: &[&str] = &[
    "(",
    ")",
    "[",
    "]",
    ",",
    ".",
    "-",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "=",
    "!",
    "&&",
    "and",
    "or",
    "not",
    "in",
    "exists",
    "isnan",
    "startswith",
    "contains",
    "key",
    "meta",
    "a",
    "tags",
    "image",
    "shape",
    "dtype",
    "1",
    "-2",
    "2.5",
    "1e3",
    "'s'",
    "\"t\"",
    "'",
    "\\",
    "true",
    "None",
    "温度",
    "😀",
    " ",
    "\n",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn generated_queries_parse_and_agree_with_reference(
        expr in expr_strategy(),
        style in style_strategy(),
        records in prop::collection::vec(record_strategy(), 1..4),
    ) {
        let mut src = String::new();
        render(&expr, style, &mut src);
        let q = Query::parse(&src).map_err(|e| TestCaseError::fail(format!("{src:?}: {e}")))?;
        for rec in &records {
            prop_assert_eq!(
                q.matches(rec),
                ref_eval(&expr, &rec.meta),
                "query {:?} on {:?}", src, rec.meta
            );
        }
    }

    #[test]
    fn columns_agree_with_records(
        expr in expr_strategy(),
        style in style_strategy(),
        records in prop::collection::vec(record_strategy(), 1..40),
        arrays in prop::collection::vec(prop::option::of((0usize..4, prop::collection::vec(0u64..4, 0..3))), 1..40),
    ) {
        let mut src = String::new();
        render(&expr, style, &mut src);
        let q = Query::parse(&src).map_err(|e| TestCaseError::fail(format!("{src:?}: {e}")))?;
        let records: Vec<TestRecord> = records
            .into_iter()
            .enumerate()
            .map(|(i, mut r)| {
                r.key = format!("k{i:03}");
                match arrays.get(i).cloned().flatten() {
                    Some((name, shape)) => r.with_array(FIELDS[name], &shape, "float64", "'<f8'"),
                    None => r,
                }
            })
            .collect();
        assert_columns_agree(&q, &records);
    }

    #[test]
    fn number_and_string_columns_agree_with_records(
        values in prop::collection::vec(prop_oneof![
            4 => scalar_strategy(),
            1 => tagged_strategy(),
            1 => Just(Value::Null),
        ], 1..60),
        op in op_strategy(),
        literal in scalar_strategy(),
        flip in any::<bool>(),
        nested in any::<bool>(),
    ) {
        let records: Vec<TestRecord> = values
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                let meta = if nested { json!({"p": {"a": v}}) } else { json!({"a": v}) };
                TestRecord::keyed(&format!("k{i:03}"), meta)
            })
            .collect();
        let mut lit = String::new();
        render_value(&literal, style_all_off(), &mut lit);
        let path = if nested { "p.a" } else { "a" };
        let src = if flip {
            format!("{lit} {} {path}", op_text(op))
        } else {
            format!("{path} {} {lit}", op_text(op))
        };
        let q = Query::parse(&src).map_err(|e| TestCaseError::fail(format!("{src:?}: {e}")))?;
        assert_columns_agree(&q, &records);
        for src in [format!("{path} in [{lit}, 1, 'a']"), format!("{path} not in [{lit}]"),
                    format!("not ({path} == {lit})"), format!("exists({path})"), format!("isnan({path})"),
                    format!("{path}.startswith('a')"), format!("{path}.contains({lit})")] {
            let q = Query::parse(&src).map_err(|e| TestCaseError::fail(format!("{src:?}: {e}")))?;
            assert_columns_agree(&q, &records);
        }
    }

    #[test]
    fn arbitrary_strings_never_panic(src in any::<String>()) {
        parse_never_panics(&src);
    }

    #[test]
    fn token_soup_never_panics(tokens in prop::collection::vec(prop::sample::select(TOKENS), 0..40)) {
        parse_never_panics(&tokens.join(" "));
        parse_never_panics(&tokens.concat());
    }

    #[test]
    fn mutated_queries_never_panic(
        expr in expr_strategy(),
        style in style_strategy(),
        at in any::<prop::sample::Index>(),
        insert in prop::sample::select(vec!["", "(", ")", "'", "\"", "[", "]", "not ", "\\", "=", "é"]),
    ) {
        let mut src = String::new();
        render(&expr, style, &mut src);
        let chars: Vec<char> = src.chars().collect();
        let i = at.index(chars.len() + 1);
        let mut mutated: String = chars[..i].iter().collect();
        mutated.push_str(insert);
        // Drop one character when inserting nothing.
        let skip = usize::from(insert.is_empty() && i < chars.len());
        mutated.extend(&chars[i + skip..]);
        parse_never_panics(&mutated);
    }
}

#[test]
fn generated_query_rendering_round_trips_examples() {
    // Spot checks of the generator's renderer, so the property test means something.
    let style = Style {
        tight: false,
        double_quotes: false,
        python_words: true,
        escape_unicode: true,
    };
    let e = RExpr::And(vec![
        RExpr::Or(vec![
            RExpr::Exists(RPath {
                root: "a",
                segs: vec![RSeg::Field("y z", true)],
            }),
            RExpr::Cmp(
                RPath {
                    root: "b",
                    segs: vec![RSeg::Index(-1)],
                },
                ROp::Le,
                json!("é'"),
                true,
            ),
        ]),
        RExpr::Not(Box::new(RExpr::In(
            RPath {
                root: "c",
                segs: vec![],
            },
            vec![Value::Null],
            true,
        ))),
    ]);
    let mut src = String::new();
    render(&e, style, &mut src);
    assert_eq!(
        src,
        r#"(exists(a["y z"]) or '\u00e9\'' <= b[-1]) and not c not in [None]"#
    );
    let rec = TestRecord::new(json!({"a": {"y z": 1}, "c": null}));
    assert_eq!(query(&src).matches(&rec), ref_eval(&e, &rec.meta));
    assert!(query(&src).matches(&rec));
}

/// Generated datetimes, stored in each way Python writes it, against every
/// literal form and against each other: the module agrees with the
/// reference, and the comparisons are not all false.
#[test]
fn datetimes_agree_with_reference_exhaustively() {
    let mut specs = Vec::new();
    for day in -2..=2 {
        for hour in [0, 1, 12, 23] {
            for minute in [0, 30] {
                for offset in [None, Some(-330), Some(0), Some(60)] {
                    specs.push(TimeSpec {
                        day,
                        hour,
                        minute,
                        offset,
                    });
                }
            }
        }
    }
    let ops = [ROp::Eq, ROp::Ne, ROp::Lt, ROp::Le, ROp::Gt, ROp::Ge];
    let path = RPath {
        root: "a",
        segs: vec![],
    };
    let mut queries = Vec::new();
    for t in &specs {
        for form in 0..4 {
            for op in ops {
                let e = RExpr::Cmp(path.clone(), op, Value::String(t.literal(form)), false);
                let mut src = String::new();
                render(&e, style_all_off(), &mut src);
                queries.push((query(&src), e));
            }
        }
    }
    let mut matched = 0usize;
    let mut records = 0usize;
    // Every fifth datetime stored (5 is prime to the 32 datetimes of a day,
    // so each time of day and offset is among them).
    for (i, t) in specs.iter().enumerate().step_by(5) {
        for form in 0..3 {
            records += 1;
            let rec = TestRecord::new(
                json!({"a": t.stored(form), "b": specs[(i * 7) % specs.len()].stored(form + 1)}),
            );
            for (q, e) in &queries {
                let want = ref_eval(e, &rec.meta);
                assert_eq!(q.matches(&rec), want, "{} on {:?}", q.source(), rec.meta);
                matched += usize::from(want);
            }
            for op in ops {
                let e = RExpr::CmpPaths(
                    path.clone(),
                    op,
                    RPath {
                        root: "b",
                        segs: vec![],
                    },
                );
                let mut src = String::new();
                render(&e, style_all_off(), &mut src);
                assert_eq!(
                    query(&src).matches(&rec),
                    ref_eval(&e, &rec.meta),
                    "{src} on {:?}",
                    rec.meta
                );
            }
        }
    }
    assert!(matched > queries.len() * records / 4, "{matched}");
}

fn style_all_off() -> Style {
    Style {
        tight: false,
        double_quotes: false,
        python_words: false,
        escape_unicode: false,
    }
}
