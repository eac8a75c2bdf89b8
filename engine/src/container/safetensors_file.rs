//! The safetensors header and the shard index, parsed from untrusted bytes.
//!
//! Layout: `u64 little-endian header length N`, `N bytes of JSON`, then the data section.
//! The JSON maps tensor names to `{dtype, shape, data_offsets:[start,end]}` relative to the
//! data section, plus an optional `__metadata__` string map. We check everything a hostile
//! file could get wrong before any byte of tensor data is touched.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// Headers above this size are refused (the reference implementation uses the same bound).
pub const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    F8E4M3,
    F8E5M2,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl DType {
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s {
            "F64" => DType::F64,
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "F8_E4M3" => DType::F8E4M3,
            "F8_E5M2" => DType::F8E5M2,
            "I64" => DType::I64,
            "I32" => DType::I32,
            "I16" => DType::I16,
            "I8" => DType::I8,
            "U8" => DType::U8,
            "BOOL" => DType::Bool,
            _ => return None,
        })
    }
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "F64",
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::I16 => "I16",
            DType::I8 => "I8",
            DType::U8 => "U8",
            DType::Bool => "BOOL",
        }
    }
}

#[derive(Clone, Debug)]
pub struct HeaderEntry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Byte range relative to the data section.
    pub start: usize,
    pub end: usize,
}

#[derive(Clone, Debug, Default)]
pub struct ParsedHeader {
    /// Absolute offset of the data section (8 + header length).
    pub data_start: usize,
    pub tensors: Vec<HeaderEntry>,
    pub metadata: BTreeMap<String, String>,
}

fn corrupt(path: &Path, msg: impl Into<String>) -> Error {
    Error::CorruptFile {
        file: path.to_path_buf(),
        msg: msg.into(),
    }
}

fn bad_tensor(path: &Path, name: &str, msg: impl Into<String>) -> Error {
    Error::BadTensor {
        file: path.to_path_buf(),
        tensor: name.to_string(),
        msg: msg.into(),
    }
}

/// Parses and validates the header of a whole safetensors file held in `file`.
///
/// Checked: header length within the file and below [`MAX_HEADER_BYTES`], valid UTF-8 JSON
/// object, known dtypes, shape element count without overflow, `end - start` equal to
/// `elements × dtype size`, every range inside the data section, no two tensors overlapping,
/// and the data section fully covered (trailing garbage is tolerated by nobody).
pub fn parse_safetensors_header(file: &[u8], path: &Path) -> Result<ParsedHeader> {
    if file.len() < 8 {
        return Err(corrupt(
            path,
            format!("{} bytes is too short for a safetensors file", file.len()),
        ));
    }
    let n = u64::from_le_bytes(file[..8].try_into().expect("8 bytes"));
    if n > MAX_HEADER_BYTES {
        return Err(corrupt(
            path,
            format!("header length {n} exceeds the {MAX_HEADER_BYTES} byte limit"),
        ));
    }
    let avail = (file.len() - 8) as u64;
    if n > avail {
        return Err(corrupt(
            path,
            format!(
                "header length {n} runs past the end of the file ({avail} bytes after the length)"
            ),
        ));
    }
    let n = n as usize;
    let header = std::str::from_utf8(&file[8..8 + n])
        .map_err(|_| corrupt(path, "header is not valid UTF-8"))?;
    let json: serde_json::Value = serde_json::from_str(header.trim_end_matches(' '))
        .map_err(|e| corrupt(path, format!("header is not valid JSON: {e}")))?;
    let obj = json
        .as_object()
        .ok_or_else(|| corrupt(path, "header is not a JSON object"))?;
    let data_start = 8 + n;
    let data_len = file.len() - data_start;

    let mut out = ParsedHeader {
        data_start,
        ..Default::default()
    };
    for (name, v) in obj {
        if name == "__metadata__" {
            let m = v
                .as_object()
                .ok_or_else(|| corrupt(path, "__metadata__ is not an object"))?;
            for (k, val) in m {
                let s = val.as_str().ok_or_else(|| {
                    corrupt(
                        path,
                        format!("__metadata__ value for '{k}' is not a string"),
                    )
                })?;
                out.metadata.insert(k.clone(), s.to_string());
            }
            continue;
        }
        let t = v
            .as_object()
            .ok_or_else(|| bad_tensor(path, name, "entry is not an object"))?;
        let dtype_s = t
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad_tensor(path, name, "missing dtype"))?;
        let dtype = DType::parse(dtype_s)
            .ok_or_else(|| bad_tensor(path, name, format!("unknown dtype '{dtype_s}'")))?;
        let shape_v = t
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad_tensor(path, name, "missing shape"))?;
        let mut shape = Vec::with_capacity(shape_v.len());
        for d in shape_v {
            let d = d
                .as_u64()
                .and_then(|d| usize::try_from(d).ok())
                .ok_or_else(|| {
                    bad_tensor(path, name, "shape entries must be non-negative integers")
                })?;
            shape.push(d);
        }
        let offs = t
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .filter(|a| a.len() == 2)
            .ok_or_else(|| bad_tensor(path, name, "data_offsets must be [start, end]"))?;
        let get = |i: usize| {
            offs[i]
                .as_u64()
                .and_then(|d| usize::try_from(d).ok())
                .ok_or_else(|| bad_tensor(path, name, "data_offsets must be non-negative integers"))
        };
        let (start, end) = (get(0)?, get(1)?);
        let numel = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad_tensor(path, name, format!("shape {shape:?} overflows")))?;
        let nbytes = numel
            .checked_mul(dtype.size())
            .ok_or_else(|| bad_tensor(path, name, format!("shape {shape:?} overflows")))?;
        if end < start {
            return Err(bad_tensor(
                path,
                name,
                format!("data_offsets [{start}, {end}] are reversed"),
            ));
        }
        if end > data_len {
            return Err(bad_tensor(
                path,
                name,
                format!(
                    "data_offsets [{start}, {end}] run past the data section ({data_len} bytes)"
                ),
            ));
        }
        if end - start != nbytes {
            return Err(bad_tensor(
                path,
                name,
                format!(
                    "holds {} bytes but shape {shape:?} of {} needs {nbytes}",
                    end - start,
                    dtype.name()
                ),
            ));
        }
        out.tensors.push(HeaderEntry {
            name: name.clone(),
            dtype,
            shape,
            start,
            end,
        });
    }
    // No overlaps: sorted by start, each must begin at or after the previous end.
    let mut order: Vec<&HeaderEntry> = out.tensors.iter().filter(|e| e.end > e.start).collect();
    order.sort_by_key(|e| e.start);
    for w in order.windows(2) {
        if w[1].start < w[0].end {
            return Err(bad_tensor(
                path,
                &w[1].name,
                format!("data overlaps tensor '{}'", w[0].name),
            ));
        }
    }
    Ok(out)
}

/// Parses `model.safetensors.index.json`: the `weight_map` from tensor name to shard file.
/// Shard names must be plain file names (no path separators, no `..`), so a hostile index
/// cannot point the loader outside the model folder.
pub fn parse_index(bytes: &[u8], path: &Path) -> Result<BTreeMap<String, String>> {
    let json: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| corrupt(path, format!("invalid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| corrupt(path, "no 'weight_map' object"))?;
    let mut out = BTreeMap::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            corrupt(
                path,
                format!("weight_map entry for '{tensor}' is not a string"),
            )
        })?;
        if file.is_empty()
            || file.contains('/')
            || file.contains('\\')
            || file == ".."
            || file == "."
            || !file.ends_with(".safetensors")
        {
            return Err(corrupt(
                path,
                format!("weight_map places '{tensor}' in '{file}', which is not a .safetensors file name in this folder"),
            ));
        }
        out.insert(tensor.clone(), file.to_string());
    }
    if out.is_empty() {
        return Err(corrupt(path, "weight_map is empty"));
    }
    Ok(out)
}
