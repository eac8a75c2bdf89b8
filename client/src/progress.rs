//! Progress display on stderr, shown only when stderr is a terminal so that scripts and
//! logs stay clean.

use crate::output::fmt_bytes;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// A spinner with elapsed time for work whose length is unknown (loading a model).
pub fn spinner(msg: impl Into<String>) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg.into());
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

/// In-process loads of checkpoints with more tensor bytes than this show a byte bar; smaller
/// ones load in a moment, and a spinner says enough.
pub const LOAD_BAR_MIN_BYTES: u64 = 1 << 30;

/// Plain progress lines (no terminal) come at most this often, plus the last one.
const LINE_EVERY: Duration = Duration::from_secs(1);

/// A model load's progress on stderr. On a terminal: a spinner that turns into a byte bar
/// with rate and ETA once the load's size is known (and at least `bar_from` bytes).
/// Otherwise: nothing, or with `lines` a plain line now and then (`coli load`, whose whole
/// job is the load, in a log).
pub struct LoadBar {
    pb: ProgressBar,
    label: String,
    bar_from: u64,
    is_bar: bool,
    lines: bool,
    last_line: Option<Instant>,
}

impl LoadBar {
    pub fn new(label: impl Into<String>, bar_from: u64, lines: bool) -> LoadBar {
        let label = label.into();
        LoadBar {
            pb: spinner(format!("loading {label}")),
            label,
            bar_from,
            is_bar: false,
            lines,
            last_line: None,
        }
    }

    /// The load has done `done` of `total` bytes (0 total: not known yet).
    pub fn update(&mut self, done: u64, total: u64, message: &str) {
        if !self.pb.is_hidden() {
            if !self.is_bar && total > 0 && total >= self.bar_from {
                self.is_bar = true;
                self.pb.set_style(
                    ProgressStyle::with_template(
                        "{spinner} {msg:40!} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
            }
            if self.is_bar {
                // A new phase (the copy into RAM, then the layers) counts from 0 again: its
                // rate and ETA start afresh.
                if self.pb.length() != Some(total) || done < self.pb.position() {
                    self.pb.reset();
                }
                self.pb.set_length(total);
                self.pb.set_position(done);
            }
            // The phase first: the field is cut at 40 characters, and a long model path
            // would hide it.
            self.pb.set_message(if message.is_empty() {
                format!("loading {}", self.label)
            } else {
                format!("{message} · {}", self.label)
            });
        } else if self.lines {
            let last = total > 0 && done >= total;
            if last || self.last_line.is_none_or(|t| t.elapsed() >= LINE_EVERY) {
                self.last_line = Some(Instant::now());
                let bytes = if total > 0 {
                    format!(
                        " ({} of {}, {:.0}%)",
                        fmt_bytes(done),
                        fmt_bytes(total),
                        done as f64 * 100.0 / total as f64
                    )
                } else {
                    String::new()
                };
                eprintln!("loading {}: {message}{bytes}", self.label);
            }
        }
    }

    pub fn finish(&self) {
        self.pb.finish_and_clear();
    }
}
