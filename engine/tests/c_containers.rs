//! Containers of the colibri C engine, written from the transformers fixtures by the C
//! layouts' Python writer (`tools/c_containers/make_fixtures.sh` → tests/fixtures/c_containers),
//! against transformers run on their dequantized weights; the format test vectors of the
//! Python reference quantizer; refused layouts.

use colibri_engine::container::{c_layout_format, Checkpoint};
use colibri_engine::experts::plan::{MemInfo, MemoryPlan};
use colibri_engine::experts::stream::{self, model_bytes, StreamOptions};
use colibri_engine::kernels::{self, Int8Act};
use colibri_engine::kv::KvDtype;
use colibri_engine::quant::eval::{agreement, load_reference, Agreement};
use colibri_engine::tensor::{Blob, Matrix, WeightFormat};
use colibri_engine::{LogitsWanted, Model, SeqStep};
use safetensors::tensor::{Dtype, TensorView};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn c_dir(name: &str) -> PathBuf {
    fixtures().join("c_containers").join(name)
}

/// The int8-activation policy is process-wide and read when a model loads; tests that load
/// models take this lock and say which policy they want.
static MODE: Mutex<()> = Mutex::new(());

fn load(dir: &Path, mode: Int8Act) -> Model {
    let _g = MODE.lock().unwrap_or_else(|e| e.into_inner());
    kernels::set_int8_act_mode(mode);
    let m = Model::load(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    kernels::set_int8_act_mode(Int8Act::SubByte);
    m
}

fn reference(path: &Path, vocab: usize) -> Vec<Vec<f32>> {
    let raw = std::fs::read(path).unwrap();
    let v: Vec<f32> = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    v.chunks(vocab).map(|r| r.to_vec()).collect()
}

/// `kv`: the KV cache's element type, `None` for the model's default (f16 for grouped-query
/// attention, which alone moves these logits by up to 1.4e-3: tests/tests/kv_dtype.rs).
fn measure(m: &Model, ids: &[u32], refp: &Path, kv: Option<KvDtype>) -> (Agreement, Vec<f32>) {
    let mut cache = match kv {
        Some(d) => m.net.new_cache_with(d),
        None => m.new_cache(),
    };
    let mut step = [SeqStep {
        cache: &mut cache,
        tokens: ids,
        logits: LogitsWanted::All,
    }];
    let got = m.forward(&mut step).unwrap().remove(0);
    let r = reference(refp, m.info.vocab_size);
    assert_eq!(r.len(), ids.len());
    let per_pos = r
        .iter()
        .enumerate()
        .map(|(p, row)| {
            row.iter()
                .zip(&got[p * row.len()..(p + 1) * row.len()])
                .fold(0f32, |a, (x, y)| a.max((x - y).abs()))
        })
        .collect();
    (agreement(&r, &got), per_pos)
}

/// With f32 activations and an f32 KV cache the engine computes what transformers computes
/// on the same (dequantized) weights; with the default int8 activations for sub-byte experts it stays
/// within their usual error except where a discrete choice (router top-k) flips at a
/// near-tie (at most one position of 32 on these fixtures; docs/FORMAT.md).
fn check(dir: &Path, fixture: &str, refp: &Path) -> Model {
    let ids = load_reference(&fixtures().join(fixture)).unwrap().input_ids;
    let (exact, _) = measure(&load(dir, Int8Act::Off), &ids, refp, Some(KvDtype::F32));
    let m = load(dir, Int8Act::SubByte);
    let (def, per_pos) = measure(&m, &ids, refp, None);
    let over = per_pos.iter().filter(|d| **d > 0.1).count();
    eprintln!(
        "{}: f32 act max |Δ| {:.2e}; default max |Δ| {:.4}, argmax {}/{}, {over} positions over 0.1, mean KL {:.2e}",
        dir.display(),
        exact.max_abs_diff,
        def.max_abs_diff,
        def.argmax_equal,
        def.positions,
        def.mean_kl
    );
    assert!(exact.max_abs_diff < 1e-3, "f32 activations: {exact:?}");
    assert_eq!(exact.argmax_equal, exact.positions);
    assert!(over <= 1, "{over} positions differ by more than 0.1");
    assert!(def.mean_kl < 1e-2, "{def:?}");
    m
}

fn copy_files(from: &Path, to: &Path, files: &[&str]) {
    for f in files {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
}

const DSA_NOTE: &str = "DSA indexer absent: dense attention; outputs differ from the reference beyond index_topk (8) tokens";

#[test]
fn glm5_without_the_indexer_runs_dense_attention_and_says_so() {
    let src = c_dir("glm_moe_dsa");
    let dir = tempfile::tempdir().unwrap();
    copy_files(
        &src,
        dir.path(),
        &[
            "config.json",
            "generation_config.json",
            "out-00000.safetensors",
        ],
    );
    let m = check(dir.path(), "glm_moe_dsa", &src.join("reference_dense.f32"));
    assert_eq!(m.info.layout, "colibri C layout (U8 + .qs scales)");
    assert!(
        m.info.notes.iter().any(|n| n == DSA_NOTE),
        "{:?}",
        m.info.notes
    );
    assert!(
        m.info
            .notes
            .iter()
            .any(|n| n.starts_with("no MTP layers") && n.contains("speculative decoding is off")),
        "{:?}",
        m.info.notes
    );
    assert!(m.net.mtp.is_empty());
    // The sparse-attention reference agrees while the context is within index_topk (8):
    // the indexer selects every position there. Beyond, they differ.
    let ids = load_reference(&fixtures().join("glm_moe_dsa"))
        .unwrap()
        .input_ids;
    let exact = load(dir.path(), Int8Act::Off);
    let (_, per_pos) = measure(
        &exact,
        &ids,
        &src.join("reference_dsa.f32"),
        Some(KvDtype::F32),
    );
    assert!(per_pos[..8].iter().all(|d| *d < 1e-3), "{per_pos:?}");
    assert!(per_pos[8..].iter().any(|d| *d > 0.05), "{per_pos:?}");
}

#[test]
fn glm5_with_the_indexer_and_mtp_passes_uses_them() {
    let src = c_dir("glm_moe_dsa");
    let m = check(&src, "glm_moe_dsa", &src.join("reference_dsa.f32"));
    assert!(!m
        .info
        .notes
        .iter()
        .any(|n| n.starts_with("DSA indexer absent")));
    assert_eq!(m.net.mtp.len(), 1, "the --mtp pass's layer is loaded");
    assert!(
        m.info
            .notes
            .iter()
            .any(|n| n.starts_with("MTP layer without its DSA indexer")),
        "{:?}",
        m.info.notes
    );
    let class = |c: &str| -> Vec<String> {
        m.info
            .weight_classes
            .iter()
            .filter(|w| w.class == c)
            .map(|w| w.format.clone())
            .collect()
    };
    assert_eq!(class("attention"), ["int8"]);
    assert_eq!(class("DSA indexer"), ["int8"]);
    assert_eq!(class("routers"), ["f32"]);
    assert_eq!(class("embeddings"), ["int8"]);
    assert_eq!(class("routed experts"), ["int4-g32", "int4-row"]);
}

#[test]
fn a_partly_present_indexer_is_a_clear_error() {
    let src = c_dir("glm_moe_dsa");
    let dir = tempfile::tempdir().unwrap();
    copy_files(
        &src,
        dir.path(),
        &[
            "config.json",
            "out-00000.safetensors",
            "out-mtp-00000.safetensors",
        ],
    );
    // The indexer pass without layer 1.
    let bytes = std::fs::read(src.join("out-idx-00000.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| !n.starts_with("model.layers.1."))
        .collect();
    safetensors::serialize_to_file(kept, None, &dir.path().join("out-idx-00000.safetensors"))
        .unwrap();
    let e = Model::load(dir.path())
        .err()
        .expect("must not load")
        .to_string();
    assert!(
        e.contains("model.layers.1.self_attn.indexer.wq_b.weight"),
        "{e}"
    );
}

#[test]
fn every_c_format_in_one_mla_container() {
    let src = c_dir("deepseek_v3_mixed");
    let m = check(&src, "deepseek_v3", &src.join("reference.f32"));
    let experts: Vec<String> = m
        .info
        .weight_classes
        .iter()
        .filter(|w| w.class == "routed experts")
        .map(|w| w.format.clone())
        .collect();
    assert_eq!(experts.len(), 3);
    for f in ["int4-row", "int3-g64", "int2-plain"] {
        assert!(experts.iter().any(|e| e == f), "{experts:?}");
    }
}

#[test]
fn int4_with_a_group_size_of_16() {
    let src = c_dir("qwen3_moe_g16");
    let m = check(&src, "qwen3_moe", &src.join("reference.f32"));
    assert!(m
        .info
        .weight_classes
        .iter()
        .any(|w| w.class == "routed experts" && w.format == "int4-g16"));
}

#[test]
fn merged_olmoe_experts_load_and_stream_with_one_read_each() {
    let src = c_dir("olmoe_merged");
    let m = check(&src, "olmoe", &src.join("reference.f32"));
    // gate, up and down are consecutive ranges of one tensor; their scales are in RAM.
    let colibri_engine::arch::Ffn::Moe(moe) = &m.net.layers[0].ffn else {
        panic!("layer 0 is MoE")
    };
    let e = &moe.experts[3];
    let range = |x: &Matrix| match &x.data {
        Blob::Mapped { start, end, .. } => (*start, *end),
        _ => panic!("weights must stay in the memory map"),
    };
    assert_eq!(range(&e.gate).1, range(&e.up).0);
    assert_eq!(range(&e.up).1, range(&e.down).0);
    assert!(matches!(e.gate.scales, Some(Blob::Owned(_))));
    assert_eq!(e.gate.format, WeightFormat::I8Row);

    // Streamed with room for 3 experts, no prefetch: every miss is one read, and the
    // outputs are bit-identical to the resident run.
    let ids = load_reference(&fixtures().join("olmoe")).unwrap().input_ids;
    let want = m.score(&ids).unwrap();
    let mut s = load(&src, Int8Act::SubByte);
    let bytes = model_bytes(&s.net);
    let expert = 3 * 32 * 64;
    assert!(bytes.expert_size as usize >= expert && bytes.expert_size < 2 * 4096 + expert as u64);
    let plan = MemoryPlan::new(bytes.clone(), MemInfo::read(), Some(3 * bytes.expert_size));
    let opts = StreamOptions {
        prefetch: false,
        persist: false,
        preload: false,
        readers: 1,
        ..Default::default()
    };
    let streaming = stream::enable_with_plan(&mut s.net, &s.info.dir, &opts, plan).unwrap();
    assert_eq!(s.score(&ids).unwrap(), want);
    let st = streaming.stats();
    assert!(st.misses > 0);
    assert_eq!(st.reads, st.misses, "{st:?}");
}

/// The older split layout (`convert_olmoe.py`): per-expert I8 `[rows, cols]` tensors with
/// `.qs` row scales. Rewritten here from the merged container's bytes, so the values are the
/// same and so must the logits be.
#[test]
fn split_int8_experts_give_the_merged_logits() {
    let src = c_dir("olmoe_merged");
    let ck = Checkpoint::open(&src).unwrap();
    let (hidden, inter) = (64usize, 32usize);
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut names: Vec<&str> = ck.tensor_names().collect();
    names.sort();
    for n in names {
        let t = ck.get(n).unwrap();
        if let Some(p) = n.strip_suffix(".merged_weight") {
            let w = t.bytes();
            let s = ck.get(&format!("{p}.qs")).unwrap().bytes();
            let parts = [
                ("gate_proj", 0, inter, hidden, 0),
                ("up_proj", inter * hidden, inter, hidden, inter),
                ("down_proj", 2 * inter * hidden, hidden, inter, 2 * inter),
            ];
            for (proj, off, rows, cols, s0) in parts {
                let name = format!("{p}.{proj}.weight");
                owned.push((
                    name.clone(),
                    Dtype::I8,
                    vec![rows, cols],
                    w[off..off + rows * cols].to_vec(),
                ));
                owned.push((
                    format!("{name}.qs"),
                    Dtype::F32,
                    vec![rows],
                    s[4 * s0..4 * (s0 + rows)].to_vec(),
                ));
            }
        } else if !n.ends_with(".qs") {
            let dt = match t.dtype.name() {
                "BF16" => Dtype::BF16,
                "F32" => Dtype::F32,
                o => panic!("{o}"),
            };
            owned.push((n.to_string(), dt, t.shape.clone(), t.bytes().to_vec()));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, dt, s, b)| (n.clone(), TensorView::new(*dt, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    copy_files(&src, dir.path(), &["config.json"]);
    let ids = load_reference(&fixtures().join("olmoe")).unwrap().input_ids;
    let a = load(&src, Int8Act::SubByte).score(&ids).unwrap();
    let split = load(dir.path(), Int8Act::SubByte);
    assert_eq!(split.score(&ids).unwrap(), a);
    assert!(split
        .info
        .weight_classes
        .iter()
        .any(|w| w.class == "routed experts" && w.format == "int8" && w.tensors == 48));
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The Python reference quantizer (`tools/c_containers/cformats.py`, written from the layout
/// description) packed one matrix in every C format: colibri finds each layout from the byte
/// and scale counts, decodes it to exactly the Python dequantized values, and its own int3 and
/// int2 quantizers write exactly the Python bytes and scales.
#[test]
fn the_python_reference_vectors_decode_and_quantize_identically() {
    let bytes = std::fs::read(c_dir("vectors.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let input = st.tensor("input").unwrap();
    let (rows, cols) = (input.shape()[0], input.shape()[1]);
    let x = f32s(input.data());
    let cases = [
        ("int8", WeightFormat::I8Row),
        (
            "int4",
            WeightFormat::I4 {
                group: 0,
                scale: colibri_engine::tensor::ScaleType::F32,
            },
        ),
        (
            "int4_g32",
            WeightFormat::I4 {
                group: 32,
                scale: colibri_engine::tensor::ScaleType::F32,
            },
        ),
        (
            "int4_g48",
            WeightFormat::I4 {
                group: 48,
                scale: colibri_engine::tensor::ScaleType::F32,
            },
        ),
        (
            "int4_g64",
            WeightFormat::I4 {
                group: 64,
                scale: colibri_engine::tensor::ScaleType::F32,
            },
        ),
        ("int2", WeightFormat::I2Plain),
        ("int3", WeightFormat::I3G64),
    ];
    for (name, want) in cases {
        let q = st
            .tensor(&format!("{name}.weight"))
            .unwrap()
            .data()
            .to_vec();
        let s = st
            .tensor(&format!("{name}.weight.qs"))
            .unwrap()
            .data()
            .to_vec();
        let deq = f32s(st.tensor(&format!("{name}.dequantized")).unwrap().data());
        let f = c_layout_format(q.len(), s.len() / 4, rows, cols).unwrap();
        assert_eq!(f, want, "{name}");
        let m = Matrix::quantized(
            rows,
            cols,
            f,
            Blob::Owned(Arc::new(q.clone())),
            Some(Blob::Owned(Arc::new(s.clone()))),
        )
        .unwrap();
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            m.row_to_f32(r, &mut row);
            assert_eq!(&row[..], &deq[r * cols..(r + 1) * cols], "{name} row {r}");
        }
        if matches!(want, WeightFormat::I3G64 | WeightFormat::I2Plain) {
            let p = colibri_engine::quant::quantize(want, rows, cols, &x);
            assert_eq!(
                p.data, q,
                "{name}: packed bytes differ from the Python quantizer"
            );
            assert_eq!(
                p.scales, s,
                "{name}: scales differ from the Python quantizer"
            );
        }
    }
}

/// A copy of `src` with tensor `victim` (and its scales) replaced.
fn with_tensor(
    src: &Path,
    file: &str,
    victim: &str,
    weight: (Dtype, Vec<u8>),
    scales: Vec<f32>,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n != file && !n.ends_with(".f32") {
            std::fs::copy(e.path(), dir.path().join(&n)).unwrap();
        }
    }
    let bytes = std::fs::read(src.join(file)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let qs_name = match victim.strip_suffix(".merged_weight") {
        Some(p) => format!("{p}.qs"),
        None => format!("{victim}.qs"),
    };
    let sbytes: Vec<u8> = scales.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut views: Vec<(String, TensorView)> = Vec::new();
    for (n, v) in st.tensors() {
        if n == victim {
            views.push((
                n,
                TensorView::new(weight.0, vec![weight.1.len()], &weight.1).unwrap(),
            ));
        } else if n == qs_name {
            views.push((
                n,
                TensorView::new(Dtype::F32, vec![scales.len()], &sbytes).unwrap(),
            ));
        } else {
            views.push((n, v));
        }
    }
    safetensors::serialize_to_file(views, None, &dir.path().join(file)).unwrap();
    dir
}

#[test]
fn refused_layouts_name_the_format() {
    let ds = c_dir("deepseek_v3_mixed");
    let victim = "model.layers.1.mlp.experts.2.up_proj.weight"; // [32, 64]
                                                                // E8/IQ3: 98 bytes per 256 weights of a row, a single tag value as '.qs'.
    let d = with_tensor(
        &ds,
        "out-00000.safetensors",
        victim,
        (Dtype::U8, vec![0; 32 * 98]),
        vec![6.0],
    );
    let e = Model::load(d.path()).err().unwrap().to_string();
    assert!(e.contains(victim) && e.contains("E8/IQ3"), "{e}");
    // FP8 passthrough: a byte per weight and one scale per 128×128 block.
    let d = with_tensor(
        &ds,
        "out-00000.safetensors",
        victim,
        (Dtype::U8, vec![0; 32 * 64]),
        vec![1.0],
    );
    let e = Model::load(d.path()).err().unwrap().to_string();
    assert!(e.contains(victim) && e.contains("FP8"), "{e}");
    // Bytes of no layout.
    let d = with_tensor(
        &ds,
        "out-00000.safetensors",
        victim,
        (Dtype::U8, vec![0; 32 * 5]),
        vec![1.0; 32],
    );
    let e = Model::load(d.path()).err().unwrap().to_string();
    assert!(e.contains(victim) && e.contains("match no layout"), "{e}");

    let ol = c_dir("olmoe_merged");
    let merged = "model.layers.0.mlp.experts.5.merged_weight";
    let file = ["model-00001.safetensors", "model-00002.safetensors"]
        .into_iter()
        .find(|f| {
            let b = std::fs::read(ol.join(f)).unwrap();
            safetensors::SafeTensors::deserialize(&b)
                .unwrap()
                .tensors()
                .iter()
                .any(|(n, _)| n == merged)
        })
        .expect("a shard holds expert 5");
    // Merged int4 (the C qwen36 layout): half the int8 bytes.
    let d = with_tensor(
        &ol,
        file,
        merged,
        (Dtype::U8, vec![0; 3 * 32 * 64 / 2]),
        vec![1.0; 128],
    );
    let e = Model::load(d.path()).err().unwrap().to_string();
    assert!(e.contains(merged) && e.contains("int4"), "{e}");
    // Merged int8 with the wrong number of row scales.
    let d = with_tensor(
        &ol,
        file,
        merged,
        (Dtype::I8, vec![0; 3 * 32 * 64]),
        vec![1.0; 127],
    );
    let e = Model::load(d.path()).err().unwrap().to_string();
    assert!(e.contains(merged) && e.contains("row scales"), "{e}");
}

/// Routed experts of a C container (int4 rows, int3-g64, int2 rows, their `.qs` in the
/// same file) stream from the store with outputs bit-identical to the resident run.
#[test]
fn c_layout_experts_stream_bit_identically() {
    let src = c_dir("deepseek_v3_mixed");
    let ids = load_reference(&fixtures().join("deepseek_v3"))
        .unwrap()
        .input_ids;
    let want = load(&src, Int8Act::SubByte).score(&ids).unwrap();
    let mut s = load(&src, Int8Act::SubByte);
    let bytes = model_bytes(&s.net);
    let plan = MemoryPlan::new(bytes.clone(), MemInfo::read(), Some(2 * bytes.expert_size));
    let opts = StreamOptions {
        prefetch: false,
        persist: false,
        preload: false,
        readers: 2,
        ..Default::default()
    };
    let streaming = stream::enable_with_plan(&mut s.net, &s.info.dir, &opts, plan).unwrap();
    assert_eq!(s.score(&ids).unwrap(), want);
    assert!(streaming.stats().misses > 0);
}

/// Mutated headers of C-layout files (merged experts, quantized matrices) are refused or
/// load into something that runs; never a panic.
#[test]
fn mutated_c_layout_headers_never_panic() {
    for (name, file) in [
        ("olmoe_merged", "model-00001.safetensors"),
        ("deepseek_v3_mixed", "out-00000.safetensors"),
    ] {
        let src = c_dir(name);
        let base = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(&src).unwrap().flatten() {
            std::fs::copy(e.path(), base.path().join(e.file_name())).unwrap();
        }
        let orig = std::fs::read(src.join(file)).unwrap();
        let header_len = u64::from_le_bytes(orig[..8].try_into().unwrap()) as usize;
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let (mut ok, mut err) = (0, 0);
        for _ in 0..150 {
            let mut b = orig.clone();
            for _ in 0..1 + next() % 4 {
                let at = 8 + (next() as usize % header_len);
                b[at] = match next() % 3 {
                    0 => b"0123456789"[next() as usize % 10],
                    1 => b"\"{}[],:"[next() as usize % 7],
                    _ => next() as u8,
                };
            }
            std::fs::write(base.path().join(file), &b).unwrap();
            match Model::load(base.path()) {
                Ok(m) => {
                    let _ = m.score(&[1, 2, 3]);
                    ok += 1;
                }
                Err(_) => err += 1,
            }
        }
        assert!(err > 75, "{name}: {ok} loaded, {err} refused");
    }
}
