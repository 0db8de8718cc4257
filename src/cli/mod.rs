//! The `zeta` command: argument parsing, the state directory, and one module per command group.
//!
//! Architecture invariant: the CLI reaches the engine only through `dsl::Pool` and
//! `zvol::Volume`; it never touches labels, blocks or devices' bytes itself.

pub mod args;
pub mod bench_checksum;
pub mod bench_cmd;
pub mod bench_frag;
pub mod bench_parity;
pub mod bench_raidz;
pub mod bench_scrub;
pub mod bench_sync;
pub mod control;
pub mod fmt;
pub mod guard;
pub mod memory;
pub mod nbd_load;
pub mod plot;
pub mod pool_cmd;
pub mod progress;
pub mod room;
pub mod serve_cmd;
pub mod state;
pub mod vol_cmd;
pub mod watch;

use clap::Parser;

pub use args::Cli;

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    memory::tune_allocator(match cli.command {
        args::Command::Bench(args::BenchCmd::Vol(_)) => memory::Allocators::One,
        _ => memory::Allocators::Many,
    });
    if matches!(
        cli.command,
        args::Command::Pool(_) | args::Command::Vol(_) | args::Command::Inject(_)
    ) {
        die_on_closed_pipe();
    }
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
        args::Command::Bench(args::BenchCmd::Frag(a)) => bench_frag::frag_bench(a),
        args::Command::Bench(args::BenchCmd::Load(a)) => nbd_load::load_cmd(a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("zeta: {e}");
            1
        }
    }
}

/// Lets SIGPIPE end the process, as it ends other Unix tools, when a reader closes its
/// output early (`zeta pool status | head -3`). Rust ignores SIGPIPE, so `println!` would
/// panic on the broken pipe instead. Only for commands that print and exit: a server must
/// outlive a client that hangs up, and its socket writes rely on getting EPIPE.
fn die_on_closed_pipe() {
    // SAFETY: sets the disposition of one signal to its default before any thread of ours
    // starts; no handler of ours is replaced (the runtime only set SIGPIPE to ignore).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
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
