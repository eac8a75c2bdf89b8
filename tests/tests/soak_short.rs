//! The soak test's short version, run with the other tests (CI): 30 s of mixed traffic at
//! 16-way concurrency against the real `colibrid`, a SIGKILL and restart in the middle.
//! It asserts only what does not depend on the machine's speed: no request gets an error it
//! should not, every witness session comes back and continues identically, RSS after the
//! traffic is within 64 MiB of the steady state. (The full run: `cargo run --release
//! --example soak -- --minutes 5`.)

#[allow(dead_code)]
#[path = "../examples/soak.rs"]
mod soak;

use std::time::Duration;

#[test]
fn thirty_seconds_of_mixed_traffic_with_a_sigkill_in_the_middle() {
    let opts = soak::Opts::new(Duration::from_secs(30));
    let report = soak::run(&opts);
    report.print();
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    assert!(report.killed_at.is_some());
    assert_eq!(report.witnesses.len(), 4);
}
