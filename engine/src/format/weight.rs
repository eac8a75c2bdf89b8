//! The weight formats: how a matrix's elements and scales are stored (docs/FORMAT.md), the
//! vocabulary every layer shares, from the kernels and quantizers up to the containers.

/// Elements per activation-quantization block (and per int2 packing block).
pub const QBLOCK: usize = 32;

/// Elements `b*32 .. min((b+1)*32, cols)`.
#[inline]
pub fn block_range(b: usize, cols: usize) -> std::ops::Range<usize> {
    b * QBLOCK..((b + 1) * QBLOCK).min(cols)
}

/// Width of the per-group (or per-row) scales of a quantized matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleType {
    F32,
    F16,
    /// One byte, a power of two `2^(e - 127)` (OCP microscaling E8M0: MXFP4's scales).
    E8M0,
    /// bfloat16: the scales of compressed-tensors checkpoints as published
    /// ([`WeightFormat::I4Ct`]).
    BF16,
}

impl ScaleType {
    pub fn size(self) -> usize {
        match self {
            ScaleType::F32 => 4,
            ScaleType::F16 => 2,
            ScaleType::E8M0 => 1,
            ScaleType::BF16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ScaleType::F32 => "f32",
            ScaleType::F16 => "f16",
            ScaleType::E8M0 => "e8m0",
            ScaleType::BF16 => "bf16",
        }
    }
}

/// Storage format of a matrix's elements. The quantized formats are described byte by
/// byte in docs/FORMAT.md; `group == 0` means one group spanning the whole row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    BF16,
    F16,
    /// int8, symmetric, one f32 scale per row.
    I8Row,
    /// int8, symmetric, one scale per `group` elements of a row (a multiple of 32): for
    /// dense matrices, where one scale per row is too coarse (docs/FORMAT.md).
    I8 {
        group: u32,
        scale: ScaleType,
    },
    /// int4, symmetric, stored as `q + 8` in a nibble, even element in the low nibble;
    /// one scale per `group` elements of a row.
    I4 {
        group: u32,
        scale: ScaleType,
    },
    /// [`I4`](Self::I4) with its rows interleaved by 8 (`int4-rows8`, [`crate::rows8`]): per
    /// group of 8 rows and pair of 32-element blocks, 8 words of 32 bytes, word `u` holding
    /// bytes `4u..4u + 4` of the pair in rows 0–7 side by side; the scales of a group's 8 rows
    /// side by side per scale unit. The same codes and scales, so the same products as
    /// [`I4`](Self::I4), but one contiguous stream puts 8 rows in the lanes of a vector, for
    /// decode as for prefill. Groups of 32 or 64, rows a multiple of 8, columns of 64.
    I4Rows8 {
        group: u32,
        scale: ScaleType,
    },
    /// int5, symmetric, code `c` in 0..32 meaning `(c - 16) * scale`, one scale per `group`
    /// elements of a row (`crate::kernels::int5`): a row's low 4 bits as [`I4`](Self::I4)
    /// packs its nibbles, then its high bits, one per element, in the order the int4 SIMD
    /// paths unpack nibbles (per pair of 32-element blocks). 5.5 bits a weight with f16
    /// scales per 32: for the output head, which decode reads whole for every token and int4
    /// leaves too coarse (docs/FORMAT.md).
    I5 {
        group: u32,
        scale: ScaleType,
    },
    /// int2: code `c` in 0..4 means `(c - 1.5) * scale`; four codes per byte, laid out per
    /// 32-element block so one shift+mask yields 8 consecutive elements (docs/FORMAT.md).
    I2 {
        group: u32,
        scale: ScaleType,
    },
    /// int3 as the colibri C engine stores it: groups of 64 elements in 24 bytes each, 16
    /// bytes of low 2-bit codes (element `j` of the group in bits `2(j%4)` of byte `j/4`)
    /// then 8 bytes of high bits (element `j` in bit `j%8` of byte `16 + j/8`); code `c` in
    /// 0..8 means `(c - 4) * scale`; one f32 scale per group. A row's last group is padded.
    I3G64,
    /// int2 as the colibri C engine stores it: code `c` in 0..4 means `(c - 2) * scale`,
    /// four codes per byte (element `j` in bits `2(j%4)` of byte `j/4`), one f32 scale per
    /// row. (colibri's own [`I2`](Self::I2) is symmetric and interleaved per 32 elements.)
    I2Plain,
    /// MXFP4 (OCP microscaling FP4) as gpt-oss publishes its experts: per block of 32
    /// elements 16 bytes of FP4 e2m1 codes (element `2k` in the low nibble of byte `k`) and
    /// one E8M0 scale byte (`format::mxfp4`); a row's last block may be partial.
    Mxfp4,
    /// int4 as compressed-tensors' `pack-quantized` format stores it (Kimi-K2-Thinking,
    /// Kimi-K2.5's experts, llm-compressor's W4A16): `weight_packed` holds eight codes `q + 8`
    /// per little-endian int32, element `8w + i` in bits `4i` of word `w` — byte for byte
    /// [`I4`](Self::I4)'s nibbles; one scale (`weight_scale`, as published: bf16) per `group`
    /// elements of a row. What differs is the value: compressed-tensors dequantizes in the
    /// scale's dtype, so an element is `q × scale` rounded to that dtype (bf16: to 8
    /// significant bits), the value transformers computes with (`format::ct_int4`).
    I4Ct {
        group: u32,
        scale: ScaleType,
    },
}

impl WeightFormat {
    /// Bytes of one row of `cols` elements (scales not included).
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            WeightFormat::F32 => cols * 4,
            WeightFormat::BF16 | WeightFormat::F16 => cols * 2,
            WeightFormat::I8Row | WeightFormat::I8 { .. } => cols,
            WeightFormat::I4 { .. } | WeightFormat::I4Rows8 { .. } | WeightFormat::I4Ct { .. } => {
                cols.div_ceil(2)
            }
            WeightFormat::I5 { .. } => cols.div_ceil(2) + cols.div_ceil(8),
            WeightFormat::I2 { .. } | WeightFormat::I2Plain => cols.div_ceil(4),
            WeightFormat::I3G64 => cols.div_ceil(64) * 24,
            WeightFormat::Mxfp4 => cols.div_ceil(32) * 16,
        }
    }

    /// Elements per scale for a row of `cols` elements (`None` for unscaled formats).
    pub fn group_len(self, cols: usize) -> Option<usize> {
        match self {
            WeightFormat::F32 | WeightFormat::BF16 | WeightFormat::F16 => None,
            WeightFormat::I8Row | WeightFormat::I2Plain => Some(cols.max(1)),
            WeightFormat::I3G64 => Some(64),
            WeightFormat::Mxfp4 => Some(32),
            WeightFormat::I8 { group, .. }
            | WeightFormat::I4 { group, .. }
            | WeightFormat::I4Rows8 { group, .. }
            | WeightFormat::I5 { group, .. }
            | WeightFormat::I4Ct { group, .. }
            | WeightFormat::I2 { group, .. } => Some(if group == 0 {
                cols.max(1)
            } else {
                group as usize
            }),
        }
    }

    /// Scales per row (0 for unscaled formats).
    pub fn groups_per_row(self, cols: usize) -> usize {
        self.group_len(cols).map_or(0, |g| cols.div_ceil(g))
    }

    pub fn scale_type(self) -> Option<ScaleType> {
        match self {
            WeightFormat::F32 | WeightFormat::BF16 | WeightFormat::F16 => None,
            WeightFormat::I8Row | WeightFormat::I3G64 | WeightFormat::I2Plain => {
                Some(ScaleType::F32)
            }
            WeightFormat::Mxfp4 => Some(ScaleType::E8M0),
            WeightFormat::I8 { scale, .. }
            | WeightFormat::I4 { scale, .. }
            | WeightFormat::I4Rows8 { scale, .. }
            | WeightFormat::I5 { scale, .. }
            | WeightFormat::I4Ct { scale, .. }
            | WeightFormat::I2 { scale, .. } => Some(scale),
        }
    }

    /// Bytes of the scales of one row.
    pub fn scale_row_bytes(self, cols: usize) -> usize {
        self.scale_type()
            .map_or(0, |s| s.size() * self.groups_per_row(cols))
    }

    pub fn is_quantized(self) -> bool {
        self.scale_type().is_some()
    }

    /// The format of one row on its own: [`I4`](Self::I4) for [`I4Rows8`](Self::I4Rows8)
    /// (whose rows [`crate::rows8::gather_row`] takes out), else the format itself.
    pub fn row_major(self) -> WeightFormat {
        match self {
            WeightFormat::I4Rows8 { group, scale } => WeightFormat::I4 { group, scale },
            f => f,
        }
    }

    /// Whether rows are interleaved ([`I4Rows8`](Self::I4Rows8)): a row's bytes are not
    /// contiguous.
    pub fn interleaved(self) -> bool {
        matches!(self, WeightFormat::I4Rows8 { .. })
    }

    /// The short name used in container metadata and on the command line.
    pub fn name(self) -> String {
        match self {
            WeightFormat::F32 => "f32".into(),
            WeightFormat::BF16 => "bf16".into(),
            WeightFormat::F16 => "f16".into(),
            WeightFormat::I8Row => "int8".into(),
            WeightFormat::I8 { group: 0, .. } => "int8-row".into(),
            WeightFormat::I8 { group, .. } => format!("int8-g{group}"),
            WeightFormat::I4 { group: 0, .. } => "int4-row".into(),
            WeightFormat::I4 { group, .. } => format!("int4-g{group}"),
            WeightFormat::I4Rows8 { group, .. } => format!("int4-g{group}-rows8"),
            WeightFormat::I5 { group: 0, .. } => "int5-row".into(),
            WeightFormat::I5 { group, .. } => format!("int5-g{group}"),
            WeightFormat::I2 { group: 0, .. } => "int2-row".into(),
            WeightFormat::I2 { group, .. } => format!("int2-g{group}"),
            WeightFormat::I3G64 => "int3-g64".into(),
            WeightFormat::I2Plain => "int2-plain".into(),
            WeightFormat::Mxfp4 => "mxfp4".into(),
            WeightFormat::I4Ct { group: 0, .. } => "int4-ct-row".into(),
            WeightFormat::I4Ct { group, .. } => format!("int4-ct-g{group}"),
        }
    }
}
