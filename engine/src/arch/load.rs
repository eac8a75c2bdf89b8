//! What a model load reports as it goes: the stages ([`LoadStage`]) and progress in tensor
//! bytes ([`LoadProgress`]), told through the [`LoadHook`] every family's loader carries,
//! which also collects the census of formats and the load's notes.

use super::census;
use crate::container::Checkpoint;
use crate::tensor::{Matrix, WeightFormat};
use std::cell::Cell;
use std::collections::HashMap;

/// What a model load is doing, as [`LoadProgress`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadStage {
    /// The files' bytes are being copied into RAM ([`crate::container::WeightsIn`]):
    /// `done`/`total` count the bytes of the files copied, not the tensor bytes of the
    /// stages after it. Reported (before [`Opening`](Self::Opening)) only when a file is
    /// copied, every 64 MiB, from 0 to `total`.
    Copying,
    /// The checkpoint's headers are read and its files mapped; nothing is loaded yet.
    Opening,
    /// Decoder layers (then embeddings and head) are being loaded and checked.
    Weights,
    /// Weights done; the tokenizer and chat template are being read.
    Text,
}

/// How far [`Model::load_with_progress`](crate::Model::load_with_progress) has got, in the
/// checkpoint's tensor bytes. Reported once per decoder layer (not per byte): `done` only
/// grows, never passes `total`, and the last report has `done == total`. Before them, when files are copied into RAM, reports of
/// [`LoadStage::Copying`] count the bytes copied (their own `total`, the same rules).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadProgress {
    pub stage: LoadStage,
    pub done: u64,
    pub total: u64,
    pub message: String,
}

/// Load progress in the checkpoint's tensor bytes, reported once per decoder layer (and MTP
/// layer): a layer's bytes are every tensor under `model.layers.N.`, so a whole checkpoint
/// costs one hash-map pass up front and nothing per byte.
pub struct LoadHook<'a> {
    report: &'a dyn Fn(LoadProgress),
    /// Tensor bytes under each `model.layers.N` prefix.
    layer_bytes: HashMap<String, u64>,
    total: u64,
    done: Cell<u64>,
    layers_done: Cell<usize>,
    /// What the load found worth telling (a missing DSA indexer, no MTP layers), once each.
    notes: std::cell::RefCell<Vec<String>>,
    /// Formats of the matrices loaded, per tensor class.
    census: std::cell::RefCell<census::Census>,
    /// `num_hidden_layers`: layers past it are MTP layers.
    decoder_layers: Option<usize>,
}

impl<'a> LoadHook<'a> {
    pub fn new(ckpt: &Checkpoint, report: &'a dyn Fn(LoadProgress)) -> LoadHook<'a> {
        let mut layer_bytes: HashMap<String, u64> = HashMap::new();
        let mut total = 0u64;
        for name in ckpt.tensor_names() {
            let Some(t) = ckpt.get(name) else { continue };
            let bytes = (t.end - t.start) as u64;
            total += bytes;
            if let Some(prefix) = layer_prefix(name) {
                *layer_bytes.entry(prefix.to_string()).or_default() += bytes;
            }
        }
        LoadHook {
            report,
            layer_bytes,
            total,
            done: Cell::new(0),
            layers_done: Cell::new(0),
            notes: Default::default(),
            census: Default::default(),
            decoder_layers: ckpt
                .config
                .get("num_hidden_layers")
                .and_then(|v| v.as_u64())
                .map(|v| v as usize),
        }
    }

    /// Counts a loaded matrix in the census of formats.
    pub fn record_matrix(&self, name: &str, m: &Matrix) {
        self.record_matrix_as(name, m, m.format);
    }

    /// Counts a loaded matrix under `format` (the file's, where the matrix was rearranged
    /// at load).
    pub fn record_matrix_as(&self, name: &str, m: &Matrix, format: WeightFormat) {
        self.census
            .borrow_mut()
            .record(name, m, format, self.decoder_layers);
    }

    /// The formats of the matrices loaded so far, per tensor class.
    pub fn weight_classes(&self) -> Vec<census::WeightClass> {
        self.census.borrow().classes()
    }

    /// Records something the user should know about the loaded model (kept once).
    pub fn note(&self, msg: impl Into<String>) {
        let msg = msg.into();
        let mut n = self.notes.borrow_mut();
        if !n.contains(&msg) {
            n.push(msg);
        }
    }

    /// The notes recorded so far.
    pub fn notes(&self) -> Vec<String> {
        self.notes.borrow().clone()
    }

    /// Tensor bytes of the whole checkpoint.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Reports `done` as it stands.
    pub fn report(&self, stage: LoadStage, message: impl Into<String>) {
        (self.report)(LoadProgress {
            stage,
            done: self.done.get(),
            total: self.total,
            message: message.into(),
        });
    }

    /// Counts the layer under `prefix` (`model.layers.N`) as loaded.
    pub fn layer_loaded(&self, prefix: &str) {
        // A prefix counted twice would overshoot the total: take its bytes once.
        let bytes = self.layer_bytes.get(prefix).copied().unwrap_or(0);
        self.done.set((self.done.get() + bytes).min(self.total));
        self.layers_done.set(self.layers_done.get() + 1);
        self.report(
            LoadStage::Weights,
            format!(
                "layer {} of {}",
                self.layers_done.get(),
                self.layer_bytes.len()
            ),
        );
    }

    /// Counts everything as loaded (embeddings, head, tensors no layer claimed).
    pub fn finish(&self, stage: LoadStage, message: impl Into<String>) {
        self.done.set(self.total);
        self.report(stage, message);
    }
}

/// `model.layers.N` of a tensor named `model.layers.N.…`.
fn layer_prefix(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("model.layers.")?;
    let digits = rest.find('.')?;
    if digits == 0 || !rest[..digits].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(&name[.."model.layers.".len() + digits])
}
