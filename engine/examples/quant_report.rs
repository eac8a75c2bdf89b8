//! Prints the quantization accuracy table of docs/FORMAT.md: every fixture family converted
//! with each expert format, compared with the transformers reference.
//!
//! cargo run --release -p colibri-engine --example quant_report [-- tests/fixtures]

use colibri_engine::convert::{convert, parse_format, ConvertOptions};
use colibri_engine::quant::eval::{evaluate, fixture_dirs};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "tests/fixtures".into()),
    );
    let fams = fixture_dirs(&root)?;
    use colibri_engine::kernels::Int8Act::{All, Off, SubByte};
    // (label, experts, group, dense, attention, activation policy)
    let cases = [
        ("bf16 (dense bf16)", "bf16", 64, "bf16", None, Off),
        ("int8", "int8", 0, "bf16", None, Off),
        ("int8, int8 act", "int8", 0, "bf16", None, All),
        ("int8, dense int8 (per row)", "int8", 0, "int8", None, Off),
        (
            "int8, dense int8-g64, f32 act",
            "int8",
            0,
            "int8-g64",
            None,
            Off,
        ),
        (
            "int8, dense int8-g64 (int8 act)",
            "int8",
            0,
            "int8-g64",
            None,
            SubByte,
        ),
        (
            "int8, dense int8-g32, f32 act",
            "int8",
            0,
            "int8-g32",
            None,
            Off,
        ),
        (
            "int8, dense int8-g32 (int8 act)",
            "int8",
            0,
            "int8-g32",
            None,
            SubByte,
        ),
        ("int4-g32", "int4", 32, "bf16", None, Off),
        ("int4-g64, f32 act", "int4", 64, "bf16", None, Off),
        (
            "int4-g64 (int8 act, default)",
            "int4",
            64,
            "bf16",
            None,
            SubByte,
        ),
        ("int4 per row", "int4", 0, "bf16", None, Off),
        (
            "int4-g64, dense int8-g32 (int8 act)",
            "int4",
            64,
            "int8-g32",
            None,
            SubByte,
        ),
        (
            "int4-g64, dense int8-g32, attention int4-g32",
            "int4",
            64,
            "int8-g32",
            Some("int4-g32"),
            SubByte,
        ),
        (
            "int4-g64, dense int4-g32",
            "int4",
            64,
            "int4-g32",
            None,
            SubByte,
        ),
        ("int2-g32", "int2", 32, "bf16", None, Off),
        ("int2-g64", "int2", 64, "bf16", None, Off),
    ];
    println!("| family | experts | argmax = ref | max abs Δlogit | mean KL (nats) |");
    println!("|---|---|---|---|---|");
    for fam in &fams {
        let name = fam.file_name().unwrap().to_string_lossy().into_owned();
        if let Err(e) = colibri_engine::Model::load(fam) {
            eprintln!("{name}: skipped ({e})");
            continue;
        }
        for (label, ex, g, dense, attention, mode) in cases {
            let tmp = tempfile::tempdir()?;
            let opts = ConvertOptions {
                input: fam.clone(),
                output: tmp.path().to_path_buf(),
                experts: parse_format(ex, g)?,
                dense: parse_format(dense, 0)?,
                attention: attention.map(|a| parse_format(a, 0)).transpose()?,
                lm_head: None,
                interleave: true,
            };
            convert(&opts, &())?;
            // Each row states its activation policy: f32 unless the label says int8.
            colibri_engine::kernels::set_int8_act_mode(mode);
            let a = evaluate(tmp.path(), fam)?;
            println!(
                "| {name} | {label} | {}/{} | {:.4} | {:.2e} |",
                a.argmax_equal, a.positions, a.max_abs_diff, a.mean_kl
            );
        }
    }
    // Weight-level error on a realistic width, where groups differ from rows: Gaussian-ish
    // rows with a few outliers, as trained weights have.
    let (rows, cols) = (256, 4096);
    let mut s = 0x9E3779B97F4A7C15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    let vals: Vec<f32> = (0..rows * cols)
        .map(|_| {
            let g = (0..4).map(|_| next()).sum::<f32>() - 2.0;
            if next() < 0.002 {
                g * 8.0
            } else {
                g
            }
        })
        .collect();
    println!();
    println!("| format (256×4096, heavy-tailed rows) | relative RMS error |");
    println!("|---|---|");
    for (label, f, g) in [
        ("int8", "int8", 0),
        ("int8-g64", "int8-g64", 0),
        ("int8-g32", "int8-g32", 0),
        ("int4-g32", "int4", 32),
        ("int4-g64", "int4", 64),
        ("int4-g128", "int4", 128),
        ("int4 per row", "int4", 0),
        ("int2-g32", "int2", 32),
        ("int2-g64", "int2", 64),
    ] {
        let format = parse_format(f, g)?;
        let p = colibri_engine::quant::quantize(format, rows, cols, &vals);
        let d = colibri_engine::quant::dequantize(format, rows, cols, &p);
        let num: f64 = vals
            .iter()
            .zip(&d)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let den: f64 = vals.iter().map(|a| (*a as f64).powi(2)).sum();
        println!("| {label} | {:.4} |", (num / den).sqrt());
    }
    Ok(())
}
