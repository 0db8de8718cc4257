//! Volume reservations (`refreservation`, as `zfs create -V` makes by default): a reserved
//! volume has the room to be written whole kept free for it, so a guest never meets a full
//! pool on a volume the pool accepted; what its blocks already take (`used_bytes`) comes out
//! of its reservation, and what is left of it no other volume's writes may have.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Dataset, Pool, PoolError};
use crate::dmu::dnode::{IND_BLOCK_BYTES, IND_SHIFT};

/// Copies of each indirect block of a volume (`object::indirect_copies` of one data copy).
const INDIRECT_COPIES: u64 = 2;

impl Pool {
    /// What a volume of `volsize` bytes in blocks of `volblocksize` takes written whole: every
    /// data block at the largest allocation any data vdev makes of it (a raidz's parity
    /// included), and every indirect block of its tree in two copies.
    pub fn reservation_for(&self, volsize: u64, volblocksize: u32) -> u64 {
        let blocks = volsize.div_ceil(volblocksize as u64);
        let mut total = self.raw_bytes(volsize, volblocksize as u64);
        let ind = INDIRECT_COPIES * self.worst_asize(IND_BLOCK_BYTES as u64);
        let mut level = blocks;
        while level > 1 {
            level = level.div_ceil(1 << IND_SHIFT);
            total = total.saturating_add(level * ind);
        }
        total
    }

    /// What `len` bytes in blocks of `block` bytes take allocated: each block at the largest
    /// allocation any data vdev makes of it.
    pub(super) fn raw_bytes(&self, len: u64, block: u64) -> u64 {
        len.div_ceil(block).saturating_mul(self.worst_asize(block))
    }

    fn worst_asize(&self, psize: u64) -> u64 {
        (self.io.zio.tops.iter())
            .map(|t| t.asize_of(psize))
            .max()
            .unwrap_or(psize)
    }

    /// Every volume's reservation not yet taken by its blocks: room only they may have.
    pub fn reserved_bytes(&self) -> u64 {
        self.admission.reserved.load(Ordering::Acquire)
    }

    /// Counts `reserved_bytes` again from the volumes: after every sync (their blocks grew or
    /// shrank) and every change of a reservation.
    pub(super) fn refresh_reservations(&self) {
        let total = (self.datasets.read().values())
            .map(|d| d.unused_reservation())
            .sum();
        self.admission.reserved.store(total, Ordering::Release);
    }

    /// For a write into `ds`: what the other volumes' reservations keep (not its to take),
    /// and what is left of its own (its to fill). While others hold reservations, a write
    /// also leaves the room a txg's space maps may take (`MetaRoom::mos`): a reserved volume's
    /// own writes need it beside their blocks, and its reservation is blocks only.
    pub(super) fn reservations_for(&self, ds: &Dataset) -> (u64, u64) {
        let own = if ds.refreservation() > 0 {
            ds.unused_reservation()
        } else {
            0
        };
        let others = self.reserved_bytes().saturating_sub(own);
        let others = match others {
            0 => 0,
            n => n + self.space_map_room(),
        };
        (others, own)
    }

    /// What the space maps may take in one txg: two copies of a block of each metaslab's
    /// (as `fits_meta` counts it).
    fn space_map_room(&self) -> u64 {
        let piece = IND_BLOCK_BYTES as u64 * self.io.zio.max_inflation();
        self.io.zio.alloc.lock().metaslab_count() as u64 * 2 * piece
    }

    /// Refuses to reserve `need` bytes for volume `vol` (of `volsize` bytes) unless the pool's
    /// free space, less the other volumes' reservations and the slop every write must leave,
    /// holds what of `need` the volume does not take already. `own` is the volume being
    /// resized (its present reservation makes way for the new one), if any.
    pub(super) fn check_reservation(
        &self,
        vol: &str,
        volsize: u64,
        need: u64,
        own: Option<&Dataset>,
        map: &BTreeMap<String, Arc<Dataset>>,
    ) -> Result<(), PoolError> {
        let space = self.space();
        let others: u64 = (map.values())
            .filter(|d| own.is_none_or(|o| !std::ptr::eq(o, d.as_ref())))
            .map(|d| d.unused_reservation())
            .sum();
        let slop = (space.size / 32).max(4 << 20);
        let avail = space.free.saturating_sub(others).saturating_sub(slop);
        let used = own.map_or(0, |d| d.object.used_bytes());
        if need.saturating_sub(used) > avail {
            return Err(PoolError::CannotReserve {
                vol: vol.to_string(),
                volsize,
                need,
                avail,
            });
        }
        Ok(())
    }
}

/// `bytes` as `zeta` prints sizes (1.5G, 64.0T, 812M): for the reservation's error, and for
/// every front end (`zeta_server::fmt` uses it).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else if v >= 100.0 {
        format!("{v:.0}{}", UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn sizes_read_as_the_cli_prints_them() {
        assert_eq!(human(512), "512B");
        assert_eq!(human(1536 << 20), "1.5G");
        assert_eq!(human(64 << 40), "64.0T");
        assert_eq!(human(812 << 20), "812M");
    }
}
