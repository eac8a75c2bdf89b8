//! A JSON value read character by character, as a model writes it: the syntaxes that put
//! JSON in a call (Qwen's object, DeepSeek's arguments) stream it as it arrives and need to
//! know where it ends.

/// One JSON value read character by character; reports when it is complete.
#[derive(Default)]
pub(crate) struct JsonValue {
    pub raw: String,
    pub started: bool,
    pub done: bool,
    depth: u32,
    in_str: bool,
    esc: bool,
    /// A number / true / false / null.
    scalar: bool,
}

impl JsonValue {
    /// Feeds one character; returns whether it belongs to the value (a scalar ends at the
    /// first character that cannot continue it, which is not consumed).
    pub fn feed(&mut self, c: char) -> bool {
        if self.done {
            return false;
        }
        if !self.started {
            if c.is_whitespace() {
                return false;
            }
            self.started = true;
            match c {
                '{' | '[' => self.depth = 1,
                '"' => self.in_str = true,
                _ => self.scalar = true,
            }
            self.raw.push(c);
            return true;
        }
        if self.scalar {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '.') {
                self.raw.push(c);
                return true;
            }
            self.done = true;
            return false;
        }
        self.raw.push(c);
        if self.in_str {
            if self.esc {
                self.esc = false;
            } else if c == '\\' {
                self.esc = true;
            } else if c == '"' {
                self.in_str = false;
                if self.depth == 0 {
                    self.done = true;
                }
            }
            return true;
        }
        match c {
            '"' => self.in_str = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.done = true;
                }
            }
            _ => {}
        }
        true
    }

    /// A container or string value: streaming its characters is safe.
    pub fn is_container(&self) -> bool {
        self.started && !self.scalar && self.raw.starts_with(['{', '['])
    }
}
