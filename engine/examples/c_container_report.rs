//! Measures containers (the colibri C layout, or colibri's own) against transformers run on
//! their dequantized weights (`tools/c_containers/reference.py` writes those logits) and
//! prints one markdown row per container: the docs/FORMAT.md table of C-project layouts.
//!
//! ```sh
//! cargo run --release -p colibri-engine --example c_container_report -- \
//!     NAME CONTAINER_DIR REFERENCE.f32 FIXTURE_DIR [NAME DIR REF FIXTURE ...]
//! ```
//! The fixture gives the input ids (its ref.json); the reference holds positions × vocab
//! f32 logits. Each container is scored twice: with the default activations (int8 for
//! sub-byte routed experts, see docs/FORMAT.md) and with f32 activations everywhere
//! (`COLIBRI_INT8_ACT=0`), which isolates the engine's arithmetic from that choice.

use colibri_engine::kernels::{self, Int8Act};
use colibri_engine::quant::eval::{agreement, load_reference};
use colibri_engine::Model;
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || !args.len().is_multiple_of(4) {
        eprintln!("usage: c_container_report NAME DIR REFERENCE.f32 FIXTURE [...]");
        std::process::exit(2);
    }
    println!(
        "| container | formats | argmax = ref | max abs Δlogit | positions over 0.1 | mean KL (nats) | max abs Δlogit, f32 act |"
    );
    println!("|---|---|---|---|---|---|---|");
    for a in args.chunks(4) {
        let (name, dir, refp, fixture) = (&a[0], Path::new(&a[1]), &a[2], Path::new(&a[3]));
        let ids = load_reference(fixture).expect("fixture ref.json").input_ids;
        let score = |mode| {
            kernels::set_int8_act_mode(mode);
            let m = Model::load(dir).unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = m.score(&ids).expect("score");
            (m, got)
        };
        let (_, exact) = score(Int8Act::Off);
        let (model, got) = score(Int8Act::SubByte);
        let raw = std::fs::read(refp).expect("reference file");
        let vocab = model.info.vocab_size;
        let reference: Vec<Vec<f32>> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect::<Vec<_>>()
            .chunks(vocab)
            .map(|r| r.to_vec())
            .collect();
        assert_eq!(reference.len(), ids.len(), "{name}: reference rows");
        let ag = agreement(&reference, &got);
        let ag_exact = agreement(&reference, &exact);
        let over = reference
            .iter()
            .enumerate()
            .filter(|(p, row)| {
                row.iter()
                    .zip(&got[p * vocab..(p + 1) * vocab])
                    .any(|(a, b)| (a - b).abs() > 0.1)
            })
            .count();
        let mut formats: Vec<String> = model
            .info
            .weight_classes
            .iter()
            .filter(|c| c.format != "f32")
            .map(|c| format!("{} {}", c.class, c.format))
            .collect();
        formats.dedup();
        println!(
            "| {name} | {} | {}/{} | {:.4} | {over} | {:.2e} | {:.4} |",
            formats.join(", "),
            ag.argmax_equal,
            ag.positions,
            ag.max_abs_diff,
            ag.mean_kl,
            ag_exact.max_abs_diff
        );
        for n in &model.info.notes {
            eprintln!("{name}: note: {n}");
        }
    }
}
