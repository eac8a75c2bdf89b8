//! `coli plan`: where a model's bytes would go on this machine — the resident part, the
//! routed experts, the memory available (MemAvailable, or the memory cgroup's room when it
//! is smaller), whether the model fits, and the default expert cache budget.

use anyhow::Context;
use clap::Args;
use colibri_engine::experts::stream;
use colibri_engine::Model;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Model folder (Hub checkpoint or colibri container).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Plan with this expert cache budget in MiB instead of the default.
    #[arg(long, value_name = "MB")]
    pub expert_cache: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn plan(a: PlanArgs) -> anyhow::Result<()> {
    // Loading maps the files and validates every tensor; nothing is read into RAM.
    let model = Model::load(&a.model).with_context(|| format!("loading {}", a.model.display()))?;
    let p = stream::plan(&model.net, a.expert_cache.map(|mb| mb << 20));
    if a.json {
        return crate::output::print_json(&serde_json::json!({
            "resident_bytes": p.model.resident,
            "expert_bytes": p.model.experts,
            "expert_count": p.model.expert_count,
            "expert_size": p.model.expert_size,
            "mem_available": p.mem.mem_available,
            "cgroup_limit": p.mem.cgroup_limit,
            "cgroup_used": p.mem.cgroup_used,
            "available": p.available(),
            "margin": p.margin,
            "budget": p.budget,
            "budget_requested": p.budget_requested,
            "capacity_experts": p.capacity(),
            "fits_entirely": p.fits_entirely(),
            "runnable": p.refusal().is_none(),
            "refusal": p.refusal(),
            "layout": model.info.layout,
            "weight_classes": model.info.weight_classes,
            "notes": model.info.notes,
        }));
    }
    println!(
        "{}: {} ({})",
        a.model.display(),
        model.info.model_type,
        model.info.layout
    );
    println!("weights by class:");
    for line in colibri_engine::arch::census::summary(&model.info.weight_classes) {
        println!("  {line}");
    }
    for n in &model.info.notes {
        println!("note: {n}");
    }
    println!("{p}");
    if let Some(why) = p.refusal() {
        anyhow::bail!("{why}");
    }
    Ok(())
}
