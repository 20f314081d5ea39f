//! The syntax tree of a parsed query, and how a plain path reads as an array
//! name (`frames[0]` is the array `frames/0`) or an array fact
//! (`image.shape[0]`) when the metadata has no such field.

use serde_json::Value;

/// A condition: what a query, or one part of it, says of a record.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Node {
    /// Any of two or more conditions.
    Or(Vec<Node>),
    /// All of two or more conditions (a chain `a < b < c` is one too).
    And(Vec<Node>),
    Not(Box<Node>),
    Compare {
        lhs: Operand,
        op: CmpOp,
        rhs: Operand,
    },
    /// `exists(path)`.
    Exists(PathExpr),
    /// `isnan(path)`.
    IsNan(PathExpr),
    /// `path.startswith(arg)` and its kin.
    Method {
        target: PathExpr,
        method: Method,
        arg: Operand,
    },
}

/// One side of a comparison, or a method's argument.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Operand {
    Literal(Value),
    Path(PathExpr),
}

/// A comparison operator: `== != < <= > >= in`, `not in`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    NotIn,
}

/// A string or list method: `startswith`, `endswith`, `contains`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Method {
    StartsWith,
    EndsWith,
    Contains,
}

impl CmpOp {
    /// The operator with its operands swapped (`1 < x` is `x > 1`); `None`
    /// for `in` and `not in`, which do not swap.
    pub(super) fn flipped(self) -> Option<CmpOp> {
        Some(match self {
            CmpOp::Eq => CmpOp::Eq,
            CmpOp::Ne => CmpOp::Ne,
            CmpOp::Lt => CmpOp::Gt,
            CmpOp::Le => CmpOp::Ge,
            CmpOp::Gt => CmpOp::Lt,
            CmpOp::Ge => CmpOp::Le,
            CmpOp::In | CmpOp::NotIn => return None,
        })
    }
}

impl Method {
    /// The method called `name`, if there is one.
    pub(super) fn from_name(name: &str) -> Option<Method> {
        Some(match name {
            "startswith" => Method::StartsWith,
            "endswith" => Method::EndsWith,
            "contains" => Method::Contains,
            _ => return None,
        })
    }
}

/// What a path starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Root {
    /// `key`: the record's key.
    Key,
    /// `meta.<path>`: explicitly a metadata field, never an array fact.
    Meta,
    /// A plain path: a metadata field, else an array fact.
    Field,
}

/// One step of a path.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Seg {
    /// `.name` or `['name']`.
    Field(String),
    /// `[i]`; negative counts from the end.
    Index(i64),
}

/// An array fact a query can read: from the record's index entry, never the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FactKind {
    Shape,
    Dtype,
    Ndim,
    Nbytes,
    Size,
}

/// How a plain path reads as an array fact: `<array>.<fact>` or `<array>.shape[i]`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct FactRef {
    /// The array's path name, as [`crate::query::RecordView::array`] takes it.
    pub(super) array: String,
    pub(super) kind: FactKind,
    /// `shape[i]`: one dimension.
    pub(super) index: Option<i64>,
}

/// A path as parsed, with its readings as an array name and an array fact
/// worked out once at parse time.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PathExpr {
    pub(super) root: Root,
    /// Segments below the root; for `Root::Field` the first is the field name.
    pub(super) segs: Vec<Seg>,
    /// The whole path as an array name (for `exists`), when it can be one.
    pub(super) array: Option<String>,
    /// The path as an array fact, when it can be one.
    pub(super) fact: Option<FactRef>,
}

impl PathExpr {
    pub(super) fn new(root: Root, segs: Vec<Seg>) -> PathExpr {
        let (array, fact) = if root == Root::Field {
            (array_name(&segs), fact_ref(&segs))
        } else {
            (None, None)
        };
        PathExpr {
            root,
            segs,
            array,
            fact,
        }
    }
}

/// Array name of a path: fields and non-negative indexes joined by `/`.
fn array_name(segs: &[Seg]) -> Option<String> {
    let mut name = String::new();
    for (i, seg) in segs.iter().enumerate() {
        if i > 0 {
            name.push('/');
        }
        match seg {
            Seg::Field(f) => name.push_str(f),
            Seg::Index(n) if *n >= 0 => name.push_str(&n.to_string()),
            Seg::Index(_) => return None,
        }
    }
    (!name.is_empty()).then_some(name)
}

fn fact_kind(name: &str) -> Option<FactKind> {
    Some(match name {
        "shape" => FactKind::Shape,
        "dtype" => FactKind::Dtype,
        "ndim" => FactKind::Ndim,
        "nbytes" => FactKind::Nbytes,
        "size" => FactKind::Size,
        _ => return None,
    })
}

/// The array fact a path names, if it has the form of one.
fn fact_ref(segs: &[Seg]) -> Option<FactRef> {
    let n = segs.len();
    let (prefix, kind, index) = match segs {
        [.., Seg::Field(last)] if n >= 2 => (&segs[..n - 1], fact_kind(last)?, None),
        [.., Seg::Field(shape), Seg::Index(i)] if n >= 3 && shape == "shape" => {
            (&segs[..n - 2], FactKind::Shape, Some(*i))
        }
        _ => return None,
    };
    Some(FactRef {
        array: array_name(prefix)?,
        kind,
        index,
    })
}
