//! Page-aligned owned buffers for expert bytes.
//!
//! Anonymous memory maps rather than the heap: they are page-aligned (O_DIRECT needs the
//! buffer aligned to the device's logical block, 4096 covers every device we meet) and
//! unmapping returns the memory to the system at once. Buffers of a few MB freed from the
//! heap can instead stay in the allocator's arenas, and RSS would drift above the budget.

use memmap2::MmapMut;
use std::ops::Range;

/// Alignment of buffer starts and of direct-I/O offsets and lengths.
pub const ALIGN: usize = 4096;

pub struct AlignedBuf {
    map: MmapMut,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes (the pages are not touched until written).
    pub fn new(len: usize) -> std::io::Result<AlignedBuf> {
        let map = MmapMut::map_anon(len.max(1).next_multiple_of(ALIGN))?;
        debug_assert_eq!(map.as_ptr() as usize % ALIGN, 0);
        Ok(AlignedBuf { map, len })
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes mapped (the length rounded up to whole pages).
    pub fn capacity(&self) -> usize {
        self.map.len()
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.map[..self.len]
    }
    /// The whole mapping, for reads that round their length up to [`ALIGN`].
    pub fn as_mut_full(&mut self) -> &mut [u8] {
        &mut self.map[..]
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// One expert's bytes as read from disk: the parts its [`super::ExpertSpec`] asked for, each
/// at a known range of one buffer.
#[derive(Debug)]
pub struct ExpertBuf {
    pub buf: AlignedBuf,
    pub parts: Vec<Range<usize>>,
}

impl ExpertBuf {
    pub fn part(&self, i: usize) -> &[u8] {
        &self.buf.as_slice()[self.parts[i].clone()]
    }
    /// Bytes held in RAM (whole pages).
    pub fn size_bytes(&self) -> usize {
        self.buf.capacity()
    }
}

impl AsRef<[u8]> for ExpertBuf {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0, 1, 4095, 4096, 4097, 3 << 20] {
            let mut b = AlignedBuf::new(len).unwrap();
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.len(), len);
            assert_eq!(b.capacity() % ALIGN, 0);
            assert!(b.capacity() >= len.max(1));
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_full()[0] = 7;
            if len > 0 {
                assert_eq!(b.as_slice()[0], 7);
            }
        }
    }
}
