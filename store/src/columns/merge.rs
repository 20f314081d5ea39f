//! The columns of a merged run from the columns of its inputs: each output
//! row is one input row (the newest entry of its key), so the merged
//! columns are the inputs' columns interleaved, without reading a record.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{new_null_array, Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use indexmap::IndexMap;

use super::{field_meta, Columns, Kind};

/// The columns of rows `picks` (input, row) of `inputs`, in that order;
/// `None` when they cannot be interleaved (a path typed differently in two
/// inputs, a column that cannot be read): the caller builds them from the
/// records instead.
pub(crate) fn interleave(inputs: &[Arc<Columns>], picks: &[(usize, usize)]) -> Option<Columns> {
    if inputs
        .iter()
        .any(|c| !c.paths_complete || !c.facts_complete)
    {
        return None; // the records have what the columns left out
    }
    // Every output column: its kind and type, in first-seen order; and
    // where each input has it.
    let mut out: IndexMap<Kind, (String, DataType)> = IndexMap::new();
    // Each column's field metadata, when every input has the same (the
    // marks of tagged values hold only then).
    let mut metas: HashMap<Kind, Option<arrow_schema::Metadata>> = HashMap::new();
    let mut at: Vec<HashMap<Kind, usize>> = vec![HashMap::new(); inputs.len()];
    for (c, at) in inputs.iter().zip(&mut at) {
        for (i, field) in c.schema().fields().iter().enumerate() {
            let Some(kind) = super::kind_of(field.metadata()) else {
                continue;
            };
            at.insert(kind.clone(), i);
            let agreed = metas
                .entry(kind.clone())
                .or_insert_with(|| Some(field.metadata().clone()));
            if agreed.as_ref() != Some(field.metadata()) {
                *agreed = None;
            }
            match out.get(&kind) {
                Some((_, t)) if t != field.data_type() => return None,
                Some(_) => {}
                None => {
                    out.insert(kind, (field.name().clone(), field.data_type().clone()));
                }
            }
        }
    }
    let paths = out
        .keys()
        .filter_map(|k| match k {
            Kind::Meta(p) | Kind::Json(p) => Some(p),
            _ => None,
        })
        .collect::<std::collections::HashSet<_>>()
        .len();
    let arrays = out
        .keys()
        .filter_map(|k| match k {
            Kind::Fact { array, .. } => Some(array),
            _ => None,
        })
        .collect::<std::collections::HashSet<_>>()
        .len();
    if paths > super::build::MAX_PATHS || arrays > super::build::MAX_ARRAYS {
        return None;
    }
    let mut fields = Vec::with_capacity(out.len());
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(out.len());
    for (kind, (name, data_type)) in &out {
        let mut sources: Vec<ArrayRef> = Vec::with_capacity(inputs.len());
        for (c, at) in inputs.iter().zip(&at) {
            sources.push(match at.get(kind).copied() {
                Some(i) => c.column(i)?.clone(),
                None => new_null_array(data_type, c.len()),
            });
        }
        let refs: Vec<&dyn Array> = sources.iter().map(|a| a.as_ref()).collect();
        let array = arrow_select::interleave::interleave(&refs, picks).ok()?;
        let nullable = !matches!(kind, Kind::Key | Kind::Live);
        // An input without the column holds no value there: its marks
        // still hold (all null rows), so only disagreeing inputs drop them.
        let meta = match metas.get(kind) {
            Some(Some(m)) => m.clone(),
            _ => field_meta(kind),
        };
        fields.push(Field::new(name, data_type.clone(), nullable).with_metadata(meta));
        arrays.push(array);
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).ok()?;
    Columns::new(batch).ok()
}
