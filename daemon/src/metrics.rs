//! The daemon's own counters for `/metrics`, recorded as they happen for gRPC and HTTP
//! requests alike: HTTP requests by route and status, finished generations by reason, the
//! time-to-first-token histogram. The shared generation path in service.rs calls
//! [`Metrics::generation_finished`]; http/metrics.rs renders them with the figures the daemon
//! already keeps.

use colibri_proto::v1 as pb;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Upper bounds (seconds) of the time-to-first-token histogram's buckets.
pub const TTFT_BUCKETS: [f64; 12] = [
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

#[derive(Default)]
pub struct Metrics {
    pub(crate) inner: Mutex<Inner>,
}

#[derive(Default)]
pub(crate) struct Inner {
    /// (route, status code) → requests.
    pub(crate) http: BTreeMap<(String, u16), u64>,
    /// Canonical model id → its generations.
    pub(crate) models: BTreeMap<String, ModelMetrics>,
}

#[derive(Default)]
pub(crate) struct ModelMetrics {
    /// Finish reason → generations.
    pub(crate) finished: BTreeMap<&'static str, u64>,
    pub(crate) ttft_buckets: [u64; TTFT_BUCKETS.len()],
    pub(crate) ttft_count: u64,
    pub(crate) ttft_sum: f64,
    pub(crate) prompt_tokens: u64,
    pub(crate) cached_tokens: u64,
    pub(crate) generated_tokens: u64,
    /// Seconds spent decoding (first token to last) and tokens decoded in them.
    pub(crate) decode_seconds: f64,
    pub(crate) decode_tokens: u64,
    /// Decode speed of the last finished generation with at least two tokens.
    pub(crate) last_decode_tps: f64,
}

impl Metrics {
    pub fn http_request(&self, route: &str, status: u16) {
        let mut g = self.inner.lock().expect("metrics lock");
        *g.http.entry((route.to_string(), status)).or_default() += 1;
    }

    /// Records a generation's Finished event (any front door).
    pub fn generation_finished(&self, model: &str, f: &pb::generate_event::Finished) {
        let reason = match pb::FinishReason::try_from(f.reason) {
            Ok(pb::FinishReason::Length) => "length",
            Ok(pb::FinishReason::Eos) => "eos",
            Ok(pb::FinishReason::Stop) => "stop",
            Ok(pb::FinishReason::Cancelled) => "cancelled",
            _ => "unspecified",
        };
        let mut g = self.inner.lock().expect("metrics lock");
        let m = g.models.entry(model.to_string()).or_default();
        *m.finished.entry(reason).or_default() += 1;
        let Some(s) = &f.stats else { return };
        m.prompt_tokens += s.prompt_tokens as u64;
        m.cached_tokens += s.cached_tokens as u64;
        m.generated_tokens += s.generated_tokens as u64;
        if s.generated_tokens > 0 {
            let ttft = s.time_to_first_token_ms / 1e3;
            m.ttft_count += 1;
            m.ttft_sum += ttft;
            for (b, le) in m.ttft_buckets.iter_mut().zip(TTFT_BUCKETS) {
                if ttft <= le {
                    *b += 1;
                }
            }
        }
        if s.generated_tokens > 1 && s.decode_tokens_per_second > 0.0 {
            let n = (s.generated_tokens - 1) as u64;
            m.decode_tokens += n;
            m.decode_seconds += n as f64 / s.decode_tokens_per_second;
            m.last_decode_tps = s.decode_tokens_per_second;
        }
    }

    /// A generation whose stream was dropped before it finished (the client went away, so
    /// the engine cancels it) or that failed.
    pub fn generation_ended_early(&self, model: &str, reason: &'static str) {
        let mut g = self.inner.lock().expect("metrics lock");
        let m = g.models.entry(model.to_string()).or_default();
        *m.finished.entry(reason).or_default() += 1;
    }
}
