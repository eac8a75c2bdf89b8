//! Hand-made corrupt and hostile safetensors files and indexes: each must be a typed error
//! naming the file (and tensor where there is one), never a panic or an out-of-bounds read.

use colibri_engine::container::{parse_index, parse_safetensors_header, Checkpoint};
use colibri_engine::Error;
use std::path::Path;

/// A safetensors file from a raw header string and a data section.
fn file_with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

fn parse(bytes: &[u8]) -> Result<colibri_engine::container::ParsedHeader, Error> {
    parse_safetensors_header(bytes, Path::new("x.safetensors"))
}

fn err_text(bytes: &[u8]) -> String {
    parse(bytes).expect_err("must be rejected").to_string()
}

#[test]
fn valid_file_parses() {
    let f = file_with_header(
        r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}}"#,
        &[0u8; 12],
    );
    let h = parse(&f).unwrap();
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.metadata["format"], "pt");
}

#[test]
fn truncated_and_oversized_headers_are_rejected() {
    assert!(err_text(&[1, 2, 3]).contains("too short"));
    let mut f = file_with_header(r#"{}"#, &[]);
    f[..8].copy_from_slice(&1000u64.to_le_bytes());
    assert!(err_text(&f).contains("past the end"));
    f[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err_text(&f).contains("limit"));
}

#[test]
fn malformed_json_is_rejected() {
    assert!(err_text(&file_with_header("{not json", &[])).contains("not valid JSON"));
    assert!(err_text(&file_with_header("[1,2]", &[])).contains("not a JSON object"));
    let mut f = file_with_header("{\"a\":1}", &[]);
    f[9] = 0xff;
    assert!(err_text(&f).contains("UTF-8"));
}

#[test]
fn offsets_out_of_bounds_are_rejected() {
    let f = file_with_header(
        r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
        &[0u8; 8],
    );
    let e = err_text(&f);
    assert!(
        e.contains("'w'") && e.contains("past the data section"),
        "{e}"
    );
}

#[test]
fn shape_overflow_is_rejected() {
    let f = file_with_header(
        r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}}"#,
        &[0u8; 4],
    );
    assert!(err_text(&f).contains("overflows"));
}

#[test]
fn shape_bytes_mismatch_is_rejected() {
    let f = file_with_header(
        r#"{"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}}"#,
        &[0u8; 8],
    );
    let e = err_text(&f);
    assert!(e.contains("holds 8 bytes") && e.contains("needs 6"), "{e}");
}

#[test]
fn overlapping_and_reversed_ranges_are_rejected() {
    let f = file_with_header(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
        &[0u8; 12],
    );
    assert!(err_text(&f).contains("overlaps"));
    let f = file_with_header(
        r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}"#,
        &[0u8; 8],
    );
    assert!(err_text(&f).contains("reversed"));
}

#[test]
fn unknown_dtype_and_bad_fields_are_rejected() {
    let f = file_with_header(
        r#"{"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}"#,
        &[0u8; 1],
    );
    assert!(err_text(&f).contains("unknown dtype"));
    let f = file_with_header(
        r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
        &[0u8; 4],
    );
    assert!(err_text(&f).contains("non-negative"));
    let f = file_with_header(
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
        &[0u8; 4],
    );
    assert!(err_text(&f).contains("data_offsets"));
}

#[test]
fn index_must_name_plain_shard_files() {
    let p = Path::new("model.safetensors.index.json");
    assert!(parse_index(br#"{"weight_map":{"a":"../../etc/passwd"}}"#, p).is_err());
    assert!(parse_index(br#"{"weight_map":{"a":"/abs.safetensors"}}"#, p).is_err());
    assert!(parse_index(br#"{"weight_map":{}}"#, p).is_err());
    assert!(parse_index(br#"{"nope":1}"#, p).is_err());
    assert!(parse_index(b"\xff", p).is_err());
    let m = parse_index(
        br#"{"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors"}}"#,
        p,
    )
    .unwrap();
    assert_eq!(m["a"], "model-00001-of-00002.safetensors");
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

#[test]
fn duplicate_tensor_across_shards_is_rejected() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "config.json", b"{}");
    let f = file_with_header(
        r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        &[0u8; 4],
    );
    write(d.path(), "a.safetensors", &f);
    write(d.path(), "b.safetensors", &f);
    let e = Checkpoint::open(d.path())
        .err()
        .expect("duplicate must fail");
    assert!(matches!(e, Error::DuplicateTensor { .. }), "{e}");
}

#[test]
fn index_pointing_at_wrong_shard_is_rejected() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "config.json", b"{}");
    let f = file_with_header(
        r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        &[0u8; 4],
    );
    write(d.path(), "a.safetensors", &f);
    write(d.path(), "b.safetensors", &file_with_header("{}", &[]));
    write(
        d.path(),
        "model.safetensors.index.json",
        br#"{"weight_map":{"w":"b.safetensors"}}"#,
    );
    let e = Checkpoint::open(d.path())
        .err()
        .expect("must fail")
        .to_string();
    assert!(e.contains("'w'") && e.contains("b.safetensors"), "{e}");
    // An index naming a shard that does not exist.
    write(
        d.path(),
        "model.safetensors.index.json",
        br#"{"weight_map":{"w":"missing.safetensors"}}"#,
    );
    let e = Checkpoint::open(d.path())
        .err()
        .expect("must fail")
        .to_string();
    assert!(e.contains("missing.safetensors"), "{e}");
}

#[test]
fn folders_without_config_or_weights_are_rejected() {
    let d = tempfile::tempdir().unwrap();
    let e = Checkpoint::open(d.path())
        .err()
        .expect("no config")
        .to_string();
    assert!(e.contains("config.json"), "{e}");
    write(d.path(), "config.json", b"{}");
    let e = Checkpoint::open(d.path())
        .err()
        .expect("no weights")
        .to_string();
    assert!(e.contains("safetensors"), "{e}");
    write(d.path(), "config.json", b"{oops");
    assert!(Checkpoint::open(d.path()).is_err());
    let e = Checkpoint::open(&d.path().join("nope"))
        .err()
        .expect("not a dir")
        .to_string();
    assert!(e.contains("not a directory"), "{e}");
}

#[test]
fn unknown_model_type_lists_the_supported_ones() {
    let d = tempfile::tempdir().unwrap();
    write(
        d.path(),
        "config.json",
        br#"{"model_type":"llama_moe_9000"}"#,
    );
    write(d.path(), "model.safetensors", &file_with_header("{}", &[]));
    let e = colibri_engine::Model::load(d.path())
        .err()
        .expect("must fail")
        .to_string();
    assert!(
        e.contains("llama_moe_9000") && e.contains("olmoe") && e.contains("mixtral"),
        "{e}"
    );
}

/// A deterministic stand-in for the fuzz targets that CI can run: thousands of byte-level
/// mutations of real fixture files' headers and of an index never panic, and whatever is
/// accepted stays in bounds.
#[test]
fn mutated_headers_never_panic() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let original = std::fs::read(fixtures.join("olmoe/model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;
    // The header plus a little data keeps each parse cheap.
    let base = &original[..(8 + header_len + 64).min(original.len())];
    let index = std::fs::read(fixtures.join("mixtral/model.safetensors.index.json")).unwrap();
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..4000 {
        let src: &[u8] = if round % 2 == 0 { base } else { &index };
        let mut m = src.to_vec();
        for _ in 0..1 + next() % 8 {
            let i = (next() as usize) % m.len();
            match next() % 4 {
                0 => m[i] = next() as u8,
                1 => m[i] = b"0123456789,:[]{}\"-e"[(next() % 19) as usize],
                2 => {
                    m.truncate(i.max(1));
                }
                _ => m.insert(i, next() as u8),
            }
        }
        if round % 2 == 0 {
            if let Ok(h) = parse(&m) {
                for t in &h.tensors {
                    assert!(h.data_start + t.end <= m.len());
                }
            }
        } else {
            let _ = parse_index(&m, Path::new("i.json"));
        }
    }
}
