//! The engine against Hugging Face transformers: every fixture family's teacher-forced
//! logits, argmax, 20-token greedy continuation, and KV-cache consistency.

use colibri_engine::{LogitsWanted, Model, SeqStep};
use colibri_tests::{fixture, max_abs_diff, top2, Reference, FAMILIES, LOGIT_TOL};

fn check_teacher_forced(family: &str) {
    let model = Model::load(&fixture(family)).unwrap_or_else(|e| panic!("{family}: {e}"));
    let r = Reference::load(family);
    let vocab = model.info.vocab_size;
    let logits = model.score(&r.input_ids).unwrap();
    assert_eq!(logits.len(), r.input_ids.len() * vocab);
    let mut worst = 0f32;
    for (p, want) in r.logits.iter().enumerate() {
        let got = &logits[p * vocab..(p + 1) * vocab];
        let d = max_abs_diff(got, want);
        worst = worst.max(d);
        assert!(d < LOGIT_TOL, "{family}: position {p}: max |Δlogit| = {d}");
        let (want_arg, gap) = top2(want);
        if gap > 1e-3 {
            assert_eq!(
                top2(got).0,
                want_arg,
                "{family}: argmax differs at position {p}"
            );
        }
    }
    eprintln!(
        "{family}: max |Δlogit| over {} positions = {worst:.2e}",
        r.logits.len()
    );
}

fn check_greedy(family: &str) {
    let model = Model::load(&fixture(family)).unwrap();
    Reference::load(family).assert_greedy(&model, family);
}

/// Prefill of the prompt then one token at a time gives the one-pass logits.
fn check_kv_consistency(family: &str) {
    let model = Model::load(&fixture(family)).unwrap();
    let r = Reference::load(family);
    let vocab = model.info.vocab_size;
    let full = model.score(&r.input_ids).unwrap();
    let mut cache = model.new_cache();
    let np = r.prompt_ids.len();
    let mut step = [SeqStep {
        cache: &mut cache,
        tokens: &r.input_ids[..np],
        logits: LogitsWanted::All,
    }];
    let pre = model.forward(&mut step).unwrap().remove(0);
    assert!(
        max_abs_diff(&pre, &full[..np * vocab]) < 1e-4,
        "{family}: prefill"
    );
    for p in np..r.input_ids.len() {
        let got = model.step(&mut cache, &r.input_ids[p..p + 1]).unwrap();
        let d = max_abs_diff(&got, &full[p * vocab..(p + 1) * vocab]);
        assert!(d < 1e-4, "{family}: decode at position {p}: {d}");
    }
}

/// Two sequences in one batched step get exactly what each gets alone.
fn check_batch_independence(family: &str) {
    let model = Model::load(&fixture(family)).unwrap();
    let r = Reference::load(family);
    let a = &r.input_ids[..10];
    let b = &r.input_ids[5..20];
    let solo_a = model.score(a).unwrap();
    let solo_b = model.score(b).unwrap();
    let (mut ca, mut cb) = (model.new_cache(), model.new_cache());
    let mut batch = [
        SeqStep {
            cache: &mut ca,
            tokens: a,
            logits: LogitsWanted::All,
        },
        SeqStep {
            cache: &mut cb,
            tokens: b,
            logits: LogitsWanted::All,
        },
    ];
    let out = model.forward(&mut batch).unwrap();
    assert!(max_abs_diff(&out[0], &solo_a) < 1e-4);
    assert!(max_abs_diff(&out[1], &solo_b) < 1e-4);
}

macro_rules! family_tests {
    ($($name:ident => $family:literal),* $(,)?) => {
        $(mod $name {
            #[test]
            fn teacher_forced_logits_match_transformers() { super::check_teacher_forced($family) }
            #[test]
            fn greedy_continuation_matches_transformers() { super::check_greedy($family) }
            #[test]
            fn prefill_then_decode_equals_one_pass() { super::check_kv_consistency($family) }
            #[test]
            fn batched_sequences_are_independent() { super::check_batch_independence($family) }
        })*
        #[test]
        fn every_family_has_tests() {
            let listed = [$($family),*];
            for f in FAMILIES { assert!(listed.contains(f), "{f} has no tests"); }
        }
    };
}

family_tests! {
    olmoe => "olmoe",
    qwen3_moe => "qwen3_moe",
    mixtral => "mixtral",
    deepseek_v3 => "deepseek_v3",
    deepseek_v3_noqlora => "deepseek_v3_noqlora",
    deepseek_v32 => "deepseek_v32",
    glm4_moe => "glm4_moe",
    glm_moe_dsa => "glm_moe_dsa",
    gpt_oss => "gpt_oss",
    kimi_k25 => "kimi_k25",
}
