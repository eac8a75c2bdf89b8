//! The reader threads: take a job off the queues, read its groups (direct, or buffered then
//! dropped from the page cache), hand the buffer to its waiters and the cache.

use super::direct_io::{drop_cached, read_fully, EINVAL};
use super::reads::{align_down, align_up, ReadGroup};
use super::shared::{lock, DiskFile, ReadResult, Shared, Slot};
use crate::experts::buf::{AlignedBuf, ExpertBuf};
use crate::experts::Key;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

pub(super) fn reader_loop(s: &Shared) {
    loop {
        let job = {
            let mut q = lock(&s.jobs);
            loop {
                if q.shutdown {
                    // Nobody will read these; wake anyone still holding a ticket.
                    while let Some(j) = q.pop() {
                        j.pending.complete(Err((
                            PathBuf::new(),
                            std::io::ErrorKind::Interrupted,
                            "the expert store was shut down".into(),
                        )));
                    }
                    return;
                }
                if let Some(j) = q.pop() {
                    break j;
                }
                q = s.jobs_cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        {
            // A speculative read whose entry was evicted before it started, and that nobody
            // waits for, is skipped. (Tickets are only handed out under the state lock.)
            let st = lock(&s.state);
            let live = matches!(st.slots.get(&job.key), Some(Slot::Loading(p)) if Arc::ptr_eq(p, &job.pending));
            if !live && Arc::strong_count(&job.pending) == 1 {
                continue;
            }
        }
        let r: ReadResult = s.read(job.key).map(|(buf, bytes)| {
            if job.preload {
                s.c.preload_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            Arc::new(buf)
        });
        {
            // The cache first, then the waiters: whoever wakes up sees the final state.
            let mut st = lock(&s.state);
            let live = matches!(st.slots.get(&job.key), Some(Slot::Loading(p)) if Arc::ptr_eq(p, &job.pending));
            if live {
                match &r {
                    Ok(buf) => {
                        st.resident_bytes += buf.size_bytes() as u64;
                        *st.slots.get_mut(&job.key).expect("live") = Slot::Ready(buf.clone());
                    }
                    Err(_) => {
                        st.slots.remove(&job.key);
                        st.book.remove(job.key);
                    }
                }
            }
        }
        job.pending.complete(r);
    }
}

impl Shared {
    pub(super) fn read(
        &self,
        key: Key,
    ) -> std::result::Result<(ExpertBuf, u64), (PathBuf, std::io::ErrorKind, String)> {
        let plan = self.plans[key.layer as usize][key.expert as usize]
            .as_ref()
            .expect("keys are checked before they are queued");
        let fail = |path: &Path, e: std::io::Error| {
            self.c.read_errors.fetch_add(1, Ordering::Relaxed);
            (
                path.to_path_buf(),
                e.kind(),
                format!("reading routed expert {key}: {e}"),
            )
        };
        let mut buf = AlignedBuf::new(plan.len).map_err(|e| fail(Path::new("expert buffer"), e))?;
        self.busy_start();
        let t0 = Instant::now();
        let mut result = Ok(());
        let mut bytes = 0;
        for g in &plan.groups {
            let f = &self.files[g.file];
            match self.read_group(f, g, &mut buf) {
                Ok(n) => bytes += n,
                Err(e) => {
                    result = Err(fail(&f.path, e));
                    break;
                }
            }
        }
        self.c
            .read_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.busy_end();
        result?;
        self.c.reads.fetch_add(1, Ordering::Relaxed);
        Ok((
            ExpertBuf {
                buf,
                parts: plan.parts.clone(),
            },
            bytes,
        ))
    }

    /// Reads one group; returns the bytes read from the file.
    pub(super) fn read_group(
        &self,
        f: &DiskFile,
        g: &ReadGroup,
        buf: &mut AlignedBuf,
    ) -> std::io::Result<u64> {
        let a0 = align_down(g.start);
        let a1 = align_up(g.end);
        if let Some(d) = f
            .direct
            .as_ref()
            .filter(|_| f.direct_ok.load(Ordering::Relaxed))
        {
            let dst = &mut buf.as_mut_full()[g.buf_off..g.buf_off + (a1 - a0) as usize];
            match read_fully(d, dst, a0, (g.end - a0) as usize) {
                Ok(()) => {
                    self.c.direct_reads.fetch_add(1, Ordering::Relaxed);
                    self.c.bytes_read.fetch_add(a1 - a0, Ordering::Relaxed);
                    return Ok(a1 - a0);
                }
                Err(e) if e.raw_os_error() == Some(EINVAL) => {
                    f.direct_ok.store(false, Ordering::Relaxed);
                    lock(&self.notes).push(format!(
                        "{}: direct reads refused ({e}); using buffered reads with page-cache eviction",
                        f.path.display()
                    ));
                }
                Err(e) => return Err(e),
            }
        }
        let off = g.buf_off + (g.start - a0) as usize;
        let n = (g.end - g.start) as usize;
        read_fully(
            &f.buffered,
            &mut buf.as_mut_full()[off..off + n],
            g.start,
            n,
        )?;
        drop_cached(&f.buffered, g.start, n as u64);
        self.c.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n as u64)
    }

    pub(super) fn busy_start(&self) {
        let mut b = lock(&self.busy);
        if b.active == 0 {
            b.since = Some(Instant::now());
        }
        b.active += 1;
    }

    pub(super) fn busy_end(&self) {
        let mut b = lock(&self.busy);
        b.active -= 1;
        if b.active == 0 {
            if let Some(t) = b.since.take() {
                b.ns += t.elapsed().as_nanos() as u64;
            }
        }
    }
}
