//! `coli convert`: a Hugging Face checkpoint (bf16, f16, f32, or FP8 e4m3 with 128×128
//! `weight_scale_inv` block scales) → a colibri container (docs/FORMAT.md).
//!
//! The output is planned completely before anything is written: which tensor goes to which
//! part (one file per MoE layer's routed experts, dense tensors in `dense-*.safetensors`),
//! in which format, at which offset. Parts are written through temp files and recorded in a
//! manifest once complete, so an interrupted run resumes with the first unfinished part and
//! produces the same bytes as an uninterrupted one. A lock file keeps two converters out of
//! one folder; free disk space is checked against the planned size before starting.

pub mod writer;

use crate::container::{is_routed_expert, Checkpoint, DType, TensorRef};
use crate::error::{Error, Result};
use crate::tensor::{ScaleType, WeightFormat};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
pub use writer::{fnv64, layout, write_atomic, write_part, Item, Layout, Source};

/// Manifest of finished parts (kept in the output; deterministic, no timestamps).
pub const MANIFEST: &str = ".colibri-convert.json";
pub const LOCK: &str = ".colibri-convert.lock";
/// Dense parts are cut at this size so an interruption loses little work.
const DENSE_PART_BYTES: usize = 2 << 30;
/// FP8 checkpoints scale 128×128 blocks.
const FP8_BLOCK: usize = 128;

#[derive(Clone, Debug)]
pub struct ConvertOptions {
    pub input: PathBuf,
    pub output: PathBuf,
    /// Routed experts' format.
    pub experts: WeightFormat,
    /// Other matrices' format (attention, shared experts, embeddings, lm_head). Routers and
    /// vectors keep their dtype.
    pub dense: WeightFormat,
    /// The attention projections' format when it differs from `dense` (`self_attn.*`
    /// matrices but the sparse-attention indexer, which stays exact).
    pub attention: Option<WeightFormat>,
    /// The output head's format when it differs from `dense` (`lm_head.weight`, the MTP
    /// layers' `shared_head.head.weight`, and the embedding table when the model ties it to
    /// the head). Decode reads the whole head for every token: on OLMoE-1B-7B it is 16% of
    /// a lean container's bytes (docs/PERFORMANCE.md).
    pub lm_head: Option<WeightFormat>,
    /// int4 matrices with groups of 32 or 64 written with their rows interleaved by 8
    /// ([`WeightFormat::I4Rows8`], `crate::rows8`) where the shape allows: what the 8-row
    /// kernels read without transposing. `false` writes every row on its own.
    pub interleave: bool,
}

/// Parses a format name of the command line: `int8`, `int4`, `int3`, `int2`, `bf16` (`f16`,
/// `f32`) with the group size for int4/int2 (0 = one scale per row; int3 is always in groups
/// of 64). A name may carry its own group size, which then wins: `int8-g32`, `int4-g64`,
/// `int4-row`, `int3-g64`; `int8` alone is per row (f32 scales), `int8-gN` grouped with f16
/// scales.
pub fn parse_format(name: &str, group: u32) -> Result<WeightFormat> {
    if let Some((base, g)) = name.split_once('-') {
        let group = match g {
            "row" => 0,
            _ => g
                .strip_prefix('g')
                .and_then(|v| v.parse::<u32>().ok())
                .filter(|v| *v > 0)
                .ok_or_else(|| {
                    Error::invalid(
                        "format",
                        format!("'{name}': the group is written -gN (e.g. int8-g32) or -row"),
                    )
                })?,
        };
        if base == "int8" && group != 0 {
            if !group.is_multiple_of(32) {
                return Err(Error::invalid(
                    "group-size",
                    format!("{group} is not a multiple of 32"),
                ));
            }
            return Ok(WeightFormat::I8 {
                group,
                scale: ScaleType::F16,
            });
        }
        if base == "int3" && group == 64 {
            return Ok(WeightFormat::I3G64);
        }
        if !matches!(base, "int8" | "int5" | "int4" | "int2") {
            return Err(Error::invalid(
                "format",
                format!("'{name}': only int8, int5, int4 and int2 take a group (int3 is -g64)"),
            ));
        }
        return parse_format(base, group);
    }
    if group != 0 && !group.is_multiple_of(32) {
        return Err(Error::invalid(
            "group-size",
            format!("{group} is not 0 (per row) or a multiple of 32"),
        ));
    }
    // Per-row scales are f32, grouped ones f16.
    let scale = if group == 0 {
        ScaleType::F32
    } else {
        ScaleType::F16
    };
    Ok(match name {
        "int8" => WeightFormat::I8Row,
        "int4" => WeightFormat::I4 { group, scale },
        "int5" => WeightFormat::I5 { group, scale },
        "int2" => WeightFormat::I2 { group, scale },
        // The C engine's int3: groups of 64 with f32 scales, whatever --group-size says.
        "int3" => WeightFormat::I3G64,
        "bf16" => WeightFormat::BF16,
        "f16" => WeightFormat::F16,
        "f32" => WeightFormat::F32,
        o => {
            return Err(Error::invalid(
                "format",
                format!(
                    "'{o}' is not one of int8, int8-gN, int5-gN, int4, int4-gN, int3, int2, bf16"
                ),
            ))
        }
    })
}

/// Progress reporting (the CLI draws a bar).
pub trait Progress: Sync {
    fn begin(&self, _total_bytes: u64, _parts: usize, _already_done: usize) {}
    fn advance(&self, _bytes: u64) {}
    fn message(&self, _msg: &str) {}
}

impl Progress for () {}

/// One tensor of the plan.
#[derive(Clone, Debug)]
pub struct PlannedItem {
    pub name: String,
    pub shape: Vec<usize>,
    pub format: WeightFormat,
}

#[derive(Clone, Debug)]
pub struct PlannedPart {
    pub file: String,
    pub items: Vec<PlannedItem>,
}

/// Matrices that make discrete choices, kept in their source dtype: routers
/// (`...mlp.gate.weight`, `...block_sparse_moe.gate.weight`) pick experts and the sparse
/// attention indexer (`...self_attn.indexer.*`) picks keys; both flip on tiny differences.
pub fn keep_exact(name: &str) -> bool {
    name.ends_with(".gate.weight") || name.contains(".indexer.")
}

/// The output head: `lm_head.weight`, an MTP layer's `shared_head.head.weight`, and the
/// embedding table when `tied` (the model reads its logits through it).
pub fn is_output_head(name: &str, tied: bool) -> bool {
    // A multimodal wrapper's head lies under its language model (`language_model.lm_head`).
    name == "lm_head.weight"
        || name.ends_with(".lm_head.weight")
        || name.ends_with(".shared_head.head.weight")
        || (tied && name.ends_with("embed_tokens.weight") && !name.contains(".layers."))
}

/// An attention projection (`...self_attn.q_proj.weight`, MLA's `q_a_proj`, `kv_b_proj`, ...).
pub fn is_attention(name: &str) -> bool {
    name.contains(".self_attn.") && !name.contains(".indexer.")
}

fn layer_of(name: &str) -> Option<usize> {
    let rest = name.split(".layers.").nth(1)?;
    rest.split('.').next()?.parse().ok()
}

fn expert_index(name: &str) -> usize {
    is_routed_expert(name)
        .and_then(|p| p.rsplit('.').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn plain_format(dtype: DType) -> Option<WeightFormat> {
    match dtype {
        DType::F32 => Some(WeightFormat::F32),
        DType::BF16 => Some(WeightFormat::BF16),
        DType::F16 => Some(WeightFormat::F16),
        DType::F8E4M3 => Some(WeightFormat::BF16),
        _ => None,
    }
}

/// Decides every tensor's format and part.
pub fn plan(ckpt: &Checkpoint, opts: &ConvertOptions) -> Result<Vec<PlannedPart>> {
    let mut names: Vec<&str> = ckpt.tensor_names().collect();
    names.sort();
    let mut dense: Vec<PlannedItem> = Vec::new();
    let mut experts: BTreeMap<usize, Vec<(usize, PlannedItem)>> = BTreeMap::new();
    // Multi-token-prediction layers sit after the decoder layers (DeepSeek-V3, GLM). Their
    // routed experts stay at int8 or better: int4 MTP heads are reported to collapse draft
    // acceptance, and they are one layer, so the bytes are small.
    let decoder_layers = ckpt
        .config
        .get("num_hidden_layers")
        .and_then(|v| v.as_u64())
        .map(|v| v as usize);
    let is_mtp =
        |name: &str| matches!((layer_of(name), decoder_layers), (Some(l), Some(n)) if l >= n);
    let tied = ckpt
        .config
        .get("tie_word_embeddings")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    for name in names {
        let t = ckpt.get(name).expect("listed");
        if name.ends_with("_scale_inv") {
            let base = name.trim_end_matches("_scale_inv");
            if ckpt.get(base).is_none() {
                return Err(t.bad("block scales of a tensor that does not exist"));
            }
            continue;
        }
        // compressed-tensors int4 (read as `X.weight` in place): its parts are not tensors of
        // their own, and the weight converts from its values.
        let ct = t.quant.as_ref().and_then(|q| {
            q.format
                .filter(|f| crate::format::ct_int4::is(*f))
                .map(|_| q.shape.clone())
        });
        if ct.is_none() && is_compressed_part(name, ckpt) {
            continue;
        }
        if (t.quant.is_some() && ct.is_none()) || name.ends_with(crate::container::SCALES_SUFFIX) {
            return Err(
                t.bad("the input is already quantized; convert from the original Hub checkpoint")
            );
        }
        let shape = ct.clone().unwrap_or_else(|| t.shape.clone());
        let plain = if ct.is_some() {
            Some(WeightFormat::BF16)
        } else {
            plain_format(t.dtype)
        };
        let plain = plain.ok_or_else(|| {
            t.bad(format!(
                "dtype {} cannot be converted (bf16, f16, f32, F8_E4M3 can)",
                t.dtype.name()
            ))
        })?;
        if t.dtype == DType::F8E4M3 && ckpt.get(&format!("{name}_scale_inv")).is_none() {
            return Err(t.bad("FP8 weight without its 'weight_scale_inv' block scales"));
        }
        let matrix = shape.len() == 2 && name.ends_with(".weight");
        let format = if matrix && is_routed_expert(name).is_some() {
            match opts.experts {
                WeightFormat::I5 { .. }
                | WeightFormat::I4 { .. }
                | WeightFormat::I2 { .. }
                | WeightFormat::I3G64
                | WeightFormat::I2Plain
                    if is_mtp(name) =>
                {
                    WeightFormat::I8Row
                }
                f => f,
            }
        } else if matrix && !keep_exact(name) {
            match (opts.attention, opts.lm_head) {
                (Some(f), _) if is_attention(name) => f,
                (_, Some(f)) if is_output_head(name, tied) => f,
                _ => opts.dense,
            }
        } else {
            plain
        };
        let format = match shape[..] {
            [rows, cols] if matrix && opts.interleave => {
                crate::rows8::for_shape(format, rows, cols)
            }
            _ => format,
        };
        let item = PlannedItem {
            name: name.to_string(),
            shape,
            format,
        };
        match (is_routed_expert(name), layer_of(name)) {
            (Some(_), Some(l)) if matrix => experts
                .entry(l)
                .or_default()
                .push((expert_index(name), item)),
            _ => dense.push(item),
        }
    }
    let mut parts = Vec::new();
    let mut cur = PlannedPart {
        file: String::new(),
        items: Vec::new(),
    };
    let mut cur_bytes = 0;
    for it in dense {
        let (rows, cols) = rows_cols(&it.shape);
        let b = rows * (it.format.row_bytes(cols) + it.format.scale_row_bytes(cols));
        if cur_bytes > 0 && cur_bytes + b > DENSE_PART_BYTES {
            parts.push(std::mem::replace(
                &mut cur,
                PlannedPart {
                    file: String::new(),
                    items: Vec::new(),
                },
            ));
            cur_bytes = 0;
        }
        cur_bytes += b;
        cur.items.push(it);
    }
    if !cur.items.is_empty() || parts.is_empty() {
        parts.push(cur);
    }
    let n = parts.len();
    for (i, p) in parts.iter_mut().enumerate() {
        p.file = format!("dense-{:05}-of-{n:05}.safetensors", i + 1);
    }
    for (layer, mut items) in experts {
        // Expert order by index (numerically), then tensor name: each expert contiguous.
        items.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.name.cmp(&b.1.name)));
        parts.push(PlannedPart {
            file: format!("experts-layer{layer:05}.safetensors"),
            items: items.into_iter().map(|(_, i)| i).collect(),
        });
    }
    Ok(parts)
}

/// A tensor that is part of a compressed-tensors int4 weight (`X.weight_packed`,
/// `X.weight_scale`, `X.weight_shape`, whose `X.weight` the checkpoint reads as one matrix).
fn is_compressed_part(name: &str, ckpt: &Checkpoint) -> bool {
    ["_packed", "_scale", "_shape"].iter().any(|s| {
        name.strip_suffix(s).is_some_and(|w| {
            ckpt.get(w)
                .and_then(|t| t.quant.as_ref())
                .and_then(|q| q.format)
                .is_some_and(crate::format::ct_int4::is)
        })
    })
}

fn rows_cols(shape: &[usize]) -> (usize, usize) {
    match shape {
        [r, c] => (*r, *c),
        s => (1, s.iter().product()),
    }
}

/// A checkpoint tensor as a source of rows.
struct TensorSource<'a> {
    t: &'a TensorRef,
    cols: usize,
    /// FP8 block scales, `[ceil(rows/128), ceil(cols/128)]`.
    scale_inv: Option<Vec<f32>>,
    /// The output format equals the stored dtype: copy the bytes.
    copy: bool,
}

impl Source for TensorSource<'_> {
    fn row(&self, r: usize, out: &mut [f32]) {
        let b = self.t.bytes();
        let c = self.cols;
        match self.t.dtype {
            DType::F32 => {
                for (o, ch) in out
                    .iter_mut()
                    .zip(b[r * c * 4..(r + 1) * c * 4].chunks_exact(4))
                {
                    *o = f32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]);
                }
            }
            DType::BF16 => {
                for (o, ch) in out
                    .iter_mut()
                    .zip(b[r * c * 2..(r + 1) * c * 2].chunks_exact(2))
                {
                    *o = half::bf16::from_le_bytes([ch[0], ch[1]]).to_f32();
                }
            }
            DType::F16 => {
                for (o, ch) in out
                    .iter_mut()
                    .zip(b[r * c * 2..(r + 1) * c * 2].chunks_exact(2))
                {
                    *o = half::f16::from_le_bytes([ch[0], ch[1]]).to_f32();
                }
            }
            DType::F8E4M3 => {
                let s = self.scale_inv.as_deref().unwrap_or(&[]);
                let bc = c.div_ceil(FP8_BLOCK);
                let srow = &s[(r / FP8_BLOCK) * bc..(r / FP8_BLOCK + 1) * bc];
                for (j, o) in out.iter_mut().enumerate() {
                    *o = crate::quant::fp8_e4m3_to_f32(b[r * c + j]) * srow[j / FP8_BLOCK];
                }
            }
            // compressed-tensors int4: the values transformers computes with.
            DType::I32 if self.t.quant.is_some() => {
                let q = self.t.quant.as_ref().expect("checked");
                let f = q.format.expect("compressed-tensors records its format");
                let s = q.scales.as_ref().map_or(&[][..], |s| s.bytes());
                let (wb, sb) = (f.row_bytes(c), f.scale_row_bytes(c));
                crate::kernels::decode_row(
                    f,
                    &b[r * wb..(r + 1) * wb],
                    &s[r * sb..(r + 1) * sb],
                    out,
                );
            }
            _ => out.iter_mut().for_each(|o| *o = 0.0),
        }
    }
    fn raw(&self) -> Option<&[u8]> {
        self.copy.then(|| self.t.bytes())
    }
}

fn source_for<'a>(ckpt: &'a Checkpoint, it: &PlannedItem) -> Result<TensorSource<'a>> {
    let t = ckpt.get(&it.name).ok_or_else(|| Error::MissingTensor {
        dir: ckpt.dir.clone(),
        tensor: it.name.clone(),
        family: "convert".into(),
    })?;
    let shape = t
        .quant
        .as_ref()
        .map_or_else(|| t.shape.clone(), |q| q.shape.clone());
    let (rows, cols) = rows_cols(&shape);
    let scale_inv = if t.dtype == DType::F8E4M3 {
        let s = ckpt
            .get(&format!("{}_scale_inv", it.name))
            .ok_or_else(|| t.bad("FP8 weight without its 'weight_scale_inv' block scales"))?;
        let want = [rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK)];
        if s.shape != want {
            return Err(s.bad(format!(
                "block scales of shape {:?}, 128×128 blocks need {want:?}",
                s.shape
            )));
        }
        Some(s.to_f32_vec()?)
    } else {
        None
    };
    let copy = plain_format(t.dtype) == Some(it.format) && t.dtype != DType::F8E4M3;
    Ok(TensorSource {
        t,
        cols,
        scale_inv,
        copy,
    })
}

/// The items of a part, with their sources.
pub fn part_items<'a>(ckpt: &'a Checkpoint, part: &PlannedPart) -> Result<Vec<Item<'a>>> {
    part.items
        .iter()
        .map(|it| {
            Ok(Item {
                name: it.name.clone(),
                shape: it.shape.clone(),
                format: it.format,
                source: Box::new(source_for(ckpt, it)?),
            })
        })
        .collect()
}

#[derive(serde::Serialize, serde::Deserialize, Default, Debug, PartialEq)]
struct Manifest {
    fingerprint: String,
    /// file → (length, FNV-64 of the header)
    parts: BTreeMap<String, (u64, String)>,
}

/// Holds the output folder's lock; removes it when dropped.
pub struct LockGuard(PathBuf);

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Takes `dir/.colibri-convert.lock` (created exclusively, holding our pid). A lock whose
/// process is gone (a killed converter) is taken over.
pub fn lock(dir: &Path) -> Result<LockGuard> {
    let path = dir.join(LOCK);
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                use std::io::Write;
                writeln!(f, "{}", std::process::id()).map_err(|e| Error::io(&path, e))?;
                return Ok(LockGuard(path));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let pid: Option<u32> = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
                match pid {
                    Some(p) if p != std::process::id() && pid_alive(p) => {
                        return Err(Error::invalid(
                            "output",
                            format!("another converter (pid {p}) is writing to {}; wait for it or stop it", dir.display()),
                        ))
                    }
                    _ => {
                        // Stale: its process is gone.
                        std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                    }
                }
            }
            Err(e) => return Err(Error::io(&path, e)),
        }
    }
    Err(Error::invalid(
        "output",
        format!("could not take the lock {}", path.display()),
    ))
}

/// Bytes available to unprivileged users on the file system holding `dir`.
#[cfg(unix)]
pub fn free_bytes(dir: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| Error::invalid("output", "path contains NUL"))?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(Error::io(dir, std::io::Error::last_os_error()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Elsewhere the free-space check is skipped (reported as unlimited); the write itself
/// still fails cleanly on a full disk.
#[cfg(not(unix))]
pub fn free_bytes(_dir: &Path) -> Result<u64> {
    Ok(u64::MAX)
}

fn fingerprint(ckpt: &Checkpoint, opts: &ConvertOptions) -> String {
    let mut names: Vec<&str> = ckpt.tensor_names().collect();
    names.sort();
    let mut s = format!(
        "colibri-convert v{} experts={} dense={}\n",
        crate::container::FORMAT_VERSION,
        opts.experts.name(),
        opts.dense.name()
    );
    if let Some(a) = opts.attention {
        // Only when set, so the fingerprints of earlier conversions stay valid.
        s.push_str(&format!("attention={}\n", a.name()));
    }
    if let Some(h) = opts.lm_head {
        s.push_str(&format!("lm_head={}\n", h.name()));
    }
    if opts.interleave {
        // Likewise: a conversion that was under way with rows one after another resumes so.
        s.push_str("int4-rows8\n");
    }
    for n in names {
        let t = ckpt.get(n).expect("listed");
        s.push_str(&format!(
            "{n} {} {:?} {}\n",
            t.dtype.name(),
            t.shape,
            t.end - t.start
        ));
    }
    format!("{:016x}", fnv64(s.as_bytes()))
}

/// Files copied unchanged next to the weights: everything but safetensors and their index.
fn side_files(input: &Path) -> Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(input).map_err(|e| Error::io(input, e))? {
        let e = e.map_err(|e| Error::io(input, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let ft = e.file_type().map_err(|er| Error::io(e.path(), er))?;
        if !ft.is_file()
            || name.starts_with('.')
            || name.ends_with(".safetensors")
            || name == "model.safetensors.index.json"
        {
            continue;
        }
        v.push(e.path());
    }
    v.sort();
    Ok(v)
}

/// Summary of a finished conversion.
#[derive(Clone, Debug)]
pub struct ConvertSummary {
    pub parts: usize,
    pub resumed_parts: usize,
    pub bytes_written: u64,
    pub total_bytes: u64,
}

/// Converts `opts.input` into the container folder `opts.output` (resuming a previous,
/// interrupted run into the same folder).
pub fn convert(opts: &ConvertOptions, progress: &dyn Progress) -> Result<ConvertSummary> {
    let ckpt = Checkpoint::open_mapped(&opts.input)?;
    if ckpt.is_container {
        return Err(Error::invalid(
            "input",
            "the input is already a colibri container",
        ));
    }
    std::fs::create_dir_all(&opts.output).map_err(|e| Error::io(&opts.output, e))?;
    let _lock = lock(&opts.output)?;
    let parts = plan(&ckpt, opts)?;
    let fp = fingerprint(&ckpt, opts);
    let mpath = opts.output.join(MANIFEST);
    let mut manifest = match std::fs::read(&mpath) {
        Ok(b) => {
            let m: Manifest = serde_json::from_slice(&b).map_err(|e| Error::CorruptFile {
                file: mpath.clone(),
                msg: format!("unreadable conversion manifest ({e}); remove it to start over"),
            })?;
            if m.fingerprint != fp {
                return Err(Error::invalid(
                    "output",
                    format!(
                        "{} holds a conversion of another input or with other options; use an empty folder",
                        opts.output.display()
                    ),
                ));
            }
            m
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Manifest {
            fingerprint: fp.clone(),
            ..Default::default()
        },
        Err(e) => return Err(Error::io(&mpath, e)),
    };
    // Leftovers of an interrupted write.
    for e in std::fs::read_dir(&opts.output)
        .map_err(|e| Error::io(&opts.output, e))?
        .flatten()
    {
        if e.file_name().to_string_lossy().ends_with(".partial") {
            let _ = std::fs::remove_file(e.path());
        }
    }
    // Lay out every part (cheap) and check which finished parts are intact.
    let mut todo = Vec::new();
    let mut total = 0u64;
    let mut weight_map: BTreeMap<String, String> = BTreeMap::new();
    for p in &parts {
        let items = part_items(&ckpt, p)?;
        let lay = layout(&items)?;
        for it in &p.items {
            weight_map.insert(it.name.clone(), p.file.clone());
            if it.format.is_quantized() {
                weight_map.insert(
                    format!("{}{}", it.name, crate::container::SCALES_SUFFIX),
                    p.file.clone(),
                );
            }
        }
        total += lay.file_len;
        let want = (lay.file_len, format!("{:016x}", fnv64(&lay.header)));
        let path = opts.output.join(&p.file);
        let intact = manifest.parts.get(&p.file) == Some(&want)
            && std::fs::metadata(&path).is_ok_and(|m| m.len() == want.0)
            && read_prefix(&path, lay.header.len()).is_some_and(|h| h == lay.header);
        if !intact {
            manifest.parts.remove(&p.file);
            todo.push((p, want));
        }
    }
    let remaining: u64 = todo.iter().map(|(_, w)| w.0).sum();
    let free = free_bytes(&opts.output)?;
    if remaining + (remaining / 100) > free {
        return Err(Error::invalid(
            "output",
            format!(
                "{} needs {:.1} GB more, the disk has {:.1} GB free",
                opts.output.display(),
                remaining as f64 / 1e9,
                free as f64 / 1e9
            ),
        ));
    }
    progress.begin(remaining, parts.len(), parts.len() - todo.len());
    let mut written = 0u64;
    for (p, want) in &todo {
        progress.message(&p.file);
        let items = part_items(&ckpt, p)?;
        let lay = write_part(&opts.output.join(&p.file), &items, &|b| progress.advance(b))?;
        debug_assert_eq!(lay.file_len, want.0);
        written += lay.file_len;
        manifest.parts.insert(p.file.clone(), want.clone());
        write_atomic(
            &mpath,
            &serde_json::to_vec_pretty(&manifest).expect("manifest serializes"),
        )?;
        // Lets the kill -9 test interrupt a conversion of a tiny fixture between parts.
        if let Some(ms) = std::env::var("COLIBRI_CONVERT_PAUSE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }
    let index = serde_json::json!({
        "metadata": { "format": "colibri", "colibri_version": crate::container::FORMAT_VERSION, "total_size": total },
        "weight_map": weight_map,
    });
    write_atomic(
        &opts.output.join("model.safetensors.index.json"),
        &serde_json::to_vec_pretty(&index).expect("index serializes"),
    )?;
    for f in side_files(&opts.input)? {
        let name = f.file_name().expect("a file");
        let mut bytes = std::fs::read(&f).map_err(|e| Error::io(&f, e))?;
        if name == "config.json" {
            // The source's quantization_config (FP8, compressed-tensors int4; a multimodal
            // wrapper keeps it in its text config) no longer describes the weights.
            if let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                let mut removed = false;
                if let Some(o) = v.as_object_mut() {
                    removed |= o.remove("quantization_config").is_some();
                    for k in ["text_config", "language_config", "llm_config"] {
                        if let Some(t) = o.get_mut(k).and_then(|t| t.as_object_mut()) {
                            removed |= t.remove("quantization_config").is_some();
                        }
                    }
                }
                if removed {
                    bytes = serde_json::to_vec_pretty(&v).expect("json");
                }
            }
        }
        write_atomic(&opts.output.join(name), &bytes)?;
    }
    Ok(ConvertSummary {
        parts: parts.len(),
        resumed_parts: parts.len() - todo.len(),
        bytes_written: written,
        total_bytes: total,
    })
}

fn read_prefix(path: &Path, n: usize) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut b = vec![0u8; n];
    f.read_exact(&mut b).ok()?;
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names `coli plan/doctor/status` print for the converter's formats are accepted
    /// back on the command line.
    #[test]
    fn printed_format_names_parse_back() {
        for name in [
            "int8", "int8-g32", "int4-g64", "int4-g32", "int2-g64", "int3-g64",
        ] {
            let f = parse_format(name, 0).unwrap();
            assert_eq!(f.name(), name);
        }
        assert_eq!(parse_format("int3", 0).unwrap(), WeightFormat::I3G64);
        assert!(parse_format("int3-g32", 0).is_err());
    }

    /// `--lm-head` reaches the output heads, and the embedding table only where the model
    /// ties it to the head.
    #[test]
    fn output_heads_are_named() {
        assert!(is_output_head("lm_head.weight", false));
        assert!(is_output_head("language_model.lm_head.weight", false));
        assert!(is_output_head(
            "model.layers.61.shared_head.head.weight",
            false
        ));
        assert!(!is_output_head("model.embed_tokens.weight", false));
        assert!(is_output_head("model.embed_tokens.weight", true));
        assert!(!is_output_head("model.layers.61.embed_tokens.weight", true));
        assert!(!is_output_head(
            "model.layers.0.self_attn.o_proj.weight",
            true
        ));
    }
}
