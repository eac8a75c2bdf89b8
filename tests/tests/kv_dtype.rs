//! The KV cache's element type against transformers on every fixture family: what storing
//! keys and values in f16 changes in the logits, and that each family's default cache
//! (f16 for grouped-query attention, f32 for MLA's latent) stays within the oracle tolerance.

use colibri_engine::kv::KvDtype;
use colibri_engine::{LogitsWanted, Model, SeqStep};
use colibri_tests::{fixture, max_abs_diff, Reference, FAMILIES, LOGIT_TOL};

fn score(model: &Model, tokens: &[u32], dtype: Option<KvDtype>) -> Vec<f32> {
    let mut cache = match dtype {
        Some(d) => model.net.new_cache_with(d),
        None => model.new_cache(),
    };
    let mut step = [SeqStep {
        cache: &mut cache,
        tokens,
        logits: LogitsWanted::All,
    }];
    model.forward(&mut step).unwrap().remove(0)
}

fn worst(got: &[f32], want: &[Vec<f32>]) -> f32 {
    let v = want[0].len();
    want.iter()
        .enumerate()
        .map(|(p, w)| max_abs_diff(&got[p * v..(p + 1) * v], w))
        .fold(0f32, f32::max)
}

/// Measured (AVX2): f32 caches within 8e-6 of transformers everywhere; f16 caches within
/// 1.4e-3 on the GQA families, but 2.2e-3 and 2.8e-3 on two of the three MLA ones (past
/// the 2e-3 tolerance), hence f32 latents by default.
#[test]
fn f16_kv_changes_logits_within_the_tolerance_where_it_is_the_default() {
    for family in FAMILIES {
        let model = Model::load(&fixture(family)).unwrap();
        let r = Reference::load(family);
        let exact = score(&model, &r.input_ids, Some(KvDtype::F32));
        let half = score(&model, &r.input_ids, Some(KvDtype::F16));
        let default = score(&model, &r.input_ids, None);
        let (d32, d16, dd) = (
            worst(&exact, &r.logits),
            worst(&half, &r.logits),
            worst(&default, &r.logits),
        );
        let change = max_abs_diff(&exact, &half);
        let default_dtype = model.new_cache().layers[0].k.dtype();
        eprintln!(
            "{family}: max |Δlogit| vs transformers: f32 KV {d32:.2e}, f16 KV {d16:.2e} \
             (f16 - f32: {change:.2e}); default {} ",
            default_dtype.name()
        );
        assert!(d32 < 1e-4, "{family}: f32 KV {d32}");
        assert!(
            dd < LOGIT_TOL,
            "{family}: default KV ({default_dtype:?}) {dd}"
        );
        assert!(change < 1e-2, "{family}: f16 moved the logits by {change}");
        // f16 stores keys and values in half the bytes (side data stays f32).
        let c16 = model.net.new_cache_with(KvDtype::F16);
        let c32 = model.net.new_cache_with(KvDtype::F32);
        let side: usize = c32.layers.iter().map(|l| l.extra_width * 4).sum();
        assert_eq!(
            2 * (c16.bytes_per_position() - side),
            c32.bytes_per_position() - side
        );
    }
}

/// A session saved with an f16 cache continues exactly where it was: the snapshot bytes
/// round-trip and the next step's logits are those of the uninterrupted run.
#[test]
fn f16_cache_snapshot_continues_bit_for_bit() {
    let model = Model::load(&fixture("olmoe")).unwrap();
    let r = Reference::load("olmoe");
    let ids = &r.input_ids;
    let mut cache = model.net.new_cache_with(KvDtype::F16);
    model.step(&mut cache, &ids[..10]).unwrap();
    let restored = colibri_engine::KvCache::from_bytes(&cache.to_bytes()).unwrap();
    assert!(restored.same_layout(&cache));
    let mut restored = restored;
    let a = model.step(&mut cache, &ids[10..12]).unwrap();
    let b = model.step(&mut restored, &ids[10..12]).unwrap();
    assert_eq!(a, b);
}
