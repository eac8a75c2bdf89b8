//! Which prefix-cache eviction policy keeps the most prompt tokens out of prefill, on a mix
//! of the two workloads the cache exists for: chat clients resending a growing conversation
//! each turn, and an agent resending a long system prompt with a new task every call.
//!
//!     cargo run --release -p colibri-daemon --example prefix_policy
//!
//! Simulated with the real `PrefixCache` over a stand-in KV (one byte per position), so the
//! budget reads in positions. Prints, per budget and policy, the share of prompt tokens
//! served from the cache.

use colibri_daemon::prefix::{Payload, Policy, PrefixCache};
use colibri_engine::sample::Xoshiro256;

#[derive(Clone)]
struct Positions(usize);

impl Payload for Positions {
    fn bytes(&self) -> usize {
        self.0
    }
    fn prefix(&self, n: usize) -> Self {
        Positions(n)
    }
}

struct Conversation {
    tokens: Vec<u32>,
}

fn main() {
    let policies = [Policy::Lru, Policy::Lfu, Policy::Largest];
    println!("budget (positions) | lru | lfu | largest   (share of prompt tokens reused)");
    for budget in [8_000usize, 16_000, 32_000, 64_000] {
        let mut row = Vec::new();
        for &policy in &policies {
            let mut rng = Xoshiro256::seed_from_u64(
                std::env::var("SEED")
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(42),
            );
            let mut r = |n: u64| (rng.next_u64() % n) as u32;
            let mut cache = PrefixCache::new(budget, policy);
            let mut fresh = 1_000_000u32;
            let mut next = || {
                fresh += 1;
                fresh
            };
            // 3 agent system prompts of 1500-3000 tokens, shared by every call of that agent.
            let systems: Vec<Vec<u32>> = (0..3)
                .map(|_| (0..1500 + r(1500)).map(|_| next()).collect())
                .collect();
            let mut convs: Vec<Conversation> = Vec::new();
            let (mut total, mut reused) = (0u64, 0u64);
            for _ in 0..3000 {
                let kind = r(100);
                let prompt = if kind < 45 {
                    // An agent call: its system prompt plus a new task.
                    let s = &systems[(r(100) as usize * r(100) as usize / 3300).min(2)];
                    let mut p = s.clone();
                    p.extend((0..100 + r(400)).map(|_| next()));
                    p
                } else {
                    // A chat turn: a new conversation sometimes, else a recent one continues
                    // (users come back to recent chats more than to old ones).
                    if convs.is_empty() || r(100) < 12 {
                        convs.push(Conversation {
                            tokens: (0..50 + r(300)).map(|_| next()).collect(),
                        });
                    }
                    let back = (r(8) * r(8) / 7) as usize;
                    let i = convs.len() - 1 - back.min(convs.len() - 1);
                    let c = &mut convs[i];
                    if c.tokens.len() > 6000 {
                        c.tokens.truncate(400);
                    }
                    c.tokens.extend((0..30 + r(200)).map(|_| next()));
                    c.tokens.clone()
                };
                total += prompt.len() as u64;
                let hit = cache.lookup(&prompt).map(|(_, n)| n).unwrap_or(0);
                reused += hit as u64;
                // The reply is generated and the whole sequence cached.
                let mut seq = prompt;
                let reply: Vec<u32> = (0..20 + r(300)).map(|_| next()).collect();
                seq.extend(&reply);
                if kind >= 45 {
                    let i = convs
                        .iter()
                        .position(|c| seq.starts_with(&c.tokens))
                        .expect("the conversation");
                    convs[i].tokens.extend(reply);
                }
                let n = seq.len();
                cache.insert(seq, Positions(n));
            }
            row.push(reused as f64 / total as f64);
        }
        println!(
            "{budget:>18} | {:.3} | {:.3} | {:.3}",
            row[0], row[1], row[2]
        );
    }
}
