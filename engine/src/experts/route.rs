//! What a router decides for one row, the currency of the hooks, traces and simulator.

/// One row's routing decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}
