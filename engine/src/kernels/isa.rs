//! The SIMD level this process runs (`COLIBRI_ISA`, detected once) and the AVX-512 BF16
//! opt-in (`COLIBRI_BF16_ACT`): what the CPU has, what was asked for, what runs.

use std::sync::OnceLock;

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
    pub(super) fn runs_under(self, best: Level) -> bool {
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
pub(super) fn requested(
    isa: Option<&str>,
    kernels: Option<&str>,
) -> (Option<Level>, Option<String>) {
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
