//! The intent log (issue 6): what makes a FUA write or a FLUSH durable without committing a
//! whole transaction group.
//!
//! Each volume will keep a chain of checksummed log blocks (`block`): records of the writes
//! that must be durable before their txg syncs, packed by a group-committing writer into as
//! few blocks as possible, placed on the pool's devices by one rotor shared by all volumes,
//! and replayed at import. This session lays the foundation: the on-disk format of log blocks
//! and records, and the chain walk replay will use (which ends by itself at the first block
//! never written, torn, damaged, or left from an older chain). Nothing writes log blocks yet;
//! FLUSH and FUA still commit a txg.
//!
//! Architecture invariant: `zil` sits between `zvol` and `dmu`; it reaches devices only
//! through `zio`.

pub mod block;
