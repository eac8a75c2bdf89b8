#![no_main]
//! Any byte string as the colibri records of a converted container: first as a JSON object
//! of `__metadata__` strings, then as a whole safetensors file whose metadata is parsed the
//! same way. The parser returns Ok or a typed error; accepted records name valid formats
//! and 4096-aligned, non-overflowing expert extents. The C layout's byte-count rule gets the
//! numbers the input spells.

use colibri_engine::container::{
    c_layout_format, parse_container_meta, parse_safetensors_header, EXPERT_ALIGN,
};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::path::Path;

fn check(meta: &BTreeMap<String, String>) {
    if let Ok(Some(m)) = parse_container_meta(meta, Path::new("fuzz.safetensors")) {
        for r in m.tensors.values() {
            assert!(r.weight_format().is_ok());
        }
        for e in &m.experts {
            assert!(e.offset % EXPERT_ALIGN as u64 == 0 && e.length % EXPERT_ALIGN as u64 == 0);
            assert!(e.offset.checked_add(e.length).is_some());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(meta) = serde_json::from_slice::<BTreeMap<String, String>>(data) {
        check(&meta);
    }
    if let Ok(h) = parse_safetensors_header(data, Path::new("fuzz.safetensors")) {
        check(&h.metadata);
    }
    if data.len() >= 32 {
        let n = |i: usize| {
            u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap()) as usize % (1 << 40)
        };
        let _ = c_layout_format(n(0), n(1), n(2), n(3));
    }
});
