//! What the dashboard's expert grid shows: one cell per (layer, expert), where the expert
//! is (pinned, cached, being read, on disk, or resident when experts are not streamed), how
//! often it was routed to, and which experts the latest token went to.
//!
//! [`crate::activity::ExpertActivity`] is the routing observer every MoE block of a daemon model reports to
//! (installed at load, streamed or not): it counts the rows routed to each expert and keeps
//! the last row's choice per layer. [`Grid::of`] reads it together with the expert store's
//! residency and the model's pins; [`Grid::delta`] is what changed between two grids, so a
//! live view sends a few hundred cells per update instead of the whole 20k of GLM-5.

use crate::daemon::ModelHandle;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

/// Cell codes (one ASCII digit each in a snapshot's `cells` string).
pub mod code {
    /// No routed expert here: a dense layer, or past the layer's last expert.
    pub const NONE: u8 = 0;
    /// Streamed, not in RAM.
    pub const DISK: u8 = 1;
    /// Streamed, a read in flight.
    pub const READING: u8 = 2;
    /// Streamed, in the cache.
    pub const CACHED: u8 = 3;
    /// Pinned and in RAM.
    pub const PINNED: u8 = 4;
    /// Pinned, not (yet) in RAM.
    pub const PINNED_DISK: u8 = 5;
    /// Not streamed: the model's experts are all in memory (the memory map).
    pub const RESIDENT: u8 = 6;
}

/// The grid of one model at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct Grid {
    pub layers: usize,
    pub width: usize,
    /// A [`code`] per cell, row-major (`layer * width + expert`).
    pub cells: Vec<u8>,
    /// Rows routed to each cell's expert since load.
    pub uses: Vec<u64>,
    /// Per layer, the experts routed by the latest token.
    pub last: Vec<Vec<u32>>,
    /// The observer's counter of routed layers, as read.
    pub observed: u64,
}

impl Grid {
    /// Reads a model's grid: the observer's counts, the store's residency, the pins.
    pub fn of(h: &ModelHandle) -> Grid {
        let a = &h.activity;
        let (layers, width) = (a.layers(), a.width());
        let mut cells = vec![code::NONE; layers * width];
        let base = if h.streaming.is_some() {
            code::DISK
        } else {
            code::RESIDENT
        };
        for (l, &n) in a.row_experts.iter().enumerate() {
            cells[l * width..l * width + n as usize].fill(base);
        }
        let cell = |layer: u32, expert: u32| -> Option<usize> {
            let n = *a.row_experts.get(layer as usize)?;
            (expert < n).then(|| layer as usize * width + expert as usize)
        };
        if let Some(s) = &h.streaming {
            for (k, ready) in s.store.residency() {
                if let Some(i) = cell(k.layer, k.expert) {
                    cells[i] = if ready { code::CACHED } else { code::READING };
                }
            }
        }
        for &(l, e) in h.shared.pins.lock().expect("pins lock").iter() {
            if let Some(i) = cell(l, e) {
                cells[i] = match cells[i] {
                    code::DISK | code::READING => code::PINNED_DISK,
                    _ => code::PINNED,
                };
            }
        }
        // Counts may move while they are read: the next grid catches up.
        let observed = a.observed.load(Ordering::Relaxed);
        let uses = a.uses.iter().map(|u| u.load(Ordering::Relaxed)).collect();
        Grid {
            layers,
            width,
            cells,
            uses,
            last: a.last(),
            observed,
        }
    }

    /// The whole grid as JSON: `cells` one digit per cell, `uses` one number per cell,
    /// `last` the experts of the latest token per layer.
    pub fn snapshot_json(&self) -> Value {
        let cells: String = self.cells.iter().map(|&c| char::from(b'0' + c)).collect();
        json!({
            "layers": self.layers,
            "experts": self.width,
            "cells": cells,
            "uses": self.uses,
            "last": self.last,
            "observed": self.observed,
        })
    }

    /// What changed since `before` (a grid of the same model): `cells` and `uses` as flat
    /// `[index, value, index, value, ...]` lists, `last` when the latest token's routing
    /// changed. None when nothing did.
    pub fn delta(&self, before: &Grid) -> Option<Value> {
        if self.cells.len() != before.cells.len() {
            return Some(json!({"reset": true}));
        }
        let mut cells = Vec::new();
        let mut uses = Vec::new();
        for i in 0..self.cells.len() {
            if self.cells[i] != before.cells[i] {
                cells.extend([i as u64, self.cells[i] as u64]);
            }
            if self.uses[i] != before.uses[i] {
                uses.extend([i as u64, self.uses[i]]);
            }
        }
        let routed = self.observed != before.observed;
        if cells.is_empty() && uses.is_empty() && !routed {
            return None;
        }
        let mut d = json!({"cells": cells, "uses": uses, "observed": self.observed});
        if routed {
            d["last"] = json!(self.last);
        }
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_name_changed_cells_only() {
        let g = Grid {
            layers: 2,
            width: 3,
            cells: vec![1, 1, 1, 3, 1, 0],
            uses: vec![0, 5, 0, 0, 0, 0],
            last: vec![vec![1], vec![]],
            observed: 4,
        };
        assert_eq!(g.delta(&g), None);
        let mut h = g.clone();
        h.cells[4] = 2;
        h.uses[1] = 7;
        let d = h.delta(&g).unwrap();
        assert_eq!(d["cells"], json!([4, 2]));
        assert_eq!(d["uses"], json!([1, 7]));
        assert!(d.get("last").is_none());
        h.observed = 5;
        h.last = vec![vec![0], vec![2]];
        let d = h.delta(&g).unwrap();
        assert_eq!(d["last"], json!([[0], [2]]));
        let s = g.snapshot_json();
        assert_eq!(s["cells"], "111310");
        assert_eq!(s["uses"], json!([0, 5, 0, 0, 0, 0]));
    }
}
