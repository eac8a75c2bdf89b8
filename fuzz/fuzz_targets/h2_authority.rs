#![no_main]
//! Any byte string as a client's side of an HTTP/2 connection to colibrid: the `:authority`
//! rewriter never panics, and what it does not rewrite passes through byte for byte.

use colibri_daemon::authority::Rewriter;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The preface, so that the frames behind it are followed; the first byte picks where
    // the input is split between two reads.
    let Some((&cut, rest)) = data.split_first() else { return };
    let mut input = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    input.extend_from_slice(rest);
    let cut = (cut as usize * input.len() / 256).min(input.len());
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    r.push(&input[..cut], &mut out);
    r.push(&input[cut..], &mut out);
    r.finish(&mut out);
    if r.rewritten == 0 {
        assert_eq!(out, input);
    }
});
