//! Read planning: one expert's parts grouped into aligned reads, computed once at start.

use super::config::ExpertSpec;
use crate::experts::buf::ALIGN;
use std::ops::Range;

/// Parts of one file closer than this are read with one request (a gap costs less than a
/// second request).
pub(super) const MERGE_GAP: u64 = 64 << 10;

/// A precomputed read of one expert.
#[derive(Debug)]
pub(super) struct ReadPlan {
    pub(super) groups: Vec<ReadGroup>,
    /// Buffer length (each group starts on an [`ALIGN`] boundary of the buffer).
    pub(super) len: usize,
    pub(super) parts: Vec<Range<usize>>,
}

#[derive(Debug)]
pub(super) struct ReadGroup {
    pub(super) file: usize,
    /// Bytes wanted: `[start, end)` of the file.
    pub(super) start: u64,
    pub(super) end: u64,
    /// Buffer offset of `start` rounded down to [`ALIGN`].
    pub(super) buf_off: usize,
}

impl ExpertSpec {
    /// Bytes of the buffer one read of this expert fills (whole pages per read group).
    pub fn buffer_len(&self) -> u64 {
        let lens: Vec<u64> = (0..=self.parts.iter().map(|p| p.file).max().unwrap_or(0))
            .map(|_| u64::MAX)
            .collect();
        ReadPlan::new(self, &lens).map_or(0, |p| p.len as u64)
    }
}

impl ReadPlan {
    pub(super) fn new(
        spec: &ExpertSpec,
        file_lens: &[u64],
    ) -> std::result::Result<ReadPlan, String> {
        if spec.parts.is_empty() {
            return Err("an expert with no bytes".into());
        }
        for p in &spec.parts {
            let len = *file_lens
                .get(p.file)
                .ok_or_else(|| format!("file index {} out of range", p.file))?;
            if p.offset.checked_add(p.len).is_none_or(|e| e > len) {
                return Err(format!(
                    "extent [{}, +{}) runs past the end of the file ({len} bytes)",
                    p.offset, p.len
                ));
            }
        }
        let mut order: Vec<usize> = (0..spec.parts.len()).collect();
        order.sort_by_key(|&i| (spec.parts[i].file, spec.parts[i].offset));
        let mut groups: Vec<ReadGroup> = Vec::new();
        let mut group_of = vec![0usize; spec.parts.len()];
        for &i in &order {
            let p = spec.parts[i];
            match groups.last_mut() {
                Some(g) if g.file == p.file && p.offset <= g.end + MERGE_GAP => {
                    g.end = g.end.max(p.offset + p.len)
                }
                _ => groups.push(ReadGroup {
                    file: p.file,
                    start: p.offset,
                    end: p.offset + p.len,
                    buf_off: 0,
                }),
            }
            group_of[i] = groups.len() - 1;
        }
        let mut cursor = 0usize;
        for g in &mut groups {
            g.buf_off = cursor;
            let a0 = align_down(g.start);
            cursor += (align_up(g.end) - a0) as usize;
        }
        let parts = spec
            .parts
            .iter()
            .zip(&group_of)
            .map(|(p, &gi)| {
                let g = &groups[gi];
                let at = g.buf_off + (p.offset - align_down(g.start)) as usize;
                at..at + p.len as usize
            })
            .collect();
        Ok(ReadPlan {
            groups,
            len: cursor,
            parts,
        })
    }
}

pub(super) fn align_down(x: u64) -> u64 {
    x / ALIGN as u64 * ALIGN as u64
}
pub(super) fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN as u64) * ALIGN as u64
}
