//! Where a model's bytes go: the resident part, the routed experts, the memory this process
//! may use (MemAvailable, and the memory cgroup's limit when one is set: a limit counts the
//! page cache and /proc/meminfo does not know about it), and the expert cache budget that
//! follows. Printed by `coli plan`; a model whose resident part does not fit is refused with
//! this plan as the error.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Memory as the system and the cgroup see it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemInfo {
    pub mem_total: u64,
    pub mem_available: u64,
    /// The effective cgroup limit (the smallest along the hierarchy), if any.
    pub cgroup_limit: Option<u64>,
    /// The cgroup's usage, less its reclaimable file cache.
    pub cgroup_used: Option<u64>,
    pub cgroup_path: Option<PathBuf>,
}

impl MemInfo {
    /// Bytes this process may still take: MemAvailable, or the room left under the cgroup
    /// limit when that is smaller.
    pub fn available(&self) -> u64 {
        match (self.cgroup_limit, self.cgroup_used) {
            (Some(l), Some(u)) => self.mem_available.min(l.saturating_sub(u)),
            (Some(l), None) => self.mem_available.min(l),
            _ => self.mem_available,
        }
    }

    /// Reads /proc/meminfo and the memory cgroup (v1 or v2) of this process. Fields that
    /// cannot be read are left empty (other platforms: zero available, see [`MemoryPlan`]).
    pub fn read() -> MemInfo {
        let mut m = MemInfo::default();
        if let Ok(s) = std::fs::read_to_string("/proc/meminfo") {
            let kb = |key: &str| {
                s.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    .map(|v| v * 1024)
            };
            m.mem_total = kb("MemTotal:").unwrap_or(0);
            m.mem_available = kb("MemAvailable:").unwrap_or(0);
        }
        if let Ok(s) = std::fs::read_to_string("/proc/self/cgroup") {
            if let Some((path, limit, used)) = cgroup_v1(&s).or_else(|| cgroup_v2(&s)) {
                m.cgroup_path = Some(path);
                m.cgroup_limit = limit;
                m.cgroup_used = used;
            }
        }
        m
    }
}

/// Larger than this is "no limit" (cgroup v1 writes PAGE_COUNTER_MAX rounded to pages).
const NO_LIMIT: u64 = 1 << 60;

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn cgroup_v1(proc_cgroup: &str) -> Option<(PathBuf, Option<u64>, Option<u64>)> {
    let rel = proc_cgroup.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctl, path) = (it.next()?, it.next()?, it.next()?);
        ctl.split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    })?;
    let dir = PathBuf::from(format!("/sys/fs/cgroup/memory{rel}"));
    let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    let limit = stat_value(&stat, "hierarchical_memory_limit")
        .or_else(|| read_u64(&dir.join("memory.limit_in_bytes")))
        .filter(|&l| l < NO_LIMIT);
    let usage = read_u64(&dir.join("memory.usage_in_bytes"));
    let inactive = stat_value(&stat, "total_inactive_file").unwrap_or(0);
    Some((dir, limit, usage.map(|u| u.saturating_sub(inactive))))
}

fn cgroup_v2(proc_cgroup: &str) -> Option<(PathBuf, Option<u64>, Option<u64>)> {
    let rel = proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .to_string();
    let root = PathBuf::from("/sys/fs/cgroup");
    let dir = root.join(rel.trim_start_matches('/'));
    if !dir.join("memory.max").exists() {
        return None;
    }
    // The effective limit is the smallest of this group's and its ancestors'.
    let mut limit: Option<u64> = None;
    let mut d = dir.clone();
    while d.starts_with(&root) {
        if let Ok(s) = std::fs::read_to_string(d.join("memory.max")) {
            if let Ok(v) = s.trim().parse::<u64>() {
                limit = Some(limit.map_or(v, |l| l.min(v)));
            }
        }
        if !d.pop() {
            break;
        }
    }
    let usage = read_u64(&dir.join("memory.current"));
    let inactive = std::fs::read_to_string(dir.join("memory.stat"))
        .ok()
        .and_then(|s| stat_value(&s, "inactive_file"))
        .unwrap_or(0);
    Some((dir, limit, usage.map(|u| u.saturating_sub(inactive))))
}

/// The sizes of a model's parts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelBytes {
    /// Attention, norms, routers, embeddings, dense and shared MLPs: always in RAM.
    pub resident: u64,
    /// All routed experts.
    pub experts: u64,
    pub expert_count: usize,
    /// One routed expert as the cache holds it (whole pages).
    pub expert_size: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan {
    pub model: ModelBytes,
    pub mem: MemInfo,
    /// Kept free for activations, KV caches, the runtime and the page cache's own needs.
    pub margin: u64,
    /// The expert cache budget: the one asked for, or the default.
    pub budget: u64,
    pub budget_requested: bool,
}

/// Least memory kept free; a tenth of what is available when that is more, up to 2 GiB.
const MIN_MARGIN: u64 = 256 << 20;
const MAX_MARGIN: u64 = 2 << 30;

impl MemoryPlan {
    /// The plan for `model` with `mem`; `requested` is `--expert-cache` in bytes.
    pub fn new(model: ModelBytes, mem: MemInfo, requested: Option<u64>) -> MemoryPlan {
        let avail = mem.available();
        let margin = (avail / 10).clamp(MIN_MARGIN, MAX_MARGIN);
        let budget = match requested {
            Some(b) => b,
            // Never more than every expert: the rest would sit unused.
            None => avail
                .saturating_sub(model.resident + margin)
                .min(model.experts),
        };
        MemoryPlan {
            model,
            mem,
            margin,
            budget,
            budget_requested: requested.is_some(),
        }
    }

    pub fn available(&self) -> u64 {
        self.mem.available()
    }

    /// The whole model (resident part and every expert) fits with the margin to spare.
    pub fn fits_entirely(&self) -> bool {
        self.model.resident + self.model.experts + self.margin <= self.available()
    }

    /// Experts the budget holds.
    pub fn capacity(&self) -> u64 {
        self.budget.checked_div(self.model.expert_size).unwrap_or(0)
    }

    /// Refuses a model that cannot run here: the resident part with the margin does not fit,
    /// or the requested cache does not fit beside it. The error carries this plan.
    pub fn check(&self) -> Result<()> {
        match self.refusal() {
            None => Ok(()),
            Some(w) => Err(Error::invalid("model", format!("{w}\n{self}"))),
        }
    }

    /// Why this model cannot run here, if it cannot.
    pub fn refusal(&self) -> Option<String> {
        let avail = self.available();
        if self.model.resident + self.margin > avail {
            Some(format!(
                "the resident part alone ({}) and the safety margin ({}) exceed the memory available ({})",
                gib(self.model.resident),
                gib(self.margin),
                gib(avail)
            ))
        } else if self.budget_requested && self.model.resident + self.margin + self.budget > avail {
            Some(format!(
                "the expert cache asked for ({}) does not fit beside the resident part; at most {} would",
                gib(self.budget),
                gib(avail - self.model.resident - self.margin)
            ))
        } else {
            None
        }
    }
}

pub fn gib(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b as f64 / 1024.0)
    }
}

impl std::fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = &self.model;
        writeln!(f, "resident part (dense weights)   {:>12}", gib(m.resident))?;
        writeln!(
            f,
            "routed experts                  {:>12}  ({} experts of {})",
            gib(m.experts),
            m.expert_count,
            gib(m.expert_size)
        )?;
        writeln!(
            f,
            "MemAvailable                    {:>12}",
            gib(self.mem.mem_available)
        )?;
        if let Some(l) = self.mem.cgroup_limit {
            writeln!(
                f,
                "memory cgroup limit             {:>12}  (in use: {})",
                gib(l),
                gib(self.mem.cgroup_used.unwrap_or(0))
            )?;
        }
        writeln!(
            f,
            "available to this process       {:>12}",
            gib(self.available())
        )?;
        writeln!(
            f,
            "safety margin                   {:>12}",
            gib(self.margin)
        )?;
        let cap = self.capacity();
        writeln!(
            f,
            "expert cache budget             {:>12}  ({}; {} experts, {:.0}% of all)",
            gib(self.budget),
            if self.budget_requested {
                "requested"
            } else {
                "default"
            },
            cap,
            if m.expert_count > 0 {
                100.0 * cap.min(m.expert_count as u64) as f64 / m.expert_count as f64
            } else {
                0.0
            }
        )?;
        let verdict = if self.refusal().is_some() {
            "does NOT fit (see above)"
        } else if self.fits_entirely() {
            "fits entirely in RAM (experts are cached as they are first used)"
        } else {
            "fits with experts streamed from disk"
        };
        write!(f, "verdict: {verdict}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn model() -> ModelBytes {
        ModelBytes {
            resident: 450 * MIB,
            experts: 3 * GIB,
            expert_count: 1024,
            expert_size: 3 * MIB,
        }
    }

    fn mem(avail: u64, cg: Option<(u64, u64)>) -> MemInfo {
        MemInfo {
            mem_total: 24 * GIB,
            mem_available: avail,
            cgroup_limit: cg.map(|c| c.0),
            cgroup_used: cg.map(|c| c.1),
            cgroup_path: None,
        }
    }

    #[test]
    fn cgroup_limit_decides_when_smaller() {
        let p = MemoryPlan::new(model(), mem(20 * GIB, Some((2 * GIB, 100 * MIB))), None);
        assert_eq!(p.available(), 2 * GIB - 100 * MIB);
        assert_eq!(p.margin, 256 * MIB);
        assert_eq!(p.budget, 2 * GIB - 100 * MIB - 450 * MIB - 256 * MIB);
        assert!(!p.fits_entirely());
        p.check().unwrap();
        assert_eq!(p.capacity(), p.budget / (3 * MIB));
        let s = p.to_string();
        assert!(
            s.contains("memory cgroup limit") && s.contains("streamed"),
            "{s}"
        );
    }

    #[test]
    fn plenty_of_memory_caps_the_budget_at_all_experts() {
        let p = MemoryPlan::new(model(), mem(20 * GIB, None), None);
        assert_eq!(p.budget, 3 * GIB);
        assert!(p.fits_entirely());
        assert_eq!(p.margin, 2 * GIB);
    }

    #[test]
    fn resident_part_too_big_is_refused_with_the_plan() {
        let p = MemoryPlan::new(model(), mem(600 * MIB, None), None);
        let e = p.check().unwrap_err().to_string();
        assert!(
            e.contains("resident part alone")
                && e.contains("routed experts")
                && e.contains("NOT fit"),
            "{e}"
        );
        // A requested cache that does not fit beside the resident part is refused too.
        let p = MemoryPlan::new(model(), mem(2 * GIB, None), Some(3 * GIB));
        assert!(p.check().unwrap_err().to_string().contains("at most"));
        MemoryPlan::new(model(), mem(2 * GIB, None), Some(GIB))
            .check()
            .unwrap();
    }

    #[test]
    fn reads_this_machine() {
        let m = MemInfo::read();
        if cfg!(target_os = "linux") {
            assert!(m.mem_total > 0 && m.mem_available > 0 && m.available() <= m.mem_available);
        }
    }

    #[test]
    fn parses_cgroup_stat_lines() {
        let stat = "cache 5\nhierarchical_memory_limit 2147483648\ntotal_inactive_file 7\n";
        assert_eq!(stat_value(stat, "hierarchical_memory_limit"), Some(2 << 30));
        assert_eq!(stat_value(stat, "total_inactive_file"), Some(7));
        assert_eq!(stat_value(stat, "inactive_file"), None);
    }
}
