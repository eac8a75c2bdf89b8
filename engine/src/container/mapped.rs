//! The bytes of one safetensors file: memory-mapped, or copied into RAM where the loader may
//! rearrange a tensor in place.

use crate::error::{Error, Result};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One memory-mapped safetensors file, validated.
pub struct MappedFile {
    pub path: PathBuf,
    pub(super) bytes: FileBytes,
    /// The `__metadata__` map of the header (format versions, quantisation records).
    pub metadata: BTreeMap<String, String>,
    /// Starts of the tensors rearranged in the RAM copy at load (int4 interleaved by 8 rows,
    /// [`crate::rows8`]): their bytes differ from the file's.
    pub(super) repacked: std::sync::Mutex<std::collections::HashSet<usize>>,
}

/// Where a [`MappedFile`]'s bytes are.
pub(super) enum FileBytes {
    /// The file, memory-mapped read-only.
    Mapped(Mmap),
    /// Copied into anonymous memory ([`WeightsIn`](super::WeightsIn)), which stays writable so the loader can
    /// rearrange a tensor in place (`MappedFile::ram_ptr`).
    Ram(RamCopy),
}

/// An anonymous mapping and the pointer its bytes are read and (once per tensor, at load)
/// written through.
pub(super) struct RamCopy {
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

    /// Whether the bytes were copied into RAM ([`WeightsIn::Ram`](super::WeightsIn::Ram),
    /// [`WeightsIn::Auto`](super::WeightsIn::Auto)).
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

/// Bytes copied between two progress reports
/// ([`Checkpoint::open_reporting`](super::Checkpoint::open_reporting)).
const COPY_REPORT_BYTES: usize = 64 << 20;

/// `map`'s bytes copied into anonymous memory (in parallel, 4 MiB per task), `copied`
/// told after every [`COPY_REPORT_BYTES`].
pub(super) fn into_ram(map: &Mmap, path: &Path, copied: &mut dyn FnMut(u64)) -> Result<RamCopy> {
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
