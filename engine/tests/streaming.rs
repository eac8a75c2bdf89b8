//! Streamed experts against the all-resident run: logits must be bit-identical whatever the
//! budget, policy, prefetch or reader count, on every fixture family, from the Hub bf16
//! layout (expert byte ranges read straight from the safetensors files) and from a converted
//! int4 container (one aligned read per expert).

use colibri_engine::arch::moe::Route;
use colibri_engine::arch::Ffn;
use colibri_engine::convert::{convert, parse_format, ConvertOptions};
use colibri_engine::experts::plan::{MemInfo, MemoryPlan};
use colibri_engine::experts::stream::{self, model_bytes, StreamOptions};
use colibri_engine::experts::{MoeHooks, RoutingObserver};
use colibri_engine::tensor::WeightFormat;
use colibri_engine::Model;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// Fixture families with routed experts that this engine loads.
fn families() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("tests/fixtures")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("ref.json").exists())
        .filter(|p| match Model::load(p) {
            Ok(m) => m.net.layers.iter().any(|l| matches!(l.ffn, Ffn::Moe(_))),
            Err(e) => {
                eprintln!("skipping {}: {e}", p.display());
                false
            }
        })
        .collect();
    v.sort();
    let names: Vec<String> = v
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for need in ["olmoe", "qwen3_moe", "mixtral"] {
        assert!(
            names.iter().any(|n| n == need),
            "fixture {need} missing: {names:?}"
        );
    }
    v
}

fn input_ids(fam: &Path) -> Vec<u32> {
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fam.join("ref.json")).unwrap()).unwrap();
    r["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Everything a run computes: teacher-forced logits of the whole sequence in one prefill
/// step, then the same sequence fed one token per step (decode), as raw bits.
fn run(m: &Model, ids: &[u32]) -> Vec<u32> {
    let mut bits: Vec<u32> = m.score(ids).unwrap().iter().map(|v| v.to_bits()).collect();
    let mut cache = m.new_cache();
    for &t in ids {
        bits.extend(
            m.step(&mut cache, &[t])
                .unwrap()
                .iter()
                .map(|v| v.to_bits()),
        );
    }
    bits
}

fn experts_per_layer(m: &Model) -> (usize, usize) {
    let moe: Vec<usize> = m
        .net
        .layers
        .iter()
        .filter_map(|l| match &l.ffn {
            Ffn::Moe(x) => Some(x.experts.len()),
            Ffn::Dense(_) => None,
        })
        .collect();
    (moe.len(), moe[0])
}

/// Streams `m`'s experts with a budget of `n_experts` experts.
fn stream_with(m: &mut Model, n_experts: u64, opts: StreamOptions) -> Arc<stream::Streaming> {
    let bytes = model_bytes(&m.net);
    let plan = MemoryPlan::new(
        bytes.clone(),
        MemInfo::read(),
        Some(n_experts * bytes.expert_size),
    );
    stream::enable_with_plan(&mut m.net, &m.info.dir, &opts, plan).unwrap()
}

fn opts(
    policy: &str,
    readers: usize,
    prefetch: bool,
    direct: bool,
    state: Option<&Path>,
) -> StreamOptions {
    StreamOptions {
        budget: None,
        policy: policy.into(),
        pin_share: 0.5,
        readers,
        direct,
        prefetch,
        state_dir: state.map(Path::to_path_buf),
        persist: state.is_some(),
        preload: true,
        pins: Vec::new(),
    }
}

fn check_family(dir: &Path, ids: &[u32], label: &str) {
    let resident = Model::load(dir).unwrap();
    let want = run(&resident, ids);
    let (layers, per_layer) = experts_per_layer(&resident);
    drop(resident);
    let state = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, u64, StreamOptions)> = vec![
        // One expert of budget: every layer of every token evicts.
        (
            "budget 1, lru, 1 reader, direct",
            1,
            opts("lru", 1, false, true, None),
        ),
        (
            "budget 3, arc, 4 readers, prefetch, buffered",
            3,
            opts("arc", 4, true, false, None),
        ),
        (
            "budget half, lfu-admit, 2 readers, prefetch",
            (layers * per_layer / 2) as u64,
            opts("lfu-admit", 2, true, true, Some(state.path())),
        ),
        // A second start: the histogram of the run before seeds pins, preloaded at start.
        (
            "budget half, pinned-lru, preloaded pins",
            (layers * per_layer / 2) as u64,
            opts("pinned-lru", 3, true, true, Some(state.path())),
        ),
        (
            "budget all, lrfu",
            (layers * per_layer) as u64,
            opts("lrfu", 2, false, true, None),
        ),
        // Half the budget lent to KV caches (ExpertStore::lend), from the first step on.
        (
            "budget all, half lent to the KV caches, lrfu, prefetch",
            (layers * per_layer) as u64,
            opts("lrfu", 2, true, true, None),
        ),
    ];
    for (what, budget, o) in cases {
        let mut m = Model::load(dir).unwrap();
        let s = stream_with(&mut m, budget, o);
        let lent = what.contains("lent");
        if lent {
            s.set_idle_kv_bytes(s.plan.margin / 2 + s.plan.budget / 2);
        }
        let got = run(&m, ids);
        let st = s.stats();
        assert!(
            got == want,
            "{label}, {what}: streamed logits differ from the resident run ({} of {} values)",
            got.iter().zip(&want).filter(|(a, b)| a != b).count(),
            want.len()
        );
        assert!(
            st.requests > 0 && st.read_errors == 0,
            "{label}, {what}: {st}"
        );
        if budget == 1 {
            // Each decode token routes top_k >= 2 experts per layer through a 1-expert cache.
            assert!(
                st.evictions as usize >= ids.len() * layers,
                "{label}, {what}: {st}"
            );
            assert!(st.resident_experts <= 1, "{label}, {what}: {st}");
        }
        if lent {
            let room = (s.plan.budget - s.plan.budget / 2) / st.expert_bytes;
            assert!(
                st.resident_bytes <= room * st.expert_bytes && st.evictions > 0,
                "{label}, {what}: room {room}, {} evictions, {} resident bytes: {st}",
                st.evictions,
                st.resident_bytes
            );
        }
        drop(m);
        s.save_histogram().unwrap();
    }
}

#[test]
fn streamed_experts_are_bit_identical_on_every_family() {
    for fam in families() {
        let ids = input_ids(&fam);
        let name = fam.file_name().unwrap().to_string_lossy().into_owned();
        check_family(&fam, &ids, &format!("{name} (as published)"));
        // gpt-oss is published quantized (MXFP4 experts, streamed as they lie in the file);
        // `coli convert` takes bf16/f16/f32/FP8 sources.
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fam.join("config.json")).unwrap()).unwrap();
        if cfg["quantization_config"]["quant_method"].is_string() {
            continue;
        }
        let tmp = tempfile::tempdir().unwrap();
        let o = ConvertOptions {
            input: fam.clone(),
            output: tmp.path().to_path_buf(),
            experts: parse_format("int4", 32).unwrap(),
            dense: WeightFormat::BF16,
            attention: None,
            lm_head: None,
            interleave: true,
        };
        convert(&o, &()).unwrap();
        check_family(tmp.path(), &ids, &format!("{name} (int4 container)"));
    }
}

#[test]
fn container_experts_are_one_aligned_read_each() {
    let fam = fixtures().join("olmoe");
    let tmp = tempfile::tempdir().unwrap();
    let o = ConvertOptions {
        input: fam.clone(),
        output: tmp.path().to_path_buf(),
        experts: parse_format("int4", 32).unwrap(),
        dense: WeightFormat::BF16,
        attention: None,
        lm_head: None,
        interleave: true,
    };
    convert(&o, &()).unwrap();
    let mut m = Model::load(tmp.path()).unwrap();
    let s = stream_with(&mut m, 1000, opts("lru", 1, false, true, None));
    m.score(&input_ids(&fam)).unwrap();
    let st = s.stats();
    assert_eq!(st.reads, st.misses, "{st}");
    assert_eq!(st.expert_bytes % 4096, 0);
}

#[test]
fn a_model_whose_resident_part_does_not_fit_is_refused_with_the_plan() {
    let m = Model::load(&fixtures().join("olmoe")).unwrap();
    let bytes = model_bytes(&m.net);
    assert!(bytes.resident > 0 && bytes.experts > 0 && bytes.expert_count == 2 * 8);
    let tiny = MemInfo {
        mem_total: 1 << 30,
        mem_available: bytes.resident / 2,
        ..MemInfo::default()
    };
    let e = MemoryPlan::new(bytes, tiny, None)
        .check()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("resident part alone")
            && e.contains("routed experts")
            && e.contains("expert cache budget"),
        "{e}"
    );
}

struct Recorder(Mutex<Vec<(usize, Vec<Route>)>>);
impl RoutingObserver for Recorder {
    fn observe(&self, layer: usize, routes: &[Route]) {
        self.0.lock().unwrap().push((layer, routes.to_vec()));
    }
}

fn set_hooks(m: &mut Model, f: impl Fn(usize, &mut MoeHooks)) {
    for (li, l) in m.net.layers.iter_mut().enumerate() {
        if let Ffn::Moe(x) = &mut l.ffn {
            x.hooks.layer = li;
            f(li, &mut x.hooks);
        }
    }
}

#[test]
fn observer_sees_every_layer_and_row() {
    let fam = fixtures().join("qwen3_moe");
    let ids = input_ids(&fam);
    let mut m = Model::load(&fam).unwrap();
    let plain = m.score(&ids).unwrap();
    let rec = Arc::new(Recorder(Mutex::new(Vec::new())));
    let obs: Arc<dyn RoutingObserver> = rec.clone();
    set_hooks(&mut m, |_, h| h.observer = Some(obs.clone()));
    assert_eq!(m.score(&ids).unwrap(), plain, "observing changes nothing");
    let seen = rec.0.lock().unwrap();
    let moe_layers: Vec<usize> = (0..m.net.layers.len())
        .filter(|&i| matches!(m.net.layers[i].ffn, Ffn::Moe(_)))
        .collect();
    assert_eq!(
        moe_layers,
        vec![0, 2],
        "the fixture's layer 1 is dense (mlp_only_layers)"
    );
    assert_eq!(seen.iter().map(|(l, _)| *l).collect::<Vec<_>>(), moe_layers);
    for (_, routes) in seen.iter() {
        assert_eq!(routes.len(), ids.len());
        assert!(routes.iter().all(|r| r.experts.len() == 2));
    }
}

/// Expert top-p is lossy: it reads fewer experts and moves the distribution a little. This
/// prints the table for docs/STREAMING.md (`cargo test --test streaming -- --nocapture`) and
/// checks the trend: fewer experts as p falls, KL 0 at p = 1.
#[test]
fn expert_top_p_bytes_saved_vs_kl() {
    eprintln!("family               p      experts kept   bytes saved   KL(resident || top-p) mean      max");
    for fam in families() {
        let ids = input_ids(&fam);
        let name = fam.file_name().unwrap().to_string_lossy().into_owned();
        let mut m = Model::load(&fam).unwrap();
        let base = m.score(&ids).unwrap();
        let v = m.info.vocab_size;
        let (layers, _) = experts_per_layer(&m);
        let top_k = match &m.net.layers.iter().find_map(|l| match &l.ffn {
            Ffn::Moe(x) => Some(x.top_k),
            Ffn::Dense(_) => None,
        }) {
            Some(k) => *k,
            None => unreachable!("families() keeps MoE models"),
        };
        let mut last_kept = f64::INFINITY;
        for p in [1.0f32, 0.95, 0.9, 0.8, 0.6] {
            let rec = Arc::new(Recorder(Mutex::new(Vec::new())));
            let obs: Arc<dyn RoutingObserver> = rec.clone();
            set_hooks(&mut m, |_, h| {
                h.top_p = Some(p);
                h.observer = Some(obs.clone());
            });
            let got = m.score(&ids).unwrap();
            let seen = rec.0.lock().unwrap();
            let applied: usize = seen
                .iter()
                .map(|(_, rs)| rs.iter().map(|r| r.experts.len()).sum::<usize>())
                .sum();
            let kept = applied as f64 / (ids.len() * layers * top_k) as f64;
            let kls: Vec<f64> = (0..ids.len())
                .map(|i| kl(&base[i * v..(i + 1) * v], &got[i * v..(i + 1) * v]))
                .collect();
            let mean = kls.iter().sum::<f64>() / kls.len() as f64;
            let max = kls.iter().cloned().fold(0.0, f64::max);
            eprintln!(
                "{name:<20} {p:<5} {:>10.1}% {:>12.1}%   {mean:>22.6} {max:>12.6}",
                100.0 * kept,
                100.0 * (1.0 - kept)
            );
            if p == 1.0 {
                assert_eq!(got, base);
            }
            assert!(kept <= last_kept + 1e-9, "{name}: fewer experts as p falls");
            last_kept = kept;
        }
    }
}

fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lp = log_softmax(p_logits);
    let lq = log_softmax(q_logits);
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
    x.iter().map(|&v| v as f64 - m - s.ln()).collect()
}
