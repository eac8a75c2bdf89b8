//! Speculative decoding with the model's own multi-token-prediction (MTP) layers.
//!
//! Each step drafts `k` tokens with the MTP layer (cheap: one decoder layer per draft),
//! then runs the main model once over the pending token and the drafts: one batched forward
//! in which every routed expert is read once for all `k + 1` rows. The model's logits
//! decide which drafts stand:
//! - greedy: a draft is accepted when it is the argmax, so the output is exactly what plain
//!   greedy decoding gives;
//! - sampling: standard speculative sampling (Leviathan et al. 2023, Chen et al. 2023):
//!   accept draft `d` with probability `min(1, p(d)/q(d))`, else sample from
//!   `max(0, p − q)` renormalised; `p` and `q` are the model's and the draft's distributions
//!   after the same processors (temperature, top-k/p, min-p, repetition penalty). The output
//!   distribution is exactly the model's, though a given seed yields different tokens than
//!   without speculation (the random stream is consumed differently).
//!
//! Every step emits at least one token. [`DraftMode::Auto`] watches acceptance and the
//! measured speed of drafting steps against plain decode steps (probed now and then) and
//! stops drafting for the rest of the generation when it does not pay — as when experts come
//! from disk and `k + 1` rows need more of them than one row does.
//!
//! The MTP layer attends over its own cache of every earlier position, built from the main
//! model's final hidden states, so drafting needs the sequence from position 0: a
//! generation that continues an existing cache drafts only when given the MTP cache the
//! previous generation left ([`Speculator::into_mtp_cache`]; the daemon keeps it with the
//! session). [`Speculator`] is the step-wise form a batching scheduler uses.

use crate::error::{Error, Result};
use crate::generate::{GenerateRequest, Generation, StepEvent};
use crate::kv::KvCache;
use crate::model::{LogitsWanted, Model, SeqStep};
use crate::sample::{Sampler, SamplingParams};
use std::time::Instant;

/// How many tokens to draft per step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftMode {
    /// Draft [`AUTO_DRAFT_TOKENS`] per step when the model has MTP layers; stop when the
    /// acceptance or the measured speed says it does not pay.
    #[default]
    Auto,
    /// Never draft (`--no-draft`).
    Off,
    /// Always draft this many tokens per step (`--draft N`); 0 means off.
    Tokens(usize),
}

impl DraftMode {
    /// The mode the command-line flags `--draft N` and `--no-draft` ask for (neither: Auto).
    pub fn from_flags(draft: Option<usize>, no_draft: bool) -> Result<DraftMode> {
        match (draft, no_draft) {
            (Some(_), true) => Err(Error::invalid(
                "draft",
                "--draft and --no-draft contradict each other",
            )),
            (_, true) | (Some(0), false) => Ok(DraftMode::Off),
            (Some(n), false) => Ok(DraftMode::Tokens(n)),
            (None, false) => Ok(DraftMode::Auto),
        }
    }
}

impl DraftMode {
    /// Drafts per step this mode asks for (0: none).
    pub fn drafts(self) -> usize {
        match self {
            DraftMode::Off | DraftMode::Tokens(0) => 0,
            DraftMode::Auto => AUTO_DRAFT_TOKENS,
            DraftMode::Tokens(n) => n,
        }
    }
}

/// Drafts per step in [`DraftMode::Auto`]: DeepSeek-V3 and GLM ship one MTP layer, trained
/// to predict one token ahead; chaining it further loses acceptance quickly.
pub const AUTO_DRAFT_TOKENS: usize = 1;

/// Auto mode gives up below this acceptance rate (after [`MIN_SPEC_STEPS`] drafting steps).
const MIN_ACCEPTANCE: f64 = 0.1;
/// Drafting steps and plain probes measured before Auto mode judges the speed.
const MIN_SPEC_STEPS: usize = 4;
const MIN_PLAIN_PROBES: usize = 2;
/// Auto mode runs one plain decode step in this many while drafting, to keep measuring.
const PROBE_EVERY: usize = 32;

/// What speculation did, for `coli` and the daemon to report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    /// Decode steps that verified drafts.
    pub spec_steps: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// Tokens those steps emitted (accepted drafts plus one per step).
    pub spec_tokens: usize,
    /// Seconds of drafting steps (MTP and verification).
    pub spec_seconds: f64,
    /// Decode steps without drafts, and the seconds of their main-model forward.
    pub plain_steps: usize,
    pub plain_seconds: f64,
    /// Why drafting is off, if it is.
    pub disabled: Option<String>,
}

impl SpecStats {
    /// Accepted drafts over drafted ones (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Tokens per second of drafting steps and of plain steps, where measured.
    pub fn rates(&self) -> (Option<f64>, Option<f64>) {
        let rate = |n: usize, s: f64| (n > 0 && s > 0.0).then(|| n as f64 / s);
        (
            rate(self.spec_tokens, self.spec_seconds),
            rate(self.plain_steps, self.plain_seconds),
        )
    }
}

/// Proposes up to `k` draft tokens to follow `history` (the whole sequence so far); used in
/// place of the MTP layers (prompt-lookup drafting, tests). Drafts count as certain
/// (`q(d) = 1`) in the acceptance test.
pub type ExternalDrafter = Box<dyn FnMut(&[u32], usize) -> Vec<u32> + Send>;

// One drafter per generation: boxing the MTP state would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Drafter {
    Mtp(MtpState),
    External(ExternalDrafter),
}

struct MtpState {
    /// The MTP layer's cache; `cache.len` positions have been through it.
    cache: KvCache,
    /// Final hidden states of the main model for positions `cache.len..` (row-major), waiting
    /// for the MTP layer.
    backlog: Vec<f32>,
    /// Draws the drafts (its own stream, so drafting does not shift the main sampler's).
    sampler: Sampler,
}

/// What one sequence feeds to a step, as [`Speculator::plan`] decided; hand it back to
/// [`Speculator::finish`] with that step's outputs.
pub struct StepPlan {
    /// The tokens to feed (a prompt chunk, the pending token, or the pending token and the
    /// drafts after it).
    pub tokens: Vec<u32>,
    /// The rows whose logits the step must return.
    pub logits: LogitsWanted,
    /// The rows whose final hidden states the step must return (the MTP layer's input; see
    /// [`Model::forward_with_hidden`]).
    pub hidden: LogitsWanted,
    kind: StepKind,
}

enum StepKind {
    Prefill,
    Plain,
    /// Drafts (after the pending token) and their draft distributions.
    Spec {
        drafts: Vec<u32>,
        q: Vec<Option<Vec<f64>>>,
        base: usize,
    },
}

impl StepPlan {
    /// Whether this step verifies drafts (it feeds `drafts + 1` tokens and wants every row's
    /// logits).
    pub fn drafting(&self) -> bool {
        matches!(self.kind, StepKind::Spec { .. })
    }
}

/// The drafting half of speculative decoding, apart from the [`Generation`] it drafts for,
/// so that a scheduler that steps many sequences in one batched forward can draft for some of
/// them: [`plan`](Self::plan) before the step (drafts with the MTP layer),
/// [`finish`](Self::finish) after it (accepts drafts, emits one or more tokens).
/// [`SpeculativeGeneration`] is the same for one sequence run on its own.
pub struct Speculator {
    mode: DraftMode,
    /// Drafts per step; 0 = not drafting.
    k: usize,
    drafter: Option<Drafter>,
    stats: SpecStats,
    decode_steps: usize,
    /// Cache length when the generation started: the generation's history begins at this
    /// position.
    base: usize,
}

impl Speculator {
    /// A speculator for `gen` (just created, nothing fed yet) drafting with the model's MTP
    /// layers per `mode`. A generation that continues a cache can draft only with `mtp`, the
    /// MTP layer's cache of that sequence ([`into_mtp_cache`](Self::into_mtp_cache) of the
    /// previous generation) covering exactly the same positions. Asking for drafts
    /// (`Tokens(n)`) when the model has no MTP layers or `mtp` does not fit is an error;
    /// `Auto` quietly decodes without.
    pub fn new(
        model: &Model,
        gen: &Generation,
        sampling: &SamplingParams,
        mode: DraftMode,
        mtp: Option<KvCache>,
    ) -> Result<Speculator> {
        let base = gen.cache.len();
        let want = mode.drafts();
        let mut stats = SpecStats::default();
        let mut drafter = None;
        if want > 0 {
            let cache = if model.net.mtp.is_empty() {
                Err("the model has no MTP layers")
            } else if sampling.adjusts_logits() {
                // Verification compares the draft with the model's plain distribution.
                Err("frequency/presence penalties and logit_bias are not drafted")
            } else if gen.is_constrained() {
                // A grammar masks each token after the one before it was sampled.
                Err("structured output and forced tool calls are not drafted")
            } else if base == 0 {
                Ok(model.net.new_mtp_cache(0))
            } else {
                match mtp {
                    Some(c) if c.len() == base && c.same_layout(&model.net.new_mtp_cache(0)) => {
                        Ok(c)
                    }
                    _ => Err("the sequence continues a cache the MTP layer has not seen"),
                }
            };
            match cache {
                Err(why) if mode == DraftMode::Auto => stats.disabled = Some(why.into()),
                Err(why) => return Err(Error::invalid("draft", why)),
                Ok(cache) => {
                    // The draft sampler draws with the request's settings from its own stream.
                    let mut params = sampling.clone();
                    params.seed = params.seed.wrapping_add(0x5EC0_1A7E_D4AF_7000);
                    drafter = Some(Drafter::Mtp(MtpState {
                        cache,
                        backlog: Vec::new(),
                        sampler: Sampler::new(params),
                    }));
                }
            }
        } else {
            stats.disabled = Some("drafting is off".into());
        }
        let k = if drafter.is_some() { want } else { 0 };
        Ok(Speculator {
            mode,
            k,
            drafter,
            stats,
            decode_steps: 0,
            base,
        })
    }

    /// Drafts with `drafter` instead of MTP layers (`Auto` drafts [`AUTO_DRAFT_TOKENS`]).
    pub fn with_drafter(gen: &Generation, mode: DraftMode, drafter: ExternalDrafter) -> Speculator {
        let k = mode.drafts();
        Speculator {
            mode,
            k,
            drafter: (k > 0).then_some(Drafter::External(drafter)),
            stats: SpecStats {
                disabled: (k == 0).then(|| "drafting is off".into()),
                ..Default::default()
            },
            decode_steps: 0,
            base: gen.cache.len(),
        }
    }

    pub fn stats(&self) -> &SpecStats {
        &self.stats
    }

    /// Whether drafts are still being made (Auto mode may have stopped).
    pub fn drafting(&self) -> bool {
        self.k > 0
    }

    /// The MTP layer's cache while drafting with it (diagnostics, tests).
    pub fn mtp_cache(&self) -> Option<&KvCache> {
        match &self.drafter {
            Some(Drafter::Mtp(m)) => Some(&m.cache),
            _ => None,
        }
    }

    fn mtp_active(&self) -> bool {
        self.k > 0 && matches!(self.drafter, Some(Drafter::Mtp(_)))
    }

    /// Whether Auto mode takes a plain step now, to measure what drafting is compared to.
    fn probe_now(&self) -> bool {
        self.mode == DraftMode::Auto
            && (self.stats.plain_steps < MIN_PLAIN_PROBES
                || self.decode_steps % PROBE_EVERY == PROBE_EVERY - 1)
    }

    /// What `gen` feeds next: at most `prefill_chunk` prompt tokens, or the pending token
    /// (with drafts after it when drafting). Drafting runs the MTP layer here.
    pub fn plan(
        &mut self,
        model: &Model,
        gen: &mut Generation,
        prefill_chunk: usize,
    ) -> Result<StepPlan> {
        let hidden = if self.mtp_active() {
            LogitsWanted::All
        } else {
            LogitsWanted::None
        };
        if gen.prompt_pending() > 0 {
            let (tokens, logits) = gen.next_input(prefill_chunk);
            return Ok(StepPlan {
                tokens: tokens.to_vec(),
                logits,
                hidden,
                kind: StepKind::Prefill,
            });
        }
        if self.k == 0 || self.probe_now() {
            let (tokens, logits) = gen.next_input(1);
            return Ok(StepPlan {
                tokens: tokens.to_vec(),
                logits,
                hidden,
                kind: StepKind::Plain,
            });
        }
        let base = gen.cache.len();
        let room = model.info.max_context.saturating_sub(base + 1);
        let k = self.k.min(gen.remaining().saturating_sub(1)).min(room);
        let (drafts, q) = if k == 0 {
            (Vec::new(), Vec::new())
        } else {
            self.draft(model, gen, k)?
        };
        let pending = gen
            .pending_token()
            .expect("decode steps follow a sampled token");
        let mut tokens = Vec::with_capacity(drafts.len() + 1);
        tokens.push(pending);
        tokens.extend_from_slice(&drafts);
        Ok(StepPlan {
            tokens,
            logits: LogitsWanted::All,
            hidden,
            kind: StepKind::Spec { drafts, q, base },
        })
    }

    /// Takes the step's outputs for `plan` (`logits` of the rows it wanted, `hidden` of the
    /// rows it wanted, the step's wall time) and emits the tokens they decide, calling
    /// `on_event` for each.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        &mut self,
        model: &Model,
        gen: &mut Generation,
        plan: StepPlan,
        logits: &[f32],
        mut hidden: Vec<f32>,
        seconds: f64,
        on_event: &mut dyn FnMut(&StepEvent),
    ) -> Result<()> {
        if let Some(Drafter::Mtp(m)) = &mut self.drafter {
            if self.k > 0 {
                m.backlog.append(&mut hidden);
            }
        }
        match plan.kind {
            StepKind::Prefill => {
                let l = (plan.logits != LogitsWanted::None).then_some(logits);
                let ev = gen.accept(model, plan.tokens.len(), l)?;
                if ev.token.is_some() {
                    on_event(&ev);
                }
            }
            StepKind::Plain => {
                self.stats.plain_seconds += seconds;
                self.stats.plain_steps += 1;
                self.decode_steps += 1;
                let ev = gen.accept(model, plan.tokens.len(), Some(logits))?;
                on_event(&ev);
                self.judge();
            }
            StepKind::Spec { drafts, q, base } => {
                let emitted =
                    accept_drafts(model, gen, &drafts, &q, logits, &mut self.stats, on_event)?;
                // Keep the cache at "every emitted token but the last": the pending token and
                // the accepted drafts; rejected drafts and their hidden states go.
                gen.cache.truncate(base + emitted);
                if let Some(Drafter::Mtp(m)) = &mut self.drafter {
                    let width = model.info.hidden_size;
                    let keep = (gen.cache.len() - m.cache.len()) * width;
                    m.backlog.truncate(keep);
                }
                self.stats.spec_steps += 1;
                self.stats.drafted += drafts.len();
                self.stats.spec_tokens += emitted;
                self.stats.spec_seconds += seconds;
                self.decode_steps += 1;
                self.judge();
            }
        }
        Ok(())
    }

    /// The MTP layer's cache of the sequence when drafting is still on, brought up to the
    /// main cache as far as the tokens known allow (each MTP position needs the token after
    /// it; the last one is the pending sampled token): what a later generation continuing
    /// the same cache passes to [`new`](Self::new). `None` when not drafting with MTP.
    pub fn into_mtp_cache(self, model: &Model, gen: &Generation) -> Option<KvCache> {
        let Some(Drafter::Mtp(mut m)) = self.drafter else {
            return None;
        };
        if self.k == 0 {
            return None;
        }
        let width = model.info.hidden_size;
        let history = gen.history();
        // Row j of the backlog is position start + j; it needs the token at start + j + 1,
        // which is history[start + j + 1 - base] (the MTP cache starts at `base`, never
        // before).
        let from = m.cache.len() + 1 - self.base;
        let n = (m.backlog.len() / width).min(history.len().saturating_sub(from));
        if n > 0 {
            let tokens = &history[from..from + n];
            model.net.mtp_forward(
                0,
                &mut m.cache,
                tokens,
                &m.backlog[..n * width],
                LogitsWanted::None,
            );
        }
        Some(m.cache)
    }

    /// Up to `k` drafts to follow the pending token, with the draft distribution of each
    /// (dense over the vocabulary; `None` for an external drafter's certain tokens).
    #[allow(clippy::type_complexity)]
    fn draft(
        &mut self,
        model: &Model,
        gen: &mut Generation,
        k: usize,
    ) -> Result<(Vec<u32>, Vec<Option<Vec<f64>>>)> {
        let history: Vec<u32> = gen.history().to_vec();
        let base = self.base;
        match self.drafter.as_mut() {
            None => Ok((Vec::new(), Vec::new())),
            Some(Drafter::External(f)) => {
                let mut d = f(&history, k);
                d.truncate(k);
                if let Some(bad) = d.iter().find(|&&t| t as usize >= model.info.vocab_size) {
                    return Err(Error::invalid(
                        "draft",
                        format!("drafted token {bad} is outside the vocabulary"),
                    ));
                }
                let q = vec![None; d.len()];
                Ok((d, q))
            }
            Some(Drafter::Mtp(m)) => {
                let net = &model.net;
                let width = model.info.hidden_size;
                let vocab = model.info.vocab_size;
                // Catch up: positions the main model has run but the MTP layer has not; the
                // token after each is known (the last one is the pending sampled token).
                let start = m.cache.len();
                let n = m.backlog.len() / width;
                let from = start + 1 - base;
                let tokens = &history[from..from + n];
                let (mut logits, hidden) =
                    net.mtp_forward(0, &mut m.cache, tokens, &m.backlog, LogitsWanted::Last);
                m.backlog.clear();
                let real = m.cache.len();
                let mut prev = hidden[(n - 1) * width..].to_vec();
                let mut drafts = Vec::with_capacity(k);
                let mut qs = Vec::with_capacity(k);
                let mut hist = history;
                for j in 0..k {
                    let dist = m.sampler.distribution(&logits, &hist);
                    let d = m.sampler.draw(&dist).unwrap_or(0);
                    let mut dense = vec![0f64; vocab];
                    for (x, px) in dist {
                        dense[x as usize] = px;
                    }
                    drafts.push(d);
                    qs.push(Some(dense));
                    hist.push(d);
                    if j + 1 < k {
                        // Chain: the MTP layer's own output stands in for the main model's.
                        let (l, h) =
                            net.mtp_forward(0, &mut m.cache, &[d], &prev, LogitsWanted::Last);
                        logits = l;
                        prev = h;
                    }
                }
                // Positions past the pending token were guesses; the verified ones come back
                // through the backlog.
                m.cache.truncate(real);
                Ok((drafts, qs))
            }
        }
    }

    /// Auto mode: stop drafting when it does not pay.
    fn judge(&mut self) {
        if self.mode != DraftMode::Auto || self.k == 0 || self.stats.spec_steps < MIN_SPEC_STEPS {
            return;
        }
        let acceptance = self.stats.acceptance();
        let reason = if acceptance < MIN_ACCEPTANCE {
            Some(format!(
                "acceptance {:.0}% is below {:.0}%",
                acceptance * 100.0,
                MIN_ACCEPTANCE * 100.0
            ))
        } else if self.stats.plain_steps >= MIN_PLAIN_PROBES {
            match self.stats.rates() {
                (Some(spec), Some(plain)) if spec < plain => Some(format!(
                    "drafting gives {spec:.2} tok/s, plain decoding {plain:.2} tok/s"
                )),
                _ => None,
            }
        } else {
            None
        };
        if let Some(r) = reason {
            self.stats.disabled = Some(r);
            self.k = 0;
            self.drafter = None;
        }
    }
}

/// The acceptance test of one verifying step: row `j` of `logits` is the model's
/// distribution after the pending token and `drafts[..j]`. Emits the accepted drafts and one
/// more token (the correction at the first rejection, or a bonus token when all stand);
/// returns how many tokens were emitted.
fn accept_drafts(
    model: &Model,
    gen: &mut Generation,
    drafts: &[u32],
    q: &[Option<Vec<f64>>],
    logits: &[f32],
    stats: &mut SpecStats,
    on_event: &mut dyn FnMut(&StepEvent),
) -> Result<usize> {
    let vocab = model.info.vocab_size;
    let mut emitted = 0;
    let mut push = |gen: &mut Generation, t: u32, emitted: &mut usize| -> Result<()> {
        let ev = gen.push_token(model, t)?;
        *emitted += 1;
        on_event(&ev);
        Ok(())
    };
    for j in 0..=drafts.len() {
        let row = &logits[j * vocab..(j + 1) * vocab];
        let (sampler, history) = gen.sampling_state();
        let p = sampler.distribution(row, history);
        if j < drafts.len() {
            let d = drafts[j];
            let p_d = p.iter().find(|x| x.0 == d).map_or(0.0, |x| x.1);
            let q_d = q[j].as_ref().map_or(1.0, |q| q[d as usize]);
            if p_d >= q_d || sampler.uniform() * q_d < p_d {
                stats.accepted += 1;
                push(gen, d, &mut emitted)?;
            } else {
                // Rejected: sample from max(0, p - q), renormalised.
                let residual: Vec<(u32, f64)> = p
                    .iter()
                    .map(|&(x, px)| {
                        let qx = match &q[j] {
                            Some(q) => q[x as usize],
                            None => f64::from(u8::from(x == d)),
                        };
                        (x, (px - qx).max(0.0))
                    })
                    .collect();
                let t = sampler
                    .draw(&residual)
                    .or_else(|| sampler.draw(&p))
                    .unwrap_or(d);
                push(gen, t, &mut emitted)?;
                break;
            }
        } else {
            // Every draft stood: one more token from the last row.
            let t = sampler.draw(&p).unwrap_or(0);
            push(gen, t, &mut emitted)?;
        }
        if gen.finished().is_some() {
            break;
        }
    }
    Ok(emitted)
}

/// A [`Generation`] that drafts with the model's MTP layers and verifies in batches, run on
/// its own (one sequence per forward).
pub struct SpeculativeGeneration {
    gen: Generation,
    spec: Speculator,
}

impl SpeculativeGeneration {
    /// Like [`Generation::new`], drafting with the model's MTP layers per `mode`. Asking for
    /// drafts (`Tokens(n)`) from a model without MTP layers, or for a continued cache, is an
    /// error; `Auto` quietly decodes without.
    pub fn new(
        model: &Model,
        cache: KvCache,
        req: GenerateRequest,
        mode: DraftMode,
    ) -> Result<Self> {
        Self::continuing(model, cache, None, req, mode)
    }

    /// [`new`](Self::new) for a sequence that continues `cache`, with the MTP layer's cache
    /// of the same positions (see [`Speculator::new`]).
    pub fn continuing(
        model: &Model,
        cache: KvCache,
        mtp: Option<KvCache>,
        req: GenerateRequest,
        mode: DraftMode,
    ) -> Result<Self> {
        let sampling = req.sampling.clone();
        let gen = Generation::new(model, cache, req)?;
        let spec = Speculator::new(model, &gen, &sampling, mode, mtp)?;
        Ok(SpeculativeGeneration { gen, spec })
    }

    /// Drafts with `drafter` instead of MTP layers (`mode` as in [`new`](Self::new); `Auto`
    /// drafts [`AUTO_DRAFT_TOKENS`]).
    pub fn with_drafter(
        model: &Model,
        cache: KvCache,
        req: GenerateRequest,
        mode: DraftMode,
        drafter: ExternalDrafter,
    ) -> Result<Self> {
        let gen = Generation::new(model, cache, req)?;
        let spec = Speculator::with_drafter(&gen, mode, drafter);
        Ok(SpeculativeGeneration { gen, spec })
    }

    pub fn stats(&self) -> &SpecStats {
        self.spec.stats()
    }

    pub fn generation(&self) -> &Generation {
        &self.gen
    }

    pub fn into_generation(self) -> Generation {
        self.gen
    }

    /// The generation and the MTP layer's cache to continue the sequence with (see
    /// [`Speculator::into_mtp_cache`]).
    pub fn into_parts(self, model: &Model) -> (Generation, Option<KvCache>) {
        let mtp = self.spec.into_mtp_cache(model, &self.gen);
        (self.gen, mtp)
    }

    /// The MTP layer's cache while drafting with it (diagnostics, tests).
    pub fn mtp_cache(&self) -> Option<&KvCache> {
        self.spec.mtp_cache()
    }

    /// Runs the generation to the end, calling `on_event` after every token.
    pub fn run(
        &mut self,
        model: &Model,
        prefill_chunk: usize,
        mut on_event: impl FnMut(&StepEvent),
    ) -> Result<()> {
        while self.gen.finished().is_none() {
            let plan = self.spec.plan(model, &mut self.gen, prefill_chunk)?;
            let t0 = Instant::now();
            let mut step = [SeqStep {
                cache: &mut self.gen.cache,
                tokens: &plan.tokens,
                logits: plan.logits,
            }];
            let (mut out, mut h) = model.forward_with_hidden(&mut step, &[plan.hidden])?;
            let seconds = t0.elapsed().as_secs_f64();
            let logits = out.swap_remove(0);
            let hidden = h.swap_remove(0);
            self.spec.finish(
                model,
                &mut self.gen,
                plan,
                &logits,
                hidden,
                seconds,
                &mut on_event,
            )?;
        }
        Ok(())
    }
}
