//! Deterministic mutation test of the HTTP API's request parsers (the same functions the
//! fuzz target `http_request` drives): thousands of byte-level and value-level mutations of
//! valid OpenAI and Anthropic bodies. Nothing may panic; every refusal is a 400 with a
//! message; a value replaced at a path that makes the request invalid is refused naming
//! that path (or the part of it that the API checks).

use colibri_daemon::http::error::ApiError;
use colibri_daemon::http::{anthropic, openai};
use serde_json::{json, Value};

/// xorshift64*: a fixed stream, the same on every machine.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

type Parser = fn(&[u8]) -> Result<(), ApiError>;

fn parsers() -> Vec<(&'static str, Parser, Value)> {
    vec![
        (
            "chat",
            |b| openai::parse_chat(b).map(|_| ()),
            json!({"model": "m", "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": null, "tool_calls": null},
                {"role": "user", "content": "again"}],
                "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 7,
                "stop": ["a", "b"], "stream": true, "stream_options": {"include_usage": true},
                "n": 1, "response_format": {"type": "text"}, "tool_choice": "none"}),
        ),
        (
            "completion",
            |b| openai::parse_completion(b).map(|_| ()),
            json!({"model": "m", "prompt": [1, 2, 3], "max_tokens": 4, "stop": "x",
                   "temperature": 0, "stream": false, "best_of": 1, "echo": false}),
        ),
        (
            "messages",
            |b| anthropic::parse_messages(b, false).map(|_| ()),
            json!({"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "s"}],
                   "messages": [{"role": "user", "content": "a"},
                                {"role": "assistant", "content": [{"type": "text", "text": "b"}]},
                                {"role": "user", "content": [{"type": "text", "text": "c"}]}],
                   "stop_sequences": ["z"], "top_k": 3, "temperature": 1.0,
                   "thinking": {"type": "disabled"}, "stream": true}),
        ),
    ]
}

/// Every (path, value) of a JSON document, paths spelled as serde_path_to_error does.
fn paths(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                let p = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                out.push(p.clone());
                paths(x, p, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let p = format!("{at}[{i}]");
                out.push(p.clone());
                paths(x, p, out);
            }
        }
        _ => {}
    }
}

fn set(v: &mut Value, path: &str, new: Value) {
    let mut cur = v;
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('[') {
            let (i, r) = r.split_once(']').unwrap();
            cur = &mut cur[i.parse::<usize>().unwrap()];
            rest = r.strip_prefix('.').unwrap_or(r);
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            cur = &mut cur[&rest[..end]];
            rest = rest[end..].strip_prefix('.').unwrap_or(&rest[end..]);
        }
    }
    *cur = new;
}

fn odd_value(r: &mut Rng) -> Value {
    let pool = [
        json!(null),
        json!(-1),
        json!(0),
        json!(1e300),
        json!(-0.5),
        json!(u64::MAX),
        json!(""),
        json!("\u{0}\u{fffd}"),
        json!([]),
        json!({}),
        json!([null]),
        json!(true),
        json!("user"),
        json!([{"type": "image"}]),
        json!({"type": "json_schema"}),
    ];
    pool[r.below(pool.len())].clone()
}

fn check_refusal(e: &ApiError, what: &str) {
    assert_eq!(e.status.as_u16(), 400, "{what}: {e:?}");
    assert!(!e.message.is_empty(), "{what}");
    // The body serializes in both shapes.
    let _ = e.body().to_string();
}

#[test]
fn mutated_requests_never_panic_and_refusals_name_the_field() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut accepted, mut refused) = (0, 0);
    for (name, parse, base) in parsers() {
        let bytes = base.to_string().into_bytes();
        parse(&bytes).unwrap_or_else(|e| panic!("{name}: the base body is refused: {e:?}"));
        // Byte level: flips, cuts, insertions, duplications.
        for i in 0..4000 {
            let mut b = bytes.clone();
            for _ in 0..1 + r.below(3) {
                match r.below(5) {
                    0 if !b.is_empty() => {
                        let at = r.below(b.len());
                        b[at] ^= 1 << r.below(8);
                    }
                    1 => b.truncate(r.below(b.len() + 1)),
                    2 => {
                        let at = r.below(b.len() + 1);
                        let tok: &[u8] = [
                            &b"null"[..],
                            b"-",
                            b"\"",
                            b"[",
                            b"{",
                            b"}",
                            b",",
                            b"\\u0000",
                            b"9e99",
                            b"\xff",
                        ][r.below(10)];
                        b.splice(at..at, tok.iter().copied());
                    }
                    3 if !b.is_empty() => {
                        let from = r.below(b.len());
                        let len = r.below(b.len() - from + 1).min(64);
                        let piece = b[from..from + len].to_vec();
                        let at = r.below(b.len() + 1);
                        b.splice(at..at, piece);
                    }
                    _ => {
                        let at = r.below(b.len() + 1);
                        b.truncate(at);
                    }
                }
            }
            match parse(&b) {
                Ok(()) => accepted += 1,
                Err(e) => {
                    refused += 1;
                    check_refusal(&e, &format!("{name} byte mutation {i}"));
                }
            }
        }
        // Value level: one node replaced by an odd value.
        let mut all = Vec::new();
        paths(&base, String::new(), &mut all);
        for i in 0..3000 {
            let p = &all[r.below(all.len())];
            let mut v = base.clone();
            set(&mut v, p, odd_value(&mut r));
            match parse(v.to_string().as_bytes()) {
                Ok(()) => accepted += 1,
                Err(e) => {
                    refused += 1;
                    check_refusal(&e, &format!("{name} value mutation {i} at {p}"));
                    let param = e.param.clone().unwrap_or_else(|| {
                        panic!("{name}: a bad value at {p} was refused without naming it: {e:?}")
                    });
                    // messages[1].content[0] replaced by an image block → ...content[0].type.
                    let related = param.starts_with(p.as_str()) || p.starts_with(param.as_str());
                    assert!(
                        related,
                        "{name}: the value at {p} was replaced, the error names {param}: {}",
                        e.message
                    );
                }
            }
        }
    }
    // The mutations exercised both outcomes.
    assert!(
        accepted > 500 && refused > 5000,
        "accepted {accepted}, refused {refused}"
    );
}
