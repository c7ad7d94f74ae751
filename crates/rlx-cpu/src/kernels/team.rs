//! A spinning team of threads for the small parallel loops of a decode
//! step, beside the rayon pool.
//!
//! A decode step of SmolLM2-135M is ~150 parallel dispatches of a few
//! microseconds each (the quantized matmuls and the one-query attention).
//! A rayon fork-join wakes sleeping workers through the kernel and costs
//! several microseconds, more with more threads. A [`Team`] keeps its
//! workers spinning on an epoch counter for a while after each loop (then
//! they park), and every worker takes part in every loop, so that a loop
//! costs a few cache-line transfers: the barrier that llama.cpp's OpenMP
//! threads use.
//!
//! Only the loops of decode-sized work use it: the quantized matmuls of
//! up to [`MAX_ROWS`] activation rows and the one-query attention. Every
//! other loop (GEMMs, fused segments, prefill attention) stays on rayon,
//! since a team spinning beside a busy pool takes its cores.
//!
//! The executor makes a team current on the thread that runs a model
//! ([`with_team`]); [`for_each`] and [`for_each_chunk_mut`] run on it, and
//! fall back to the rayon pool wherever there is no current team, the
//! team is busy (another model's run, or a nested loop), or
//! `RLX_CPU_TEAM=0` turned teams off (A/B runs). Which thread runs a task
//! never changes what it computes: kernels split their work by the shape,
//! not by the thread count, wherever the bits depend on the split.

use rayon::prelude::*;
use std::cell::{RefCell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most activation rows of a matmul whose loop runs on the team: a decode
/// step, or a small batch of them. Longer loops (prefill) pay for a rayon
/// fork-join, and the ops around them run on rayon: a team spinning
/// beside a busy rayon pool took cores from it (SmolLM2 prefill 5-15 %
/// slower on 16 threads of the Xeon, MiniLM bf16 1x128 40 % slower).
pub const MAX_ROWS: usize = 8;

/// How long an idle worker spins before it parks. Long enough to span the
/// serial ops between two loops of a decode step (and the sampling
/// between steps), short enough that an idle model gives its cores back.
const SPIN: Duration = Duration::from_micros(200);

/// Spin iterations between two checks of the clock and two yields.
const SPIN_BATCH: u32 = 64;

/// One cache line per hot counter, so that the workers' check-ins do not
/// slow the epoch reads.
#[repr(align(128))]
struct Line<T>(T);

/// The loop being run: a type-erased `&dyn Fn(usize)` and its task count.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

struct Shared {
    /// Bumped once per loop, after `job`, `next` and `done` are set.
    epoch: Line<AtomicUsize>,
    /// The next task index to take.
    next: Line<AtomicUsize>,
    /// Workers finished with the current epoch.
    done: Line<AtomicUsize>,
    /// Written by the caller only while every worker waits for the next
    /// epoch (all have checked in to `done`), read by the workers only
    /// after they see the epoch that published it.
    job: UnsafeCell<Job>,
    workers: usize,
    parked: AtomicUsize,
    stop: AtomicBool,
    panicked: AtomicBool,
    sleep: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is the only field that is not `Sync` by itself. The caller
// writes it only while no worker reads it (between a worker's check-in and
// the next epoch, see `Team::run`), and the epoch's Release/Acquire orders
// the write before every read. The closure it points to is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the pointer in `job` is only dereferenced under that
// protocol, and the closure it points to is `Sync`.
unsafe impl Send for Shared {}

/// A fixed set of worker threads that run parallel loops with the calling
/// thread. See the module docs.
pub struct Team {
    shared: Arc<Shared>,
    /// Held by the thread running a loop: one loop at a time.
    busy: Mutex<()>,
    handles: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team")
            .field("threads", &self.threads())
            .finish()
    }
}

impl Team {
    /// A team of `threads` threads: the caller of each loop and
    /// `threads - 1` workers. An error if the OS refuses a thread.
    pub fn new(threads: usize) -> std::io::Result<Team> {
        let workers = threads.max(1) - 1;
        let shared = Arc::new(Shared {
            epoch: Line(AtomicUsize::new(0)),
            next: Line(AtomicUsize::new(0)),
            done: Line(AtomicUsize::new(workers)),
            job: UnsafeCell::new(Job {
                f: &|_| {},
                tasks: 0,
            }),
            workers,
            parked: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut handles = Vec::with_capacity(workers);
        for i in 0..workers {
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("rlx-team-{i}"))
                .spawn(move || worker(&s));
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The workers started so far wait for epochs that will
                    // never be counted against them: stop them.
                    stop(&shared, std::mem::take(&mut handles));
                    return Err(e);
                }
            }
        }
        Ok(Team {
            shared,
            busy: Mutex::new(()),
            handles,
        })
    }

    /// Threads that run a loop, the caller included.
    pub fn threads(&self) -> usize {
        self.shared.workers + 1
    }

    /// `f(i)` for every `i < tasks`, spread over the team and the calling
    /// thread; returns when all are done. Runs on the rayon pool instead
    /// when the team is running another loop. A panic in a task is resumed
    /// on the caller once every task has ended.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if tasks <= 1 || self.shared.workers == 0 {
            (0..tasks).for_each(f);
            return;
        }
        let _busy = match self.busy.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                (0..tasks).into_par_iter().for_each(f);
                return;
            }
        };
        let s = &*self.shared;
        // SAFETY: every worker checked in to `done` for the previous epoch
        // (the previous `run` waited for that before returning, and `busy`
        // keeps runs apart), so none reads `job` until the epoch below
        // moves. The lifetime of `f` is erased, but the pointer is only
        // dereferenced by the workers before they check in for this
        // epoch, and this function does not return (nor unwind) before
        // all have.
        unsafe {
            let f: *const (dyn Fn(usize) + Sync + '_) = f;
            *s.job.get() = Job {
                f: std::mem::transmute::<
                    *const (dyn Fn(usize) + Sync + '_),
                    *const (dyn Fn(usize) + Sync + 'static),
                >(f),
                tasks,
            };
        }
        s.next.0.store(0, Ordering::Relaxed);
        s.done.0.store(0, Ordering::Relaxed);
        s.epoch.0.fetch_add(1, Ordering::SeqCst);
        if s.parked.load(Ordering::SeqCst) > 0 {
            let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _in_loop = LoopGuard::enter();
            take_tasks(s, f, tasks)
        }));
        let mut spins = 0u32;
        while s.done.0.load(Ordering::Acquire) < s.workers {
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(SPIN_BATCH * 16) {
                std::thread::yield_now();
            }
        }
        if let Err(payload) = mine {
            std::panic::resume_unwind(payload);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a task of an rlx thread-team loop panicked (its message is above)");
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        stop(&self.shared, std::mem::take(&mut self.handles));
    }
}

fn stop(s: &Shared, handles: Vec<JoinHandle<()>>) {
    s.stop.store(true, Ordering::SeqCst);
    {
        let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
        s.wake.notify_all();
    }
    for h in handles {
        let _ = h.join();
    }
}

/// Take and run tasks until none is left.
fn take_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync), tasks: usize) {
    loop {
        let i = s.next.0.fetch_add(1, Ordering::Relaxed);
        if i >= tasks {
            return;
        }
        f(i);
    }
}

fn worker(s: &Shared) {
    IN_LOOP.with(|f| f.set(true));
    let mut seen = 0usize;
    loop {
        let Some(epoch) = next_epoch(s, seen) else {
            return;
        };
        seen = epoch;
        // SAFETY: the caller wrote `job` before the SeqCst bump of the
        // epoch read (Acquire or stronger) in `next_epoch`, and does not
        // write it again, nor let `job.f` die, before this worker checks
        // in below.
        let job = unsafe { *s.job.get() };
        let f = unsafe { &*job.f };
        let ran =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| take_tasks(s, f, job.tasks)));
        if ran.is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.done.0.fetch_add(1, Ordering::Release);
    }
}

/// Wait for an epoch other than `seen`: spin for [`SPIN`], then park.
/// `None` once the team stops.
fn next_epoch(s: &Shared, seen: usize) -> Option<usize> {
    let start = Instant::now();
    loop {
        for _ in 0..SPIN_BATCH {
            let e = s.epoch.0.load(Ordering::Acquire);
            if e != seen {
                return Some(e);
            }
            std::hint::spin_loop();
        }
        if s.stop.load(Ordering::Relaxed) {
            return None;
        }
        if start.elapsed() > SPIN {
            break;
        }
        // Other runnable threads (a loaded machine, tests in parallel)
        // get the core between batches.
        std::thread::yield_now();
    }
    let mut g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
    s.parked.fetch_add(1, Ordering::SeqCst);
    loop {
        let e = s.epoch.0.load(Ordering::SeqCst);
        let stopped = s.stop.load(Ordering::SeqCst);
        if e != seen || stopped {
            s.parked.fetch_sub(1, Ordering::SeqCst);
            return if stopped { None } else { Some(e) };
        }
        g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
    }
}

thread_local! {
    /// The team of the model running on this thread ([`with_team`]).
    static CURRENT: RefCell<Option<Arc<Team>>> = const { RefCell::new(None) };
    /// Set on a team's workers, and on a caller while its loop runs: a
    /// loop started from a task runs serially, since every thread of the
    /// team is busy with the outer loop.
    static IN_LOOP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Clears [`IN_LOOP`] when a caller's loop ends, also on unwind.
struct LoopGuard;
impl LoopGuard {
    fn enter() -> LoopGuard {
        IN_LOOP.with(|f| f.set(true));
        LoopGuard
    }
}
impl Drop for LoopGuard {
    fn drop(&mut self) {
        IN_LOOP.with(|f| f.set(false));
    }
}

/// Whether `RLX_CPU_TEAM=0` turned teams off (A/B runs): loops then run
/// on the rayon pool.
pub fn teams_disabled() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("RLX_CPU_TEAM").is_ok_and(|v| v.trim() == "0"))
}

/// The process-wide team of `threads` threads: the one a live model
/// already holds, or a new one. `None` for one thread or when teams are
/// off ([`teams_disabled`]) or the OS refuses the threads.
pub fn shared_team(threads: usize) -> Option<Arc<Team>> {
    static TEAMS: Mutex<Vec<(usize, Weak<Team>)>> = Mutex::new(Vec::new());
    if threads <= 1 || teams_disabled() {
        return None;
    }
    let mut teams = TEAMS.lock().unwrap_or_else(|e| e.into_inner());
    teams.retain(|(_, w)| w.strong_count() > 0);
    if let Some(t) = teams
        .iter()
        .find(|(t, _)| *t == threads)
        .and_then(|(_, w)| w.upgrade())
    {
        return Some(t);
    }
    let team = Arc::new(Team::new(threads).ok()?);
    teams.push((threads, Arc::downgrade(&team)));
    Some(team)
}

/// `f()` with `team` current on this thread (none for `None`); the
/// previous one is restored after, also on unwind.
pub fn with_team<R>(team: Option<&Arc<Team>>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<Team>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = prev);
        }
    }
    let prev = CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), team.cloned()));
    let _restore = Restore(prev);
    f()
}

/// Threads a loop of [`for_each`] spreads over here: the current team's,
/// else the rayon pool's; 1 inside a task of a team's loop.
pub fn threads() -> usize {
    if IN_LOOP.with(|f| f.get()) {
        return 1;
    }
    CURRENT
        .with(|c| c.borrow().as_ref().map(|t| t.threads()))
        .unwrap_or_else(super::num_threads)
}

/// `f(i)` for every `i < tasks` in parallel: on the current team, else on
/// the rayon pool; serially inside a task of a team's loop.
pub fn for_each(tasks: usize, f: impl Fn(usize) + Sync) {
    if IN_LOOP.with(|f| f.get()) {
        (0..tasks).for_each(f);
        return;
    }
    let team = CURRENT.with(|c| c.borrow().clone());
    match team {
        Some(t) => t.run(tasks, &f),
        None if tasks <= 1 => (0..tasks).for_each(f),
        None => (0..tasks).into_par_iter().for_each(&f),
    }
}

/// [`for_each`] of a fallible `f`: the first error seen (of any task; all
/// tasks run), or `Ok`.
pub fn try_for_each<E: Send>(
    tasks: usize,
    f: impl Fn(usize) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let failed = Mutex::new(None);
    for_each(tasks, |i| {
        if let Err(e) = f(i) {
            failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(e);
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `out` split into chunks of `chunk` elements (the last may be shorter),
/// `f(i, chunk_i)` for each, in parallel as [`for_each`].
pub fn for_each_chunk_mut<T: Send>(
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let ok: Result<(), ()> = try_for_each_chunk_mut(out, chunk, |i, c| {
        f(i, c);
        Ok(())
    });
    debug_assert!(ok.is_ok());
}

/// [`for_each_chunk_mut`] of a fallible `f`, as [`try_for_each`].
pub fn try_for_each_chunk_mut<T: Send, E: Send>(
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let chunk = chunk.max(1);
    let len = out.len();
    let base = SendPtr(out.as_mut_ptr());
    try_for_each(len.div_ceil(chunk), |i| {
        let start = i * chunk;
        let n = chunk.min(len - start);
        // SAFETY: task `i` alone gets elements `i * chunk..` (`n` of
        // them, inside `out`): the chunks are disjoint, and `out` stays
        // mutably borrowed until every task has returned.
        let c = unsafe { std::slice::from_raw_parts_mut(base.at(start), n) };
        f(i, c)
    })
}

/// A raw pointer that tasks may share (they write disjoint parts).
struct SendPtr<T>(*mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: only used by `for_each_chunk_mut`, whose tasks touch disjoint
// elements of a buffer of `Send` elements.
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer `i` elements on. A method, so that closures capture the
    /// whole (Sync) wrapper rather than its raw-pointer field.
    fn at(self, i: usize) -> *mut T {
        self.0.wrapping_add(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_task_runs_once_on_every_team_size() {
        for threads in [1, 2, 3, 5] {
            let team = Team::new(threads).unwrap();
            for tasks in [0, 1, 2, 7, 64, 1000] {
                let hits: Vec<AtomicU64> = (0..tasks).map(|_| AtomicU64::new(0)).collect();
                for round in 0..50u64 {
                    team.run(tasks, &|i| {
                        hits[i].fetch_add(round + 1, Ordering::Relaxed);
                    });
                }
                let want = (1..=50u64).sum::<u64>();
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == want),
                    "threads {threads}, tasks {tasks}"
                );
            }
        }
    }

    #[test]
    fn chunks_cover_the_buffer_and_writes_are_visible_after() {
        let team = Arc::new(Team::new(4).unwrap());
        for len in [0usize, 1, 15, 16, 17, 1000] {
            let mut out = vec![0usize; len];
            with_team(Some(&team), || {
                for_each_chunk_mut(&mut out, 16, |i, c| {
                    for (j, x) in c.iter_mut().enumerate() {
                        *x = i * 16 + j + 1;
                    }
                })
            });
            assert!(
                out.iter().enumerate().all(|(j, &x)| x == j + 1),
                "len {len}"
            );
        }
    }

    #[test]
    fn workers_wake_after_parking() {
        let team = Team::new(3).unwrap();
        let sum = AtomicU64::new(0);
        team.run(8, &|i| {
            sum.fetch_add(i as u64, Ordering::Relaxed);
        });
        // Idle workers park after SPIN (allow for a loaded machine).
        let start = Instant::now();
        while team.shared.parked.load(Ordering::SeqCst) < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "idle workers never parked"
            );
            std::thread::sleep(SPIN);
        }
        team.run(8, &|i| {
            sum.fetch_add(i as u64, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 2 * 28);
    }

    #[test]
    fn a_nested_or_concurrent_loop_runs_elsewhere() {
        let team = Arc::new(Team::new(2).unwrap());
        let count = AtomicU64::new(0);
        with_team(Some(&team), || {
            for_each(4, |_| {
                // Inside a task: serial, on this thread.
                assert_eq!(threads(), 1);
                for_each(4, |_| {
                    count.fetch_add(1, Ordering::Relaxed);
                });
                // The team itself is busy with the outer loop: a direct
                // run goes to the rayon pool instead of deadlocking.
                team.run(4, &|_| {
                    count.fetch_add(1, Ordering::Relaxed);
                });
            })
        });
        assert_eq!(count.load(Ordering::Relaxed), 32);
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_team_goes_on() {
        let team = Team::new(3).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            team.run(16, &|i| assert!(i != 11, "task 11"))
        }));
        assert!(r.is_err());
        let count = AtomicU64::new(0);
        team.run(16, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 16);
    }
}
