//! Multi-head latent attention and DSA beyond the generic oracle checks: both attention
//! formulations (weight-absorbed and expanded) against transformers, the DSA indexer
//! actually changing the result on its fixture, and the latent cache's size.

use colibri_engine::arch::mla::MlaPath;
use colibri_engine::arch::Attention;
use colibri_engine::{LogitsWanted, Model, SeqStep};
use colibri_tests::{fixture, max_abs_diff, Reference};

const MLA_FAMILIES: &[&str] = &[
    "deepseek_v3",
    "deepseek_v3_noqlora",
    "glm_moe_dsa",
    "kimi_k25",
];

fn load_with(family: &str, path: MlaPath) -> Model {
    let mut model = Model::load(&fixture(family)).unwrap();
    for l in &mut model.net.layers {
        if let Attention::Mla(a) = &mut l.attn {
            a.path = path;
        }
    }
    model
}

/// Worst |Δlogit| of a teacher-forced pass against the reference.
fn worst_vs_reference(model: &Model, r: &Reference) -> f32 {
    let vocab = model.info.vocab_size;
    let logits = model.score(&r.input_ids).unwrap();
    r.logits
        .iter()
        .enumerate()
        .map(|(p, want)| max_abs_diff(&logits[p * vocab..(p + 1) * vocab], want))
        .fold(0.0, f32::max)
}

#[test]
fn absorbed_and_expanded_attention_both_match_transformers() {
    for family in MLA_FAMILIES {
        let r = Reference::load(family);
        for path in [MlaPath::Absorbed, MlaPath::Expanded] {
            let model = load_with(family, path);
            let worst = worst_vs_reference(&model, &r);
            eprintln!("{family} {path:?}: max |Δlogit| = {worst:.2e}");
            assert!(worst < 2e-3, "{family} {path:?}: {worst}");
        }
    }
}

/// Prefill expanded, decode absorbed (what Auto does at real sizes) equals one pass.
#[test]
fn expanded_prefill_then_absorbed_decode_equals_one_pass() {
    for family in MLA_FAMILIES {
        let r = Reference::load(family);
        let mut model = load_with(family, MlaPath::Expanded);
        let vocab = model.info.vocab_size;
        let full = model.score(&r.input_ids).unwrap();
        let mut cache = model.new_cache();
        let np = r.prompt_ids.len();
        let mut step = [SeqStep {
            cache: &mut cache,
            tokens: &r.input_ids[..np],
            logits: LogitsWanted::All,
        }];
        model.forward(&mut step).unwrap();
        for l in &mut model.net.layers {
            if let Attention::Mla(a) = &mut l.attn {
                a.path = MlaPath::Absorbed;
            }
        }
        for p in np..r.input_ids.len() {
            let got = model.step(&mut cache, &r.input_ids[p..p + 1]).unwrap();
            let d = max_abs_diff(&got, &full[p * vocab..(p + 1) * vocab]);
            assert!(d < 1e-4, "{family}: position {p}: {d}");
        }
    }
}

/// The glm_moe_dsa fixture is longer than `index_topk`, so the indexer's choice matters:
/// attending to every position instead gives clearly different logits late in the sequence
/// (and the result with the indexer is the one that matches transformers).
#[test]
fn dsa_indexer_selection_is_active_on_its_fixture() {
    let family = "glm_moe_dsa";
    let r = Reference::load(family);
    let mut model = Model::load(&fixture(family)).unwrap();
    assert!(worst_vs_reference(&model, &r) < 2e-3);
    for l in &mut model.net.layers {
        if let Attention::Mla(a) = &mut l.attn {
            assert!(a
                .indexer
                .as_ref()
                .is_some_and(|i| i.topk < r.input_ids.len()));
            a.indexer = None;
        }
    }
    let dense = worst_vs_reference(&model, &r);
    eprintln!("glm_moe_dsa with every position attended: max |Δlogit| = {dense:.2e}");
    assert!(dense > 1e-2, "the indexer made no difference ({dense})");
}

/// Bytes per token of the latent cache next to a full per-head K/V cache, for the fixtures
/// and for the published model shapes (computed from their dims, f32 cache).
#[test]
fn latent_cache_bytes_per_token() {
    for family in MLA_FAMILIES {
        let model = Model::load(&fixture(family)).unwrap();
        let (held, full) = model.net.kv_bytes_per_token();
        let mut cache = model.new_cache();
        model.step(&mut cache, &[1, 2, 3]).unwrap();
        assert_eq!(
            cache.size_bytes(),
            3 * held,
            "{family}: cache holds what it reports"
        );
        eprintln!(
            "{family}: {held} B/token latent cache vs {full} B/token full K/V ({:.1}x)",
            full as f64 / held as f64
        );
        assert!(held < full);
    }
    // (name, layers, heads, kv_lora_rank, rope, nope, v, indexer key dim)
    for (name, layers, heads, l, r, n, v, ix) in [
        (
            "DeepSeek-V3",
            61usize,
            128usize,
            512usize,
            64usize,
            128usize,
            128usize,
            0usize,
        ),
        ("GLM-5", 78, 64, 512, 64, 192, 256, 128),
    ] {
        let held = layers * (l + r + ix) * 4;
        let full = layers * heads * (n + r + v) * 4;
        eprintln!(
            "{name}: {:.1} KiB/token latent cache vs {:.1} KiB/token full K/V ({:.0}x)",
            held as f64 / 1024.0,
            full as f64 / 1024.0,
            full as f64 / held as f64
        );
    }
}

/// The glm_moe_dsa fixture with `indexer_types` replaced, in a temporary folder (the
/// weights are linked, the extra indexer tensors of shared layers simply go unused).
fn dsa_variant(indexer_types: serde_json::Value) -> tempfile::TempDir {
    let src = fixture("glm_moe_dsa");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["indexer_types"] = indexer_types;
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    std::os::unix::fs::symlink(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    dir
}

/// GLM-5's "shared" layers reuse the previous layer's selection: no indexer of their own, no
/// indexer keys in their cache, and the cached path still equals one pass.
#[test]
fn dsa_shared_layers_reuse_the_previous_selection() {
    let dir = dsa_variant(serde_json::json!(["full", "shared", "full"]));
    let model = Model::load(dir.path()).unwrap();
    let kinds: Vec<(bool, bool)> = model
        .net
        .layers
        .iter()
        .map(|l| match &l.attn {
            Attention::Mla(a) => (a.indexer.is_some(), a.shares_selection),
            _ => panic!("MLA expected"),
        })
        .collect();
    assert_eq!(kinds, vec![(true, false), (false, true), (true, false)]);
    let cache = model.new_cache();
    let extra: Vec<usize> = cache.layers.iter().map(|l| l.extra_width).collect();
    assert_eq!(extra, vec![32, 0, 32]);

    let r = Reference::load("glm_moe_dsa");
    let vocab = model.info.vocab_size;
    let full = model.score(&r.input_ids).unwrap();
    let own = Model::load(&fixture("glm_moe_dsa"))
        .unwrap()
        .score(&r.input_ids)
        .unwrap();
    assert!(
        max_abs_diff(&full, &own) > 1e-3,
        "sharing layer 0's selection changes layer 1"
    );
    let mut cache = model.new_cache();
    let np = r.prompt_ids.len();
    model.step(&mut cache, &r.input_ids[..np]).unwrap();
    for p in np..r.input_ids.len() {
        let got = model.step(&mut cache, &r.input_ids[p..p + 1]).unwrap();
        let d = max_abs_diff(&got, &full[p * vocab..(p + 1) * vocab]);
        assert!(d < 1e-4, "position {p}: {d}");
    }
}

#[test]
fn dsa_shared_first_layer_is_a_config_error() {
    let dir = dsa_variant(serde_json::json!(["shared", "full", "full"]));
    let err = Model::load(dir.path()).err().expect("refused").to_string();
    assert!(err.contains("indexer_types"), "{err}");
    let dir = dsa_variant(serde_json::json!(["full", "sometimes", "full"]));
    let err = Model::load(dir.path()).err().expect("refused").to_string();
    assert!(err.contains("sometimes"), "{err}");
}
