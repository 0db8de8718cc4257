//! Command-line grammar, in the style of zpool(8) and zfs(8).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "zeta",
    version,
    about = "Copy-on-write, checksummed, pooled storage in user space",
    long_about = "zeta pools files or block devices into a copy-on-write, checksummed store and \
                  keeps volumes on it.\n\nKnown pools are remembered in $ZETA_HOME (default: \
                  $XDG_STATE_HOME/zeta or ~/.local/state/zeta)."
)]
pub struct Cli {
    /// State directory holding the pool cache file (overrides $ZETA_HOME).
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create, import, inspect and remove pools.
    #[command(subcommand)]
    Pool(PoolCmd),
    /// Create, resize and copy data into and out of volumes.
    #[command(subcommand)]
    Vol(VolCmd),
    /// Benchmarks that print ratios against a reference measured in the same run.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Serve every volume of the given pools (default: all known pools) over NBD.
    #[command(after_help = "Each volume is exported as POOL/VOL, e.g.\n  \
                            nbdinfo nbd://127.0.0.1:10809/tank/vm0\n  \
                            qemu-img info nbd://127.0.0.1:10809/tank/vm0\n\n\
                            SIGINT, SIGTERM or SIGHUP stops the server cleanly: in-flight requests \
                            finish and reply, the pools sync and close.")]
    Serve(ServeArgs),
    /// Inject faults into a device of a pool, to test or rehearse a failure: silent
    /// corruption of allocated sectors, failing reads or writes, or a device that vanishes.
    #[command(
        after_help = "Failures and --vanish act on a served pool (through `zeta serve`) \
                            and last until --clear or the server stops. --corrupt overwrites \
                            sectors on the device itself and works on any pool; a scrub \
                            finds and repairs what the redundancy allows.\n\nExamples:\n  \
                            zeta inject tank /var/zeta/b --corrupt 100\n  \
                            zeta inject tank /var/zeta/b --fail-reads 0.5\n  \
                            zeta inject tank /var/zeta/b --full\n  \
                            zeta inject tank /var/zeta/b --vanish\n  \
                            zeta inject tank /var/zeta/b --clear"
    )]
    Inject(InjectArgs),
    /// The embedded default: create (on first use) a pool of files under ./zeta-data with a
    /// volume, and serve it over NBD on 127.0.0.1:10809.
    Up(UpArgs),
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("fault").required(true).args(["corrupt", "fail_reads", "fail_writes", "full", "vanish", "clear"])))]
pub struct InjectArgs {
    /// The served pool.
    pub pool: String,
    /// The device's path as `zeta pool status` shows it.
    pub device: String,
    /// Overwrite N random allocated sectors of the device with random bytes.
    #[arg(long, value_name = "N")]
    pub corrupt: Option<usize>,
    /// Make data reads fail with probability P (0 to 1).
    #[arg(long, value_name = "P")]
    pub fail_reads: Option<f64>,
    /// Make data writes fail with probability P (0 to 1).
    #[arg(long, value_name = "P")]
    pub fail_writes: Option<f64>,
    /// Make data writes fail with ENOSPC, as when the file system under a file device has
    /// filled: the device is NOSPACE while other copies take the writes; once no copy of a
    /// txg can be written the pool suspends (writes and flushes get ENOSPC) and waits for
    /// room. --clear makes room: the pool resumes by itself and the device is resilvered.
    #[arg(long)]
    pub full: bool,
    /// Make every I/O to the device fail, labels and flushes included, as if it were pulled.
    #[arg(long)]
    pub vanish: bool,
    /// Remove the injected failures.
    #[arg(long)]
    pub clear: bool,
    /// Seed for --corrupt's choice of sectors.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Subcommand, Debug)]
pub enum PoolCmd {
    /// Create a pool. VDEV is a path (file or block device), `mirror PATH PATH...`, or
    /// `raidz1|raidz2|raidz3 PATH...` (3 to 24 devices, 1 to 3 of which may fail); `log`
    /// starts the separate log devices (`log PATH`, `log mirror PATH PATH`).
    #[command(
        after_help = "Examples:\n  zeta pool create -o size=1G tank /var/zeta/a\n  \
                            zeta pool create -o size=1G tank mirror /var/zeta/a /var/zeta/b\n  \
                            zeta pool create -o size=1G tank raidz2 /var/zeta/d{1,2,3,4,5,6}\n  \
                            zeta pool create -o size=1G tank mirror /var/zeta/a /var/zeta/b log /var/zeta/l\n\n\
                            After `log`, every device is a separate log device (or `log mirror \
                            PATH PATH...`): the intent log writes there instead of the data \
                            devices' log reserve. \
                            Properties (-o): size=SIZE creates missing file vdevs of that size, \
                            sparse unless prealloc=on, which allocates their blocks at once so \
                            the file system cannot fill under the pool later; \
                            checksum=fletcher2|fletcher4|sha256|blake3 (default fletcher4); \
                            raidz2-code=rs|rdp: the double-parity code of raidz2 vdevs, \
                            Reed-Solomon P+Q or row-diagonal parity (default rs); \
                            zil.commit=group|per-request: a FLUSH or FUA write joins one \
                            group commit of everything queued, or writes and flushes its own \
                            log block, one at a time (default group); \
                            zil.placement=global|per-volume: one rotor spreads every volume's \
                            log blocks over the devices, or each volume has its own rotor \
                            (default global)."
    )]
    Create {
        /// Use devices even if they belong to another pool.
        #[arg(short, long)]
        force: bool,
        /// Property KEY=VALUE (size=, prealloc=, checksum=, raidz2-code=, zil.commit=,
        /// zil.placement=).
        #[arg(short = 'o', value_name = "KEY=VAL")]
        props: Vec<String>,
        /// The new pool's name.
        pool: String,
        /// The devices and their layout (see above).
        #[arg(required = true, num_args = 1.., value_name = "VDEV")]
        vdevs: Vec<String>,
    },
    /// Import a pool from the devices in DIR (repeatable); without POOL, list what is there
    /// or import the only pool found.
    #[command(
        after_help = "A device that is missing, truncated, unreadable or now part of \
                            another pool counts as missing: the pool imports DEGRADED when \
                            its redundancy allows, and says which devices it went without and \
                            why. A pool whose devices another process holds open (a running \
                            `zeta serve`) is refused as in use.\n\n\
                            Examples:\n  zeta pool import -d /var/zeta\n  \
                            zeta pool import -d /var/zeta tank\n  \
                            zeta pool import -d /var/zeta tank tank2    # under a new name\n  \
                            zeta pool import -d /var/zeta -f tank       # last held elsewhere\n  \
                            zeta pool import -d /var/zeta -o readonly=on tank"
    )]
    Import {
        /// A directory to look for devices in (default /dev); repeatable.
        #[arg(short = 'd', value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// readonly=on: open the pool without writing a byte to its devices (no txg, no
        /// label, no intent-log replay: volumes read as of the last txg; no scrub, no repair
        /// of bad copies a read finds). Every command that would change it is refused, and it
        /// is served read-only, until it is exported and imported again without this.
        #[arg(short = 'o', value_name = "PROP=VALUE")]
        props: Vec<String>,
        /// Import a pool that was not exported and whose labels say another host or another
        /// state directory ($ZETA_HOME) had it last: only once sure that nothing uses it
        /// there (a pool open in two places at once is destroyed). Devices a process on this
        /// host holds open are refused even so.
        #[arg(short, long)]
        force: bool,
        /// The pool to import (its name as the listing shows it).
        pool: Option<String>,
        /// Import it under this name instead (the new name is written to its labels).
        #[arg(requires = "pool")]
        new_name: Option<String>,
        /// Print as JSON: with no POOL, list what is there (even a single pool) rather than
        /// import it.
        #[arg(long)]
        json: bool,
        /// Import even if a volume's intent log cannot be read (its device is missing, or no
        /// copy of one of its blocks reads without an I/O error), losing the synchronous
        /// writes it held past that point since the last txg; says what is lost.
        #[arg(long)]
        discard_log: bool,
    },
    /// Sync a pool, mark it exported and forget it.
    Export {
        /// The pool's name.
        pool: String,
    },
    /// List imported pools with their space: SIZE, ALLOC, FREE and CAP raw, as `zpool
    /// list` counts them (parity included); FREEING freed but not yet allocatable (frees wait
    /// two txgs; `zeta pool sync` brings them); FRAG how much of the free space lies in
    /// small segments (0 % one free extent per metaslab, 100 % all in 512-byte slivers; the
    /// weights of `zpool list`'s FRAG, `zeta pool map` shows it per metaslab); USABLE and
    /// AVAIL what volumes of 16K blocks can hold, after raidz parity and padding, as `zfs
    /// list` counts it.
    List {
        /// Print as JSON, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Draw every metaslab of a pool as a cell coloured and labelled by its free percentage
    /// and its fragmentation (FRAG in `pool list`): compact after sequential writes,
    /// scattered after random overwrites.
    #[command(after_help = "Examples:\n  zeta pool map tank -o tank.svg\n  \
                            zeta pool map tank -o tank.png\n  zeta pool map tank --json\n\n\
                            Without -o or --json it prints one line per vdev and the pool's \
                            free-segment histogram.")]
    Map {
        /// The pool's name.
        pool: String,
        /// Write the picture here: FILE.svg or FILE.png.
        #[arg(short = 'o', value_name = "FILE")]
        output: Option<PathBuf>,
        /// Print the numbers as JSON: every metaslab's free bytes, largest free segment,
        /// segment count and fragmentation, each vdev's and the pool's, and the histogram.
        #[arg(long)]
        json: bool,
    },
    /// Show the health and layout of pools.
    Status {
        /// One pool (default: every imported pool).
        pool: Option<String>,
        /// Print as JSON, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Commit a transaction group now: everything written so far goes into the pool's
    /// block tree (not only into the intent log), as `zpool sync` does; then the txgs that
    /// make the space freed until then (FREEING in `pool list`) allocatable again.
    Sync {
        /// The pool's name.
        pool: String,
    },
    /// Show the intent log's counters since the pool was opened: log blocks and bytes per
    /// vdev, sync requests, records per commit batch and per block, mean batch latency,
    /// device flushes and fallbacks to a txg sync; and the data writes that reached the
    /// devices, by size (small random writes should leave in large runs).
    Iostat {
        /// The pool's name.
        pool: String,
        /// Print as JSON, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Scrub a pool: read every copy of every block (mirror children, raidz parity
    /// included), verify it, and repair what the redundancy allows.
    #[command(
        after_help = "A served pool is scrubbed in the background by `zeta serve`, \
                            throttled behind the volumes' own I/O; --wait follows it to the \
                            end. A pool that is not served is scrubbed by this command, which \
                            then always waits. A scrub survives export and import: it resumes \
                            where it stopped. `zeta pool status` shows its progress and \
                            findings."
    )]
    Scrub {
        /// Follow the scrub until it ends, with a progress line.
        #[arg(long)]
        wait: bool,
        /// Cancel the running scrub.
        #[arg(long, conflicts_with = "wait")]
        stop: bool,
        /// The pool's name.
        pool: String,
    },
    /// Take a device offline: no I/O reaches it, and the transaction groups it misses are
    /// recorded. Refused where its vdev would lose more devices than its redundancy allows.
    Offline {
        /// The pool's name.
        pool: String,
        /// The device's path as `zeta pool status` shows it.
        device: String,
    },
    /// Bring an offline device back: it is resilvered with exactly what it missed.
    Online {
        /// The pool's name.
        pool: String,
        /// The device's path as `zeta pool status` shows it.
        device: String,
    },
    /// Replace a device (present or missing) by a new one, which is rebuilt in full from the
    /// redundancy. NEW is created as a file of the size of its siblings if it does not exist,
    /// with its blocks allocated at once if theirs are (`pool create -o prealloc=on`).
    #[command(
        after_help = "On a served pool the server replaces the device in place and \
                            rebuilds it (a resilver) while it serves I/O; otherwise the \
                            rebuild runs in this command (and resumes at the next import if \
                            interrupted)."
    )]
    Replace {
        /// Use NEW even if it belongs to another pool.
        #[arg(short, long)]
        force: bool,
        /// The pool's name.
        pool: String,
        /// The device to replace, its path as `zeta pool status` shows it.
        old: String,
        /// The new device: a file (created if missing) or a block device.
        new: PathBuf,
    },
    /// Add separate log devices to a pool, while it runs: `log PATH...` (each device a log
    /// vdev of its own) or `log mirror PATH PATH...`. From then on the intent log's blocks go
    /// there instead of the data devices' log reserve.
    #[command(after_help = "Examples:\n  zeta pool add tank log /dev/nvme0n1\n  \
                            zeta pool add --size 1G tank log mirror /var/zeta/l1 /var/zeta/l2\n\n\
                            A pool may also get its log devices at creation: \
                            zeta pool create tank mirror A B log C. On a served pool the \
                            server adds them (paths are taken from this directory).")]
    Add {
        /// Use devices even if they belong to another pool.
        #[arg(short, long)]
        force: bool,
        /// Create missing files of this size (e.g. 512M, 1G), allocated at once if the
        /// pool's files are (`pool create -o prealloc=on`).
        #[arg(long, value_name = "SIZE")]
        size: Option<String>,
        /// The pool's name.
        pool: String,
        /// `log` followed by the devices (see above).
        #[arg(required = true, num_args = 1.., value_name = "VDEV")]
        vdevs: Vec<String>,
    },
    /// Remove a log device while the pool runs (DEVICE: one of its paths, as `zeta pool
    /// status` shows it; a log mirror goes as a whole). The volumes' logs move to the other
    /// log devices, or to the data devices' log reserve; nothing they hold is lost. Data
    /// devices cannot be removed.
    Remove {
        /// The pool's name.
        pool: String,
        /// The log device, its path as `zeta pool status` shows it.
        device: String,
    },
    /// Zero the READ/WRITE/CKSUM error counters of every device of a pool, and return
    /// FAULTED devices to service (each is resilvered with what it missed). It does not
    /// resume a SUSPENDED pool: one waiting for room resumes by itself once room is made,
    /// one suspended by a device failure when the server is restarted.
    Clear {
        /// The pool's name.
        pool: String,
    },
    /// Clear the zeta labels of a device no pool uses any more (one replaced or removed by an
    /// older zeta, or of a pool given up on), so that no import finds it and any pool can
    /// take it without -f.
    Labelclear {
        /// Clear the labels of a device of a pool that is not imported here and was not
        /// destroyed (exported, or not exported at all): that pool loses the device.
        #[arg(short, long)]
        force: bool,
        /// The device (file or block device).
        device: PathBuf,
    },
    /// Destroy a pool: its devices are marked free for reuse and its data is gone.
    Destroy {
        /// Required: destroying a pool cannot be undone.
        #[arg(short, long)]
        force: bool,
        /// The pool's name.
        pool: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum VolCmd {
    /// Create a volume of SIZE bytes (suffixes K, M, G, T).
    Create {
        /// Block size, a power of two from 4K to 128K.
        #[arg(short = 'b', default_value = "16K", value_name = "SIZE")]
        block_size: String,
        /// Property KEY=VALUE (checksum=fletcher2|fletcher4|sha256|blake3; default: the pool's).
        #[arg(short = 'o', value_name = "KEY=VAL")]
        props: Vec<String>,
        /// POOL/VOL
        name: String,
        /// Its size (suffixes K, M, G, T).
        size: String,
    },
    /// List volumes.
    List {
        /// One pool's volumes (default: every imported pool's).
        pool: Option<String>,
        /// Print as JSON, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Destroy a volume and free its space. One that holds data needs -f, or its name typed
    /// on a terminal.
    Destroy {
        /// POOL/VOL
        name: String,
        /// Destroy it even though it holds data, without asking.
        #[arg(short, long)]
        force: bool,
    },
    /// Change a volume's size. Shrinking discards the data past the new end, and needs -f
    /// or the volume's name typed on a terminal.
    Resize {
        /// POOL/VOL
        name: String,
        /// The new size (suffixes K, M, G, T).
        size: String,
        /// Shrink without asking.
        #[arg(short, long)]
        force: bool,
    },
    /// Copy FILE into the volume starting at byte 0 (or --offset).
    Put {
        /// POOL/VOL
        name: String,
        /// The file to copy in.
        file: PathBuf,
        /// Where in the volume the copy starts (suffixes K, M, G, T).
        #[arg(long, default_value = "0")]
        offset: String,
    },
    /// Copy the volume's whole contents into FILE, sparse: the volume's holes and blocks
    /// of zeros stay holes in the file (as `cp --sparse=always` does).
    Get {
        /// POOL/VOL
        name: String,
        /// The file to copy out to: created; an existing one only with --force, and never
        /// a device of a pool that is open or imported here.
        file: PathBuf,
        /// Overwrite FILE if it exists.
        #[arg(short, long)]
        force: bool,
    },
}

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Directory for the default pool's files.
    #[arg(long, default_value = "zeta-data")]
    pub dir: PathBuf,
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Pools to serve (default: every pool in the pool cache).
    pub pools: Vec<String>,
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
}

/// The memory a long-running command uses for each pool it holds. Together with the
/// server's --max-inflight they bound the process: it keeps its resident size within their
/// sum, giving up cached blocks (never below a quarter of --cache) when the rest of its
/// memory needs the room.
#[derive(Args, Debug, Clone)]
pub struct MemoryArgs {
    /// Recently used blocks kept in memory, per pool.
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    pub cache: String,
    /// Written data a pool holds in memory before writers wait for a txg to sync [default:
    /// a tenth of the machine's memory (or of the cgroup's limit), between 128M and 4G].
    /// A txg syncs once a quarter of it is held: larger txgs rewrite each indirect block
    /// once for more of the data blocks under it.
    #[arg(long, value_name = "SIZE")]
    pub dirty_max: Option<String>,
}

#[derive(Args, Debug)]
pub struct NetArgs {
    /// Address and port to listen on.
    #[arg(long, default_value = "127.0.0.1:10809", value_name = "ADDR:PORT")]
    pub listen: String,
    /// Connections served at once (past their handshake); further clients get a clear
    /// refusal.
    #[arg(long, default_value_t = 64)]
    pub max_connections: usize,
    /// Handshakes in progress at once (they hold no serving slot); one more ends the
    /// oldest.
    #[arg(long, default_value_t = 32)]
    pub max_handshakes: usize,
    /// Seconds a client has for its whole handshake before it is dropped.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub handshake_timeout: u64,
    /// Seconds a client may leave its replies unread (the socket full) before it is
    /// dropped.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub write_timeout: u64,
    /// Export every volume read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Request payloads and read buffers held in memory at once, server-wide (at least 32M,
    /// the largest request).
    #[arg(long, default_value = "32M", value_name = "SIZE")]
    pub max_inflight: String,
    /// TLS (NBD_OPT_STARTTLS): off; on (offered, clients may go without); require (every
    /// option but STARTTLS is refused before the upgrade). Needs --tls-certificates or
    /// --tls-psk.
    #[arg(long, value_enum, default_value = "off")]
    pub tls: TlsArg,
    /// X.509 credentials: a directory with server-cert.pem and server-key.pem, and with
    /// ca-cert.pem to accept only clients whose certificate that CA signed (the layout
    /// nbdkit and qemu use).
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Pre-shared keys: a file of `username:hexkey` lines, as psktool writes them.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsArg {
    /// No TLS.
    Off,
    /// TLS offered; clients may go without.
    On,
    /// TLS before anything else.
    Require,
}

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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every subcommand and every argument of every subcommand says what it is in `--help`.
    #[test]
    fn every_command_and_argument_is_explained() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                let p = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(p.clone());
                }
                walk(sub, &p, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "zeta", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }
}
