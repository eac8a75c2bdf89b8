//! `coli plan`, `coli trace --stream` and `coli simulate` on the olmoe fixture.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn olmoe() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/olmoe")
}

fn coli(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(args)
        .env_remove("COLIBRI_STATE_DIR")
        .output()
        .expect("coli runs");
    assert!(
        o.status.success(),
        "coli {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

#[test]
fn plan_reports_where_the_bytes_go() {
    let m = olmoe();
    let v = json(&coli(&["plan", "--model", m.to_str().unwrap(), "--json"]));
    assert_eq!(v["expert_count"], 16);
    assert!(v["resident_bytes"].as_u64().unwrap() > 0);
    assert!(v["expert_bytes"].as_u64().unwrap() > 0);
    assert_eq!(v["runnable"], true);
    let text = String::from_utf8(coli(&["plan", "--model", m.to_str().unwrap()]).stdout).unwrap();
    assert!(
        text.contains("resident part") && text.contains("verdict"),
        "{text}"
    );
}

#[test]
fn trace_streams_records_and_simulates() {
    let m = olmoe();
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("trace.json");
    let state = tmp.path().join("state");
    let ids = "5,17,99,3,250,7";
    // A streamed run and a resident run give the same greedy tokens and the same routing.
    let run = |extra: &[&str], out: &Path| {
        let mut args = vec![
            "trace",
            "--model",
            m.to_str().unwrap(),
            "--prompt-ids",
            ids,
            "--max-tokens",
            "12",
            "--json",
            "--output",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        json(&coli(&args))
    };
    let streamed = run(
        &[
            "--stream",
            "--expert-cache",
            "0",
            "--state-dir",
            state.to_str().unwrap(),
        ],
        &trace,
    );
    let resident_trace = tmp.path().join("resident.json");
    let resident = run(&[], &resident_trace);
    assert_eq!(streamed["generated_tokens"], 12);
    assert_eq!(
        std::fs::read(&trace).unwrap(),
        std::fs::read(&resident_trace).unwrap(),
        "streaming changed the routing"
    );
    assert!(resident.get("store").is_none());
    let st = &streamed["store"];
    assert_eq!(st["capacity_experts"], 0, "a zero budget keeps nothing");
    assert_eq!(st["hits"], 0);
    assert!(st["misses"].as_u64().unwrap() > 0);
    // The usage history was written under the state folder.
    let models = std::fs::read_dir(state.join("models")).unwrap().count();
    assert_eq!(models, 1);

    let sim = json(&coli(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--capacity",
        "0,4,100%",
        "--json",
    ]));
    let results = sim["results"].as_array().unwrap();
    for r in results {
        let b = results
            .iter()
            .find(|x| x["policy"] == "belady" && x["capacity"] == r["capacity"])
            .unwrap();
        assert!(r["hit_rate"].as_f64().unwrap() <= b["hit_rate"].as_f64().unwrap() + 1e-12);
        if r["capacity"] == 0 {
            assert_eq!(r["hits"], 0);
        }
    }
    let text = String::from_utf8(
        coli(&[
            "simulate",
            "--synthetic",
            "4,16,2,50,1.0,0.2",
            "--capacity",
            "25%",
        ])
        .stdout,
    )
    .unwrap();
    assert!(text.contains("belady") && text.contains("lrfu"), "{text}");
}

#[test]
fn bad_arguments_are_clear_errors() {
    let o = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(["simulate", "--synthetic", "4,16,20,50,1.0,0.2"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("TOP_K"));
    let o = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args([
            "trace",
            "--model",
            olmoe().to_str().unwrap(),
            "--prompt-ids",
            "1,2",
            "--stream",
            "--no-history",
            "--policy",
            "mru",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown policy"));
}
