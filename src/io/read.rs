//! Streaming reads of CSV and Parquet inputs.

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions};
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;
use url::Url;

use super::IoError;
use super::store::{register_stores_for, resolve_url, store_for};
use crate::domain::DomainSpec;

/// File format of an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum InputFormat {
    /// Delimited text (CSV, UCI `.data`/`.test`, TSV).
    Csv,
    /// Apache Parquet.
    Parquet,
}

impl InputFormat {
    /// Guesses the format from the file extension (Parquet for prefixes).
    pub fn detect(location: &str) -> Self {
        let l = location.to_ascii_lowercase();
        let l = l.split(['?', '#']).next().unwrap_or(&l);
        if [".csv", ".data", ".test", ".txt", ".tsv", ".csv.gz"].iter().any(|e| l.ends_with(e)) {
            InputFormat::Csv
        } else {
            InputFormat::Parquet
        }
    }
}

fn extension_of(url: &Url) -> String {
    let path = url.path();
    let name = path.rsplit('/').next().unwrap_or("");
    if name.contains('*') || name.is_empty() {
        return String::new();
    }
    match name.rfind('.') {
        Some(i) => name[i..].to_string(),
        None => String::new(),
    }
}

/// Reads the header line of a delimited text file (first file of a prefix).
pub async fn read_header_names(
    ctx: &SessionContext,
    url: &Url,
    delimiter: char,
    quote: char,
) -> Result<Vec<String>, IoError> {
    let store = store_for(ctx, url)?;
    let location = || url.to_string();
    let mut path =
        ObjectPath::from_url_path(url.path()).map_err(|source| IoError::BadPath { location: location(), source })?;
    let store_err = |action| move |source| IoError::Store { action, location: location(), source };
    if url.path().ends_with('/') {
        let first = store
            .list(Some(&path))
            .try_next()
            .await
            .map_err(store_err("listing"))?
            .ok_or_else(|| IoError::EmptyPrefix { url: location() })?;
        path = first.location;
    }
    let meta = store.head(&path).await.map_err(store_err("cannot open"))?;
    let end = meta.size.min(1 << 16);
    let bytes = store.get_range(&path, 0..end).await.map_err(store_err("reading"))?;
    let text = String::from_utf8_lossy(&bytes);
    let line = text.lines().next().ok_or_else(|| IoError::EmptyFile { url: location() })?;
    Ok(line.split(delimiter).map(|s| s.trim().trim_matches(quote).to_string()).collect())
}

/// Fails unless `url` names an existing object, or a prefix/glob with at least
/// one object (DataFusion would silently read an empty table).
pub async fn ensure_exists(ctx: &SessionContext, url: &Url, location: &str) -> Result<(), IoError> {
    let store = store_for(ctx, url)?;
    let path = url.path();
    let is_glob = path.contains(['*', '?', '[']);
    if !is_glob && !path.ends_with('/') {
        let p = ObjectPath::from_url_path(path)
            .map_err(|source| IoError::BadPath { location: location.to_string(), source })?;
        if store.head(&p).await.is_ok() {
            return Ok(());
        }
    }
    // A directory/prefix (or glob): needs at least one object below its fixed part.
    let fixed = match path.find(['*', '?', '[']) {
        Some(i) => &path[..path[..i].rfind('/').map_or(0, |j| j + 1)],
        None => path,
    };
    let prefix = ObjectPath::from_url_path(fixed)
        .map_err(|source| IoError::BadPath { location: location.to_string(), source })?;
    match store.list(Some(&prefix)).try_next().await {
        Ok(Some(_)) => Ok(()),
        _ => Err(IoError::MissingInput { location: location.to_string(), url: url.to_string() }),
    }
}

/// Opens an input as a (lazy, streaming) DataFrame. CSV columns are read as
/// text (the domain decides types); names come from the header or, when the
/// domain says `header: false`, from the domain's column order.
pub async fn open_input(
    ctx: &SessionContext,
    location: &str,
    format: Option<InputFormat>,
    spec: &DomainSpec,
) -> Result<DataFrame, IoError> {
    open_inputs(ctx, &[location.to_string()], format, spec).await
}

/// The path DataFusion lists for `url`. Local directories and globs go as
/// plain paths: DataFusion 55 turns a `file://…/dir/` URL into a path without
/// its trailing slash (and then takes the directory for a file), and matches
/// the glob of a `file://` URL against object paths it never equals (so a
/// glob read nothing at all).
fn listing_path(url: &Url) -> String {
    let path = url.path();
    let glob = path.contains(['*', '?', '[']);
    if url.scheme() == "file"
        && (path.ends_with('/') || glob)
        && let Ok(p) = url.to_file_path()
    {
        let p = p.display().to_string();
        return if glob { p } else { format!("{}/", p.trim_end_matches('/')) };
    }
    url.to_string()
}

/// Opens several inputs (files, prefixes or globs of one format) as one table.
pub async fn open_inputs(
    ctx: &SessionContext,
    locations: &[String],
    format: Option<InputFormat>,
    spec: &DomainSpec,
) -> Result<DataFrame, IoError> {
    let location = locations.first().ok_or(IoError::NoInput)?.as_str();
    let mut table_paths = Vec::with_capacity(locations.len());
    let mut urls = Vec::with_capacity(locations.len());
    for l in locations {
        let url = resolve_url(l)?;
        register_stores_for(ctx, &url)?;
        ensure_exists(ctx, &url, l).await?;
        table_paths.push(listing_path(&url));
        urls.push(url);
    }
    let url = urls[0].clone();
    let format = format.unwrap_or_else(|| InputFormat::detect(location));
    let table_path = table_paths;
    match format {
        InputFormat::Parquet => {
            check_parquet_footers(ctx, &urls, location).await?;
            ctx.read_parquet(table_path, ParquetReadOptions::default()).await.map_err(|source| IoError::OpenInput {
                format: "Parquet",
                location: location.to_string(),
                source,
            })
        }
        InputFormat::Csv => {
            let t = &spec.text;
            if !t.delimiter.is_ascii() || !t.quote.is_ascii() || t.comment.is_some_and(|c| !c.is_ascii()) {
                return Err(IoError::NonAsciiText { domain: spec.source.to_string() });
            }
            let names: Vec<String> = if t.header {
                read_header_names(ctx, &url, t.delimiter, t.quote).await?
            } else {
                spec.domain.names().iter().map(|s| s.to_string()).collect()
            };
            let schema = Schema::new(names.iter().map(|n| Field::new(n, DataType::Utf8, true)).collect::<Vec<_>>());
            let ext = if urls.len() == 1 { extension_of(&url) } else { String::new() };
            let mut opts = CsvReadOptions::new()
                .has_header(t.header)
                .delimiter(t.delimiter as u8)
                .quote(t.quote as u8)
                .schema(&schema)
                .file_extension(&ext);
            if let Some(c) = t.comment {
                opts = opts.comment(c as u8);
            }
            ctx.read_csv(table_path, opts).await.map_err(|source| IoError::OpenInput {
                format: "CSV",
                location: location.to_string(),
                source,
            })
        }
    }
}

/// Opens a released (public) table: synthetic sets, published outputs. No
/// domain is needed: CSV types are inferred from the file, which is fine for
/// data that is already public and wrong for protected data (use
/// [`open_input`] there). Parquet files get the same footer checks.
pub async fn open_released(
    ctx: &SessionContext,
    location: &str,
    format: Option<InputFormat>,
) -> Result<DataFrame, IoError> {
    let url = resolve_url(location)?;
    register_stores_for(ctx, &url)?;
    ensure_exists(ctx, &url, location).await?;
    let open_err = |format| move |source| IoError::OpenInput { format, location: location.to_string(), source };
    match format.unwrap_or_else(|| InputFormat::detect(location)) {
        InputFormat::Parquet => {
            check_parquet_footers(ctx, std::slice::from_ref(&url), location).await?;
            ctx.read_parquet(url.to_string(), ParquetReadOptions::default()).await.map_err(open_err("Parquet"))
        }
        InputFormat::Csv => {
            let ext = extension_of(&url);
            ctx.read_csv(url.to_string(), CsvReadOptions::new().has_header(true).file_extension(&ext))
                .await
                .map_err(open_err("CSV"))
        }
    }
}

/// The Parquet footer: the metadata length (u32, little-endian) and the magic.
const PARQUET_FOOTER: u64 = 8;
/// The leading magic `PAR1`.
const PARQUET_MAGIC: u64 = 4;

/// Checks the footer and metadata of every Parquet file the inputs name (the
/// files DataFusion will list: `.parquet` under a prefix or glob) before
/// DataFusion decodes them. The Parquet reader (59.x) computes the metadata's
/// offset as `size - 8 - length` without checking it, and panics on a file
/// whose footer claims more metadata than the file holds (`PAR1garbagePAR1`);
/// it also panics when a column chunk or page index named by the metadata
/// lies past the end of the file. Two range requests per file (the footer,
/// then the metadata), sixteen files at a time, once per version of a file
/// in a process: a pipeline opens its dataset for each step and `dpflow
/// serve` for each session, and only listing is repeated.
async fn check_parquet_footers(ctx: &SessionContext, urls: &[Url], location: &str) -> Result<(), IoError> {
    use datafusion::datasource::listing::ListingTableUrl;
    let open_err = |source| IoError::OpenInput { format: "Parquet", location: location.to_string(), source };
    let state = ctx.state();
    let mut files = Vec::new();
    for url in urls {
        let listing = ListingTableUrl::parse(url.as_str()).map_err(open_err)?;
        let store = store_for(ctx, url)?;
        let metas: Vec<_> = listing
            .list_all_files(&state, store.as_ref(), ".parquet")
            .await
            .map_err(open_err)?
            .try_collect()
            .await
            .map_err(open_err)?;
        let base = &url[..url::Position::BeforePath];
        let checked = checked_parquet_files().lock();
        files.extend(
            metas
                .into_iter()
                .map(|m| (store.clone(), format!("{base}/{}", m.location), m))
                .filter(|(_, file, m)| !checked.contains(&file_version(file, m))),
        );
    }
    // Sixteen requests at a time (a stream's `buffer_unordered` here makes the
    // server's futures fail the `Send` check: a known compiler limitation).
    let mut files = files.into_iter().peekable();
    while files.peek().is_some() {
        let batch: Vec<_> = files.by_ref().take(16).collect();
        let versions: Vec<_> = batch.iter().map(|(_, f, m)| file_version(f, m)).collect();
        futures::future::try_join_all(batch.into_iter().map(|(s, f, m)| check_parquet_footer(s, f, m))).await?;
        let mut checked = checked_parquet_files().lock();
        if checked.len() > 1_000_000 {
            checked.clear();
        }
        checked.extend(versions);
    }
    Ok(())
}

/// One version of a file: its URL, size, modification time and e-tag.
type FileVersion = (String, u64, chrono::DateTime<chrono::Utc>, Option<String>);

fn file_version(file: &str, m: &object_store::ObjectMeta) -> FileVersion {
    (file.to_string(), m.size, m.last_modified, m.e_tag.clone())
}

/// The file versions whose footers and metadata passed the checks in this
/// process (cleared past a million entries).
fn checked_parquet_files() -> &'static parking_lot::Mutex<std::collections::HashSet<FileVersion>> {
    static CHECKED: std::sync::OnceLock<parking_lot::Mutex<std::collections::HashSet<FileVersion>>> =
        std::sync::OnceLock::new();
    CHECKED.get_or_init(Default::default)
}

/// One file's footer check (see [`check_parquet_footers`]).
async fn check_parquet_footer(
    store: std::sync::Arc<dyn object_store::ObjectStore>,
    file: String,
    meta: object_store::ObjectMeta,
) -> Result<(), IoError> {
    let not = |problem| IoError::NotParquet { file: file.clone(), problem };
    if meta.size < PARQUET_MAGIC + PARQUET_FOOTER {
        return Err(not("it is shorter than a Parquet header and footer"));
    }
    let tail = store
        .get_range(&meta.location, meta.size - PARQUET_FOOTER..meta.size)
        .await
        .map_err(|source| IoError::ReadFooter { file: file.clone(), source })?;
    if tail.len() as u64 != PARQUET_FOOTER {
        return Err(not("its footer could not be read whole"));
    }
    if &tail[4..] != b"PAR1" && &tail[4..] != b"PARE" {
        return Err(not("it does not end with the Parquet magic `PAR1`"));
    }
    let metadata = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if metadata > meta.size - PARQUET_MAGIC - PARQUET_FOOTER {
        return Err(not("its footer claims more metadata than the file holds"));
    }
    if &tail[4..] == b"PARE" {
        // An encrypted footer: its metadata cannot be read without the keys.
        return Ok(());
    }
    // Every range the metadata names must lie inside the file, before the
    // metadata: the reader fetches them (column chunks, page indexes) and
    // panics when a store returns fewer bytes than it asked for (found by the
    // `parquet` fuzz target), or asserts on negative offsets.
    let meta_start = meta.size - PARQUET_FOOTER - metadata;
    let bytes = store
        .get_range(&meta.location, meta_start..meta.size - PARQUET_FOOTER)
        .await
        .map_err(|source| IoError::ReadFooter { file: file.clone(), source })?;
    let decoded = datafusion::parquet::file::metadata::ParquetMetaDataReader::decode_metadata(&bytes)
        .map_err(|_| not("its metadata cannot be decoded"))?;
    let inside = |offset: Option<i64>, len: Option<i64>| match (offset, len) {
        (None, _) | (_, None) => true,
        (Some(o), Some(l)) => o >= 0 && l >= 0 && o.checked_add(l).is_some_and(|end| end as u64 <= meta_start),
    };
    // Row counts and sizes: DataFusion sums them into file statistics with
    // plain `+` and `*` (`statistics_from_parquet_metadata`), which panics
    // on overflow in a debug build (found by the `parquet` fuzz target: a
    // negative row count cast to usize). Counts must be non-negative and
    // their totals far from overflow (2⁵² rows; sizes within i64).
    let mut rows: i64 = 0;
    let mut uncompressed: Vec<i64> = Vec::new();
    for rg in decoded.row_groups() {
        rows = rows
            .checked_add(rg.num_rows())
            .filter(|&r| rg.num_rows() >= 0 && r <= 1 << 52 && rg.total_byte_size() >= 0)
            .ok_or_else(|| not("its metadata gives an impossible row count or size"))?;
        uncompressed.resize(uncompressed.len().max(rg.columns().len()), 0);
        for (total, c) in uncompressed.iter_mut().zip(rg.columns()) {
            *total = total
                .checked_add(c.uncompressed_size())
                .filter(|_| c.uncompressed_size() >= 0)
                .ok_or_else(|| not("its metadata gives an impossible column size"))?;
        }
    }
    for rg in decoded.row_groups() {
        for c in rg.columns() {
            let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
            if !inside(Some(start), Some(c.compressed_size()))
                || !inside(c.column_index_offset(), c.column_index_length().map(i64::from))
                || !inside(c.offset_index_offset(), c.offset_index_length().map(i64::from))
            {
                return Err(not("its metadata points outside the file"));
            }
        }
    }
    // The schema DataFusion infers next: the Parquet schema and, when the
    // writer embedded one, the Arrow schema (IPC flatbuffers under
    // `ARROW:schema`). arrow-ipc 59.x reaches `unimplemented!` on a field of
    // type NONE (found by the `parquet` fuzz target); the conversion is
    // deterministic, so doing it here, guarded, first, means DataFusion's
    // own call cannot panic.
    let fm = decoded.file_metadata();
    let arrow_schema = dpflow_udfs::unwind::guarded(|| {
        datafusion::parquet::arrow::parquet_to_arrow_schema(fm.schema_descr(), fm.key_value_metadata())
    });
    match arrow_schema {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => Err(not("its schema cannot be converted to Arrow types")),
        Err(_) => Err(not("its embedded Arrow schema (`ARROW:schema`) cannot be read")),
    }
}
