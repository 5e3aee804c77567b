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
        table_paths.push(url.to_string());
        urls.push(url);
    }
    let url = urls[0].clone();
    let format = format.unwrap_or_else(|| InputFormat::detect(location));
    let table_path = table_paths;
    match format {
        InputFormat::Parquet => ctx
            .read_parquet(table_path, ParquetReadOptions::default())
            .await
            .map_err(|source| IoError::OpenInput { format: "Parquet", location: location.to_string(), source }),
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
