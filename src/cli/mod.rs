//! The `zeta` command: argument parsing, the state directory, and one module per command group.
//!
//! Architecture invariant: the CLI reaches the engine only through `dsl` (the pool and the
//! types it re-exports to build one) and `zvol::Volume`; it never touches labels, blocks or
//! devices' bytes itself. `tests/layers.rs` checks that no front end names a lower module.

pub mod args;
pub mod control_ops;
pub mod guard;
pub mod pool_cmd;
pub mod prop_cmd;
pub mod serve_cmd;
pub mod snap_cmd;
pub mod vol_cmd;

use clap::Parser;
use zeta_server::{memory, state};

pub use args::Cli;

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    // `rados:POOL/NAME` devices (librados is loaded only when one is used).
    zeta_rados::register();
    let cli = Cli::parse();
    memory::tune_allocator(match cli.command {
        args::Command::Bench(zeta_bench::args::BenchCmd::Vol(_)) => memory::Allocators::One,
        _ => memory::Allocators::Many,
    });
    if matches!(
        cli.command,
        args::Command::Pool(_)
            | args::Command::Vol(_)
            | args::Command::Inject(_)
            | args::Command::Get(_)
            | args::Command::Set(_)
            | args::Command::Snapshot(_)
            | args::Command::List(_)
            | args::Command::Destroy(_)
            | args::Command::Rollback(_)
            | args::Command::Receive(_)
            | args::Command::Clone(_)
            | args::Command::Promote(_)
    ) {
        die_on_closed_pipe();
    }
    let home = state::Home::resolve(cli.home.clone());
    let result = match cli.command {
        args::Command::Pool(cmd) => pool_cmd::run(&home, cmd),
        args::Command::Vol(cmd) => vol_cmd::run(&home, cmd),
        args::Command::Get(a) => vol_cmd::run(&home, args::VolCmd::PropGet(a)),
        args::Command::Set(a) => vol_cmd::run(&home, args::VolCmd::PropSet(a)),
        args::Command::Snapshot(a) => vol_cmd::run(&home, args::VolCmd::Snapshot(a)),
        args::Command::List(a) => vol_cmd::run(&home, args::VolCmd::DsList(a)),
        args::Command::Destroy(a) => vol_cmd::run(&home, args::VolCmd::DsDestroy(a)),
        args::Command::Rollback(a) => vol_cmd::run(&home, args::VolCmd::DsRollback(a)),
        args::Command::Send(a) => vol_cmd::run(&home, args::VolCmd::DsSend(a)),
        args::Command::Receive(a) => vol_cmd::run(&home, args::VolCmd::DsReceive(a)),
        args::Command::Clone(a) => vol_cmd::run(&home, args::VolCmd::DsClone(a)),
        args::Command::Promote(a) => vol_cmd::run(&home, args::VolCmd::DsPromote(a)),
        args::Command::Serve(cmd) => serve_cmd::serve(&home, cmd),
        args::Command::Up(cmd) => serve_cmd::up(&home, cmd),
        args::Command::Inject(a) => pool_cmd::inject(&home, a),
        args::Command::Bench(cmd) => zeta_bench::run(cmd),
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

/// Errors of the command line: a message for the user, one line (shared with the serving
/// runtime, which runs the same operations for a control client).
pub use zeta_server::{usage, Error as CliError, Result};

/// The error of a failed write of a command's output.
fn stdout_err(e: std::io::Error) -> CliError {
    CliError::Io {
        path: "stdout".into(),
        source: e,
    }
}
