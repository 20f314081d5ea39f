//! Output shaping over hand-built column batches (the builder's conventions).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringDictionaryBuilder, UInt64Builder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema};

use super::{civil_from_days, iso_micros, shape, Rows};

/// A column of a batch: its field (with the builder's metadata) and array.
fn col(name: &str, meta: &[(&str, &str)], array: ArrayRef) -> (Field, ArrayRef) {
    let metadata: HashMap<String, String> = meta
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    (
        Field::new(name, array.data_type().clone(), true).with_metadata(metadata),
        array,
    )
}

fn key(keys: &[&str]) -> (Field, ArrayRef) {
    col(
        "key",
        &[("lazyvault.kind", "key")],
        Arc::new(StringArray::from(keys.to_vec())),
    )
}

fn live(n: usize) -> (Field, ArrayRef) {
    col(
        "$live",
        &[("lazyvault.kind", "live")],
        Arc::new(BooleanArray::from(vec![true; n])),
    )
}

fn meta(name: &str, array: ArrayRef) -> (Field, ArrayRef) {
    let path = serde_json::to_string(&name.split('.').collect::<Vec<_>>()).unwrap();
    col(
        name,
        &[("lazyvault.kind", "meta"), ("lazyvault.path", &path)],
        array,
    )
}

fn json(name: &str, values: Vec<Option<&str>>) -> (Field, ArrayRef) {
    let path = serde_json::to_string(&name.split('.').collect::<Vec<_>>()).unwrap();
    col(
        name,
        &[("lazyvault.kind", "json"), ("lazyvault.path", &path)],
        Arc::new(StringArray::from(values)),
    )
}

fn dict(values: Vec<Option<&str>>) -> ArrayRef {
    let mut b = StringDictionaryBuilder::<Int32Type>::new();
    for v in values {
        b.append_option(v);
    }
    Arc::new(b.finish())
}

/// The four fact columns of array `a`.
fn facts(
    a: &str,
    shapes: Vec<Option<Vec<u64>>>,
    dtypes: Vec<Option<&str>>,
) -> Vec<(Field, ArrayRef)> {
    let mut shape_b = ListBuilder::new(UInt64Builder::new());
    for s in &shapes {
        match s {
            Some(s) => {
                shape_b.values().append_slice(s);
                shape_b.append(true);
            }
            None => shape_b.append(false),
        }
    }
    let nbytes: Vec<Option<u64>> = shapes.iter().map(|s| s.as_ref().map(|_| 8)).collect();
    let fact = |f: &'static str, array: ArrayRef| {
        col(
            &format!("{a}.{f}"),
            &[
                ("lazyvault.kind", "fact"),
                ("lazyvault.array", a),
                ("lazyvault.fact", f),
            ],
            array,
        )
    };
    vec![
        fact("shape", Arc::new(shape_b.finish())),
        fact("dtype", dict(dtypes.clone())),
        fact("descr", dict(dtypes)),
        fact("nbytes", Arc::new(arrow_array::UInt64Array::from(nbytes))),
    ]
}

/// Row 0 of each batch, in this order.
fn first_rows<'a>(batches: &[&'a RecordBatch]) -> Vec<Rows<'a>> {
    batches
        .iter()
        .map(|batch| Rows { batch, rows: &[0] })
        .collect()
}

fn batch(columns: Vec<(Field, ArrayRef)>) -> RecordBatch {
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns.into_iter().unzip();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

fn names(b: &RecordBatch) -> Vec<String> {
    b.schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect()
}

fn keys(b: &RecordBatch) -> Vec<&str> {
    b.column(0)
        .as_string::<i32>()
        .iter()
        .map(Option::unwrap)
        .collect()
}

fn texts(a: &ArrayRef) -> Vec<Option<&str>> {
    a.as_string::<i32>().iter().collect()
}

fn run_a() -> RecordBatch {
    let mut cols = vec![
        key(&["a", "c", "e"]),
        live(3),
        meta(
            "t",
            Arc::new(Float64Array::from(vec![Some(1.5), None, Some(3.0)])),
        ),
        meta(
            "n",
            Arc::new(Int64Array::from(vec![Some(1), Some(2), None])),
        ),
        meta("s", dict(vec![Some("x"), None, Some("y")])),
        json("s", vec![None, Some("[1, 2]"), None]),
        meta(
            "only_c",
            Arc::new(Int64Array::from(vec![None, Some(7), None])),
        ),
    ];
    cols.extend(facts(
        "pos",
        vec![Some(vec![2, 3]), None, Some(vec![4])],
        vec![Some("float64"), None, Some("int32")],
    ));
    batch(cols)
}

#[test]
fn one_batch_every_row_goes_out_as_it_is() {
    let a = run_a();
    let rows: Vec<u32> = (0..3).collect();
    let (schema, out) = shape(&[Rows {
        batch: &a,
        rows: &rows,
    }])
    .unwrap();
    assert_eq!(out.len(), 1);
    let b = &out[0];
    assert_eq!(
        names(b),
        ["key", "t", "n", "s", "only_c", "pos.shape", "pos.dtype"]
    );
    assert_eq!(schema.field(0).data_type(), &DataType::Utf8);
    assert!(!schema.field(0).is_nullable());
    // the same buffers: no copy
    let same = |i: usize, j: usize| {
        b.column(i).to_data().buffers()[0].as_ptr() == a.column(j).to_data().buffers()[0].as_ptr()
    };
    assert!(same(0, 0) && same(1, 2) && same(2, 3) && same(5, 7));
    // s: a json value among the rows: one JSON text column
    let s = b.column(3);
    assert_eq!(texts(s), [Some("\"x\""), Some("[1, 2]"), Some("\"y\"")]);
    assert_eq!(schema.field(3).metadata()["lazyvault.json"], "true");
    assert_eq!(schema.field(3).metadata()["lazyvault.path"], "[\"s\"]");
    assert!(!schema.field(1).metadata().contains_key("lazyvault.json"));
}

#[test]
fn selected_rows_drop_columns_without_values() {
    let a = run_a();
    let (_, out) = shape(&[Rows {
        batch: &a,
        rows: &[0, 2],
    }])
    .unwrap();
    let b = &out[0];
    // only_c has no value in a or e; s has no json value there: typed
    assert_eq!(names(b), ["key", "t", "n", "s", "pos.shape", "pos.dtype"]);
    assert_eq!(keys(b), ["a", "e"]);
    assert_eq!(b.column(3).data_type(), a.column(4).data_type());
    let n = b.column(2).as_primitive::<Int64Type>();
    assert_eq!(n.iter().collect::<Vec<_>>(), [Some(1), None]);
    let shapes = b.column(4).as_list::<i32>();
    assert_eq!(
        shapes
            .value(1)
            .as_primitive::<arrow_array::types::UInt64Type>()
            .values()
            .to_vec(),
        [4]
    );
}

#[test]
fn no_row_gives_the_key_column_only() {
    let a = run_a();
    let (schema, out) = shape(&[Rows {
        batch: &a,
        rows: &[],
    }])
    .unwrap();
    assert_eq!(schema.fields().len(), 1);
    assert_eq!(out[0].num_rows(), 0);
}

#[test]
fn batches_merge_in_key_order_and_types_unify() {
    let a = run_a();
    let b = batch(vec![
        key(&["b", "d"]),
        live(2),
        // ints in one batch, floats in the other: floats
        meta("n", Arc::new(Float64Array::from(vec![Some(0.5), None]))),
        meta("t", Arc::new(Int64Array::from(vec![Some(4), Some(5)]))),
        // a string in one batch, a bool in the other: JSON text
        meta(
            "only_c",
            Arc::new(BooleanArray::from(vec![Some(true), None])),
        ),
        meta("new", Arc::new(Int64Array::from(vec![None, Some(9)]))),
    ]);
    let rows_a: Vec<u32> = (0..3).collect();
    let (schema, out) = shape(&[
        Rows {
            batch: &a,
            rows: &rows_a,
        },
        Rows {
            batch: &b,
            rows: &[0, 1],
        },
    ])
    .unwrap();
    let o = &out[0];
    assert_eq!(keys(o), ["a", "b", "c", "d", "e"]);
    assert_eq!(
        names(o),
        [
            "key",
            "t",
            "n",
            "s",
            "only_c",
            "new",
            "pos.shape",
            "pos.dtype"
        ]
    );
    let t = o.column(1).as_primitive::<Float64Type>();
    assert_eq!(
        t.iter().collect::<Vec<_>>(),
        [Some(1.5), Some(4.0), None, Some(5.0), Some(3.0)]
    );
    let n = o.column(2).as_primitive::<Float64Type>();
    assert_eq!(
        n.iter().collect::<Vec<_>>(),
        [Some(1.0), Some(0.5), Some(2.0), None, None]
    );
    assert_eq!(
        texts(o.column(4)),
        [None, Some("true"), Some("7"), None, None]
    );
    assert_eq!(schema.field(4).metadata()["lazyvault.json"], "true");
    assert_eq!(
        o.column(5)
            .as_primitive::<Int64Type>()
            .iter()
            .collect::<Vec<_>>(),
        [None, None, None, Some(9), None]
    );
    let dtype = o.column(7).as_dictionary::<Int32Type>();
    let dtypes: Vec<Option<&str>> = dtype
        .downcast_dict::<StringArray>()
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(dtypes, [Some("float64"), None, None, None, Some("int32")]);
}

#[test]
fn big_ints_with_floats_stay_exact_as_json() {
    let a = batch(vec![
        key(&["a"]),
        meta("x", Arc::new(Int64Array::from(vec![(1 << 53) + 1]))),
    ]);
    let b = batch(vec![
        key(&["b"]),
        meta("x", Arc::new(Float64Array::from(vec![0.25]))),
    ]);
    let (_, out) = shape(&first_rows(&[&a, &b])).unwrap();
    assert_eq!(
        texts(out[0].column(1)),
        [Some("9007199254740993"), Some("0.25")]
    );
}

#[test]
fn datetimes_unify_or_go_to_text() {
    let micros = 1_709_296_200_000_000; // 2024-03-01T12:30:00Z
    let naive = batch(vec![
        key(&["a"]),
        meta("w", Arc::new(TimestampMicrosecondArray::from(vec![micros]))),
    ]);
    let paris = batch(vec![
        key(&["b"]),
        meta(
            "w",
            Arc::new(
                TimestampMicrosecondArray::from(vec![micros + 1]).with_timezone("Europe/Paris"),
            ),
        ),
    ]);
    let utc = batch(vec![
        key(&["c"]),
        meta(
            "w",
            Arc::new(TimestampMicrosecondArray::from(vec![micros]).with_timezone("+00:00")),
        ),
    ]);
    // aware of two zones: the same instants in UTC
    let (schema, out) = shape(&first_rows(&[&paris, &utc])).unwrap();
    assert_eq!(
        schema.field(1).data_type(),
        &DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, Some("+00:00".into()))
    );
    let w = out[0]
        .column(1)
        .as_primitive::<arrow_array::types::TimestampMicrosecondType>();
    assert_eq!(w.values().to_vec(), [micros + 1, micros]);
    // naive and aware: text, as tagged datetimes
    let (_, out) = shape(&first_rows(&[&naive, &paris])).unwrap();
    assert_eq!(
        texts(out[0].column(1)),
        [
            Some(r#"{"$datetime":"2024-03-01T12:30:00"}"#),
            Some(r#"{"$datetime":"2024-03-01T12:30:00.000001+00:00"}"#)
        ]
    );
}

#[test]
fn iso_text_of_microseconds() {
    assert_eq!(iso_micros(0, false), "1970-01-01T00:00:00");
    assert_eq!(iso_micros(-1, true), "1969-12-31T23:59:59.999999+00:00");
    assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    assert_eq!(civil_from_days(-719_162), (1, 1, 1));
    assert_eq!(civil_from_days(2_932_896), (9999, 12, 31));
}

#[test]
fn a_batch_without_key_is_corrupt() {
    let b = batch(vec![meta("x", Arc::new(Int64Array::from(vec![1])))]);
    let err = shape(&[Rows {
        batch: &b,
        rows: &[0],
    }])
    .unwrap_err();
    assert!(err.to_string().contains("no key column"), "{err}");
}

#[test]
fn a_store_and_a_query() {
    use crate::query::Query;
    use crate::{ArraySource, Mode, Store};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.lv"), Mode::Append).unwrap();
    let data = [0u8; 6];
    let put = |key: &str, meta: serde_json::Value, arrays: &[ArraySource<'_>]| {
        let meta = meta.as_object().unwrap().clone();
        store
            .put(key, meta, serde_json::Value::Null, arrays, None)
            .unwrap();
    };
    let positions = ArraySource {
        name: "positions".into(),
        descr: "'|u1'".into(),
        dtype: "uint8".into(),
        shape: vec![2, 3],
        fortran_order: false,
        data: &data,
        pickled: false,
    };
    put(
        "b",
        serde_json::json!({"t": 2, "p": {"lr": 0.5}, "tags": ["x"]}),
        std::slice::from_ref(&positions),
    );
    put("a", serde_json::json!({"t": 1.5, "m": "Si"}), &[]);
    put(
        "c",
        serde_json::json!({"t": 3, "m": {"$float": "nan"}}),
        &[],
    );
    let (schema, batches) = store.to_arrow(None).unwrap();
    let b = &batches[0];
    assert_eq!(keys(b), ["a", "b", "c"]);
    assert_eq!(
        names(b),
        [
            "key",
            "t",
            "m",
            "p.lr",
            "tags",
            "positions.shape",
            "positions.dtype"
        ]
    );
    let t = b.column(1).as_primitive::<Float64Type>();
    assert_eq!(t.values().to_vec(), [1.5, 2.0, 3.0]);
    assert_eq!(
        texts(b.column(2)),
        [Some("\"Si\""), None, Some(r#"{"$float": "nan"}"#)]
    );
    assert_eq!(schema.field(4).metadata()["lazyvault.json"], "true");
    let (_, batches) = store
        .to_arrow(Some(&Query::parse("t > 1.8").unwrap()))
        .unwrap();
    let b = &batches[0];
    assert_eq!(keys(b), ["b", "c"]);
    assert_eq!(
        names(b),
        [
            "key",
            "t",
            "p.lr",
            "tags",
            "m",
            "positions.shape",
            "positions.dtype"
        ]
    );
    // m: only its NaN is selected: a float
    let m = b.column(4).as_primitive::<Float64Type>();
    assert!(m.is_null(0) && m.value(1).is_nan());
    let (_, batches) = store.to_arrow_keys(["c", "nope", "a"]).unwrap();
    assert_eq!(keys(&batches[0]), ["c", "a"]);
}

/// A meta column with extra field metadata (what the values were).
fn tagged(name: &str, array: ArrayRef, extra: (&str, &str)) -> (Field, ArrayRef) {
    let (field, array) = meta(name, array);
    let mut metadata = field.metadata().clone();
    metadata.insert(extra.0.to_owned(), extra.1.to_owned());
    (field.with_metadata(metadata), array)
}

#[test]
fn numpy_and_date_marks_pass_through_or_render_as_tags() {
    let day = 19_782 * 86_400_000_000; // 2024-02-29
    let a = batch(vec![
        key(&["a"]),
        tagged(
            "f",
            Arc::new(Float64Array::from(vec![1.5])),
            ("lazyvault.numpy", "<f4"),
        ),
        tagged(
            "d",
            Arc::new(TimestampMicrosecondArray::from(vec![day])),
            ("lazyvault.date", "true"),
        ),
    ]);
    let b = batch(vec![
        key(&["b"]),
        tagged(
            "f",
            Arc::new(Float64Array::from(vec![2.5])),
            ("lazyvault.numpy", "<f4"),
        ),
        json("d", vec![Some("[1]")]),
    ]);
    let c = batch(vec![
        key(&["c"]),
        tagged(
            "f",
            Arc::new(Float64Array::from(vec![3.5])),
            ("lazyvault.numpy", "<f8"),
        ),
    ]);
    let (schema, out) = shape(&first_rows(&[&a, &b])).unwrap();
    assert_eq!(schema.field(1).metadata()["lazyvault.numpy"], "<f4");
    assert_eq!(
        texts(out[0].column(2)),
        [Some(r#"{"$date":"2024-02-29"}"#), Some("[1]")]
    );
    let (schema, _) = shape(&first_rows(&[&a, &c])).unwrap();
    assert!(!schema.field(1).metadata().contains_key("lazyvault.numpy"));
    // with text in the path, the numpy scalar renders as its tagged value
    let d = batch(vec![key(&["d"]), json("f", vec![Some("\"x\"")])]);
    let (_, out) = shape(&first_rows(&[&a, &d])).unwrap();
    assert_eq!(
        texts(out[0].column(1)),
        [Some(r#"{"$numpy": ["<f4", 1.5]}"#), Some("\"x\"")]
    );
}

#[test]
fn a_path_of_json_text_only_goes_out_as_it_is() {
    let a = batch(vec![
        key(&["a", "b"]),
        json("l", vec![Some("[1]"), Some("null")]),
    ]);
    let (schema, out) = shape(&[Rows {
        batch: &a,
        rows: &[0, 1],
    }])
    .unwrap();
    let same = out[0].column(1).to_data().buffers()[1].as_ptr()
        == a.column(1).to_data().buffers()[1].as_ptr();
    assert!(same);
    assert_eq!(schema.field(1).metadata()["lazyvault.json"], "true");
    assert_eq!(schema.field(1).metadata()["lazyvault.kind"], "meta");
}
