//! Writes container parts: safetensors files with colibri records in `__metadata__`, the
//! data section starting on a 4096-byte boundary, each routed expert's tensors contiguous and
//! 4096-byte aligned (filler tensors `__pad.N` keep the file valid safetensors).
//!
//! A part is fully determined by its item list, so its bytes are the same on every run: the
//! resumable converter depends on it.

use crate::container::{
    is_routed_expert, ContainerMeta, DType, ExpertExtent, TensorRecord, EXPERT_ALIGN,
    FORMAT_VERSION, PAD_PREFIX, SCALES_SUFFIX,
};
use crate::error::{Error, Result};
use crate::tensor::WeightFormat;
use rayon::prelude::*;
use std::io::Write;
use std::path::Path;

/// Where an item's values come from.
pub trait Source: Sync {
    /// Row `r` of a `rows × cols` matrix (or, for vectors, the whole vector as row 0) as f32.
    fn row(&self, r: usize, out: &mut [f32]);
    /// The item's bytes when they are copied unchanged (`None`: go through f32).
    fn raw(&self) -> Option<&[u8]> {
        None
    }
    /// Produces the packed weights and scales directly (synthetic models skip f32).
    fn packed(
        &self,
        _format: WeightFormat,
        _rows: usize,
        _cols: usize,
    ) -> Option<crate::quant::Packed> {
        None
    }
}

/// One tensor to write: a matrix in a storage format (quantized ones get a `.qs` scales
/// tensor), or a plain array.
pub struct Item<'a> {
    pub name: String,
    /// Logical shape; matrices are `[rows, cols]`.
    pub shape: Vec<usize>,
    pub format: WeightFormat,
    pub source: Box<dyn Source + 'a>,
}

impl Item<'_> {
    fn rows_cols(&self) -> (usize, usize) {
        match self.shape.as_slice() {
            [r, c] => (*r, *c),
            s => (1, s.iter().product()),
        }
    }
    fn dtype_and_bytes(&self) -> (DType, usize) {
        let (rows, cols) = self.rows_cols();
        let dt = match self.format {
            WeightFormat::F32 => DType::F32,
            WeightFormat::BF16 => DType::BF16,
            WeightFormat::F16 => DType::F16,
            _ => DType::U8,
        };
        (dt, rows * self.format.row_bytes(cols))
    }
    /// The item's bytes: weights and scales.
    pub fn produce(&self) -> (Vec<u8>, Vec<u8>) {
        if self.format.interleaved() {
            // Quantized row by row as int4, then the rows moved into their groups of 8.
            let (rows, cols) = self.rows_cols();
            let f = self.format.row_major();
            let (mut data, mut scales) = self.produce_as(f);
            crate::rows8::interleave_in_place(f, rows, cols, &mut data, &mut scales);
            return (data, scales);
        }
        self.produce_as(self.format)
    }

    /// The item's bytes in `format` (row-major).
    fn produce_as(&self, format: WeightFormat) -> (Vec<u8>, Vec<u8>) {
        let (rows, cols) = self.rows_cols();
        if let Some(raw) = self.source.raw() {
            return (raw.to_vec(), Vec::new());
        }
        if let Some(p) = self.source.packed(format, rows, cols) {
            return (p.data, p.scales);
        }
        let rb = format.row_bytes(cols);
        let sb = format.scale_row_bytes(cols);
        const CHUNK: usize = 64;
        let parts: Vec<(Vec<u8>, Vec<u8>)> = (0..rows.div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                let mut row = vec![0f32; cols];
                let (mut d, mut s) = (
                    Vec::with_capacity(CHUNK * rb),
                    Vec::with_capacity(CHUNK * sb),
                );
                for r in c * CHUNK..((c + 1) * CHUNK).min(rows) {
                    self.source.row(r, &mut row);
                    crate::quant::quantize_row(format, &row, &mut d, &mut s);
                }
                (d, s)
            })
            .collect();
        let mut data = Vec::with_capacity(rows * rb);
        let mut scales = Vec::with_capacity(rows * sb);
        for (d, s) in parts {
            data.extend_from_slice(&d);
            scales.extend_from_slice(&s);
        }
        (data, scales)
    }
}

/// One header entry of the planned file.
#[derive(Clone, Debug)]
struct Entry {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// The computed layout of a part: header bytes and where every item goes.
pub struct Layout {
    pub header: Vec<u8>,
    /// Total file size.
    pub file_len: u64,
    /// Per item: relative offset of its weights (its scales follow directly), plus any
    /// zero filler to write before it.
    placements: Vec<(usize, usize)>,
    /// Zero bytes after the last item.
    trailing_pad: usize,
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// Lays out `items` (experts must be consecutive): offsets, filler, records and extents.
pub fn layout(items: &[Item<'_>]) -> Result<Layout> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut meta = ContainerMeta {
        version: FORMAT_VERSION,
        ..Default::default()
    };
    let mut placements = Vec::with_capacity(items.len());
    let mut pos = 0usize;
    let mut pads = 0usize;
    let mut cur_expert: Option<(String, usize)> = None;
    let push_pad = |entries: &mut Vec<Entry>, pads: &mut usize, at: usize, len: usize| {
        if len > 0 {
            entries.push(Entry {
                name: format!("{PAD_PREFIX}{pads}"),
                dtype: DType::U8,
                shape: vec![len],
                start: at,
                end: at + len,
            });
            *pads += 1;
        }
    };
    let close_expert = |entries: &mut Vec<Entry>,
                        pads: &mut usize,
                        pos: &mut usize,
                        cur: &mut Option<(String, usize)>,
                        meta: &mut ContainerMeta| {
        if let Some((name, start)) = cur.take() {
            let end = align_up(*pos, EXPERT_ALIGN);
            push_pad(entries, pads, *pos, end - *pos);
            *pos = end;
            meta.experts.push(ExpertExtent {
                name,
                offset: start as u64,
                length: (end - start) as u64,
            });
        }
    };
    for item in items {
        let expert = is_routed_expert(&item.name).map(|s| s.to_string());
        let prev = pos;
        if expert != cur_expert.as_ref().map(|c| c.0.clone()) {
            close_expert(
                &mut entries,
                &mut pads,
                &mut pos,
                &mut cur_expert,
                &mut meta,
            );
            if let Some(e) = expert {
                let start = align_up(pos, EXPERT_ALIGN);
                push_pad(&mut entries, &mut pads, pos, start - pos);
                pos = start;
                if meta.experts.iter().any(|x| x.name == e) {
                    return Err(Error::invalid(
                        "items",
                        format!("expert {e} is not contiguous"),
                    ));
                }
                cur_expert = Some((e, start));
            }
        }
        // Filler written before this item: the end of the previous expert and the start of
        // this one, both rounded to 4096.
        let pad_before = pos - prev;
        let (dtype, nbytes) = item.dtype_and_bytes();
        let (rows, cols) = item.rows_cols();
        placements.push((pos, pad_before));
        let shape = if item.format.is_quantized() {
            vec![rows, item.format.row_bytes(cols)]
        } else {
            item.shape.clone()
        };
        entries.push(Entry {
            name: item.name.clone(),
            dtype,
            shape,
            start: pos,
            end: pos + nbytes,
        });
        pos += nbytes;
        if let Some(st) = item.format.scale_type() {
            let n = rows * item.format.groups_per_row(cols);
            entries.push(Entry {
                name: format!("{}{SCALES_SUFFIX}", item.name),
                dtype: if st.size() == 4 {
                    DType::F32
                } else {
                    DType::F16
                },
                shape: vec![n],
                start: pos,
                end: pos + n * st.size(),
            });
            pos += n * st.size();
        }
        meta.tensors.insert(
            item.name.clone(),
            TensorRecord::for_format(item.format, item.shape.clone()),
        );
    }
    let before_close = pos;
    close_expert(
        &mut entries,
        &mut pads,
        &mut pos,
        &mut cur_expert,
        &mut meta,
    );
    let trailing_pad = pos - before_close;

    // The header's size depends on the absolute extents it records, which depend on the
    // header's size: grow the reserved header in 4096-byte steps until it fits.
    let mut reserved = EXPERT_ALIGN;
    loop {
        let data_start = reserved;
        let mut m = meta.clone();
        for e in &mut m.experts {
            e.offset += data_start as u64;
        }
        let json = header_json(&m, &entries);
        if 8 + json.len() <= data_start {
            let mut header = Vec::with_capacity(data_start);
            header.extend_from_slice(&((data_start - 8) as u64).to_le_bytes());
            header.extend_from_slice(json.as_bytes());
            header.resize(data_start, b' ');
            return Ok(Layout {
                header,
                file_len: (data_start + pos) as u64,
                placements,
                trailing_pad,
            });
        }
        reserved = align_up(8 + json.len(), EXPERT_ALIGN);
    }
}

fn header_json(meta: &ContainerMeta, entries: &[Entry]) -> String {
    let mut s = String::from("{\"__metadata__\":");
    s.push_str(&serde_json::to_string(&meta.to_metadata()).expect("string map"));
    for e in entries {
        s.push(',');
        s.push_str(&serde_json::to_string(&e.name).expect("string"));
        s.push_str(&format!(
            ":{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{},{}]}}",
            e.dtype.name(),
            serde_json::to_string(&e.shape).expect("ints"),
            e.start,
            e.end
        ));
    }
    s.push('}');
    s
}

/// Writes a part to `path` (through `path.partial`, fsynced, renamed into place), calling
/// `progress` with the bytes written. Items are produced `batch` at a time in parallel.
pub fn write_part(
    path: &Path,
    items: &[Item<'_>],
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Layout> {
    let lay = layout(items)?;
    let tmp = path.with_extension("safetensors.partial");
    let f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let mut w = std::io::BufWriter::with_capacity(8 << 20, f);
    let io = |e| Error::io(&tmp, e);
    w.write_all(&lay.header).map_err(io)?;
    progress(lay.header.len() as u64);
    let zeros = vec![0u8; EXPERT_ALIGN];
    // Enough items in flight to keep every core busy, few enough to bound memory.
    let batch = (rayon::current_num_threads() * 2).max(4);
    for (bi, chunk) in items.chunks(batch).enumerate() {
        let produced: Vec<(Vec<u8>, Vec<u8>)> = chunk.par_iter().map(|it| it.produce()).collect();
        for (k, (data, scales)) in produced.into_iter().enumerate() {
            let (_, pad) = lay.placements[bi * batch + k];
            w.write_all(&zeros[..pad]).map_err(io)?;
            w.write_all(&data).map_err(io)?;
            w.write_all(&scales).map_err(io)?;
            progress((pad + data.len() + scales.len()) as u64);
        }
    }
    w.write_all(&zeros[..lay.trailing_pad]).map_err(io)?;
    progress(lay.trailing_pad as u64);
    let f = w
        .into_inner()
        .map_err(|e| Error::io(&tmp, e.into_error()))?;
    f.sync_all().map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    if len != lay.file_len {
        return Err(Error::CorruptFile {
            file: tmp.clone(),
            msg: format!("wrote {len} bytes, the layout says {}", lay.file_len),
        });
    }
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    Ok(lay)
}

/// FNV-1a, 64 bit: a cheap fingerprint of headers and plans (not a security measure).
pub fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Writes `bytes` to `path` atomically (temp file, fsync, rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    f.write_all(bytes).map_err(|e| Error::io(&tmp, e))?;
    f.sync_all().map_err(|e| Error::io(&tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}
