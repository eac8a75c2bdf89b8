//! End-to-end tests of `colibrid`: each test spawns the real daemon on a temporary socket
//! and state directory and talks to it with the tonic client over the socket.

use colibri_engine::{GenerateRequest, Generation, Model, SamplingParams};
use colibri_proto::v1 as pb;
use colibri_tests::daemon::{load_model, Daemon};
use colibri_tests::{fixture, Reference};
use pb::colibri_client::ColibriClient;
use pb::generate_event::Event;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Families whose fixture the engine must reproduce exactly (transformers' greedy ids).
const ORACLE_FAMILIES: &[&str] = &["olmoe", "qwen3_moe", "mixtral", "gpt_oss", "kimi_k25"];
/// Every fixture; those the engine cannot load yet are skipped (and say so).
const ALL_FAMILIES: &[&str] = &[
    "olmoe",
    "qwen3_moe",
    "mixtral",
    "deepseek_v3",
    "glm4_moe",
    "glm_moe_dsa",
    "gpt_oss",
    "kimi_k25",
];

struct Place {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    state: PathBuf,
}

/// A socket in a directory that does not exist yet (the daemon creates it 0700).
fn place() -> Place {
    let dir = tempfile::tempdir().unwrap();
    Place {
        socket: dir.path().join("run").join("colibrid.sock"),
        state: dir.path().join("state"),
        _dir: dir,
    }
}

fn start(p: &Place, args: &[&str]) -> Daemon {
    Daemon::start(&p.socket, &p.state, args)
}

#[derive(Debug, Default)]
struct Run {
    ids: Vec<u32>,
    text: String,
    logits: Vec<Vec<f32>>,
    finish: i32,
    stats: Option<pb::GenerationStats>,
    session: String,
}

async fn collect(mut s: tonic::Streaming<pb::GenerateEvent>) -> Result<Run, Status> {
    let mut run = Run::default();
    while let Some(ev) = s.message().await? {
        match ev.event {
            Some(Event::Started(st)) => run.session = st.session_id,
            Some(Event::Tokens(t)) => {
                run.ids.extend(&t.ids);
                run.text.push_str(&t.text);
                if !t.logits.is_empty() {
                    run.logits.push(t.logits);
                }
            }
            Some(Event::Finished(f)) => {
                run.finish = f.reason;
                run.stats = f.stats;
            }
            None => {}
        }
    }
    Ok(run)
}

async fn generate(c: &mut ColibriClient<Channel>, req: pb::GenerateRequest) -> Result<Run, Status> {
    collect(c.generate(req).await?.into_inner()).await
}

fn greedy(model: &str, prompt: &[u32], max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        model: model.to_string(),
        prompt_ids: prompt.to_vec(),
        options: Some(pb::GenerationOptions {
            max_tokens,
            ignore_eos: true,
            sampling: Some(pb::SamplingParams {
                temperature: Some(0.0),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Forward steps the first loaded model has run.
async fn steps(c: &mut ColibriClient<Channel>) -> u64 {
    let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
    st.models[0].steps
}

/// Loads a fixture through LoadModel and returns its canonical id.
async fn load(c: &mut ColibriClient<Channel>, dir: &Path) -> String {
    load_model(c, &dir.display().to_string(), None).await.id
}

/// The in-process answer: `Generation::run` on the same model.
fn local_greedy(dir: &Path, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let model = Model::load(dir).unwrap();
    let req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        ..Default::default()
    };
    let mut g = Generation::new(&model, model.new_cache(), req).unwrap();
    g.run(&model, 64, |_| {}).unwrap();
    g.generated().to_vec()
}

fn loadable(family: &str) -> bool {
    let dir = fixture(family);
    if !dir.join("config.json").exists() {
        eprintln!("{family}: no fixture, skipped");
        return false;
    }
    match Model::load(&dir) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("{family}: the engine cannot load it yet ({e}), skipped");
            false
        }
    }
}

/// A daemon whose socket file was deleted (its folder removed, as a test's temporary folder
/// is) cannot be reached by anyone: it saves its state and exits instead of living on.
#[cfg(unix)]
#[test]
fn exits_when_its_socket_file_is_removed() {
    let p = place();
    let mut d = start(&p, &[]);
    std::fs::remove_file(&p.socket).unwrap();
    let st = d.wait_exit(Duration::from_secs(60));
    assert!(st.success(), "exit status {st}:\n{}", d.log_text());
    assert!(
        d.log_text().contains("socket file removed"),
        "{}",
        d.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_socket_permissions_and_single_instance() {
    let p = place();
    let mut d = start(&p, &[]);
    let mut c = d.client().await;
    let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(st.pid, d.child.id());
    assert_eq!(st.version, env!("CARGO_PKG_VERSION"));
    assert!(st.models.is_empty());
    assert!(st.uptime_seconds >= 0.0);
    assert_eq!(
        Path::new(&st.state_dir),
        p.state.canonicalize().unwrap_or(p.state.clone())
    );

    #[cfg(unix)]
    {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let md = std::fs::metadata(&p.socket).unwrap();
        assert!(md.file_type().is_socket());
        assert_eq!(md.permissions().mode() & 0o777, 0o600, "socket mode");
        let dir = std::fs::metadata(p.socket.parent().unwrap()).unwrap();
        assert_eq!(
            dir.permissions().mode() & 0o777,
            0o700,
            "socket directory mode"
        );
    }

    // A second daemon on the same socket refuses to start, and says why, and leaves the
    // first one's writes in flight alone (a temp file named by the writer's process id).
    let in_flight = p
        .state
        .join("sessions")
        .join(format!("s.kv.{}.tmp", d.child.id()));
    std::fs::write(&in_flight, b"half").unwrap();
    let log = p.state.with_extension("second.log");
    let mut second = Daemon::spawn(&p.socket, &p.state, &[], &log);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = second.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "second daemon kept running"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let msg = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "second daemon exited 0");
    assert!(msg.contains("already running"), "unclear refusal: {msg}");
    // The first one is unharmed.
    c.status(pb::StatusRequest {}).await.unwrap();
    assert!(
        in_flight.exists(),
        "the refused daemon removed a write in flight"
    );
    std::fs::remove_file(&in_flight).unwrap();

    // SIGKILL leaves a stale socket file; the next daemon replaces it.
    d.kill();
    assert!(p.socket.exists(), "stale socket left by SIGKILL");
    let d2 = start(&p, &[]);
    let mut c2 = d2.client().await;
    c2.status(pb::StatusRequest {}).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_equals_reference_and_local_on_every_fixture() {
    let p = place();
    let d = start(&p, &[]);
    let mut c = d.client().await;
    let mut checked = 0;
    for family in ALL_FAMILIES {
        if !loadable(family) {
            continue;
        }
        let dir = fixture(family);
        let r = Reference::load(family);
        let id = load(&mut c, &dir).await;
        assert_eq!(Path::new(&id), dir.canonicalize().unwrap());
        let n = r.greedy_ids.len();
        let run = generate(&mut c, greedy(&id, &r.prompt_ids, n as u32))
            .await
            .unwrap();
        let local = local_greedy(&dir, &r.prompt_ids, n);
        assert_eq!(
            run.ids, local,
            "{family}: daemon vs in-process Generation::run"
        );
        if ORACLE_FAMILIES.contains(family) {
            assert_eq!(
                run.ids, r.greedy_ids,
                "{family}: daemon vs transformers greedy_ids"
            );
        } else if run.ids != r.greedy_ids {
            eprintln!("{family}: daemon == local, but not yet == transformers greedy_ids");
        }
        assert_eq!(run.finish, pb::FinishReason::Length as i32);
        let stats = run.stats.unwrap();
        assert_eq!(stats.prompt_tokens as usize, r.prompt_ids.len());
        assert_eq!(stats.generated_tokens as usize, n);
        assert!(stats.time_to_first_token_ms > 0.0);
        // Score through the daemon: teacher-forced argmax equals the engine's.
        let score = c
            .score(pb::ScoreRequest {
                model: id.clone(),
                ids: r.input_ids.clone(),
                argmax_only: false,
            })
            .await
            .unwrap()
            .into_inner();
        let vocab = score.vocab_size as usize;
        assert_eq!(score.logits.len(), r.input_ids.len() * vocab);
        let model = Model::load(&dir).unwrap();
        assert_eq!(
            score.logits,
            model.score(&r.input_ids).unwrap(),
            "{family}: Score logits"
        );
        checked += 1;
    }
    assert!(checked >= 1, "no fixture could be checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_get_their_solo_output() {
    let p = place();
    let d = start(&p, &["--prefill-chunk", "4"]);
    let mut c = d.client().await;
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let id = load(&mut c, &dir).await;
    let a: Vec<u32> = r.prompt_ids.clone();
    let b: Vec<u32> = r.prompt_ids.iter().rev().map(|t| (t + 7) % 500).collect();
    let solo_a = generate(&mut c, greedy(&id, &a, 48)).await.unwrap().ids;
    let solo_b = generate(&mut c, greedy(&id, &b, 48)).await.unwrap().ids;
    assert_ne!(solo_a, solo_b);
    for _ in 0..2 {
        let (mut c1, mut c2) = (d.client().await, d.client().await);
        let (ra, rb) = tokio::join!(
            generate(&mut c1, greedy(&id, &a, 48)),
            generate(&mut c2, greedy(&id, &b, 48))
        );
        assert_eq!(ra.unwrap().ids, solo_a, "client A while B ran");
        assert_eq!(rb.unwrap().ids, solo_b, "client B while A ran");
    }
    // The steps really were shared: fewer steps than tokens generated.
    let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
    let m = &st.models[0];
    assert!(
        m.steps < m.tokens_generated,
        "steps {} vs tokens {}",
        m.steps,
        m.tokens_generated
    );
}

/// Prompts that arrive together are fed in one step (within the step's prompt budget), so
/// their sessions start and decode together: A arrives first; B and C arrive while the step
/// that feeds A's prompt pauses (`COLIBRI_STEP_PAUSE_MS`). 4 tokens each: A's prompt step,
/// one step with B's and C's prompts, then decode steps shared by all three make 5 steps;
/// one prompt a step (the old rule) makes 6, and 4 if all three came before the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_arriving_together_share_a_step() {
    let p = place();
    let d = Daemon::start_with_env(
        &p.socket,
        &p.state,
        &["--prefill-pace", "0"],
        &[("COLIBRI_STEP_PAUSE_MS", "600")],
    );
    let mut c = d.client().await;
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let id = load(&mut c, &dir).await;
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|k| r.prompt_ids.iter().map(|t| (t + 11 * k) % 500).collect())
        .collect();
    let mut solo = Vec::new();
    for q in &prompts {
        solo.push(generate(&mut c, greedy(&id, q, 4)).await.unwrap().ids);
    }
    let before = steps(&mut c).await;
    let (mut ca, mut cb, mut cc) = (d.client().await, d.client().await, d.client().await);
    let a = generate(&mut ca, greedy(&id, &prompts[0], 4));
    let later = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        tokio::join!(
            generate(&mut cb, greedy(&id, &prompts[1], 4)),
            generate(&mut cc, greedy(&id, &prompts[2], 4))
        )
    };
    let (ra, (rb, rc)) = tokio::join!(a, later);
    for (k, run) in [ra, rb, rc].into_iter().enumerate() {
        assert_eq!(run.unwrap().ids, solo[k], "prompt {k} batched vs alone");
    }
    let after = steps(&mut c).await;
    assert!(
        after - before <= 5,
        "{} steps for three 4-token generations that arrived together",
        after - before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_client_frees_its_slot_and_full_queue_is_resource_exhausted() {
    let p = place();
    // A 2 ms pause after each engine step (the daemon's test hook): the tiny fixture would
    // otherwise generate its 200 tokens in a few milliseconds, before a dropped client can
    // be noticed, and the test would measure the machine's load rather than cancellation.
    let d = Daemon::start_with_env(
        &p.socket,
        &p.state,
        &["--max-batch", "1", "--queue", "0"],
        &[("COLIBRI_STEP_PAUSE_MS", "2")],
    );
    let mut c = d.client().await;
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let id = load(&mut c, &dir).await;
    let long = greedy(&id, &r.prompt_ids, 200);

    // A long generation holds the only slot, so another request is refused with
    // RESOURCE_EXHAUSTED and a clear message. The tiny fixture's 200 tokens take tens of
    // milliseconds: on a loaded machine the long generation may end before the second
    // request arrives (which is then served), so that case starts over.
    let mut c1 = d.client().await;
    let mut attempt = 0;
    let (s, base) = loop {
        attempt += 1;
        let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
        let base = st.models[0].tokens_generated;
        let mut s = c1.generate(long.clone()).await.unwrap().into_inner();
        s.message().await.unwrap().expect("started");
        s.message().await.unwrap().expect("first tokens");
        match c.generate(greedy(&id, &r.prompt_ids, 4)).await {
            Err(err) => {
                assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
                assert!(err.message().contains("busy"), "{}", err.message());
                break (s, base);
            }
            Ok(second) => {
                // Served: the slot was free, so the long generation had finished.
                let mut second = second.into_inner();
                while second.message().await.unwrap().is_some() {}
                while s.message().await.unwrap().is_some() {}
                assert!(attempt < 10, "the long generation never held the slot");
            }
        }
    };

    // The client goes away mid-stream: its generation is cancelled and the slot freed.
    drop(s);
    drop(c1);
    let t = Instant::now();
    let run = loop {
        match generate(&mut c, greedy(&id, &r.prompt_ids, 4)).await {
            Ok(run) => break run,
            Err(e)
                if e.code() == Code::ResourceExhausted && t.elapsed() < Duration::from_secs(10) =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("slot not freed: {e:?}"),
        }
    };
    assert_eq!(run.ids, r.greedy_ids[..4]);
    // The engine thread publishes its status after a step (and its pause): wait for it.
    let t = Instant::now();
    let st = loop {
        let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
        if st.models[0].active_generations == 0 || t.elapsed() > Duration::from_secs(10) {
            break st;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(st.models[0].active_generations, 0);
    // The dropped generation's tokens and the 4 of the last request, fewer than its 200.
    assert!(
        st.models[0].tokens_generated - base < 200 + 4,
        "the dropped generation ran to the end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_are_invalid_argument_and_the_daemon_carries_on() {
    let p = place();
    let d = start(&p, &[]);
    let mut c = d.client().await;
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let id = load(&mut c, &dir).await;

    let expect = |res: Result<Run, Status>, code: Code, needle: &str| {
        let e = res.expect_err("request should be refused");
        assert_eq!(e.code(), code, "{e:?}");
        assert!(
            e.message().contains(needle),
            "'{}' does not name '{needle}'",
            e.message()
        );
    };
    // A token id outside the vocabulary (512).
    expect(
        generate(&mut c, greedy(&id, &[1, 2, 100_000], 4)).await,
        Code::InvalidArgument,
        "prompt",
    );
    // NaN and negative temperature.
    for t in [f32::NAN, -1.0] {
        let mut req = greedy(&id, &r.prompt_ids, 4);
        req.options
            .as_mut()
            .unwrap()
            .sampling
            .as_mut()
            .unwrap()
            .temperature = Some(t);
        expect(
            generate(&mut c, req).await,
            Code::InvalidArgument,
            "temperature",
        );
    }
    // A prompt longer than the context (256).
    let long: Vec<u32> = (0..300).map(|i| i % 500).collect();
    expect(
        generate(&mut c, greedy(&id, &long, 4)).await,
        Code::InvalidArgument,
        "prompt",
    );
    // max_tokens beyond the context, and zero.
    expect(
        generate(&mut c, greedy(&id, &r.prompt_ids, 1000)).await,
        Code::InvalidArgument,
        "max_tokens",
    );
    expect(
        generate(&mut c, greedy(&id, &r.prompt_ids, 0)).await,
        Code::InvalidArgument,
        "max_tokens",
    );
    // Both prompt fields.
    let mut both = greedy(&id, &r.prompt_ids, 4);
    both.prompt_text = "hello".into();
    expect(
        generate(&mut c, both).await,
        Code::InvalidArgument,
        "prompt_ids",
    );
    // A model that is not loaded, one that does not exist, a bad session id.
    expect(
        generate(
            &mut c,
            greedy(&fixture("mixtral").display().to_string(), &[1], 4),
        )
        .await,
        Code::NotFound,
        "not loaded",
    );
    expect(
        generate(&mut c, greedy("/no/such/model", &[1], 4)).await,
        Code::NotFound,
        "/no/such/model",
    );
    let mut bad_session = greedy(&id, &[1], 4);
    bad_session.session_id = "../etc".into();
    expect(
        generate(&mut c, bad_session).await,
        Code::InvalidArgument,
        "session_id",
    );
    // Score: out-of-vocabulary ids.
    let e = c
        .score(pb::ScoreRequest {
            model: id.clone(),
            ids: vec![3, 999_999],
            argmax_only: true,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("ids"), "{}", e.message());

    // Nothing of that disturbed the daemon.
    let run = generate(
        &mut c,
        greedy(&id, &r.prompt_ids, r.greedy_ids.len() as u32),
    )
    .await
    .unwrap();
    assert_eq!(run.ids, r.greedy_ids);
}

/// Turn 1, then turn 2 with logits; `restart` stops and restarts the daemon in between.
async fn two_turns(p: &Place, session: &str, restart: bool) -> (Run, Run) {
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let turn2: Vec<u32> = vec![12, 400, 33];
    let mut d = start(p, &[]);
    let mut c = d.client().await;
    let id = load(&mut c, &dir).await;
    c.create_session(pb::CreateSessionRequest {
        model: id.clone(),
        id: session.into(),
    })
    .await
    .unwrap();
    let mut req = greedy(&id, &r.prompt_ids, 6);
    req.session_id = session.into();
    let first = generate(&mut c, req).await.unwrap();
    if restart {
        drop(c);
        let st = d.terminate();
        assert!(st.success(), "SIGTERM exit: {st}\n{}", d.log_text());
        assert!(p
            .state
            .join("sessions")
            .join(format!("{session}.kv"))
            .exists());
        d = start(p, &[]);
        c = d.client().await;
        let resumed = c
            .resume_session(pb::ResumeSessionRequest {
                id: session.into(),
                load_model: true,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(resumed.restored_from_disk);
        let info = resumed.session.unwrap();
        // The prompt and all generated tokens but the last (pending) are cached.
        assert_eq!(info.cached_tokens as usize, r.prompt_ids.len() + 5);
        assert_eq!(info.history_tokens as usize, r.prompt_ids.len() + 6);
    }
    let mut req = greedy(&id, &turn2, 6);
    req.session_id = session.into();
    req.options.as_mut().unwrap().return_logits = true;
    let second = generate(&mut c, req).await.unwrap();
    // No re-prefill: only the pending token and the new prompt were fed.
    let stats = second.stats.clone().unwrap();
    assert_eq!(stats.cached_tokens as usize, r.prompt_ids.len() + 5);
    assert_eq!(stats.prompt_tokens as usize, 1 + turn2.len());
    (first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_resumed_after_restart_continues_with_the_same_logits() {
    let (p1, p2) = (place(), place());
    let (a1, a2) = two_turns(&p1, "uninterrupted", false).await;
    let (b1, b2) = two_turns(&p2, "restarted", true).await;
    assert_eq!(a1.ids, b1.ids);
    assert_eq!(a2.ids, b2.ids);
    assert_eq!(a2.logits.len(), 6);
    assert_eq!(
        a2.logits, b2.logits,
        "logits after restart differ from the uninterrupted session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_leaves_state_the_next_start_reads_or_sets_aside() {
    let p = place();
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    // Sessions are saved as soon as they are idle, so a SIGKILL lands during or after a save.
    let mut d = start(&p, &["--session-save-after", "0"]);
    let mut c = d.client().await;
    let id = load(&mut c, &dir).await;
    for s in ["keep1", "keep2", "cut", "flipped"] {
        c.create_session(pb::CreateSessionRequest {
            model: id.clone(),
            id: s.into(),
        })
        .await
        .unwrap();
        let mut req = greedy(&id, &r.prompt_ids, 3);
        req.session_id = s.into();
        generate(&mut c, req).await.unwrap();
    }
    // Wait for the idle save, then kill without warning.
    let sessions = p.state.join("sessions");
    let t = Instant::now();
    while !["keep1", "keep2", "cut", "flipped"]
        .iter()
        .all(|s| sessions.join(format!("{s}.kv")).exists())
    {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "idle sessions were not saved"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(c);
    d.kill();

    // Damage of every kind a crash or a disk can leave: a half-written temp file, a
    // snapshot cut short, one with a flipped byte, one that is not a snapshot at all.
    let good = std::fs::read(sessions.join("keep1.kv")).unwrap();
    std::fs::write(sessions.join("half.kv.4242.tmp"), &good[..good.len() / 2]).unwrap();
    let cut = std::fs::read(sessions.join("cut.kv")).unwrap();
    std::fs::write(sessions.join("cut.kv"), &cut[..cut.len() - 100]).unwrap();
    let mut flipped = std::fs::read(sessions.join("flipped.kv")).unwrap();
    let n = flipped.len();
    flipped[n - 50] ^= 0x10;
    std::fs::write(sessions.join("flipped.kv"), &flipped).unwrap();
    std::fs::write(sessions.join("junk.kv"), b"definitely not a snapshot").unwrap();

    let d = start(&p, &[]);
    let mut c = d.client().await;
    let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
    let names: Vec<&str> = st.sessions.iter().map(|s| s.id.as_str()).collect();
    assert!(
        names.contains(&"keep1") && names.contains(&"keep2"),
        "{names:?}"
    );
    assert!(!names.contains(&"junk"), "{names:?}");
    assert!(
        !sessions.join("half.kv.4242.tmp").exists(),
        "temp file not cleaned up"
    );
    assert!(
        !sessions.join("junk.kv").exists(),
        "junk snapshot not set aside"
    );
    let aside = |stem: &str| {
        std::fs::read_dir(&sessions).unwrap().flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{stem}.kv."))
                && e.file_name().to_string_lossy().ends_with(".bad")
        })
    };
    assert!(aside("junk"));

    // The intact session resumes; the damaged ones are refused (DATA_LOSS) and set aside.
    let ok = c
        .resume_session(pb::ResumeSessionRequest {
            id: "keep1".into(),
            load_model: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ok.session.unwrap().cached_tokens as usize,
        r.prompt_ids.len() + 2
    );
    for bad in ["cut", "flipped"] {
        let e = c
            .resume_session(pb::ResumeSessionRequest {
                id: bad.into(),
                load_model: true,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::DataLoss, "{bad}: {e:?}");
        assert!(aside(bad), "{bad} not set aside");
        assert!(!sessions.join(format!("{bad}.kv")).exists());
    }
    // And the daemon serves on.
    let run = generate(&mut c, greedy(&id, &r.prompt_ids, 4))
        .await
        .unwrap();
    assert_eq!(run.ids, r.greedy_ids[..4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_session_reuses_its_cache_and_shutdown_rpc_exits_cleanly() {
    let dir = fixture("qwen3_moe");
    let p = place();
    let mut d = start(&p, &[]);
    let mut c = d.client().await;
    let id = load(&mut c, &dir).await;
    let msg = |role: &str, content: &str| pb::ChatMessage {
        role: role.into(),
        content: content.into(),
        ..Default::default()
    };
    let chat = |session: &str, m: Vec<pb::ChatMessage>| pb::ChatRequest {
        model: id.clone(),
        messages: m,
        session_id: session.into(),
        options: Some(pb::GenerationOptions {
            max_tokens: 5,
            ignore_eos: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    match c.chat(chat("", vec![msg("user", "hello")])).await {
        Err(e) if e.code() == Code::FailedPrecondition => {
            eprintln!(
                "chat template unavailable in this build ({}); chat part skipped",
                e.message()
            );
        }
        Err(e) => panic!("{e:?}"),
        Ok(s) => {
            let solo = collect(s.into_inner()).await.unwrap();
            assert_eq!(solo.ids.len(), 5);
            c.create_session(pb::CreateSessionRequest {
                model: id.clone(),
                id: "talk".into(),
            })
            .await
            .unwrap();
            let t1 = collect(
                c.chat(chat("talk", vec![msg("user", "hello")]))
                    .await
                    .unwrap()
                    .into_inner(),
            )
            .await
            .unwrap();
            assert_eq!(
                t1.ids, solo.ids,
                "a session's first turn equals a one-off chat"
            );
            let t2 = collect(
                c.chat(chat("talk", vec![msg("user", "more")]))
                    .await
                    .unwrap()
                    .into_inner(),
            )
            .await
            .unwrap();
            let stats = t2.stats.unwrap();
            assert!(stats.cached_tokens > 0, "second turn re-used nothing");
            let resumed = c
                .resume_session(pb::ResumeSessionRequest {
                    id: "talk".into(),
                    load_model: false,
                })
                .await
                .unwrap()
                .into_inner();
            let roles: Vec<&str> = resumed.messages.iter().map(|m| m.role.as_str()).collect();
            assert_eq!(roles, ["user", "assistant", "user", "assistant"]);
        }
    }
    c.shutdown(pb::ShutdownRequest {}).await.unwrap();
    let st = d.wait_exit(Duration::from_secs(30));
    assert!(st.success(), "{st}\n{}", d.log_text());
    assert!(
        !p.socket.exists(),
        "socket left behind after a clean shutdown"
    );
}

/// Run as another uid by `peer_from_another_uid_is_refused`: connects and reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_probe() {
    let Some(socket) = std::env::var_os("COLIBRI_PEER_PROBE_SOCKET") else {
        return;
    };
    let served = match colibri_proto::connect::client(Path::new(&socket)).await {
        Ok(mut c) => c.status(pb::StatusRequest {}).await.is_ok(),
        Err(_) => false,
    };
    println!("PEER_PROBE {}", if served { "served" } else { "refused" });
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_from_another_uid_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("not root: cannot run a client as another uid; skipped");
        return;
    }
    let p = place();
    let d = start(&p, &[]);
    // Open the file-system gates so that only the daemon's SO_PEERCRED check is left.
    for path in [
        p.socket.parent().unwrap().parent().unwrap(),
        p.socket.parent().unwrap(),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    std::fs::set_permissions(&p.socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let exe = std::env::current_exe().unwrap();
    let probe = |uid: u32| {
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "peer_probe",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("COLIBRI_PEER_PROBE_SOCKET", &p.socket)
            .uid(uid)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    let other = probe(65534);
    if !other.contains("PEER_PROBE") {
        eprintln!("uid 65534 cannot run the test binary here ({other}); skipped");
        return;
    }
    assert!(other.contains("PEER_PROBE refused"), "{other}");
    // The same probe as our own uid is served.
    assert!(probe(0).contains("PEER_PROBE served"));
    assert!(
        d.log_text().contains("refused a connection from uid 65534"),
        "{}",
        d.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_rpc_stops_a_generation_and_keep_alive_unloads_an_idle_model() {
    let p = place();
    let d = start(&p, &["--keep-alive", "2"]);
    let mut c = d.client().await;
    let r = Reference::load("olmoe");
    let id = load(&mut c, &fixture("olmoe")).await;
    c.create_session(pb::CreateSessionRequest {
        model: id.clone(),
        id: "kept".into(),
    })
    .await
    .unwrap();
    let mut req = greedy(&id, &r.prompt_ids, 240);
    req.session_id = "kept".into();
    req.options.as_mut().unwrap().request_id = "long-one".into();
    let mut c1 = d.client().await;
    let mut s = c1.generate(req).await.unwrap().into_inner();
    s.message().await.unwrap().expect("started");
    let n = c
        .cancel(pb::CancelRequest {
            request_id: "long-one".into(),
            session_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .cancelled;
    assert_eq!(n, 1);
    let rest = collect(s).await.unwrap();
    assert_eq!(rest.finish, pb::FinishReason::Cancelled as i32);
    assert!(
        rest.ids.len() < 239,
        "cancel came too late: {} tokens",
        rest.ids.len()
    );

    // Idle for longer than --keep-alive: the model is unloaded and its session saved.
    let t = Instant::now();
    loop {
        let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
        if st.models.is_empty() {
            let s = st
                .sessions
                .iter()
                .find(|s| s.id == "kept")
                .expect("session listed");
            assert_eq!(s.state, "saved");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "model still loaded after keep-alive"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(p.state.join("sessions").join("kept.kv").exists());
}

/// systemd socket activation: the daemon serves on an inherited listening socket (fd 3).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_on_a_socket_passed_by_systemd() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("activated.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let fd = listener.as_raw_fd();
    let log = dir.path().join("log");
    let mut cmd = std::process::Command::new("sh");
    // LISTEN_PID must be the daemon's pid: the shell exports its own and execs in place.
    cmd.arg("-c")
        .arg(r#"LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@""#)
        .arg(colibri_tests::daemon::colibrid_bin())
        .arg("--socket")
        .arg(dir.path().join("unused.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap());
    // SAFETY: only dup2 (async-signal-safe) runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(listener);
    let mut c = colibri_proto::connect::client(&socket).await.unwrap();
    let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(st.pid, child.id());
    assert!(
        !dir.path().join("unused.sock").exists(),
        "--socket was bound despite the inherited socket"
    );
    c.shutdown(pb::ShutdownRequest {}).await.unwrap();
    let status = child.wait().unwrap();
    assert!(status.success());
    assert!(socket.exists(), "the daemon removed systemd's socket file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_experts_give_the_same_tokens_and_report_cache_statistics() {
    let p = place();
    let mut d = start(&p, &[]);
    let mut c = d.client().await;
    let r = Reference::load("olmoe");
    let dir = fixture("olmoe");
    // A budget far below the experts' size: the cache must evict and re-read.
    let mut s = c
        .load_model(pb::LoadModelRequest {
            model: dir.display().to_string(),
            expert_cache_bytes: Some(256 << 10),
        })
        .await
        .unwrap()
        .into_inner();
    let mut id = String::new();
    while let Some(m) = s.message().await.unwrap() {
        if let Some(info) = m.info {
            id = info.id;
        }
    }
    let run = generate(
        &mut c,
        greedy(&id, &r.prompt_ids, r.greedy_ids.len() as u32),
    )
    .await
    .unwrap();
    assert_eq!(run.ids, r.greedy_ids, "streamed experts changed the output");
    let hit = run.stats.unwrap().expert_cache_hit_rate;
    assert!(hit > 0.0 && hit < 1.0, "per-request hit rate {hit}");
    let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
    let cache = st.models[0].expert_cache.clone().unwrap();
    assert_eq!(cache.budget_bytes, 256 << 10);
    assert!(cache.misses > 0 && cache.bytes_read > 0, "{cache:?}");
    assert!(cache.hit_rate > 0.0 && cache.hit_rate < 1.0, "{cache:?}");
    assert_eq!(cache.total_experts, 16);
    // Usage per expert, most used first; the hottest can be pinned by count.
    let stats = c
        .expert_stats(pb::ExpertStatsRequest {
            model: id.clone(),
            top: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!stats.experts.is_empty());
    assert!(stats.experts.windows(2).all(|w| w[0].uses >= w[1].uses));
    let pinned = c
        .pin(pb::PinRequest {
            model: id.clone(),
            experts: vec![],
            hottest: 2,
        })
        .await
        .unwrap()
        .into_inner()
        .pinned;
    assert_eq!(pinned.len(), 2);
    let top = (stats.experts[0].layer, stats.experts[0].expert);
    assert!(pinned.iter().any(|e| (e.layer, e.expert) == top));
    // The usage history is saved on shutdown, next to the pins.
    c.shutdown(pb::ShutdownRequest {}).await.unwrap();
    assert!(d.wait_exit(Duration::from_secs(30)).success());
    let models = p.state.join("models");
    let saved: Vec<_> = std::fs::read_dir(&models)
        .unwrap()
        .flatten()
        .flat_map(|m| {
            std::fs::read_dir(m.path())
                .unwrap()
                .flatten()
                .map(|f| f.file_name())
        })
        .collect();
    assert!(
        saved.len() >= 2,
        "expected pins and usage history in {}: {saved:?}",
        models.display()
    );
}

/// The invariants one `ExpertCacheStats` must satisfy, whatever span it covers. (A
/// speculative read may still be running when a request finishes: read-side counters are
/// checked exactly only once the cache has settled, by `settled_cache`.)
fn check_cache_stats(c: &pb::ExpertCacheStats) {
    assert!(c.streamed, "{c:?}");
    assert_eq!(c.requests, c.hits + c.misses, "{c:?}");
    assert!(c.inflight_hits <= c.hits, "{c:?}");
    let hit_rate = c.hits as f64 / c.requests as f64;
    assert!((c.hit_rate - hit_rate).abs() < 1e-12, "{c:?}");
    // Every miss is read (and waited for before the span ends).
    assert!(c.misses <= c.reads, "{c:?}");
    assert_eq!(c.read_errors, 0, "{c:?}");
    let per_token = c.bytes_read as f64 / c.tokens as f64;
    assert!((c.bytes_per_token - per_token).abs() < 1e-9, "{c:?}");
    assert!(c.disk_busy_seconds > 0.0 && c.read_seconds > 0.0, "{c:?}");
    let gbps = c.bytes_read as f64 / c.disk_busy_seconds / 1e9;
    assert!((c.disk_read_gb_per_s - gbps).abs() < 1e-9, "{c:?}");
    // Reads are waited for inside forward passes.
    assert!(c.forward_seconds > 0.0, "{c:?}");
    assert!(c.read_wait_seconds <= c.forward_seconds, "{c:?}");
    // The next layer's router predicts (prefetch is on by default): scored, within [0, 1].
    assert!(c.predicted > 0 && c.predicted_actual > 0, "{c:?}");
    assert!(c.predicted_correct <= c.predicted.min(c.predicted_actual));
    let recall = c.predicted_correct as f64 / c.predicted_actual as f64;
    let precision = c.predicted_correct as f64 / c.predicted as f64;
    assert!((c.prefetch_recall - recall).abs() < 1e-12, "{c:?}");
    assert!((c.prefetch_precision - precision).abs() < 1e-12, "{c:?}");
    assert!((0.0..=1.0).contains(&c.prefetch_recall), "{c:?}");
    assert!((0.0..=1.0).contains(&c.prefetch_precision), "{c:?}");
    assert!(c.resident_experts <= c.capacity_experts, "{c:?}");
    assert!(c.used_bytes <= c.budget_bytes, "{c:?}");
    assert!(c.policy.starts_with("lrfu"), "the default policy: {c:?}");
    assert_eq!(c.readers, 4, "{c:?}");
}

/// The model's expert cache once no read is running (two snapshots agree), with the
/// read-side invariants checked.
async fn settled_cache(c: &mut ColibriClient<Channel>) -> pb::ExpertCacheStats {
    let snap = |st: pb::StatusResponse| st.models[0].expert_cache.clone().unwrap();
    let mut last = snap(c.status(pb::StatusRequest {}).await.unwrap().into_inner());
    let t = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = snap(c.status(pb::StatusRequest {}).await.unwrap().into_inner());
        // Busy time grows while a read runs.
        let same = (now.reads, now.bytes_read, now.disk_busy_seconds)
            == (last.reads, last.bytes_read, last.disk_busy_seconds);
        last = now;
        if same {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "reads never settle");
    }
    let c = last;
    check_cache_stats(&c);
    // Every read was a miss, a prefetch or a preload (a speculative read evicted before
    // it started is skipped).
    assert!(
        c.reads <= c.misses + c.prefetch_issued + c.preload_issued,
        "{c:?}"
    );
    // A speculative read is used or evicted unused at most once (maybe in a later request's
    // span than the one that issued it).
    assert!(
        c.prefetch_used + c.prefetch_wasted <= c.prefetch_issued + c.preload_issued,
        "{c:?}"
    );
    // A direct read reads the expert's whole aligned buffer; a buffered one only its bytes.
    assert!(c.bytes_read <= c.reads * c.expert_bytes, "{c:?}");
    if c.direct_reads == c.reads {
        assert_eq!(c.bytes_read, c.reads * c.expert_bytes, "{c:?}");
    } else {
        assert!(
            !c.notes.is_empty(),
            "buffered reads without a note why: {c:?}"
        );
    }
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_stats_carry_the_requests_expert_cache_delta_and_expert_stats_add_up() {
    let p = place();
    let _d = start(&p, &[]);
    let mut c = _d.client().await;
    let r = Reference::load("olmoe");
    let dir = fixture("olmoe");
    // Room for 4 of the 16 experts (16 KiB each): every step evicts, prefetches compete.
    let mut s = c
        .load_model(pb::LoadModelRequest {
            model: dir.display().to_string(),
            expert_cache_bytes: Some(4 * 16384),
        })
        .await
        .unwrap()
        .into_inner();
    let mut id = String::new();
    while let Some(m) = s.message().await.unwrap() {
        if let Some(info) = m.info {
            id = info.id;
        }
    }
    let n = r.greedy_ids.len();
    let run = generate(&mut c, greedy(&id, &r.prompt_ids, n as u32))
        .await
        .unwrap();
    assert_eq!(run.ids, r.greedy_ids, "streamed experts changed the output");
    let stats = run.stats.unwrap();
    let first = stats
        .expert_cache
        .clone()
        .expect("Finished.stats.expert_cache");
    check_cache_stats(&first);
    assert_eq!((first.expert_bytes, first.capacity_experts), (16384, 4));
    assert_eq!(first.budget_bytes, 4 * 16384);
    assert!(first.misses > 0 && first.evictions > 0, "{first:?}");
    assert_eq!(stats.expert_cache_hit_rate, first.hit_rate);
    // The store counts the rows that went through the MoE layers: the prompt, then every
    // generated token but the last (which is never fed back).
    assert_eq!(
        first.tokens,
        (r.prompt_ids.len() + n - 1) as u64,
        "{first:?}"
    );
    // The fixture's 2 layers route each row to 2 of their 8 experts; the store gets one
    // request per unique expert per layer per step: 2 × 2 per decode step, and at most the
    // 2 × 8 experts for the prompt's single prefill step.
    let decode = 4 * (n as u64 - 1);
    assert!(
        (decode..=decode + 16).contains(&first.requests),
        "{first:?}"
    );

    // The first request since load: its delta is everything the model's cache did (on the
    // demand side; a speculative read may complete after it).
    let total = settled_cache(&mut c).await;
    let counters = |c: &pb::ExpertCacheStats| {
        [
            c.requests,
            c.hits,
            c.inflight_hits,
            c.misses,
            c.tokens,
            c.evictions,
            c.prefetch_issued,
            c.predicted,
            c.predicted_correct,
            c.predicted_actual,
        ]
    };
    assert_eq!(counters(&total), counters(&first));
    assert!(total.forward_seconds >= first.forward_seconds);

    // A second request's delta is its own: the totals are the sum of both.
    let prompt2 = &r.input_ids[..r.input_ids.len().min(6)];
    let run2 = generate(&mut c, greedy(&id, prompt2, 3)).await.unwrap();
    let stats2 = run2.stats.unwrap();
    let second = stats2.expert_cache.clone().unwrap();
    check_cache_stats(&second);
    // Its prompt shares a prefix with the first one's: the prefix cache serves that part,
    // and only the rest goes through the MoE layers.
    assert_eq!(
        (stats2.prompt_tokens + stats2.cached_tokens) as usize,
        prompt2.len()
    );
    assert_eq!(
        second.tokens,
        (stats2.prompt_tokens + 3 - 1) as u64,
        "{second:?}"
    );
    let total = settled_cache(&mut c).await;
    let sum: Vec<u64> = counters(&first)
        .iter()
        .zip(counters(&second))
        .map(|(a, b)| a + b)
        .collect();
    assert_eq!(counters(&total).to_vec(), sum);

    // Per expert: hits and misses since load add up to the cache's; with a fresh state
    // folder the usage history is this run's requests.
    let es = c
        .expert_stats(pb::ExpertStatsRequest {
            model: id.clone(),
            top: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let cache = es.cache.unwrap();
    assert_eq!(counters(&cache), counters(&total));
    assert_eq!(es.experts.iter().map(|u| u.hits).sum::<u64>(), cache.hits);
    assert_eq!(
        es.experts.iter().map(|u| u.misses).sum::<u64>(),
        cache.misses
    );
    for u in &es.experts {
        assert_eq!(u.uses, u.hits + u.misses, "{u:?}");
    }
    assert!(es.experts.iter().filter(|u| u.misses > 0).count() > 4);
}

/// LoadModel streams the engine's per-layer progress (throttled to one event per 100 ms,
/// which the daemon's load pause hook makes visible on a tiny fixture), growing to the
/// checkpoint's tensor bytes and ending in Ready; a second load is Ready at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_model_streams_layer_progress_up_to_ready() {
    use pb::load_model_progress::Stage;
    let p = place();
    let d = Daemon::start_with_env(
        &p.socket,
        &p.state,
        &[],
        &[("COLIBRI_LOAD_PAUSE_MS", "150")],
    );
    let mut c = d.client().await;
    let dir = fixture("qwen3_moe");
    let request = pb::LoadModelRequest {
        model: dir.display().to_string(),
        ..Default::default()
    };
    let mut s = c.load_model(request.clone()).await.unwrap().into_inner();
    let mut events = Vec::new();
    while let Some(e) = s.message().await.unwrap() {
        events.push(e);
    }
    let ready = events.pop().expect("a Ready event");
    assert_eq!(ready.stage, Stage::Ready as i32, "{ready:?}");
    assert!(!ready.already_loaded);
    // The files' bytes copied into RAM come first, counted on their own up to their total.
    let (copying, events): (Vec<_>, Vec<_>) = events
        .into_iter()
        .partition(|e| e.message == "copying into RAM");
    let mut copied = 0;
    for e in &copying {
        assert!(e.stage == Stage::Loading as i32 && e.total > 0, "{e:?}");
        assert!(e.done >= copied && e.done <= e.total, "{copying:?}");
        copied = e.done;
    }
    assert!(
        copying.last().is_none_or(|e| e.done == e.total),
        "{copying:?}"
    );
    let layers = ready.info.as_ref().unwrap().num_layers;
    assert!(events.len() >= 3, "progress events: {events:?}");
    let total = events.last().unwrap().total;
    assert!(total > 0);
    let mut prev = 0;
    for e in &events {
        assert!(
            e.stage == Stage::Opening as i32 || e.stage == Stage::Loading as i32,
            "{e:?}"
        );
        if e.total > 0 {
            assert_eq!(e.total, total, "{e:?}");
        }
        assert!(e.done >= prev && e.done <= total, "{events:?}");
        prev = e.done;
    }
    assert_eq!(
        prev, total,
        "the last progress event is the whole checkpoint"
    );
    let loading: Vec<_> = events
        .iter()
        .filter(|e| e.stage == Stage::Loading as i32)
        .collect();
    assert!(
        loading.len() >= layers as usize,
        "one event per layer at 150 ms a layer: {events:?}"
    );
    assert!(loading
        .iter()
        .any(|e| e.message == format!("layer {layers} of {layers}")));
    assert_eq!((ready.done, ready.total), (total, total));

    let mut again = c.load_model(request).await.unwrap().into_inner();
    let first = again.message().await.unwrap().unwrap();
    assert_eq!(first.stage, Stage::Ready as i32);
    assert!(first.already_loaded);
    assert!(again.message().await.unwrap().is_none());
}
