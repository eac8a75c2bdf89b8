//! One batched forward step as the network takes it: each sequence's share ([`SeqStep`],
//! with the logits it wants back, [`LogitsWanted`]) and the rows they make ([`BatchRows`]).

use crate::kv::KvCache;

/// Which logits a sequence wants back from a forward step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    None,
    Last,
    All,
}

/// One sequence's share of a batched forward step: feed `tokens` at positions
/// `cache.len..`, append their keys and values to `cache`.
pub struct SeqStep<'a> {
    pub cache: &'a mut KvCache,
    pub tokens: &'a [u32],
    pub logits: LogitsWanted,
}

/// Which sequence and position each row of a batched step belongs to.
pub struct BatchRows {
    pub seq: Vec<usize>,
    pub pos: Vec<usize>,
    /// Row offset of each sequence's first row; `starts[s]..starts[s+1]`.
    pub starts: Vec<usize>,
}

impl BatchRows {
    pub fn len(&self) -> usize {
        self.seq.len()
    }
    pub fn is_empty(&self) -> bool {
        self.seq.is_empty()
    }
    pub fn seq_range(&self, s: usize) -> std::ops::Range<usize> {
        self.starts[s]..self.starts[s + 1]
    }
}
