//! Policies by name: the names, the default, and [`build`].

use super::arc::ArcCache;
use super::base::Policy;
use super::lfu::Lfu;
use super::lrfu::Lrfu;
use super::lrfu_auto::AdaptiveLrfu;
use super::lru::Lru;
use super::pinned::Pinned;
use crate::error::{Error, Result};
use crate::experts::Key;

/// The policy names [`build`] accepts (`lrfu` takes an optional `:HALF_LIFE` in tokens;
/// any of them may be prefixed with `pinned-`).
pub const POLICY_NAMES: &[&str] = &["lru", "lfu", "lfu-admit", "lrfu", "lrfu-auto", "arc"];

/// The policy the store uses unless told otherwise: [`AdaptiveLrfu`]. Chosen on the routing
/// of four trained models (Qwen3-30B-A3B, granite-3.0-1b-a400m, gemma-4-26B-A4B,
/// gpt-oss-120b) at 10%, 25% and 40% of their experts, where every fixed policy is the
/// worst of the field somewhere and the adaptive one is within 3% of the best everywhere
/// (docs/STREAMING.md has the tables).
pub const DEFAULT_POLICY: &str = "lrfu-auto";

/// Default half-life of a plain `lrfu`, in tokens: the fixed half-life with the smallest
/// worst case over the real traces (16: at most 1.79× Belady; 64 reached 1.91×, 4 1.95×).
pub const DEFAULT_LRFU_HALF_LIFE_TOKENS: f64 = 16.0;

/// Builds a policy from its name. `counts` (a usage histogram of earlier runs) seeds the
/// frequency policies and chooses the pins of a `pinned-` policy, which gets
/// `pin_share × capacity` of them. `requests_per_token` (MoE layers × top-k) turns LRFU's
/// half-life in tokens (`lrfu:TOKENS`) into accesses.
pub fn build(
    spec: &str,
    capacity: usize,
    counts: Option<&[(Key, u64)]>,
    pin_share: f64,
    requests_per_token: usize,
) -> Result<Box<dyn Policy>> {
    if let Some(rest) = spec.strip_prefix("pinned-") {
        let n = ((capacity as f64) * pin_share.clamp(0.0, 1.0)).floor() as usize;
        let pins = hottest(counts.unwrap_or(&[]), n);
        let mut err = None;
        let p = Pinned::new(capacity, &pins, |cap| {
            match build(rest, cap, counts, 0.0, requests_per_token) {
                Ok(p) => p,
                Err(e) => {
                    err = Some(e);
                    Box::new(Lru::new(cap))
                }
            }
        });
        return match err {
            Some(e) => Err(e),
            None => Ok(Box::new(p)),
        };
    }
    let (name, param) = match spec.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (spec, None),
    };
    let seeded = |mut p: Lfu| {
        if let Some(c) = counts {
            p.seed(c.iter().copied());
        }
        p
    };
    let no_param = |p: Option<&str>| match p {
        Some(_) => Err(Error::invalid(
            "policy",
            format!("'{name}' takes no parameter"),
        )),
        None => Ok(()),
    };
    Ok(match name {
        "lru" => {
            no_param(param)?;
            Box::new(Lru::new(capacity))
        }
        "lfu" => {
            no_param(param)?;
            Box::new(seeded(Lfu::new(capacity, true)))
        }
        "lfu-admit" => {
            no_param(param)?;
            Box::new(seeded(Lfu::new(capacity, false)))
        }
        "arc" => {
            no_param(param)?;
            Box::new(ArcCache::new(capacity))
        }
        "lrfu-auto" => {
            no_param(param)?;
            let mut p = AdaptiveLrfu::new(capacity, requests_per_token);
            if let Some(c) = counts {
                p.seed(c);
            }
            Box::new(p)
        }
        "lrfu" => {
            let tokens = match param {
                None => DEFAULT_LRFU_HALF_LIFE_TOKENS,
                Some(p) => match p.parse::<f64>() {
                    Ok(h) if h > 0.0 && h.is_finite() => h,
                    _ => {
                        return Err(Error::invalid(
                            "policy",
                            format!("lrfu half-life '{p}' is not a positive number of tokens"),
                        ))
                    }
                },
            };
            let mut p = Lrfu::new(capacity, tokens * requests_per_token.max(1) as f64);
            p.label = format!("lrfu:{tokens}");
            if let Some(c) = counts {
                // Seeded counts are old uses: a plain count, not ordered in time.
                for &(k, n) in c {
                    if n > 0 {
                        p.score.insert(k, (n as f64).log2());
                    }
                }
            }
            Box::new(p)
        }
        _ => {
            return Err(Error::invalid(
                "policy",
                format!(
                    "unknown policy '{spec}'; known: {} (each may be prefixed with 'pinned-')",
                    POLICY_NAMES.join(", ")
                ),
            ))
        }
    })
}

/// The `n` keys with the largest counts (ties by key, so the choice is reproducible).
pub fn hottest(counts: &[(Key, u64)], n: usize) -> Vec<Key> {
    let mut v: Vec<(Key, u64)> = counts.iter().copied().filter(|&(_, c)| c > 0).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(n);
    v.into_iter().map(|(k, _)| k).collect()
}
