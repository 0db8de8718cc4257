//! Choosing among a kernel family at start-up: the `ZETA_*_IMPL` override, checked the same
//! way for every family, and the short benchmark that otherwise picks the fastest.

use std::time::{Duration, Instant};

/// Resolves an override `env=value` against a family's kernels (`all`, with their names and
/// whether this CPU runs them). An unknown or unsupported name is an error naming what is
/// accepted (`extra`: values the family takes besides kernel names), not a silent fallback.
pub(crate) fn resolve_override<K: Copy>(
    env: &str,
    value: &str,
    all: &[K],
    name: fn(K) -> &'static str,
    supported: fn(K) -> bool,
    extra: &[&str],
) -> Result<K, String> {
    let Some(&k) = all.iter().find(|&&k| name(k) == value) else {
        let mut names: Vec<&str> = all.iter().map(|&k| name(k)).collect();
        names.extend_from_slice(extra);
        return Err(format!("{env}={value}: not one of {}", names.join(", ")));
    };
    if !supported(k) {
        return Err(format!("{env}={value}: this CPU cannot run it"));
    }
    Ok(k)
}

/// Runs `run` with each candidate a few times and returns the one with the best time, or
/// `fallback` if there is none. Takes well under a millisecond on the buffers used.
pub(crate) fn fastest<K: Copy>(
    candidates: impl IntoIterator<Item = K>,
    fallback: K,
    mut run: impl FnMut(K),
) -> K {
    let mut best = (fallback, Duration::MAX);
    for k in candidates {
        let mut t = Duration::MAX;
        for _ in 0..5 {
            let start = Instant::now();
            run(k);
            t = t.min(start.elapsed());
        }
        if t < best.1 {
            best = (k, t);
        }
    }
    best.0
}

/// A 64 KiB buffer of varied bytes for timing checksum kernels.
pub(crate) fn timing_buffer() -> Vec<u8> {
    (0..65536u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_name_what_is_accepted() {
        let name = |k: u8| ["a", "b", "c"][k as usize];
        let supported = |k: u8| k != 2;
        assert_eq!(
            resolve_override("E", "b", &[0, 1, 2], name, supported, &[]),
            Ok(1)
        );
        assert_eq!(
            resolve_override("E", "z", &[0, 1, 2], name, supported, &["cycle"]),
            Err("E=z: not one of a, b, c, cycle".to_string())
        );
        assert_eq!(
            resolve_override("E", "c", &[0, 1, 2], name, supported, &[]),
            Err("E=c: this CPU cannot run it".to_string())
        );
    }

    #[test]
    fn the_fastest_candidate_wins() {
        let k = fastest([0u64, 1, 2], 9, |k| {
            std::thread::sleep(Duration::from_micros(if k == 1 { 10 } else { 300 }))
        });
        assert_eq!(k, 1);
        assert_eq!(fastest(std::iter::empty::<u8>(), 7, |_| {}), 7);
    }
}
