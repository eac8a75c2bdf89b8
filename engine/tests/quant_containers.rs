//! Converted containers against the transformers fixtures (tests/fixtures/<family>), the
//! colibri C layout, hostile containers, and resuming an interrupted conversion.

use colibri_engine::convert::{convert, parse_format, ConvertOptions};
use colibri_engine::quant::eval::{agreement, evaluate, load_reference};
use colibri_engine::tensor::{ScaleType, WeightFormat};
use colibri_engine::Model;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// Fixture families this engine can load and convert (families still being added are
/// skipped, loudly). A checkpoint published quantized (gpt-oss's MXFP4 experts) is read as
/// it is: `coli convert` takes bf16/f16/f32/FP8 sources, so it is not converted here.
fn families() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("tests/fixtures")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("ref.json").exists())
        .filter(|p| !published_quantized(p))
        .filter(|p| match Model::load(p) {
            Ok(_) => true,
            Err(e) => {
                eprintln!("skipping {}: {e}", p.display());
                false
            }
        })
        .collect();
    v.sort();
    assert!(
        v.len() >= 3,
        "expected at least the olmoe, qwen3_moe and mixtral fixtures"
    );
    v
}

/// Whether config.json names a quantization the checkpoint is published in (`quant_method`).
fn published_quantized(dir: &Path) -> bool {
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    cfg["quantization_config"]["quant_method"].is_string()
}

fn convert_to(fam: &Path, out: &Path, experts: WeightFormat, dense: WeightFormat) {
    convert_with(fam, out, experts, dense, None, true)
}

fn convert_with(
    fam: &Path,
    out: &Path,
    experts: WeightFormat,
    dense: WeightFormat,
    attention: Option<WeightFormat>,
    interleave: bool,
) {
    let opts = ConvertOptions {
        input: fam.to_path_buf(),
        output: out.to_path_buf(),
        experts,
        dense,
        attention,
        lm_head: None,
        interleave,
    };
    convert(&opts, &()).unwrap_or_else(|e| panic!("converting {}: {e}", fam.display()));
}

/// int4 written with its rows interleaved by 8 (`int4-rows8`, the default) gives the logits
/// of the same model written row after row, bit for bit, on every family: routed experts
/// (int4-g64) and attention (int4-g32, MLA's per-head blocks of `kv_b_proj` included).
#[test]
fn rows8_containers_give_the_logits_of_row_major_ones() {
    let i4 = |group| WeightFormat::I4 {
        group,
        scale: ScaleType::F16,
    };
    for fam in families() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let dense = parse_format("int8-g32", 0).unwrap();
        convert_with(&fam, a.path(), i4(64), dense, Some(i4(32)), true);
        convert_with(&fam, b.path(), i4(64), dense, Some(i4(32)), false);
        let ckpt = colibri_engine::container::Checkpoint::open(a.path()).unwrap();
        let interleaved = ckpt
            .tensor_names()
            .filter_map(|n| ckpt.get(n)?.quant.as_ref()?.format)
            .filter(|f| f.interleaved())
            .count();
        assert!(interleaved > 0, "{}: no int4-rows8 tensor", fam.display());
        let r = load_reference(&fam).unwrap();
        let la = Model::load(a.path()).unwrap().score(&r.input_ids).unwrap();
        // The row-major container mapped: in RAM it would be interleaved at load as well.
        let mapped = colibri_engine::container::OpenOptions {
            weights: colibri_engine::container::WeightsIn::Map,
            streamed_experts: false,
        };
        let lb = Model::load_with(b.path(), &mapped, &|_| {})
            .unwrap()
            .score(&r.input_ids)
            .unwrap();
        assert_eq!(la, lb, "{}: int4-rows8 logits differ", fam.display());
    }
}

/// `--lm-head int4-g32` and `--lm-head int5-g32` (the lean container with a narrower head):
/// the output head, and only it, is written in that format (int4 interleaved by 8 where the
/// shape allows), and every family stays close to transformers' logits: the same next token
/// at nearly every position, and a mean KL within a small multiple of the int8-g32 head's —
/// int5's closer than int4's.
#[test]
fn int4_and_int5_output_heads_stay_close_to_transformers() {
    let i4 = |group| WeightFormat::I4 {
        group,
        scale: ScaleType::F16,
    };
    let i5 = WeightFormat::I5 {
        group: 32,
        scale: ScaleType::F16,
    };
    let dense = parse_format("int8-g32", 0).unwrap();
    for fam in families() {
        let r = load_reference(&fam).unwrap();
        let a = tempfile::tempdir().unwrap();
        convert_with(&fam, a.path(), i4(64), dense, None, true);
        let int8 = agreement(
            &r.logits,
            &Model::load(a.path()).unwrap().score(&r.input_ids).unwrap(),
        );
        let mut narrow = Vec::new();
        for head in [i4(32), i5] {
            let b = tempfile::tempdir().unwrap();
            let opts = ConvertOptions {
                input: fam.clone(),
                output: b.path().to_path_buf(),
                experts: i4(64),
                dense,
                attention: None,
                lm_head: Some(head),
                interleave: true,
            };
            convert(&opts, &()).unwrap();
            let ckpt = colibri_engine::container::Checkpoint::open(b.path()).unwrap();
            let tied = !ckpt.tensor_names().any(|n| n.ends_with("lm_head.weight"));
            let mut heads = 0;
            for n in ckpt.tensor_names() {
                let t = ckpt.get(n).unwrap();
                let Some(f) = t.quant.as_ref().and_then(|q| q.format) else {
                    continue;
                };
                let is_head = colibri_engine::convert::is_output_head(n, tied);
                let routed = colibri_engine::container::is_routed_expert(n).is_some();
                let rows8 = WeightFormat::I4Rows8 {
                    group: 32,
                    scale: ScaleType::F16,
                };
                if f == head || (f == rows8 && head == i4(32)) {
                    assert!(is_head, "{}: {n} is {}", fam.display(), f.name());
                    heads += 1;
                } else if is_head {
                    panic!("{}: the head {n} is {}", fam.display(), f.name());
                } else if !routed {
                    assert_eq!(f, dense, "{}: {n}", fam.display());
                }
            }
            assert!(heads >= 1, "{}: no {} head", fam.display(), head.name());
            let got = agreement(
                &r.logits,
                &Model::load(b.path()).unwrap().score(&r.input_ids).unwrap(),
            );
            eprintln!(
                "{}: head int8-g32 argmax {}/{} KL {:.2e}; head {} argmax {}/{} KL {:.2e}",
                fam.display(),
                int8.argmax_equal,
                int8.positions,
                int8.mean_kl,
                head.name(),
                got.argmax_equal,
                got.positions,
                got.mean_kl
            );
            narrow.push(got);
        }
        let (int4, int5) = (&narrow[0], &narrow[1]);
        // Measured: int4's KL 1.1–8.2× the int8 head's (qwen3_moe 3.1e-4 → 2.6e-3), argmax
        // down by 0–8 of 32 on these random models, whose logits lie close together; the
        // trained model's figures are in docs/FORMAT.md.
        assert!(
            int4.mean_kl <= 4.0 * int8.mean_kl + 3e-3,
            "{}: int4 head KL {:.2e} against the int8 head's {:.2e}",
            fam.display(),
            int4.mean_kl,
            int8.mean_kl
        );
        assert!(
            int4.argmax_equal + 9 >= int8.argmax_equal && int4.argmax_equal >= 20,
            "{}: int4 head argmax {} against the int8 head's {}",
            fam.display(),
            int4.argmax_equal,
            int8.argmax_equal
        );
        // Measured: int5's KL 1.02–2.7× the int8 head's (qwen3_moe 3.1e-4 → 8.4e-4), a
        // quarter to a tenth of what int4 adds; argmax within 3 of int8's.
        assert!(
            int5.mean_kl <= 2.0 * int8.mean_kl + 5e-4 && int5.mean_kl < int4.mean_kl,
            "{}: int5 head KL {:.2e} against the int8 head's {:.2e} and int4's {:.2e}",
            fam.display(),
            int5.mean_kl,
            int8.mean_kl,
            int4.mean_kl
        );
        assert!(
            int5.argmax_equal + 4 >= int8.argmax_equal,
            "{}: int5 head argmax {} against the int8 head's {}",
            fam.display(),
            int5.argmax_equal,
            int8.argmax_equal
        );
    }
}

#[test]
fn int8_container_matches_transformers_on_every_family() {
    for fam in families() {
        let tmp = tempfile::tempdir().unwrap();
        convert_to(&fam, tmp.path(), WeightFormat::I8Row, WeightFormat::BF16);
        let r = load_reference(&fam).unwrap();
        let m = Model::load(tmp.path()).unwrap();
        let got = m.score(&r.input_ids).unwrap();
        let v = r.logits[0].len();
        // A position is good when its argmax agrees and every logit is within 0.15.
        let good = r
            .logits
            .iter()
            .enumerate()
            .filter(|(p, row)| {
                let g = &got[p * v..(p + 1) * v];
                let close = row.iter().zip(g).all(|(a, b)| (a - b).abs() <= 0.15);
                let am = |x: &[f32]| (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b });
                close && am(row) == am(g)
            })
            .count();
        let a = agreement(&r.logits, &got);
        eprintln!(
            "{}: int8 argmax {}/{}, good positions {good}, max |Δ| {:.4}, mean KL {:.2e}",
            fam.display(),
            a.argmax_equal,
            a.positions,
            a.max_abs_diff,
            a.mean_kl
        );
        assert!(
            a.argmax_equal >= 31 && a.positions == 32,
            "{}: argmax {}/{}",
            fam.display(),
            a.argmax_equal,
            a.positions
        );
        // DeepSeek-V3.2's indexer picks its keys by a top-k over int8-rounded products: one
        // flipped pick moves a later position by ~0.25 (a discrete step, not drift), so its
        // fixture is allowed two such positions; argmax must still agree as above.
        let need = if fam.ends_with("deepseek_v32") {
            30
        } else {
            31
        };
        assert!(
            good >= need,
            "{}: only {good} of 32 positions within 0.15",
            fam.display()
        );
    }
}

#[test]
fn grouped_int4_is_not_worse_than_per_row() {
    for fam in families() {
        let kl = |format: WeightFormat| {
            let tmp = tempfile::tempdir().unwrap();
            convert_to(&fam, tmp.path(), format, WeightFormat::BF16);
            evaluate(tmp.path(), &fam).unwrap().mean_kl
        };
        // Same scale type for both, so only the grouping differs.
        let g64 = kl(WeightFormat::I4 {
            group: 64,
            scale: ScaleType::F16,
        });
        let row = kl(WeightFormat::I4 {
            group: 0,
            scale: ScaleType::F16,
        });
        let int8 = kl(WeightFormat::I8Row);
        eprintln!(
            "{}: mean KL int8 {int8:.2e}, int4-g64 {g64:.2e}, int4 per row {row:.2e}",
            fam.display()
        );
        assert!(
            g64 <= row * 1.0001 + 1e-9,
            "{}: int4-g64 KL {g64} > per-row {row}",
            fam.display()
        );
        assert!(
            int8 < g64,
            "{}: int8 should be closer than int4",
            fam.display()
        );
    }
}

/// Rewrites our container `src` in the colibri C layout: every quantized tensor as a flat U8
/// `name` plus a flat F32 `name.qs`, plain tensors unchanged, no container records.
fn write_c_layout(src: &Path, dst: &Path) {
    use safetensors::tensor::{Dtype, TensorView};
    std::fs::create_dir_all(dst).unwrap();
    let ck = colibri_engine::container::Checkpoint::open(src).unwrap();
    let mut names: Vec<&str> = ck.tensor_names().collect();
    names.sort();
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for n in names {
        let t = ck.get(n).unwrap();
        let (dt, shape) = match t.dtype.name() {
            "U8" => (Dtype::U8, vec![t.numel()]),
            "F32" => (Dtype::F32, vec![t.numel()]),
            "F16" => panic!("C layout scales are f32; convert with f32 scales"),
            "BF16" => (Dtype::BF16, t.shape.clone()),
            o => panic!("unexpected {o}"),
        };
        owned.push((n.to_string(), dt, shape, t.bytes().to_vec()));
    }
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, dt, s, b)| (n.clone(), TensorView::new(*dt, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dst.join("model.safetensors")).unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        if src.join(f).exists() {
            std::fs::copy(src.join(f), dst.join(f)).unwrap();
        }
    }
}

#[test]
fn c_layout_gives_the_same_logits_as_our_container() {
    for fam in families() {
        for format in [
            WeightFormat::I4 {
                group: 32,
                scale: ScaleType::F32,
            },
            WeightFormat::I4 {
                group: 0,
                scale: ScaleType::F32,
            },
            WeightFormat::I8Row,
            WeightFormat::I3G64,
            WeightFormat::I2Plain,
        ] {
            let ours = tempfile::tempdir().unwrap();
            // The C layout has rows one after another.
            convert_with(&fam, ours.path(), format, WeightFormat::BF16, None, false);
            let c = tempfile::tempdir().unwrap();
            write_c_layout(ours.path(), c.path());
            let r = load_reference(&fam).unwrap();
            let a = Model::load(ours.path())
                .unwrap()
                .score(&r.input_ids)
                .unwrap();
            let b = Model::load(c.path())
                .unwrap_or_else(|e| panic!("{} C layout {format:?}: {e}", fam.display()))
                .score(&r.input_ids)
                .unwrap();
            assert_eq!(a, b, "{} {format:?}: C layout logits differ", fam.display());
        }
    }
}

fn olmoe() -> PathBuf {
    fixtures().join("olmoe")
}

fn load_err(dir: &Path) -> String {
    match Model::load(dir) {
        Ok(_) => panic!("{} loaded, but it is broken", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn hostile_c_layout_containers_are_clear_errors() {
    use safetensors::tensor::{Dtype, TensorView};
    let ours = tempfile::tempdir().unwrap();
    convert_to(
        &olmoe(),
        ours.path(),
        WeightFormat::I4 {
            group: 32,
            scale: ScaleType::F32,
        },
        WeightFormat::BF16,
    );
    let c = tempfile::tempdir().unwrap();
    write_c_layout(ours.path(), c.path());
    let file = c.path().join("model.safetensors");
    let orig = std::fs::read(&file).unwrap();
    let victim = "model.layers.0.mlp.experts.3.up_proj.weight";
    type Edit<'a> = &'a dyn Fn(&str, Vec<u8>) -> Option<(Dtype, Vec<usize>, Vec<u8>)>;
    let rewrite = |edit: Edit| {
        let st = safetensors::SafeTensors::deserialize(&orig).unwrap();
        let mut owned = Vec::new();
        for (n, v) in st.tensors() {
            let data = v.data().to_vec();
            match edit(&n, data.clone()) {
                Some(x) => owned.push((n, x.0, x.1, x.2)),
                None => owned.push((n, v.dtype(), v.shape().to_vec(), data)),
            }
        }
        let views: Vec<(String, TensorView)> = owned
            .iter()
            .map(|(n, dt, s, b)| (n.clone(), TensorView::new(*dt, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &file).unwrap();
    };
    // Scale array of the wrong size.
    rewrite(&|n, d| {
        (n == format!("{victim}.qs"))
            .then(|| (Dtype::F32, vec![d.len() / 4 - 1], d[..d.len() - 4].to_vec()))
    });
    let e = load_err(c.path());
    assert!(e.contains(victim) && e.contains("scales"), "{e}");
    // Weight bytes matching no layout.
    rewrite(&|n, d| (n == victim).then(|| (Dtype::U8, vec![d.len() - 3], d[3..].to_vec())));
    let e = load_err(c.path());
    assert!(e.contains(victim) && e.contains("match no layout"), "{e}");
    // U8 weights without scales.
    rewrite(&|n, _| (n == format!("{victim}.qs")).then(|| (Dtype::F32, vec![0], vec![])));
    let e = load_err(c.path());
    assert!(e.contains(victim), "{e}");
}

/// Replaces the `__metadata__` value `key` of a container file in place (same length, so
/// offsets stay valid) and returns the error the loader gives.
fn corrupt_metadata(dir: &Path, file: &str, from: &str, to: &str) -> String {
    assert_eq!(from.len(), to.len());
    let p = dir.join(file);
    let mut b = std::fs::read(&p).unwrap();
    let pos = b
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .expect("pattern in header");
    b[pos..pos + to.len()].copy_from_slice(to.as_bytes());
    std::fs::write(&p, b).unwrap();
    load_err(dir)
}

#[test]
fn hostile_converted_containers_are_clear_errors() {
    let base = tempfile::tempdir().unwrap();
    convert_to(
        &olmoe(),
        base.path(),
        WeightFormat::I4 {
            group: 32,
            scale: ScaleType::F16,
        },
        WeightFormat::I8Row,
    );
    let copy = || {
        let d = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(base.path()).unwrap().flatten() {
            std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
        }
        d
    };
    let experts = "experts-layer00000.safetensors";
    let dense = "dense-00001-of-00001.safetensors";
    let d = copy();
    let e = corrupt_metadata(
        d.path(),
        experts,
        "colibri.version\":\"1\"",
        "colibri.version\":\"7\"",
    );
    assert!(e.contains("version 7"), "{e}");
    let d = copy();
    let e = corrupt_metadata(
        d.path(),
        experts,
        "\"group_size\\\":32",
        "\"group_size\\\":48",
    );
    assert!(e.contains("group_size 48"), "{e}");
    let d = copy();
    let e = corrupt_metadata(
        d.path(),
        dense,
        "\"format\\\":\\\"int8\\\"",
        "\"format\\\":\\\"int9\\\"",
    );
    assert!(e.contains("int9"), "{e}");
    let d = copy();
    let e = corrupt_metadata(d.path(), experts, "\"offset\\\":4096", "\"offset\\\":4095");
    assert!(e.contains("aligned"), "{e}");
    // A record whose shape disagrees with the stored bytes.
    let d = copy();
    let e = corrupt_metadata(
        d.path(),
        experts,
        "\"shape\\\":[32,64]",
        "\"shape\\\":[16,64]",
    );
    assert!(e.contains("stored as U8"), "{e}");
}

fn dir_bytes(d: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn an_interrupted_conversion_resumes_to_the_same_bytes() {
    let fam = fixtures().join("mixtral");
    let whole = tempfile::tempdir().unwrap();
    let i4 = parse_format("int4", 64).unwrap();
    convert_to(&fam, whole.path(), i4, WeightFormat::BF16);
    let want = dir_bytes(whole.path());
    assert!(want.iter().any(|(n, _)| n.starts_with("experts-layer")));

    // What a kill -9 leaves behind: a finished part, a half-written part, a lock held by a
    // dead process, and no index yet.
    let cut = tempfile::tempdir().unwrap();
    convert_to(&fam, cut.path(), i4, WeightFormat::BF16);
    let last = want
        .iter()
        .rev()
        .find(|(n, _)| n.starts_with("experts-layer"))
        .unwrap()
        .0
        .clone();
    let data = std::fs::read(cut.path().join(&last)).unwrap();
    std::fs::remove_file(cut.path().join(&last)).unwrap();
    std::fs::write(
        cut.path().join(format!("{last}.partial")),
        &data[..data.len() / 2],
    )
    .unwrap();
    std::fs::remove_file(cut.path().join("model.safetensors.index.json")).unwrap();
    std::fs::write(cut.path().join(".colibri-convert.lock"), "999999999\n").unwrap();
    // A finished part damaged after the fact must be redone, not trusted.
    let first = want
        .iter()
        .find(|(n, _)| n.starts_with("dense-"))
        .unwrap()
        .0
        .clone();
    let mut d = std::fs::read(cut.path().join(&first)).unwrap();
    let n = d.len();
    d.truncate(n - 1);
    std::fs::write(cut.path().join(&first), d).unwrap();

    convert_to(&fam, cut.path(), i4, WeightFormat::BF16);
    assert_eq!(dir_bytes(cut.path()), want);

    // Another format into the same folder is refused.
    let opts = ConvertOptions {
        input: fam.clone(),
        output: cut.path().to_path_buf(),
        experts: WeightFormat::I8Row,
        dense: WeightFormat::BF16,
        attention: None,
        lm_head: None,
        interleave: true,
    };
    let e = convert(&opts, &()).unwrap_err().to_string();
    assert!(e.contains("other options"), "{e}");
}

#[test]
fn a_live_lock_stops_a_second_converter() {
    let out = tempfile::tempdir().unwrap();
    // Our own parent process is certainly alive.
    let ppid = std::os::unix::process::parent_id();
    std::fs::write(
        out.path().join(".colibri-convert.lock"),
        format!("{ppid}\n"),
    )
    .unwrap();
    let opts = ConvertOptions {
        input: olmoe(),
        output: out.path().to_path_buf(),
        experts: WeightFormat::I8Row,
        dense: WeightFormat::BF16,
        attention: None,
        lm_head: None,
        interleave: true,
    };
    let e = convert(&opts, &()).unwrap_err().to_string();
    assert!(e.contains("another converter"), "{e}");
}

/// The deterministic stand-in for the `container_meta` fuzz target that CI runs: random byte
/// edits inside the header (records included) of a real container file never panic.
#[test]
fn mutated_container_headers_never_panic() {
    let base = tempfile::tempdir().unwrap();
    convert_to(
        &olmoe(),
        base.path(),
        WeightFormat::I4 {
            group: 32,
            scale: ScaleType::F16,
        },
        WeightFormat::I8Row,
    );
    let file = "experts-layer00001.safetensors";
    let orig = std::fs::read(base.path().join(file)).unwrap();
    let header_len = u64::from_le_bytes(orig[..8].try_into().unwrap()) as usize;
    let mut s = 0x1234_5678u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let (mut ok, mut err) = (0, 0);
    for _ in 0..200 {
        let mut b = orig.clone();
        for _ in 0..1 + next() % 4 {
            let at = 8 + (next() as usize % header_len);
            b[at] = match next() % 3 {
                0 => b"0123456789"[next() as usize % 10],
                1 => b"\"{}[],:"[next() as usize % 7],
                _ => next() as u8,
            };
        }
        std::fs::write(base.path().join(file), &b).unwrap();
        match Model::load(base.path()) {
            Ok(m) => {
                // Whatever loaded must also run.
                let _ = m.score(&[1, 2, 3]);
                ok += 1;
            }
            Err(_) => err += 1,
        }
    }
    std::fs::write(base.path().join(file), &orig).unwrap();
    assert!(Model::load(base.path()).is_ok());
    assert!(
        err > 100,
        "most mutations must be refused ({ok} loaded, {err} refused)"
    );
}

/// MTP layers (after the decoder layers) keep their routed experts at int8 when the other
/// experts go to int4.
#[test]
fn mtp_experts_stay_int8_in_an_int4_container() {
    let fam = fixtures().join("deepseek_v3");
    let tmp = tempfile::tempdir().unwrap();
    let int4 = parse_format("int4", 64).unwrap();
    convert_to(&fam, tmp.path(), int4, WeightFormat::BF16);
    let ckpt = colibri_engine::container::Checkpoint::open(tmp.path()).unwrap();
    let format = |name: &str| {
        ckpt.get(name)
            .and_then(|t| t.quant.as_ref())
            .and_then(|q| q.format)
            .unwrap_or_else(|| panic!("{name} is not a quantized tensor"))
    };
    assert_eq!(
        format("model.layers.1.mlp.experts.0.gate_proj.weight").row_major(),
        int4
    );
    assert_eq!(
        format("model.layers.3.mlp.experts.0.gate_proj.weight"),
        WeightFormat::I8Row
    );
    // And the converted model still loads, MTP layer included.
    Model::load(tmp.path()).unwrap();
}

/// Weights copied into RAM (`COLIBRI_WEIGHTS=ram`) give the logits of the same folder
/// memory-mapped, and a folder whose experts will be streamed keeps its expert files mapped
/// while its dense file is copied.
#[test]
fn weights_in_ram_give_the_logits_of_mapped_ones() {
    use colibri_engine::container::{Checkpoint, OpenOptions, WeightsIn};
    let fam = olmoe();
    let tmp = tempfile::tempdir().unwrap();
    let int4 = parse_format("int4", 64).unwrap();
    convert_to(&fam, tmp.path(), int4, WeightFormat::BF16);
    let r = load_reference(&fam).unwrap();
    let open = |weights, streamed_experts| OpenOptions {
        weights,
        streamed_experts,
    };
    let score = |o: OpenOptions| {
        Model::load_with(tmp.path(), &o, &|_| {})
            .unwrap()
            .score(&r.input_ids)
            .unwrap()
    };
    let mapped = score(open(WeightsIn::Map, false));
    assert_eq!(score(open(WeightsIn::Ram, false)), mapped);
    assert_eq!(score(open(WeightsIn::Ram, true)), mapped);
    // Where each file's bytes live.
    let ram = Checkpoint::open_with(tmp.path(), &open(WeightsIn::Ram, true)).unwrap();
    let map = Checkpoint::open_with(tmp.path(), &open(WeightsIn::Map, false)).unwrap();
    for name in ram.tensor_names() {
        let (a, b) = (ram.get(name).unwrap(), map.get(name).unwrap());
        assert_eq!(
            &a.file.bytes()[a.start..a.end],
            &b.file.bytes()[b.start..b.end],
            "{name}"
        );
        let expert = name.contains(".experts.");
        assert_eq!(a.file.in_ram(), !expert, "{name}");
        assert!(!b.file.in_ram(), "{name}");
    }
}
