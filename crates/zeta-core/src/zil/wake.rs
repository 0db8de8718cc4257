//! Answering the requests a commit made durable, as one batch.
//!
//! A group commit answers a few hundred requests at once, each through its `Done` callback.
//! A callback that writes its answer to a socket right away makes one system call per
//! request; one that can tell a batch is being answered leaves its answer queued and asks,
//! with `after_wakeups`, to be called back once the batch is done, so one write can carry
//! every answer of the batch that goes the same way.

use std::cell::RefCell;

use super::LogError;

/// Called once a sync request's records are durable (or cannot be made so).
pub type Done = Box<dyn FnOnce(Result<(), LogError>) + Send>;

/// What to run once the batch being answered is answered.
type Hooks = Vec<fn()>;

thread_local! {
    /// While this thread answers a batch: its hooks.
    static EPILOGUE: RefCell<Option<Hooks>> = const { RefCell::new(None) };
}

/// Calls every `done` with `result()`, then each hook they registered with
/// `after_wakeups`. Within an outer batch on the same thread, the hooks wait for that one.
pub(crate) fn wake_all(
    dones: impl IntoIterator<Item = Done>,
    result: impl Fn() -> Result<(), LogError>,
) {
    let outer = EPILOGUE.with(|e| {
        let mut e = e.borrow_mut();
        let outer = e.is_some();
        e.get_or_insert_with(Vec::new);
        outer
    });
    if outer {
        dones.into_iter().for_each(|d| d(result()));
        return;
    }
    // Runs the hooks even if a callback panics (the worker contains the panic and goes on),
    // so no answer is left queued behind it.
    struct Epilogue;
    impl Drop for Epilogue {
        fn drop(&mut self) {
            // A hook may itself answer requests: it runs outside the batch.
            let hooks = EPILOGUE.with(|e| e.borrow_mut().take()).unwrap_or_default();
            hooks.into_iter().for_each(|h| h());
        }
    }
    let _epilogue = Epilogue;
    dones.into_iter().for_each(|d| d(result()));
}

/// Inside a batch being answered on this thread (a `Done` callback of `wake_all`): runs `hook`
/// once the batch is answered and returns true. Elsewhere: returns false and runs nothing.
/// A hook registered twice runs twice; callers register once per batch.
pub fn after_wakeups(hook: fn()) -> bool {
    EPILOGUE.with(|e| match e.borrow_mut().as_mut() {
        Some(hooks) => {
            hooks.push(hook);
            true
        }
        None => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        static LOG: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
        static REGISTERED: Cell<bool> = const { Cell::new(false) };
    }

    fn note(what: &'static str) {
        LOG.with(|l| l.borrow_mut().push(what));
    }

    fn hook() {
        REGISTERED.with(|r| r.set(false));
        note("hook");
    }

    fn done() -> Done {
        Box::new(|r| {
            assert!(r.is_ok());
            note("done");
            if !REGISTERED.with(|r| r.replace(true)) {
                assert!(after_wakeups(hook));
            }
        })
    }

    #[test]
    fn hooks_run_once_after_the_whole_batch() {
        wake_all([done(), done(), done()], || Ok(()));
        assert_eq!(
            LOG.with(|l| l.take()),
            ["done", "done", "done", "hook"],
            "the hook registered by the first callback waits for the last"
        );
        // Outside a batch nothing is deferred.
        assert!(!after_wakeups(hook));
        wake_all([done()], || Ok(()));
        assert_eq!(LOG.with(|l| l.take()), ["done", "hook"]);
    }

    #[test]
    fn a_nested_batch_leaves_its_hooks_to_the_outer_one() {
        let inner: Done = Box::new(|_| {
            note("outer done");
            wake_all([done()], || Ok(()));
        });
        wake_all([inner], || Ok(()));
        assert_eq!(LOG.with(|l| l.take()), ["outer done", "done", "hook"]);
    }

    #[test]
    fn hooks_run_when_a_callback_panics() {
        let boom: Done = Box::new(|_| panic!("callback failed"));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wake_all([done(), boom], || Ok(()))
        }));
        assert!(r.is_err());
        assert_eq!(LOG.with(|l| l.take()), ["done", "hook"]);
        assert!(!after_wakeups(hook), "the batch is over");
    }
}
