//! Model names as the HTTP API shows them: the folder's name (`olmoe` for
//! `/models/olmoe`), lengthened with parent folders only where two loaded models would
//! otherwise share it (`a/olmoe`, `b/olmoe`). A request may name a model by that name or by
//! its full path (the canonical id the gRPC API uses).

use crate::daemon::{Daemon, ModelHandle};
use std::sync::Arc;

/// (name, canonical id) of every id, names unique among them, in the ids' order.
pub fn names(ids: &[String]) -> Vec<(String, String)> {
    let parts: Vec<Vec<&str>> = ids
        .iter()
        .map(|id| id.split(['/', '\\']).filter(|p| !p.is_empty()).collect())
        .collect();
    // Shortest suffix of path components that no other id ends with.
    let suffix = |p: &[&str], n: usize| p[p.len().saturating_sub(n)..].join("/");
    ids.iter()
        .zip(&parts)
        .enumerate()
        .map(|(i, (id, p))| {
            let mut n = 1;
            while n < p.len()
                && parts
                    .iter()
                    .enumerate()
                    .any(|(j, q)| j != i && suffix(q, n) == suffix(p, n))
            {
                n += 1;
            }
            let name = if p.is_empty() {
                id.clone()
            } else {
                suffix(p, n)
            };
            (name, id.clone())
        })
        .collect()
}

/// The loaded models with their API names.
pub fn listed(daemon: &Daemon) -> Vec<(String, Arc<ModelHandle>)> {
    let models = daemon.ready_models();
    let ids: Vec<String> = models.iter().map(|h| h.id.clone()).collect();
    names(&ids)
        .into_iter()
        .zip(models)
        .map(|((name, _), h)| (name, h))
        .collect()
}

/// The loaded model a request names: by API name, by canonical id, or by a path that
/// canonicalizes to a loaded model's id. Only loaded models: HTTP never loads one.
pub fn find(daemon: &Daemon, requested: &str) -> Option<(String, Arc<ModelHandle>)> {
    let listed = listed(daemon);
    if let Some(found) = listed
        .iter()
        .find(|(name, h)| name == requested || h.id == requested)
    {
        return Some(found.clone());
    }
    // A path given another way (relative, through a link): only when it exists.
    let canonical = std::fs::canonicalize(requested).ok()?;
    let canonical = canonical.to_string_lossy();
    listed.into_iter().find(|(_, h)| h.id == canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_folder_names_made_unique() {
        let ids: Vec<String> = ["/m/a/olmoe", "/m/b/olmoe", "/m/qwen3", "/x/a/olmoe2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let n: Vec<String> = names(&ids).into_iter().map(|(n, _)| n).collect();
        assert_eq!(n, ["a/olmoe", "b/olmoe", "qwen3", "olmoe2"]);
        // Identical trailing paths all the way: the whole path.
        let ids = vec!["/a/m".to_string(), "/b/a/m".to_string()];
        let n: Vec<String> = names(&ids).into_iter().map(|(n, _)| n).collect();
        assert_eq!(n, ["a/m", "b/a/m"]);
        assert_eq!(names(&["/".to_string()])[0].0, "/");
    }
}
