//! The `coli` binary's in-process path (`--local`) against the transformers fixtures, and
//! its behaviour on bad input: a clear one-line error, a non-zero exit, never a panic.

mod common;

use common::{csv, families, fixtures, ids_of, reference};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn coli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(args)
        // Never reach a real daemon from a test.
        .env("COLI_SOCKET", "/nonexistent/colibri-test.sock")
        .output()
        .expect("spawn coli")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_ok(o: &Output) {
    assert!(o.status.success(), "coli failed: {}", stderr(o));
}

/// Asserts a clean failure and returns stderr.
fn assert_clean_failure(o: &Output) -> String {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "expected exit code 1, stderr: {err}"
    );
    assert!(!err.contains("panicked"), "coli panicked: {err}");
    assert!(
        err.starts_with("error: "),
        "stderr should start with 'error: ': {err}"
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "error should be one line: {err}"
    );
    assert!(
        o.stdout.is_empty(),
        "nothing on stdout on failure: {}",
        stdout(o)
    );
    err
}

fn greedy_ids(dir: &Path, prompt: &[u32], n: usize) -> Output {
    coli(&[
        "run",
        "--local",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &csv(prompt),
        "--max-tokens",
        &n.to_string(),
        "--temperature",
        "0",
        "--output",
        "ids",
    ])
}

#[test]
fn run_greedy_ids_match_transformers() {
    let mut mismatches = Vec::new();
    for (family, dir) in families() {
        let r = reference(&dir);
        let want = ids_of(&r["greedy_ids"]);
        let o = greedy_ids(&dir, &ids_of(&r["prompt_ids"]), want.len());
        assert_ok(&o);
        let out = stdout(&o);
        assert_eq!(
            out.lines().count(),
            1,
            "{family}: one line expected: {out:?}"
        );
        let got: Vec<u32> = out
            .split_whitespace()
            .map(|t| t.parse().expect("ids only"))
            .collect();
        if got != want {
            mismatches.push(format!("{family}: got {got:?}, transformers {want:?}"));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn run_json_reports_ids_text_and_finish() {
    let (_, dir) = families().remove(0);
    let r = reference(&dir);
    let o = coli(&[
        "run",
        "--local",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &csv(&ids_of(&r["prompt_ids"])),
        "--max-tokens",
        "5",
        "--temperature",
        "0",
        "--ignore-eos",
        "--output",
        "json",
    ]);
    assert_ok(&o);
    let v: Value = serde_json::from_str(&stdout(&o)).expect("one JSON document");
    assert_eq!(ids_of(&v["ids"]).len(), 5);
    assert_eq!(v["finish_reason"], "length");
    assert!(v["text"].is_string());
    assert_eq!(
        v["stats"]["prompt_tokens"],
        r["prompt_ids"].as_array().unwrap().len()
    );
    assert_eq!(v["stats"]["generated_tokens"], 5);
}

#[test]
fn score_prints_argmax_and_full_logits() {
    for (family, dir) in families() {
        let r = reference(&dir);
        let ids = ids_of(&r["input_ids"]);
        let o = coli(&[
            "score",
            "--local",
            "--model",
            dir.to_str().unwrap(),
            "--ids",
            &csv(&ids),
            "--output",
            "json",
        ]);
        assert_ok(&o);
        let v: Value = serde_json::from_str(&stdout(&o)).expect("one JSON document");
        let argmax = v["argmax"].as_array().expect("argmax array");
        let rows = v["logits"].as_array().expect("logits array");
        let want_rows = r["logits"].as_array().unwrap();
        assert_eq!(argmax.len(), ids.len(), "{family}: one argmax per position");
        assert_eq!(
            rows.len(),
            ids.len(),
            "{family}: one logits row per position"
        );
        let mut worst = 0f64;
        for (pos, (row, want)) in rows.iter().zip(want_rows).enumerate() {
            let row = row.as_array().unwrap();
            let want = want.as_array().unwrap();
            assert_eq!(row.len(), want.len(), "{family}: full vocabulary per row");
            // The printed argmax is the argmax of the printed row.
            let best = row
                .iter()
                .enumerate()
                .fold((0, f64::NEG_INFINITY), |b, (i, x)| {
                    let x = x.as_f64().unwrap();
                    if x > b.1 {
                        (i, x)
                    } else {
                        b
                    }
                })
                .0;
            assert_eq!(
                argmax[pos].as_u64(),
                Some(best as u64),
                "{family} position {pos}"
            );
            for (a, b) in row.iter().zip(want) {
                worst = worst.max((a.as_f64().unwrap() - b.as_f64().unwrap()).abs());
            }
        }
        assert!(
            worst < 2e-3,
            "{family}: logits differ from transformers by {worst}"
        );
    }
}

#[test]
fn text_prompt_streams_text() {
    let (_, dir) = families().remove(0);
    for extra in [&[][..], &["--raw"][..]] {
        let mut args = vec![
            "run",
            "--local",
            "--model",
            dir.to_str().unwrap(),
            "--max-tokens",
            "8",
            "--temperature",
            "0",
            "--ignore-eos",
            "--output",
            "json",
        ];
        args.extend_from_slice(extra);
        args.push("Hello there");
        let o = coli(&args);
        assert_ok(&o);
        let v: Value = serde_json::from_str(&stdout(&o)).expect("one JSON document");
        assert_eq!(ids_of(&v["ids"]).len(), 8, "{extra:?}");
        assert!(v["stats"]["prompt_tokens"].as_u64().unwrap() > 0);
    }
}

#[test]
fn same_seed_same_tokens() {
    let (_, dir) = families().remove(0);
    let r = reference(&dir);
    let run = |seed: &str| {
        let o = coli(&[
            "run",
            "--local",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &csv(&ids_of(&r["prompt_ids"])),
            "--max-tokens",
            "12",
            "--temperature",
            "1.0",
            "--top-p",
            "0.9",
            "--seed",
            seed,
            "--ignore-eos",
            "--output",
            "ids",
        ]);
        assert_ok(&o);
        stdout(&o)
    };
    assert_eq!(run("7"), run("7"));
}

/// A copy of a fixture in a temporary folder, to damage.
fn copy_fixture(family: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixtures().join(family)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    tmp
}

fn run_ids_on(dir: &Path) -> Output {
    greedy_ids(dir, &[1, 2, 3], 4)
}

#[test]
fn unknown_model_type_lists_supported_types() {
    let tmp = copy_fixture("olmoe");
    let cfg = tmp.path().join("config.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    v["model_type"] = "llama_moe_9000".into();
    std::fs::write(&cfg, serde_json::to_vec(&v).unwrap()).unwrap();
    let err = assert_clean_failure(&run_ids_on(tmp.path()));
    assert!(err.contains("llama_moe_9000"), "{err}");
    // Fixture folder names are model types, except variants like deepseek_v3_noqlora.
    for (f, _) in families().iter().filter(|(f, _)| !f.ends_with("_noqlora")) {
        assert!(err.contains(f), "supported type {f} not listed: {err}");
    }
}

/// Replaces `from` by `to` (same length) inside the safetensors header of `file`.
fn rename_in_header(file: &Path, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let mut bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = &mut bytes[8..8 + n];
    let pos = header
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| panic!("{from} not in the header of {}", file.display()));
    header[pos..pos + to.len()].copy_from_slice(to.as_bytes());
    std::fs::write(file, bytes).unwrap();
}

#[test]
fn missing_tensor_is_named() {
    let tmp = copy_fixture("olmoe");
    rename_in_header(
        &tmp.path().join("model.safetensors"),
        "\"model.norm.weight\"",
        "\"model.norX.weight\"",
    );
    let err = assert_clean_failure(&run_ids_on(tmp.path()));
    assert!(err.contains("model.norm.weight"), "{err}");
}

#[test]
fn corrupt_safetensors_is_reported() {
    // Header length far beyond the file.
    let tmp = copy_fixture("olmoe");
    let file = tmp.path().join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    std::fs::write(&file, &bytes).unwrap();
    let err = assert_clean_failure(&run_ids_on(tmp.path()));
    assert!(
        err.contains("model.safetensors"),
        "the file is named: {err}"
    );

    // Data cut short: offsets beyond the end of the file.
    let tmp = copy_fixture("olmoe");
    let file = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let err = assert_clean_failure(&run_ids_on(tmp.path()));
    assert!(
        err.contains("model.safetensors"),
        "the file is named: {err}"
    );

    // Garbage instead of JSON in the header.
    let tmp = copy_fixture("olmoe");
    let file = tmp.path().join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    for b in &mut bytes[8..40] {
        *b = 0xff;
    }
    std::fs::write(&file, &bytes).unwrap();
    assert_clean_failure(&run_ids_on(tmp.path()));
}

#[test]
fn prompt_longer_than_context_is_an_error() {
    let (_, dir) = families().remove(0);
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let ctx = cfg["max_position_embeddings"].as_u64().unwrap() as usize;
    let prompt: Vec<u32> = (0..ctx as u32 + 10).map(|i| 1 + i % 50).collect();
    let err = assert_clean_failure(&greedy_ids(&dir, &prompt, 4));
    assert!(err.contains("context"), "{err}");

    // A prompt that fits, with --max-tokens that does not.
    let prompt: Vec<u32> = (0..ctx as u32 - 2).map(|i| 1 + i % 50).collect();
    let err = assert_clean_failure(&greedy_ids(&dir, &prompt, 10));
    assert!(err.contains("max_tokens"), "{err}");

    // Exactly the context: no room for even one token.
    let prompt: Vec<u32> = (0..ctx as u32).map(|i| 1 + i % 50).collect();
    let o = coli(&[
        "run",
        "--local",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &csv(&prompt),
        "--output",
        "ids",
    ]);
    let err = assert_clean_failure(&o);
    assert!(err.contains("context"), "{err}");
}

#[test]
fn token_outside_vocabulary_is_an_error() {
    let (_, dir) = families().remove(0);
    let err = assert_clean_failure(&greedy_ids(&dir, &[1, 99_999_999], 4));
    assert!(err.contains("vocabulary"), "{err}");
    let o = coli(&[
        "score",
        "--local",
        "--model",
        dir.to_str().unwrap(),
        "--ids",
        "1,99999999",
    ]);
    assert_clean_failure(&o);
}

#[test]
fn nonexistent_model_dir_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-model");
    let err = assert_clean_failure(&run_ids_on(&missing));
    assert!(err.contains("no-such-model"), "{err}");
    // A folder without config.json.
    let err = assert_clean_failure(&run_ids_on(tmp.path()));
    assert!(err.contains("config.json"), "{err}");
}

#[test]
fn malformed_arguments_are_usage_errors() {
    let (_, dir) = families().remove(0);
    let o = coli(&[
        "run",
        "--local",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,x,3",
    ]);
    assert_eq!(o.status.code(), Some(2), "clap usage error: {}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"));
    let o = coli(&[
        "run",
        "--local",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2",
        "--temperature",
        "-1",
        "--output",
        "ids",
    ]);
    let err = assert_clean_failure(&o);
    assert!(err.contains("temperature"), "{err}");
}

/// Speculation with the MTP layers changes speed, never greedy tokens.
#[test]
fn draft_keeps_greedy_tokens() {
    for family in ["deepseek_v3", "glm_moe_dsa"] {
        let dir = fixtures().join(family);
        let r = reference(&dir);
        let want = ids_of(&r["greedy_ids"]);
        for draft in ["--draft=1", "--draft=3", "--no-draft"] {
            let o = coli(&[
                "run",
                "--local",
                "--model",
                dir.to_str().unwrap(),
                "--prompt-ids",
                &csv(&ids_of(&r["prompt_ids"])),
                "--max-tokens",
                &want.len().to_string(),
                "--temperature",
                "0",
                "--ignore-eos",
                "--output",
                "ids",
                "--stats",
                draft,
            ]);
            assert_ok(&o);
            let got: Vec<u32> = stdout(&o)
                .split_whitespace()
                .map(|t| t.parse().unwrap())
                .collect();
            assert_eq!(got, want, "{family} {draft}");
            assert!(stderr(&o).contains("speculation:"), "{}", stderr(&o));
        }
    }
    // A model without MTP layers refuses an explicit draft request.
    let o = coli(&[
        "run",
        "--local",
        "--model",
        fixtures().join("olmoe").to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "2",
        "--draft",
        "2",
    ]);
    let err = assert_clean_failure(&o);
    assert!(err.contains("MTP"), "{err}");
}

/// `--expert-cache` streams the experts through a tiny cache: same tokens, statistics shown.
#[test]
fn streamed_experts_give_the_same_tokens() {
    let dir = fixtures().join("olmoe");
    let state = tempfile::tempdir().unwrap();
    let r = reference(&dir);
    let want = ids_of(&r["greedy_ids"]);
    let o = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args([
            "run",
            "--local",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &csv(&ids_of(&r["prompt_ids"])),
            "--max-tokens",
            &want.len().to_string(),
            "--temperature",
            "0",
            "--ignore-eos",
            "--output",
            "ids",
            "--stats",
            "--expert-cache",
            "0",
        ])
        .env("COLI_SOCKET", "/nonexistent/colibri-test.sock")
        .env("XDG_STATE_HOME", state.path())
        .env("HOME", state.path())
        .output()
        .unwrap();
    assert_ok(&o);
    let got: Vec<u32> = stdout(&o)
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(got, want);
    assert!(stderr(&o).contains("experts: hit"), "{}", stderr(&o));
}
