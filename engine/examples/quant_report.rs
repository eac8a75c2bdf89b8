//! Prints the quantization accuracy table of docs/FORMAT.md: every fixture family converted
//! with each expert format, compared with the transformers reference.
//!
//! cargo run --release -p colibri-engine --example quant_report [-- tests/fixtures]

use colibri_engine::convert::{convert, parse_format, ConvertOptions};
use colibri_engine::quant::eval::evaluate;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "tests/fixtures".into()),
    );
    let mut fams: Vec<PathBuf> = std::fs::read_dir(&root)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("ref.json").exists())
        .collect();
    fams.sort();
    let cases = [
        ("bf16 (dense bf16)", "bf16", 64, "bf16", false),
        ("int8", "int8", 0, "bf16", false),
        ("int8, dense int8", "int8", 0, "int8", false),
        ("int4-g32", "int4", 32, "bf16", false),
        ("int4-g64", "int4", 64, "bf16", false),
        ("int4-g64, int8 act", "int4", 64, "bf16", true),
        ("int4 per row", "int4", 0, "bf16", false),
        ("int2-g32", "int2", 32, "bf16", false),
        ("int2-g64", "int2", 64, "bf16", false),
    ];
    println!("| family | experts | argmax = ref | max abs Δlogit | mean KL (nats) |");
    println!("|---|---|---|---|---|");
    for fam in &fams {
        let name = fam.file_name().unwrap().to_string_lossy().into_owned();
        if let Err(e) = colibri_engine::Model::load(fam) {
            eprintln!("{name}: skipped ({e})");
            continue;
        }
        for (label, ex, g, dense, int8) in cases {
            let tmp = tempfile::tempdir()?;
            let opts = ConvertOptions {
                input: fam.clone(),
                output: tmp.path().to_path_buf(),
                experts: parse_format(ex, g)?,
                dense: parse_format(dense, 0)?,
            };
            convert(&opts, &())?;
            colibri_engine::kernels::set_int8_activations(int8);
            let a = evaluate(tmp.path(), fam)?;
            println!(
                "| {name} | {label} | {}/{} | {:.4} | {:.2e} |",
                a.argmax_equal, a.positions, a.max_abs_diff, a.mean_kl
            );
        }
    }
    Ok(())
}
