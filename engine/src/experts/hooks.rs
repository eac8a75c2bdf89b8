//! What a MoE block consults besides its own weights: an observer of its routing (for
//! `coli trace`), the lossy expert top-p, the streamed expert source and the predictor of the
//! next layer's experts. All optional; a block without hooks runs exactly as before.

use super::route::Route;
use super::streaming::Streaming;
use std::sync::Arc;

/// Sees every MoE layer's routing decisions.
pub trait RoutingObserver: Send + Sync {
    /// `layer` is the model's layer index; `routes` has one entry per row of the step, after
    /// expert top-p when that is on (the experts actually applied).
    fn observe(&self, layer: usize, routes: &[Route]);
}

/// Predicts the next MoE layer's experts from this layer's post-attention state and reads
/// them ahead. Implemented by [`super::stream::Predictor`], which runs the next layer's norm
/// and router: a trait so these hooks sit below the MoE block they serve.
pub trait LayerPredictor: Send + Sync {
    /// The layer predicted.
    fn layer(&self) -> usize;
    /// Called with the residual stream `x` (`n` rows) after this layer's attention.
    fn predict(&self, x: &[f32], n: usize);
}

/// Replaces the router's choices (benchmarks only: it changes outputs). A random-weight
/// model routes degenerately (deep layers pick the same experts for every token), which
/// would make any cache look perfect; a [`super::trace::ZipfRouting`] gives it realistic
/// traffic over its real expert files.
pub trait RouteSource: Send + Sync {
    fn reroute(&self, layer: usize, routes: &mut [Route]);
}

#[derive(Clone, Default)]
pub struct MoeHooks {
    /// The model layer index of this block (set by whoever installs hooks).
    pub layer: usize,
    pub observer: Option<Arc<dyn RoutingObserver>>,
    /// Expert top-p (lossy): keep each row's experts, heaviest first, until their weight
    /// reaches this share of the row's total routing weight.
    pub top_p: Option<f32>,
    /// Routed experts come from the expert store instead of the memory map.
    pub stream: Option<Arc<Streaming>>,
    /// Predicts the next MoE layer's experts from this layer's post-attention state.
    pub predictor: Option<Arc<dyn LayerPredictor>>,
    /// Benchmarks only: routes come from here instead of the router (changes outputs).
    pub route_source: Option<Arc<dyn RouteSource>>,
}

impl std::fmt::Debug for MoeHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoeHooks")
            .field("layer", &self.layer)
            .field("observer", &self.observer.is_some())
            .field("top_p", &self.top_p)
            .field("stream", &self.stream.is_some())
            .field("predictor", &self.predictor.as_ref().map(|p| p.layer()))
            .field("route_source", &self.route_source.is_some())
            .finish()
    }
}

impl MoeHooks {
    /// Called with the step's routes before the experts run.
    pub fn routed(&self, routes: &mut [Route]) {
        if let Some(src) = &self.route_source {
            src.reroute(self.layer, routes);
        }
        if let Some(p) = self.top_p {
            for r in routes.iter_mut() {
                prune_top_p(r, p);
            }
        }
        if let Some(s) = &self.stream {
            s.check_prediction(self.layer, routes);
        }
        if let Some(o) = &self.observer {
            o.observe(self.layer, routes);
        }
    }

    /// Called with the residual stream `x` (`n` rows) after this layer's attention.
    pub fn after_attention(&self, x: &[f32], n: usize) {
        if let Some(p) = &self.predictor {
            p.predict(x, n);
        }
    }
}

/// Expert top-p on one row: keeps the heaviest experts until their cumulative weight
/// reaches `p` of the row's total (at least one), with their weights unchanged; the dropped
/// experts' contributions are simply missing. (Rescaling the kept weights to the original
/// total was measured too: it doubles the KL divergence on the fixtures, docs/STREAMING.md.)
/// The kept experts stay in their original order.
pub fn prune_top_p(r: &mut Route, p: f32) {
    if r.experts.len() <= 1 || p >= 1.0 {
        return;
    }
    let total: f32 = r.weights.iter().sum();
    let mut order: Vec<usize> = (0..r.weights.len()).collect();
    order.sort_by(|&a, &b| r.weights[b].total_cmp(&r.weights[a]).then(a.cmp(&b)));
    let mut keep = vec![false; r.weights.len()];
    let mut acc = 0f32;
    for &i in &order {
        keep[i] = true;
        acc += r.weights[i];
        if acc >= p * total {
            break;
        }
    }
    let (mut experts, mut weights) = (Vec::new(), Vec::new());
    for ((&e, &w), _) in r
        .experts
        .iter()
        .zip(&r.weights)
        .zip(&keep)
        .filter(|(_, &k)| k)
    {
        experts.push(e);
        weights.push(w);
    }
    r.experts = experts;
    r.weights = weights;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(experts: &[usize], weights: &[f32]) -> Route {
        Route {
            experts: experts.to_vec(),
            weights: weights.to_vec(),
        }
    }

    #[test]
    fn top_p_keeps_heaviest_until_share_reached() {
        let mut r = route(&[4, 1, 7, 2], &[0.1, 0.5, 0.3, 0.1]);
        prune_top_p(&mut r, 0.75);
        // 0.5 + 0.3 = 0.8 >= 0.75: experts 1 and 7, in their original order, weights as they were.
        assert_eq!(r, route(&[1, 7], &[0.5, 0.3]));

        // Unnormalised weights (OLMoE): the share is of their own total.
        let mut r = route(&[0, 1], &[0.2, 0.1]);
        prune_top_p(&mut r, 0.6);
        assert_eq!(r, route(&[0], &[0.2]));

        // p = 1 keeps everything untouched; p tiny keeps one.
        let mut r = route(&[3, 5], &[0.4, 0.6]);
        prune_top_p(&mut r, 1.0);
        assert_eq!(r, route(&[3, 5], &[0.4, 0.6]));
        prune_top_p(&mut r, 0.01);
        assert_eq!(r.experts, vec![5]);
    }
}
