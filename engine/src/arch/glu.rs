//! What a gated MLP does between its gate/up products and its down projection, beyond the
//! plain `silu(gate) ⊙ up` every family but gpt-oss uses: biases on the products, a fused
//! gate/up matrix with interleaved rows, and the clamped SwiGLU activation.

use super::simd;
use std::sync::Arc;

/// The activation of a gated MLP.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum GluAct {
    /// `silu(gate) · up`.
    #[default]
    Silu,
    /// gpt-oss's experts (transformers' `GptOssExperts._apply_gate`): `gate` clamped above at
    /// `limit`, `up` to `±limit`, then `(up + 1) · gate · sigmoid(alpha · gate)`.
    ClampedSwiGlu { limit: f32, alpha: f32 },
}

/// A gated MLP's options ([`super::blocks::Mlp::glu`]); the default is the plain SiLU MLP
/// with separate gate and up matrices and no biases.
#[derive(Clone, Debug, Default)]
pub struct Glu {
    pub act: GluAct,
    /// Gate and up are one matrix of `2 · intermediate` rows, gate row `j` at `2j` and up row
    /// `j` at `2j + 1` (gpt-oss's `gate_up_proj`, read as published): `Mlp::gate` holds it and
    /// `Mlp::up` has no rows.
    pub interleaved: bool,
    /// Added to the gate/up products, in the gate matrix's row order (interleaved when
    /// `interleaved`); with separate matrices, the gate's biases then the up's.
    pub gate_up_bias: Option<Arc<[f32]>>,
    /// Added to the down projection's output.
    pub down_bias: Option<Arc<[f32]>>,
}

impl Glu {
    /// Whether this is the plain SiLU MLP.
    pub fn is_plain(&self) -> bool {
        self.act == GluAct::Silu
            && !self.interleaved
            && self.gate_up_bias.is_none()
            && self.down_bias.is_none()
    }

    /// The down projection's input for `rows` rows of `inter` elements, in `g`: from the gate
    /// products `g` (`rows × 2·inter` when interleaved, else `rows × inter`) and the up
    /// products `u` (`rows × inter`, empty when interleaved). `g` ends `rows × inter` long.
    pub fn activate(&self, g: &mut Vec<f32>, u: &[f32], rows: usize, inter: usize) {
        if self.is_plain() {
            return simd::silu_mul(g, u);
        }
        let bias = self.gate_up_bias.as_deref();
        for t in 0..rows {
            for j in 0..inter {
                let (gi, ui) = if self.interleaved {
                    (2 * j, 2 * j + 1)
                } else {
                    (j, inter + j)
                };
                let (mut gv, mut uv) = if self.interleaved {
                    (g[t * 2 * inter + gi], g[t * 2 * inter + ui])
                } else {
                    (g[t * inter + j], u[t * inter + j])
                };
                if let Some(b) = bias {
                    gv += b[gi];
                    uv += b[ui];
                }
                // Written at t·inter + j, never past what is still to be read.
                g[t * inter + j] = match self.act {
                    GluAct::Silu => gv / (1.0 + simd::exp_scalar(-gv)) * uv,
                    GluAct::ClampedSwiGlu { limit, alpha } => clamped_swiglu(gv, uv, limit, alpha),
                };
            }
        }
        g.truncate(rows * inter);
    }

    /// Adds the down bias to every row of `y` (rows of the down projection's width).
    pub fn add_down_bias(&self, y: &mut [f32]) {
        if let Some(b) = &self.down_bias {
            for row in y.chunks_mut(b.len()) {
                for (v, bv) in row.iter_mut().zip(b.iter()) {
                    *v += bv;
                }
            }
        }
    }
}

/// One element of [`GluAct::ClampedSwiGlu`], in transformers' order of operations (f32).
#[inline]
pub fn clamped_swiglu(gate: f32, up: f32, limit: f32, alpha: f32) -> f32 {
    let gate = gate.min(limit);
    let up = up.clamp(-limit, limit);
    let glu = gate * (1.0 / (1.0 + (-(gate * alpha)).exp()));
    (up + 1.0) * glu
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamped_swiglu_clamps_gate_above_and_up_both_sides() {
        let (limit, alpha) = (7.0, 1.702);
        let s = |x: f32| 1.0 / (1.0 + (-x).exp());
        // Below the limit: (up + 1) · gate · σ(α gate).
        let want = 3.0 * 0.5 * s(0.851);
        assert!((clamped_swiglu(0.5, 2.0, limit, alpha) - want).abs() < 1e-6);
        // The gate clamps at 7 above, not below; up clamps to ±7.
        assert_eq!(
            clamped_swiglu(9.0, 10.0, limit, alpha),
            clamped_swiglu(7.0, 7.0, limit, alpha)
        );
        assert_eq!(
            clamped_swiglu(-9.0, -10.0, limit, alpha),
            clamped_swiglu(-9.0, -7.0, limit, alpha)
        );
        assert_ne!(
            clamped_swiglu(-9.0, 0.0, limit, alpha),
            clamped_swiglu(-7.0, 0.0, limit, alpha)
        );
    }

    #[test]
    fn interleaved_rows_pair_gate_and_up_with_their_biases() {
        let glu = Glu {
            act: GluAct::ClampedSwiGlu {
                limit: 7.0,
                alpha: 1.702,
            },
            interleaved: true,
            gate_up_bias: Some(vec![0.1, 0.2, 0.3, 0.4].into()),
            down_bias: None,
        };
        // Two rows of 2 × inter = 4 products: [g0, u0, g1, u1].
        let mut g = vec![1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 0.0, -2.0];
        glu.activate(&mut g, &[], 2, 2);
        let f = |gv: f32, uv: f32| clamped_swiglu(gv, uv, 7.0, 1.702);
        assert_eq!(g, [f(1.1, 2.2), f(3.3, 4.4), f(-0.9, 0.7), f(0.3, -1.6)]);
    }
}
