//! [`Network`]: a decoder-only transformer as every supported family instantiates it, its
//! KV caches, and the one batched forward pass (optionally returning final hidden states),
//! with the MTP forward beside it.

use super::blocks::{Loader, RmsNorm};
use super::config::CommonDims;
use super::layer::Layer;
use super::mtp::MtpLayer;
use super::profile;
use super::step::{BatchRows, LogitsWanted, SeqStep};
use crate::error::Result;
use crate::kv::{KvCache, KvDtype};
use crate::tensor::Matrix;

/// A decoder-only transformer as every supported family instantiates it.
pub struct Network {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub max_context: usize,
    /// `[vocab, hidden]`.
    pub embed: Matrix,
    pub layers: Vec<Layer>,
    pub final_norm: RmsNorm,
    /// `[vocab, hidden]` (the embedding again when tied).
    pub lm_head: Matrix,
    /// Multi-token-prediction layers (`num_nextn_predict_layers`), drafting for speculative
    /// decoding; empty when the checkpoint carries none.
    pub mtp: Vec<MtpLayer>,
}

/// Builds the rows of a batched step: sequence and position of each.
fn batch_rows(batch: &[SeqStep<'_>]) -> BatchRows {
    let mut rows = BatchRows {
        seq: Vec::new(),
        pos: Vec::new(),
        starts: vec![0],
    };
    for (s, step) in batch.iter().enumerate() {
        for j in 0..step.tokens.len() {
            rows.seq.push(s);
            rows.pos.push(step.cache.len + j);
        }
        rows.starts.push(rows.seq.len());
    }
    rows
}

/// The rows of `range` that `want` selects.
fn wanted_rows(want: LogitsWanted, range: std::ops::Range<usize>) -> std::ops::Range<usize> {
    match want {
        LogitsWanted::None => range.start..range.start,
        LogitsWanted::Last if range.is_empty() => range,
        LogitsWanted::Last => range.end - 1..range.end,
        LogitsWanted::All => range,
    }
}

/// A cache with one layer per entry of `layers`, sized for `capacity` positions.
/// `dtype` forces every layer's dtype; `None`: each layer's attention default.
fn cache_for<'a>(
    layers: impl Iterator<Item = &'a Layer>,
    capacity: usize,
    dtype: Option<KvDtype>,
) -> KvCache {
    let layers: Vec<&Layer> = layers.collect();
    let widths: Vec<(usize, usize, usize)> = layers.iter().map(|l| l.attn.cache_widths()).collect();
    let kv: Vec<(usize, usize)> = widths.iter().map(|&(k, v, _)| (k, v)).collect();
    let mut cache = KvCache::new(&kv, capacity);
    for ((l, &(_, _, extra)), layer) in cache.layers.iter_mut().zip(&widths).zip(&layers) {
        l.extra_width = extra;
        let d = dtype.unwrap_or_else(|| layer.attn.default_kv_dtype());
        l.k = crate::kv::KvBuf::new(d);
        l.v = crate::kv::KvBuf::new(d);
    }
    cache
}

impl Network {
    /// A decoder-only network of `layers` (and `mtp` layers) under the Hub's usual names for
    /// the embedding, final norm and head ([`CommonDims::embeddings`]): how every family
    /// finishes its build.
    pub fn decoder(
        model_type: &str,
        d: &CommonDims,
        ld: &Loader,
        layers: Vec<Layer>,
        mtp: Vec<MtpLayer>,
    ) -> Result<Network> {
        let (embed, final_norm, lm_head) = d.embeddings(ld)?;
        Ok(Network {
            model_type: model_type.into(),
            vocab_size: d.vocab,
            hidden_size: d.hidden,
            max_context: d.max_context,
            embed,
            layers,
            final_norm,
            lm_head,
            mtp,
        })
    }
    /// A cache in each layer's default dtype (f16 keys and values for GQA, f32 latents for
    /// MLA) unless `COLIBRI_KV` forces one (see [`crate::kv`]).
    pub fn new_cache(&self) -> KvCache {
        cache_for(self.layers.iter(), self.max_context, KvDtype::from_env())
    }

    /// A cache with every layer in `dtype`.
    pub fn new_cache_with(&self, dtype: KvDtype) -> KvCache {
        cache_for(self.layers.iter(), self.max_context, Some(dtype))
    }

    /// Bytes per position a new cache holds, and what a plain per-head K/V cache of the same
    /// layers would hold in the same dtype: MLA keeps a latent instead of expanded keys and
    /// values.
    pub fn kv_bytes_per_token(&self) -> (usize, usize) {
        let forced = KvDtype::from_env();
        let (mut held, mut full) = (0, 0);
        for l in &self.layers {
            let e = forced.unwrap_or_else(|| l.attn.default_kv_dtype()).size();
            let (k, v, x) = l.attn.cache_widths();
            held += (k + v) * e + x * 4;
            full += l.attn.full_kv_width() * e;
        }
        (held, full)
    }

    pub fn weight_bytes(&self) -> usize {
        let mut b = self.embed.size_bytes() + self.final_norm.width() * 4;
        if !std::ptr::eq(&self.embed, &self.lm_head) {
            b += self.lm_head.size_bytes();
        }
        b + self.layers.iter().map(|l| l.size_bytes()).sum::<usize>()
    }

    /// Bytes of the MTP layers (not in [`weight_bytes`](Self::weight_bytes): decoding
    /// without drafts never reads them).
    pub fn mtp_weight_bytes(&self) -> usize {
        self.mtp.iter().map(|m| m.size_bytes()).sum()
    }

    /// The batched forward pass. Caller has validated ids and context room.
    pub fn forward(&self, batch: &mut [SeqStep<'_>]) -> Vec<Vec<f32>> {
        self.forward_with_hidden(batch, &[]).0
    }

    /// The batched forward pass, also returning the final-normed hidden states of the rows
    /// `hidden[s]` selects for sequence `s` (missing entries mean none): what the MTP layers
    /// take as their input. Returns (logits per sequence, hidden rows per sequence).
    pub fn forward_with_hidden(
        &self,
        batch: &mut [SeqStep<'_>],
        hidden: &[LogitsWanted],
    ) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let width = self.hidden_size;
        let rows = batch_rows(batch);
        let n = rows.len();
        let mut x = vec![0f32; n * width];
        let mut i = 0;
        for step in batch.iter() {
            for &t in step.tokens {
                self.embed
                    .row_to_f32(t as usize, &mut x[i * width..(i + 1) * width]);
                i += 1;
            }
        }
        let mut caches: Vec<&mut KvCache> = batch.iter_mut().map(|s| &mut *s.cache).collect();
        let mut sel = None;
        for (li, layer) in self.layers.iter().enumerate() {
            layer.forward(&mut x, &rows, &mut caches, li, &mut sel);
        }
        for step in batch.iter_mut() {
            step.cache.len += step.tokens.len();
        }

        // Final norm on the rows whose logits or hidden states are wanted, lm_head only on
        // the former.
        let mut normed: Vec<usize> = Vec::new();
        let mut logit_rows: Vec<usize> = Vec::new();
        for (s, step) in batch.iter().enumerate() {
            let r = rows.seq_range(s);
            let lr = wanted_rows(step.logits, r.clone());
            let hr = wanted_rows(
                hidden.get(s).copied().unwrap_or(LogitsWanted::None),
                r.clone(),
            );
            logit_rows.extend(lr.clone());
            normed.extend(r.filter(|i| lr.contains(i) || hr.contains(i)));
        }
        let _head = profile::span(profile::Phase::LmHead);
        let mut hs = Vec::with_capacity(normed.len() * width);
        for &r in &normed {
            hs.extend_from_slice(&x[r * width..(r + 1) * width]);
        }
        self.final_norm.apply_chunks(&mut hs);
        let normed_row = |r: usize| {
            let k = normed.binary_search(&r).expect("wanted rows are normed");
            &hs[k * width..(k + 1) * width]
        };
        let mut head_in = Vec::with_capacity(logit_rows.len() * width);
        for &r in &logit_rows {
            head_in.extend_from_slice(normed_row(r));
        }
        let v = self.vocab_size;
        let mut logits = vec![0f32; logit_rows.len() * v];
        self.lm_head.matmul(&head_in, logit_rows.len(), &mut logits);
        let mut out = Vec::with_capacity(batch.len());
        let mut out_hidden = Vec::with_capacity(batch.len());
        let mut k = 0;
        for (s, step) in batch.iter().enumerate() {
            let r = rows.seq_range(s);
            let m = wanted_rows(step.logits, r.clone()).len();
            out.push(logits[k * v..(k + m) * v].to_vec());
            k += m;
            let hr = wanted_rows(hidden.get(s).copied().unwrap_or(LogitsWanted::None), r);
            let mut h = Vec::with_capacity(hr.len() * width);
            for row in hr {
                h.extend_from_slice(normed_row(row));
            }
            out_hidden.push(h);
        }
        (out, out_hidden)
    }

    /// A cache for MTP layer `k` (one layer; the same capacity as the main cache).
    pub fn new_mtp_cache(&self, k: usize) -> KvCache {
        cache_for(
            std::iter::once(&self.mtp[k].layer),
            self.max_context,
            KvDtype::from_env(),
        )
    }

    /// Runs MTP layer `k` on one sequence: row `j` combines `tokens[j]` (the token at
    /// position `cache.len + j + 1`) with `prev` row `j` (the hidden state the previous
    /// stage produced at position `cache.len + j`) and predicts the token after `tokens[j]`.
    /// Returns the logits of the rows `want` selects and every row's output hidden state
    /// (the input of a further chained MTP step). The caller checks ids and room.
    pub fn mtp_forward(
        &self,
        k: usize,
        cache: &mut KvCache,
        tokens: &[u32],
        prev: &[f32],
        want: LogitsWanted,
    ) -> (Vec<f32>, Vec<f32>) {
        let m = &self.mtp[k];
        let width = self.hidden_size;
        let n = tokens.len();
        let start = cache.len;
        let embed = m.embed.as_ref().unwrap_or(&self.embed);
        let mut joined = vec![0f32; n * 2 * width];
        for (j, &t) in tokens.iter().enumerate() {
            let row = &mut joined[j * 2 * width..(j + 1) * 2 * width];
            // vLLM zeroes the embedding at position 0 ("not needed by MTP").
            if start + j > 0 {
                embed.row_to_f32(t as usize, &mut row[..width]);
                m.enorm.apply(&mut row[..width]);
            }
            row[width..].copy_from_slice(&prev[j * width..(j + 1) * width]);
            m.hnorm.apply(&mut row[width..]);
        }
        let mut x = vec![0f32; n * width];
        m.eh_proj.matmul(&joined, n, &mut x);
        let rows = BatchRows {
            seq: vec![0; n],
            pos: (start..start + n).collect(),
            starts: vec![0, n],
        };
        let mut sel = None;
        m.layer
            .forward(&mut x, &rows, &mut [&mut *cache], 0, &mut sel);
        cache.len += n;
        let lr = wanted_rows(want, 0..n);
        let mut hs = x[lr.start * width..lr.end * width].to_vec();
        m.norm.apply_chunks(&mut hs);
        let head = m.head.as_ref().unwrap_or(&self.lm_head);
        let mut logits = vec![0f32; lr.len() * self.vocab_size];
        head.matmul(&hs, lr.len(), &mut logits);
        (logits, x)
    }
}
