//! Vectorised pass-through for typed output: a column whose values are all
//! already canonical in-domain values (integers and reals inside the bounds,
//! categorical text equal to a domain value, booleans; nulls only where the
//! column is nullable) is checked with whole-array kernels and returned as is,
//! without classifying each row. Anything else (aliases, null tokens, text to
//! parse, out-of-domain values and their policies) returns `None` and takes
//! the row-by-row path, so the result is the same either way.

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, GenericStringArray, OffsetSizeTrait, PrimitiveArray, StringViewArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{ArrowPrimitiveType, DataType, Float64Type, Int64Type};

use super::column::{Column, ColumnKind};

/// Labels of a categorical column, each with its code, for lookups on raw
/// bytes: an open-addressing table over labels of up to 15 bytes packed into a
/// `u128` (length in the top byte), with the rare longer labels compared as
/// bytes. The typed path asks only for membership; the encoder asks for codes.
pub(crate) struct LabelSet {
    slots: Vec<u128>,
    /// The code of the label in the same slot of `slots`.
    slot_codes: Vec<u32>,
    shift: u32,
    long: Vec<(Vec<u8>, u32)>,
    /// When every label fits inline in an Arrow string view (≤ 12 bytes): the
    /// labels' views in a collision-free table (slots, multiplier, shift), so
    /// a `StringViewArray` row is tested on its view with one load and one
    /// compare, without branches.
    perfect: Option<Perfect>,
}

/// A collision-free table of inline string views and their codes.
pub(crate) struct Perfect {
    slots: Vec<u128>,
    codes: Vec<u32>,
    mul: u64,
    shift: u32,
}

impl Perfect {
    /// The code of the label whose view is `v`, if `v` is one (a view longer
    /// than 12 bytes never equals an inline label's view).
    #[inline]
    pub(crate) fn code(&self, v: u128) -> Option<u32> {
        let i = perfect_slot(v, self.mul, self.shift);
        (self.slots[i] == v).then(|| self.codes[i])
    }
}

const EMPTY: u128 = u128::MAX;

#[inline]
fn pack(b: &[u8]) -> Option<u128> {
    if b.len() > 15 {
        return None;
    }
    let mut buf = [0u8; 16];
    buf[..b.len()].copy_from_slice(b);
    buf[15] = b.len() as u8;
    Some(u128::from_le_bytes(buf))
}

#[inline]
fn slot_of(key: u128, shift: u32) -> usize {
    let h = ((key as u64) ^ ((key >> 64) as u64).rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> shift) as usize
}

impl LabelSet {
    /// The set of `labels`, coded by position.
    pub(crate) fn new<'a>(labels: impl IntoIterator<Item = &'a str>) -> Self {
        Self::with_codes(labels.into_iter().zip(0u32..))
    }

    /// The set of `(label, code)` pairs (a label listed twice keeps its first code).
    pub(crate) fn with_codes<'a>(pairs: impl IntoIterator<Item = (&'a str, u32)>) -> Self {
        let mut seen = std::collections::HashSet::new();
        let pairs: Vec<(&str, u32)> = pairs.into_iter().filter(|(l, _)| seen.insert(*l)).collect();
        let bits = (pairs.len().max(1) * 4).next_power_of_two().trailing_zeros().max(4);
        let mut set = Self {
            slots: vec![EMPTY; 1 << bits],
            slot_codes: vec![0; 1 << bits],
            shift: 64 - bits,
            long: Vec::new(),
            perfect: perfect_table(&pairs),
        };
        for (l, code) in pairs {
            match pack(l.as_bytes()) {
                Some(k) => insert(&mut set.slots, &mut set.slot_codes, k, code, set.shift),
                None => set.long.push((l.as_bytes().to_vec(), code)),
            }
        }
        set
    }

    /// Whether `b` is one of the labels.
    #[inline]
    pub(crate) fn contains(&self, b: &[u8]) -> bool {
        self.code(b).is_some()
    }

    /// The code of `b`, if it is one of the labels.
    #[inline]
    pub(crate) fn code(&self, b: &[u8]) -> Option<u32> {
        match pack(b) {
            Some(k) => probe(&self.slots, k, self.shift).map(|i| self.slot_codes[i]),
            None => self.long.iter().find(|(l, _)| l == b).map(|(_, c)| *c),
        }
    }

    /// The code of the string whose Arrow view is `v` (`buffers`: the array's
    /// data buffers), if it is one of the labels. Reads bytes, never `&str`,
    /// and a view pointing outside its buffer is simply not a label.
    #[inline]
    pub(crate) fn view_code(&self, v: u128, buffers: &[datafusion::arrow::buffer::Buffer]) -> Option<u32> {
        let len = v as u32 as usize;
        if len <= 12 {
            // An inline view is the length, then the bytes zero-padded: shifted down it is
            // the packed key (a view with non-zero padding matches no key).
            let key = (v >> 32) | ((len as u128) << 120);
            return probe(&self.slots, key, self.shift).map(|i| self.slot_codes[i]);
        }
        let (buffer, offset) = ((v >> 64) as u32 as usize, (v >> 96) as u32 as usize);
        self.code(buffers.get(buffer)?.get(offset..offset.checked_add(len)?)?)
    }

    /// The collision-free view table, when every label is inline.
    pub(crate) fn perfect(&self) -> Option<&Perfect> {
        self.perfect.as_ref()
    }
}

#[inline]
fn perfect_slot(view: u128, mul: u64, shift: u32) -> usize {
    (((view as u64) ^ ((view >> 64) as u64)).wrapping_mul(mul) >> shift) as usize
}

/// A table in which every label's view sits at its own home slot, if the
/// labels are all inline (≤ 12 bytes) and a multiplier is found (tried in a
/// fixed order, at sizes up to 64 slots per label).
fn perfect_table(pairs: &[(&str, u32)]) -> Option<Perfect> {
    let views: Vec<u128> = pairs.iter().map(|(l, _)| inline_view(l.as_bytes())).collect::<Option<_>>()?;
    let mut mul: u64 = 0x9E37_79B9_7F4A_7C15;
    for bits in (views.len().max(1) * 4).next_power_of_two().trailing_zeros().max(4)..=20 {
        if (1usize << bits) > 64 * views.len().max(4) {
            break;
        }
        for _ in 0..64 {
            let shift = 64 - bits;
            let mut slots = vec![EMPTY; 1 << bits];
            let mut codes = vec![0u32; 1 << bits];
            if views.iter().zip(pairs).all(|(&v, &(_, code))| {
                let i = perfect_slot(v, mul, shift);
                let free = slots[i] == EMPTY;
                slots[i] = v;
                codes[i] = code;
                free
            }) {
                return Some(Perfect { slots, codes, mul, shift });
            }
            // Next odd multiplier (splitmix step).
            mul = (mul ^ (mul >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1;
        }
    }
    None
}

/// The Arrow view of an inline string (≤ 12 bytes).
fn inline_view(b: &[u8]) -> Option<u128> {
    if b.len() > 12 {
        return None;
    }
    let mut buf = [0u8; 16];
    buf[..4].copy_from_slice(&(b.len() as u32).to_le_bytes());
    buf[4..4 + b.len()].copy_from_slice(b);
    Some(u128::from_le_bytes(buf))
}

fn insert(slots: &mut [u128], codes: &mut [u32], k: u128, code: u32, shift: u32) {
    let mask = slots.len() - 1;
    let mut i = slot_of(k, shift);
    while slots[i] != EMPTY && slots[i] != k {
        i = (i + 1) & mask;
    }
    slots[i] = k;
    codes[i] = code;
}

/// The slot holding `k`, if any.
#[inline]
fn probe(slots: &[u128], k: u128, shift: u32) -> Option<usize> {
    let mask = slots.len() - 1;
    let mut i = slot_of(k, shift);
    loop {
        let s = slots[i];
        if s == k {
            return Some(i);
        }
        if s == EMPTY {
            return None;
        }
        i = (i + 1) & mask;
    }
}

fn all_labels<O: OffsetSizeTrait>(a: &GenericStringArray<O>, set: &LabelSet) -> bool {
    let offsets = a.value_offsets();
    let bytes = a.value_data();
    let mut prev: Option<&[u8]> = None;
    for i in 0..a.len() {
        if a.is_null(i) {
            continue;
        }
        let v = &bytes[offsets[i].as_usize()..offsets[i + 1].as_usize()];
        if prev == Some(v) {
            continue;
        }
        if !set.contains(v) {
            return false;
        }
        prev = Some(v);
    }
    true
}

fn all_labels_view(a: &StringViewArray, set: &LabelSet) -> bool {
    if let Some(p) = &set.perfect {
        // Branch-free: a view matches iff it is the label at its home slot
        // (a view longer than 12 bytes never equals an inline label's view);
        // a null row passes whatever its view holds.
        let hit = |v: u128| p.slots[perfect_slot(v, p.mul, p.shift)] == v;
        return match a.nulls() {
            None => a.views().chunks(1024).all(|chunk| chunk.iter().fold(true, |ok, &v| ok & hit(v))),
            Some(n) => {
                let valid = n.inner();
                a.views().iter().enumerate().fold(true, |ok, (i, &v)| ok & (hit(v) | !valid.value(i)))
            }
        };
    }
    let mut prev = EMPTY;
    for (i, &v) in a.views().iter().enumerate() {
        // A null's view is unspecified: never read through it.
        if v == prev || a.is_null(i) {
            continue;
        }
        if !set.contains(a.value(i).as_bytes()) {
            return false;
        }
        prev = v;
    }
    true
}

/// Whether every non-null value lies in [lo, hi]: one branch-free pass that
/// vectorises (a null passes by its validity bit, whatever its slot holds).
pub(crate) fn within<T: ArrowPrimitiveType>(p: &PrimitiveArray<T>, lo: T::Native, hi: T::Native) -> bool
where
    T::Native: PartialOrd,
{
    match p.nulls() {
        None => p.values().iter().fold(true, |ok, &x| ok & (x >= lo) & (x <= hi)),
        Some(n) => {
            let valid = n.inner();
            p.values().iter().enumerate().fold(true, |ok, (i, &x)| ok & ((x >= lo) & (x <= hi) | !valid.value(i)))
        }
    }
}

/// The typed output of `array` for `col` if every value is already canonical
/// and in the domain (see the module docs); `labels` is the canonical label
/// set of a categorical column and `text` the string type to return it as.
pub(crate) fn fast_typed(
    col: &Column,
    labels: Option<&LabelSet>,
    text: &DataType,
    array: &ArrayRef,
) -> Option<ArrayRef> {
    let dt = array.data_type();
    if array.null_count() > 0 && !col.nullable {
        return None;
    }
    match &col.kind {
        ColumnKind::Integer { edges } if dt.is_integer() => {
            let a = cast(array, &DataType::Int64).ok()?;
            // A lossy cast (u64 above i64::MAX) shows up as a new null.
            if a.null_count() != array.null_count() {
                return None;
            }
            within(a.as_primitive::<Int64Type>(), edges[0], edges[edges.len() - 1] - 1).then_some(a)
        }
        ColumnKind::Float { edges } if dt.is_floating() => {
            let a = cast(array, &DataType::Float64).ok()?;
            // NaN fails both comparisons, so it falls through to the row path.
            within(a.as_primitive::<Float64Type>(), edges[0], edges[edges.len() - 1]).then_some(a)
        }
        ColumnKind::Boolean if *dt == DataType::Boolean => Some(array.clone()),
        ColumnKind::Categorical { .. } => {
            let set = labels?;
            let ok = match dt {
                DataType::Utf8 => all_labels(array.as_string::<i32>(), set),
                DataType::LargeUtf8 => all_labels(array.as_string::<i64>(), set),
                DataType::Utf8View => all_labels_view(array.as_string_view(), set),
                _ => false,
            };
            if !ok {
                return None;
            }
            if dt == text { Some(array.clone()) } else { cast(array, text).ok() }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn label_set_membership_is_exact() {
        let long = "a label longer than sixteen bytes";
        let s = LabelSet::new(["", "F", "M", "S01", "25-00503", long]);
        for l in ["", "F", "M", "S01", "25-00503", long] {
            assert!(s.contains(l.as_bytes()), "{l:?}");
        }
        for l in ["f", " F", "F ", "S1", "S010", "a label longer than sixteen byte", "25-00504"] {
            assert!(!s.contains(l.as_bytes()), "{l:?}");
        }
        // Many labels: no false positives or negatives.
        let many: Vec<String> = (0..1000).map(|i| format!("v{i}")).collect();
        let s = LabelSet::new(many.iter().map(|x| x.as_str()));
        assert!((0..1000).all(|i| s.contains(format!("v{i}").as_bytes())));
        assert!((1000..3000).all(|i| !s.contains(format!("v{i}").as_bytes())));
    }

    #[test]
    fn numeric_bounds_are_checked_with_and_without_nulls() {
        use datafusion::arrow::array::{Float64Array, Int32Array};
        let int = Column {
            name: "i".into(),
            kind: ColumnKind::Integer { edges: vec![0, 10, 20, 100] },
            nullable: true,
            null_tokens: vec![],
            out_of_domain: super::super::OutOfDomain::Error,
            not_applicable_when: None,
        };
        let t = DataType::Utf8;
        let ok: ArrayRef = Arc::new(Int32Array::from(vec![0, 99, 42]));
        assert_eq!(fast_typed(&int, None, &t, &ok).unwrap().data_type(), &DataType::Int64);
        for bad in [vec![Some(0), Some(100)], vec![Some(-1), None], vec![None, Some(100)]] {
            let arr: ArrayRef = Arc::new(Int32Array::from(bad.clone()));
            assert!(fast_typed(&int, None, &t, &arr).is_none(), "{bad:?}");
        }
        let with_null: ArrayRef = Arc::new(Int32Array::from(vec![Some(5), None]));
        assert!(fast_typed(&int, None, &t, &with_null).is_some());
        let real = Column { kind: ColumnKind::Float { edges: vec![0.0, 0.5, 1.0] }, ..int };
        for (vals, want) in [(vec![0.0, 1.0], true), (vec![0.0, f64::NAN], false), (vec![1.0000001], false)] {
            let arr: ArrayRef = Arc::new(Float64Array::from(vals.clone()));
            assert_eq!(fast_typed(&real, None, &t, &arr).is_some(), want, "{vals:?}");
        }
    }

    #[test]
    fn string_views_of_every_length_are_checked() {
        use datafusion::arrow::array::StringViewArray;
        use std::collections::BTreeMap;
        let labels = ["a", "twelve bytes", "thirteen byte", "a much longer label than that"];
        let col = Column {
            name: "c".into(),
            kind: ColumnKind::Categorical {
                values: labels.iter().map(|x| x.to_string()).collect(),
                aliases: BTreeMap::new(),
            },
            nullable: true,
            null_tokens: vec![],
            out_of_domain: super::super::OutOfDomain::Error,
            not_applicable_when: None,
        };
        let set = LabelSet::new(labels);
        let ok: ArrayRef = Arc::new(StringViewArray::from(vec![
            Some("a"),
            None,
            Some("twelve bytes"),
            Some("thirteen byte"),
            Some("a much longer label than that"),
            Some("a"),
        ]));
        let out = fast_typed(&col, Some(&set), &DataType::Utf8, &ok).expect("all canonical");
        assert_eq!(out.data_type(), &DataType::Utf8);
        assert_eq!(out.as_string::<i32>().value(3), "thirteen byte");
        assert!(out.is_null(1));
        // All-inline labels, no nulls: the branch-free table.
        let short = LabelSet::new((0..50).map(|i| if i % 2 == 0 { "S0" } else { "T1" }).chain(["twelve bytes"]));
        assert!(short.perfect.is_some());
        let many: Vec<String> = (0..500).map(|i| format!("L{i:03}")).collect();
        let big = LabelSet::new(many.iter().map(|x| x.as_str()));
        assert!(big.perfect.is_some());
        let arr = StringViewArray::from(many.iter().map(|x| x.as_str()).collect::<Vec<_>>());
        assert!(all_labels_view(&arr, &big));
        for bad in ["L500", "L00", "", "L0000000000001", "a much longer label than that"] {
            let arr = StringViewArray::from(vec!["L001", bad, "L002"]);
            assert!(!all_labels_view(&arr, &big), "{bad:?}");
        }
        // With nulls: a null passes, a wrong value still fails.
        assert!(all_labels_view(&StringViewArray::from(vec![Some("L001"), None, Some("L499")]), &big));
        assert!(!all_labels_view(&StringViewArray::from(vec![Some("L001"), None, Some("L500")]), &big));
        for bad in ["b", "twelve byteS", "thirteen bytes", "a much longer label than this", ""] {
            let arr: ArrayRef = Arc::new(StringViewArray::from(vec![Some("a"), Some(bad)]));
            assert!(fast_typed(&col, Some(&set), &DataType::Utf8View, &arr).is_none(), "{bad:?}");
        }
    }
}
