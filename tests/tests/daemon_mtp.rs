//! MTP speculation through the daemon: the real `colibrid` drafts with the fixture's MTP
//! layer (one-off requests, concurrent requests batched with plain ones, sessions that
//! continue over several requests, the HTTP API), and greedy output stays transformers'
//! greedy output. Refusals: drafts asked of a model without MTP layers, or of a session
//! whose MTP cache is missing.

use colibri_proto::v1 as pb;
use colibri_tests::daemon::{load_model, Daemon};
use colibri_tests::http::post_json;
use colibri_tests::{fixture, Reference};
use pb::colibri_client::ColibriClient;
use pb::generate_event::Event;
use serde_json::json;
use std::path::Path;
use tonic::transport::Channel;
use tonic::{Code, Status};

const MTP_FAMILIES: &[&str] = &["deepseek_v3", "glm_moe_dsa"];

#[derive(Debug, Default)]
struct Run {
    ids: Vec<u32>,
    stats: pb::GenerationStats,
}

async fn generate(c: &mut ColibriClient<Channel>, req: pb::GenerateRequest) -> Result<Run, Status> {
    let mut s = c.generate(req).await?.into_inner();
    let mut run = Run::default();
    while let Some(ev) = s.message().await? {
        match ev.event {
            Some(Event::Tokens(t)) => run.ids.extend(&t.ids),
            Some(Event::Finished(f)) => run.stats = f.stats.unwrap_or_default(),
            _ => {}
        }
    }
    Ok(run)
}

fn greedy(
    model: &str,
    prompt: &[u32],
    max_tokens: usize,
    draft: Option<u32>,
) -> pb::GenerateRequest {
    pb::GenerateRequest {
        model: model.to_string(),
        prompt_ids: prompt.to_vec(),
        options: Some(pb::GenerationOptions {
            max_tokens: max_tokens as u32,
            ignore_eos: true,
            sampling: Some(pb::SamplingParams {
                temperature: Some(0.0),
                ..Default::default()
            }),
            draft_tokens: draft,
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn load(c: &mut ColibriClient<Channel>, dir: &Path) -> String {
    load_model(c, &dir.display().to_string(), None).await.id
}

fn spec(run: &Run) -> &pb::SpeculationStats {
    run.stats
        .speculation
        .as_ref()
        .expect("drafting was asked for: the stats say how it went")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_drafts_with_mtp_and_greedy_output_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("run").join("c.sock"),
        &dir.path().join("state"),
        // No prefix cache: the same prompt is asked for several times, and a prefix hit
        // turns automatic drafting off (the prefix cache keeps no MTP cache).
        &["--http", "127.0.0.1:0", "--prefix-cache", "0"],
    );
    let mut c = d.client().await;
    for family in MTP_FAMILIES {
        let r = Reference::load(family);
        let n = r.greedy_ids.len();
        let id = load(&mut c, &fixture(family)).await;

        // One-off requests: 2 drafts, automatic, none.
        let two = generate(&mut c, greedy(&id, &r.prompt_ids, n, Some(2)))
            .await
            .unwrap();
        assert_eq!(two.ids, r.greedy_ids, "{family}, 2 drafts");
        let st = spec(&two);
        assert!(st.drafted > 0 && st.steps > 0, "{family}: {st:?}");
        assert!(st.off_reason.is_empty(), "{family}: {st:?}");
        let auto = generate(&mut c, greedy(&id, &r.prompt_ids, n, None))
            .await
            .unwrap();
        assert_eq!(auto.ids, r.greedy_ids, "{family}, automatic");
        let st = spec(&auto);
        assert!(st.drafted > 0, "{family}: Auto drafts first: {st:?}");
        let off = generate(&mut c, greedy(&id, &r.prompt_ids, n, Some(0)))
            .await
            .unwrap();
        assert_eq!(off.ids, r.greedy_ids, "{family}, no drafts");
        assert!(off.stats.speculation.is_none());

        // Concurrent requests, drafting and not, batched in the same steps.
        let mut tasks = Vec::new();
        for draft in [Some(1), Some(3), Some(0), None] {
            let mut c = c.clone();
            let req = greedy(&id, &r.prompt_ids, n, draft);
            tasks.push(tokio::spawn(async move { generate(&mut c, req).await }));
        }
        for t in tasks {
            assert_eq!(
                t.await.unwrap().unwrap().ids,
                r.greedy_ids,
                "{family}, batched"
            );
        }

        // A session over three requests: the later ones continue from the pending token and
        // draft with the MTP cache the earlier ones left.
        for split in [1, n / 2] {
            let sid = format!("{family}-{split}");
            c.create_session(pb::CreateSessionRequest {
                model: id.clone(),
                id: sid.clone(),
            })
            .await
            .unwrap();
            let mut got = Vec::new();
            let parts = [
                (r.prompt_ids.clone(), split),
                (Vec::new(), (n - split) / 2),
                (Vec::new(), n - split - (n - split) / 2),
            ];
            for (k, (prompt, max)) in parts.into_iter().enumerate() {
                let mut req = greedy(&id, &prompt, max, Some(2));
                req.session_id = sid.clone();
                let run = generate(&mut c, req).await.unwrap();
                assert_eq!(run.ids.len(), max);
                if k > 0 && max > 2 {
                    let st = spec(&run);
                    assert!(st.drafted > 0, "{family}, turn {k} drafts: {st:?}");
                }
                got.extend(run.ids);
            }
            assert_eq!(got, r.greedy_ids, "{family}, session split after {split}");
        }

        // A session whose earlier request did not draft has no MTP cache: asking for
        // drafts is refused, Auto decodes plainly and says why.
        let sid = format!("{family}-plain");
        c.create_session(pb::CreateSessionRequest {
            model: id.clone(),
            id: sid.clone(),
        })
        .await
        .unwrap();
        let mut req = greedy(&id, &r.prompt_ids, 2, Some(0));
        req.session_id = sid.clone();
        generate(&mut c, req).await.unwrap();
        let mut req = greedy(&id, &[], 3, Some(2));
        req.session_id = sid.clone();
        let e = generate(&mut c, req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("MTP"), "{e:?}");
        let mut req = greedy(&id, &[], n - 2, None);
        req.session_id = sid.clone();
        let run = generate(&mut c, req).await.unwrap();
        assert_eq!(
            run.ids,
            r.greedy_ids[2..],
            "{family}: refused request lost nothing"
        );
        assert!(!spec(&run).off_reason.is_empty());
    }

    // The HTTP API's requests draft automatically (greedy): same tokens.
    let addr = colibri_tests::daemon::http_addr(&mut c).await;
    for family in MTP_FAMILIES {
        let r = Reference::load(family);
        let body = json!({"model": family, "prompt": r.prompt_ids, "max_tokens": r.greedy_ids.len(),
                          "temperature": 0, "ignore_eos": true, "return_token_ids": true});
        let resp = tokio::task::spawn_blocking(move || post_json(addr, "/v1/completions", &body))
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{}", resp.text());
        let ids: Vec<u32> = resp.json()["choices"][0]["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ids, r.greedy_ids, "{family} over HTTP");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_from_a_model_without_mtp_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("run").join("c.sock"),
        &dir.path().join("state"),
        &[],
    );
    let mut c = d.client().await;
    let id = load(&mut c, &fixture("olmoe")).await;
    let r = Reference::load("olmoe");
    let e = generate(&mut c, greedy(&id, &r.prompt_ids, 4, Some(2)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("no MTP layers"), "{e:?}");
    let auto = generate(&mut c, greedy(&id, &r.prompt_ids, 4, None))
        .await
        .unwrap();
    assert_eq!(auto.ids, r.greedy_ids[..4]);
    let st = spec(&auto);
    assert_eq!(st.drafted, 0);
    assert_eq!(st.off_reason, "the model has no MTP layers");
}
