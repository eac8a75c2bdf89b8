//! Opening model directories: Hugging Face checkpoints as published on the Hub (config.json,
//! one or many `*.safetensors` with `model.safetensors.index.json`, tokenizer files).
//!
//! Every byte read from disk is untrusted. The safetensors header and the shard index are
//! parsed by the pure functions [`parse_safetensors_header`] and [`parse_index`] (the fuzz
//! targets call them directly); a bad file is a typed error naming the file and tensor.

pub mod compressed;
mod mapped;
mod quantized;
mod safetensors_file;
mod tensor_ref;

pub use mapped::MappedFile;
pub use quantized::{
    c_layout_format, is_routed_expert, parse_container_meta, split_merged_expert, ContainerMeta,
    ExpertExtent, TensorRecord, EXPERT_ALIGN, FORMAT_VERSION, KEY_EXPERTS, KEY_TENSORS,
    KEY_VERSION, MERGED_WEIGHT, PAD_PREFIX, SCALES_SUFFIX,
};
pub use tensor_ref::{QuantAttach, TensorRef};

pub use safetensors_file::{
    parse_index, parse_safetensors_header, DType, HeaderEntry, ParsedHeader,
};

use crate::error::{Error, Result};
use mapped::{into_ram, FileBytes};
use memmap2::Mmap;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    /// `(read as, published as)` name prefixes of a [`renamed`](Self::renamed) view, so a
    /// missing tensor is reported under the name the files would hold.
    renames: Vec<(String, String)>,
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
        compressed::attach(&config, &config_path, &mut tensors)?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config_path,
            config,
            tensors,
            expert_extents,
            is_container,
            c_layout,
            renames: Vec::new(),
        })
    }

    /// A view of this folder in which the tensors under each `published` prefix are read under
    /// `read_as` instead (a multimodal wrapper's language model — `language_model.model.` —
    /// read by its text family under `model.`); tensors under no listed prefix are left out.
    /// The tensors themselves (names included, so their errors name the files' tensors) are
    /// shared, not copied.
    pub fn renamed(&self, map: &[(&str, &str)]) -> Checkpoint {
        let tensors = self
            .tensors
            .iter()
            .filter_map(|(name, t)| {
                map.iter().find_map(|(read_as, published)| {
                    let rest = name.strip_prefix(published)?;
                    Some((format!("{read_as}{rest}"), t.clone()))
                })
            })
            .collect();
        Checkpoint {
            dir: self.dir.clone(),
            config_path: self.config_path.clone(),
            config: self.config.clone(),
            tensors,
            expert_extents: self.expert_extents.clone(),
            is_container: self.is_container,
            c_layout: self.c_layout,
            renames: map
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        }
    }

    /// The name a tensor read as `name` has in the files.
    pub fn published_name(&self, name: &str) -> String {
        self.renames
            .iter()
            .find_map(|(read_as, published)| {
                name.strip_prefix(read_as.as_str())
                    .map(|rest| format!("{published}{rest}"))
            })
            .unwrap_or_else(|| name.to_string())
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
            tensor: self.published_name(name),
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
