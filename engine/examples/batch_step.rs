//! Cost of one batched decode step against one row: `cargo run --release -p colibri-engine
//! --example batch_step -- MODEL_DIR [ROWS,ROWS,..] [STEPS]`. Each row is its own sequence
//! (a 16-token prompt of its own), so a step's rows route independently, as sessions of a
//! daemon do; prints ms per step, tok/s and the ratio to one row, with time per phase.

use colibri_engine::arch::profile::{self, PHASES};
use colibri_engine::model::{LogitsWanted, Model, SeqStep};
use std::time::Instant;

fn main() -> colibri_engine::error::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).expect("MODEL_DIR");
    let rows: Vec<usize> = args
        .get(2)
        .map_or("1,2,4,8", |s| s.as_str())
        .split(',')
        .map(|s| s.parse().expect("rows"))
        .collect();
    let steps: usize = args.get(3).map_or(16, |s| s.parse().expect("steps"));
    let model = Model::load(std::path::Path::new(dir))?;
    let vocab = model.info.vocab_size as u64;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % vocab) as u32
    };
    let mut one = None;
    for &n in &rows {
        let mut caches: Vec<_> = (0..n).map(|_| model.new_cache()).collect();
        for c in caches.iter_mut() {
            let p: Vec<u32> = (0..16).map(|_| next()).collect();
            model.step(c, &p)?;
        }
        let mut time = 0f64;
        profile::take();
        for s in 0..steps + 2 {
            let toks: Vec<[u32; 1]> = (0..n).map(|_| [next()]).collect();
            let mut batch: Vec<SeqStep> = caches
                .iter_mut()
                .zip(&toks)
                .map(|(cache, t)| SeqStep {
                    cache,
                    tokens: t,
                    logits: LogitsWanted::Last,
                })
                .collect();
            // Two steps to warm up, untimed.
            profile::enable(s >= 2);
            let t0 = Instant::now();
            model.forward(&mut batch)?;
            if s >= 2 {
                time += t0.elapsed().as_secs_f64();
            }
        }
        profile::enable(false);
        let ns = profile::take();
        let ms = time * 1e3 / steps as f64;
        let rate = n as f64 * steps as f64 / time;
        let base = *one.get_or_insert(rate);
        let phases: Vec<String> = PHASES
            .iter()
            .zip(ns)
            .map(|(p, v)| format!("{} {:.1}", p.name(), v as f64 / 1e6 / steps as f64))
            .collect();
        println!(
            "{n} rows: {ms:.1} ms/step, {rate:.1} tok/s, {:.2}x one row | ms/step: {}",
            rate / base,
            phases.join(" · ")
        );
    }
    Ok(())
}
