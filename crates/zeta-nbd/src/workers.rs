//! The request workers: plain threads taking jobs from one queue.
//!
//! Not a rayon pool, on purpose. A request blocks (on a volume's range locks, the dirty-data
//! throttle, device I/O), and the layers below use rayon to read a stripe's columns in
//! parallel. A rayon worker that waits for such a parallel operation runs other queued jobs
//! on its own stack meanwhile; if one of those is a request that waits for a range lock held
//! by the suspended request beneath it, that worker never returns. Called from a plain
//! thread, rayon blocks the caller instead.

use std::cell::Cell;
use std::sync::Arc;
use std::thread::JoinHandle;

use std::collections::VecDeque;

use parking_lot::{Condvar, Mutex};

type Job = Box<dyn FnOnce() + Send + 'static>;

pub struct Workers {
    queue: Arc<Queue>,
    threads: Vec<JoinHandle<()>>,
}

/// The jobs, and whether the pool is closing (then workers run what is left and stop).
///
/// Idle workers sleep on the condvar. (A shared `mpsc::Receiver` behind a mutex made every
/// idle worker spin on that mutex while one slept in `recv`; `crossbeam_channel` spun and
/// called `sched_yield` before it slept. Figures: docs/perf/nbd.md, "Why idle workers sleep
/// on a condition variable".)
struct Queue {
    jobs: Mutex<(VecDeque<Job>, bool)>,
    ready: Condvar,
}

/// Jobs a worker runs back to back before it calls its `between` hook even though more are
/// queued.
const RUN_OF_JOBS: usize = 8;

thread_local! {
    /// Whether the job running on this thread had more queued behind it (see `more_queued`).
    static MORE_QUEUED: Cell<bool> = const { Cell::new(false) };
}

/// True while a worker runs a job with more queued behind it: the worker calls its `between`
/// hook as soon as it finds the queue empty, and at the latest once the jobs it took back to
/// back number `RUN_OF_JOBS`. Work that can wait that long (an NBD reply that can share a
/// system call with the next ones) may be left for the hook.
pub fn more_queued() -> bool {
    MORE_QUEUED.with(Cell::get)
}

impl Workers {
    /// `n` workers; each calls `between` before it waits for a job, and between runs of
    /// `RUN_OF_JOBS` jobs taken back to back.
    pub fn new(n: usize, between: fn()) -> std::io::Result<Workers> {
        let queue = Arc::new(Queue {
            jobs: Mutex::new((VecDeque::new(), false)),
            ready: Condvar::new(),
        });
        let threads = (0..n.max(1))
            .map(|i| {
                let queue = queue.clone();
                std::thread::Builder::new()
                    .name(format!("nbd-worker-{i}"))
                    .spawn(move || {
                        schedule_as_batch();
                        work(&queue, between)
                    })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Workers { queue, threads })
    }

    /// Queues a job. A job that panics is contained: the worker goes on with the next one.
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        let mut q = self.queue.jobs.lock();
        if q.1 {
            return; // closing: only `Drop` closes, and nothing spawns after it
        }
        q.0.push_back(Box::new(job));
        drop(q);
        self.queue.ready.notify_one();
    }
}

/// Puts the calling thread in `SCHED_BATCH`: woken, it does not preempt the thread that
/// woke it, but waits for that thread to block or for an idle core.
///
/// A connection's reader wakes a worker for each request it hands over. Woken workers took
/// the reader's core from it at once, so the reader sat preempted, holding the next
/// requests, while the worker ran (in `Condvar::notify_one`). With the workers in
/// `SCHED_BATCH` the reader goes on framing requests and the workers run as it blocks:
/// faster under fio over NBD and group commit, at less CPU per request (figures:
/// docs/perf/nbd.md, "Why the request workers run in `SCHED_BATCH`"). Workers still run at
/// once on an idle core, so a lone request waits no longer. Best effort: if the kernel
/// refuses, they run as before.
fn schedule_as_batch() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads `param`, which lives across the call; pid 0 is the
    // calling thread.
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_BATCH, &param);
    }
}

fn work(queue: &Queue, between: fn()) {
    let mut run = 0;
    loop {
        let mut q = queue.jobs.lock();
        let job = match q.0.pop_front() {
            Some(job) if run < RUN_OF_JOBS => job,
            Some(job) => {
                drop(q);
                between();
                run = 0;
                q = queue.jobs.lock();
                job
            }
            None => {
                drop(q);
                between();
                run = 0;
                q = queue.jobs.lock();
                loop {
                    if let Some(job) = q.0.pop_front() {
                        break job;
                    }
                    if q.1 {
                        return; // closed and empty
                    }
                    queue.ready.wait(&mut q);
                }
            }
        };
        run += 1;
        let more = run < RUN_OF_JOBS && !q.0.is_empty();
        drop(q);
        MORE_QUEUED.with(|m| m.set(more));
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        MORE_QUEUED.with(|m| m.set(false));
    }
}

impl Drop for Workers {
    /// Runs what is queued, then stops the threads.
    fn drop(&mut self) {
        self.queue.jobs.lock().1 = true;
        self.queue.ready.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::channel;

    static BETWEEN: AtomicUsize = AtomicUsize::new(0);

    fn between() {
        BETWEEN.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn workers_run_as_batch_threads() {
        // Where the kernel refuses the policy (a sandbox filtering the call), the workers run
        // as before by design; there is nothing to check.
        let allowed = std::thread::spawn(|| {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: as in `schedule_as_batch`, on this scratch thread.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) == 0 }
        });
        if !allowed.join().unwrap() {
            eprintln!("SCHED_BATCH refused here: not checked");
            return;
        }
        let w = Workers::new(2, between).unwrap();
        let (tx, rx) = channel();
        w.spawn(move || {
            // SAFETY: sched_getscheduler only reads the calling thread's policy.
            let _ = tx.send(unsafe { libc::sched_getscheduler(0) });
        });
        assert_eq!(rx.recv().unwrap(), libc::SCHED_BATCH);
    }

    #[test]
    fn a_worker_calls_its_hook_when_it_runs_out_of_jobs_and_within_every_run() {
        let w = Workers::new(1, between).unwrap();
        // Hold the lone worker while jobs pile up behind it.
        let (go_tx, go_rx) = channel::<()>();
        let (seen_tx, seen_rx) = channel::<(usize, bool, usize)>();
        w.spawn(move || go_rx.recv().unwrap());
        let jobs = 2 * RUN_OF_JOBS + 3;
        for i in 0..jobs {
            let seen = seen_tx.clone();
            w.spawn(move || {
                let _ = seen.send((i, more_queued(), BETWEEN.load(Ordering::SeqCst)));
            });
        }
        let before = BETWEEN.load(Ordering::SeqCst);
        go_tx.send(()).unwrap();
        let seen: Vec<_> = (0..jobs).map(|_| seen_rx.recv().unwrap()).collect();
        drop(w);
        // Jobs run in order; all but the last of each run see more queued.
        assert!(seen.iter().enumerate().all(|(k, s)| s.0 == k));
        assert!(seen[0].1, "the first job has the rest queued behind it");
        assert!(!seen[jobs - 1].1, "nothing is queued behind the last");
        // The hook ran between runs of RUN_OF_JOBS (not after each job)...
        let calls: Vec<usize> = seen.iter().map(|s| s.2 - before).collect();
        assert_eq!(calls[RUN_OF_JOBS - 2], calls[0], "no call inside a run");
        assert!(
            calls[jobs - 1] >= 2,
            "a call after each full run: {calls:?}"
        );
        // ...and once the queue ran dry, before the worker slept (and at shutdown).
        assert!(BETWEEN.load(Ordering::SeqCst) > before + calls[jobs - 1]);
    }
}
