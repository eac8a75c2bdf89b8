//! Opening model directories: Hugging Face checkpoints as published on the Hub (config.json,
//! one or many `*.safetensors` with `model.safetensors.index.json`, tokenizer files).
//!
//! Every byte read from disk is untrusted. The safetensors header and the shard index are
//! parsed by the pure functions [`parse_safetensors_header`] and [`parse_index`] (the fuzz
//! targets call them directly); a bad file is a typed error naming the file and tensor.

mod quantized;
mod safetensors_file;

pub use quantized::{
    c_layout_format, is_routed_expert, parse_container_meta, split_merged_expert, ContainerMeta,
    ExpertExtent, QuantAttach, TensorRecord, EXPERT_ALIGN, FORMAT_VERSION, KEY_EXPERTS,
    KEY_TENSORS, KEY_VERSION, MERGED_WEIGHT, PAD_PREFIX, SCALES_SUFFIX,
};

pub use safetensors_file::{
    parse_index, parse_safetensors_header, DType, HeaderEntry, ParsedHeader,
};

use crate::error::{Error, Result};
use memmap2::Mmap;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One memory-mapped safetensors file, validated.
pub struct MappedFile {
    pub path: PathBuf,
    bytes: FileBytes,
    /// The `__metadata__` map of the header (format versions, quantisation records).
    pub metadata: BTreeMap<String, String>,
    /// Starts of the tensors rearranged in the RAM copy at load (int4 interleaved by 8 rows,
    /// [`crate::rows8`]): their bytes differ from the file's.
    repacked: std::sync::Mutex<std::collections::HashSet<usize>>,
}

/// Where a [`MappedFile`]'s bytes are.
enum FileBytes {
    /// The file, memory-mapped read-only.
    Mapped(Mmap),
    /// Copied into anonymous memory ([`WeightsIn`]), which stays writable so the loader can
    /// rearrange a tensor in place (`MappedFile::ram_ptr`).
    Ram(RamCopy),
}

/// An anonymous mapping and the pointer its bytes are read and (once per tensor, at load)
/// written through.
struct RamCopy {
    _map: memmap2::MmapMut,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is the mapping's own, alive as long as `_map`; writes through it
// follow the contract of `MappedFile::ram_ptr`.
unsafe impl Send for RamCopy {}
unsafe impl Sync for RamCopy {}

impl MappedFile {
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            FileBytes::Mapped(m) => m,
            // SAFETY: `ptr` and `len` are the live mapping's.
            FileBytes::Ram(r) => unsafe { std::slice::from_raw_parts(r.ptr, r.len) },
        }
    }

    /// Bytes `start..end` (a slice of that range alone: a RAM copy's other tensors may be
    /// rearranged meanwhile, see `ram_ptr`).
    #[inline]
    pub fn range(&self, start: usize, end: usize) -> &[u8] {
        match &self.bytes {
            FileBytes::Mapped(m) => &m[start..end],
            FileBytes::Ram(r) => {
                assert!(
                    start <= end && end <= r.len,
                    "range {start}..{end} of {}",
                    r.len
                );
                // SAFETY: inside the live mapping (checked).
                unsafe { std::slice::from_raw_parts(r.ptr.add(start), end - start) }
            }
        }
    }

    /// Whether the bytes were copied into RAM ([`WeightsIn::Ram`], [`WeightsIn::Auto`]).
    pub fn in_ram(&self) -> bool {
        matches!(self.bytes, FileBytes::Ram(_))
    }

    /// A pointer to bytes `start..end` of a RAM copy, to rewrite them; `None` for a mapped
    /// file. Writing through it is sound only while no other reference to these bytes is
    /// alive or made: the loader rewrites a tensor once, before any matrix over it exists
    /// (under the tensor's lock, `QuantAttach::format_for`).
    pub(crate) fn ram_ptr(&self, start: usize, end: usize) -> Option<*mut u8> {
        match &self.bytes {
            FileBytes::Mapped(_) => None,
            FileBytes::Ram(r) => {
                assert!(
                    start <= end && end <= r.len,
                    "range {start}..{end} of {}",
                    r.len
                );
                // SAFETY: inside the live mapping (checked).
                Some(unsafe { r.ptr.add(start) })
            }
        }
    }

    /// Records that the tensor starting at `start` was rearranged in RAM.
    pub(crate) fn mark_repacked(&self, start: usize) {
        let mut v = self.repacked.lock().unwrap_or_else(|p| p.into_inner());
        v.insert(start);
    }

    /// Whether the tensor starting at `start` was rearranged in RAM at load, so its bytes
    /// in the file are in another layout (the expert cache reads the file).
    pub fn repacked_at(&self, start: usize) -> bool {
        let v = self.repacked.lock().unwrap_or_else(|p| p.into_inner());
        v.contains(&start)
    }
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .finish()
    }
}

/// A tensor inside a mapped file: dtype, shape and the absolute byte range, already checked
/// to lie inside the file and to match `shape × dtype size`.
#[derive(Clone, Debug)]
pub struct TensorRef {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub file: Arc<MappedFile>,
    pub start: usize,
    pub end: usize,
    /// Quantized storage (converted container or C layout); `None` for plain arrays.
    pub quant: Option<Arc<QuantAttach>>,
}

impl TensorRef {
    pub fn bytes(&self) -> &[u8] {
        self.file.range(self.start, self.end)
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bad(&self, msg: impl Into<String>) -> Error {
        Error::BadTensor {
            file: self.file.path.clone(),
            tensor: self.name.clone(),
            msg: msg.into(),
        }
    }
    /// Checks the shape (and that the dtype is one the dense f32 path can read).
    pub fn expect_shape(&self, shape: &[usize]) -> Result<()> {
        if self.shape != shape {
            return Err(self.bad(format!(
                "shape {:?} does not match the configuration, which needs {:?}",
                self.shape, shape
            )));
        }
        Ok(())
    }
    /// The tensor converted to f32 (for small vectors: norms, biases, router bias).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        let b = self.bytes();
        Ok(match self.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(self.bad(format!("dtype {other:?} where f32, bf16 or f16 is needed")))
            }
        })
    }
}

/// A model directory: its config and every tensor of every shard, by name.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config_path: PathBuf,
    pub config: serde_json::Value,
    tensors: HashMap<String, TensorRef>,
    /// Converted container: routed experts' byte extents by name prefix
    /// (`model.layers.L.mlp.experts.E`), with the file holding each.
    pub expert_extents: HashMap<String, (Arc<MappedFile>, ExpertExtent)>,
    /// Whether this folder is a converted container (docs/FORMAT.md).
    pub is_container: bool,
    /// Whether it holds tensors in the colibri C layout (`name` U8/I8 + `name.qs`).
    pub c_layout: bool,
}

/// Where the weights of an opened folder are read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightsIn {
    /// In RAM when they fit in half of the memory available (and of the memory cgroup's
    /// room), else memory-mapped (`COLIBRI_WEIGHTS=auto`, the default).
    Auto,
    /// Copied into anonymous memory (`COLIBRI_WEIGHTS=ram`).
    Ram,
    /// Memory-mapped from the files, read through the page cache (`COLIBRI_WEIGHTS=mmap`:
    /// loading takes no time, and the bytes are shared with the page cache).
    Map,
}

impl WeightsIn {
    /// `COLIBRI_WEIGHTS`: `ram`, `mmap` or `auto` (anything else).
    pub fn from_env() -> WeightsIn {
        match std::env::var("COLIBRI_WEIGHTS").as_deref() {
            Ok("ram") => WeightsIn::Ram,
            Ok("mmap") | Ok("map") => WeightsIn::Map,
            _ => WeightsIn::Auto,
        }
    }
}

/// How [`Checkpoint::open_with`] opens a folder.
#[derive(Clone, Copy, Debug)]
pub struct OpenOptions {
    pub weights: WeightsIn,
    /// The routed experts will be streamed through the expert cache: files holding expert
    /// extents stay mapped (the cache reads them), only the dense files may be copied.
    pub streamed_experts: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            weights: WeightsIn::from_env(),
            streamed_experts: false,
        }
    }
}

/// Bytes that may be copied into RAM under [`WeightsIn::Auto`]: half of what is available,
/// in the machine (`MemAvailable`) and in this process's memory cgroup (v1 or v2), so the
/// page cache and everything else keep the other half. 0 where neither can be read.
fn ram_budget() -> u64 {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let avail = read("/proc/meminfo").and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb << 10)
    });
    let Some(mut room) = avail else { return 0 };
    for line in read("/proc/self/cgroup").unwrap_or_default().lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrl, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let (limit, usage) = match ctrl {
            "" => (
                format!("/sys/fs/cgroup{path}/memory.max"),
                format!("/sys/fs/cgroup{path}/memory.current"),
            ),
            c if c.split(',').any(|c| c == "memory") => (
                format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"),
                format!("/sys/fs/cgroup/memory{path}/memory.usage_in_bytes"),
            ),
            _ => continue,
        };
        let num = |p: &str| read(p).and_then(|v| v.trim().parse::<u64>().ok());
        if let (Some(l), Some(u)) = (num(&limit), num(&usage)) {
            room = room.min(l.saturating_sub(u));
        }
    }
    room / 2
}

/// Bytes copied between two progress reports ([`Checkpoint::open_reporting`]).
const COPY_REPORT_BYTES: usize = 64 << 20;

/// `map`'s bytes copied into anonymous memory (in parallel, 4 MiB per task), `copied`
/// told after every [`COPY_REPORT_BYTES`].
fn into_ram(map: &Mmap, path: &Path, copied: &mut dyn FnMut(u64)) -> Result<RamCopy> {
    use rayon::prelude::*;
    let mut anon = memmap2::MmapMut::map_anon(map.len().max(1)).map_err(|e| Error::io(path, e))?;
    for (dst, src) in anon[..map.len()]
        .chunks_mut(COPY_REPORT_BYTES)
        .zip(map.chunks(COPY_REPORT_BYTES))
    {
        dst.par_chunks_mut(4 << 20)
            .zip(src.par_chunks(4 << 20))
            .for_each(|(d, s)| d.copy_from_slice(s));
        copied(src.len() as u64);
    }
    let ptr = anon.as_mut_ptr();
    Ok(RamCopy {
        _map: anon,
        ptr,
        len: map.len(),
    })
}

/// Whether int4 matrices copied into RAM are rearranged into the 8-row interleaved layout
/// at load (`COLIBRI_REPACK=0` turns it off, for comparisons).
pub fn repack_enabled() -> bool {
    std::env::var("COLIBRI_REPACK").map_or(true, |v| v != "0")
}

impl Checkpoint {
    /// Opens and validates a Hub checkpoint directory. Shards are taken from
    /// `model.safetensors.index.json` when present, otherwise every `*.safetensors` file.
    /// Where the weights live follows `COLIBRI_WEIGHTS` ([`OpenOptions::default`]).
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with(dir, &OpenOptions::default())
    }

    /// Only memory-mapped, whatever `COLIBRI_WEIGHTS` says (a converter's input, read once).
    pub fn open_mapped(dir: &Path) -> Result<Self> {
        Self::open_with(
            dir,
            &OpenOptions {
                weights: WeightsIn::Map,
                streamed_experts: false,
            },
        )
    }

    /// [`open`](Self::open), the weights placed as `opts` says.
    ///
    /// Why copy: on the Zen 4 machine (docs/PERFORMANCE.md) decode of the OLMoE-1B-7B synth
    /// ran 26–31 tok/s memory-mapped right after its conversion and 41–42 later, against
    /// 43–52 copied into RAM (llama.cpp 44–45 in the same rounds): a copy makes decode
    /// independent of how the page cache holds the files, at the price of the load time
    /// (3–8 s for 3.8 GB against 0.1–0.2 s), paid once by the daemon.
    pub fn open_with(dir: &Path, opts: &OpenOptions) -> Result<Self> {
        Self::open_reporting(dir, opts, &|_, _| {})
    }

    /// [`open_with`](Self::open_with), telling `copied(done, total)` how many of the bytes
    /// to be copied into RAM are (after each 64 MiB; nothing when nothing is copied).
    ///
    /// Int4 matrices of files copied into RAM whose shape the 8-row kernels take (groups of
    /// 32 or 64, rows a multiple of 8, columns of 64: [`crate::rows8::for_shape`]) are
    /// rearranged there into `int4-rows8` as they are loaded (`QuantAttach::format_for`),
    /// unless `COLIBRI_REPACK=0` or they are routed experts that will be streamed.
    pub fn open_reporting(
        dir: &Path,
        opts: &OpenOptions,
        copied: &dyn Fn(u64, u64),
    ) -> Result<Self> {
        if !dir.is_dir() {
            return Err(Error::Config {
                file: dir.to_path_buf(),
                msg: "not a directory (expected a model folder with config.json and *.safetensors)"
                    .into(),
            });
        }
        let config_path = dir.join("config.json");
        let config_bytes = std::fs::read(&config_path).map_err(|e| Error::io(&config_path, e))?;
        let config: serde_json::Value =
            serde_json::from_slice(&config_bytes).map_err(|e| Error::Config {
                file: config_path.clone(),
                msg: format!("invalid JSON: {e}"),
            })?;
        if !config.is_object() {
            return Err(Error::Config {
                file: config_path,
                msg: "expected a JSON object".into(),
            });
        }

        let index_path = dir.join("model.safetensors.index.json");
        // (shard file name, tensors the index says it holds)
        let mut shards: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let indexed = index_path.exists();
        if indexed {
            let bytes = std::fs::read(&index_path).map_err(|e| Error::io(&index_path, e))?;
            let map = parse_index(&bytes, &index_path)?;
            for (tensor, file) in map {
                shards.entry(file).or_default().push(tensor);
            }
        } else {
            let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
            for entry in rd {
                let entry = entry.map_err(|e| Error::io(dir, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with(".safetensors") {
                    shards.insert(name, Vec::new());
                }
            }
            if shards.is_empty() {
                return Err(Error::Config {
                    file: dir.to_path_buf(),
                    msg: "no *.safetensors file and no model.safetensors.index.json".into(),
                });
            }
        }

        let mut tensors: HashMap<String, TensorRef> = HashMap::new();
        let mut expert_extents = HashMap::new();
        let mut container_files: Option<bool> = None;
        let mut ram_left = match opts.weights {
            WeightsIn::Auto => ram_budget(),
            WeightsIn::Ram => u64::MAX,
            WeightsIn::Map => 0,
        };
        // Every file mapped and its header read first, so the bytes to copy are known
        // before the copy starts (its progress has a total).
        let mut opened = Vec::with_capacity(shards.len());
        for shard in shards.keys() {
            let path = dir.join(shard);
            let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
            // SAFETY: the map is read-only; a file truncated underneath us by another process
            // is outside what any mmap-based loader can defend against.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
            let parsed = parse_safetensors_header(&mmap, &path)?;
            let container_meta = parse_container_meta(&parsed.metadata, &path)?;
            match (container_meta.is_some(), container_files) {
                (true, None) => container_files = Some(true),
                (false, None) => container_files = Some(false),
                (c, Some(prev)) if c != prev => return Err(Error::CorruptFile {
                    file: path.clone(),
                    msg:
                        "some files of this folder carry colibri container records and some do not"
                            .into(),
                }),
                _ => {}
            }
            let holds_experts = container_meta
                .as_ref()
                .is_some_and(|m| !m.experts.is_empty());
            let len = mmap.len() as u64;
            let in_ram = len <= ram_left && !(opts.streamed_experts && holds_experts);
            if in_ram {
                ram_left -= len;
            }
            opened.push((path, mmap, parsed, container_meta, in_ram));
        }
        let to_copy: u64 = opened
            .iter()
            .filter(|o| o.4)
            .map(|o| o.1.len() as u64)
            .sum();
        let mut done = 0u64;
        if to_copy > 0 {
            copied(0, to_copy);
        }
        let repack = repack_enabled();
        // Which int4 matrices may be rearranged in their file's RAM copy (`QuantAttach::repack`).
        let may_repack = |t: &TensorRef, routed: bool| {
            repack && t.file.in_ram() && !(routed && opts.streamed_experts)
        };
        for ((shard, listed), (path, mmap, parsed, container_meta, in_ram)) in
            shards.iter().zip(opened)
        {
            let bytes = if in_ram {
                FileBytes::Ram(into_ram(&mmap, &path, &mut |n| {
                    done += n;
                    copied(done, to_copy);
                })?)
            } else {
                FileBytes::Mapped(mmap)
            };
            let mapped = Arc::new(MappedFile {
                path: path.clone(),
                bytes,
                metadata: parsed.metadata,
                repacked: Default::default(),
            });
            let mut file_tensors: HashMap<String, TensorRef> = HashMap::new();
            for e in parsed.tensors {
                file_tensors.insert(
                    e.name.clone(),
                    TensorRef {
                        name: e.name,
                        dtype: e.dtype,
                        shape: e.shape,
                        file: mapped.clone(),
                        start: parsed.data_start + e.start,
                        end: parsed.data_start + e.end,
                        quant: None,
                    },
                );
            }
            if let Some(meta) = &container_meta {
                for ext in
                    quantized::apply_container_meta(meta, &path, &mut file_tensors, &may_repack)?
                {
                    expert_extents.insert(ext.name.clone(), (mapped.clone(), ext));
                }
            }
            let mut file_tensors: Vec<TensorRef> = file_tensors.into_values().collect();
            file_tensors.sort_by(|a, b| a.name.cmp(&b.name));
            for e in file_tensors {
                if let Some(prev) = tensors.get(&e.name) {
                    return Err(Error::DuplicateTensor {
                        tensor: e.name,
                        first: prev.file.path.clone(),
                        second: path.clone(),
                    });
                }
                tensors.insert(e.name.clone(), e);
            }
            for t in listed {
                match tensors.get(t) {
                    Some(r) if r.file.path == path => {}
                    Some(r) => {
                        return Err(Error::DuplicateTensor {
                            tensor: t.clone(),
                            first: r.file.path.clone(),
                            second: path.clone(),
                        })
                    }
                    None => {
                        return Err(Error::CorruptFile {
                            file: index_path.clone(),
                            msg: format!(
                                "the index places tensor '{t}' in {shard}, which does not hold it"
                            ),
                        })
                    }
                }
            }
        }
        let is_container = container_files == Some(true);
        let c_layout = !is_container && quantized::attach_c_layout(&mut tensors, &may_repack)? > 0;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config_path,
            config,
            tensors,
            expert_extents,
            is_container,
            c_layout,
        })
    }

    /// What kind of folder this is, in words.
    pub fn layout(&self) -> &'static str {
        if self.is_container {
            "colibri container"
        } else if self.c_layout {
            "colibri C layout (U8 + .qs scales)"
        } else {
            "Hub checkpoint"
        }
    }

    pub fn get(&self, name: &str) -> Option<&TensorRef> {
        self.tensors.get(name)
    }

    /// The named tensor, or a `MissingTensor` error naming the family that needs it.
    pub fn require(&self, name: &str, family: &str) -> Result<&TensorRef> {
        self.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            dir: self.dir.clone(),
            tensor: name.to_string(),
            family: family.to_string(),
        })
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}
