//! Sessions on an engine thread: created, deleted, restored from and saved to snapshots,
//! and everything saved on unload.

use super::rows::{session_info, Outcome, Session};
use super::thread::EngineThread;
use crate::snapshot::{self, SessionMeta, SnapshotError, SnapshotMessage};
use crate::state;
use crate::wire::now_unix_ms;
use colibri_engine::text::ChatMessage;
use colibri_engine::FinishReason;
use colibri_proto::v1 as pb;
use std::time::Instant;
use tonic::Status;

impl EngineThread {
    pub(super) fn create_session(&mut self, id: String) -> Result<pb::SessionInfo, Status> {
        if self.sessions.contains_key(&id) || self.state.session_path(&id).exists() {
            return Err(Status::already_exists(format!(
                "session '{id}' already exists"
            )));
        }
        let now = now_unix_ms();
        let s = Session {
            id: id.clone(),
            tokens: Vec::new(),
            cache: Some(self.model.new_cache()),
            mtp: None,
            cached_len: 0,
            kv_bytes: 0,
            messages: Vec::new(),
            created_ms: now,
            last_used_ms: now,
            last_used: Instant::now(),
            busy: None,
            persisted: false,
        };
        let info = session_info(&self.id, &s);
        self.sessions.insert(id, s);
        Ok(info)
    }

    pub(super) fn delete_session(&mut self, id: &str) -> Result<(), Status> {
        if let Some(s) = self.sessions.get(id) {
            if let Some(r) = &s.busy {
                return Err(Status::failed_precondition(format!(
                    "session '{id}' is generating (request {r}); cancel it first"
                )));
            }
        }
        let live = self.sessions.remove(id).is_some();
        let path = self.state.session_path(id);
        let on_disk = match std::fs::remove_file(&path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(Status::internal(format!("{}: {e}", path.display()))),
        };
        if live || on_disk {
            Ok(())
        } else {
            Err(Status::not_found(format!("no session '{id}'")))
        }
    }

    /// A live session, restored from its snapshot when needed. The bool says whether it
    /// came from disk just now.
    pub(super) fn session(&mut self, id: &str) -> Result<(&mut Session, bool), Status> {
        let mut from_disk = false;
        if !self.sessions.contains_key(id) {
            let path = self.state.session_path(id);
            if !path.exists() {
                return Err(Status::not_found(format!("no session '{id}'")));
            }
            match snapshot::load(&path, &self.id, &self.model.new_cache()) {
                Ok((meta, kv)) => {
                    if meta.vocab_size != self.model.info.vocab_size {
                        return Err(
                            self.damaged(&path, "vocabulary size differs from the model's".into())
                        );
                    }
                    let s = Session {
                        id: id.to_string(),
                        cached_len: kv.len,
                        kv_bytes: kv.size_bytes(),
                        tokens: meta.tokens,
                        cache: Some(kv),
                        mtp: None,
                        messages: meta
                            .messages
                            .into_iter()
                            .map(|m| ChatMessage {
                                role: m.role,
                                content: m.content,
                                ..Default::default()
                            })
                            .collect(),
                        created_ms: meta.created_unix_ms,
                        last_used_ms: meta.last_used_unix_ms,
                        last_used: Instant::now(),
                        busy: None,
                        persisted: true,
                    };
                    tracing::info!(
                        "session {id}: restored {} cached positions from {}",
                        s.cached_len,
                        path.display()
                    );
                    self.sessions.insert(id.to_string(), s);
                    from_disk = true;
                }
                Err(SnapshotError::Damaged(msg)) => return Err(self.damaged(&path, msg)),
                Err(SnapshotError::Io(e)) => {
                    return Err(Status::unavailable(format!("{}: {e}", path.display())))
                }
            }
        }
        Ok((
            self.sessions.get_mut(id).expect("inserted above"),
            from_disk,
        ))
    }

    /// Sets a damaged snapshot aside and describes it for the client.
    pub(super) fn damaged(&self, path: &std::path::Path, msg: String) -> Status {
        let aside = state::set_aside(path)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|e| format!("(could not move it aside: {e})"));
        tracing::warn!("{}: {msg}; moved to {aside}", path.display());
        Status::data_loss(format!(
            "the snapshot of this session is damaged ({msg}); it was moved aside to {aside}"
        ))
    }

    pub(super) fn save_session(&mut self, id: &str) {
        let Some(s) = self.sessions.get_mut(id) else {
            return;
        };
        let Some(cache) = &s.cache else { return };
        let meta = SessionMeta {
            id: s.id.clone(),
            model: self.id.clone(),
            model_type: self.model.info.model_type.clone(),
            vocab_size: self.model.info.vocab_size,
            created_unix_ms: s.created_ms,
            last_used_unix_ms: s.last_used_ms,
            tokens: s.tokens.clone(),
            messages: s
                .messages
                .iter()
                .map(|m| SnapshotMessage {
                    role: m.role.clone(),
                    content: m.content.clone(),
                })
                .collect(),
        };
        let path = self.state.session_path(id);
        let t = Instant::now();
        match snapshot::save(&path, &meta, cache) {
            Ok(()) => {
                s.persisted = true;
                tracing::info!(
                    "session {id}: saved {} positions ({} bytes of KV) in {:.1} ms",
                    cache.len,
                    cache.size_bytes(),
                    t.elapsed().as_secs_f64() * 1e3
                );
            }
            Err(e) => tracing::error!("session {id}: cannot save {}: {e}", path.display()),
        }
    }

    pub(super) fn save_idle_sessions(&mut self) {
        let due: Vec<String> = self
            .sessions
            .values()
            .filter(|s| {
                !s.persisted
                    && s.busy.is_none()
                    && s.last_used.elapsed() >= self.cfg.session_save_after
            })
            .map(|s| s.id.clone())
            .collect();
        for id in due {
            self.save_session(&id);
        }
    }

    /// Cancels every row, saves sessions and pins.
    pub(super) fn unload(&mut self) -> pb::UnloadModelResponse {
        for row in std::mem::take(&mut self.active)
            .into_iter()
            .chain(std::mem::take(&mut self.waiting))
        {
            self.finish_row(row, Outcome::Finished(FinishReason::Cancelled));
        }
        let ids: Vec<String> = self.sessions.keys().cloned().collect();
        let mut saved = 0;
        for id in &ids {
            if !self.sessions[id].persisted {
                self.save_session(id);
            }
            if self.sessions[id].persisted {
                saved += 1;
            }
        }
        // The usage history feeds the next start's preload and pins.
        if let Some(s) = colibri_engine::experts::stream::streaming_of(&self.model.net) {
            if let Err(e) = s.save_histogram() {
                tracing::error!(
                    "model {}: cannot save the expert usage history: {e}",
                    self.id
                );
            }
        }
        let pins: Vec<(u32, u32)> = self
            .shared
            .pins
            .lock()
            .expect("pins lock")
            .iter()
            .copied()
            .collect();
        if let Err(e) = self.state.save_pins(&self.id, &pins) {
            tracing::error!("model {}: cannot save pins: {e}", self.id);
        }
        self.publish();
        pb::UnloadModelResponse {
            model: self.id.clone(),
            sessions_saved: saved,
        }
    }
}
