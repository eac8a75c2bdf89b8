#![no_main]
//! Any byte string as a whole safetensors file: the parser returns Ok or a typed error, and
//! every range it accepts lies inside the input.

use colibri_engine::container::parse_safetensors_header;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = parse_safetensors_header(data, Path::new("fuzz.safetensors")) {
        for t in &h.tensors {
            assert!(h.data_start + t.end <= data.len());
            assert!(t.start <= t.end);
        }
    }
});
