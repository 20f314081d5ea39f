//! Inputs shared by the criterion benchmarks: a realistic record of about
//! 1 KiB of metadata (16 fields, one nested object, a short list), as the
//! Python front stores an experiment run.

// Each bench target compiles this module and uses only part of it.
#![allow(dead_code)]

use lazyvault_store::schema::{ArrayEntry, Record};
use lazyvault_store::ArraySource;
use serde_json::{json, Map, Value};

/// Materials cycled through by [`meta`]: a query on `material == 'Si'`
/// keeps one record in four.
pub const MATERIALS: [&str; 4] = ["Si", "Ge", "GaAs", "C"];

/// Elements of the benchmark array: 512 float64, 4 KiB.
pub const ARRAY_LEN: usize = 512;

/// Metadata of run `i`: 16 top-level fields, about 1 KiB of compact JSON.
/// `temperature` runs over [250, 450) in steps of 0.5 (so `temperature >
/// 399.0` keeps about a quarter of the records); run 0 is Si at 412.5 K, a
/// record every benchmark query matches.
pub fn meta(i: u64) -> Map<String, Value> {
    let material = MATERIALS[(i % 4) as usize];
    let temperature = 250.0 + ((i * 7 + 325) % 400) as f64 * 0.5;
    let value = json!({
        "run_id": format!("run-{i:06}"),
        "material": material,
        "temperature": temperature,
        "pressure": 1.01325 + (i % 10) as f64 * 0.1,
        "timestep_fs": 0.5,
        "n_atoms": 4096 + (i % 8) * 512,
        "n_steps": 200_000,
        "converged": !i.is_multiple_of(5),
        "energy_ev": -18234.123456 - i as f64 * 0.75,
        "tags": ["production", "npt", "green-kubo", format!("batch-{}", i % 16)],
        "params": {
            "lr": 0.001,
            "cutoff": 6.5,
            "thermostat": "nose-hoover",
            "barostat": "parrinello-rahman",
            "seed": 42 + i,
            "potential": "SiC.tersoff",
            "neighbor_skin": 2.0,
            "kpoints": [4, 4, 4]
        },
        "created": "2026-11-29T19:43:36Z",
        "host": "node-017.hpc.example.org",
        "operator": "J. Doe (materials theory group)",
        "code_version": "lammps-2Aug2023-update3",
        "description": format!(
            "NPT molecular dynamics of bulk {material} with a Tersoff potential, \
             equilibrated for 50 ps before production; velocities rescaled every \
             100 steps, trajectory written every 1000 steps, energies every 10. \
             Part of the thermal conductivity sweep, batch {}. Green-Kubo heat \
             flux sampled every 5 steps over 2 ns; 64 independent seeds per \
             temperature; cell 16x16x16 conventional, periodic in x, y and z. \
             Restarted once from the checkpoint at step 120000 after a node failure.",
            i % 16
        ),
    });
    let Value::Object(map) = value else {
        unreachable!("json! of an object")
    };
    map
}

/// The layout the Python front writes for [`meta`] plus one array named
/// `positions`: a `{"dict": ...}` node repeating the values.
pub fn layout(meta: &Map<String, Value>) -> Value {
    fn node(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                json!({"dict": m.iter().map(|(k, v)| (k.clone(), node(v))).collect::<Map<_, _>>()})
            }
            Value::Array(items) => json!({"list": items.iter().map(node).collect::<Vec<_>>()}),
            other => other.clone(),
        }
    }
    let mut root = match node(&Value::Object(meta.clone())) {
        Value::Object(mut m) => m.remove("dict").expect("a dict node"),
        _ => unreachable!("an object makes a dict node"),
    };
    root.as_object_mut()
        .expect("dict node")
        .insert("positions".into(), json!({"array": "positions"}));
    json!({ "dict": root })
}

/// The bytes of the benchmark array: [`ARRAY_LEN`] little-endian float64.
pub fn array_bytes() -> Vec<u8> {
    (0..ARRAY_LEN)
        .flat_map(|k| (k as f64 * 0.25).to_le_bytes())
        .collect()
}

/// The benchmark array as `Store::put` takes it.
pub fn array_source(data: &[u8]) -> ArraySource<'_> {
    ArraySource {
        name: "positions".into(),
        descr: "'<f8'".into(),
        dtype: "float64".into(),
        shape: vec![ARRAY_LEN as u64],
        fortran_order: false,
        data,
        pickled: false,
    }
}

/// Record `i` as the store keeps it: [`meta`], one array entry, the layout.
pub fn record(i: u64) -> Record {
    let meta = meta(i);
    let layout = layout(&meta);
    let mut arrays = indexmap::IndexMap::new();
    arrays.insert(
        "positions".to_owned(),
        ArrayEntry {
            id: format!("{:032x}", 0x7657_2807_92c8_47bb_u128 + u128::from(i)),
            descr: "'<f8'".into(),
            dtype: "float64".into(),
            shape: vec![ARRAY_LEN as u64],
            fortran_order: false,
            nbytes: (ARRAY_LEN * 8) as u64,
            data_offset: 128,
            pickled: false,
            checksum: Some("xxh3-64:ea99cbf87674b914".into()),
            pack: None,
            pack_offset: None,
        },
    );
    Record {
        meta,
        arrays,
        layout,
        pickle: false,
    }
}

/// Checks the "about 1 KiB of metadata" claim the results table makes.
pub fn assert_meta_size() -> usize {
    let len = serde_json::to_vec(&meta(0)).expect("serializes").len();
    assert!(
        (900..=1300).contains(&len),
        "benchmark metadata is {len} bytes, not about 1 KiB"
    );
    len
}
