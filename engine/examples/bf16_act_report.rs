//! The accuracy of bf16 activations for bf16 matrices (`COLIBRI_BF16_ACT=1`, AVX-512 BF16):
//! every fixture family's checkpoint (and the trained models of `models/`, with
//! `tests/fixtures/trained`) against its transformers reference, as the engine runs
//! in this process. Run it twice, with and without the variable, for docs/PERFORMANCE.md.
//!
//! `COLIBRI_BF16_ACT=1 cargo run --release -p colibri-engine --example bf16_act_report [-- tests/fixtures]`

use colibri_engine::kernels;
use colibri_engine::quant::eval::{evaluate, fixture_dirs};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "tests/fixtures".into()),
    );
    let fams = fixture_dirs(&root)?;
    println!(
        "{} · bf16 activations {}",
        kernels::isa_report(),
        if kernels::bf16_act() { "on" } else { "off" }
    );
    println!("| family | positions | same argmax | max abs Δlogit | mean KL (nats) |");
    println!("|---|---|---|---|---|");
    for f in fams {
        // A trained model's reference sits in tests/fixtures/trained, its weights in models/.
        let name = f.file_name().unwrap_or_default().to_owned();
        let model = if f.join("config.json").exists() {
            f.clone()
        } else {
            PathBuf::from("models").join(&name)
        };
        if !model.join("config.json").exists() {
            continue;
        }
        let a = match evaluate(&model, &f) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("{}: skipped ({e})", model.display());
                continue;
            }
        };
        println!(
            "| {} | {} | {} | {:.2e} | {:.2e} |",
            f.file_name().unwrap_or_default().to_string_lossy(),
            a.positions,
            a.argmax_equal,
            a.max_abs_diff,
            a.mean_kl
        );
    }
    Ok(())
}
