//! kNN imputation in partitions of the input (issue 19 item 3; issue 21):
//! each partition of a scan — a contiguous stretch of the rows in file
//! order — runs the donor search on its own rows, and a merge in file order
//! finishes what crosses partitions. In-process the partitions run on all
//! cores; on a cluster each is a task on an executor, and only the classes,
//! the partial aggregates and the donees' intervals come back.
//!
//! The donor rule is 004 Def. 4.1 with the cyclic tie-break of
//! the index module (k = 1): a donee x takes, among the donors of the nearest
//! donor classes (its *level*), the first whose identifier follows x's,
//! wrapping around. Identifiers are row numbers in file order (partition
//! *p*'s rows start at the number of rows before it), so the rule only needs
//! order, and order is what a partitioned pass keeps:
//!
//! - **Pass 1** ([`ClassCounter`], [`merge_classes`]): per partition, each class's donors,
//!   donees and first donor. Merged in partition order ([`merge_classes`]),
//!   they give each class its global first donor, and the client gives each
//!   donee class its level ([`super::ClassView`]'s distances).
//! - **Pass 2** ([`Imputer`]): per partition, a donee waits in its class's
//!   queue and the next donor of its level *in the partition* resolves it; a
//!   partition reports its *first* donor of each class (with the donees it
//!   served so far, since donees of earlier partitions may still come to it)
//!   and the donees still waiting at its end (*carried*).
//! - **Merge** ([`merge_partials`]), in partition order: a carried donee of
//!   partition q takes the first donor of its level in partitions q+1, q+2,
//!   …, which is the earliest of those partitions' first donors of the
//!   level's classes; one still waiting after the last partition wraps
//!   around to its level's first donor in the file. That is exactly the
//!   sequential pass's choice (tested against the in-memory imputation).
//!
//! Every row is added to the queries' exact aggregates (counts and sums on
//! a public integer grid, so the order of addition does not matter) as soon
//! as its values are known, and each donee leaves (identifier, donor
//! identifier) for L1_R(D) of every number whose R it is in, with case (a)
//! of L1(D) (the most donees of R one donor serves) from each donor's final
//! load (`docs/PRIVACY.md` §6).
//!
//! A partition holds its classes, its donees' intervals and its waiting
//! donees; the merge holds the carried donees and every donee's interval
//! (16 bytes per donee per released number that reads an imputed column).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Float64Type, SchemaRef, UInt32Type};
use datafusion::common::{DataFusionError, Result};
use datafusion::physical_expr::PhysicalExpr;
use serde::{Deserialize, Serialize};

use super::query::{Aggregates, Columns, CompiledQuery, QuerySpec, RowView};
use crate::domain::{BatchEncoder, ColumnKind, Domain, conform_to_decoded, decoded_schema};

/// No row (a class without donors).
pub const NONE: u64 = u64::MAX;

/// What a partitioned kNN pass reads (public: the spec and the domain).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KnnRead {
    /// The input's domain.
    pub domain: Domain,
    /// Every column the queries and the imputation read, sorted ([`Columns::of`]).
    pub columns: Vec<String>,
    /// The imputed columns A.
    pub imputed: Vec<String>,
    /// Per matching attribute: (column, code grouping).
    pub grouping: Vec<(String, u32)>,
    /// The scan's file groups, by partition (`file_groups` of the operator's
    /// module): how a task whose scan was cut down to its own groups finds
    /// its partition.
    pub groups: Vec<GroupId>,
}

/// A file group's first file and byte offset (None for an empty group).
pub type GroupId = Option<(String, i64)>;

/// An imputed column's `not_applicable_when` rule, compiled over the
/// domain's decoded schema ([`decoded_schema`]).
pub type Rule = (String, Arc<dyn PhysicalExpr>);

/// How one row takes part.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// Complete on the imputed columns.
    Donor,
    /// An unknown cell in an imputed column.
    Donee,
    /// Neither (a not-applicable null, with no unknown cell).
    None,
}

/// Reads raw batches through the domain into what the donor search and the
/// queries need: each column's values as numbers (categorical and boolean
/// columns as their codes), its unknown cells, and the match keys.
pub struct Reader {
    encoder: BatchEncoder,
    decoded: SchemaRef,
    /// Domain position of each read column.
    col_pos: Vec<usize>,
    /// Whether each read column is categorical or boolean (read as its code).
    as_code: Vec<Option<Option<u32>>>,
    /// Whether each read column is imputed, and its rule.
    imputed: Vec<(bool, Option<Arc<dyn PhysicalExpr>>)>,
    /// Positions of the imputed columns among the read columns.
    a_pos: Vec<usize>,
    /// Domain positions and groupings of the matching attributes.
    matching: Vec<(usize, u32)>,
}

/// One batch, read.
pub struct ReadBatch {
    /// Rows.
    pub rows: usize,
    /// Per read column: values (null: null).
    pub observed: Vec<Vec<Option<f64>>>,
    /// Per read column: unknown cells (null, imputed, not not-applicable).
    pub unknown: Vec<Vec<bool>>,
    /// The codes of the matching attributes, grouped (one column per attribute).
    keys: Vec<Vec<u32>>,
}

fn internal(msg: impl Into<String>) -> DataFusionError {
    DataFusionError::Internal(msg.into())
}

impl Reader {
    /// A reader of inputs with `input_schema`.
    pub fn new(read: &KnnRead, rules: &[Rule], input_schema: &datafusion::arrow::datatypes::Schema) -> Result<Self> {
        let domain = &read.domain;
        let encoder = BatchEncoder::new(Arc::new(domain.clone()), input_schema)
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let pos =
            |name: &str| domain.position(name).ok_or_else(|| DataFusionError::Plan(format!("unknown column {name:?}")));
        let col_pos = read.columns.iter().map(|c| pos(c)).collect::<Result<Vec<_>>>()?;
        let as_code = col_pos
            .iter()
            .map(|&p| {
                let col = &domain.columns()[p];
                matches!(col.kind, ColumnKind::Categorical { .. } | ColumnKind::Boolean).then(|| col.null_code())
            })
            .collect();
        let imputed = read
            .columns
            .iter()
            .map(|c| {
                let rule = rules.iter().find(|(n, _)| n == c).map(|(_, r)| r.clone());
                (read.imputed.contains(c), rule)
            })
            .collect();
        let a_pos = read
            .imputed
            .iter()
            .map(|a| read.columns.iter().position(|c| c == a).ok_or_else(|| internal("an imputed column is not read")))
            .collect::<Result<Vec<_>>>()?;
        let matching = read.grouping.iter().map(|(c, g)| Ok((pos(c)?, (*g).max(1)))).collect::<Result<Vec<_>>>()?;
        Ok(Reader { encoder, decoded: decoded_schema(domain), col_pos, as_code, imputed, a_pos, matching })
    }

    /// Positions of the imputed columns among the read columns.
    pub fn a_pos(&self) -> &[usize] {
        &self.a_pos
    }

    /// Reads one raw batch (rows the domain's policies drop are dropped, as
    /// in every read of the input).
    pub fn read(&mut self, raw: &RecordBatch) -> Result<ReadBatch> {
        let exec = |e: crate::domain::EncodeError| DataFusionError::Execution(e.to_string());
        let codes = self.encoder.encode(raw).map_err(exec)?;
        let typed = self.encoder.typed(raw).map_err(exec)?;
        if codes.num_rows() != typed.num_rows() {
            return Err(internal("the two readings of a batch are not aligned"));
        }
        let rows = codes.num_rows();
        let mut typed_conformed: Option<RecordBatch> = None;
        let mut observed = Vec::with_capacity(self.col_pos.len());
        let mut unknown = Vec::with_capacity(self.col_pos.len());
        for (i, &p) in self.col_pos.iter().enumerate() {
            let v: Vec<Option<f64>> = match self.as_code[i] {
                Some(null) => {
                    let c = codes.column(p).as_primitive::<UInt32Type>();
                    c.values().iter().map(|&x| (Some(x) != null).then_some(x as f64)).collect()
                }
                None => {
                    let f = datafusion::arrow::compute::cast(typed.column(p), &DataType::Float64)?;
                    let f = f.as_primitive::<Float64Type>();
                    (0..rows).map(|r| f.is_valid(r).then(|| f.value(r))).collect()
                }
            };
            let u = match &self.imputed[i] {
                (false, _) => vec![false; rows],
                (true, None) => v.iter().map(Option::is_none).collect(),
                (true, Some(rule)) => {
                    if typed_conformed.is_none() {
                        typed_conformed = Some(conform_to_decoded(&typed, &self.decoded)?);
                    }
                    let t = typed_conformed.as_ref().expect("set");
                    let holds = rule.evaluate(t)?.into_array(rows)?;
                    let holds = holds.as_boolean();
                    // A null is not applicable where the rule holds (a null rule does not).
                    (0..rows).map(|r| v[r].is_none() && !(holds.is_valid(r) && holds.value(r))).collect()
                }
            };
            observed.push(v);
            unknown.push(u);
        }
        let keys = self
            .matching
            .iter()
            .map(|&(p, g)| codes.column(p).as_primitive::<UInt32Type>().values().iter().map(|&c| c / g).collect())
            .collect();
        Ok(ReadBatch { rows, observed, unknown, keys })
    }

    /// Row `r`'s role.
    pub fn role(&self, b: &ReadBatch, r: usize) -> Role {
        if self.a_pos.iter().all(|&a| b.observed[a][r].is_some()) {
            Role::Donor
        } else if self.a_pos.iter().any(|&a| b.unknown[a][r]) {
            Role::Donee
        } else {
            Role::None
        }
    }

    /// Row `r`'s grouped match key.
    pub fn key(&self, b: &ReadBatch, r: usize, key: &mut [u32]) {
        for (k, column) in key.iter_mut().zip(&b.keys) {
            *k = column[r];
        }
    }

    /// Matching attributes.
    pub fn key_len(&self) -> usize {
        self.matching.len()
    }
}

/// Pass 1 of one partition: its rows, and per class (in the order of first
/// appearance) its donors, donees and first donor.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassCounts {
    /// Rows of the partition (after the domain's policies).
    pub rows: u64,
    /// Classes, in the order they first appear in the partition.
    pub classes: Vec<ClassCount>,
}

/// What pass 1 learns of one class.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassCount {
    /// The grouped match key.
    pub key: Vec<u32>,
    /// Donors.
    pub donors: u64,
    /// Donees.
    pub donees: u64,
    /// Row of its first donor ([`NONE`] without donors): within the
    /// partition in a [`ClassCounts`], in the file after [`merge_classes`].
    pub first_donor: u64,
}

crate::protected_debug!(ClassCounts, ClassCount, KnnIndex, Waiting, FirstDonor, Partial);

/// Pass 1 over one partition's batches.
#[derive(Default)]
pub struct ClassCounter {
    id: HashMap<Vec<u32>, usize>,
    counts: ClassCounts,
    key: Vec<u32>,
}

impl ClassCounter {
    /// Adds one read batch.
    pub fn add(&mut self, reader: &Reader, b: &ReadBatch) {
        self.key.resize(reader.key_len(), 0);
        for r in 0..b.rows {
            let role = reader.role(b, r);
            if role != Role::None {
                reader.key(b, r, &mut self.key);
                let k = match self.id.get(self.key.as_slice()) {
                    Some(&k) => k,
                    None => {
                        self.id.insert(self.key.clone(), self.counts.classes.len());
                        self.counts.classes.push(ClassCount {
                            key: self.key.clone(),
                            donors: 0,
                            donees: 0,
                            first_donor: NONE,
                        });
                        self.counts.classes.len() - 1
                    }
                };
                let class = &mut self.counts.classes[k];
                if role == Role::Donor {
                    class.donors += 1;
                    if class.first_donor == NONE {
                        class.first_donor = self.counts.rows + r as u64;
                    }
                } else {
                    class.donees += 1;
                }
            }
        }
        self.counts.rows += b.rows as u64;
    }

    /// The partition's counts.
    pub fn finish(self) -> ClassCounts {
        self.counts
    }
}

/// The partitions' classes merged in partition order: each class once (in
/// the order it first appears in the file), its counts summed and its first
/// donor a row number in the file; and each partition's first row.
pub fn merge_classes(parts: &[ClassCounts]) -> (Vec<ClassCount>, Vec<u64>) {
    let mut id: HashMap<&[u32], usize> = HashMap::new();
    let mut out: Vec<ClassCount> = Vec::new();
    let mut offsets = Vec::with_capacity(parts.len());
    let mut offset = 0u64;
    for p in parts {
        offsets.push(offset);
        for c in &p.classes {
            let first = if c.first_donor == NONE { NONE } else { offset + c.first_donor };
            match id.get(c.key.as_slice()) {
                Some(&k) => {
                    let o = &mut out[k];
                    o.donors += c.donors;
                    o.donees += c.donees;
                    o.first_donor = o.first_donor.min(first);
                }
                None => {
                    id.insert(&c.key, out.len());
                    out.push(ClassCount { key: c.key.clone(), donors: c.donors, donees: c.donees, first_donor: first });
                }
            }
        }
        offset += p.rows;
    }
    (out, offsets)
}

/// What pass 2 needs of the whole file (public spec, the queries, and the
/// class index that pass 1 built).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct KnnIndex {
    /// The queries.
    pub queries: Vec<QuerySpec>,
    /// Class keys, by class id.
    pub keys: Vec<Vec<u32>>,
    /// Per donor class: the donee classes whose level holds it.
    pub watchers: Vec<Vec<u32>>,
    /// Per class: whether it has a level (some donor anywhere).
    pub has_level: Vec<bool>,
    /// Per partition: its first row's number in the file.
    pub offsets: Vec<u64>,
    /// Per partition: its rows (pass 1 counted them).
    pub rows: Vec<u64>,
}

/// A donee whose donor is not known yet.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Waiting {
    /// Its class.
    pub class: u32,
    /// Its row.
    pub row: u64,
    /// Its read values.
    pub observed: Vec<Option<f64>>,
    /// Its unknown cells.
    pub unknown: Vec<bool>,
}

/// A partition's first donor of one class.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstDonor {
    /// Its class.
    pub class: u32,
    /// Its row.
    pub row: u64,
    /// Its values of the imputed columns.
    pub values: Vec<f64>,
    /// The donees of R it served in the partition, per smooth number.
    pub load: Vec<u64>,
}

/// One partition's pass 2, except its donees' intervals.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Partial {
    /// The partition.
    pub partition: usize,
    /// Per query: (imputed, ignore-missing) aggregates of its resolved rows.
    pub aggs: Vec<(Aggregates, Aggregates)>,
    /// Per smooth number: donees of R resolved.
    pub inside: Vec<u64>,
    /// Donees resolved.
    pub seen: u64,
    /// Per smooth number: the most donees of R a donor whose load is final served.
    pub remove_donor: Vec<u64>,
    /// The partition's first donor of each class, in row order.
    pub firsts: Vec<FirstDonor>,
    /// Donees still waiting at the partition's end.
    pub carried: Vec<Waiting>,
}

/// One donee's interval in R of one smooth number: (number, class, donee
/// row, donor row or NaN without a donor).
pub type Interval = (u32, u32, f64, f64);

/// The queries compiled once, and how a donee's values enter them.
pub struct Compiled<'a> {
    queries: Vec<CompiledQuery<'a>>,
    /// Smooth numbers, flat: (query, index among its smooth numbers).
    flat: Vec<(usize, usize)>,
    a_pos: Vec<usize>,
}

impl<'a> Compiled<'a> {
    /// Compiles `queries` over the read columns of `read`.
    pub fn new(queries: &'a [QuerySpec], read: &KnnRead) -> Self {
        let cols = Columns { names: read.columns.clone() };
        let queries: Vec<CompiledQuery<'a>> =
            queries.iter().map(|q| CompiledQuery::new(q, &cols, &read.imputed)).collect();
        let flat = queries
            .iter()
            .enumerate()
            .flat_map(|(qi, q)| (0..q.smooth_parts().count()).map(move |k| (qi, k)))
            .collect();
        let a_pos = read.imputed.iter().map(|a| cols.position(a)).collect();
        Compiled { queries, flat, a_pos }
    }

    /// Smooth numbers in all.
    pub fn smooth_numbers(&self) -> usize {
        self.flat.len()
    }

    /// The compiled queries.
    pub fn queries(&self) -> &[CompiledQuery<'a>] {
        &self.queries
    }

    /// Adds a row that is not a donee, as read.
    fn add_plain(&self, observed: &[Option<f64>], unknown: &[bool], aggs: &mut [(Aggregates, Aggregates)]) {
        let view = RowView { after: observed, observed, unknown, donee: false };
        for (q, (imp, ign)) in self.queries.iter().zip(aggs.iter_mut()) {
            q.add(&view, imp, ign);
        }
    }

    /// A donee's values once its donor is known (None: no donor anywhere),
    /// added to every aggregate; its interval goes to every smooth number
    /// whose R holds it, and its donor's `load` grows by one there.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        w: &Waiting,
        donor: Option<(u64, &[f64])>,
        load: &mut [u64],
        aggs: &mut [(Aggregates, Aggregates)],
        inside: &mut [u64],
        intervals: &mut dyn FnMut(Interval),
    ) {
        let mut after = w.observed.clone();
        for (j, &p) in self.a_pos.iter().enumerate() {
            if w.unknown[p] {
                after[p] = donor.map(|(_, v)| v[j]);
            }
        }
        let view = RowView { after: &after, observed: &w.observed, unknown: &w.unknown, donee: true };
        for (q, (imp, ign)) in self.queries.iter().zip(aggs.iter_mut()) {
            q.add(&view, imp, ign);
        }
        let donor_row = donor.map_or(f64::NAN, |(r, _)| r as f64);
        for (f, &(qi, k)) in self.flat.iter().enumerate() {
            if self.queries[qi].relevant(k, &view) {
                intervals((f as u32, w.class, w.row as f64, donor_row));
                inside[f] += 1;
                load[f] += u64::from(donor.is_some());
            }
        }
    }
}

/// Pass 2 over one partition's batches, in order.
pub struct Imputer<'a> {
    index: &'a KnnIndex,
    compiled: &'a Compiled<'a>,
    id: HashMap<&'a [u32], u32>,
    partial: Partial,
    waiting: Vec<Vec<Waiting>>,
    first_seen: Vec<bool>,
    load: Vec<u64>,
    row: u64,
    end: u64,
    key: Vec<u32>,
}

impl<'a> Imputer<'a> {
    /// Pass 2 of partition `partition`.
    pub fn new(index: &'a KnnIndex, compiled: &'a Compiled<'a>, partition: usize) -> Result<Self> {
        let (Some(&offset), Some(&rows)) = (index.offsets.get(partition), index.rows.get(partition)) else {
            return Err(internal("the imputation input is partitioned differently in its two passes"));
        };
        let nclass = index.keys.len();
        let nflat = compiled.smooth_numbers();
        Ok(Imputer {
            index,
            compiled,
            id: index.keys.iter().enumerate().map(|(i, k)| (k.as_slice(), i as u32)).collect(),
            partial: Partial {
                partition,
                aggs: vec![Default::default(); compiled.queries.len()],
                inside: vec![0; nflat],
                remove_donor: vec![0; nflat],
                ..Default::default()
            },
            waiting: (0..nclass).map(|_| Vec::new()).collect(),
            first_seen: vec![false; nclass],
            load: vec![0; nflat],
            row: offset,
            end: offset + rows,
            key: Vec::new(),
        })
    }

    /// Adds one read batch; each donee's interval goes to `intervals`.
    pub fn add(&mut self, reader: &Reader, b: &ReadBatch, intervals: &mut dyn FnMut(Interval)) -> Result<()> {
        let changed = || internal("the imputation input changed between its two reads");
        self.key.resize(reader.key_len(), 0);
        let c = self.compiled;
        let ncols = b.observed.len();
        let mut observed = vec![None; ncols];
        let mut unknown = vec![false; ncols];
        for r in 0..b.rows {
            let this = self.row;
            self.row += 1;
            if this >= self.end {
                return Err(changed());
            }
            for i in 0..ncols {
                observed[i] = b.observed[i][r];
                unknown[i] = b.unknown[i][r];
            }
            let role = reader.role(b, r);
            if role != Role::None {
                reader.key(b, r, &mut self.key);
                let k = *self.id.get(self.key.as_slice()).ok_or_else(changed)?;
                let p = &mut self.partial;
                if role == Role::Donee {
                    let w = Waiting { class: k, row: this, observed: observed.clone(), unknown: unknown.clone() };
                    if self.index.has_level[k as usize] {
                        self.waiting[k as usize].push(w);
                    } else {
                        // No donor anywhere: its unknown cells stay null.
                        c.finish(&w, None, &mut self.load, &mut p.aggs, &mut p.inside, intervals);
                        p.seen += 1;
                    }
                    continue;
                }
                let values: Vec<f64> = c
                    .a_pos
                    .iter()
                    .map(|&a| observed[a].ok_or_else(|| internal("a donor is complete")))
                    .collect::<Result<_>>()?;
                self.load.iter_mut().for_each(|l| *l = 0);
                for &w in &self.index.watchers[k as usize] {
                    for d in std::mem::take(&mut self.waiting[w as usize]) {
                        c.finish(&d, Some((this, &values)), &mut self.load, &mut p.aggs, &mut p.inside, intervals);
                        p.seen += 1;
                    }
                }
                if !self.first_seen[k as usize] {
                    // Donees of earlier partitions may still come to it: its load is not final.
                    self.first_seen[k as usize] = true;
                    p.firsts.push(FirstDonor { class: k, row: this, values, load: self.load.clone() });
                } else {
                    p.remove_donor.iter_mut().zip(&self.load).for_each(|(m, l)| *m = (*m).max(*l));
                }
            }
            c.add_plain(&observed, &unknown, &mut self.partial.aggs);
        }
        Ok(())
    }

    /// The partition's partial: the donees still waiting are carried.
    pub fn finish(mut self) -> Result<Partial> {
        if self.row != self.end {
            return Err(internal("the imputation input changed between its two reads"));
        }
        self.partial.carried = self.waiting.into_iter().flatten().collect();
        self.partial.carried.sort_by_key(|w| w.row);
        Ok(self.partial)
    }
}

/// Everything the partitions found, merged: what L1_R(D) and the release need.
pub struct Merged {
    /// Per query: (imputed, ignore-missing) aggregates.
    pub aggs: Vec<(Aggregates, Aggregates)>,
    /// Per smooth number, per class: the donees of R as (identifier, donor identifier or NaN).
    pub per_part: Vec<Vec<Vec<(f64, f64)>>>,
    /// Per smooth number: |R|.
    pub inside: Vec<u64>,
    /// Donees in all.
    pub seen: u64,
    /// Per smooth number: the most donees of R one donor serves.
    pub remove_donor: Vec<u64>,
}

/// An empty home for the donees' intervals of every smooth number and class
/// ([`push_interval`] fills it as the partitions' intervals arrive).
pub fn interval_table(compiled: &Compiled<'_>, index: &KnnIndex) -> Vec<Vec<Vec<(f64, f64)>>> {
    vec![vec![Vec::new(); index.keys.len()]; compiled.smooth_numbers()]
}

/// Files one interval in an [`interval_table`].
pub fn push_interval(per_part: &mut [Vec<Vec<(f64, f64)>>], (f, class, x, y): Interval) -> Result<()> {
    per_part
        .get_mut(f as usize)
        .and_then(|p| p.get_mut(class as usize))
        .ok_or_else(|| internal("an interval names an unknown number or class"))?
        .push((x, y));
    Ok(())
}

/// Merges the partitions' partials (in any order; sorted here) into the
/// intervals that arrived with them (`per_part`): carried donees find their donors among later partitions'
/// first donors, and the last wrap around to their level's first donor.
/// `first_donor` is each class's first donor in the file ([`merge_classes`]);
/// `wrap` each donee class's level's first donor class.
pub fn merge_partials(
    compiled: &Compiled<'_>,
    index: &KnnIndex,
    first_donor: &[u64],
    wrap: &[Option<u32>],
    mut partials: Vec<Partial>,
    per_part: Vec<Vec<Vec<(f64, f64)>>>,
) -> Result<Merged> {
    let nclass = index.keys.len();
    let nflat = compiled.smooth_numbers();
    partials.sort_by_key(|p| p.partition);
    if partials.len() != index.offsets.len() || partials.iter().enumerate().any(|(i, p)| p.partition != i) {
        return Err(internal("a partition of the imputation's second pass is missing or repeated"));
    }
    if per_part.len() != nflat || per_part.iter().any(|p| p.len() != nclass) {
        return Err(internal("the donee intervals are not laid out by number and class"));
    }
    let mut m = Merged {
        aggs: vec![Default::default(); compiled.queries.len()],
        per_part,
        inside: vec![0; nflat],
        seen: 0,
        remove_donor: vec![0; nflat],
    };
    let push = |per_part: &mut Vec<Vec<Vec<(f64, f64)>>>, iv: Interval| push_interval(per_part, iv);
    let mut pending: Vec<Vec<Waiting>> = (0..nclass).map(|_| Vec::new()).collect();
    let mut first_load: Vec<Option<Vec<u64>>> = vec![None; nclass];
    let mut first_values: Vec<Option<Vec<f64>>> = vec![None; nclass];
    let mut local = Vec::new();
    for p in partials {
        for (a, b) in m.aggs.iter_mut().zip(&p.aggs) {
            add_aggs(&mut a.0, &b.0);
            add_aggs(&mut a.1, &b.1);
        }
        m.inside.iter_mut().zip(&p.inside).for_each(|(a, b)| *a += b);
        m.seen += p.seen;
        m.remove_donor.iter_mut().zip(&p.remove_donor).for_each(|(a, b)| *a = (*a).max(*b));
        for f in p.firsts {
            let mut load = f.load;
            let class = f.class as usize;
            let watchers = index.watchers.get(class).ok_or_else(|| internal("a first donor of an unknown class"))?;
            for &w in watchers {
                for d in std::mem::take(&mut pending[w as usize]) {
                    local.clear();
                    compiled.finish(&d, Some((f.row, &f.values)), &mut load, &mut m.aggs, &mut m.inside, &mut |iv| {
                        local.push(iv)
                    });
                    for &iv in &local {
                        push(&mut m.per_part, iv)?;
                    }
                    m.seen += 1;
                }
            }
            if first_donor[class] == f.row {
                first_load[class] = Some(load);
                first_values[class] = Some(f.values);
            } else {
                m.remove_donor.iter_mut().zip(&load).for_each(|(a, b)| *a = (*a).max(*b));
            }
        }
        for w in p.carried {
            let class = w.class as usize;
            pending.get_mut(class).ok_or_else(|| internal("a donee of an unknown class"))?.push(w);
        }
    }
    // Donees still waiting wrap around to their level's first donor.
    for (k, queue) in pending.iter_mut().enumerate() {
        if queue.is_empty() {
            continue;
        }
        let d = wrap[k].ok_or_else(|| internal("a donee without a level waited for a donor"))? as usize;
        let mut load = first_load[d].take().unwrap_or_else(|| vec![0; nflat]);
        let values = first_values[d].clone().ok_or_else(|| internal("a first donor was not seen again"))?;
        for w in std::mem::take(queue) {
            local.clear();
            compiled.finish(&w, Some((first_donor[d], &values)), &mut load, &mut m.aggs, &mut m.inside, &mut |iv| {
                local.push(iv)
            });
            for &iv in &local {
                push(&mut m.per_part, iv)?;
            }
            m.seen += 1;
        }
        first_load[d] = Some(load);
    }
    for load in first_load.iter().flatten() {
        m.remove_donor.iter_mut().zip(load).for_each(|(a, b)| *a = (*a).max(*b));
    }
    if m.per_part.iter().zip(&m.inside).any(|(p, &n)| p.iter().map(|c| c.len() as u64).sum::<u64>() != n) {
        return Err(internal("the donee intervals do not match the partitions' counts"));
    }
    Ok(m)
}

fn add_aggs(a: &mut Aggregates, b: &Aggregates) {
    a.count += b.count;
    a.numerator += b.numerator;
    a.values += b.values;
    a.units += b.units;
    a.units_sq += b.units_sq;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partials_cross_json_bit_for_bit() {
        // Values a two-step decimal parse rounds wrong (serde_json without float_roundtrip).
        let odd = [0.9999999999999999, 12.753451286971085, 1e-310, f64::MAX, 0.1 + 0.2];
        let w = Waiting { class: 3, row: 7, observed: odd.iter().map(|&x| Some(x)).collect(), unknown: vec![false; 5] };
        let back: Waiting = serde_json::from_slice(&serde_json::to_vec(&w).unwrap()).unwrap();
        assert!(back.observed.iter().zip(&odd).all(|(b, o)| b.unwrap().to_bits() == o.to_bits()));
        let f = FirstDonor { class: 1, row: 2, values: odd.to_vec(), load: vec![4] };
        let back: FirstDonor = serde_json::from_slice(&serde_json::to_vec(&f).unwrap()).unwrap();
        assert!(back.values.iter().zip(&odd).all(|(b, o)| b.to_bits() == o.to_bits()));
    }
}
