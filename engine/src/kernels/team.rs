//! The thread team that runs the kernels' parallel loops.
//!
//! A decode step runs a few hundred small products (every expert's three matrices, q/k/v/o,
//! the router, ...), tens of microseconds each, so what a parallel loop costs to start and
//! to join matters. The team keeps its threads alive: a loop is published with one atomic
//! store, the threads that are already waiting (spinning briefly, then parked) pick tasks
//! from a shared counter, and the caller works too and spins until the last task is done.
//! Nothing is allocated per loop.
//!
//! One team per thread count, made on first use: a caller inside `ThreadPool::install` (as
//! `coli bench --threads N` does) gets a team of that pool's size. A loop started from
//! inside a team task, or while the team is busy with another caller's loop (experts run
//! side by side on rayon in a prefill), runs on rayon instead, which nests without
//! oversubscribing the cores. `COLIBRI_TEAM=rayon` sends every loop to rayon (for
//! comparison).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// Threads of the current pool.
pub fn threads() -> usize {
    rayon::current_num_threads().max(1)
}

thread_local! {
    /// Set while this thread runs a team task (a nested loop then goes to rayon).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f(0..n)`, in parallel when `n > 1`.
pub fn par_for(n: usize, f: &(dyn Fn(usize) + Sync)) {
    match n {
        0 => {}
        1 => f(0),
        _ => {
            let t = threads();
            if t > 1 && use_team() && !IN_TASK.with(|c| c.get()) {
                if let Some(team) = team_for(t) {
                    if team.try_run(n, f) {
                        return;
                    }
                }
            }
            use rayon::prelude::*;
            (0..n).into_par_iter().with_max_len(1).for_each(f);
        }
    }
}

/// A pointer into memory that the tasks of one parallel loop write at disjoint places
/// (each task its own rows or chunks), so it may be shared with them. Read it with
/// [`SharedMut::ptr`]: a closure that names the field captures the bare pointer, which is
/// not `Sync`.
#[derive(Clone, Copy)]
pub struct SharedMut<T>(*mut T);

// SAFETY: only a pointer; whoever writes through it keeps the writes of different tasks
// disjoint (see each use).
unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub fn new(data: &mut [T]) -> Self {
        SharedMut(data.as_mut_ptr())
    }
    pub fn ptr(&self) -> *mut T {
        self.0
    }
}

/// `f(i, chunk)` for every `chunk`-element piece of `data` (the last may be shorter), on the
/// team like [`par_for`]. Decode's per-layer loops outside the matmuls (attention over the
/// cache) run here rather than on rayon: the team's threads spin for a while after each
/// loop, and a rayon loop started meanwhile would share the cores with them.
pub fn par_chunks_mut<T: Send>(data: &mut [T], chunk: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    let chunk = chunk.max(1);
    let (len, n) = (data.len(), data.len().div_ceil(chunk));
    let base = SharedMut::new(data);
    par_for(n, &|i| {
        let start = i * chunk;
        let end = (start + chunk).min(len);
        // SAFETY: chunks `i` are disjoint and inside `data`, which outlives the loop.
        let piece = unsafe { std::slice::from_raw_parts_mut(base.ptr().add(start), end - start) };
        f(i, piece)
    });
}

fn use_team() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("COLIBRI_TEAM").map_or(true, |v| v != "rayon"))
}

/// The team of `t` threads (the caller plus `t - 1` workers), made on first use.
fn team_for(t: usize) -> Option<Arc<Team>> {
    static TEAMS: Mutex<Vec<Arc<Team>>> = Mutex::new(Vec::new());
    let mut teams = TEAMS.lock().ok()?;
    if let Some(team) = teams.iter().find(|x| x.size == t) {
        return Some(team.clone());
    }
    let team = Team::new(t)?;
    teams.push(team.clone());
    Some(team)
}

/// A published loop: the closure (lifetime erased; the caller waits for every task before
/// returning, so it outlives every use) and its task count.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    n: usize,
}

struct Team {
    size: usize,
    /// Held by the caller whose loop is running.
    busy: AtomicBool,
    /// Bumped when a loop is published; workers wait for it to change.
    epoch: AtomicU64,
    job: Mutex<Option<Job>>,
    /// Next task to take, and tasks finished, of the current loop.
    next: AtomicUsize,
    done: AtomicUsize,
    /// Workers that are executing the current loop (the caller waits for them to leave
    /// before the loop's closure goes away).
    active: AtomicUsize,
    /// A task of the current loop panicked on a worker.
    panicked: AtomicBool,
    /// Parked workers wait here for the next epoch.
    park: Mutex<()>,
    wake: Condvar,
    sleepers: AtomicUsize,
}

// SAFETY: `Job::f` points to a `Sync` closure that is only called while its caller waits in
// `try_run`; everything else is atomics and locks.
unsafe impl Send for Team {}
unsafe impl Sync for Team {}

/// How long a worker spins for the next loop before parking (decode issues one every few
/// tens of microseconds; parking costs a futex wake of about as much).
const SPIN: std::time::Duration = std::time::Duration::from_micros(200);

impl Team {
    fn new(size: usize) -> Option<Arc<Team>> {
        let team = Arc::new(Team {
            size,
            busy: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            job: Mutex::new(None),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            park: Mutex::new(()),
            wake: Condvar::new(),
            sleepers: AtomicUsize::new(0),
        });
        for i in 1..size {
            let t = team.clone();
            std::thread::Builder::new()
                .name(format!("colibri-team-{i}"))
                .spawn(move || t.worker())
                .ok()?;
        }
        Some(team)
    }

    /// Runs the loop on the team, or returns `false` when the team is busy.
    fn try_run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        // SAFETY (lifetime erasure): this function does not return before every task has
        // run and every worker has left the loop (`active == 0`), so `f` outlives its uses.
        let f: *const (dyn Fn(usize) + Sync) = unsafe {
            std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f)
        };
        {
            // Counters reset under the job's lock: a worker that reads this job sees them.
            let mut job = self.job.lock().unwrap_or_else(|e| e.into_inner());
            self.next.store(0, Ordering::Relaxed);
            self.done.store(0, Ordering::Relaxed);
            *job = Some(Job { f, n });
        }
        // SeqCst on both sides (here: bump, then read sleepers; a worker: count itself,
        // then read the epoch) so a worker going to sleep cannot miss this loop.
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.park.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
        // The caller works too; a panicking task is counted as done (so the loop
        // completes) and re-raised once every task has finished.
        IN_TASK.with(|c| c.set(true));
        let mut result = Ok(());
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            // SAFETY: `f` is alive (see above).
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*f)(i) }));
            if r.is_err() && result.is_ok() {
                result = r;
            }
            self.done.fetch_add(1, Ordering::Release);
        }
        IN_TASK.with(|c| c.set(false));
        while self.done.load(Ordering::Acquire) < n || self.active.load(Ordering::Acquire) > 0 {
            std::hint::spin_loop();
        }
        *self.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let worker_panicked = self.panicked.swap(false, Ordering::AcqRel);
        self.busy.store(false, Ordering::Release);
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
        if worker_panicked {
            panic!("a kernel task panicked on a team thread");
        }
        true
    }

    fn worker(&self) {
        let mut seen = self.epoch.load(Ordering::Acquire);
        loop {
            // Wait for a new loop: spin a little, then park.
            let start = std::time::Instant::now();
            let mut spins = 0u32;
            while self.epoch.load(Ordering::Acquire) == seen {
                spins += 1;
                if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                    let g = self.park.lock().unwrap_or_else(|e| e.into_inner());
                    self.sleepers.fetch_add(1, Ordering::SeqCst);
                    let g = self
                        .wake
                        .wait_while(g, |_| self.epoch.load(Ordering::SeqCst) == seen)
                        .unwrap_or_else(|e| e.into_inner());
                    self.sleepers.fetch_sub(1, Ordering::AcqRel);
                    drop(g);
                    break;
                }
                std::hint::spin_loop();
            }
            seen = self.epoch.load(Ordering::Acquire);
            self.active.fetch_add(1, Ordering::AcqRel);
            let job = *self.job.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(job) = job {
                IN_TASK.with(|c| c.set(true));
                loop {
                    let i = self.next.fetch_add(1, Ordering::Relaxed);
                    if i >= job.n {
                        break;
                    }
                    // SAFETY: the caller waits for `active == 0`, so the closure is alive.
                    // A panic is caught and re-raised on the caller's thread.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                        (*job.f)(i)
                    }));
                    if r.is_err() {
                        self.panicked.store(true, Ordering::Release);
                    }
                    self.done.fetch_add(1, Ordering::Release);
                }
                IN_TASK.with(|c| c.set(false));
            }
            self.active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn pool(t: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .unwrap()
    }

    #[test]
    fn every_task_runs_once_many_times_over() {
        pool(3).install(|| {
            for n in [2usize, 3, 7, 64, 1000] {
                for _ in 0..50 {
                    let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                    par_for(n, &|i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    });
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{n}");
                }
            }
        });
    }

    #[test]
    fn nested_and_concurrent_loops_complete() {
        pool(2).install(|| {
            let total = AtomicUsize::new(0);
            // Loops from several rayon workers at once (the team serves one, rayon the
            // others), each with a nested loop inside its tasks.
            use rayon::prelude::*;
            (0..8).into_par_iter().for_each(|_| {
                par_for(5, &|_| {
                    par_for(3, &|_| {
                        total.fetch_add(1, Ordering::Relaxed);
                    });
                });
            });
            assert_eq!(total.load(Ordering::Relaxed), 8 * 5 * 3);
        });
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_team_survives() {
        pool(2).install(|| {
            for _ in 0..5 {
                let r = std::panic::catch_unwind(|| {
                    par_for(16, &|i| {
                        if i == 11 {
                            panic!("task 11");
                        }
                    })
                });
                assert!(r.is_err());
            }
            let count = AtomicUsize::new(0);
            par_for(16, &|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(count.load(Ordering::Relaxed), 16);
        });
    }
}
