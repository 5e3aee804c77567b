use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use super::*;

fn cols() -> Vec<EncodedColumn> {
    vec![
        EncodedColumn { name: "a".into(), cardinality: 3, null_code: Some(2) },
        EncodedColumn { name: "b".into(), cardinality: 2, null_code: None },
        EncodedColumn { name: "c".into(), cardinality: 4, null_code: Some(3) },
    ]
}

fn batch(rows: &[[u32; 3]]) -> RecordBatch {
    let schema = Arc::new(Schema::new(
        ["a", "b", "c"].iter().map(|n| Field::new(*n, DataType::UInt32, false)).collect::<Vec<_>>(),
    ));
    let arrays =
        (0..3).map(|j| Arc::new(UInt32Array::from(rows.iter().map(|r| r[j]).collect::<Vec<_>>())) as _).collect();
    RecordBatch::try_new(schema, arrays).unwrap()
}

fn brute(rows: &[[u32; 3]], cols: &[EncodedColumn], attrs: &[usize], mode: NullMode) -> (Vec<u64>, u64) {
    let sizes: Vec<u32> = attrs
        .iter()
        .map(|&a| match (mode, cols[a].null_code) {
            (NullMode::Observed, Some(_)) => cols[a].cardinality - 1,
            _ => cols[a].cardinality,
        })
        .collect();
    let cells: u32 = sizes.iter().product();
    let mut counts = vec![0u64; cells as usize];
    let mut observed = 0;
    'rows: for r in rows {
        let mut idx = 0u32;
        for (k, &a) in attrs.iter().enumerate() {
            if mode == NullMode::Observed && Some(r[a]) == cols[a].null_code {
                continue 'rows;
            }
            idx = idx * sizes[k] + r[a];
        }
        counts[idx as usize] += 1;
        observed += 1;
    }
    (counts, observed)
}

#[test]
fn matches_brute_force_for_all_sets_and_modes() {
    let mut rows = Vec::new();
    let mut x = 7u32;
    for _ in 0..1000 {
        x = x.wrapping_mul(1103515245).wrapping_add(12345);
        rows.push([(x >> 8) % 3, (x >> 12) % 2, (x >> 16) % 4]);
    }
    let sets: Vec<Vec<usize>> = vec![vec![0], vec![1], vec![2], vec![0, 1], vec![2, 0], vec![0, 1, 2], vec![2, 1, 0]];
    for mode in [NullMode::Cells, NullMode::Observed] {
        let config = MarginalConfig {
            columns: cols(),
            sets: sets.iter().map(|s| MarginalSet { attrs: s.clone(), mode }).collect(),
        };
        let mut acc = MarginalAccumulator::new(config.clone(), vec![0, 1, 2]).unwrap();
        // Split into uneven batches.
        acc.update(&batch(&rows[..333])).unwrap();
        acc.update(&batch(&rows[333..334])).unwrap();
        acc.update(&batch(&rows[334..])).unwrap();
        let got = acc.finish();
        for (i, s) in sets.iter().enumerate() {
            assert_eq!(got[i], brute(&rows, &cols(), s, mode), "set {s:?} mode {mode:?}");
        }
    }
}

#[test]
fn all_null_and_empty_inputs() {
    let rows = vec![[2, 0, 3], [2, 1, 3]];
    let config = MarginalConfig {
        columns: cols(),
        sets: vec![
            MarginalSet { attrs: vec![0, 2], mode: NullMode::Observed },
            MarginalSet { attrs: vec![0, 2], mode: NullMode::Cells },
        ],
    };
    let mut acc = MarginalAccumulator::new(config.clone(), vec![0, 1, 2]).unwrap();
    acc.update(&batch(&rows)).unwrap();
    let got = acc.finish();
    assert_eq!(got[0], (vec![0; 6], 0));
    let mut cells = vec![0; 12];
    cells[2 * 4 + 3] = 2;
    assert_eq!(got[1], (cells, 2));
    // Empty input: all zeros.
    let acc = MarginalAccumulator::new(config, vec![0, 1, 2]).unwrap();
    assert_eq!(acc.finish()[1], (vec![0; 12], 0));
}

#[test]
fn bad_codes_and_configs_are_errors() {
    let config = MarginalConfig { columns: cols(), sets: vec![MarginalSet { attrs: vec![0], mode: NullMode::Cells }] };
    let mut acc = MarginalAccumulator::new(config, vec![0, 1, 2]).unwrap();
    assert!(acc.update(&batch(&[[5, 0, 0]])).is_err());
    let bad = MarginalConfig { columns: cols(), sets: vec![MarginalSet { attrs: vec![0, 0], mode: NullMode::Cells }] };
    assert!(bad.validate().is_err());
    let bad = MarginalConfig { columns: cols(), sets: vec![MarginalSet { attrs: vec![7], mode: NullMode::Cells }] };
    assert!(bad.validate().is_err());
}
