//! Which experts a daemon model routes to: [`ExpertActivity`] is the routing observer every
//! MoE block of a daemon model reports to (installed at load, streamed or not). It counts the
//! rows routed to each expert and keeps the last row's choice per layer; the dashboard's grid
//! (http/web/grid.rs) reads it.

use colibri_engine::arch::moe::Route;
use colibri_engine::experts::RoutingObserver;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The routing observer of one model.
pub struct ExpertActivity {
    /// Routed experts per layer (0 for a dense layer).
    pub(crate) row_experts: Vec<u32>,
    /// Columns of the grid: the most experts in a layer.
    width: usize,
    /// Rows routed to each expert since load, `[layer * width + expert]`.
    pub(crate) uses: Vec<AtomicU64>,
    /// Per layer, the experts the last row of the latest step was routed to.
    last: Mutex<Vec<Vec<u32>>>,
    /// Bumped at every observed layer: tells a reader that routing happened.
    pub(crate) observed: AtomicU64,
}

impl ExpertActivity {
    pub fn new(row_experts: &[usize]) -> ExpertActivity {
        let width = row_experts.iter().copied().max().unwrap_or(0);
        ExpertActivity {
            row_experts: row_experts.iter().map(|&n| n as u32).collect(),
            width,
            uses: (0..row_experts.len() * width)
                .map(|_| AtomicU64::new(0))
                .collect(),
            last: Mutex::new(vec![Vec::new(); row_experts.len()]),
            observed: AtomicU64::new(0),
        }
    }

    pub fn layers(&self) -> usize {
        self.row_experts.len()
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn row_experts(&self) -> &[u32] {
        &self.row_experts
    }

    pub(crate) fn last(&self) -> Vec<Vec<u32>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl RoutingObserver for ExpertActivity {
    fn observe(&self, layer: usize, routes: &[Route]) {
        let n = self.row_experts.get(layer).copied().unwrap_or(0) as usize;
        if n == 0 {
            return;
        }
        let row = layer * self.width;
        for r in routes {
            for &e in r.experts.iter().filter(|&&e| e < n) {
                self.uses[row + e].fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(r) = routes.last() {
            let mut experts: Vec<u32> = r
                .experts
                .iter()
                .filter(|&&e| e < n)
                .map(|&e| e as u32)
                .collect();
            experts.sort_unstable();
            self.last.lock().unwrap_or_else(|e| e.into_inner())[layer] = experts;
        }
        self.observed.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(experts: &[usize]) -> Route {
        Route {
            experts: experts.to_vec(),
            weights: vec![0.5; experts.len()],
        }
    }

    #[test]
    fn counts_rows_and_keeps_the_last_rows_choice() {
        // A dense first layer, then two MoE layers of 4 experts.
        let a = ExpertActivity::new(&[0, 4, 4]);
        assert_eq!((a.layers(), a.width()), (3, 4));
        a.observe(1, &[route(&[0, 2]), route(&[2, 3])]);
        a.observe(2, &[route(&[1, 0]), route(&[3, 1])]);
        // Out-of-range experts and dense layers are ignored, not a panic.
        a.observe(0, &[route(&[0])]);
        a.observe(2, &[route(&[9])]);
        let uses: Vec<u64> = a.uses.iter().map(|u| u.load(Ordering::Relaxed)).collect();
        assert_eq!(uses, [0, 0, 0, 0, 1, 0, 2, 1, 1, 2, 0, 1]);
        assert_eq!(a.last(), vec![vec![], vec![2, 3], vec![]]);
        assert_eq!(a.observed.load(Ordering::Relaxed), 3);
    }
}
