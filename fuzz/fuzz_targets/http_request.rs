#![no_main]
//! Any byte string as the body of an HTTP API request: the OpenAI chat and completions
//! parsers and the Anthropic Messages parser (as a generation and as count_tokens). Each
//! returns a request or a 400 whose body serializes in the API's shape; none panics.
//! The same parsers get a deterministic mutation test in CI
//! (daemon/tests/http_request_mutations.rs).

use colibri_daemon::http::error::ApiError;
use colibri_daemon::http::{anthropic, openai};
use libfuzzer_sys::fuzz_target;

fn refused(e: ApiError) {
    assert_eq!(e.status.as_u16(), 400);
    assert!(!e.message.is_empty());
    let _ = e.body().to_string();
}

fuzz_target!(|data: &[u8]| {
    if let Err(e) = openai::parse_chat(data) {
        refused(e);
    }
    if let Err(e) = openai::parse_completion(data) {
        refused(e);
    }
    for count_only in [false, true] {
        if let Err(e) = anthropic::parse_messages(data, count_only) {
            refused(e);
        }
    }
});
