#![no_main]
//! Any byte string as `model.safetensors.index.json`: Ok only with plain shard file names.

use colibri_engine::container::parse_index;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(map) = parse_index(data, Path::new("model.safetensors.index.json")) {
        for file in map.values() {
            assert!(!file.contains('/') && !file.contains('\\') && file.ends_with(".safetensors"));
        }
    }
});
