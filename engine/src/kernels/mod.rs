//! Compute kernels: matrix products of weight rows in every storage format against
//! activation rows.
//!
//! Every format has a scalar reference ([`scalar`]) that defines the result. The SIMD level
//! is chosen once at run time ([`level`], `COLIBRI_ISA`), and every SIMD kernel is tested
//! against the reference (`tests.rs`).
//!
//! Activations are prepared once per input ([`Input`]) and shared by every matrix that reads
//! that input (q/k/v, gate/up): quantized to int8 per 32-element block for the integer
//! kernels, or permuted to match the int4 packing, lazily, the first time a matrix needs it.
//!
//! A product runs as register tiles of `R` weight rows × `T` activation rows ([`matmul`]):
//! each weight row is loaded and unpacked once per tile and applied to all `T` tokens. Every
//! (row, token) pair has its own accumulator and visits the row in the same order whatever
//! the tile shape, so a token's result does not depend on how many tokens were batched with
//! it (decode is the `T = 1` case of the same kernel).

pub mod int5;
pub mod lowbit;
pub mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_row;
#[cfg(target_arch = "x86_64")]
mod avx2_rows8;
#[cfg(target_arch = "x86_64")]
pub mod avx512_bf16;
#[cfg(target_arch = "aarch64")]
mod neon;

mod matmul;
pub mod team;

use crate::format::WeightFormat;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

pub use crate::format::{block_range, QBLOCK};
pub use matmul::{matmul, matmul_each, matmul_many, Weights};
pub use scalar::dot_f32 as dot_f32_scalar;

/// Which kernel family runs on this machine.
///
/// x86-64 levels form a ladder: `Scalar` < `Avx2` (AVX2+FMA+F16C) < `Avx512Vnni` (that, plus
/// AVX-512 F/BW/VL and VNNI). `Avx512Vnni` runs every AVX2 kernel and, where it has one, an
/// AVX-512 VNNI kernel instead (`vpdpbusd`: int4 × int8 in `avx2_rows8.rs`); both give the
/// scalar reference's bits there, so the level never changes a result. AVX-512 BF16 is
/// detected and reported, not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Scalar,
    Avx2,
    Avx512Vnni,
    Neon,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2+fma",
            Level::Avx512Vnni => "avx512-vnni",
            Level::Neon => "neon",
        }
    }

    /// Whether the AVX2+FMA+F16C kernels may run (every x86 level above scalar).
    #[inline]
    pub fn has_avx2(self) -> bool {
        matches!(self, Level::Avx2 | Level::Avx512Vnni)
    }

    /// Whether `self`, asked for, can run where `best` is the best supported level.
    fn runs_under(self, best: Level) -> bool {
        self == Level::Scalar || self == best || (self == Level::Avx2 && best.has_avx2())
    }
}

/// Whether this CPU has what [`Level::Avx512Vnni`] uses.
#[cfg(target_arch = "x86_64")]
fn avx512_vnni_supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// The best level this CPU supports.
fn best_supported() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return if avx512_vnni_supported() {
                Level::Avx512Vnni
            } else {
                Level::Avx2
            };
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Level::Neon;
        }
    }
    Level::Scalar
}

/// What `COLIBRI_ISA` (or the older `COLIBRI_KERNELS=scalar`) asks for, and a note when the
/// request cannot be honoured as written.
fn requested(isa: Option<&str>, kernels: Option<&str>) -> (Option<Level>, Option<String>) {
    if let Some(v) = isa {
        return match v.trim().to_ascii_lowercase().as_str() {
            "" | "auto" | "native" => (None, None),
            "scalar" | "reference" => (Some(Level::Scalar), None),
            "avx2" | "avx2+fma" => (Some(Level::Avx2), None),
            "neon" => (Some(Level::Neon), None),
            "avx512" | "avx512vnni" | "avx512-vnni" => (Some(Level::Avx512Vnni), None),
            _ => (
                None,
                Some(format!(
                    "COLIBRI_ISA={v} is not one of auto, avx512, avx2, neon, scalar; using the best level available"
                )),
            ),
        };
    }
    if kernels == Some("scalar") {
        return (Some(Level::Scalar), None);
    }
    (None, None)
}

/// The level to run: the best supported one, or a lower one forced by `COLIBRI_ISA=avx2|
/// scalar` (for comparisons; `avx512` names the top x86 level). A level above what the CPU supports is never chosen.
pub fn detect() -> Level {
    let isa = std::env::var("COLIBRI_ISA").ok();
    let kernels = std::env::var("COLIBRI_KERNELS").ok();
    let (want, note) = requested(isa.as_deref(), kernels.as_deref());
    if let Some(n) = note {
        eprintln!("colibri: {n}");
    }
    let best = best_supported();
    match want {
        None => best,
        Some(Level::Scalar) => Level::Scalar,
        Some(w) if w.runs_under(best) => w,
        Some(w) => {
            eprintln!(
                "colibri: COLIBRI_ISA asks for {} but this CPU runs {}; using {}",
                w.name(),
                best.name(),
                best.name()
            );
            best
        }
    }
}

/// The kernel family in use (detected once, then cached).
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}

/// Whether the AVX2+FMA+F16C kernels run (the vector helpers outside this module ask it).
#[inline]
pub fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        level().has_avx2()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The SIMD features of this CPU that matter to the kernels (present, not necessarily used).
pub fn cpu_features() -> Vec<&'static str> {
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! have {
            ($($f:tt),*) => {
                $(if is_x86_feature_detected!($f) { v.push($f); })*
            };
        }
        have!(
            "avx2",
            "fma",
            "f16c",
            "avxvnni",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512vnni",
            "avx512bf16"
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            v.push("neon");
        }
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            v.push("dotprod");
        }
    }
    v
}

/// One line for `coli doctor` / `coli bench`: the level that runs and why.
pub fn isa_report() -> String {
    let l = level();
    let feats = cpu_features();
    let mut s = format!("kernels {}", l.name());
    if l == Level::Scalar && best_supported() != Level::Scalar {
        s.push_str(&format!(
            " (forced; this CPU could run {})",
            best_supported().name()
        ));
    }
    if l == Level::Avx2 && best_supported() == Level::Avx512Vnni {
        s.push_str(" (forced; this CPU could run avx512-vnni)");
    } else if l == Level::Avx2 && feats.contains(&"avx512f") {
        s.push_str(" (AVX-512 present without VNNI/BW/VL: the AVX2 kernels run)");
    }
    if l == Level::Avx512Vnni {
        s.push_str(" (int4 × int8 on vpdpbusd; other formats on the AVX2 kernels)");
    }
    if bf16_act() {
        s.push_str(" · bf16 × bf16 activations on vdpbf16ps (COLIBRI_BF16_ACT=1)");
    } else if bf16_act_requested() {
        s.push_str(" · COLIBRI_BF16_ACT=1 ignored: needs the avx512-vnni level and AVX-512 BF16");
    }
    s
}

/// Whether bf16 matrices take bf16 activations on AVX-512 BF16 (`vdpbf16ps`,
/// `avx512_bf16.rs`): `COLIBRI_BF16_ACT=1` asks for it, read once; it runs only on the
/// `avx512-vnni` level of a CPU with AVX-512 BF16. Off (the default), bf16 matrices multiply
/// f32 activations. The activations' rounding changes the results (docs/PERFORMANCE.md
/// measures it), so it is a per-process choice: decode, batched decode and prefill agree
/// bit for bit either way.
pub fn bf16_act() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| bf16_act_requested() && bf16_act_supported())
}

/// Whether `COLIBRI_BF16_ACT=1` asks for [`bf16_act`] (honoured or not).
fn bf16_act_requested() -> bool {
    std::env::var("COLIBRI_BF16_ACT").is_ok_and(|v| v == "1")
}

/// Whether this CPU and level can run [`bf16_act`]'s kernels.
pub fn bf16_act_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        level() == Level::Avx512Vnni && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// When quantized matrices get int8 activations (per 32-element block) and integer dot
/// products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Act {
    /// Never: exact f32 activations everywhere.
    Off,
    /// Routed experts in int4 and int2, and dense matrices in grouped int8 (the default).
    /// Measured on every fixture family, it moves the mean KL divergence from
    /// transformers by under 1% of what the int4 weights themselves cost, and it is what
    /// lets int4 matvec run at memory speed (docs/FORMAT.md). Per-row int8 keeps f32
    /// activations: there it doubles the (small) divergence.
    SubByte,
    /// For every quantized matrix, per-row int8 too.
    All,
}

// 0 = not yet read from the environment, else 1 + the mode's index.
static INT8_ACT: AtomicU8 = AtomicU8::new(0);

/// The int8-activation policy: `COLIBRI_INT8_ACT=0|1|subbyte` (off, all, the default) or
/// [`set_int8_activations`]. Read when a model is loaded.
pub fn int8_act_mode() -> Int8Act {
    let modes = [Int8Act::Off, Int8Act::SubByte, Int8Act::All];
    match INT8_ACT.load(Ordering::Relaxed) {
        0 => {
            let m = match std::env::var("COLIBRI_INT8_ACT").as_deref() {
                Ok("0") | Ok("off") | Ok("false") => Int8Act::Off,
                Ok("1") | Ok("all") | Ok("true") => Int8Act::All,
                _ => Int8Act::SubByte,
            };
            set_int8_act_mode(m);
            m
        }
        v => modes[(v - 1) as usize],
    }
}

pub fn set_int8_act_mode(m: Int8Act) {
    let v = match m {
        Int8Act::Off => 1,
        Int8Act::SubByte => 2,
        Int8Act::All => 3,
    };
    INT8_ACT.store(v, Ordering::Relaxed);
}

/// `true`: int8 activations for every quantized matrix; `false`: none.
pub fn set_int8_activations(on: bool) {
    set_int8_act_mode(if on { Int8Act::All } else { Int8Act::Off });
}

/// Whether int4 with a scale per 32 or 64 elements and int8 activations runs on the 8-row
/// kernels (`avx2_rows8.rs`): `COLIBRI_INT4_ROWS8=0` turns them off, read once.
///
/// They compute the scalar reference's bits and prefill 1.3–1.9× faster (8 rows in the lanes
/// of a vector keep a block's sums in int16); their decode streams the same bytes about 9%
/// slower than the one-row kernel of `avx2.rs` on the OLMoE-1B-7B synth (docs/PERFORMANCE.md).
/// Off, that kernel and the tiles run, in their own summation order. Either way decode,
/// batched decode and prefill agree bit for bit: the choice is per process, never per call.
pub fn int4_rows8() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("COLIBRI_INT4_ROWS8").as_deref(),
            Ok("0") | Ok("off") | Ok("false")
        )
    })
}

/// Whether a matrix stored in `format` gets int8 activations under the policy. Routed
/// experts and dense matrices are treated alike: what decides is the format (int4, int2 and
/// grouped int8 were quantized with int8 activations in mind; per-row int8 was not).
pub fn int8_act_for(format: WeightFormat) -> bool {
    let format = format.row_major();
    match int8_act_mode() {
        Int8Act::Off => false,
        Int8Act::All => format.is_quantized(),
        Int8Act::SubByte => matches!(
            format,
            WeightFormat::I4 { .. }
                | WeightFormat::I5 { .. }
                | WeightFormat::I2 { .. }
                | WeightFormat::I8 { .. }
                | WeightFormat::I3G64
                | WeightFormat::I2Plain
        ),
    }
}

/// Whether int8 activations can be used with `format` on rows of `cols`: quantized weights
/// whose scale groups are whole 32-element blocks (or one group per row).
pub fn q8_supported(format: WeightFormat, cols: usize) -> bool {
    format.is_quantized()
        && format
            .group_len(cols)
            .is_some_and(|g| g % QBLOCK == 0 || g >= cols)
}

/// One activation row quantized to int8 per 32-element block: `x[j] ≈ q[j] * d[j / 32]`.
#[derive(Clone, Copy, Debug)]
pub struct Q8Row<'a> {
    /// Natural order.
    pub q: &'a [i8],
    /// One scale per block (the last block may be partial).
    pub d: &'a [f32],
    /// `sum(q)` per block (the offset correction of the int4/int2 codes).
    pub qsum: &'a [i32],
}

/// One activation row of an [`Input`] as the reference kernels see it (borrowed).
#[derive(Clone, Copy, Debug)]
pub struct ActRow<'a> {
    pub x: &'a [f32],
    /// Present when the matrix uses int8 activations.
    pub q8: Option<Q8Row<'a>>,
}

/// Quantized activations as the reference kernels read them (either form).
pub trait Q8View {
    fn q(&self) -> &[i8];
    fn d(&self) -> &[f32];
}

impl Q8View for Q8Row<'_> {
    fn q(&self) -> &[i8] {
        self.q
    }
    fn d(&self) -> &[f32] {
        self.d
    }
}

impl Q8View for Q8Act {
    fn q(&self) -> &[i8] {
        &self.q
    }
    fn d(&self) -> &[f32] {
        &self.d
    }
}

// The per-row API (one owned prepared row per call): the per-row kernels (NEON, formats
// without tiles) and the reference fallback use it; the tiles use `Input`.

/// Activations quantized to int8 per 32-element block: `x[j] ≈ q[j] * d[j / 32]`.
#[derive(Clone, Debug, Default)]
pub struct Q8Act {
    /// Natural order.
    pub q: Vec<i8>,
    /// One scale per block (the last block may be partial).
    pub d: Vec<f32>,
    /// `sum(q)` per block (the offset correction of the int4/int2 codes).
    pub qsum: Vec<i32>,
    /// int4 SIMD order: per pair of full blocks A, B: `[A even | B even | A odd | B odd]`
    /// (int3-g64, int2-plain and int5 have their own orders: `lowbit::order_q8`, `int5::order_q8`).
    pub qp: Vec<i8>,
    /// int4 SIMD: per pair, the block scales as the 8 lanes of the pair's sums `[dA×4, dB×4]`.
    pub d8: Vec<f32>,
    /// int4 SIMD: per pair, the code offset `8·sum(q)` of A in lane 0 and of B in lane 4, so
    /// the correction is one integer subtraction.
    pub corr8: Vec<i32>,
}

/// One activation row prepared for one weight format.
#[derive(Clone, Debug, Default)]
pub struct Act {
    /// The activations, natural order.
    pub x: Vec<f32>,
    /// int4 f32 path: per full block, `[even 0..16 | odd 0..16 | even 16..32 | odd 16..32]`.
    pub xp: Vec<f32>,
    /// Sum of `x` per full block (offset correction of the int4/int2 codes).
    pub bsum: Vec<f32>,
    pub q8: Option<Q8Act>,
}

/// Quantizes `x` per 32-element block ([`quantize_row`]), with the int4 order if asked.
pub fn quantize_act(x: &[f32], with_int4_order: bool) -> Q8Act {
    let nb = x.len().div_ceil(QBLOCK);
    let mut a = Q8Act {
        q: vec![0; x.len()],
        d: vec![0.0; nb],
        qsum: vec![0; nb],
        ..Default::default()
    };
    quantize_row(x, &mut a.q, &mut a.d, &mut a.qsum);
    if with_int4_order {
        let pairs = x.len() / QBLOCK / 2;
        a.qp = vec![0; pairs * 64];
        a.d8 = vec![0.0; pairs * 8];
        a.corr8 = vec![0; pairs * 8];
        for p in 0..pairs {
            for k in 0..4 {
                a.d8[p * 8 + k] = a.d[2 * p];
                a.d8[p * 8 + 4 + k] = a.d[2 * p + 1];
            }
            a.corr8[p * 8] = 8 * a.qsum[2 * p];
            a.corr8[p * 8 + 4] = 8 * a.qsum[2 * p + 1];
            let out = &mut a.qp[p * 64..(p + 1) * 64];
            for (h, blk) in [2 * p, 2 * p + 1].into_iter().enumerate() {
                let q = &a.q[blk * QBLOCK..(blk + 1) * QBLOCK];
                for k in 0..16 {
                    out[h * 16 + k] = q[2 * k];
                    out[32 + h * 16 + k] = q[2 * k + 1];
                }
            }
        }
    }
    a
}

/// Prepares one activation row for `format`. `int8` asks for quantized activations; it is
/// honoured only where [`q8_supported`].
pub fn prepare(format: WeightFormat, x: &[f32], int8: bool) -> Act {
    let format = format.row_major();
    let cols = x.len();
    let full = cols / QBLOCK;
    let mut act = Act {
        x: x.to_vec(),
        ..Default::default()
    };
    if int8 && q8_supported(format, cols) {
        let mut q = quantize_act(x, matches!(format, WeightFormat::I4 { .. }));
        if matches!(format, WeightFormat::I3G64 | WeightFormat::I2Plain) {
            lowbit::order_q8(format, &mut q);
        }
        if matches!(format, WeightFormat::I5 { .. }) {
            int5::order_q8(&mut q);
        }
        act.q8 = Some(q);
        return act;
    }
    if matches!(
        format,
        WeightFormat::I4 { .. }
            | WeightFormat::I2 { .. }
            | WeightFormat::I3G64
            | WeightFormat::I2Plain
    ) {
        act.bsum = (0..full)
            .map(|b| x[b * QBLOCK..(b + 1) * QBLOCK].iter().sum())
            .collect();
    }
    if matches!(format, WeightFormat::I4 { .. }) {
        act.xp = vec![0.0; full * QBLOCK];
        for b in 0..full {
            let src = &x[b * QBLOCK..(b + 1) * QBLOCK];
            let dst = &mut act.xp[b * QBLOCK..(b + 1) * QBLOCK];
            for half in 0..2 {
                for k in 0..8 {
                    dst[half * 16 + k] = src[half * 16 + 2 * k];
                    dst[half * 16 + 8 + k] = src[half * 16 + 2 * k + 1];
                }
            }
        }
    }
    act
}

/// `n` activation rows quantized per block (natural order), back to back.
#[derive(Clone, Debug, Default)]
pub struct Q8Rows {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub qsum: Vec<i32>,
}

/// Tokens per packed tile of activations.
pub const TILE: usize = 8;

/// Activations packed for the SIMD tiles, as GEMM libraries pack their second operand:
/// tokens in tiles of [`TILE`] (the last may hold fewer), and within a tile unit after unit
/// (a 32-element block, or an int4 pair of blocks), each unit holding its tokens side by
/// side. A tile's units are contiguous, so a kernel walks them with one pointer and a small
/// constant stride, and a token's place within the unit is a constant offset.
/// `at(t, u)` is the index, in units of one token's unit, of token `t`'s unit `u`.
#[derive(Clone, Copy, Debug)]
pub struct Packing {
    pub n: usize,
    /// Units per token.
    pub units: usize,
}

impl Packing {
    /// Tokens in the tile holding token `t`.
    #[inline(always)]
    pub fn slots(&self, t: usize) -> usize {
        (self.n - t / TILE * TILE).min(TILE)
    }
    /// Index of token `t`'s unit 0; unit `u` is `slots(t) · u` further.
    #[inline(always)]
    pub fn base(&self, t: usize) -> usize {
        t / TILE * TILE * self.units + t % TILE
    }
    #[inline(always)]
    pub fn at(&self, t: usize, u: usize) -> usize {
        self.base(t) + u * self.slots(t)
    }
}

/// f32 activations packed by 32-element block ([`Packing`]; full blocks only), in natural
/// order or in int4 order: per block `[even 0..16 | odd 0..16 | even 16..32 | odd 16..32]`,
/// read as four 8-lane chunks: low nibbles of bytes 0..8, high nibbles of bytes 0..8, low of
/// 8..16, high of 8..16.
#[derive(Clone, Debug, Default)]
pub struct F32Panel {
    pub x: Vec<f32>,
}

/// Quantized activations packed by 32-element block ([`Packing`]; full blocks only): codes
/// (32 per unit), scales and sums (one per unit).
#[derive(Clone, Debug, Default)]
pub struct Q8Panel {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub qsum: Vec<i32>,
}

/// Quantized activations in int4 order, packed by pair of full blocks A, B ([`Packing`]):
/// `qp` = 64 codes `[A even | B even | A odd | B odd]` (matching the nibbles of 32 packed
/// bytes), `d8` = the block scales as the 8 lanes of the pair's sums `[dA×4, dB×4]`,
/// `corr8` = the code offset `8·sum(q)` of A in lane 0 and of B in lane 4 (so the
/// correction is one integer subtraction).
#[derive(Clone, Debug, Default)]
pub struct Q8I4Panel {
    pub qp: Vec<i8>,
    pub d8: Vec<f32>,
    pub corr8: Vec<i32>,
    /// Per token (natural order, `pairs` each) the pair's offset in f32,
    /// `8·(dA·sum(qA) + dB·sum(qB))`, for kernels that subtract it once per row.
    pub cp: Vec<f32>,
}

/// Activation rows prepared once for every matrix that reads them. The f32 rows are
/// borrowed; the other forms are made on first use (thread-safe) and kept.
pub struct Input<'a> {
    pub x: &'a [f32],
    pub n: usize,
    pub cols: usize,
    q8: OnceLock<Q8Rows>,
    q8_panel: OnceLock<Q8Panel>,
    q8_i4: OnceLock<Q8I4Panel>,
    x_panel: OnceLock<F32Panel>,
    x_i4: OnceLock<F32Panel>,
    /// The rows rounded to bf16, each padded with zeros to whole 16-column chunks
    /// ([`Input::x_bf16`]).
    x_bf16: OnceLock<(Vec<u16>, usize)>,
    /// Rows prepared one by one for the per-row kernels, per (format, int8).
    per_row: Mutex<Vec<PerRow>>,
}

type PerRow = ((WeightFormat, bool), Arc<[Act]>);

impl<'a> Input<'a> {
    /// `n` rows of `x.len() / n` activations.
    pub fn new(x: &'a [f32], n: usize) -> Input<'a> {
        Input::with_cols(x, n, x.len().checked_div(n).unwrap_or(0))
    }

    /// `n` rows of `cols` activations (`n` may be 0).
    pub fn with_cols(x: &'a [f32], n: usize, cols: usize) -> Input<'a> {
        assert_eq!(
            x.len(),
            n * cols,
            "activations: {} values are not {n} rows of {cols}",
            x.len()
        );
        Input {
            x,
            n,
            cols,
            q8: OnceLock::new(),
            q8_panel: OnceLock::new(),
            q8_i4: OnceLock::new(),
            x_panel: OnceLock::new(),
            x_i4: OnceLock::new(),
            x_bf16: OnceLock::new(),
            per_row: Mutex::new(Vec::new()),
        }
    }

    /// Every row prepared for `format`'s per-row kernels (made on first use, then shared by
    /// every task that reads this input).
    pub fn acts(&self, format: WeightFormat, int8: bool) -> Arc<[Act]> {
        // Interleaved int4 takes the activations of int4 (its rows are int4 rows).
        let format = format.row_major();
        let key = (format, int8);
        let mut made = self.per_row.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, a)) = made.iter().find(|(k, _)| *k == key) {
            return a.clone();
        }
        let a: Arc<[Act]> = (0..self.n)
            .map(|t| prepare(format, self.row(t), int8))
            .collect();
        made.push((key, a.clone()));
        a
    }

    /// Row `t`, f32.
    #[inline]
    pub fn row(&self, t: usize) -> &'a [f32] {
        &self.x[t * self.cols..(t + 1) * self.cols]
    }

    /// Blocks per row (the last may be partial).
    #[inline]
    pub fn blocks(&self) -> usize {
        self.cols.div_ceil(QBLOCK)
    }

    /// The rows quantized to int8 per block (computed on first use).
    pub fn q8(&self) -> &Q8Rows {
        self.q8.get_or_init(|| {
            let (cols, nb) = (self.cols, self.blocks());
            let mut r = Q8Rows {
                q: vec![0; self.n * cols],
                d: vec![0.0; self.n * nb],
                qsum: vec![0; self.n * nb],
            };
            let work = |t: usize, q: &mut [i8], d: &mut [f32], s: &mut [i32]| {
                quantize_row(self.row(t), q, d, s)
            };
            if self.n * cols >= 1 << 16 {
                use rayon::prelude::*;
                r.q.par_chunks_mut(cols.max(1))
                    .zip(r.d.par_chunks_mut(nb.max(1)))
                    .zip(r.qsum.par_chunks_mut(nb.max(1)))
                    .enumerate()
                    .for_each(|(t, ((q, d), s))| work(t, q, d, s));
            } else {
                for t in 0..self.n {
                    work(
                        t,
                        &mut r.q[t * cols..(t + 1) * cols],
                        &mut r.d[t * nb..(t + 1) * nb],
                        &mut r.qsum[t * nb..(t + 1) * nb],
                    );
                }
            }
            r
        })
    }

    /// How the block panels are packed.
    pub fn blocks_packing(&self) -> Packing {
        Packing {
            n: self.n,
            units: self.cols / QBLOCK,
        }
    }

    /// How the int4 pair panel is packed.
    pub fn pairs_packing(&self) -> Packing {
        Packing {
            n: self.n,
            units: self.cols / QBLOCK / 2,
        }
    }

    /// The quantized rows packed by block for the SIMD tiles (computed on first use).
    pub fn q8_panel(&self) -> &Q8Panel {
        self.q8_panel.get_or_init(|| {
            let a = self.q8();
            let (cols, nb) = (self.cols, self.blocks());
            let pk = self.blocks_packing();
            let len = pk.units * self.n;
            let mut r = Q8Panel {
                q: vec![0; len * QBLOCK],
                d: vec![0.0; len],
                qsum: vec![0; len],
            };
            for t in 0..self.n {
                for b in 0..pk.units {
                    let (i, src) = (pk.at(t, b), t * cols + b * QBLOCK);
                    r.q[i * QBLOCK..(i + 1) * QBLOCK].copy_from_slice(&a.q[src..src + QBLOCK]);
                    r.d[i] = a.d[t * nb + b];
                    r.qsum[i] = a.qsum[t * nb + b];
                }
            }
            r
        })
    }

    /// The quantized rows in int4 SIMD order (computed on first use).
    pub fn q8_i4(&self) -> &Q8I4Panel {
        self.q8_i4.get_or_init(|| {
            let a = self.q8();
            let (cols, nb) = (self.cols, self.blocks());
            let pk = self.pairs_packing();
            let len = pk.units * self.n;
            let mut r = Q8I4Panel {
                qp: vec![0; len * 64],
                d8: vec![0.0; len * 8],
                corr8: vec![0; len * 8],
                cp: vec![0.0; len],
            };
            for t in 0..self.n {
                let (q, d, qs) = (
                    &a.q[t * cols..(t + 1) * cols],
                    &a.d[t * nb..(t + 1) * nb],
                    &a.qsum[t * nb..(t + 1) * nb],
                );
                for p in 0..pk.units {
                    let i = pk.at(t, p);
                    for k in 0..4 {
                        r.d8[i * 8 + k] = d[2 * p];
                        r.d8[i * 8 + 4 + k] = d[2 * p + 1];
                    }
                    r.corr8[i * 8] = 8 * qs[2 * p];
                    r.corr8[i * 8 + 4] = 8 * qs[2 * p + 1];
                    r.cp[t * pk.units + p] = (8 * qs[2 * p]) as f32 * d[2 * p]
                        + (8 * qs[2 * p + 1]) as f32 * d[2 * p + 1];
                    let out = &mut r.qp[i * 64..(i + 1) * 64];
                    for (h, blk) in [2 * p, 2 * p + 1].into_iter().enumerate() {
                        let qb = &q[blk * QBLOCK..(blk + 1) * QBLOCK];
                        for k in 0..16 {
                            out[h * 16 + k] = qb[2 * k];
                            out[32 + h * 16 + k] = qb[2 * k + 1];
                        }
                    }
                }
            }
            r
        })
    }

    /// The f32 rows packed by block, natural order (computed on first use).
    /// The rows rounded to bf16 (to nearest even), each padded with zeros to a multiple of
    /// 16 values, and that padded length: what bf16 matrices read under [`bf16_act`].
    pub fn x_bf16(&self) -> (&[u16], usize) {
        let (v, row) = self.x_bf16.get_or_init(|| {
            let row = self.cols.div_ceil(16) * 16;
            let mut v = vec![0u16; self.n * row];
            for t in 0..self.n {
                for (d, &x) in v[t * row..].iter_mut().zip(self.row(t)) {
                    *d = half::bf16::from_f32(x).to_bits();
                }
            }
            (v, row)
        });
        (v, *row)
    }

    pub fn x_panel(&self) -> &F32Panel {
        self.x_panel.get_or_init(|| self.pack_f32(false))
    }

    /// The f32 rows packed by block, int4 order (computed on first use).
    pub fn x_i4(&self) -> &F32Panel {
        self.x_i4.get_or_init(|| self.pack_f32(true))
    }

    fn pack_f32(&self, int4_order: bool) -> F32Panel {
        let pk = self.blocks_packing();
        let mut v = vec![0f32; pk.units * self.n * QBLOCK];
        for t in 0..self.n {
            let x = self.row(t);
            for b in 0..pk.units {
                let src = &x[b * QBLOCK..(b + 1) * QBLOCK];
                let i = pk.at(t, b);
                let dst = &mut v[i * QBLOCK..(i + 1) * QBLOCK];
                if int4_order {
                    for half in 0..2 {
                        for k in 0..8 {
                            dst[half * 16 + k] = src[half * 16 + 2 * k];
                            dst[half * 16 + 8 + k] = src[half * 16 + 2 * k + 1];
                        }
                    }
                } else {
                    dst.copy_from_slice(src);
                }
            }
        }
        F32Panel { x: v }
    }

    /// Makes the forms `format` (with or without int8 activations) needs, so the parallel
    /// kernels find them ready.
    pub fn prepare_for(&self, format: WeightFormat, int8: bool) {
        let format = format.row_major();
        if !level().has_avx2() || !matmul::tiled(format, self.cols) {
            self.acts(format, int8);
            return;
        }
        if int8 {
            self.q8();
        }
        match (int8, matches!(format, WeightFormat::I4 { .. })) {
            (true, true) => {
                self.q8_i4();
            }
            (true, false) => {
                self.q8_panel();
            }
            (false, true) => {
                self.x_i4();
            }
            (false, false) if format == WeightFormat::BF16 && bf16_act() => {
                self.x_bf16();
            }
            (false, false) => {
                self.x_panel();
            }
        }
    }

    /// Row `t` as the reference kernels take it.
    pub fn act(&self, t: usize, int8: bool) -> ActRow<'_> {
        let nb = self.blocks();
        ActRow {
            x: self.row(t),
            q8: int8.then(|| {
                let a = self.q8();
                Q8Row {
                    q: &a.q[t * self.cols..(t + 1) * self.cols],
                    d: &a.d[t * nb..(t + 1) * nb],
                    qsum: &a.qsum[t * nb..(t + 1) * nb],
                }
            }),
        }
    }
}

/// Quantizes one row per 32-element block, symmetric, round half to even (so the SIMD path
/// gives the same bytes): `q`, `d` and `qsum` as in [`Q8Row`].
pub fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], qsum: &mut [i32]) {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the AVX2 levels are only chosen when avx2, fma and f16c are detected.
        Level::Avx2 | Level::Avx512Vnni => unsafe { avx2::quantize_row(x, q, d, qsum) },
        _ => scalar::quantize_row(x, q, d, qsum),
    }
}

/// `dot(row, act)` for one weight row in `format` with its scales, on the per-row kernels
/// of this level (AVX2, NEON, else the reference).
pub fn dot_act(format: WeightFormat, w: &[u8], scales: &[u8], act: &Act) -> f32 {
    if matches!(format, WeightFormat::I3G64 | WeightFormat::I2Plain) {
        return lowbit::dot_act(format, w, scales, act);
    }
    if matches!(format, WeightFormat::I5 { .. }) {
        return int5::dot_act(format, w, scales, act);
    }
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the AVX2 levels are only chosen when avx2, fma and f16c are detected.
        Level::Avx2 | Level::Avx512Vnni => unsafe { avx2_row::dot_act(format, w, scales, act) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: Level::Neon is only chosen when neon is detected.
        Level::Neon => unsafe { neon::dot_act(format, w, scales, act) },
        _ => scalar::dot_act(format, w, scales, act),
    }
}

/// `dot(a, b)` of two f32 vectors on the fastest path.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `quantize_row`.
        Level::Avx2 => unsafe { avx2::dot_f32(a, b) },
        _ => scalar::dot_f32(a, b),
    }
}

/// `dot(row, x)` with f32 activations (prepares `x` on every call: for one-off dots).
pub fn dot(format: WeightFormat, w: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    dot_act(format, w, scales, &prepare(format, x, false))
}

/// Decodes (dequantizes) one row into `out` (length = cols).
pub fn decode_row(format: WeightFormat, w: &[u8], scales: &[u8], out: &mut [f32]) {
    scalar::decode_row(format, w, scales, out)
}

/// Sums a buffer with several AVX2 accumulators: the memory read bandwidth yardstick the
/// kernel benchmarks compare against (a naive sum is compute-bound far below bandwidth).
pub fn sum_bytes_as_f32(buf: &[u8]) -> f32 {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `quantize_row`.
        Level::Avx2 => unsafe { avx2::sum_f32(buf) },
        _ => {
            let mut acc = [0f32; 16];
            for c in buf.chunks_exact(64) {
                for (i, a) in acc.iter_mut().enumerate() {
                    *a += f32::from_le_bytes([c[4 * i], c[4 * i + 1], c[4 * i + 2], c[4 * i + 3]]);
                }
            }
            acc.iter().sum()
        }
    }
}

#[cfg(test)]
mod tests;
