//! Speculative decoding: greedy output identical to plain decoding (MTP drafts and external
//! drafts, accepted and rejected), sampled output with the model's exact distribution (a
//! chi-square test over many seeds), acceptance statistics, Auto mode and errors.

use colibri_engine::speculative::ExternalDrafter;
use colibri_engine::{
    DraftMode, Error, GenerateRequest, Generation, Model, SamplingParams, SpecStats,
    SpeculativeGeneration,
};
use colibri_tests::{fixture, Reference};
use std::collections::HashMap;

fn greedy_request(r: &Reference) -> GenerateRequest {
    GenerateRequest {
        prompt: r.prompt_ids.clone(),
        max_tokens: r.greedy_ids.len(),
        sampling: SamplingParams::default(),
        ignore_eos: true,
        ..Default::default()
    }
}

fn run_spec(model: &Model, s: &mut SpeculativeGeneration) -> Vec<u32> {
    let mut events = Vec::new();
    s.run(model, 64, |ev| events.push(ev.token.unwrap()))
        .unwrap();
    assert_eq!(
        events,
        s.generation().generated(),
        "every token is reported once"
    );
    events
}

fn report(what: &str, st: &SpecStats) {
    eprintln!(
        "{what}: {} drafting steps, {} drafted, {} accepted ({:.0}%), {} tokens from drafting steps, {} plain steps{}",
        st.spec_steps,
        st.drafted,
        st.accepted,
        st.acceptance() * 100.0,
        st.spec_tokens,
        st.plain_steps,
        st.disabled.as_ref().map(|d| format!("; off: {d}")).unwrap_or_default()
    );
}

#[test]
fn greedy_with_mtp_drafts_is_plain_greedy() {
    for family in ["deepseek_v3", "glm_moe_dsa"] {
        let model = Model::load(&fixture(family)).unwrap();
        assert_eq!(
            model.net.mtp.len(),
            1,
            "{family} fixture carries an MTP layer"
        );
        let r = Reference::load(family);
        for k in [1, 2, 4] {
            let mut s = SpeculativeGeneration::new(
                &model,
                model.new_cache(),
                greedy_request(&r),
                DraftMode::Tokens(k),
            )
            .unwrap();
            let out = run_spec(&model, &mut s);
            assert_eq!(out, r.greedy_ids, "{family}, {k} drafts per step");
            let st = s.stats();
            report(&format!("{family} greedy, MTP, k={k}"), st);
            assert!(st.spec_steps > 0 && st.drafted > 0);
            assert_eq!(st.plain_steps, 0, "a forced draft count never probes");
            // The cache holds every token but the last, as after plain decoding.
            let plain_len = r.prompt_ids.len() + r.greedy_ids.len() - 1;
            assert_eq!(s.generation().cache.len(), plain_len);
        }
    }
}

/// A drafter that proposes the known greedy continuation, wrong at the positions `i` with
/// `i % wrong_every == 1` (none when 0): exercises acceptance, rejection and the bonus token.
fn continuation_drafter(
    prompt_len: usize,
    continuation: Vec<u32>,
    wrong_every: usize,
) -> ExternalDrafter {
    Box::new(move |history: &[u32], k: usize| {
        let at = history.len() - prompt_len; // index in `continuation` of the next token
        (0..k)
            .filter_map(|j| continuation.get(at + j).copied().map(|t| (at + j, t)))
            .map(|(i, t)| {
                if wrong_every > 0 && i % wrong_every == 1 {
                    (t + 1) % 512
                } else {
                    t
                }
            })
            .collect()
    })
}

#[test]
fn greedy_with_external_drafts_is_plain_greedy() {
    for family in ["deepseek_v3", "glm4_moe", "glm_moe_dsa", "olmoe"] {
        let model = Model::load(&fixture(family)).unwrap();
        let r = Reference::load(family);
        for (k, wrong_every) in [(3, 0), (3, 4), (2, 3), (5, 7)] {
            let drafter =
                continuation_drafter(r.prompt_ids.len(), r.greedy_ids.clone(), wrong_every);
            let mut s = SpeculativeGeneration::with_drafter(
                &model,
                model.new_cache(),
                greedy_request(&r),
                DraftMode::Tokens(k),
                drafter,
            )
            .unwrap();
            let out = run_spec(&model, &mut s);
            assert_eq!(
                out, r.greedy_ids,
                "{family}, k={k}, wrong every {wrong_every}"
            );
            let st = s.stats();
            report(
                &format!("{family} greedy, continuation drafts, k={k}, wrong every {wrong_every}"),
                st,
            );
            if wrong_every == 0 {
                assert_eq!(st.accepted, st.drafted, "perfect drafts are all accepted");
                assert!(st.spec_steps <= r.greedy_ids.len().div_ceil(k + 1) + 1);
            } else {
                assert!(st.accepted > 0 && st.accepted < st.drafted);
            }
        }
    }
}

/// Top-k sampling keeps the support small enough to enumerate: the exact distribution of
/// the first `depth` generated tokens, from the model's own logits.
fn exact_joint(
    model: &Model,
    prompt: &[u32],
    params: &SamplingParams,
    depth: usize,
) -> HashMap<Vec<u32>, f64> {
    let mut out = HashMap::new();
    let mut frontier = vec![(Vec::<u32>::new(), 1.0f64)];
    for _ in 0..depth {
        let mut next = Vec::new();
        for (prefix, p) in frontier {
            let mut ids = prompt.to_vec();
            ids.extend_from_slice(&prefix);
            let mut cache = model.new_cache();
            let logits = model.step(&mut cache, &ids).unwrap();
            let mut sampler = colibri_engine::Sampler::new(params.clone());
            for (t, pt) in sampler.distribution(&logits, &ids) {
                let mut longer = prefix.clone();
                longer.push(t);
                next.push((longer, p * pt));
            }
        }
        frontier = next;
    }
    for (k, p) in frontier {
        out.insert(k, p);
    }
    out
}

/// Pearson chi-square of observed sequences against `exact`, cells with expectation below 5
/// pooled; returns (statistic, degrees of freedom).
fn chi_square(
    exact: &HashMap<Vec<u32>, f64>,
    observed: &HashMap<Vec<u32>, usize>,
    n: usize,
) -> (f64, usize) {
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pooled_e, mut pooled_o) = (0.0, 0usize);
    for (k, p) in exact {
        let e = p * n as f64;
        let o = observed.get(k).copied().unwrap_or(0);
        if e >= 5.0 {
            stat += (o as f64 - e).powi(2) / e;
            cells += 1;
        } else {
            pooled_e += e;
            pooled_o += o;
        }
    }
    let unexpected: usize = observed
        .iter()
        .filter(|(k, _)| !exact.contains_key(*k))
        .map(|(_, o)| o)
        .sum();
    assert_eq!(
        unexpected, 0,
        "sequences the exact distribution gives probability 0"
    );
    if pooled_e > 0.0 {
        stat += (pooled_o as f64 - pooled_e).powi(2) / pooled_e.max(1e-9);
        cells += 1;
    }
    (stat, cells - 1)
}

/// Chi-square quantile for p = 1e-4 (Wilson–Hilferty).
fn critical(df: usize) -> f64 {
    let d = df as f64;
    let z = 3.719;
    d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

fn sample_many(
    model: &Model,
    prompt: &[u32],
    params: &SamplingParams,
    depth: usize,
    seeds: std::ops::Range<u64>,
    mut make: impl FnMut(GenerateRequest) -> Option<SpeculativeGeneration>,
) -> (HashMap<Vec<u32>, usize>, SpecStats) {
    let mut counts = HashMap::new();
    let mut total = SpecStats::default();
    for seed in seeds {
        let req = GenerateRequest {
            prompt: prompt.to_vec(),
            max_tokens: depth,
            sampling: SamplingParams {
                seed,
                ..params.clone()
            },
            ignore_eos: true,
            ..Default::default()
        };
        let out = match make(req.clone()) {
            Some(mut s) => {
                s.run(model, 64, |_| {}).unwrap();
                let st = s.stats();
                total.spec_steps += st.spec_steps;
                total.drafted += st.drafted;
                total.accepted += st.accepted;
                total.spec_tokens += st.spec_tokens;
                s.generation().generated().to_vec()
            }
            None => {
                let mut g = Generation::new(model, model.new_cache(), req).unwrap();
                g.run(model, 64, |_| {}).unwrap();
                g.generated().to_vec()
            }
        };
        *counts.entry(out).or_insert(0) += 1;
    }
    (counts, total)
}

#[test]
fn sampled_output_has_the_model_distribution() {
    let family = "deepseek_v3";
    let model = Model::load(&fixture(family)).unwrap();
    let r = Reference::load(family);
    let prompt = &r.prompt_ids;
    // A temperature above 1 flattens the random model's logits so that every branch is
    // visited; top-k keeps the tree small.
    let params = SamplingParams {
        temperature: 1.5,
        top_k: 4,
        ..Default::default()
    };
    let depth = 3;
    let n = 2000u64;
    let exact = exact_joint(&model, prompt, &params, depth);
    assert!((exact.values().sum::<f64>() - 1.0).abs() < 1e-6);

    let plain = sample_many(&model, prompt, &params, depth, 0..n, |_| None).0;
    let mtp = sample_many(&model, prompt, &params, depth, 0..n, |req| {
        Some(
            SpeculativeGeneration::new(&model, model.new_cache(), req, DraftMode::Tokens(2))
                .unwrap(),
        )
    });
    // Drafts of the most likely continuation: many accepted, the rest resampled.
    let greedy = r.greedy_ids.clone();
    let external = sample_many(&model, prompt, &params, depth, 0..n, |req| {
        let drafter = continuation_drafter(prompt.len(), greedy.clone(), 0);
        Some(
            SpeculativeGeneration::with_drafter(
                &model,
                model.new_cache(),
                req,
                DraftMode::Tokens(2),
                drafter,
            )
            .unwrap(),
        )
    });
    for (what, counts) in [
        ("plain", &plain),
        ("MTP drafts", &mtp.0),
        ("greedy-continuation drafts", &external.0),
    ] {
        let (stat, df) = chi_square(&exact, counts, n as usize);
        eprintln!(
            "{what}: chi-square {stat:.1} on {df} degrees of freedom (p = 1e-4 bound {:.1})",
            critical(df)
        );
        assert!(stat < critical(df), "{what}: {stat} on {df} df");
    }
    report("deepseek_v3 sampled, MTP, k=2 (all seeds)", &mtp.1);
    report(
        "deepseek_v3 sampled, continuation drafts, k=2 (all seeds)",
        &external.1,
    );
    assert!(mtp.1.drafted > 0);
    assert!(external.1.accepted > 0 && external.1.accepted < external.1.drafted);
}

/// The MTP cache built step by step (catch-up from verified rows, guessed rows dropped) is
/// the cache one pass over the final sequence builds.
#[test]
fn mtp_cache_after_speculation_equals_one_pass() {
    for family in ["deepseek_v3", "glm_moe_dsa"] {
        let model = Model::load(&fixture(family)).unwrap();
        let r = Reference::load(family);
        let mut s = SpeculativeGeneration::new(
            &model,
            model.new_cache(),
            greedy_request(&r),
            DraftMode::Tokens(3),
        )
        .unwrap();
        run_spec(&model, &mut s);
        let got = s.mtp_cache().unwrap();
        let m = got.len();
        assert!(
            m > r.prompt_ids.len(),
            "{family}: the MTP layer saw generated positions"
        );
        let want = mtp_cache_in_one_pass(&model, &r.input_ids, m);
        let (a, b) = (&got.layers[0], &want.layers[0]);
        assert_eq!(
            (a.k.len(), a.extra.len()),
            (b.k.len(), b.extra.len()),
            "{family}"
        );
        let d = colibri_tests::max_abs_diff(&a.k.to_f32_vec(), &b.k.to_f32_vec())
            .max(colibri_tests::max_abs_diff(&a.extra, &b.extra));
        assert!(d < 1e-4, "{family}: MTP cache differs by {d}");
    }
}

#[test]
fn draft_flags() {
    assert_eq!(DraftMode::from_flags(None, false).unwrap(), DraftMode::Auto);
    assert_eq!(
        DraftMode::from_flags(Some(3), false).unwrap(),
        DraftMode::Tokens(3)
    );
    assert_eq!(
        DraftMode::from_flags(Some(0), false).unwrap(),
        DraftMode::Off
    );
    assert_eq!(DraftMode::from_flags(None, true).unwrap(), DraftMode::Off);
    assert!(DraftMode::from_flags(Some(2), true).is_err());
}

#[test]
fn auto_mode_keeps_greedy_output_and_reports_why_it_stops() {
    for family in ["deepseek_v3", "glm_moe_dsa", "glm4_moe"] {
        let model = Model::load(&fixture(family)).unwrap();
        let r = Reference::load(family);
        let mut s = SpeculativeGeneration::new(
            &model,
            model.new_cache(),
            greedy_request(&r),
            DraftMode::Auto,
        )
        .unwrap();
        assert_eq!(run_spec(&model, &mut s), r.greedy_ids, "{family}");
        let st = s.stats();
        report(&format!("{family} greedy, Auto"), st);
        if model.net.mtp.is_empty() {
            assert_eq!(st.disabled.as_deref(), Some("the model has no MTP layers"));
            assert_eq!(st.spec_steps, 0);
        } else {
            assert!(st.plain_steps >= 2, "Auto measures plain steps");
        }
    }
}

#[test]
fn asking_for_drafts_without_mtp_is_an_error() {
    let model = Model::load(&fixture("olmoe")).unwrap();
    let r = Reference::load("olmoe");
    match SpeculativeGeneration::new(
        &model,
        model.new_cache(),
        greedy_request(&r),
        DraftMode::Tokens(2),
    ) {
        Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "draft"),
        other => panic!("expected an invalid-argument error, got {:?}", other.err()),
    }
    // Off behaves as plain decoding.
    let mut s = SpeculativeGeneration::new(
        &model,
        model.new_cache(),
        greedy_request(&r),
        DraftMode::Off,
    )
    .unwrap();
    assert_eq!(run_spec(&model, &mut s), r.greedy_ids);
    assert_eq!(s.stats().spec_steps, 0);
}

/// A generation that continues a sequence drafts with the MTP cache the previous one left
/// (the daemon's sessions): greedy output over two requests equals one plain greedy run, the
/// second request drafts, and its MTP cache is what one pass over the whole sequence builds.
/// Without that MTP cache, asking for drafts is refused and Auto decodes plainly.
#[test]
fn continued_sequence_drafts_with_the_mtp_cache_it_left() {
    for family in ["deepseek_v3", "glm_moe_dsa"] {
        let model = Model::load(&fixture(family)).unwrap();
        let r = Reference::load(family);
        for split in [1, 3, r.greedy_ids.len() / 2] {
            let mut first = greedy_request(&r);
            first.max_tokens = split;
            let mut s =
                SpeculativeGeneration::new(&model, model.new_cache(), first, DraftMode::Tokens(2))
                    .unwrap();
            let mut out = run_spec(&model, &mut s);
            let (gen, mtp) = s.into_parts(&model);
            let mtp = mtp.expect("still drafting: the MTP cache is handed on");
            let pending = gen.pending_token().unwrap();
            let cache = gen.into_cache();
            assert_eq!(
                mtp.len(),
                cache.len(),
                "{family}: caught up with the main cache"
            );
            let second = GenerateRequest {
                prompt: vec![pending],
                max_tokens: r.greedy_ids.len() - split,
                sampling: SamplingParams::default(),
                ignore_eos: true,
                ..Default::default()
            };
            // Without the MTP cache: refused when asked for, plain under Auto.
            assert!(SpeculativeGeneration::continuing(
                &model,
                cache.clone(),
                None,
                second.clone(),
                DraftMode::Tokens(2)
            )
            .is_err());
            let auto = SpeculativeGeneration::continuing(
                &model,
                cache.clone(),
                None,
                second.clone(),
                DraftMode::Auto,
            )
            .unwrap();
            assert!(auto.stats().disabled.is_some());
            let mut s = SpeculativeGeneration::continuing(
                &model,
                cache,
                Some(mtp),
                second,
                DraftMode::Tokens(2),
            )
            .unwrap();
            out.extend(run_spec(&model, &mut s));
            assert_eq!(out, r.greedy_ids, "{family}, split after {split}");
            let st = s.stats();
            report(&format!("{family} continued after {split}, MTP, k=2"), st);
            assert!(st.drafted > 0, "{family}: the continuation drafted");
            // The MTP cache equals one pass over the sequence.
            let got = s.mtp_cache().unwrap();
            let m = got.len();
            let want = mtp_cache_in_one_pass(&model, &r.input_ids, m);
            let d = colibri_tests::max_abs_diff(
                &got.layers[0].k.to_f32_vec(),
                &want.layers[0].k.to_f32_vec(),
            )
            .max(colibri_tests::max_abs_diff(
                &got.layers[0].extra,
                &want.layers[0].extra,
            ));
            assert!(d < 1e-4, "{family}: MTP cache differs by {d}");
        }
    }
}

/// The MTP layer's cache of the first `m` positions of `seq`, computed in one pass (the
/// main model's hidden states of `seq[..m]`, the MTP layer fed `seq[1..m + 1]`): what
/// drafting step by step must have left.
fn mtp_cache_in_one_pass(model: &Model, seq: &[u32], m: usize) -> colibri_engine::KvCache {
    use colibri_engine::{LogitsWanted, SeqStep};
    let mut cache = model.new_cache();
    let mut step = [SeqStep {
        cache: &mut cache,
        tokens: &seq[..m],
        logits: LogitsWanted::None,
    }];
    let (_, hidden) = model
        .net
        .forward_with_hidden(&mut step, &[LogitsWanted::All]);
    let mut want = model.net.new_mtp_cache(0);
    model
        .net
        .mtp_forward(0, &mut want, &seq[1..m + 1], &hidden[0], LogitsWanted::None);
    want
}
