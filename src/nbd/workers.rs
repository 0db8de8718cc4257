//! The request workers: plain threads taking jobs from one queue.
//!
//! Not a rayon pool, on purpose. A request blocks (on a volume's range locks, the dirty-data
//! throttle, device I/O), and the layers below use rayon to read a stripe's columns in
//! parallel. A rayon worker that waits for such a parallel operation runs other queued jobs
//! on its own stack meanwhile; if one of those is a request that waits for a range lock held
//! by the suspended request beneath it, that worker never returns. Called from a plain
//! thread, rayon blocks the caller instead.

use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::Mutex;

type Job = Box<dyn FnOnce() + Send + 'static>;

pub struct Workers {
    queue: Mutex<Option<Sender<Job>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    pub fn new(n: usize) -> std::io::Result<Workers> {
        // A multi-consumer queue: idle workers sleep in it. (A shared `mpsc::Receiver`
        // behind a mutex made every idle worker spin on that mutex while one slept in
        // `recv`: 6 % of the server's time under 128K writes.)
        let (tx, rx) = unbounded::<Job>();
        let threads = (0..n.max(1))
            .map(|i| {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("nbd-worker-{i}"))
                    .spawn(move || work(&rx))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Workers {
            queue: Mutex::new(Some(tx)),
            threads,
        })
    }

    /// Queues a job. A job that panics is contained: the worker goes on with the next one.
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        if let Some(tx) = &*self.queue.lock() {
            // Sending fails only once every worker is gone, which `Drop` alone causes.
            let _ = tx.send(Box::new(job));
        }
    }
}

fn work(rx: &Receiver<Job>) {
    loop {
        match rx.recv() {
            Ok(job) => {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            }
            Err(_) => return, // the queue is closed and empty
        }
    }
}

impl Drop for Workers {
    /// Runs what is queued, then stops the threads.
    fn drop(&mut self) {
        self.queue.lock().take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
