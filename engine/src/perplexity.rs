//! Perplexity of a token sequence with llama.cpp's `llama-perplexity` method, so that the
//! figures compare with the ones users already know:
//!
//! - the ids are cut into non-overlapping windows of `ctx`; a trailing partial window is
//!   ignored;
//! - each window is a fresh sequence (empty KV cache);
//! - in each window only the second half is scored: the token at `j + 1` from the logits at
//!   `j`, for `j` in `[ctx/2, ctx-2]` (the first half only gives context);
//! - no BOS is added here; a caller that wants llama.cpp's BOS handling for text replaces
//!   each window's first id by BOS ([`replace_window_starts`]).
//!
//! Optionally a reference model scores the same windows and the report adds the mean
//! KL divergence KL(reference ‖ model) of the next-token distributions and how often both
//! rank the same token first (llama-perplexity's `--kl-divergence`).
//!
//! The same pieces ([`window_chunks`], [`Perplexity::score_rows`]) drive the daemon's
//! Perplexity RPC, one chunk per engine step.

use crate::error::{Error, Result};
use crate::model::{LogitsWanted, Model, SeqStep};

/// The smallest window: at least one scored token.
pub const MIN_CTX: usize = 4;

/// Running totals of a perplexity evaluation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Perplexity {
    /// Σ −ln p(target), in nats.
    pub nll_sum: f64,
    pub tokens_scored: u64,
    /// Windows finished so far.
    pub windows: usize,
    /// With a reference: Σ KL(reference ‖ model) over the scored positions, in nats.
    pub kl_sum: f64,
    /// With a reference: positions where both models' most likely token is the same.
    pub top1_agree: u64,
    /// Whether a reference scored the same positions.
    pub compared: bool,
}

impl Perplexity {
    pub fn ppl(&self) -> f64 {
        if self.tokens_scored == 0 {
            return f64::NAN;
        }
        (self.nll_sum / self.tokens_scored as f64).exp()
    }

    pub fn mean_kl(&self) -> Option<f64> {
        (self.compared && self.tokens_scored > 0).then(|| self.kl_sum / self.tokens_scored as f64)
    }

    pub fn top1_agreement(&self) -> Option<f64> {
        (self.compared && self.tokens_scored > 0)
            .then(|| self.top1_agree as f64 / self.tokens_scored as f64)
    }

    /// Scores the logits rows of one chunk of a window. Row `r` holds the logits at window
    /// position `start + r`; rows outside `[ctx/2, ctx-2]` are ignored. `reference`, when
    /// given, holds the reference model's rows for the same positions.
    pub fn score_rows(
        &mut self,
        window: &[u32],
        start: usize,
        vocab: usize,
        logits: &[f32],
        reference: Option<&[f32]>,
    ) {
        let ctx = window.len();
        let first = ctx / 2;
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let j = start + r;
            if j < first || j + 1 >= ctx {
                continue;
            }
            let target = window[j + 1] as usize;
            let lse = log_sum_exp(row);
            self.nll_sum += lse - row[target] as f64;
            self.tokens_scored += 1;
            if let Some(reference) = reference {
                let base = &reference[r * vocab..(r + 1) * vocab];
                self.kl_sum += kl(base, row, lse);
                if crate::sample::argmax(base) == crate::sample::argmax(row) {
                    self.top1_agree += 1;
                }
                self.compared = true;
            }
        }
    }
}

/// ln Σ exp(x), in f64.
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    max + s.ln()
}

/// KL(p ‖ q) of the softmaxes of two logit rows; `q_lse` is ln Σ exp(q).
fn kl(p: &[f32], q: &[f32], q_lse: f64) -> f64 {
    let p_lse = log_sum_exp(p);
    p.iter()
        .zip(q)
        .map(|(&a, &b)| {
            let lp = a as f64 - p_lse;
            let lq = b as f64 - q_lse;
            lp.exp() * (lp - lq)
        })
        .sum::<f64>()
        .max(0.0)
}

/// How many windows of `ctx` ids `n_ids` ids give; an error when that is none or `ctx`
/// is too small or larger than the model's context.
pub fn window_count(n_ids: usize, ctx: usize, max_context: usize) -> Result<usize> {
    if ctx < MIN_CTX {
        return Err(Error::invalid(
            "ctx",
            format!("must be at least {MIN_CTX} (half of each window is scored), got {ctx}"),
        ));
    }
    if ctx > max_context {
        return Err(Error::invalid(
            "ctx",
            format!("{ctx} is longer than the model's context of {max_context} positions"),
        ));
    }
    if n_ids < ctx {
        return Err(Error::invalid(
            "ids",
            format!("{n_ids} ids do not fill one window of {ctx}; give more text or a smaller ctx"),
        ));
    }
    Ok(n_ids / ctx)
}

/// Logits rows fetched per forward step: bounded so that a large vocabulary does not need
/// gigabytes of logits (64 MiB of f32 at most), and at most 512 positions.
pub fn rows_per_chunk(vocab: usize) -> usize {
    ((16usize << 20) / vocab.max(1)).clamp(1, 512)
}

/// The next chunk of a window of `ctx` ids whose first `fed` positions were fed:
/// `(start, end, logits)`, at most `max_plain` positions while in the first half (no logits
/// needed) and `max_scored` in the second. None once the window is done: its last position
/// is never fed (its logits would predict past the window).
pub fn next_chunk(
    ctx: usize,
    fed: usize,
    max_plain: usize,
    max_scored: usize,
) -> Option<(usize, usize, LogitsWanted)> {
    let first = ctx / 2;
    let (end, want, max) = if fed < first {
        (first, LogitsWanted::None, max_plain)
    } else if fed + 1 < ctx {
        (ctx - 1, LogitsWanted::All, max_scored)
    } else {
        return None;
    };
    Some((fed, end.min(fed + max.max(1)), want))
}

/// Every chunk of one window ([`next_chunk`] with the same bound in both halves).
pub fn window_chunks(ctx: usize, chunk: usize) -> Vec<(usize, usize, LogitsWanted)> {
    let mut out = Vec::new();
    let mut fed = 0;
    while let Some(c) = next_chunk(ctx, fed, chunk, chunk) {
        fed = c.1;
        out.push(c);
    }
    out
}

/// llama.cpp's BOS handling for text: the first id of every window becomes `bos`.
pub fn replace_window_starts(ids: &mut [u32], ctx: usize, bos: u32) {
    for w in ids.chunks_exact_mut(ctx) {
        w[0] = bos;
    }
}

/// The BOS a tokenizer added to a text: `with` is the text encoded with the tokenizer's
/// special tokens, `without` without them. Some(bos) when `with` starts with an extra id.
pub fn added_bos(with: &[u32], without: &[u32]) -> Option<u32> {
    (with.len() > without.len() && with.get(1..=without.len()) == Some(without)).then(|| with[0])
}

/// Parses an ids file: non-negative integers separated by commas and/or whitespace.
pub fn parse_ids(text: &str) -> Result<Vec<u32>> {
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| {
            s.parse::<u32>().map_err(|_| {
                Error::invalid(
                    "ids",
                    format!("entry {} ('{}') is not a token id", i + 1, truncate(s, 20)),
                )
            })
        })
        .collect()
}

fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// Evaluates `model` (and `reference`, when given, on the same windows) over `ids`.
/// `progress` is called after every window with the totals so far and the window count.
pub fn evaluate(
    model: &Model,
    reference: Option<&Model>,
    ids: &[u32],
    ctx: usize,
    progress: &mut dyn FnMut(&Perplexity, usize),
) -> Result<Perplexity> {
    let n = window_count(ids.len(), ctx, model.info.max_context)?;
    model.check_tokens(0, ids, "ids").or_else(|e| match e {
        // The whole sequence is longer than the context; each window is checked below.
        Error::ContextOverflow { .. } => Ok(()),
        e => Err(e),
    })?;
    let vocab = model.info.vocab_size;
    if let Some(r) = reference {
        if r.info.vocab_size != vocab {
            return Err(Error::invalid(
                "reference",
                format!(
                    "has a vocabulary of {} ids, the model {vocab}",
                    r.info.vocab_size
                ),
            ));
        }
        window_count(ids.len(), ctx, r.info.max_context)?;
    }
    let chunks = window_chunks(ctx, rows_per_chunk(vocab));
    let mut acc = Perplexity::default();
    for w in 0..n {
        let window = &ids[w * ctx..(w + 1) * ctx];
        let mut cache = model.new_cache();
        let mut ref_cache = reference.map(|r| r.new_cache());
        for &(s, e, want) in &chunks {
            let logits = forward_one(model, &mut cache, &window[s..e], want)?;
            let base = match (reference, ref_cache.as_mut()) {
                (Some(r), Some(c)) => Some(forward_one(r, c, &window[s..e], want)?),
                _ => None,
            };
            if want == LogitsWanted::All {
                acc.score_rows(window, s, vocab, &logits, base.as_deref());
            }
        }
        acc.windows += 1;
        progress(&acc, n);
    }
    Ok(acc)
}

fn forward_one(
    model: &Model,
    cache: &mut crate::kv::KvCache,
    tokens: &[u32],
    logits: LogitsWanted,
) -> Result<Vec<f32>> {
    let mut step = [SeqStep {
        cache,
        tokens,
        logits,
    }];
    Ok(model.forward(&mut step)?.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_window_but_its_last_position() {
        let c = window_chunks(10, 3);
        assert_eq!(
            c,
            vec![
                (0, 3, LogitsWanted::None),
                (3, 5, LogitsWanted::None),
                (5, 8, LogitsWanted::All),
                (8, 9, LogitsWanted::All),
            ]
        );
        // Odd windows: first = ctx / 2 as llama.cpp computes it.
        assert_eq!(
            window_chunks(5, 512),
            vec![(0, 2, LogitsWanted::None), (2, 4, LogitsWanted::All)]
        );
    }

    #[test]
    fn scores_the_second_half_from_the_previous_position() {
        // vocab 3; the logits at position j put all mass on the id j % 3.
        let window = [0u32, 1, 2, 0, 1, 2, 1, 1];
        let vocab = 3;
        let mut rows = Vec::new();
        for j in 0..7 {
            let mut r = vec![-1e9f32; vocab];
            r[(j + 1) % 3] = 0.0;
            rows.extend(r);
        }
        let mut p = Perplexity::default();
        // positions 4..=6 are scored: targets window[5..=7] = 2, 1, 1; predicted 2, 0, 1
        p.score_rows(&window, 0, vocab, &rows, None);
        assert_eq!(p.tokens_scored, 3);
        assert!((p.nll_sum - 1e9).abs() < 1.0, "{}", p.nll_sum);
        // The same rows fed in two chunks give the same totals.
        let mut q = Perplexity::default();
        q.score_rows(&window, 0, vocab, &rows[..5 * vocab], None);
        q.score_rows(&window, 5, vocab, &rows[5 * vocab..], None);
        assert_eq!(p, q);
    }

    #[test]
    fn uniform_logits_give_the_vocabulary_size() {
        let vocab = 7;
        let window: Vec<u32> = (0..16).map(|i| i % 7).collect();
        let rows = vec![0.5f32; 15 * vocab];
        let mut p = Perplexity::default();
        p.score_rows(&window, 0, vocab, &rows, Some(&rows));
        assert_eq!(p.tokens_scored, 7); // j in [8, 14]
        assert!((p.ppl() - 7.0).abs() < 1e-9);
        assert!(p.mean_kl().unwrap().abs() < 1e-12);
        assert_eq!(p.top1_agreement(), Some(1.0));
    }

    #[test]
    fn kl_matches_a_hand_computation() {
        let p = [0.0f32, 1.0];
        let q = [1.0f32, 0.0];
        let (pa, pb) = (1.0 / (1.0 + 1f64.exp()), 1f64.exp() / (1.0 + 1f64.exp()));
        let want = pa * (pa / pb).ln() + pb * (pb / pa).ln();
        assert!((kl(&p, &q, log_sum_exp(&q)) - want).abs() < 1e-12);
    }

    #[test]
    fn windows_are_checked() {
        assert_eq!(window_count(1000, 256, 4096).unwrap(), 3);
        assert!(window_count(100, 256, 4096).is_err());
        assert!(window_count(1000, 2, 4096).is_err());
        let e = window_count(10000, 8192, 4096).unwrap_err().to_string();
        assert!(e.contains("8192") && e.contains("4096"), "{e}");
    }

    /// The fuzz target's property (fuzz/fuzz_targets/ids_file.rs) on deterministic
    /// mutations of a valid file: never a panic, and what parses round-trips.
    #[test]
    fn mutated_ids_files_never_panic() {
        let base = b"12, 7 9\n4096,\t0 4294967295 1\n".to_vec();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut ok, mut err) = (0, 0);
        for _ in 0..20_000 {
            let mut b = base.clone();
            let alphabet = b"0123456789, -x\n\xff";
            for _ in 0..1 + next() % 4 {
                if b.is_empty() {
                    break;
                }
                let i = (next() % b.len() as u64) as usize;
                match next() % 3 {
                    0 => b[i] = next() as u8,
                    1 => b.insert(i, alphabet[(next() % alphabet.len() as u64) as usize]),
                    _ => {
                        b.remove(i);
                    }
                }
            }
            let Ok(text) = std::str::from_utf8(&b) else {
                continue;
            };
            match parse_ids(text) {
                Ok(ids) => {
                    let again: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
                    assert_eq!(parse_ids(&again.join(",")).unwrap(), ids);
                    ok += 1;
                }
                Err(_) => err += 1,
            }
        }
        assert!(ok > 100 && err > 100, "{ok} parsed, {err} refused");
    }

    #[test]
    fn ids_files_and_bos() {
        assert_eq!(parse_ids("1,2 3\n4,\t5 ,\n").unwrap(), vec![1, 2, 3, 4, 5]);
        let e = parse_ids("1,x2,3").unwrap_err().to_string();
        assert!(e.contains("entry 2") && e.contains("x2"), "{e}");
        assert!(parse_ids("-1").is_err());
        assert_eq!(added_bos(&[9, 1, 2], &[1, 2]), Some(9));
        assert_eq!(added_bos(&[1, 2], &[1, 2]), None);
        let mut ids = vec![5u32; 10];
        replace_window_starts(&mut ids, 4, 1);
        assert_eq!(ids, vec![1, 5, 5, 5, 1, 5, 5, 5, 5, 5]);
    }
}
