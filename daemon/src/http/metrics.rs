//! `GET /metrics`: Prometheus text exposition (format 0.0.4) of the daemon's work.
//!
//! Counters that only the request path sees (HTTP requests by route and status, finished
//! generations by reason, the time-to-first-token histogram) are recorded in [`crate::metrics`] as they
//! happen, for gRPC and HTTP requests alike (the shared generation path in service.rs
//! calls [`Metrics::generation_finished`]). Everything the daemon already keeps (tokens,
//! queue depth, KV bytes, the expert cache's counters) is read at scrape time from the same
//! figures `Status` reports, so the two never disagree.

use crate::daemon::Daemon;
use crate::metrics::{Metrics, TTFT_BUCKETS};
use colibri_proto::v1 as pb;
use std::fmt::Write;

impl Metrics {
    /// The exposition text: recorded counters plus the daemon's current figures.
    pub fn render(&self, daemon: &Daemon, models: &[(String, pb::ModelStatus)]) -> String {
        let mut out = String::new();
        let family = |name: &str, kind: &str, help: &str, out: &mut String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            "colibri_up",
            "gauge",
            "1 while the daemon serves.",
            &mut out,
        );
        out.push_str("colibri_up 1\n");
        family(
            "colibri_uptime_seconds",
            "gauge",
            "Seconds since the daemon started.",
            &mut out,
        );
        let _ = writeln!(
            out,
            "colibri_uptime_seconds {}",
            num(daemon.started.elapsed().as_secs_f64())
        );
        let mem = crate::daemon::memory_stats();
        family(
            "colibri_resident_memory_bytes",
            "gauge",
            "Resident set of the daemon process.",
            &mut out,
        );
        let _ = writeln!(out, "colibri_resident_memory_bytes {}", mem.rss_bytes);

        let g = self.inner.lock().expect("metrics lock");
        family(
            "colibri_http_requests_total",
            "counter",
            "HTTP API requests by route and status code.",
            &mut out,
        );
        for ((route, status), n) in &g.http {
            let _ = writeln!(
                out,
                "colibri_http_requests_total{{route=\"{}\",code=\"{status}\"}} {n}",
                esc(route)
            );
        }

        // Per model: the daemon's figures, then what was recorded for it.
        type Gauge = fn(&pb::ModelStatus) -> f64;
        let gauges: [(&str, &str, &str, Gauge); 12] = [
            (
                "colibri_model_loaded_seconds",
                "gauge",
                "Seconds since the model was loaded.",
                |s| s.loaded_seconds,
            ),
            (
                "colibri_active_generations",
                "gauge",
                "Generations being stepped now.",
                |s| s.active_generations as f64,
            ),
            (
                "colibri_queue_depth",
                "gauge",
                "Requests waiting for a place in the batch.",
                |s| s.queued as f64,
            ),
            (
                "colibri_live_sessions",
                "gauge",
                "Sessions held in memory.",
                |s| s.live_sessions as f64,
            ),
            (
                "colibri_kv_cache_bytes",
                "gauge",
                "Bytes of KV caches held.",
                |s| s.kv_bytes as f64,
            ),
            (
                "colibri_steps_total",
                "counter",
                "Batched forward steps run.",
                |s| s.steps as f64,
            ),
            (
                "colibri_prompt_tokens_total",
                "counter",
                "Prompt tokens prefilled (tokens in).",
                |s| s.tokens_prefilled as f64,
            ),
            (
                "colibri_generated_tokens_total",
                "counter",
                "Tokens generated (tokens out).",
                |s| s.tokens_generated as f64,
            ),
            (
                "colibri_expert_cache_hit_rate",
                "gauge",
                "Expert cache hits / lookups since load (streamed experts).",
                |s| cache(s).hit_rate,
            ),
            (
                "colibri_expert_cache_read_bytes_total",
                "counter",
                "Bytes the expert cache read from disk.",
                |s| cache(s).bytes_read as f64,
            ),
            (
                "colibri_expert_cache_hits_total",
                "counter",
                "Expert lookups served from memory.",
                |s| cache(s).hits as f64,
            ),
            (
                "colibri_expert_cache_misses_total",
                "counter",
                "Expert lookups that read from disk.",
                |s| cache(s).misses as f64,
            ),
        ];
        for (name, kind, help, f) in gauges {
            family(name, kind, help, &mut out);
            for (label, s) in models {
                let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", esc(label), num(f(s)));
            }
        }
        family(
            "colibri_expert_cache_used_bytes",
            "gauge",
            "Bytes of experts resident in the cache.",
            &mut out,
        );
        for (label, s) in models {
            let _ = writeln!(
                out,
                "colibri_expert_cache_used_bytes{{model=\"{}\"}} {}",
                esc(label),
                cache(s).used_bytes
            );
        }

        let recorded = |id: &str| g.models.get(id);
        let id_of = |s: &pb::ModelStatus| s.info.as_ref().map(|i| i.id.clone()).unwrap_or_default();
        family(
            "colibri_generations_total",
            "counter",
            "Finished generations (gRPC and HTTP) by finish reason.",
            &mut out,
        );
        for (label, s) in models {
            if let Some(m) = recorded(&id_of(s)) {
                for (reason, n) in &m.finished {
                    let _ = writeln!(
                        out,
                        "colibri_generations_total{{model=\"{}\",reason=\"{reason}\"}} {n}",
                        esc(label)
                    );
                }
            }
        }
        family(
            "colibri_request_cached_prompt_tokens_total",
            "counter",
            "Prompt tokens of finished requests served from a cached prefix.",
            &mut out,
        );
        for (label, s) in models {
            let n = recorded(&id_of(s)).map(|m| m.cached_tokens).unwrap_or(0);
            let _ = writeln!(
                out,
                "colibri_request_cached_prompt_tokens_total{{model=\"{}\"}} {n}",
                esc(label)
            );
        }
        family(
            "colibri_decode_seconds_total",
            "counter",
            "Seconds finished requests spent decoding (first token to last).",
            &mut out,
        );
        for (label, s) in models {
            let v = recorded(&id_of(s)).map(|m| m.decode_seconds).unwrap_or(0.0);
            let _ = writeln!(
                out,
                "colibri_decode_seconds_total{{model=\"{}\"}} {}",
                esc(label),
                num(v)
            );
        }
        family(
            "colibri_decode_tokens_total",
            "counter",
            "Tokens decoded in colibri_decode_seconds_total (their ratio is the decode speed).",
            &mut out,
        );
        for (label, s) in models {
            let v = recorded(&id_of(s)).map(|m| m.decode_tokens).unwrap_or(0);
            let _ = writeln!(
                out,
                "colibri_decode_tokens_total{{model=\"{}\"}} {v}",
                esc(label)
            );
        }
        family(
            "colibri_decode_tokens_per_second",
            "gauge",
            "Decode speed of the last finished generation of two tokens or more.",
            &mut out,
        );
        for (label, s) in models {
            let v = recorded(&id_of(s))
                .map(|m| m.last_decode_tps)
                .unwrap_or(0.0);
            let _ = writeln!(
                out,
                "colibri_decode_tokens_per_second{{model=\"{}\"}} {}",
                esc(label),
                num(v)
            );
        }
        family(
            "colibri_time_to_first_token_seconds",
            "histogram",
            "From a request's arrival to its first generated token.",
            &mut out,
        );
        for (label, s) in models {
            let Some(m) = recorded(&id_of(s)) else {
                continue;
            };
            let l = esc(label);
            for (n, le) in m.ttft_buckets.iter().zip(TTFT_BUCKETS) {
                let _ = writeln!(
                    out,
                    "colibri_time_to_first_token_seconds_bucket{{model=\"{l}\",le=\"{le}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "colibri_time_to_first_token_seconds_bucket{{model=\"{l}\",le=\"+Inf\"}} {}",
                m.ttft_count
            );
            let _ = writeln!(
                out,
                "colibri_time_to_first_token_seconds_sum{{model=\"{l}\"}} {}",
                num(m.ttft_sum)
            );
            let _ = writeln!(
                out,
                "colibri_time_to_first_token_seconds_count{{model=\"{l}\"}} {}",
                m.ttft_count
            );
        }
        out
    }
}

fn cache(s: &pb::ModelStatus) -> pb::ExpertCacheStats {
    s.expert_cache.clone().unwrap_or_default()
}

/// A label value with `\`, `"` and newlines escaped as the text format requires.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample value: integers without a fraction, NaN and infinities spelled as Prometheus
/// spells them.
fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        let fin = |ttft_ms: f64| pb::generate_event::Finished {
            reason: pb::FinishReason::Eos as i32,
            stats: Some(pb::GenerationStats {
                generated_tokens: 3,
                time_to_first_token_ms: ttft_ms,
                decode_tokens_per_second: 20.0,
                ..Default::default()
            }),
            ..Default::default()
        };
        m.generation_finished("/m", &fin(30.0));
        m.generation_finished("/m", &fin(700.0));
        let g = m.inner.lock().unwrap();
        let mm = &g.models["/m"];
        assert_eq!(mm.ttft_count, 2);
        // le=0.05 holds the 30 ms one; le=1 both.
        assert_eq!(mm.ttft_buckets[1], 1);
        assert_eq!(mm.ttft_buckets[5], 2);
        assert_eq!(mm.finished["eos"], 2);
        assert_eq!(mm.decode_tokens, 4);
        assert!((mm.decode_seconds - 0.2).abs() < 1e-9);
        assert_eq!(esc("a\"b\\c"), "a\\\"b\\\\c");
    }
}
