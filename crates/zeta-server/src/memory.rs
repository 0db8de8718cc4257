//! The memory of a long-running command (the server, the benchmarks): the limits it is given
//! and a governor that keeps its resident size within them.
//!
//! Each pool's block cache and dirty limit are the memory the user configures (`--cache`,
//! `--dirty-max`, and the server's `--max-inflight` for request buffers). The rest of the
//! process — its code, the pools' metadata, free memory the heap has not handed back —
//! takes room too. The governor measures that rest every 25 ms and lowers the
//! caches' limits by as much, so that with every cache full and every pool at its dirty
//! limit the process still stays within the sum. ZFS's ARC gives way to memory pressure
//! the same way; here the pressure is the configured budget, not the machine's free memory.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::fmt::parse_size;
use crate::{usage, Result};
use zeta_core::dsl::Pool;

/// The memory a long-running command uses for each pool it holds. Together with the
/// server's --max-inflight they bound the process: it keeps its resident size within their
/// sum, giving up cached blocks (never below a quarter of --cache) when the rest of its
/// memory needs the room.
#[derive(clap::Args, Debug, Clone)]
pub struct MemoryArgs {
    /// Blocks kept in memory (the ARC: blocks read lately and blocks read often), per pool.
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    pub cache: String,
    /// Written data a pool holds in memory before writers wait for a txg to sync [default:
    /// a tenth of the machine's memory (or of the cgroup's limit), between 128M and 4G].
    /// A txg syncs once a quarter of it is held: larger txgs rewrite each indirect block
    /// once for more of the data blocks under it.
    #[arg(long, value_name = "SIZE")]
    pub dirty_max: Option<String>,
    /// Do not read ahead of sequential readers (prefetch fills the cache with up to 8M per
    /// stream, at most an eighth of --cache, before the reader asks).
    #[arg(long)]
    pub no_prefetch: bool,
}

/// Parsed `MemoryArgs`.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub cache: u64,
    pub dirty_max: u64,
    pub prefetch: bool,
}

impl Limits {
    pub fn parse(args: &MemoryArgs) -> Result<Limits> {
        let cache = parse_size(&args.cache)?;
        let dirty_max = match &args.dirty_max {
            Some(size) => parse_size(size)?,
            None => default_dirty_max(memory_size()),
        };
        if cache < 1 << 20 {
            return Err(usage("--cache must be at least 1M"));
        }
        if dirty_max < 1 << 20 {
            return Err(usage("--dirty-max must be at least 1M"));
        }
        Ok(Limits {
            cache,
            dirty_max,
            prefetch: !args.no_prefetch,
        })
    }

    /// Gives `pool` these limits.
    pub fn apply(&self, pool: &Pool) {
        pool.set_memory_limits(self.cache, self.dirty_max);
        pool.set_prefetch(self.prefetch);
    }
}

/// The dirty limit when none is given: a tenth of `memory` (the machine's, or its cgroup's
/// limit), kept between 128M and 4G, as OpenZFS sizes `zfs_dirty_data_max` (and caps it
/// with `zfs_dirty_data_max_max`).
///
/// The limit sets the size of a txg, and a small txg costs the sync thread dearly under
/// random writes: each rewrites most of a volume's indirect blocks for a few data blocks
/// under each. Short writes into large blocks gain most, since every txg rewrites nearly
/// every block in full whatever the writes it holds, and writers wait for the limit while
/// it syncs. (The cap was 1G while streaming writes lost at a larger limit; since their
/// blocks are written by the request workers and the txg's sync only adopts them, they no
/// longer do.) Figures: docs/perf/memory.md, "Why the default dirty limit is a tenth of
/// memory, up to 4G".
pub fn default_dirty_max(memory: u64) -> u64 {
    (memory / 10).clamp(128 << 20, 4 << 30)
}

/// The memory this process may use: the machine's, or less if its cgroup (v2) says so.
fn memory_size() -> u64 {
    // SAFETY: sysconf only reads system constants.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let physical = (pages.max(0) as u64).saturating_mul(page.max(0) as u64);
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    match cgroup {
        Some(limit) if physical == 0 || limit < physical => limit,
        _ => physical,
    }
}

/// How often the governor looks at the process's memory. Under random NBD writes and reads
/// the resident size passed the budget between looks 100 ms apart (figures:
/// docs/perf/memory.md, "Why the governor looks every 25 ms, and its margin").
const INTERVAL: Duration = Duration::from_millis(25);

/// The freed memory at the top of a heap that glibc keeps before handing it back by itself.
const HEAP_TRIM_SLACK: usize = 48 << 20;

/// Near the budget, freed heap memory above this is handed back.
const HEAP_TRIM_NEAR_BUDGET: usize = 2 << 20;

/// How many threads of a command allocate much at once: the allocator's arenas follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocators {
    /// Many threads allocate and free request buffers: the NBD server's connections and
    /// workers, with the txg sync and the log committers freeing what they allocated.
    Many,
    /// One thread makes the work, and the pool's own threads (the txg sync and its helper)
    /// follow it: `zeta bench vol`.
    One,
}

/// Sets the allocator up for a command; call before its threads start.
///
/// glibc gives each thread that allocates its own arena (up to 8 per core) and keeps freed
/// memory in each: with the NBD server's many threads this alone took the process well over
/// the configured cache and dirty limits. Four arenas keep most of that away. Fewer cost
/// the server time: payload buffers are allocated by the connections' threads and freed by
/// the txg sync or a log committer, and each such free takes the lock of the arena the
/// buffer came from. More took `tests/nbd_memory.rs`'s server near its memory limit.
///
/// Where one thread makes the work (`Allocators::One`), one arena: each arena keeps its
/// own free memory, and the threads' bursts (the writer's payloads, the sync's new blocks)
/// come at different times, so four arenas held the sum of their peaks and took
/// `zeta bench vol` over its budget, for no speed. Figures: docs/perf/memory.md, "Why the
/// server has four malloc arenas and `bench vol` one".
///
/// Freed memory at the top of a heap goes back once `HEAP_TRIM_SLACK` of it piles up, and
/// allocations from 2 MiB up are mapped apart, so they go back when freed.
///
/// glibc stays, though allocation is a large share of the server's time under 4K sync
/// writes (payload buffers allocated by the connections and freed by the txg sync, log
/// blocks' buffers, and the page faults of memory trimmed near the budget). mimalloc 3.3 as
/// the global allocator ran short sync writes faster, but it keeps each thread's freed
/// pages for a second before giving them back, and the governor cannot trim other threads'
/// heaps: `tests/nbd_memory.rs`'s server went far past its budget. Purging early kept the
/// memory near the budget, and most of the gain went, about what glibc gains when the
/// governor does not trim (below), and for the same reason. Figures: docs/perf/memory.md,
/// "Why glibc stays the allocator".
///
/// Nor did packing each connection's short payloads side by side into shared 1 MiB chunks
/// pay (an arena per connection; the chunk freed with its last piece and counted whole by
/// the pool's throttle). From the heap, it lost at 8K and 16K writes and gained only at 4K
/// writes into 128K blocks. Where pieces soon make a whole block (two 8K writes into a 16K
/// block), the block is a buffer of its own and the pieces' room stays taken until the rest
/// of their chunk goes: a chunk is freed whole or not at all, so such writes hold their
/// bytes twice until the sync. Chunks mapped apart (`mmap` with `MAP_POPULATE`) ran 4K
/// writes faster but held the process's memory-map lock for every chunk mapped or
/// unmapped, and 32K writes' p99 rose behind it. Figures: docs/perf/memory.md, "Why
/// short payloads are not packed into shared chunks".
pub fn tune_allocator(allocators: Allocators) {
    let arenas = match allocators {
        Allocators::Many => 4,
        Allocators::One => 1,
    };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts allocator tuning; called before the threads that
    // allocate much exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas);
        libc::mallopt(libc::M_TRIM_THRESHOLD, HEAP_TRIM_SLACK as i32);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 2 << 20);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

/// What the governor steers by, per pass.
struct Reading {
    /// The process's resident bytes.
    resident: u64,
    /// Bytes the pools' caches hold.
    cached: u64,
    /// Bytes the pools' writes hold (`Pool::memory_held`).
    held: u64,
}

/// The governor's rule: what the caches may hold in all, given the budget, the pools' dirty
/// limits and their configured cache sizes, and what the rest of the process takes (`rest`:
/// resident bytes that are neither cached blocks nor written data). Never less than a
/// quarter of the configured caches: below that the rest is more than the budget can cover,
/// and a cache too small to hold a volume's indirect blocks makes every read slower without
/// making the process much smaller.
///
/// The margin covers what grows between two looks: under random NBD writes and reads the
/// peaks came above the largest size the governor saw (figures: docs/perf/memory.md, "Why
/// the governor looks every 25 ms, and its margin").
fn caches_room(budget: u64, dirty_max: u64, capacity: u64, rest: u64) -> u64 {
    let margin = (8 << 20) + budget / 16;
    budget
        .saturating_sub(dirty_max + rest + margin)
        .clamp(capacity / 4, capacity)
}

/// Starts the governor for `pools`, whose configured caches and dirty limits plus
/// `allowance` (memory configured elsewhere, such as the server's in-flight request
/// buffers) make the budget. It runs until the last of the pools is dropped.
pub fn govern(pools: &[Arc<Pool>], allowance: u64) {
    let pools: Vec<Weak<Pool>> = pools.iter().map(Arc::downgrade).collect();
    let _ = std::thread::Builder::new()
        .name("memory".into())
        .spawn(move || {
            // The rest, as the caches are sized for it: it jumps up at once and comes down
            // a megabyte per pass, so the caches do not grow back into a passing dip.
            let mut rest_seen = 0u64;
            loop {
                std::thread::sleep(INTERVAL);
                let live: Vec<Arc<Pool>> = pools.iter().filter_map(Weak::upgrade).collect();
                if live.is_empty() {
                    return;
                }
                let capacity: u64 = live.iter().map(|p| p.cache_capacity()).sum();
                let dirty_max: u64 = live.iter().map(|p| p.dirty_max()).sum();
                let budget = capacity + dirty_max + allowance;
                let r = read(&live, budget);
                let rest = r.resident.saturating_sub(r.cached + r.held);
                rest_seen = rest.max(rest_seen.saturating_sub(1 << 20));
                let room = caches_room(budget, dirty_max, capacity, rest_seen);
                for p in &live {
                    let share = p.cache_capacity();
                    p.set_cache_limit(
                        (room as u128 * share as u128 / capacity.max(1) as u128) as u64,
                    );
                }
            }
        });
}

/// Reads the process's memory, first handing freed heap memory back to the system if the
/// process is near `budget` (within `near_budget`).
fn read(pools: &[Arc<Pool>], budget: u64) -> Reading {
    let mut resident = resident_bytes();
    if resident + near_budget(budget) > budget && trim_heap() {
        resident = resident_bytes();
    }
    Reading {
        resident,
        cached: pools.iter().map(|p| p.cache_bytes()).sum(),
        held: pools.iter().map(|p| p.memory_held()).sum(),
    }
}

/// How close to its budget the process may come before freed heap memory is handed back:
/// half the margin `caches_room` keeps, so a process whose caches have made room trims
/// only when something else grows.
fn near_budget(budget: u64) -> u64 {
    (4 << 20) + budget / 32
}

/// glibc returns free memory only from the top of a heap. Block buffers are freed in cache
/// order, not allocation order, so under random writes the heaps held about as much free
/// memory as live. `malloc_trim(0)` gives back every free page, wherever it lies in the
/// heap. It is not free: each page given back is faulted in and zeroed again when reused,
/// and the unmapping interrupts every core. Trimming whenever more than 48 MiB was free
/// cost 4K random writes over NBD much of the server's time in page faults and
/// `madvise` (each txg's sync frees up to the dirty limit at once, and the next txg faults
/// it all in again); freed memory below the budget is harmless, as the heap reuses it, so
/// the governor trims only near the budget. Trims only if more than
/// `HEAP_TRIM_NEAR_BUDGET` is free; returns whether it trimmed.
///
/// Near the budget is where sync writes of short blocks keep the server: three volumes of
/// 4K writes into 16K blocks, a flush every 20th, hold two txgs of payloads (each about a
/// gigabyte) against a 2.4G dirty limit. There the trims cost some speed, but without them
/// the server went past its budget, which the trims keep. Sparing the memory the open txg
/// would fill again (freed bytes up to the dirty limit less what writes hold) kept the same
/// peak and gained nothing, as did keeping each synced txg's payload buffers (up to
/// 512 MiB) for the next writes: idle buffers are memory too, and the governor trimmed the
/// rest of the heap all the same. Figures: docs/perf/memory.md, "Why the governor trims the
/// heap only near the budget".
fn trim_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallinfo2 and malloc_trim take the allocator's own locks; mallinfo2 only reads
    // its statistics and malloc_trim only releases pages of free chunks. Both are safe to
    // call from any thread at any time.
    unsafe {
        if libc::mallinfo2().fordblks > HEAP_TRIM_NEAR_BUDGET {
            libc::malloc_trim(0);
            return true;
        }
    }
    false
}

/// The most memory the process has had resident, from `VmHWM` in `/proc/self/status` (0
/// where it cannot be read).
pub fn peak_resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
            line.split_whitespace().next()?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb << 10)
}

/// The process's resident memory, from `/proc/self/statm` (0 where it cannot be read).
pub fn resident_bytes() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn the_caches_give_up_what_the_rest_of_the_process_takes() {
        // 256M cache + 128M dirty; the rest takes 30M: the caches keep 256 - 30 - margin.
        let room = caches_room(384 * M, 128 * M, 256 * M, 30 * M);
        let margin = 8 * M + 24 * M;
        assert_eq!(room, 256 * M - 30 * M - margin);
        // With nothing else resident they keep all but the margin.
        assert_eq!(caches_room(384 * M, 128 * M, 256 * M, 0), 256 * M - margin);
        // An allowance (the server's request buffers) leaves room for the rest.
        assert_eq!(caches_room(448 * M, 128 * M, 256 * M, 10 * M), 256 * M);
    }

    #[test]
    fn the_caches_keep_a_quarter_however_large_the_rest() {
        assert_eq!(caches_room(384 * M, 128 * M, 256 * M, 1 << 40), 64 * M);
        assert_eq!(caches_room(384 * M, 128 * M, 256 * M, 200 * M), 64 * M);
    }

    #[test]
    fn limits_parse_and_refuse_what_cannot_work() {
        let args = |c: &str, d: &str| MemoryArgs {
            cache: c.into(),
            dirty_max: Some(d.into()),
            no_prefetch: false,
        };
        let l = Limits::parse(&args("1G", "64M")).unwrap();
        assert_eq!((l.cache, l.dirty_max, l.prefetch), (1 << 30, 64 * M, true));
        assert!(Limits::parse(&args("512K", "64M")).is_err());
        assert!(Limits::parse(&args("1G", "0")).is_err());
        assert!(Limits::parse(&args("lots", "64M")).is_err());
        let unset = MemoryArgs {
            cache: "1G".into(),
            dirty_max: None,
            no_prefetch: true,
        };
        let l = Limits::parse(&unset).unwrap();
        assert_eq!(l.dirty_max, default_dirty_max(memory_size()));
        assert!(!l.prefetch);
    }

    #[test]
    fn the_default_dirty_limit_is_a_tenth_of_memory_within_bounds() {
        assert_eq!(default_dirty_max(512 * M), 128 * M);
        assert_eq!(default_dirty_max(4096 * M), 4096 * M / 10);
        assert_eq!(default_dirty_max(24 * 1024 * M), 24 * 1024 * M / 10);
        assert_eq!(default_dirty_max(64 * 1024 * M), 4096 * M);
        assert!(memory_size() > 0);
    }

    #[test]
    fn resident_bytes_reads_this_process() {
        let before = resident_bytes();
        assert!(before > 0);
        assert!(peak_resident_bytes() >= before);
        let v = std::hint::black_box(vec![1u8; 64 << 20]);
        assert!(resident_bytes() >= before + (48 << 20));
        drop(v);
    }
}
