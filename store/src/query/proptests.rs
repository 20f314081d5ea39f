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
    ]
}

fn value_strategy() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => scalar_strategy(),
        1 => prop::collection::vec(scalar_strategy(), 0..3).prop_map(Value::Array),
        1 => (scalar_strategy(), scalar_strategy()).prop_map(|(x, y)| json!({"x": x, "y z": y})),
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

fn ref_get<'a>(meta: &'a Map<String, Value>, p: &RPath) -> Option<&'a Value> {
    let mut v = meta.get(p.root)?;
    for seg in &p.segs {
        v = match seg {
            RSeg::Field(name, _) => v.as_object()?.get(*name)?,
            RSeg::Index(i) => {
                let items = v.as_array()?;
                let i = if *i < 0 { items.len() as i64 + i } else { *i };
                if i < 0 {
                    return None;
                }
                items.get(i as usize)?
            }
        };
    }
    Some(v)
}

/// Twice the number, exactly (the generated floats are multiples of 0.5).
fn ref_doubled(n: &serde_json::Number) -> i128 {
    if let Some(u) = n.as_u64() {
        i128::from(u) * 2
    } else if let Some(i) = n.as_i64() {
        i128::from(i) * 2
    } else {
        let f = n.as_f64().unwrap() * 2.0;
        assert_eq!(f.fract(), 0.0);
        f as i128
    }
}

fn ref_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Number(x), Value::Number(y)) => ref_doubled(x) == ref_doubled(y),
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| ref_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| ref_eq(v, w)))
        }
        _ => false,
    }
}

fn ref_cmp(a: &Value, op: ROp, b: &Value) -> bool {
    if std::mem::discriminant(a) != std::mem::discriminant(b) {
        return false;
    }
    let order = match (a, b) {
        (Value::Number(x), Value::Number(y)) => Some(ref_doubled(x).cmp(&ref_doubled(y))),
        (Value::String(x), Value::String(y)) => Some(x.chars().cmp(y.chars())),
        _ => None,
    };
    match (op, order) {
        (ROp::Eq, _) => ref_eq(a, b),
        (ROp::Ne, _) => !ref_eq(a, b),
        (_, None) => false,
        (ROp::Lt, Some(o)) => o == Ordering::Less,
        (ROp::Le, Some(o)) => o != Ordering::Greater,
        (ROp::Gt, Some(o)) => o == Ordering::Greater,
        (ROp::Ge, Some(o)) => o != Ordering::Less,
    }
}

fn ref_eval(e: &RExpr, meta: &Map<String, Value>) -> bool {
    match e {
        RExpr::Cmp(p, op, v, flip) => match ref_get(meta, p) {
            None => false,
            Some(x) if *flip => ref_cmp(v, *op, x),
            Some(x) => ref_cmp(x, *op, v),
        },
        RExpr::CmpPaths(p, op, q) => match (ref_get(meta, p), ref_get(meta, q)) {
            (Some(x), Some(y)) => ref_cmp(x, *op, y),
            _ => false,
        },
        RExpr::In(p, items, negated) => match ref_get(meta, p) {
            None => false,
            Some(x) => items.iter().any(|i| ref_eq(x, i)) != *negated,
        },
        RExpr::Exists(p) => ref_get(meta, p).is_some(),
        RExpr::Method(p, m, arg) => match (ref_get(meta, p), m, arg) {
            (Some(Value::String(s)), RMethod::StartsWith, Value::String(a)) => {
                s.starts_with(a.as_str())
            }
            (Some(Value::String(s)), RMethod::EndsWith, Value::String(a)) => {
                s.ends_with(a.as_str())
            }
            (Some(Value::String(s)), RMethod::Contains, Value::String(a)) => s.contains(a.as_str()),
            (Some(Value::Array(items)), RMethod::Contains, a) => items.iter().any(|i| ref_eq(i, a)),
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
