//! Stop strings over streamed text.

/// Holds back the longest tail of the text that could still grow into a stop string, and cuts
/// the output at the earliest full match of any stop string, including matches that span
/// several deltas. The stop string itself is not emitted.
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
    /// The stop string that matched (the earliest in the text).
    matched: Option<String>,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would match before any text).
    pub fn new(stops: Vec<String>) -> Self {
        let mut stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        stops.sort();
        stops.dedup();
        StopMatcher {
            stops,
            held: String::new(),
            stopped: false,
            matched: None,
        }
    }

    /// Feeds a text delta; returns (text safe to emit now, whether a stop string matched).
    /// After a match, further input is ignored.
    pub fn push(&mut self, delta: &str) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        if self.stops.is_empty() {
            return (delta.to_string(), false);
        }
        self.held.push_str(delta);
        // `held` had no full match before this delta, and every possible match start was held
        // back, so searching `held` finds the earliest match of the whole stream.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, stop)) = first {
            self.matched = Some(stop.clone());
            self.held.truncate(at);
            self.stopped = true;
            return (std::mem::take(&mut self.held), true);
        }
        let keep = self.partial_match_len();
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (out, false)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of some stop string.
    fn partial_match_len(&self) -> usize {
        let longest = self.stops.iter().map(|s| s.len()).max().unwrap_or(0);
        let start = self.held.len().saturating_sub(longest.saturating_sub(1));
        let held = &self.held;
        (start..held.len())
            .filter(|&i| held.is_char_boundary(i))
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&held[i..])))
            .map(|i| held.len() - i)
            .unwrap_or(0)
    }

    /// The stop string that ended the text, once one matched (the APIs report it).
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Whatever is still held back, at the end of generation (nothing after a match).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], deltas: &[&str]) -> (Vec<String>, bool, String) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut outs = Vec::new();
        let mut hit = false;
        for d in deltas {
            let (o, s) = m.push(d);
            outs.push(o);
            if s {
                hit = true;
                break;
            }
        }
        (outs, hit, m.finish())
    }

    #[test]
    fn match_spanning_deltas() {
        let (outs, hit, rest) = run(&["</end>"], &["Hello </", "en", "d> more"]);
        assert_eq!(outs, vec!["Hello ", "", ""]);
        assert!(hit);
        assert_eq!(rest, "");
    }

    #[test]
    fn false_start_is_released() {
        let (outs, hit, rest) = run(&["STOP"], &["ab ST", "OX ", "S"]);
        assert_eq!(outs, vec!["ab ", "STOX ", ""]);
        assert!(!hit);
        assert_eq!(rest, "S");
    }

    #[test]
    fn earliest_match_across_stop_strings() {
        // "bc" starts before "cd" although "cd" is listed first.
        let (outs, hit, _) = run(&["cd", "bc"], &["abcd"]);
        assert_eq!(outs, vec!["a"]);
        assert!(hit);
        let mut m = StopMatcher::new(vec!["cd".into(), "bc".into()]);
        assert_eq!(m.matched(), None);
        m.push("abcd");
        assert_eq!(m.matched(), Some("bc"));
        // Overlapping partials: the longer-held candidate must not hide a shorter full match.
        let (outs, hit, _) = run(&["xxy", "xz"], &["axx", "z"]);
        assert_eq!(outs, vec!["a", "x"]);
        assert!(hit);
    }

    #[test]
    fn multibyte_stop_and_text() {
        let (outs, hit, _) = run(&["日本"], &["café 日", "本語"]);
        assert_eq!(outs, vec!["café ", ""]);
        assert!(hit);
        let (outs, hit, rest) = run(&["🙂!"], &["ok 🙂", "?"]);
        assert_eq!(outs, vec!["ok ", "🙂?"]);
        assert!(!hit);
        assert_eq!(rest, "");
    }

    #[test]
    fn no_stops_passes_through_and_empty_ignored() {
        let (outs, hit, rest) = run(&["", ""], &["a", "b"]);
        assert_eq!(outs, vec!["a", "b"]);
        assert!(!hit);
        assert_eq!(rest, "");
        let mut m = StopMatcher::new(vec!["x".into()]);
        assert_eq!(m.push("ax"), ("a".to_string(), true));
        assert_eq!(m.push("more"), (String::new(), true));
        assert_eq!(m.finish(), "");
    }
}
