//! Sequential read prefetch (OpenZFS's zfetch): each object watches its demand reads for
//! streams, reads that each start where one before them ended, and has the blocks ahead of
//! a stream read into the cache before they are asked for.
//!
//! A read that continues no stream starts one (replacing the one idle longest when all
//! `MAX_STREAMS` are taken) and reads nothing ahead: one read is no pattern. A read that
//! continues a stream moves it on and, when what it has read ahead runs short of its
//! distance, asks for the next stretch. The distance starts at a few blocks (at least
//! `MIN_DISTANCE_BYTES`) and doubles on every read that continues the stream, up to
//! `MAX_DISTANCE_BYTES` (and a share of the cache); a stream no read continues for
//! `STREAM_IDLE` is dropped, so reading ahead stops when the pattern stops. Only the
//! decisions are here; the reads ahead run on the pool's prefetch thread.

use std::ops::Range;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Streams watched per object (OpenZFS's `zfetch_max_streams`).
pub const MAX_STREAMS: usize = 8;
/// The first distance a stream reads ahead, at least.
pub const MIN_DISTANCE_BYTES: u64 = 256 << 10;
/// The most a stream reads ahead of its reader.
pub const MAX_DISTANCE_BYTES: u64 = 8 << 20;
/// A stream that no read continued for this long is dropped.
pub const STREAM_IDLE: Duration = Duration::from_secs(2);
/// A read in the block the stream's last read ended in is the same use of it if it comes
/// within this (OpenZFS's `ARC_MINTIME`, a sixteenth of a second).
pub const REREAD_WITHIN: Duration = Duration::from_millis(62);

#[derive(Clone, Debug)]
struct Stream {
    /// The block a read continuing the stream starts at (or the one before: a short read in
    /// the block the last read ended in continues it too).
    next: u64,
    /// The first block not yet asked for ahead.
    ahead: u64,
    /// Blocks to keep read ahead of `next`.
    distance: u64,
    last: Instant,
}

/// What a demand read means for reading ahead.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ahead {
    /// Blocks to read into the cache now (empty: none).
    pub read: Range<u64>,
    /// The read continues a stream that has read ahead: its blocks may be in the cache
    /// already, so even a streaming read looks there before going to the device.
    pub streamed: bool,
}

/// One object's streams.
#[derive(Default)]
pub struct Zfetch {
    streams: Mutex<Vec<Stream>>,
}

impl Zfetch {
    pub fn new() -> Zfetch {
        Zfetch::default()
    }

    /// Notes a demand read of blocks `first..first + count` of an object of `blocks` blocks
    /// of `block_bytes` each, at `now`; `max_bytes` bounds the distance (the cache's share).
    pub fn note(
        &self,
        first: u64,
        count: u64,
        blocks: u64,
        block_bytes: u64,
        max_bytes: u64,
        now: Instant,
    ) -> Ahead {
        let end = first + count;
        let bs = block_bytes.max(1);
        let max_distance = (MAX_DISTANCE_BYTES.min(max_bytes) / bs).max(1);
        let mut streams = self.streams.lock();
        streams.retain(|s| now.saturating_duration_since(s.last) < STREAM_IDLE);
        let continues = |s: &Stream| first == s.next || first + 1 == s.next;
        let Some(s) = streams.iter_mut().find(|s| continues(s)) else {
            let start = Stream {
                next: end,
                ahead: end,
                distance: (MIN_DISTANCE_BYTES / bs).max(2 * count).min(max_distance),
                last: now,
            };
            if streams.len() == MAX_STREAMS {
                let oldest = (0..streams.len())
                    .min_by_key(|&i| streams[i].last)
                    .expect("MAX_STREAMS > 0");
                streams[oldest] = start;
            } else {
                streams.push(start);
            }
            return Ahead::default();
        };
        let streamed = s.ahead > first;
        let moved = end > s.next;
        s.next = s.next.max(end);
        s.ahead = s.ahead.max(s.next);
        s.last = now;
        if !moved {
            // A short read in the block the stream is in: it goes on, but a reader of two
            // pieces of one block (a random reader's neighbouring pages) is no stream yet.
            return Ahead {
                read: 0..0,
                streamed,
            };
        }
        s.distance = (s.distance * 2).min(max_distance);
        // Ask for more once less than half the distance is left ahead, so the reads ahead
        // come in stretches rather than a block at a time.
        let mut read = 0..0;
        if s.ahead - s.next < s.distance.div_ceil(2) {
            let to = (s.next + s.distance).min(blocks);
            if to > s.ahead {
                read = s.ahead..to;
                s.ahead = to;
            }
        }
        debug_assert!(s.next <= s.ahead || s.next > blocks);
        Ahead { read, streamed }
    }

    /// `note` with nothing read ahead (prefetch is off, or the read reads enough ahead
    /// itself): the streams are still followed, for `rereads`. Returns `Ahead::streamed`.
    pub fn follow(&self, first: u64, count: u64, now: Instant) -> bool {
        // An object of no blocks: every stretch to read ahead is empty.
        let ahead = self.note(first, count, 0, 1, 0, now);
        debug_assert!(ahead.read.is_empty());
        ahead.streamed
    }

    /// Whether a read starting in block `first` at `now` starts where a stream's last read
    /// ended, inside that read's last block, and soon after it (`REREAD_WITHIN`): its use of
    /// the block is the same use.
    pub fn rereads(&self, first: u64, now: Instant) -> bool {
        (self.streams.lock().iter())
            .any(|s| s.next == first + 1 && now.saturating_duration_since(s.last) < REREAD_WITHIN)
    }

    /// The first block of `first..end`, a stretch a stream asked for, that a stream still
    /// has ahead of its reader; `end` if none. The reader may have caught up with part of the
    /// stretch while it waited in the queue (and read those blocks itself), or the stream
    /// been dropped: those blocks are no longer worth reading ahead.
    pub fn still_ahead(&self, first: u64, end: u64) -> u64 {
        (self.streams.lock().iter())
            .filter(|s| s.next < end && s.ahead > first)
            .map(|s| s.next.max(first))
            .min()
            .unwrap_or(end)
    }

    /// The streams watched now (for tests and statistics).
    pub fn streams(&self) -> usize {
        self.streams.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_in_the_block_the_last_read_ended_in_is_a_reread() {
        let z = Zfetch::new();
        let t = Instant::now();
        assert!(!z.rereads(0, t), "no stream yet");
        note(&z, 0, 1, t);
        assert!(z.rereads(0, t) && !z.rereads(1, t));
        assert!(
            !z.rereads(0, t + REREAD_WITHIN),
            "a read that late is a use of its own"
        );
        note(&z, 0, 3, t);
        assert!(z.rereads(2, t) && !z.rereads(0, t));
        // Followed without reading ahead, as with prefetch off.
        let off = Zfetch::new();
        for b in 0..100 {
            off.follow(b, 1, t);
        }
        assert!(off.rereads(99, t));
    }

    #[test]
    fn a_stretch_the_reader_caught_up_with_is_read_from_where_the_reader_is() {
        let z = Zfetch::new();
        let t = Instant::now();
        note(&z, 0, 1, t);
        let a = note(&z, 1, 1, t);
        let (first, end) = (a.read.start, a.read.end);
        assert!(end > first + 4);
        assert_eq!(
            z.still_ahead(first, end),
            first,
            "the reader is behind the stretch"
        );
        for b in 2..first + 3 {
            note(&z, b, 1, t);
        }
        assert_eq!(
            z.still_ahead(first, end),
            first + 3,
            "the reader is inside it"
        );
        assert_eq!(z.still_ahead(900_000, 900_100), 900_100, "no stream asked");
        // The stream dropped for idleness: nothing of it is read ahead any more.
        note(&z, 5000, 1, t + STREAM_IDLE * 2);
        assert_eq!(z.still_ahead(first + 3, end), end);
    }

    const BS: u64 = 16 << 10;
    const BLOCKS: u64 = 1 << 20;
    const CACHE: u64 = 1 << 30;

    fn note(z: &Zfetch, first: u64, count: u64, now: Instant) -> Ahead {
        z.note(first, count, BLOCKS, BS, CACHE, now)
    }

    #[test]
    fn a_sequential_reader_is_read_ahead_of_by_a_growing_bounded_distance() {
        let z = Zfetch::new();
        let t = Instant::now();
        assert_eq!(
            note(&z, 100, 1, t),
            Ahead::default(),
            "one read is no stream"
        );
        let mut asked = Vec::new();
        let mut next = 101;
        for _ in 0..2000 {
            let a = note(&z, next, 1, t);
            if !a.read.is_empty() {
                // Each stretch starts where the last one ended, past what was read.
                assert!(a.read.start > next);
                if let Some(last) = asked.last() {
                    assert_eq!(a.read.start, *last);
                }
                asked.push(a.read.end);
                assert!(a.read.end - (next + 1) <= MAX_DISTANCE_BYTES / BS);
            }
            next += 1;
        }
        assert!(asked.len() > 3, "reads ahead came in stretches: {asked:?}");
        // The lead reached the bound and stayed within it.
        let lead = asked.last().unwrap() - next;
        assert!((MAX_DISTANCE_BYTES / BS / 2..=MAX_DISTANCE_BYTES / BS).contains(&lead));
    }

    #[test]
    fn short_reads_within_a_block_continue_the_stream_without_moving_it() {
        let z = Zfetch::new();
        let t = Instant::now();
        note(&z, 10, 1, t);
        // Four 4K reads in block 10, then block 11: one stream throughout.
        for _ in 0..3 {
            assert!(note(&z, 10, 1, t).read.is_empty());
        }
        let a = note(&z, 11, 1, t);
        assert!(!a.read.is_empty() && a.read.start >= 12, "{a:?}");
        assert!(note(&z, 12, 1, t).streamed);
        assert_eq!(z.streams(), 1);
    }

    #[test]
    fn random_reads_read_nothing_ahead() {
        let z = Zfetch::new();
        let t = Instant::now();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Blocks far apart: none continues another.
            let blk = (x % (BLOCKS / 64)) * 64;
            assert!(note(&z, blk, 1, t).read.is_empty());
        }
        assert!(z.streams() <= MAX_STREAMS);
    }

    #[test]
    fn interleaved_streams_are_each_followed() {
        let z = Zfetch::new();
        let t = Instant::now();
        let starts = [0u64, 50_000, 200_000];
        let mut read_ahead = [0u64; 3];
        for step in 0..100 {
            for (i, s) in starts.iter().enumerate() {
                let a = note(&z, s + step, 1, t);
                read_ahead[i] += a.read.end - a.read.start;
            }
        }
        assert!(read_ahead.iter().all(|&n| n > 100), "{read_ahead:?}");
        assert_eq!(z.streams(), 3);
    }

    #[test]
    fn a_stream_left_idle_is_dropped_and_reads_ahead_no_more() {
        let z = Zfetch::new();
        let t = Instant::now();
        for b in 0..10 {
            note(&z, b, 1, t);
        }
        assert_eq!(z.streams(), 1);
        let later = t + STREAM_IDLE + Duration::from_millis(1);
        // The same next block, too late: a new stream, nothing read ahead.
        let a = note(&z, 10, 1, later);
        assert!(a.read.is_empty() && !a.streamed);
        assert_eq!(z.streams(), 1);
    }

    #[test]
    fn reads_ahead_stop_at_the_end_of_the_object_and_within_the_cache_share() {
        let z = Zfetch::new();
        let t = Instant::now();
        let blocks = 40;
        let mut furthest = 0;
        for b in 0..blocks {
            let a = z.note(b, 1, blocks, BS, CACHE, t);
            furthest = furthest.max(a.read.end);
        }
        assert_eq!(furthest, blocks);
        // A cache of 64K lets a stream of 16K blocks read at most 4 ahead.
        let z = Zfetch::new();
        for b in 0..1000 {
            let a = z.note(b, 1, BLOCKS, BS, 64 << 10, t);
            assert!(a.read.end.saturating_sub(b + 1) <= 4, "{a:?} at {b}");
        }
    }

    #[test]
    fn more_streams_than_watched_replace_the_idlest() {
        let z = Zfetch::new();
        let t = Instant::now();
        for i in 0..(MAX_STREAMS as u64 + 4) {
            note(&z, i * 1000, 1, t + Duration::from_millis(i));
        }
        assert_eq!(z.streams(), MAX_STREAMS);
        // The newest stream is still followed.
        let newest = (MAX_STREAMS as u64 + 3) * 1000 + 1;
        let a = note(&z, newest, 1, t + Duration::from_millis(100));
        assert!(!a.read.is_empty());
    }
}
