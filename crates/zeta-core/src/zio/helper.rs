//! A helper thread that shares a caller's work without the caller ever waiting for it to
//! wake.
//!
//! A streaming read is a few pieces (a device read and the checksums of its blocks each).
//! Handing half of them to a rayon worker cost about what the worker's core gave back: in a
//! virtual machine a sleeping worker's core is halted, and waking it took a good part of the
//! time the caller spent on its own half, which the caller then waited out. Here the caller
//! and the helper claim pieces from a shared counter, so a helper that wakes late does fewer
//! of them, and one that has not started when the caller runs out is simply called off.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// How long the helper stays awake for the next job after one: streaming reads come one
/// after another, and a helper still awake joins the next at once. Polled with
/// `thread::yield_now`, so any other thread that can run on the core does.
const STAY_AWAKE: Duration = Duration::from_micros(200);

/// A job: a claim loop that any number of threads may run at once, each returning once
/// nothing is left to claim. Its lifetime is erased; `share` keeps it alive until the helper
/// is done with it.
#[derive(Clone, Copy)]
struct Job(*const (dyn Fn() + Sync + 'static));

// SAFETY: the pointee is `Sync` (shareable across threads) and `share` keeps it alive and
// unmoved until the helper has finished with it.
unsafe impl Send for Job {}

#[derive(Default)]
struct State {
    /// A job posted and not yet taken.
    posted: Option<Job>,
    /// The helper is running a job it took.
    running: bool,
    /// The helper's last job panicked.
    panicked: bool,
}

struct Helper {
    state: Mutex<State>,
    wake: Condvar,
    done: Condvar,
}

fn helper() -> &'static Helper {
    static HELPER: OnceLock<&'static Helper> = OnceLock::new();
    HELPER.get_or_init(|| {
        let h: &'static Helper = Box::leak(Box::new(Helper {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            done: Condvar::new(),
        }));
        let _ = std::thread::Builder::new()
            .name("zio-helper".into())
            .spawn(move || h.serve());
        h
    })
}

impl Helper {
    fn serve(&self) {
        let mut st = self.state.lock();
        loop {
            let awake_until = Instant::now() + STAY_AWAKE;
            while st.posted.is_none() {
                if Instant::now() < awake_until {
                    drop(st);
                    std::thread::yield_now();
                    st = self.state.lock();
                } else {
                    self.wake.wait(&mut st);
                }
            }
            let job = st.posted.take().expect("a posted job");
            st.running = true;
            drop(st);
            // SAFETY: `share` posted this pointer to a live closure and does not return (or
            // unwind past the closure) until `running` is false again.
            let ok = catch_unwind(AssertUnwindSafe(|| unsafe { (*job.0)() })).is_ok();
            st = self.state.lock();
            st.running = false;
            st.panicked |= !ok;
            self.done.notify_all();
        }
    }
}

/// Runs `work` on this thread and, if the helper is free, on the helper too; returns once
/// both are done with it. `work` must be a claim loop (see `Job`): the two run it at the
/// same time, and whatever the helper does not claim this thread does.
pub fn share(work: &(dyn Fn() + Sync)) {
    let h = helper();
    // SAFETY: only the lifetime is erased; `Posted::drop` below, which runs however this
    // function is left, waits until the helper has let go of the pointer.
    let job = Job(unsafe {
        std::mem::transmute::<*const (dyn Fn() + Sync + '_), *const (dyn Fn() + Sync + 'static)>(
            work,
        )
    });
    let posted = {
        let mut st = h.state.lock();
        let free = st.posted.is_none() && !st.running;
        if free {
            st.posted = Some(job);
        }
        free
    };
    if !posted {
        // Another caller has the helper: this one works alone.
        work();
        return;
    }
    h.wake.notify_one();
    /// Calls the job off or waits for the helper to let go of it, however `share` is left;
    /// says whether the helper's run of it panicked.
    struct Posted(&'static Helper);
    impl Posted {
        fn settle(&self) -> bool {
            let mut st = self.0.state.lock();
            // Not taken yet: call it off. Taken: the helper is past its last claim or
            // about to be; wait for it to let go.
            st.posted = None;
            while st.running {
                self.0.done.wait(&mut st);
            }
            std::mem::take(&mut st.panicked)
        }
    }
    impl Drop for Posted {
        fn drop(&mut self) {
            self.settle();
        }
    }
    let guard = Posted(h);
    work();
    let helper_panicked = guard.settle();
    std::mem::forget(guard);
    assert!(
        !helper_panicked,
        "a job shared with the zio helper panicked"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Every piece is done exactly once, whoever claims it, under many callers at once.
    #[test]
    fn every_piece_is_done_once_whoever_claims_it() {
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    for round in 0..200 {
                        let pieces = 1 + (round + t) % 9;
                        let next = AtomicUsize::new(0);
                        let done: Vec<AtomicUsize> =
                            (0..pieces).map(|_| AtomicUsize::new(0)).collect();
                        share(&|| loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= pieces {
                                return;
                            }
                            done[i].fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(done.iter().all(|d| d.load(Ordering::Relaxed) == 1));
                    }
                });
            }
        });
    }

    /// The helper takes part: with pieces that take a while, it claims some of them.
    #[test]
    fn the_helper_takes_pieces() {
        let mut helped = 0;
        for _ in 0..50 {
            let next = AtomicUsize::new(0);
            let by_helper = AtomicUsize::new(0);
            let me = std::thread::current().id();
            share(&|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= 8 {
                    return;
                }
                if std::thread::current().id() != me {
                    by_helper.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(1));
            });
            helped += by_helper.load(Ordering::Relaxed);
        }
        assert!(helped > 0);
    }
}
