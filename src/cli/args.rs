//! Command-line grammar, in the style of zpool(8) and zfs(8).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use zeta_server::memory::MemoryArgs;

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
    Bench(zeta_bench::args::BenchCmd),
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
    /// Show volumes' properties, as `zfs get`.
    #[command(after_help = PROPERTIES_HELP)]
    Get(GetArgs),
    /// Set a volume's property, as `zfs set`.
    #[command(after_help = PROPERTIES_HELP)]
    Set(SetArgs),
    /// Take snapshots of volumes, all in one transaction group (as `zfs snapshot`): each
    /// holds its volume exactly as that txg committed it, read-only, sharing every block with
    /// the volume until the volume rewrites it. Constant time whatever the volume's size.
    #[command(after_help = "Examples:\n  zeta snapshot tank/vm0@monday\n  \
                            zeta snapshot tank/vm0@s1 tank/vm1@s1   (both at once)\n\n\
                            See them with `zeta list -t snapshot`, remove one with \
                            `zeta destroy tank/vm0@monday`.")]
    Snapshot(SnapshotArgs),
    /// List volumes and snapshots with their space, as `zfs list`.
    #[command(after_help = LIST_HELP)]
    List(ListArgs),
    /// Destroy a snapshot (POOL/VOL@SNAP), freeing the blocks it alone held; or a volume
    /// (POOL/VOL), which -r destroys with its snapshots.
    Destroy(DestroyArgs),
    /// Roll a volume back to its latest snapshot (as `zfs rollback`): what was written since
    /// is freed, and the volume reads as the snapshot at once. Refused while the volume is
    /// open (a client connected to its export, a copy in or out): disconnect them first.
    #[command(after_help = "Examples:\n  zeta rollback tank/vm0@before\n  \
                            zeta rollback -r tank/vm0@monday   (destroys the newer snapshots)")]
    Rollback(RollbackArgs),
    /// Write a snapshot as a stream (to stdout, or -o FILE): whole, or with -i the changes
    /// since an earlier snapshot of the same volume, read from the blocks born since it only.
    /// The stream is versioned and every record checksummed (docs/format.md).
    #[command(after_help = "Examples:\n  zeta send tank/vm0@mon > mon.zs\n  \
                            zeta send -i @mon tank/vm0@tue > mon-tue.zs\n  \
                            zeta send tank/vm0@mon | zeta receive backup/vm0\n\n\
                            On a pool `zeta serve` holds, the server writes the stream: \
                            give -o FILE.")]
    Send(SendArgs),
    /// Make a volume from a stream (stdin, or -f FILE) that `zeta send` wrote, ending in the
    /// snapshot it carries: a full stream makes a new volume; an incremental one applies to
    /// the volume whose latest snapshot is its base. A stream refused part-way (damaged, cut
    /// short) leaves no new volume, or the volume as it was.
    #[command(after_help = "Examples:\n  zeta receive backup/vm0 < mon.zs\n  \
                            zeta receive backup/vm0 < mon-tue.zs\n  \
                            zeta receive -F backup/vm0 -f mon-tue.zs   (rolls back changes made since @mon)")]
    Receive(ReceiveArgs),
    /// Make a writable volume from a snapshot (as `zfs clone`): it shares every block with the
    /// snapshot until it rewrites it, in constant time, and reserves nothing. The snapshot
    /// cannot be destroyed while the clone exists.
    #[command(after_help = "Example:\n  zeta clone tank/golden@v1 tank/vm7")]
    Clone(CloneArgs),
    /// Make a clone its origin's parent (as `zfs promote`): the snapshots of the origin's
    /// volume up to and including the clone's origin become the clone's (VOL@SNAP keeps its
    /// SNAP), and that volume becomes a clone of the origin, so it can then be destroyed while
    /// the clone lives on. Refused while a snapshot that would move is open, or if the clone
    /// has a snapshot of the same name.
    #[command(
        after_help = "Example (replace a golden image by its edited clone):\n  \
                            zeta clone tank/golden@v1 tank/golden-new\n  \
                            zeta promote tank/golden-new\n  \
                            zeta destroy -r tank/golden"
    )]
    Promote(PromoteArgs),
}

#[derive(Args, Debug, Clone)]
pub struct PromoteArgs {
    /// POOL/VOL, a clone.
    pub name: String,
}

#[derive(Args, Debug, Clone)]
pub struct CloneArgs {
    /// POOL/VOL@SNAP to clone.
    pub origin: String,
    /// POOL/NEW, of the same pool.
    pub name: String,
}

#[derive(Args, Debug, Clone)]
pub struct SendArgs {
    /// POOL/VOL@SNAP (with -t: the POOL that holds it)
    pub name: String,
    /// Send the rest of an interrupted stream: TOKEN is the receiving volume's
    /// `receive_resume_token` (zeta get), which names the snapshot, its base and where to go on.
    #[arg(short = 't', value_name = "TOKEN", conflicts_with = "from")]
    pub token: Option<String>,
    /// Send the changes since this earlier snapshot (@SNAP, or POOL/VOL@SNAP).
    #[arg(short = 'i', value_name = "BASE")]
    pub from: Option<String>,
    /// Write the stream to FILE instead of stdout (refused if it exists).
    #[arg(short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct ReceiveArgs {
    /// POOL/VOL to make, or to apply an incremental stream to.
    pub name: String,
    /// Read the stream from FILE instead of stdin.
    #[arg(short = 'f', value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// For an incremental stream: roll the volume back to its latest snapshot first if it
    /// was written since.
    #[arg(short = 'F')]
    pub force: bool,
    /// Resumable: if the stream stops part-way (cut, damaged, out of room), keep what was
    /// received and print a resume token (`zeta send -t TOKEN POOL`) instead of undoing it.
    #[arg(short = 's')]
    pub resumable: bool,
    /// Give up the volume's interrupted receive: a volume a full stream was making is
    /// destroyed, one an incremental stream was changing rolled back to its base. Reads no
    /// stream.
    #[arg(short = 'A', conflicts_with_all = ["file", "force", "resumable"])]
    pub abort: bool,
}

#[derive(Args, Debug, Clone)]
pub struct RollbackArgs {
    /// POOL/VOL@SNAP
    pub name: String,
    /// Destroy the snapshots newer than SNAP first.
    #[arg(short = 'r')]
    pub recursive: bool,
}

const LIST_HELP: &str = "Columns:\n  \
    USED      what destroying it would free: a snapshot's blocks no other tree holds; a \
    volume's blocks, its snapshots' and its unused reservation\n  \
    USEDSNAP  what a volume's snapshots hold that it no longer does (usedbysnapshots)\n  \
    REFER     what its tree holds (referenced)\n  \
    WRITTEN   what was written since the snapshot before it (a volume: since its latest)\n\n\
    Examples:\n  zeta list\n  zeta list -t snapshot tank\n  zeta list -t all -Hp --json";

#[derive(Args, Debug, Clone)]
pub struct SnapshotArgs {
    /// POOL/VOL@SNAP (several allowed, of one pool: taken together).
    #[arg(required = true)]
    pub names: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct ListArgs {
    /// What to list: volume, snapshot, or all.
    #[arg(
        short = 't',
        long = "type",
        default_value = "volume",
        value_name = "TYPE"
    )]
    pub kind: String,
    /// For scripts: no header, fields separated by a tab.
    #[arg(short = 'H')]
    pub scripted: bool,
    /// Exact numbers (bytes) instead of sizes such as 1.5G.
    #[arg(short = 'p')]
    pub parsable: bool,
    /// Print as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
    /// Pools, volumes (POOL/VOL: it and its snapshots) to list; default: every pool.
    pub names: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct DestroyArgs {
    /// POOL/VOL@SNAP, or POOL/VOL.
    pub name: String,
    /// A volume: destroy its snapshots too.
    #[arg(short = 'r')]
    pub recursive: bool,
    /// A volume that holds data: destroy it without asking.
    #[arg(short, long)]
    pub force: bool,
}

const PROPERTIES_HELP: &str = "Properties:\n  \
    type            volume or snapshot (POOL/VOL@SNAP: every property read-only)\n  \
    volsize         the volume's size (settable: grows it; shrink with `zeta vol resize -f`)\n  \
    volblocksize    its block size, fixed when it is created\n  \
    checksum        the algorithm of its new blocks (settable: fletcher2, fletcher4, sha256,\n  \
                    blake3; the blocks it holds keep theirs)\n  \
    compression     how its new blocks are stored (settable: off, on = lz4, lz4, zstd =\n  \
                    zstd-3, zstd-1 … zstd-19; a block is stored compressed only where that\n  \
                    saves a sector; the blocks it holds keep theirs)\n  \
    refreservation  the raw bytes the pool keeps for it (0: sparse) (settable: auto, the whole\n  \
                    volume; none)\n  \
    readonly        on: clients' writes are refused (NBD serves it read-only); zeta receive,\n  \
                    rollback and resize still change it (settable: on, off)\n  \
    used            the bytes its blocks take on the devices (a snapshot: those it alone holds)\n  \
    referenced      the bytes its tree holds\n  \
    usedbysnapshots what its snapshots hold that it no longer does\n  \
    written         bytes written since its latest snapshot (a snapshot: since the one before)\n  \
    logicalused     what its tree's blocks hold before compression (the blocks only its\n  \
                    snapshots hold are not counted)\n  \
    logicalreferenced  the same, as zfs names it for what a tree references\n  \
    compressratio   logicalused over what those blocks store (1.00x: nothing saved)\n  \
    origin          a clone's snapshot of origin, - otherwise\n  \
    receive_resume_token  of a volume an interrupted `zeta receive -s` left partly received:\n  \
                    give it to `zeta send -t TOKEN POOL` on the sender; - otherwise\n  \
    guid            its unique identifier\n  \
    createtxg       the txg it was created in\n\n\
    Examples:\n  \
    zeta get all tank/vm0\n  \
    zeta get -Hp volsize,used tank/vm0 tank/vm1\n  \
    zeta get written,referenced tank/vm0@monday\n  \
    zeta set volsize=20G tank/vm0\n  \
    zeta set compression=zstd tank/vm0\n  \
    zeta set readonly=on backup/vm0";

#[derive(Args, Debug, Clone)]
pub struct GetArgs {
    /// `all`, or properties separated by commas.
    pub props: String,
    /// POOL/VOL (several allowed, of one pool).
    #[arg(required = true)]
    pub names: Vec<String>,
    /// For scripts: no header, fields separated by a tab.
    #[arg(short = 'H')]
    pub scripted: bool,
    /// Exact numbers (bytes) instead of sizes such as 1.5G.
    #[arg(short = 'p')]
    pub parsable: bool,
    /// Print as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct SetArgs {
    /// PROP=VALUE
    pub assignment: String,
    /// POOL/VOL
    pub name: String,
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
    /// Show the block cache (the ARC) of a pool: hits, misses, prefetch and ghost hits, the
    /// bytes of each list (T1 recent, T2 frequent, their ghosts B1 and B2), the target of T1,
    /// and how much of it is kept compressed, as `arcstat` does.
    #[command(
        after_help = "Without INTERVAL: the counters since the pool was opened, once. With \
                      INTERVAL (seconds): a line every INTERVAL with the hits and misses of \
                      that interval, COUNT times (forever without COUNT). The cache is the \
                      server's: a pool that `zeta serve` holds is asked over its control \
                      socket; one that is not served is opened by this command, whose cache \
                      starts empty. --json prints one object per report (per line with \
                      INTERVAL): pool, hits, misses, prefetch_hits, ghost_hits_b1, \
                      ghost_hits_b2, t1, t2, b1, b2 (bytes), p (T1's target), c (the \
                      capacity now), ghost_entries, compressed_bytes, compressed_logical_bytes."
    )]
    Arcstat {
        /// The pool's name.
        pool: String,
        /// Seconds between reports.
        interval: Option<f64>,
        /// Reports to print (with INTERVAL).
        count: Option<u64>,
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
    /// `zeta get`, run where the pool is (here, or by the server that serves it).
    #[command(skip)]
    PropGet(GetArgs),
    /// `zeta set`, likewise.
    #[command(skip)]
    PropSet(SetArgs),
    /// `zeta snapshot`, likewise.
    #[command(skip)]
    Snapshot(SnapshotArgs),
    /// `zeta list`, likewise.
    #[command(skip)]
    DsList(ListArgs),
    /// `zeta destroy`, likewise.
    #[command(skip)]
    DsDestroy(DestroyArgs),
    /// `zeta rollback`, likewise.
    #[command(skip)]
    DsRollback(RollbackArgs),
    /// `zeta send`, likewise.
    #[command(skip)]
    DsSend(SendArgs),
    /// `zeta receive`, likewise.
    #[command(skip)]
    DsReceive(ReceiveArgs),
    /// `zeta clone`, likewise.
    #[command(skip)]
    DsClone(CloneArgs),
    /// `zeta promote`, likewise.
    #[command(skip)]
    DsPromote(PromoteArgs),
    /// Create a volume of SIZE bytes (suffixes K, M, G, T). It reserves the room to be
    /// written whole (refreservation, as `zfs create -V`): refused if the pool has not that
    /// much available; -s makes a sparse volume, which reserves nothing.
    Create {
        /// Block size, a power of two from 4K to 128K.
        #[arg(short = 'b', default_value = "16K", value_name = "SIZE")]
        block_size: String,
        /// Sparse: reserve nothing; writes may then meet a full pool.
        #[arg(short = 's', long)]
        sparse: bool,
        /// Property KEY=VALUE: checksum=fletcher2|fletcher4|sha256|blake3 (default: the
        /// pool's); compression=off|on|lz4|zstd|zstd-N (default off).
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
