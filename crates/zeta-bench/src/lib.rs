//! zeta's benchmarks: each prints its figures as ratios against a reference measured in the
//! same run (the raw file, ISA-L, nbdkit, zfs-fuse, btrfs, the lz4 and zstd tools), and the NBD load generator they share.
//! The `zeta` binary links this crate as `zeta bench …`; nothing in the engine depends on it.

pub mod arc;
pub mod args;
pub mod checksum;
pub mod compress;
pub mod frag;
pub mod load;
pub mod parity;
pub mod prefetch;
pub mod rados;
pub mod raidz;
pub mod scrub;
pub mod snap;
pub mod sync;
pub mod vol;

use args::BenchCmd;

/// Runs one `zeta bench` subcommand.
pub fn run(cmd: BenchCmd) -> zeta_server::Result<()> {
    match cmd {
        BenchCmd::Vol(a) => vol::vol(a),
        BenchCmd::Parity(a) => parity::parity(a),
        BenchCmd::Raidz(a) => raidz::raidz(a),
        BenchCmd::Scrub(a) => scrub::scrub_bench(a),
        BenchCmd::Snap(a) => snap::snap_bench(a),
        BenchCmd::Compress(a) => compress::compress_bench(a),
        BenchCmd::Arc(a) => arc::arc_bench(a),
        BenchCmd::Prefetch(a) => prefetch::prefetch_bench(a),
        BenchCmd::Checksum(a) => checksum::checksum(a),
        BenchCmd::Sync(a) => sync::sync_bench(a),
        BenchCmd::Rados(a) => rados::rados_bench(a),
        BenchCmd::Frag(a) => frag::frag_bench(a),
        BenchCmd::Load(a) => load::load_cmd(a),
    }
}
