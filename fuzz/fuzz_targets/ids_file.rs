#![no_main]
//! Any bytes as a `coli perplexity --ids-file`: parsed ids round-trip through their text.

use colibri_engine::perplexity::parse_ids;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(ids) = parse_ids(text) {
        let again: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        assert_eq!(parse_ids(&again.join(" ")).unwrap(), ids);
    }
});
