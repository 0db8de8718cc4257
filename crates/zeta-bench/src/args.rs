//! The arguments of `zeta bench …` (a subcommand of the `zeta` binary, which links this crate).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use zeta_server::memory::MemoryArgs;

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// A volume on a one-file pool against a raw file of the same size: sequential 1 MiB and
    /// random 4K/16K writes and reads, MB/s and the ratio (median of --runs), and the peak
    /// resident memory against --cache + --dirty-max.
    #[command(
        after_help = "Both files are written in full before measuring (a file system's first \
                      write to a block is several times slower than a rewrite, and a \
                      copy-on-write pool always writes somewhere new), so both are measured \
                      rewriting allocated space."
    )]
    Vol(BenchVolArgs),
    /// Parity generation and two-column rebuild per code and kernel, single core, data GB/s
    /// and the ratio to ISA-L on the same buffers (median of --runs).
    Parity(BenchParityArgs),
    /// The RDP paper's experiment: a sequential write to a volume on six file vdevs as raidz1,
    /// raidz2 (Reed-Solomon) and raidz2 (RDP), against a raw file: MB/s and CPU time.
    Raidz(BenchRaidzArgs),
    /// Every checksum algorithm and kernel, single core, GB/s on cache-resident 4 KiB and
    /// 128 KiB buffers, with the ratio to a memory-read reference measured in the same run.
    Checksum(BenchChecksumArgs),
    /// A scrub of a pool on file vdevs against `cat` reading the same files to /dev/null:
    /// GB/s and the ratio (median of --runs).
    Scrub(BenchScrubArgs),
    /// Snapshots of a filled volume against btrfs (a read-only subvolume snapshot on a loop
    /// device) and qcow2 (`qemu-img snapshot`), at each --size: the time to take one (median
    /// of --runs), to destroy one after 1 % and after 50 % of the volume was rewritten, a full
    /// send against reading the volume and `btrfs send`, a receive against writing it, an
    /// incremental stream's size against the bytes changed; then random 4K overwrites with 0,
    /// 1, 10 and 100 snapshots held.
    #[command(
        after_help = "btrfs needs root (a loop mount) and btrfs-progs; qcow2 needs qemu-utils. \
                      A peer that cannot run is shown as skipped, with why. Every snapshot \
                      and destroy is durable when it returns: zeta's commits its txg, btrfs's \
                      commit their transaction (--commit-after), qemu-img's close the image."
    )]
    Snap(BenchSnapArgs),
    /// Compression on random bytes and on a tar of /usr, at 16K and 128K blocks: each codec
    /// inside the pipeline against the raw crate on the same blocks (single core), the ratio
    /// against the `lz4 -1` and `zstd -3` command-line tools fed the same blocks and against
    /// btrfs (`compress=zstd` on a loop device), and a volume's write and read MB/s with lz4
    /// and zstd against compression off.
    #[command(
        after_help = "The corpus is the first --size bytes of `tar -cf - /usr` (binaries, \
                      libraries, text: what every machine has), the random data as many bytes \
                      from a seeded generator. The command-line tools compress every block as a \
                      file of its own (`lz4 -1 -m`, `zstd -3`), so they see what a volume's \
                      blocks hold. zeta's ratio counts what its blocks store, whole 4K sectors \
                      (a block is stored compressed only where that saves a sector); the \
                      codec's own output before that rounding is shown beside it. The volume \
                      rows write the data in 1M chunks to a new one-file pool and commit the \
                      txg (write MB/s), then import it again and read it back (read MB/s); as \
                      root the page cache is dropped before each read, so the read comes from \
                      the disk. A peer that cannot run (no lz4 or zstd tool, not root, no \
                      btrfs-progs or compsize) is shown as skipped, with why."
    )]
    Compress(BenchCompressArgs),
    /// The block cache (the ARC) against an LRU of the same size, fed the same requests for
    /// 16K blocks: a hot set of half the cache read repeatedly while a scan of four times
    /// the cache runs through, and a Zipf(0.9) workload; the hit ratio of each and their
    /// ratio (median of --runs, each with its own seed).
    Arc(BenchArcArgs),
    /// Sequential reads, one at a time, of a volume read cold (pool just imported, its file
    /// out of the page cache) in 4K, 16K and 128K requests, with prefetch off and on, beside
    /// the same reads of a raw file (the kernel's read-ahead): MB/s, on/off and on/raw.
    Prefetch(BenchPrefetchArgs),
    /// The group-commit paper's sync-write experiment: 3 volumes on a pool of 3 file vdevs,
    /// served over NBD, one client per volume with 100 random writes in flight and a flush
    /// every N writes. Per-request commits with a log per volume (the baseline) against group
    /// commit with one global log, driven by fio's nbd engine and by zeta's own NBD load
    /// generator, next to raw files and nbdkit: IOPS, mean and p99 latency, writes per flush,
    /// log blocks per device, disk bytes per byte written, and ratios.
    #[command(
        after_help = "Points: 4K writes with a flush every 1, 5, 10 and 20 writes, and \
                            8K, 16K and 32K writes with a flush every 5; each at every \
                            --volblocksize. --quick: 4K writes, a flush every 5, volblocksize \
                            128K, 10 s per measurement.\n\n\
                            Each zeta measurement runs on a new pool in a temporary directory \
                            under --dir: `zeta pool create -f -o zil.commit=C -o \
                            zil.placement=P` of three files, three volumes, `zeta serve`; \
                            three plain files serve the raw rows (fio, libaio, fdatasync every \
                            N writes) and `nbdkit file`. Every file is written in full once, \
                            so its blocks are allocated as a device's are, and kept for every \
                            measurement after. fio's nbd engine flushes far \
                            more often than --fsync asks at depth 100: the w/flush column shows \
                            what was sent. The wr amp column is the bytes written to the disk \
                            under --dir per byte the clients wrote (the kernel's counters of \
                            that block device; \"-\" where there is none, as on tmpfs), \
                            dev MB/s the bytes each target wrote to that device per second. \
                            Before the points, fio measures the device's rate for durable \
                            writes (1M writes at random offsets of the plain files, O_DIRECT, \
                            fdatasync every 4, one job per file): a target whose dev MB/s comes \
                            near it with the processor not all busy is bound by the device \
                            (writeback flushed once per txg or fsync can pass it). \
                            cpu us/wr is the server process's processor time per write \
                            (none for the raw files), busy the share of the whole machine's \
                            processor time in use: near 100, every target is bound by the \
                            time it spends per write, the load generator's included. \
                            Needs fio and nbdkit (apt-get install fio nbdkit).\n\n\
                            --json prints one JSON object per line and measurement: bs, fsync \
                            (writes per flush asked), volblocksize (null for raw and nbdkit), \
                            generator, commit, placement, iops, lat_mean_us, lat_p99_us, \
                            worst_second_lat_mean_us (the queue-depth-1 rows of zeta-load: \
                            the mean latency of the run's slowest second), writes_per_flush, \
                            log_blocks_per_device, device_write_bytes, \
                            write_amplification, device_write_mb_per_s, \
                            device_durable_mb_per_s (the device's reference, the same in every \
                            row), server_cpu_us_per_write, machine_busy (0 to 1) (null where \
                            not measured)."
    )]
    Sync(BenchSyncArgs),
    /// Seed 003's table on a Ceph cluster ($CEPH_CONF): a zeta volume on a pool of one RADOS
    /// device (at each --object-sizes), served over NBD and driven by fio's nbd engine,
    /// against an RBD image of the same size driven by fio's rbd engine (librbd): sequential
    /// and random reads and writes at each --block-sizes, queue depth 32, IOPS, mean and p99
    /// latency and the ratio; then random 4K writes with an fsync every 5.
    #[command(
        after_help = "Needs a reachable cluster (../shared/ceph/up.sh starts a throwaway one), \
                      fio with its rbd and nbd engines and the rbd tool (apt-get install fio \
                      ceph-common). Both devices are written whole before the points, so \
                      reads read data and writes overwrite. The Ceph pool is made if missing, \
                      with the cluster's default replication."
    )]
    Rados(BenchRadosArgs),
    /// Seed 002's fragmentation experiment: per fill level a fresh pool on one file, a
    /// volume of 8K blocks filled sequentially to that share of the pool, then --writers
    /// clients overwriting random 8K blocks of it through NBD for --runtime seconds. Prints
    /// the burst (first 10 s) and steady state (mean of the last 50 s) against the pool's
    /// occupancy, and with --peer zfs-fuse the same on zfs-fuse in the same run; writes the
    /// time series and steady-state plots, the metaslab map before and after each level, and
    /// the device write sizes to --out.
    Frag(BenchFragArgs),
    /// zeta-load, `bench sync`'s generator, against any NBD server: random writes with
    /// exactly one flush every N (or FUA on each), a connection per export: IOPS, and the
    /// latency of writes and of flushes.
    #[command(after_help = "Example, against `zeta up`:\n  \
                            zeta bench load --flush-every 5 --depth 100 zeta/vol0\n  \
                            zeta bench load --fua --depth 1 --runtime 30 --interval 1 zeta/vol0\n\
                            Writes random data over the exports: only for scratch volumes.")]
    Load(BenchLoadArgs),
}

#[derive(Args, Debug)]
pub struct BenchLoadArgs {
    /// Exports to write to, one connection each.
    #[arg(required = true, value_name = "EXPORT")]
    pub exports: Vec<String>,
    /// The server's address.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub addr: std::net::SocketAddr,
    /// Size of each write (a multiple of 4K).
    #[arg(long, default_value = "4K")]
    pub bs: String,
    /// A FLUSH after every N-th write.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub flush_every: u32,
    /// Requests in flight per connection, flushes included (at most 256).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub depth: u32,
    /// Seconds to run.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub runtime: u64,
    /// Every write with NBD_CMD_FLAG_FUA and no flushes.
    #[arg(long)]
    pub fua: bool,
    /// Also print the writes answered in each slice of the run this many seconds long
    /// (writes/s, mean, p99 and longest latency): a stall the run's mean hides shows there.
    #[arg(long, value_name = "SECS", value_parser = parse_interval)]
    pub interval: Option<f64>,
}

/// `--interval`: seconds, at least a millisecond.
fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.001 => Ok(v),
        _ => Err("a number of seconds, at least 0.001".into()),
    }
}

#[derive(Args, Debug)]
pub struct BenchSyncArgs {
    /// Print one JSON object per line (a row per measurement) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Only 4K writes with a flush every 5, volblocksize 128K, 10 s per measurement (where
    /// --points, --volblocksize or --runtime do not say otherwise).
    #[arg(long)]
    pub quick: bool,
    /// Directory for the temporary pools and files (on the disk to measure).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Seconds per measurement [default: 30, or 10 with --quick].
    #[arg(long, value_name = "SECS")]
    pub runtime: Option<u64>,
    /// Size of each volume, and of each raw and nbdkit file.
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// Each of the pool's three files is this many times --size, plus 256M for metadata and
    /// the log (written in full before the run), so the volumes fill 1/N of the pool. The
    /// paper's three 10 GB volumes sat on three 500 GB disks (1/50); copy-on-write needs free
    /// room for several txgs of rewritten blocks, so with 128K blocks a fuller pool is bound
    /// by free space rather than by the log.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub pool_scale: u64,
    /// Volume block sizes, comma-separated [default: 128K,16K, or 128K with --quick].
    #[arg(long, value_name = "LIST")]
    pub volblocksize: Option<String>,
    /// Only these points, comma-separated, each a write size and a flush interval: "8K/5,4K/20"
    /// [default: 4K/1,4K/5,4K/10,4K/20,8K/5,16K/5,32K/5, or 4K/5 with --quick].
    #[arg(long, value_name = "LIST")]
    pub points: Option<String>,
    /// Measure everything N times, taking turns (every target of a point once, then again),
    /// and print the run of median IOPS of each target in the tables; with --json, every
    /// run's row, numbered by "run". A shared or virtual machine's speed can drift by a third
    /// within minutes: one run per target can catch one in a slow spell and its peer in a
    /// fast one.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub runs: u32,
    /// Debugging only: create the pools without the zil.* properties and do without `zeta pool
    /// iostat` where it is missing, for builds that predate them. Both configurations are then
    /// the same default pool.
    #[arg(long, hide = true)]
    pub no_zil_props: bool,
}

#[derive(Args, Debug)]
pub struct BenchFragArgs {
    /// Print the results as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A short run for CI: a 512M pool, fills 10,50,90, 8 s each (where the other flags do
    /// not say otherwise).
    #[arg(long)]
    pub quick: bool,
    /// Fill levels, in percent of the pool's size, comma-separated [default:
    /// 10,25,50,75,90].
    #[arg(long, value_name = "LIST")]
    pub fills: Option<String>,
    /// Seconds of random overwrites per fill level [default: 150, or 8 with --quick].
    #[arg(long, value_name = "SECS")]
    pub runtime: Option<u64>,
    /// Concurrent writers (NBD connections for zeta, threads for zfs-fuse).
    #[arg(long, default_value_t = 8)]
    pub writers: u32,
    /// Writes each writer keeps in flight (zfs-fuse's writers, plain write(2) calls, get
    /// as many threads each).
    #[arg(long, default_value_t = 1)]
    pub depth: u32,
    /// Size of the pool's file [default: 4G, or 512M with --quick].
    #[arg(long)]
    pub size: Option<String>,
    /// Also run the experiment on this peer in the same run: zfs-fuse (needs root, the
    /// zfs-fuse package, and a loop device for its vdev).
    #[arg(long, value_name = "PEER")]
    pub peer: Option<String>,
    /// Directory for the temporary pool files (on the disk to measure).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Directory for the plots, maps and results.json (created if missing).
    #[arg(long, default_value = "frag-results")]
    pub out: PathBuf,
    /// Picture format of the plots and maps: svg or png.
    #[arg(long, default_value = "svg")]
    pub format: String,
}

#[derive(Args, Debug)]
pub struct BenchSnapArgs {
    /// The volume's sizes, comma-separated (each peer holds the same bytes at each).
    #[arg(long, default_value = "1G,16G")]
    pub size: String,
    /// Seconds of random 4K overwrites at each snapshot count (on the first size).
    #[arg(long, default_value_t = 3.0)]
    pub iops_secs: f64,
    /// Directory for the files (on the disk to measure).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Times each measurement is repeated; the figures are the median run.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Print the results as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchCompressArgs {
    /// Bytes of each data set (a whole number of MiB).
    #[arg(long, default_value = "256M")]
    pub size: String,
    /// Directory for the pool files, the block files and btrfs's image (on the disk to measure).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Times each measurement is repeated; the figures are the median run.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print the results as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchRadosArgs {
    /// The size of the zeta volume and of the RBD image.
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// Seconds each point runs (after one second of ramp).
    #[arg(long, default_value_t = 5)]
    pub runtime: u64,
    /// The object sizes of zeta's RADOS device, one column each (1M to 16M).
    #[arg(long, default_value = "1M,2M,4M")]
    pub object_sizes: String,
    /// The request sizes of the table.
    #[arg(long, default_value = "4K,8K,16K,32K,64K,128K")]
    pub block_sizes: String,
    /// The Ceph pool both live in (made if missing).
    #[arg(long, default_value = "zeta-bench")]
    pub ceph_pool: String,
    /// Directory for the bench's state directories.
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,
    /// Print the results as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchPrefetchArgs {
    /// The size of the volume and of the raw file.
    #[arg(long, default_value = "256M")]
    pub size: String,
    /// Directory for the pool's file and the raw file (on the disk to measure).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Times each measurement is repeated; the figures are the median run.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print the results as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchArcArgs {
    /// The size of both caches.
    #[arg(long, default_value = "256M")]
    pub cache: String,
    /// Times each workload is run (with a new seed each); the figures are the median run.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print the results as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchScrubArgs {
    /// Data written to the pool's volume (and read back by both).
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// Directory for the vdev files (on the disk to measure).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Times each measurement is repeated; the figures are the median run.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print the results as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchChecksumArgs {
    /// Times each measurement is repeated; the figures are the median run.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Print the results as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
    /// A tiny time budget per measurement (a smoke test, not a measurement).
    #[arg(long)]
    pub quick: bool,
}

#[derive(Args, Debug)]
pub struct BenchRaidzArgs {
    /// Bytes written per layout.
    #[arg(long, default_value = "2G")]
    pub size: String,
    /// Volume block size (the paper's file system wrote 128K records).
    #[arg(long, default_value = "128K")]
    pub block_size: String,
    /// Directory for the vdev files (on the disk to measure).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Times each measurement is repeated; the figures are the median run.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print the results as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchVolArgs {
    /// Size of the volume and of the raw file.
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// Directory for the pool's file and the raw file (on the disk to measure).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Random operations per random workload.
    #[arg(long, default_value_t = 20000)]
    pub random_ops: u64,
    /// Times each measurement is repeated; the figures are the median run.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Run only these workloads (comma-separated, e.g. `seqread,randwrite`); all by default.
    #[arg(long, value_delimiter = ',', value_parser = ["seqwrite", "seqread", "randwrite", "randread"])]
    pub only: Vec<String>,
    /// Print the results as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub memory: MemoryArgs,
}

#[derive(Args, Debug)]
pub struct BenchParityArgs {
    /// Times each measurement is repeated; the figures are the median run.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Print the results as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
    /// Only 4 KiB columns and a tiny time budget (a smoke test, not a measurement).
    #[arg(long)]
    pub quick: bool,
    /// Measure only these geometries (4+1, 4+2, 8+2, 16+2, 8+3; repeatable).
    #[arg(long, value_name = "K+P")]
    pub geometry: Vec<String>,
}
