//! Compiled public domains and the encode/decode kernels that run inside the
//! engine. The user-facing domain *spec* (YAML/JSON files, validation with
//! file/line errors) lives in the `dpflow` crate's `domain` module and
//! compiles to these types.

mod column;
mod decode;
mod encode;
mod exec;
mod fast;
mod table;
#[cfg(test)]
mod tests;

pub use column::{Column, ColumnError, ColumnKind, Domain, DomainError, OutOfDomain};
pub use decode::{DecodeError, DecodeMode, conform_to_decoded, decode_columns, decoded_schema};
pub use encode::{BatchEncoder, ColumnStats, EncodeError, EncodeStats, encoded_schema};
pub use exec::{DomainOutput, EncodeExec};
pub use table::{EncodedTable, project};
