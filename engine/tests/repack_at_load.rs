//! Row-major int4 copied into RAM at load is rearranged into `int4-rows8` there
//! (docs/FORMAT.md, "Repacked at load"): the colibri C layout's grouped int4 and containers
//! converted with `--int4-layout rows`. Loaded in RAM their matrices are `int4-rows8` where
//! the shape allows, memory-mapped they stay `int4`, and the logits are the same bits.

use colibri_engine::arch::Ffn;
use colibri_engine::container::{OpenOptions, WeightsIn};
use colibri_engine::convert::{convert, ConvertOptions};
use colibri_engine::experts::plan::{MemInfo, MemoryPlan};
use colibri_engine::experts::stream::{self, model_bytes, StreamOptions};
use colibri_engine::model::{LoadProgress, LoadStage};
use colibri_engine::quant::eval::load_reference;
use colibri_engine::rows8;
use colibri_engine::tensor::{Matrix, ScaleType, WeightFormat};
use colibri_engine::Model;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// `COLIBRI_REPACK` is read when a folder is opened: loads take this lock, and the test
/// that sets it holds it while it is set.
static ENV: Mutex<()> = Mutex::new(());

/// The model loaded with its weights as `weights` says, and the progress it reported.
fn load(dir: &Path, weights: WeightsIn, streamed_experts: bool) -> (Model, Vec<LoadProgress>) {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    load_unlocked(dir, weights, streamed_experts)
}

fn load_unlocked(
    dir: &Path,
    weights: WeightsIn,
    streamed_experts: bool,
) -> (Model, Vec<LoadProgress>) {
    let seen = RefCell::new(Vec::new());
    let opts = OpenOptions {
        weights,
        streamed_experts,
    };
    let m = Model::load_with(dir, &opts, &|p| seen.borrow_mut().push(p))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    (m, seen.into_inner())
}

/// Every routed expert's matrices, the embedding table and the output head, by name.
fn matrices(m: &Model) -> Vec<(String, &Matrix)> {
    let mut v = vec![
        ("embed".to_string(), &m.net.embed),
        ("lm_head".to_string(), &m.net.lm_head),
    ];
    for (li, l) in m.net.layers.iter().enumerate() {
        if let Ffn::Moe(x) = &l.ffn {
            for (e, mlp) in x.experts.iter().enumerate() {
                for (p, mat) in [("gate", &mlp.gate), ("up", &mlp.up), ("down", &mlp.down)] {
                    v.push((format!("layer {li} expert {e} {p}"), mat));
                }
            }
        }
    }
    v
}

/// Checks that the RAM load holds `int4-rows8` exactly where the mapped load holds int4 of
/// a shape [`rows8::for_shape`] interleaves, and `rows8_want` of them at least; returns how
/// many there are.
fn check_formats(ram: &Model, map: &Model, label: &str) -> usize {
    let (a, b) = (matrices(ram), matrices(map));
    assert_eq!(a.len(), b.len());
    let mut interleaved = 0;
    for ((name, r), (_, m)) in a.iter().zip(&b) {
        assert!(
            !m.format.interleaved(),
            "{label} {name}: mapped row-major int4 stays as it is, got {:?}",
            m.format
        );
        let want = rows8::for_shape(m.format, m.rows, m.cols);
        assert_eq!(r.format, want, "{label} {name} [{}, {}]", m.rows, m.cols);
        if want.interleaved() {
            interleaved += 1;
            assert!(
                matches!(m.format, WeightFormat::I4 { .. }),
                "{label} {name}: {:?}",
                m.format
            );
            // The same codes and scales, moved: row by row they are the mapped ones.
            assert_eq!(
                r.to_row_major().data.bytes(),
                m.data.bytes(),
                "{label} {name}"
            );
            assert_eq!(
                r.to_row_major().scales.unwrap().bytes(),
                m.scales.as_ref().unwrap().bytes(),
                "{label} {name}"
            );
        } else {
            assert_eq!(r.data.bytes(), m.data.bytes(), "{label} {name}");
        }
    }
    // The census tells the formats of the files, whichever way they were loaded.
    assert_eq!(ram.info.weight_classes, map.info.weight_classes, "{label}");
    interleaved
}

fn bits(m: &Model, ids: &[u32]) -> Vec<u32> {
    let mut v: Vec<u32> = m.score(ids).unwrap().iter().map(|x| x.to_bits()).collect();
    // And decode, one token a step (the 8-row decode kernels).
    let mut cache = m.new_cache();
    for &t in ids {
        v.extend(
            m.step(&mut cache, &[t])
                .unwrap()
                .iter()
                .map(|x| x.to_bits()),
        );
    }
    v
}

/// The copy into RAM is reported first, from 0 to the bytes of the files, then the layers.
fn check_copy_progress(seen: &[LoadProgress], dir: &Path) {
    let files: u64 = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().and_then(|x| x.to_str()) == Some("safetensors"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let copying: Vec<&LoadProgress> = seen
        .iter()
        .take_while(|p| p.stage == LoadStage::Copying)
        .collect();
    assert!(copying.len() >= 2, "{seen:?}");
    assert_eq!(copying[0].done, 0);
    assert!(copying.iter().all(|p| p.total == files), "{copying:?}");
    assert!(copying.windows(2).all(|w| w[0].done <= w[1].done));
    assert_eq!(copying.last().unwrap().done, files);
    assert!(seen[copying.len()..]
        .iter()
        .all(|p| p.stage != LoadStage::Copying));
}

/// The C engine's main GLM-5 pass (experts int4-g32 with f32 scales; gate and up
/// `[32, 64]` take the 8-row layout, down `[64, 32]` does not).
#[test]
fn c_layout_int4_is_interleaved_in_ram_and_gives_the_same_bits() {
    let dir = fixtures().join("c_containers").join("glm_moe_dsa");
    let ids = load_reference(&fixtures().join("glm_moe_dsa"))
        .unwrap()
        .input_ids;
    let (ram, seen) = load(&dir, WeightsIn::Ram, false);
    let (map, mapped_seen) = load(&dir, WeightsIn::Map, false);
    assert_eq!(ram.info.layout, "colibri C layout (U8 + .qs scales)");
    let n = check_formats(&ram, &map, "C glm_moe_dsa");
    assert!(n >= 32, "{n} interleaved matrices");
    check_copy_progress(&seen, &dir);
    assert!(mapped_seen.iter().all(|p| p.stage != LoadStage::Copying));
    assert_eq!(
        bits(&ram, &ids),
        bits(&map, &ids),
        "C layout: RAM vs mapped"
    );
}

/// `--int4-layout rows` containers: routed experts int4-g64 and the dense matrices (attention,
/// embeddings, head) int4-g32, f16 scales; qwen3_moe ties its head to the embeddings (one
/// tensor loaded twice, rearranged once).
#[test]
fn row_major_containers_are_interleaved_in_ram_and_give_the_same_bits() {
    let i4 = |group| WeightFormat::I4 {
        group,
        scale: ScaleType::F16,
    };
    for fam in ["olmoe", "qwen3_moe"] {
        let src = fixtures().join(fam);
        let tmp = tempfile::tempdir().unwrap();
        let o = ConvertOptions {
            input: src.clone(),
            output: tmp.path().to_path_buf(),
            experts: i4(64),
            dense: i4(32),
            attention: None,
            lm_head: None,
            interleave: false,
        };
        convert(&o, &()).unwrap();
        let ids = load_reference(&src).unwrap().input_ids;
        let (ram, seen) = load(tmp.path(), WeightsIn::Ram, false);
        let (map, _) = load(tmp.path(), WeightsIn::Map, false);
        let n = check_formats(&ram, &map, fam);
        assert!(n > 0, "{fam}: nothing interleaved");
        assert!(ram.net.embed.format.interleaved(), "{fam} embeddings");
        check_copy_progress(&seen, tmp.path());
        assert_eq!(bits(&ram, &ids), bits(&map, &ids), "{fam}: RAM vs mapped");
    }
}

/// `COLIBRI_REPACK=0` leaves the RAM copy as the file holds it.
#[test]
fn colibri_repack_0_turns_it_off() {
    let dir = fixtures().join("c_containers").join("glm_moe_dsa");
    let (off, _) = {
        let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
        std::env::set_var("COLIBRI_REPACK", "0");
        let r = load_unlocked(&dir, WeightsIn::Ram, false);
        std::env::remove_var("COLIBRI_REPACK");
        r
    };
    assert!(matrices(&off).iter().all(|(_, m)| !m.format.interleaved()));
    let (on, _) = load(&dir, WeightsIn::Ram, false);
    assert!(matrices(&on).iter().any(|(_, m)| m.format.interleaved()));
}

/// Streamed experts are read from the files: loaded for streaming they are not rearranged;
/// streamed from a model whose RAM copy was rearranged, they are read in the file's layout.
/// Either way the bits of the resident run.
#[test]
fn streamed_experts_read_the_files_layout() {
    let dir = fixtures().join("c_containers").join("glm_moe_dsa");
    let ids = load_reference(&fixtures().join("glm_moe_dsa"))
        .unwrap()
        .input_ids;
    let (resident, _) = load(&dir, WeightsIn::Map, false);
    let want = bits(&resident, &ids);
    for streamed_experts in [true, false] {
        let (mut m, _) = load(&dir, WeightsIn::Ram, streamed_experts);
        let experts_interleaved = matrices(&m)
            .iter()
            .any(|(n, mat)| n.contains("expert") && mat.format.interleaved());
        assert_eq!(experts_interleaved, !streamed_experts);
        let bytes = model_bytes(&m.net);
        let plan = MemoryPlan::new(bytes.clone(), MemInfo::read(), Some(3 * bytes.expert_size));
        let opts = StreamOptions {
            budget: None,
            policy: "lru".into(),
            pin_share: 0.0,
            readers: 1,
            direct: false,
            prefetch: false,
            state_dir: None,
            persist: false,
            preload: false,
            pins: Vec::new(),
        };
        let s = stream::enable_with_plan(&mut m.net, &m.info.dir, &opts, plan).unwrap();
        assert_eq!(bits(&m, &ids), want, "streamed_experts {streamed_experts}");
        assert!(s.stats().requests > 0);
    }
}
