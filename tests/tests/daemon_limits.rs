//! Bounded cost for any request, against the real `colibrid`: texts that cannot fit the
//! context are refused before they are tokenized in full (Generate, Chat, Tokenize, with and
//! without a session), oversized messages, Score and Detokenize requests are refused, and the
//! daemon answers normally afterwards.

use colibri_engine::Model;
use colibri_proto::v1 as pb;
use colibri_tests::daemon::{load_model, Daemon};
use colibri_tests::fixture;
use pb::colibri_client::ColibriClient;
use tonic::transport::Channel;
use tonic::Code;

fn options(max_tokens: u32) -> Option<pb::GenerationOptions> {
    Some(pb::GenerationOptions {
        max_tokens,
        ignore_eos: true,
        sampling: Some(pb::SamplingParams {
            temperature: Some(0.0),
            ..Default::default()
        }),
        ..Default::default()
    })
}

async fn load(c: &mut ColibriClient<Channel>) -> String {
    load_model(c, &fixture("olmoe").display().to_string(), None)
        .await
        .id
}

async fn gen_ids(
    c: &mut ColibriClient<Channel>,
    req: pb::GenerateRequest,
) -> Result<Vec<u32>, tonic::Status> {
    let mut s = c.generate(req).await?.into_inner();
    let mut ids = Vec::new();
    while let Some(ev) = s.message().await? {
        if let Some(pb::generate_event::Event::Tokens(t)) = ev.event {
            ids.extend(t.ids);
        }
    }
    Ok(ids)
}

fn refused(e: tonic::Status, code: Code, needles: &[&str]) {
    assert_eq!(e.code(), code, "{e:?}");
    for n in needles {
        assert!(e.message().contains(n), "'{}' lacks '{n}'", e.message());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn texts_that_cannot_fit_are_refused_before_tokenizing_and_the_rest_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("c.sock"), &dir.path().join("state"), &[]);
    let mut c = d.client().await;
    let id = load(&mut c).await;
    let model = Model::load(&fixture("olmoe")).unwrap();
    let text = model.text.as_ref().unwrap();
    assert_eq!(model.info.max_context, 256);

    // 4 MB of prompt text: refused, "at least" telling that it was not tokenized in full.
    let big = "The sea is blue. ".repeat(4 << 20 >> 4);
    let e = c
        .generate(pb::GenerateRequest {
            model: id.clone(),
            prompt_text: big.clone(),
            options: options(4),
            ..Default::default()
        })
        .await
        .unwrap_err();
    refused(e, Code::InvalidArgument, &["'prompt'", "at least", "256"]);

    // 8 MB to Tokenize: refused the same way, naming its field.
    let e = c
        .tokenize(pb::TokenizeRequest {
            model: id.clone(),
            text: big.repeat(2),
            ..Default::default()
        })
        .await
        .unwrap_err();
    refused(e, Code::InvalidArgument, &["'text'", "at least"]);

    // A chat whose rendered conversation cannot fit, through Chat and Tokenize.
    let msgs = vec![pb::ChatMessage {
        role: "user".into(),
        content: big.clone(),
        ..Default::default()
    }];
    let e = c
        .chat(pb::ChatRequest {
            model: id.clone(),
            messages: msgs.clone(),
            options: options(4),
            ..Default::default()
        })
        .await
        .unwrap_err();
    refused(e, Code::InvalidArgument, &["'messages'", "at least"]);
    let e = c
        .tokenize(pb::TokenizeRequest {
            model: id.clone(),
            messages: msgs,
            ..Default::default()
        })
        .await
        .unwrap_err();
    refused(e, Code::InvalidArgument, &["'messages'"]);

    // Just over the context by a little (tokenized in full, exact count) and just within.
    let fits = "sea ".repeat(40);
    let want = text.encode(&fits, true).unwrap();
    assert!(want.len() < 256);
    let got = c
        .tokenize(pb::TokenizeRequest {
            model: id.clone(),
            text: fits.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.ids, want);
    let over = "sea ".repeat(300);
    let n = text.encode(&over, true).unwrap().len();
    assert!(n > 256 && over.len() < 256 * 13, "{n}");
    let e = c
        .tokenize(pb::TokenizeRequest {
            model: id.clone(),
            text: over,
            ..Default::default()
        })
        .await
        .unwrap_err();
    refused(
        e,
        Code::InvalidArgument,
        &["'text'", &format!("{n} tokens")],
    );

    // A session's room is what its context has left.
    c.create_session(pb::CreateSessionRequest {
        model: id.clone(),
        id: "room".into(),
    })
    .await
    .unwrap();
    let first = "sea ".repeat(100);
    let first_len = text.encode(&first, true).unwrap().len();
    let turn = |t: &str, max| pb::GenerateRequest {
        model: id.clone(),
        session_id: "room".into(),
        prompt_text: t.to_string(),
        options: options(max),
        ..Default::default()
    };
    assert_eq!(gen_ids(&mut c, turn(&first, 2)).await.unwrap().len(), 2);
    // This text fits an empty context, not what the session has left.
    let second = "sea ".repeat(100);
    assert!(first_len + 2 + text.encode(&second, false).unwrap().len() > 256);
    let e = gen_ids(&mut c, turn(&second, 2)).await.unwrap_err();
    refused(e, Code::InvalidArgument, &["'prompt'"]);
    // ... and the session is intact: a short turn continues it.
    assert_eq!(gen_ids(&mut c, turn(" sea", 2)).await.unwrap().len(), 2);

    // Score: more ids than the context, refused before queueing.
    let e = c
        .score(pb::ScoreRequest {
            model: id.clone(),
            ids: vec![1; 10_000],
            argmax_only: true,
        })
        .await
        .unwrap_err();
    refused(e, Code::InvalidArgument, &["'ids'", "context"]);
    // Detokenize: not bound by the context, but by a cap.
    let e = c
        .detokenize(pb::DetokenizeRequest {
            model: id.clone(),
            ids: vec![1; (1 << 20) + 1],
            ..Default::default()
        })
        .await
        .unwrap_err();
    refused(e, Code::InvalidArgument, &["'ids'"]);
    // A message over the server's 64 MiB limit is refused by tonic from its length prefix,
    // before it is buffered.
    let e = c
        .tokenize(pb::TokenizeRequest {
            model: id.clone(),
            text: "x".repeat(65 << 20),
            ..Default::default()
        })
        .await
        .unwrap_err();
    refused(e, Code::OutOfRange, &["67108864"]);

    // The daemon carries on.
    let ids = gen_ids(
        &mut c,
        pb::GenerateRequest {
            model: id.clone(),
            prompt_ids: vec![1, 2, 3],
            options: options(3),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(ids.len(), 3);
}
