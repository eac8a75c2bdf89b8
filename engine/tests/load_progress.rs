//! `Model::load_with_progress`: one report per decoder layer, `done` growing to `total`
//! (after the reports of the copy into RAM, which count the files' bytes).

use colibri_engine::model::{LoadProgress, LoadStage};
use colibri_engine::Model;
use std::cell::RefCell;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn reports(name: &str) -> (Model, Vec<LoadProgress>) {
    let seen = RefCell::new(Vec::new());
    let model = Model::load_with_progress(&fixture(name), &|p| seen.borrow_mut().push(p))
        .unwrap_or_else(|e| panic!("loading {name}: {e}"));
    (model, seen.into_inner())
}

/// Sum of the tensor bytes of every safetensors file of a folder (file size less header).
fn tensor_bytes(name: &str) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let path = e.unwrap().path();
        if path.extension().and_then(|x| x.to_str()) != Some("safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let header = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        total += bytes.len() as u64 - 8 - header;
    }
    total
}

/// Bytes of every safetensors file of a folder.
fn file_bytes(name: &str) -> u64 {
    std::fs::read_dir(fixture(name))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().and_then(|x| x.to_str()) == Some("safetensors"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

fn check(name: &str) {
    let (model, seen) = reports(name);
    // Files copied into RAM (`COLIBRI_WEIGHTS` auto, a tiny fixture) are reported first, in
    // bytes of the files, up to their total.
    let (copying, seen): (Vec<LoadProgress>, Vec<LoadProgress>) = seen
        .into_iter()
        .partition(|p| p.stage == LoadStage::Copying);
    if let Some(last) = copying.last() {
        assert_eq!(last.total, file_bytes(name), "{name}: {copying:?}");
        assert_eq!(last.done, last.total, "{name}: {copying:?}");
        assert!(copying.windows(2).all(|w| w[0].done <= w[1].done));
    }
    let total = tensor_bytes(name);
    assert!(total > 0);
    let first = &seen[0];
    assert_eq!(first.stage, LoadStage::Opening, "{name}: {seen:?}");
    assert_eq!(first.done, 0);
    let mut last = 0;
    for p in &seen {
        assert_eq!(
            p.total, total,
            "{name}: every report has the checkpoint's bytes"
        );
        assert!(p.done >= last, "{name}: done went back: {seen:?}");
        assert!(p.done <= p.total, "{name}: done passed total: {p:?}");
        last = p.done;
    }
    assert_eq!(seen.last().unwrap().done, total, "{name}: ends at total");
    // One report per decoder layer (MTP layers included), each with a layer's bytes.
    let layers: Vec<&LoadProgress> = seen
        .iter()
        .filter(|p| p.message.starts_with("layer "))
        .collect();
    let expected = model.info.num_layers + model.net.mtp.len();
    assert_eq!(layers.len(), expected, "{name}: {seen:?}");
    assert_eq!(
        layers.last().unwrap().message,
        format!("layer {expected} of {expected}")
    );
    let mut prev = 0;
    for p in layers {
        assert!(p.done > prev, "{name}: a layer adds its bytes: {p:?}");
        prev = p.done;
    }
    assert!(
        prev < total,
        "{name}: embeddings and head come after the layers"
    );
}

#[test]
fn olmoe_reports_every_layer_up_to_the_total() {
    check("olmoe");
}

#[test]
fn sharded_mixtral_reports_every_layer_up_to_the_total() {
    check("mixtral");
}

#[test]
fn deepseek_v3_counts_its_mtp_layers() {
    check("deepseek_v3");
}

#[test]
fn load_without_a_callback_is_the_same_model() {
    let (with, _) = reports("olmoe");
    let plain = Model::load(&fixture("olmoe")).unwrap();
    assert_eq!(plain.info.weight_bytes, with.info.weight_bytes);
    assert_eq!(plain.info.num_layers, with.info.num_layers);
}
