//! The `zeta` command: argument parsing, the state directory, and one module per command group.
//!
//! Architecture invariant: the CLI reaches the engine only through `dsl::Pool` and
//! `zvol::Volume`; it never touches labels, blocks or devices' bytes itself.

pub mod args;
pub mod bench_checksum;
pub mod bench_cmd;
pub mod bench_parity;
pub mod bench_raidz;
pub mod bench_scrub;
pub mod bench_sync;
pub mod control;
pub mod fmt;
pub mod nbd_load;
pub mod pool_cmd;
pub mod serve_cmd;
pub mod state;
pub mod vol_cmd;

use clap::Parser;

pub use args::Cli;

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    limit_malloc_arenas();
    let cli = Cli::parse();
    let home = state::Home::resolve(cli.home.clone());
    let result = match cli.command {
        args::Command::Pool(cmd) => pool_cmd::run(&home, cmd),
        args::Command::Vol(cmd) => vol_cmd::run(&home, cmd),
        args::Command::Serve(cmd) => serve_cmd::serve(&home, cmd),
        args::Command::Up(cmd) => serve_cmd::up(&home, cmd),
        args::Command::Inject(a) => pool_cmd::inject(&home, a),
        args::Command::Bench(args::BenchCmd::Vol(a)) => bench_cmd::vol(a),
        args::Command::Bench(args::BenchCmd::Parity(a)) => bench_parity::parity(a),
        args::Command::Bench(args::BenchCmd::Raidz(a)) => bench_raidz::raidz(a),
        args::Command::Bench(args::BenchCmd::Scrub(a)) => bench_scrub::scrub_bench(a),
        args::Command::Bench(args::BenchCmd::Checksum(a)) => bench_checksum::checksum(a),
        args::Command::Bench(args::BenchCmd::Sync(a)) => bench_sync::sync_bench(a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("zeta: {e}");
            1
        }
    }
}

/// glibc gives each thread that allocates its own arena (up to 8 per core) and keeps freed
/// memory in each: with the NBD server's many threads this alone added ~100 MiB of resident
/// memory over the configured cache and dirty limits. Two arenas are plenty for 2-core-class
/// contention, and the server's large buffers are freed to the arena they came from anyway.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts allocator tuning; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// How often a long-running command looks at how much freed memory its heap holds.
const HEAP_TRIM_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// The freed heap memory a long-running command keeps before handing it back.
const HEAP_TRIM_SLACK: usize = 48 << 20;

/// Starts a thread that returns freed heap pages to the system once more than
/// `HEAP_TRIM_SLACK` of them pile up, for as long as the process runs (the server, the
/// benchmarks).
///
/// glibc returns free memory only from the top of a heap. Block buffers are freed in cache
/// order, not allocation order, so under random writes the heaps held about as much free
/// memory as live (489 MiB resident for 294 MiB in use, after fio's random 4K and 128K
/// writes through `zeta serve`), and the server's resident size stayed at its high-water
/// mark. `malloc_trim(0)` gives back every free page, wherever it lies in the heap. It is
/// not free: each page given back is faulted in and zeroed again when reused, and the
/// unmapping interrupts every core. Trimming every 250 ms whatever the heap held cost 4K
/// random writes over NBD a tenth of the server's time in page faults.
pub(crate) fn start_heap_trimmer() {
    // SAFETY: mallopt only sets allocator parameters; called before the threads that
    // allocate much start.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, HEAP_TRIM_SLACK as i32);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 2 << 20);
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    let _ = std::thread::Builder::new()
        .name("heap-trim".into())
        .spawn(|| loop {
            std::thread::sleep(HEAP_TRIM_INTERVAL);
            // SAFETY: mallinfo2 and malloc_trim take the allocator's own locks; mallinfo2
            // only reads its statistics and malloc_trim only releases pages of free
            // chunks. Both are safe to call from any thread at any time.
            unsafe {
                if libc::mallinfo2().fordblks > HEAP_TRIM_SLACK {
                    libc::malloc_trim(0);
                }
            }
        });
}

/// Errors of the command line: a message for the user, one line.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Pool(#[from] crate::dsl::PoolError),
    #[error(transparent)]
    Vol(#[from] crate::zvol::VolError),
    #[error(transparent)]
    Vdev(#[from] crate::vdev::VdevError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, CliError>;

pub fn usage(msg: impl Into<String>) -> CliError {
    CliError::Usage(msg.into())
}
