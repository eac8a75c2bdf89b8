//! Converted containers (docs/FORMAT.md) and the colibri C container layout.
//!
//! A converted container is a folder of safetensors files whose `__metadata__` records the
//! format version, every tensor's storage format (quantization, group size, scale type,
//! logical shape) and, for expert files, the byte extent of each routed expert. Nothing is
//! inferred from byte counts: a record that does not match its tensor is an error.
//!
//! The C layout (tensor `name` as U8 plus `name.qs` F32 scales) carries no such records; its
//! format follows from the byte counts and the shape the model's config asks for, which
//! [`QuantAttach::format_for`] decides when the family loads the matrix.

use super::{DType, QuantAttach, TensorRef};
use crate::error::{Error, Result};
use crate::format::{ScaleType, WeightFormat};
use crate::tensor::Blob;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// `__metadata__` keys of a converted container's files.
pub const KEY_VERSION: &str = "colibri.version";
pub const KEY_TENSORS: &str = "colibri.tensors";
pub const KEY_EXPERTS: &str = "colibri.experts";
/// The container format version this engine writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Alignment of every routed expert's extent in an expert file.
pub const EXPERT_ALIGN: usize = 4096;
/// Suffix of a quantized tensor's scales (shared with the C layout).
pub const SCALES_SUFFIX: &str = ".qs";
/// Prefix of the filler tensors that keep expert extents aligned.
pub const PAD_PREFIX: &str = "__pad.";

/// One tensor's storage record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorRecord {
    /// "f32", "bf16", "f16", "int8", "int4", "int4-rows8" (int4 with rows interleaved by 8,
    /// `crate::rows8`), "int5", "int2", "int3" (groups of 64), "int2-plain".
    pub format: String,
    /// Elements per scale; 0 = one scale per row. Absent for unscaled formats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_size: Option<u32>,
    /// "f32" or "f16". Absent for unscaled formats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_dtype: Option<String>,
    /// Logical shape (`[rows, cols]` for quantized matrices).
    pub shape: Vec<usize>,
}

impl TensorRecord {
    pub fn for_format(format: WeightFormat, shape: Vec<usize>) -> TensorRecord {
        let (f, g, s) = match format {
            WeightFormat::F32 => ("f32", None, None),
            WeightFormat::BF16 => ("bf16", None, None),
            WeightFormat::F16 => ("f16", None, None),
            WeightFormat::I8Row => ("int8", Some(0), Some(ScaleType::F32)),
            WeightFormat::I8 { group, scale } => ("int8", Some(group), Some(scale)),
            WeightFormat::I4 { group, scale } => ("int4", Some(group), Some(scale)),
            WeightFormat::I4Rows8 { group, scale } => ("int4-rows8", Some(group), Some(scale)),
            WeightFormat::I5 { group, scale } => ("int5", Some(group), Some(scale)),
            WeightFormat::I2 { group, scale } => ("int2", Some(group), Some(scale)),
            WeightFormat::I3G64 => ("int3", Some(64), Some(ScaleType::F32)),
            WeightFormat::I2Plain => ("int2-plain", Some(0), Some(ScaleType::F32)),
            WeightFormat::Mxfp4 => ("mxfp4", Some(32), Some(ScaleType::E8M0)),
            WeightFormat::I4Ct { group, scale } => ("int4-ct", Some(group), Some(scale)),
        };
        TensorRecord {
            format: f.into(),
            group_size: g,
            scale_dtype: s.map(|s| s.name().to_string()),
            shape,
        }
    }

    /// The storage format this record names, validated.
    pub fn weight_format(&self) -> std::result::Result<WeightFormat, String> {
        let scale = || -> std::result::Result<ScaleType, String> {
            match self.scale_dtype.as_deref() {
                Some("f32") => Ok(ScaleType::F32),
                Some("f16") => Ok(ScaleType::F16),
                Some(o) => Err(format!("unknown scale_dtype '{o}' (f32 or f16)")),
                None => Err(format!("format {} needs a scale_dtype", self.format)),
            }
        };
        let group = || -> std::result::Result<u32, String> {
            match self.group_size {
                Some(g) if g == 0 || (g % 32 == 0 && g <= 1 << 20) => Ok(g),
                Some(g) => Err(format!(
                    "group_size {g} is not 0 (per row) or a multiple of 32"
                )),
                None => Err(format!("format {} needs a group_size", self.format)),
            }
        };
        let f = match self.format.as_str() {
            "f32" => WeightFormat::F32,
            "bf16" => WeightFormat::BF16,
            "f16" => WeightFormat::F16,
            "int8" => match (group()?, scale()?) {
                (0, ScaleType::F32) => WeightFormat::I8Row,
                (0, _) => {
                    return Err("per-row int8 (group_size 0) has f32 scales".into());
                }
                (group, scale) => WeightFormat::I8 { group, scale },
            },
            "int4" => WeightFormat::I4 {
                group: group()?,
                scale: scale()?,
            },
            // compressed-tensors int4 kept as published (bf16 scales included).
            "int4-ct" => WeightFormat::I4Ct {
                group: group()?,
                scale: match self.scale_dtype.as_deref() {
                    Some("bf16") => ScaleType::BF16,
                    _ => scale()?,
                },
            },
            "int4-rows8" => {
                let (group, scale) = (group()?, scale()?);
                let fits =
                    matches!(self.shape[..], [r, c] if crate::format::rows8::fits(r, c, group));
                if !fits {
                    return Err(format!(
                        "int4-rows8 needs groups of 32 or 64, rows a multiple of 8 and \
                         columns of 64, but group_size is {group} and shape {:?}",
                        self.shape
                    ));
                }
                WeightFormat::I4Rows8 { group, scale }
            }
            "int5" => WeightFormat::I5 {
                group: group()?,
                scale: scale()?,
            },
            "int2" => WeightFormat::I2 {
                group: group()?,
                scale: scale()?,
            },
            "int3" => {
                if group()? != 64 || scale()? != ScaleType::F32 {
                    return Err(
                        "int3 is in groups of 64 with f32 scales (group_size 64, scale_dtype f32)"
                            .into(),
                    );
                }
                WeightFormat::I3G64
            }
            "int2-plain" => {
                if group()? != 0 || scale()? != ScaleType::F32 {
                    return Err(
                        "int2-plain is per row with f32 scales (group_size 0, scale_dtype f32)"
                            .into(),
                    );
                }
                WeightFormat::I2Plain
            }
            o => return Err(format!("unknown format '{o}'")),
        };
        if f.is_quantized() && self.shape.len() != 2 {
            return Err(format!(
                "quantized tensors are matrices, but shape is {:?}",
                self.shape
            ));
        }
        if !f.is_quantized() && (self.group_size.is_some() || self.scale_dtype.is_some()) {
            return Err(format!(
                "format {} takes no group_size or scale_dtype",
                self.format
            ));
        }
        Ok(f)
    }
}

/// Where one routed expert's tensors (gate, up, down and their scales) lie in its file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertExtent {
    /// Tensor-name prefix, e.g. `model.layers.3.mlp.experts.17`.
    pub name: String,
    /// Absolute byte offset in the file (a multiple of 4096).
    pub offset: u64,
    /// Bytes, padded to a multiple of 4096.
    pub length: u64,
}

/// The container records of one file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerMeta {
    pub version: u32,
    pub tensors: BTreeMap<String, TensorRecord>,
    pub experts: Vec<ExpertExtent>,
}

impl ContainerMeta {
    /// The `__metadata__` entries that describe this file.
    pub fn to_metadata(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert(KEY_VERSION.to_string(), self.version.to_string());
        m.insert(
            KEY_TENSORS.to_string(),
            serde_json::to_string(&self.tensors).expect("records serialize"),
        );
        if !self.experts.is_empty() {
            m.insert(
                KEY_EXPERTS.to_string(),
                serde_json::to_string(&self.experts).expect("extents serialize"),
            );
        }
        m
    }
}

fn corrupt(path: &Path, msg: impl Into<String>) -> Error {
    Error::CorruptFile {
        file: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Parses the container records of a file's `__metadata__` (a fuzz target). `Ok(None)` for
/// a file that is not part of a converted container.
pub fn parse_container_meta(
    meta: &BTreeMap<String, String>,
    path: &Path,
) -> Result<Option<ContainerMeta>> {
    let Some(v) = meta.get(KEY_VERSION) else {
        if meta.contains_key(KEY_TENSORS) || meta.contains_key(KEY_EXPERTS) {
            return Err(corrupt(
                path,
                format!("colibri records without '{KEY_VERSION}'"),
            ));
        }
        return Ok(None);
    };
    let version: u32 = v
        .parse()
        .map_err(|_| corrupt(path, format!("container version '{v}' is not a number")))?;
    if version != FORMAT_VERSION {
        return Err(corrupt(
            path,
            format!("container format version {version} is not supported (this engine reads version {FORMAT_VERSION}); convert again"),
        ));
    }
    let tensors: BTreeMap<String, TensorRecord> = match meta.get(KEY_TENSORS) {
        Some(s) => serde_json::from_str(s)
            .map_err(|e| corrupt(path, format!("bad '{KEY_TENSORS}': {e}")))?,
        None => {
            return Err(corrupt(
                path,
                format!("container file without '{KEY_TENSORS}'"),
            ))
        }
    };
    for (name, r) in &tensors {
        r.weight_format()
            .map_err(|m| corrupt(path, format!("record of tensor '{name}': {m}")))?;
    }
    let experts: Vec<ExpertExtent> = match meta.get(KEY_EXPERTS) {
        Some(s) => serde_json::from_str(s)
            .map_err(|e| corrupt(path, format!("bad '{KEY_EXPERTS}': {e}")))?,
        None => Vec::new(),
    };
    for e in &experts {
        if e.offset % EXPERT_ALIGN as u64 != 0
            || e.length % EXPERT_ALIGN as u64 != 0
            || e.length == 0
        {
            return Err(corrupt(
                path,
                format!(
                    "expert '{}' extent [{}, +{}) is not 4096-byte aligned",
                    e.name, e.offset, e.length
                ),
            ));
        }
        if e.offset.checked_add(e.length).is_none() {
            return Err(corrupt(
                path,
                format!("expert '{}' extent overflows", e.name),
            ));
        }
    }
    Ok(Some(ContainerMeta {
        version,
        tensors,
        experts,
    }))
}

impl QuantAttach {
    /// The format of `t` loaded as a `[rows, cols]` matrix. Row-major int4 that
    /// [`crate::rows8::for_shape`] interleaves is rearranged in its RAM copy the first time
    /// it is loaded (when [`repack`](Self::repack) allows) and is `int4-rows8` from then on:
    /// every product gives the same bits on both layouts.
    pub fn format_for(&self, t: &TensorRef, rows: usize, cols: usize) -> Result<WeightFormat> {
        if let Some(&(r, c, f)) = self.repacked.get() {
            return self.same_shape(t, (r, c), rows, cols).map(|_| f);
        }
        let f = self.decide(t, rows, cols)?;
        if !self.repack || crate::format::rows8::for_shape(f, rows, cols) == f {
            return Ok(f);
        }
        // One load rearranges the bytes; any other waits for it and reads the result.
        let &(r, c, f) = self
            .repacked
            .get_or_init(|| (rows, cols, self.repack_in_ram(t, f, rows, cols)));
        self.same_shape(t, (r, c), rows, cols).map(|_| f)
    }

    fn same_shape(
        &self,
        t: &TensorRef,
        was: (usize, usize),
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        if was == (rows, cols) {
            return Ok(());
        }
        Err(t.bad(format!(
            "loaded as [{}, {}] before (and rearranged in RAM), now asked for as [{rows}, {cols}]",
            was.0, was.1
        )))
    }

    /// The format as stored, from the record or the C layout's counts.
    fn decide(&self, t: &TensorRef, rows: usize, cols: usize) -> Result<WeightFormat> {
        if let Some(f) = self.format {
            if self.shape != [rows, cols] {
                return Err(t.bad(format!(
                    "shape {:?} does not match the configuration, which needs [{rows}, {cols}]",
                    self.shape
                )));
            }
            return Ok(f);
        }
        c_layout_format(t.end - t.start, self.scale_count, rows, cols).map_err(|m| t.bad(m))
    }

    /// Interleaves `t`'s codes and scales where they lie in RAM; `format` unchanged when
    /// they are not both in a RAM copy or their sizes are not the shape's (then
    /// `Matrix::quantized` names the error).
    fn repack_in_ram(
        &self,
        t: &TensorRef,
        format: WeightFormat,
        rows: usize,
        cols: usize,
    ) -> WeightFormat {
        let Some(Blob::Mapped {
            file: sf,
            start: s0,
            end: s1,
        }) = &self.scales
        else {
            return format;
        };
        let sizes_fit = t.end - t.start == rows * format.row_bytes(cols)
            && s1 - s0 == rows * format.scale_row_bytes(cols);
        let disjoint = !std::sync::Arc::ptr_eq(&t.file, sf) || *s0 >= t.end || *s1 <= t.start;
        if !(t.file.in_ram() && sf.in_ram() && sizes_fit && disjoint) {
            return format;
        }
        let (Some(cp), Some(sp)) = (t.file.ram_ptr(t.start, t.end), sf.ram_ptr(*s0, *s1)) else {
            return format;
        };
        // SAFETY: both ranges lie in live RAM copies (`ram_ptr` checked them) and are disjoint
        // tensors (checked; headers refuse overlaps), and only this tensor's `QuantAttach`
        // hands them out as matrices, which happens after this returns: no other reference
        // to them exists while they are rewritten.
        let (codes, scales) = unsafe {
            (
                std::slice::from_raw_parts_mut(cp, t.end - t.start),
                std::slice::from_raw_parts_mut(sp, s1 - s0),
            )
        };
        let r8 = crate::format::rows8::interleave_in_place(format, rows, cols, codes, scales);
        t.file.mark_repacked(t.start);
        r8
    }
}

/// Group sizes the C engine tries for grouped int4, finest first (its `detect_group_size`):
/// a C container that loads there is read the same way here.
const C_GROUP_CANDIDATES: [usize; 8] = [16, 32, 48, 64, 96, 128, 192, 256];

/// The C layout's format for a `[rows, cols]` matrix from its byte and f32 scale counts, as
/// the C engine decides it (`qt_resolve_fmt`): int8 rows (`rows·cols` bytes, `rows` scales),
/// int4 rows (`rows·⌈cols/2⌉`, `rows`), int4 grouped (`rows·⌈cols/2⌉`, `rows·⌈cols/gs⌉`),
/// int2 rows (`rows·⌈cols/4⌉`, `rows`), int3 in groups of 64 (`rows·⌈cols/64⌉·24`,
/// `rows·⌈cols/64⌉`). Where two layouts have the same byte count (tiny shapes) the earlier
/// one wins, as in the C engine. The E8/IQ3 lattice and the FP8 passthrough are refused by
/// name.
pub fn c_layout_format(
    bytes: usize,
    scales: usize,
    rows: usize,
    cols: usize,
) -> std::result::Result<WeightFormat, String> {
    if rows == 0 || cols == 0 {
        return Err("empty matrix".into());
    }
    let numel = rows.checked_mul(cols).ok_or("shape overflows")?;
    let per = |bytes_per_row: usize| rows.checked_mul(bytes_per_row);
    let (i8b, i4b, i2b) = (Some(numel), per(cols.div_ceil(2)), per(cols.div_ceil(4)));
    let i3b = cols.div_ceil(64).checked_mul(24).and_then(per);
    let e8b = cols.div_ceil(256).checked_mul(98).and_then(per);
    // E8/IQ3 keeps its scales inside its blocks; its `.qs` is a single tag value.
    if scales == 1 && e8b == Some(bytes) {
        return Err(format!(
            "E8/IQ3 lattice format (the C engine's fmt=6: {bytes} bytes, 98 per 256 weights of \
             rotated rows) is not supported; convert this tensor to int4 or int3 (the C \
             converter's --xbits 4 or 3) or with coli convert"
        ));
    }
    let fp8_scales = rows.div_ceil(128).checked_mul(cols.div_ceil(128));
    if bytes == numel && scales != rows && fp8_scales == Some(scales) {
        return Err(format!(
            "FP8 e4m3 passthrough (the C engine's fmt=8: one byte per weight, {scales} \
             128×128 block scales) is not supported in the C layout; convert the FP8 \
             checkpoint with coli convert instead"
        ));
    }
    let need = |fmt: &str, want: usize| -> std::result::Result<(), String> {
        if scales == want {
            Ok(())
        } else {
            Err(format!(
                "{fmt} layout of [{rows}, {cols}] needs {want} scales, found {scales}"
            ))
        }
    };
    if i8b == Some(bytes) {
        need("int8 per-row", rows)?;
        return Ok(WeightFormat::I8Row);
    }
    if i4b == Some(bytes) {
        if scales == rows {
            return Ok(WeightFormat::I4 {
                group: 0,
                scale: ScaleType::F32,
            });
        }
        return c_int4_group(scales, rows, cols).map(|g| WeightFormat::I4 {
            group: g as u32,
            scale: ScaleType::F32,
        });
    }
    if i2b == Some(bytes) {
        need("int2 per-row", rows)?;
        return Ok(WeightFormat::I2Plain);
    }
    if i3b == Some(bytes) {
        need("int3-g64", rows * cols.div_ceil(64))?;
        return Ok(WeightFormat::I3G64);
    }
    let show = |b: Option<usize>| b.map_or("-".to_string(), |b| b.to_string());
    Err(format!(
        "{bytes} bytes match no layout for [{rows}, {cols}] (int8 needs {numel}, int4 {}, \
         int2 {}, int3-g64 {})",
        show(i4b),
        show(i2b),
        show(i3b)
    ))
}

/// The group size of a grouped int4 tensor with `scales` scales: the C engine's choice when
/// one of its candidates fits, else the only size that gives `scales / rows` groups per row
/// (any group size a converter may have used); several possible sizes are refused.
fn c_int4_group(scales: usize, rows: usize, cols: usize) -> std::result::Result<usize, String> {
    if !scales.is_multiple_of(rows) || scales / rows < 2 {
        return Err(format!(
            "{scales} int4 scales is not a whole number of groups per row ({rows} rows)"
        ));
    }
    let n = scales / rows;
    if let Some(g) = C_GROUP_CANDIDATES
        .iter()
        .copied()
        .find(|&g| g <= cols && cols.div_ceil(g) == n)
    {
        return Ok(g);
    }
    // ⌈cols/g⌉ = n  ⇔  ⌈cols/n⌉ ≤ g ≤ (cols − 1)/(n − 1).
    let (lo, hi) = (cols.div_ceil(n), (cols - 1) / (n - 1));
    match lo.cmp(&hi) {
        std::cmp::Ordering::Equal => Ok(lo),
        std::cmp::Ordering::Less => Err(format!(
            "{n} int4 scales per row of {cols} elements fit every group size from {lo} to {hi}; \
             the layout is ambiguous"
        )),
        std::cmp::Ordering::Greater => Err(format!(
            "{n} int4 scales per row of {cols} elements match no group size"
        )),
    }
}

/// Name of the merged expert tensor of the C OLMoE layout: `…experts.E.merged_weight`
/// holds the gate, up and down rows (int8) back to back, `…experts.E.qs` their row scales.
pub const MERGED_WEIGHT: &str = "merged_weight";

/// Splits one merged expert (`{prefix}.merged_weight`, with its scales attached) into its
/// gate `[inter, hidden]`, up `[inter, hidden]` and down `[hidden, inter]` matrices. The
/// weights stay in the memory map (one contiguous range: a streamed expert is one read);
/// the scales (0.4% of the bytes) are copied into RAM so they need no read of their own.
pub fn split_merged_expert(
    t: &TensorRef,
    hidden: usize,
    inter: usize,
) -> Result<[crate::tensor::Matrix; 3]> {
    use crate::tensor::Matrix;
    let mat = inter
        .checked_mul(hidden)
        .ok_or_else(|| t.bad("expert shape overflows"))?;
    let bytes = t.end - t.start;
    let (format, elem) = match (t.dtype, &t.quant) {
        (DType::U8 | DType::I8, Some(q)) => {
            let want_s = 2 * inter + hidden;
            if bytes == 3 * mat && q.scale_count == want_s {
                (WeightFormat::I8Row, 1)
            } else if bytes == 3 * mat && q.scale_count != want_s {
                return Err(t.bad(format!(
                    "merged int8 expert needs {want_s} row scales (gate {inter}, up {inter}, \
                     down {hidden}), found {}",
                    q.scale_count
                )));
            } else if 2 * bytes == 3 * mat {
                return Err(t.bad(
                    "merged experts packed as int4 (the C qwen36 layout) are not supported; \
                     only the int8 merged layout of the C OLMoE converter is",
                ));
            } else {
                return Err(t.bad(format!(
                    "{bytes} bytes are not a merged int8 expert of [{inter}, {hidden}] \
                     (3 × {mat} bytes)"
                )));
            }
        }
        (DType::BF16, None) => (WeightFormat::BF16, 2),
        (DType::F16, None) => (WeightFormat::F16, 2),
        (dt, _) => {
            return Err(t.bad(format!(
                "a merged expert is int8 with '.qs' scales, bf16 or f16, not {}",
                dt.name()
            )))
        }
    };
    if bytes != 3 * mat * elem {
        return Err(t.bad(format!(
            "{bytes} bytes are not a merged {} expert of [{inter}, {hidden}]",
            format.name()
        )));
    }
    let scales = t
        .quant
        .as_ref()
        .and_then(|q| q.scales.as_ref())
        .map(|s| s.bytes().to_vec());
    let part = |k: usize, rows: usize, cols: usize, s0: usize| -> Result<Matrix> {
        let data = Blob::Mapped {
            file: t.file.clone(),
            start: t.start + k * mat * elem,
            end: t.start + (k + 1) * mat * elem,
        };
        let sc = scales
            .as_ref()
            .map(|s| Blob::Owned(std::sync::Arc::new(s[4 * s0..4 * (s0 + rows)].to_vec())));
        let mut m = Matrix::quantized(rows, cols, format, data, sc).map_err(|m| t.bad(m))?;
        m.int8_act =
            crate::kernels::int8_act_for(format) && crate::kernels::q8_supported(format, cols);
        Ok(m)
    };
    Ok([
        part(0, inter, hidden, 0)?,
        part(1, inter, hidden, inter)?,
        part(2, hidden, inter, 2 * inter)?,
    ])
}

/// Whether a tensor name belongs to a routed expert (`...experts.<index>....`).
pub fn is_routed_expert(name: &str) -> Option<&str> {
    let i = name.find(".experts.")?;
    let rest = &name[i + ".experts.".len()..];
    let digits = rest.bytes().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || rest.as_bytes().get(digits) != Some(&b'.') {
        return None;
    }
    Some(&name[..i + ".experts.".len() + digits])
}

/// Applies one converted-container file's records to its tensors: checks every record
/// against the header, attaches formats and scales, removes filler tensors, returns the
/// expert extents.
pub(super) fn apply_container_meta(
    meta: &ContainerMeta,
    path: &Path,
    file_tensors: &mut HashMap<String, TensorRef>,
    may_repack: &dyn Fn(&TensorRef, bool) -> bool,
) -> Result<Vec<ExpertExtent>> {
    let bad = |t: &str, msg: String| Error::BadTensor {
        file: path.to_path_buf(),
        tensor: t.to_string(),
        msg,
    };
    file_tensors.retain(|n, _| !n.starts_with(PAD_PREFIX));
    for name in file_tensors.keys() {
        if !meta.tensors.contains_key(name) && !is_scales_of_record(name, meta) {
            return Err(bad(
                name,
                "tensor has no record in the container metadata".into(),
            ));
        }
    }
    for (name, rec) in &meta.tensors {
        let format = rec.weight_format().map_err(|m| bad(name, m))?;
        let t = file_tensors
            .get(name)
            .cloned()
            .ok_or_else(|| bad(name, "recorded in the metadata but not in the file".into()))?;
        if !format.is_quantized() {
            let dt = match format {
                WeightFormat::F32 => DType::F32,
                WeightFormat::BF16 => DType::BF16,
                _ => DType::F16,
            };
            if t.dtype != dt || t.shape != rec.shape {
                return Err(bad(
                    name,
                    format!(
                        "record says {} {:?}, file holds {} {:?}",
                        rec.format,
                        rec.shape,
                        t.dtype.name(),
                        t.shape
                    ),
                ));
            }
            continue;
        }
        let (rows, cols) = (rec.shape[0], rec.shape[1]);
        let rb = format.row_bytes(cols);
        if t.dtype != DType::U8 || t.shape != [rows, rb] {
            return Err(bad(
                name,
                format!(
                    "{} [{rows}, {cols}] is stored as U8 [{rows}, {rb}], file holds {} {:?}",
                    format.name(),
                    t.dtype.name(),
                    t.shape
                ),
            ));
        }
        let sname = format!("{name}{SCALES_SUFFIX}");
        let s = file_tensors
            .get(&sname)
            .ok_or_else(|| bad(name, format!("scales tensor '{sname}' is missing")))?;
        let st = format.scale_type().expect("quantized formats have scales");
        let want_dt = if st == ScaleType::F32 {
            DType::F32
        } else {
            DType::F16
        };
        let want_n = rows * format.groups_per_row(cols);
        if s.dtype != want_dt || s.numel() != want_n {
            return Err(bad(
                &sname,
                format!(
                    "needs {want_n} {} scales, file holds {} {:?}",
                    st.name(),
                    s.dtype.name(),
                    s.shape
                ),
            ));
        }
        let scales = Blob::Mapped {
            file: s.file.clone(),
            start: s.start,
            end: s.end,
        };
        let entry = file_tensors.get_mut(name).expect("checked above");
        let routed_expert = is_routed_expert(name).is_some();
        let repack = may_repack(entry, routed_expert);
        entry.quant = Some(std::sync::Arc::new(QuantAttach {
            format: Some(format),
            shape: rec.shape.clone(),
            scales: Some(scales),
            scale_count: want_n,
            routed_expert,
            repack,
            repacked: Default::default(),
        }));
    }
    // Each extent must be inside the file and hold every tensor of its expert.
    let file_len = file_tensors
        .values()
        .next()
        .map_or(0, |t| t.file.bytes().len() as u64);
    let mut by_name: HashMap<&str, &ExpertExtent> = HashMap::new();
    for e in &meta.experts {
        if e.offset + e.length > file_len.div_ceil(EXPERT_ALIGN as u64) * EXPERT_ALIGN as u64 {
            return Err(corrupt(
                path,
                format!("expert '{}' extent runs past the end of the file", e.name),
            ));
        }
        if by_name.insert(e.name.as_str(), e).is_some() {
            return Err(corrupt(
                path,
                format!("expert '{}' has two extents", e.name),
            ));
        }
    }
    for t in file_tensors.values() {
        if let Some(prefix) = is_routed_expert(&t.name) {
            match by_name.get(prefix) {
                Some(e) if t.start as u64 >= e.offset && t.end as u64 <= e.offset + e.length => {}
                Some(e) => {
                    return Err(bad(
                        &t.name,
                        format!(
                            "lies outside its expert's extent [{}, +{})",
                            e.offset, e.length
                        ),
                    ))
                }
                None if meta.experts.is_empty() => {}
                None => return Err(bad(&t.name, format!("expert '{prefix}' has no extent"))),
            }
        }
    }
    Ok(meta.experts.clone())
}

/// Whether `name` is half of an MXFP4 pair as gpt-oss publishes them (`X_blocks` and
/// `X_scales`, both U8): read by the family as they are (`arch::gpt_oss`), not the C layout.
fn is_mxfp4_pair(name: &str, tensors: &HashMap<String, TensorRef>) -> bool {
    let other = if let Some(stem) = name.strip_suffix("_blocks") {
        format!("{stem}_scales")
    } else if let Some(stem) = name.strip_suffix("_scales") {
        format!("{stem}_blocks")
    } else {
        return false;
    };
    tensors.get(&other).is_some_and(|t| t.dtype == DType::U8)
        && tensors.get(name).is_some_and(|t| t.dtype == DType::U8)
}

fn is_scales_of_record(name: &str, meta: &ContainerMeta) -> bool {
    name.strip_suffix(SCALES_SUFFIX)
        .and_then(|w| meta.tensors.get(w))
        .and_then(|r| r.weight_format().ok())
        .is_some_and(|f| f.is_quantized())
}

/// Attaches the C layout to a plain checkpoint's tensors: each U8 (or I8) tensor with an
/// F32 `name.qs` becomes quantized (its format decided at load time from the config's
/// shape); a merged expert `…experts.E.merged_weight` takes `…experts.E.qs`. A U8/I8 tensor
/// without scales, or scales of another dtype, is an error. Returns how many were attached.
/// `may_repack(tensor, routed expert)`: see [`QuantAttach::repack`].
pub(super) fn attach_c_layout(
    tensors: &mut HashMap<String, TensorRef>,
    may_repack: &dyn Fn(&TensorRef, bool) -> bool,
) -> Result<usize> {
    let names: Vec<String> = tensors
        .iter()
        .filter(|(n, t)| matches!(t.dtype, DType::U8 | DType::I8) && !is_mxfp4_pair(n, tensors))
        .map(|(n, _)| n.clone())
        .collect();
    for name in &names {
        let sname = match name.strip_suffix(&format!(".{MERGED_WEIGHT}")) {
            Some(prefix) => format!("{prefix}{SCALES_SUFFIX}"),
            None => format!("{name}{SCALES_SUFFIX}"),
        };
        let t = &tensors[name];
        let Some(s) = tensors.get(&sname) else {
            return Err(t.bad(format!(
                "{} tensor without its scales '{sname}' (colibri C layout)",
                t.dtype.name()
            )));
        };
        if s.dtype != DType::F32 {
            return Err(s.bad(format!(
                "C-layout scales must be F32, found {}",
                s.dtype.name()
            )));
        }
        let routed_expert = is_routed_expert(name).is_some();
        let attach = QuantAttach {
            format: None,
            shape: Vec::new(),
            scales: Some(Blob::Mapped {
                file: s.file.clone(),
                start: s.start,
                end: s.end,
            }),
            scale_count: s.numel(),
            routed_expert,
            repack: may_repack(t, routed_expert),
            repacked: Default::default(),
        };
        tensors.get_mut(name).expect("listed above").quant = Some(std::sync::Arc::new(attach));
    }
    Ok(names.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names_are_recognised() {
        assert_eq!(
            is_routed_expert("model.layers.3.mlp.experts.17.gate_proj.weight"),
            Some("model.layers.3.mlp.experts.17")
        );
        assert_eq!(
            is_routed_expert("model.layers.0.block_sparse_moe.experts.2.w1.weight"),
            Some("model.layers.0.block_sparse_moe.experts.2")
        );
        assert_eq!(
            is_routed_expert("model.layers.3.mlp.shared_experts.gate_proj.weight"),
            None
        );
        assert_eq!(
            is_routed_expert("model.layers.3.mlp.experts.gate_up_proj"),
            None
        );
    }

    #[test]
    fn c_layout_is_decided_by_counts_or_refused() {
        let i4 = |group| WeightFormat::I4 {
            group,
            scale: ScaleType::F32,
        };
        assert_eq!(
            c_layout_format(64 * 128, 64, 64, 128),
            Ok(WeightFormat::I8Row)
        );
        assert_eq!(c_layout_format(64 * 64, 64, 64, 128), Ok(i4(0)));
        // The C engine's finest fitting candidate: 2 groups of 128 columns is gs 64.
        assert_eq!(c_layout_format(64 * 64, 128, 64, 128), Ok(i4(64)));
        assert_eq!(c_layout_format(4 * 50, 8, 4, 100), Ok(i4(64)));
        // Not a C candidate but the only size giving 62 groups of a 6144-column row.
        assert_eq!(c_layout_format(2 * 3072, 124, 2, 6144), Ok(i4(100)));
        let e = c_layout_format(2 * 500, 6, 2, 1000).unwrap_err();
        assert!(e.contains("ambiguous"), "{e}");
        assert_eq!(
            c_layout_format(64 * 32, 64, 64, 128),
            Ok(WeightFormat::I2Plain)
        );
        assert_eq!(
            c_layout_format(64 * 3 * 24, 64 * 3, 64, 150),
            Ok(WeightFormat::I3G64)
        );
        assert!(c_layout_format(64 * 3 * 24, 64, 64, 150).is_err());
        let e = c_layout_format(4 * 98 * 2, 1, 4, 512).unwrap_err();
        assert!(e.contains("E8/IQ3"), "{e}");
        let e = c_layout_format(256 * 256, 4, 256, 256).unwrap_err();
        assert!(e.contains("FP8"), "{e}");
        assert!(c_layout_format(64 * 64, 65, 64, 128).is_err());
        assert!(c_layout_format(100, 64, 64, 128).is_err());
        assert!(c_layout_format(64 * 128, 63, 64, 128).is_err());
        assert!(c_layout_format(usize::MAX, 7, usize::MAX / 2, 3).is_err());
        assert!(c_layout_format(10, 5, 5, 1 << 62).is_err());
    }

    #[test]
    fn metadata_round_trips_and_rejects_nonsense() {
        let mut m = ContainerMeta {
            version: FORMAT_VERSION,
            ..Default::default()
        };
        m.tensors.insert(
            "a".into(),
            TensorRecord::for_format(
                WeightFormat::I4 {
                    group: 64,
                    scale: ScaleType::F16,
                },
                vec![4, 128],
            ),
        );
        m.experts.push(ExpertExtent {
            name: "x.experts.0".into(),
            offset: 4096,
            length: 8192,
        });
        let p = Path::new("f");
        assert_eq!(
            parse_container_meta(&m.to_metadata(), p).unwrap(),
            Some(m.clone())
        );
        let mut bad = m.to_metadata();
        bad.insert(KEY_VERSION.into(), "2".into());
        assert!(parse_container_meta(&bad, p).is_err());
        let mut bad = m.to_metadata();
        bad.insert(
            KEY_TENSORS.into(),
            r#"{"a":{"format":"int4","group_size":48,"scale_dtype":"f16","shape":[4,128]}}"#.into(),
        );
        assert!(parse_container_meta(&bad, p).is_err());
        let mut bad = m.to_metadata();
        bad.insert(
            KEY_EXPERTS.into(),
            r#"[{"name":"e","offset":100,"length":4096}]"#.into(),
        );
        assert!(parse_container_meta(&bad, p).is_err());
        assert_eq!(parse_container_meta(&BTreeMap::new(), p).unwrap(), None);
    }

    #[test]
    fn every_written_format_reads_back_from_its_record() {
        let mut formats = vec![
            WeightFormat::F32,
            WeightFormat::BF16,
            WeightFormat::F16,
            WeightFormat::I8Row,
            WeightFormat::I3G64,
            WeightFormat::I2Plain,
            WeightFormat::I4Rows8 {
                group: 32,
                scale: ScaleType::F16,
            },
        ];
        for (group, scale) in [(32, ScaleType::F16), (64, ScaleType::F16)] {
            formats.push(WeightFormat::I8 { group, scale });
        }
        for (group, scale) in [
            (32, ScaleType::F16),
            (64, ScaleType::F16),
            (0, ScaleType::F32),
        ] {
            formats.push(WeightFormat::I4 { group, scale });
            formats.push(WeightFormat::I5 { group, scale });
            formats.push(WeightFormat::I2 { group, scale });
        }
        for f in formats {
            let r = TensorRecord::for_format(f, vec![64, 128]);
            assert_eq!(r.weight_format(), Ok(f), "{}", f.name());
        }
        // A group that is no multiple of 32 is refused for int5 as for the others.
        let mut r = TensorRecord::for_format(
            WeightFormat::I5 {
                group: 32,
                scale: ScaleType::F16,
            },
            vec![64, 128],
        );
        r.group_size = Some(48);
        assert!(r.weight_format().is_err());
    }
}
