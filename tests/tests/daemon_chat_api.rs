//! The chat-API features of the daemon over a real socket: tool calls (rendered by the
//! fixture's real Qwen3 chat template, forced by tool_choice, parsed back, results given
//! back), structured output, logprobs, frequency/presence penalties and the prefix cache.

use colibri_proto::v1 as pb;
use colibri_tests::daemon::{load_model, Daemon};
use colibri_tests::fixture;
use pb::colibri_client::ColibriClient;
use pb::generate_event::Event;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tonic::transport::Channel;
use tonic::{Code, Status};

struct Place {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    state: PathBuf,
}

fn place() -> Place {
    let dir = tempfile::tempdir().unwrap();
    Place {
        socket: dir.path().join("run").join("colibrid.sock"),
        state: dir.path().join("state"),
        _dir: dir,
    }
}

#[derive(Debug, Default)]
struct Run {
    ids: Vec<u32>,
    text: String,
    reasoning: String,
    logits: Vec<Vec<f32>>,
    logprobs: Vec<pb::TokenLogprob>,
    deltas: Vec<pb::ToolCallDelta>,
    finished: Option<pb::generate_event::Finished>,
}

impl Run {
    fn finish(&self) -> pb::FinishReason {
        pb::FinishReason::try_from(self.finished.as_ref().unwrap().reason).unwrap()
    }
    fn stats(&self) -> pb::GenerationStats {
        self.finished.as_ref().unwrap().stats.clone().unwrap()
    }
}

async fn collect(mut s: tonic::Streaming<pb::GenerateEvent>) -> Result<Run, Status> {
    let mut run = Run::default();
    while let Some(ev) = s.message().await? {
        match ev.event {
            Some(Event::Tokens(t)) => {
                assert_eq!(
                    t.logprobs.len(),
                    if t.logprobs.is_empty() {
                        0
                    } else {
                        t.ids.len()
                    }
                );
                run.ids.extend(&t.ids);
                run.text.push_str(&t.text);
                run.reasoning.push_str(&t.reasoning);
                if !t.logits.is_empty() {
                    run.logits.push(t.logits);
                }
                run.logprobs.extend(t.logprobs);
                run.deltas.extend(t.tool_calls);
            }
            Some(Event::Finished(f)) => run.finished = Some(f),
            _ => {}
        }
    }
    Ok(run)
}

async fn load(c: &mut ColibriClient<Channel>, dir: &Path) -> pb::ModelInfo {
    load_model(c, &dir.display().to_string(), None).await
}

fn user(text: &str) -> pb::ChatMessage {
    pb::ChatMessage {
        role: "user".into(),
        content: text.into(),
        ..Default::default()
    }
}

fn weather_tool() -> pb::Tool {
    pb::Tool {
        name: "get_weather".into(),
        description: "Current weather in a city".into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}
            },
            "required": ["city", "days"]
        })
        .to_string(),
    }
}

fn options(max_tokens: u32, temperature: f32) -> pb::GenerationOptions {
    pb::GenerationOptions {
        max_tokens,
        sampling: Some(pb::SamplingParams {
            temperature: Some(temperature),
            seed: Some(7),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn code(r: Result<Run, Status>) -> (Code, String) {
    let e = r.expect_err("the request should be refused");
    (e.code(), e.message().to_string())
}

async fn chat(c: &mut ColibriClient<Channel>, req: pb::ChatRequest) -> Result<Run, Status> {
    collect(c.chat(req).await?.into_inner()).await
}

async fn generate(c: &mut ColibriClient<Channel>, req: pb::GenerateRequest) -> Result<Run, Status> {
    collect(c.generate(req).await?.into_inner()).await
}

fn check_weather_args(args: &str) {
    let v: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        ["Paris", "Oslo", "Lima"].contains(&v["city"].as_str().unwrap()),
        "{v}"
    );
    assert!((1..=7).contains(&v["days"].as_i64().unwrap()), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_round_trip_through_the_real_template() {
    let p = place();
    let d = Daemon::start(&p.socket, &p.state, &[]);
    let mut c = d.client().await;
    let info = load(&mut c, &fixture("qwen3_moe")).await;
    assert_eq!(info.tool_call_format, "qwen3");
    assert!(info.has_reasoning && info.has_chat_template);
    let id = info.id;

    // A forced call: the random-weight model writes a well-formed Qwen3 call.
    for (temperature, parallel) in [(0.0, Some(false)), (1.0, Some(false)), (1.0, None)] {
        let req = pb::ChatRequest {
            model: id.clone(),
            messages: vec![user("Weather in Oslo for 3 days?")],
            tools: vec![weather_tool()],
            tool_choice: Some(pb::ToolChoice {
                mode: pb::tool_choice::Mode::Required as i32,
                ..Default::default()
            }),
            parallel_tool_calls: parallel,
            options: Some(options(200, temperature)),
            ..Default::default()
        };
        let run = chat(&mut c, req).await.unwrap();
        let f = run.finished.clone().unwrap();
        assert_eq!(run.finish(), pb::FinishReason::ToolCalls, "{run:?}");
        assert!(!f.tool_call_incomplete);
        assert_eq!(run.text, "", "the call syntax is not content");
        if parallel == Some(false) {
            assert_eq!(f.tool_calls.len(), 1);
        }
        for (i, call) in f.tool_calls.iter().enumerate() {
            assert_eq!(call.name, "get_weather");
            assert!(call.id.starts_with("call_"), "{}", call.id);
            check_weather_args(&call.arguments);
            // Streamed: the first delta names the call, the fragments add up.
            let mine: Vec<&pb::ToolCallDelta> = run
                .deltas
                .iter()
                .filter(|d| d.index as usize == i)
                .collect();
            assert_eq!(
                (mine[0].id.as_str(), mine[0].name.as_str()),
                (call.id.as_str(), "get_weather")
            );
            let args: String = mine.iter().map(|d| d.arguments.as_str()).collect();
            assert_eq!(args, call.arguments);
        }
    }

    // Named choice, then the tool's result goes back through the template.
    let req = pb::ChatRequest {
        model: id.clone(),
        messages: vec![user("Weather in Lima?")],
        tools: vec![weather_tool()],
        tool_choice: Some(pb::ToolChoice {
            mode: pb::tool_choice::Mode::Named as i32,
            name: "get_weather".into(),
        }),
        options: Some(options(200, 0.0)),
        ..Default::default()
    };
    let first = chat(&mut c, req.clone()).await.unwrap();
    let call = first.finished.clone().unwrap().tool_calls[0].clone();
    let history = vec![
        user("Weather in Lima?"),
        pb::ChatMessage {
            role: "assistant".into(),
            tool_calls: vec![call.clone()],
            ..Default::default()
        },
        pb::ChatMessage {
            role: "tool".into(),
            content: "{\"temp_c\": 19}".into(),
            tool_call_id: call.id.clone(),
            name: "get_weather".into(),
            ..Default::default()
        },
    ];
    // The rendered prompt holds the tool response (Tokenize renders without tools; the
    // chat request below renders with them).
    let mut answer = pb::ChatRequest {
        model: id.clone(),
        messages: history.clone(),
        tools: vec![weather_tool()],
        options: Some(pb::GenerationOptions {
            ignore_eos: true,
            ..options(6, 0.0)
        }),
        ..Default::default()
    };
    let r = chat(&mut c, answer.clone()).await.unwrap();
    assert_eq!(r.ids.len(), 6);
    assert_eq!(r.finish(), pb::FinishReason::Length);
    // tool_choice none: tools are not offered, so the prompt is shorter.
    answer.tool_choice = Some(pb::ToolChoice {
        mode: pb::tool_choice::Mode::None as i32,
        ..Default::default()
    });
    let none = chat(&mut c, answer).await.unwrap();
    let prompt = |r: &Run| r.stats().prompt_tokens + r.stats().cached_tokens;
    assert!(
        prompt(&none) < prompt(&r),
        "{} vs {}",
        prompt(&none),
        prompt(&r)
    );

    // A call cut off by max_tokens (inside its opening tag, or after its name): no
    // complete call, no markup as content.
    for n in [6, 30] {
        let mut cut = req.clone();
        cut.options = Some(options(n, 0.0));
        let run = chat(&mut c, cut).await.unwrap();
        let f = run.finished.clone().unwrap();
        assert_eq!(run.finish(), pb::FinishReason::Length);
        assert!(f.tool_calls.is_empty() && f.tool_call_incomplete, "{run:?}");
        assert_eq!(run.text, "");
        if n == 30 {
            assert_eq!(run.deltas[0].name, "get_weather", "{run:?}");
        }
    }

    // Refusals name the field.
    let mut bad = req.clone();
    bad.tool_choice.as_mut().unwrap().name = "nope".into();
    let (code_, msg) = code(chat(&mut c, bad).await);
    assert_eq!(code_, Code::InvalidArgument);
    assert!(msg.contains("tool_choice.name"), "{msg}");
    let mut bad = req.clone();
    bad.tools[0].parameters = "{not json".into();
    let (code_, msg) = code(chat(&mut c, bad).await);
    assert_eq!(code_, Code::InvalidArgument);
    assert!(msg.contains("tools[0].parameters"), "{msg}");

    // A family whose template has no tool syntax: tools are refused.
    let olmoe = load(&mut c, &fixture("olmoe")).await;
    assert_eq!(olmoe.tool_call_format, "");
    let mut bad = req.clone();
    bad.model = olmoe.id;
    let (code_, msg) = code(chat(&mut c, bad).await);
    assert_eq!(code_, Code::InvalidArgument);
    assert!(msg.contains("tools"), "{msg}");
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
            "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
            "sure": {"type": "boolean"}
        },
        "required": ["answer", "confidence", "sure"],
        "additionalProperties": false
    })
}

fn check_schema(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert!(
        ["yes", "no", "maybe"].contains(&v["answer"].as_str().unwrap()),
        "{v}"
    );
    assert!(
        (0..=100).contains(&v["confidence"].as_i64().unwrap()),
        "{v}"
    );
    assert!(v["sure"].is_boolean(), "{v}");
    assert_eq!(v.as_object().unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_output_parses_and_validates() {
    let p = place();
    let d = Daemon::start(&p.socket, &p.state, &[]);
    let mut c = d.client().await;
    let qwen = load(&mut c, &fixture("qwen3_moe")).await.id;
    let olmoe = load(&mut c, &fixture("olmoe")).await.id;
    let format = |t: pb::response_format::Type, schema: &str| pb::ResponseFormat {
        r#type: t as i32,
        schema: schema.into(),
        ..Default::default()
    };
    for (model, temperature) in [(&qwen, 0.0), (&qwen, 1.0), (&olmoe, 0.7)] {
        let run = chat(
            &mut c,
            pb::ChatRequest {
                model: model.clone(),
                messages: vec![user("Is the sea blue? Answer in JSON.")],
                options: Some(pb::GenerationOptions {
                    response_format: Some(format(
                        pb::response_format::Type::JsonSchema,
                        &schema().to_string(),
                    )),
                    ..options(120, temperature)
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        check_schema(&run.text);
        assert_eq!(run.finish(), pb::FinishReason::Eos);
    }
    // Raw generation, any JSON object.
    let run = generate(
        &mut c,
        pb::GenerateRequest {
            model: olmoe.clone(),
            prompt_text: "JSON:".into(),
            options: Some(pb::GenerationOptions {
                response_format: Some(format(pb::response_format::Type::JsonObject, "")),
                ..options(60, 0.0)
            }),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(run.text.starts_with('{'), "{:?}", run.text);
    if run.finish() == pb::FinishReason::Eos {
        assert!(serde_json::from_str::<Value>(&run.text)
            .unwrap()
            .is_object());
    }
    // A schema that is not JSON / does not compile.
    for bad in ["{nope", "{\"type\": \"no-such-type\"}"] {
        let (code_, msg) = code(
            generate(
                &mut c,
                pb::GenerateRequest {
                    model: olmoe.clone(),
                    prompt_ids: vec![1, 2, 3],
                    options: Some(pb::GenerationOptions {
                        response_format: Some(format(pb::response_format::Type::JsonSchema, bad)),
                        ..options(10, 0.0)
                    }),
                    ..Default::default()
                },
            )
            .await,
        );
        assert_eq!(code_, Code::InvalidArgument, "{msg}");
        assert!(msg.contains("response_format.schema"), "{msg}");
    }
}

fn log_softmax(l: &[f32]) -> Vec<f64> {
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max + l.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
    l.iter().map(|&x| x as f64 - lse).collect()
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[best] {
            best = i;
        }
    }
    best as u32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_and_penalties_follow_the_logits() {
    let p = place();
    let d = Daemon::start(&p.socket, &p.state, &["--prefix-cache", "0"]);
    let mut c = d.client().await;
    let id = load(&mut c, &fixture("olmoe")).await.id;
    let req = |logprobs: bool, top: u32, sampling: pb::SamplingParams| pb::GenerateRequest {
        model: id.clone(),
        prompt_ids: vec![5, 17, 42, 99, 7],
        options: Some(pb::GenerationOptions {
            max_tokens: 12,
            ignore_eos: true,
            return_logits: true,
            logprobs,
            top_logprobs: top,
            sampling: Some(sampling),
            ..Default::default()
        }),
        ..Default::default()
    };
    let greedy = pb::SamplingParams {
        temperature: Some(0.0),
        ..Default::default()
    };
    let run = generate(&mut c, req(true, 5, greedy.clone()))
        .await
        .unwrap();
    assert_eq!(run.logprobs.len(), 12);
    for ((lp, &id), logits) in run.logprobs.iter().zip(&run.ids).zip(&run.logits) {
        let want = log_softmax(logits);
        assert_eq!(lp.id, id);
        assert!(
            (lp.logprob as f64 - want[id as usize]).abs() < 1e-4,
            "{lp:?}"
        );
        assert_eq!(lp.top.len(), 5);
        assert_eq!(lp.top[0].id, id, "greedy picks the most likely token");
        for w in lp.top.windows(2) {
            assert!(w[0].logprob >= w[1].logprob);
        }
        for t in &lp.top {
            assert!((t.logprob as f64 - want[t.id as usize]).abs() < 1e-4);
            assert_eq!(t.token, String::from_utf8_lossy(&t.bytes));
        }
        assert!(!lp.bytes.is_empty());
    }
    // Too many alternatives, or alternatives without logprobs.
    for (lp, top) in [(true, 21), (false, 3)] {
        let (code_, msg) = code(generate(&mut c, req(lp, top, greedy.clone())).await);
        assert_eq!(code_, Code::InvalidArgument);
        assert!(msg.contains("top_logprobs"), "{msg}");
    }
    // Frequency / presence penalties: every greedy pick is the argmax of the raw logits
    // minus the penalties of the tokens generated before it.
    let penalised = pb::SamplingParams {
        temperature: Some(0.0),
        frequency_penalty: Some(1.5),
        presence_penalty: Some(0.5),
        ..Default::default()
    };
    let run = generate(&mut c, req(false, 0, penalised)).await.unwrap();
    let mut counts = std::collections::HashMap::<u32, u32>::new();
    for (&id, logits) in run.ids.iter().zip(&run.logits) {
        let mut l = logits.clone();
        for (&t, &n) in &counts {
            l[t as usize] -= 1.5 * n as f32 + 0.5;
        }
        assert_eq!(argmax(&l), id);
        *counts.entry(id).or_default() += 1;
    }
    assert!(
        counts.values().all(|&n| n <= 3),
        "penalties keep repeats down: {counts:?}"
    );
    let (code_, msg) = code(
        generate(
            &mut c,
            req(
                false,
                0,
                pb::SamplingParams {
                    presence_penalty: Some(2.5),
                    ..Default::default()
                },
            ),
        )
        .await,
    );
    assert_eq!(code_, Code::InvalidArgument);
    assert!(msg.contains("presence_penalty"), "{msg}");
}

/// Runs a conversation's two turns and a follow-up raw request; returns the second turn's
/// run and the raw one's.
async fn two_turns(c: &mut ColibriClient<Channel>, id: &str, family: &str) -> (Run, Run) {
    let opts = || pb::GenerationOptions {
        ignore_eos: true,
        return_logits: true,
        ..options(6, 0.0)
    };
    let mut msgs = vec![user("Tell me about the sea and the ships on it.")];
    let (second, first) = if family == "qwen3_moe" {
        let first = chat(
            c,
            pb::ChatRequest {
                model: id.into(),
                messages: msgs.clone(),
                options: Some(opts()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        msgs.push(pb::ChatMessage {
            role: "assistant".into(),
            content: first.text.clone(),
            ..Default::default()
        });
        msgs.push(user("And about the rivers?"));
        let second = chat(
            c,
            pb::ChatRequest {
                model: id.into(),
                messages: msgs,
                options: Some(opts()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        (second, first)
    } else {
        let prompt: Vec<u32> = (3..40).collect();
        let ids = |p: Vec<u32>| pb::GenerateRequest {
            model: id.into(),
            prompt_ids: p,
            options: Some(opts()),
            ..Default::default()
        };
        let first = generate(c, ids(prompt.clone())).await.unwrap();
        let mut next = prompt;
        next.extend(&first.ids);
        next.extend([50, 51, 52]);
        (generate(c, ids(next)).await.unwrap(), first)
    };
    let _ = first;
    // The same prompt again: all but its last token come from the cache.
    let again = generate(
        c,
        pb::GenerateRequest {
            model: id.into(),
            prompt_ids: (3..40).collect(),
            options: Some(opts()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    (second, again)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_cache_reuses_kv_and_changes_no_output() {
    let with = place();
    let without = place();
    let dw = Daemon::start(&with.socket, &with.state, &[]);
    let dn = Daemon::start(&without.socket, &without.state, &["--prefix-cache", "0"]);
    let mut cw = dw.client().await;
    let mut cn = dn.client().await;
    // MLA (latent KV) and DSA (indexer keys in the cache) families too.
    for family in ["qwen3_moe", "olmoe", "deepseek_v3", "glm_moe_dsa"] {
        let id = load(&mut cw, &fixture(family)).await.id;
        load(&mut cn, &fixture(family)).await;
        let (w2, w3) = two_turns(&mut cw, &id, family).await;
        let (n2, n3) = two_turns(&mut cn, &id, family).await;
        assert!(w2.stats().cached_tokens > 0, "{family}: nothing reused");
        assert_eq!(n2.stats().cached_tokens, 0);
        assert_eq!(
            w2.stats().prompt_tokens + w2.stats().cached_tokens,
            n2.stats().prompt_tokens,
            "{family}: the same prompt"
        );
        assert_eq!(w2.ids, n2.ids, "{family}: reuse changed the output");
        assert_eq!(w3.ids, n3.ids, "{family}");
        for (a, b) in w2
            .logits
            .iter()
            .chain(&w3.logits)
            .zip(n2.logits.iter().chain(&n3.logits))
        {
            let d = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(d < 1e-4, "{family}: logits differ by {d}");
        }
        if family != "qwen3_moe" {
            assert_eq!(w3.stats().cached_tokens, 36, "{family}");
        }
        let st = cw.status(pb::StatusRequest {}).await.unwrap().into_inner();
        let m = st
            .models
            .iter()
            .find(|m| m.info.as_ref().unwrap().id == id)
            .unwrap();
        assert!(
            m.prefix_cache_entries > 0 && m.prefix_cache_bytes > 0,
            "{m:?}"
        );
        assert!(m.prefix_cache_reused_tokens > 0);
        assert!(m.kv_bytes >= m.prefix_cache_bytes);
    }
}
