//! The input formats: tensor-usage JSON and MiniMalloc CSV. Readers take text and never panic;
//! a malformed or truncated input is an [`Error`] naming the line or record.

use serde::Deserialize;

use super::{Kind, Tensor};

/// Why a planning input could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The JSON is malformed or truncated, or a record has a wrong or missing field.
    #[error("line {line}, column {column}: {source}")]
    Json {
        /// Line (from 1).
        line: usize,
        /// Column (from 1).
        column: usize,
        /// serde_json's description (names the field).
        #[source]
        source: serde_json::Error,
    },
    /// A CSV line does not have the four fields `id,lower,upper,size`.
    #[error("line {line}: expected 4 fields id,lower,upper,size, found {found}")]
    CsvFields {
        /// Line (from 1).
        line: usize,
        /// How many fields it has.
        found: usize,
    },
    /// A CSV field is not a non-negative integer of the right width.
    #[error("line {line}: field {field} is not a non-negative integer: {text:?}")]
    CsvNumber {
        /// Line (from 1).
        line: usize,
        /// The field's name.
        field: &'static str,
        /// The text found.
        text: String,
    },
    /// A CSV buffer's half-open interval is empty (`upper <= lower`).
    #[error("line {line}: buffer {id} has an empty interval [{lower}, {upper})")]
    CsvInterval {
        /// Line (from 1).
        line: usize,
        /// The buffer's id.
        id: u64,
        /// Its start.
        lower: u64,
        /// Its end (exclusive).
        upper: u64,
    },
}

/// Which reader to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// `{"tensors": [...]}`.
    Json,
    /// MiniMalloc's `id,lower,upper,size`.
    Csv,
}

impl FileFormat {
    /// The format a file name's extension suggests (`.json`, `.csv`).
    pub fn from_extension(path: &std::path::Path) -> Option<Self> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "json" => Some(FileFormat::Json),
            "csv" => Some(FileFormat::Csv),
            _ => None,
        }
    }

    /// Reads `text` in this format.
    ///
    /// # Errors
    ///
    /// See [`Error`].
    pub fn read(self, text: &str) -> Result<Vec<Tensor>, Error> {
        match self {
            FileFormat::Json => read_json(text),
            FileFormat::Csv => read_csv(text),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonTensor {
    id: u64,
    #[serde(default)]
    name: Option<String>,
    bytes: u64,
    first: u32,
    last: u32,
    #[serde(default)]
    op: Option<String>,
    #[serde(default)]
    inputs: Vec<u64>,
    #[serde(default)]
    kind: Kind,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    inplace: Option<bool>,
}

#[derive(Deserialize)]
struct JsonDoc {
    tensors: Vec<JsonTensor>,
}

/// Reads tensor-usage JSON: `{"tensors": [{"id", "bytes", "first", "last", "op"?, "inputs"?,
/// "kind"?, "offset"?, "inplace"?, "name"?}]}`; other top-level keys are ignored, unknown keys
/// in a record are an error (a misspelt `offest` should not be silently dropped).
///
/// # Errors
///
/// [`Error::Json`] with the line and column, and serde_json's message naming the field.
pub fn read_json(text: &str) -> Result<Vec<Tensor>, Error> {
    let doc: JsonDoc = serde_json::from_str(text).map_err(|source| Error::Json {
        line: source.line(),
        column: source.column(),
        source,
    })?;
    Ok(doc
        .tensors
        .into_iter()
        .map(|t| Tensor {
            id: t.id,
            name: t.name,
            bytes: t.bytes,
            first: t.first,
            last: t.last,
            op: t.op,
            inputs: t.inputs,
            kind: t.kind,
            offset: t.offset,
            inplace: t.inplace,
        })
        .collect())
}

fn number<T: std::str::FromStr>(line: usize, field: &'static str, text: &str) -> Result<T, Error> {
    text.trim().parse().map_err(|_| Error::CsvNumber {
        line,
        field,
        text: text.chars().take(40).collect(),
    })
}

/// Reads MiniMalloc CSV: a header line `id,lower,upper,size` (optional), then one buffer per
/// line, live over the half-open `[lower, upper)`, which becomes the inclusive
/// `[lower, upper - 1]`. Blank lines are skipped.
///
/// # Errors
///
/// The line and field that are wrong.
pub fn read_csv(text: &str) -> Result<Vec<Tensor>, Error> {
    let mut tensors = Vec::new();
    for (k, raw) in text.lines().enumerate() {
        let line = k + 1;
        let raw = raw.trim();
        if raw.is_empty() || (k == 0 && raw.starts_with("id")) {
            continue;
        }
        let fields: Vec<&str> = raw.split(',').collect();
        if fields.len() != 4 {
            return Err(Error::CsvFields {
                line,
                found: fields.len(),
            });
        }
        let id: u64 = number(line, "id", fields[0])?;
        let lower: u32 = number(line, "lower", fields[1])?;
        let upper: u32 = number(line, "upper", fields[2])?;
        let size: u64 = number(line, "size", fields[3])?;
        if upper <= lower {
            return Err(Error::CsvInterval {
                line,
                id,
                lower: lower.into(),
                upper: upper.into(),
            });
        }
        tensors.push(Tensor::new(id, size, lower, upper - 1));
    }
    Ok(tensors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_reads_records_and_ignores_other_keys() {
        let text = r#"{"model": "x", "tensors": [
            {"id": 0, "bytes": 602112, "first": 0, "last": 3, "op": "Conv", "inputs": [], "kind": "intermediate"},
            {"id": 1, "bytes": 10, "first": 1, "last": 2, "op": "Relu", "inputs": [0], "kind": "output", "offset": 0, "inplace": false, "name": "y"}
        ]}"#;
        let t = read_json(text).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].op.as_deref(), Some("Conv"));
        assert_eq!(t[1].kind, Kind::Output);
        assert_eq!((t[1].offset, t[1].inplace), (Some(0), Some(false)));
        assert_eq!(t[1].name.as_deref(), Some("y"));
    }

    #[test]
    fn json_errors_name_the_place() {
        let e = read_json(r#"{"tensors": [{"id": 0, "bytes": 1, "first": 0}]}"#).unwrap_err();
        assert!(e.to_string().contains("last"), "{e}");
        let e = read_json("{\"tensors\": [\n{\"id\": 0, ").unwrap_err();
        assert!(e.to_string().starts_with("line 2"), "{e}");
        let e = read_json(r#"{"tensors": [{"id": -1, "bytes": 1, "first": 0, "last": 0}]}"#)
            .unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
    }

    #[test]
    fn csv_half_open_to_inclusive() {
        let t = read_csv("id,lower,upper,size\n0,0,3,100\n\n1,2,5,7\n").unwrap();
        assert_eq!((t[0].first, t[0].last, t[0].bytes), (0, 2, 100));
        assert_eq!((t[1].id, t[1].first, t[1].last), (1, 2, 4));
    }

    #[test]
    fn csv_errors_name_the_line() {
        let e = read_csv("id,lower,upper,size\n0,0,3,100\n1,2,5\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 3: expected 4 fields id,lower,upper,size, found 3"
        );
        let e = read_csv("0,0,x,1").unwrap_err();
        assert!(e.to_string().contains("field upper"), "{e}");
        let e = read_csv("0,4,4,1").unwrap_err();
        assert!(e.to_string().contains("empty interval"), "{e}");
        let e = read_csv("0,0,1,-5").unwrap_err();
        assert!(e.to_string().contains("field size"), "{e}");
    }
}
