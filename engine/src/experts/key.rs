//! The name of one routed expert, shared by every part of the streaming code.

/// One routed expert: its model layer index and its index within the layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub layer: u32,
    pub expert: u32,
}

impl Key {
    pub fn new(layer: usize, expert: usize) -> Key {
        Key {
            layer: layer as u32,
            expert: expert as u32,
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "L{}/E{}", self.layer, self.expert)
    }
}
