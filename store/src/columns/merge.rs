//! The columns of a merged run from the columns of its inputs: each output
//! row is one input row (the newest entry of its key), so the merged
//! columns are the inputs' columns interleaved, without reading a record.

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
    // Every output column: its kind and type, in first-seen order.
    let mut out: IndexMap<Kind, (String, DataType)> = IndexMap::new();
    for c in inputs {
        for field in c.schema().fields() {
            let Some(kind) = super::kind_of(field.metadata()) else {
                continue;
            };
            match out.get(&kind) {
                Some((_, t)) if t != field.data_type() => return None,
                Some(_) => {}
                None => {
                    out.insert(kind, (field.name().clone(), field.data_type().clone()));
                }
            }
        }
    }
    let mut fields = Vec::with_capacity(out.len());
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(out.len());
    for (kind, (name, data_type)) in &out {
        let mut sources: Vec<ArrayRef> = Vec::with_capacity(inputs.len());
        for c in inputs {
            let at = c
                .schema()
                .fields()
                .iter()
                .position(|f| super::kind_of(f.metadata()).as_ref() == Some(kind));
            sources.push(match at {
                Some(i) => c.column(i)?.clone(),
                None => new_null_array(data_type, c.len()),
            });
        }
        let refs: Vec<&dyn Array> = sources.iter().map(|a| a.as_ref()).collect();
        let array = arrow_select::interleave::interleave(&refs, picks).ok()?;
        let nullable = !matches!(kind, Kind::Key | Kind::Live);
        fields.push(Field::new(name, data_type.clone(), nullable).with_metadata(field_meta(kind)));
        arrays.push(array);
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).ok()?;
    Columns::new(batch).ok()
}
