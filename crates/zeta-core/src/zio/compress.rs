//! Block compression: what the `compression` property asks for, how one block is compressed
//! on its way to disk and decompressed on its way back, and the framing of a compressed block.
//!
//! A compressed block is stored as an 8-byte header, the codec's output, and zeros up to the
//! next sector (`docs/format.md`, "Compressed blocks"): header bytes 0..4 are the length of the
//! codec's output (little-endian), byte 4 the level it was made at (zstd; 0 for lz4), bytes
//! 5..8 zero. The block pointer says which codec (`BlkPtr::compression`), its `lsize` what the
//! block holds and its `psize` what was stored; the checksum covers the stored bytes, so a
//! read verifies before it decompresses and self-healing works on the stored bytes as ever.
//! A block is stored compressed only where that saves at least one sector (else raw, with
//! `compression` 0, as OpenZFS does).

use std::cell::RefCell;

use crate::vdev::SECTOR;

/// `BlkPtr::compression` of a block stored as it is.
pub const BP_OFF: u8 = 0;
/// `BlkPtr::compression` of a block compressed with LZ4 (block format).
pub const BP_LZ4: u8 = 1;
/// `BlkPtr::compression` of a block compressed with Zstandard (one frame).
pub const BP_ZSTD: u8 = 2;

/// Bytes of the header in front of a compressed block's codec output.
pub const HEADER_BYTES: usize = 8;

/// The zstd level `zstd` means, as in OpenZFS.
pub const ZSTD_DEFAULT: u8 = 3;
/// The highest zstd level the property takes (OpenZFS's `zstd-19`).
pub const ZSTD_MAX: u8 = 19;

/// Early abort (OpenZFS 2.2's `zstd_earlyabort`): for zstd at this level or above, a block at
/// least `EARLY_ABORT_BYTES` long is first tried with lz4 and, if lz4 cannot shrink it, with
/// zstd-1; only if one of them can is the real level run. (A first eighth of the block that
/// lz4 shrinks well lets the real level run at once: `sample_compresses`.) Incompressible data then costs an
/// lz4 pass and a zstd-1 pass instead of a slow zstd pass. OpenZFS starts at 128K records;
/// zeta's volumes default to 16K blocks, and the passes cost as little there.
pub const EARLY_ABORT_LEVEL: u8 = 3;
pub const EARLY_ABORT_BYTES: usize = 16 << 10;

/// The `compression` property: how new blocks of a volume are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    #[default]
    Off,
    Lz4,
    /// Zstandard at a level from 1 to `ZSTD_MAX`.
    Zstd(u8),
}

impl Compression {
    /// The property's value as `zeta set`/`-o` take it: `off`, `on` (= lz4), `lz4`, `zstd`
    /// (= zstd-3), `zstd-1` … `zstd-19`.
    pub fn parse(s: &str) -> Result<Compression, String> {
        let level = |l: &str| l.parse::<u8>().ok().filter(|l| (1..=ZSTD_MAX).contains(l));
        Ok(match s {
            "off" => Compression::Off,
            "on" | "lz4" => Compression::Lz4,
            "zstd" => Compression::Zstd(ZSTD_DEFAULT),
            _ => match s.strip_prefix("zstd-").and_then(level) {
                Some(l) => Compression::Zstd(l),
                None => {
                    return Err(format!(
                        "bad compression '{s}': expected off, on, lz4, zstd or zstd-1 … \
                         zstd-{ZSTD_MAX}"
                    ))
                }
            },
        })
    }

    /// The value as `zeta get` shows it (`zstd` for the default level, as OpenZFS does).
    pub fn name(&self) -> String {
        match self {
            Compression::Off => "off".into(),
            Compression::Lz4 => "lz4".into(),
            Compression::Zstd(ZSTD_DEFAULT) => "zstd".into(),
            Compression::Zstd(l) => format!("zstd-{l}"),
        }
    }

    /// The property as a volume's dnode keeps it (`DnodePhys::compress`, `compress_level`).
    pub fn to_phys(self) -> (u8, u8) {
        match self {
            Compression::Off => (BP_OFF, 0),
            Compression::Lz4 => (BP_LZ4, 0),
            Compression::Zstd(l) => (BP_ZSTD, l),
        }
    }

    /// The property from a dnode's bytes; `None` for values no writer makes.
    pub fn from_phys(codec: u8, level: u8) -> Option<Compression> {
        match (codec, level) {
            (BP_OFF, 0) => Some(Compression::Off),
            (BP_LZ4, 0) => Some(Compression::Lz4),
            (BP_ZSTD, l) if (1..=ZSTD_MAX).contains(&l) => Some(Compression::Zstd(l)),
            _ => None,
        }
    }
}

/// The name of a block's codec (`BlkPtr::compression`), for messages; `None` if unknown.
pub fn codec_name(codec: u8) -> Option<&'static str> {
    match codec {
        BP_OFF => Some("off"),
        BP_LZ4 => Some("lz4"),
        BP_ZSTD => Some("zstd"),
        _ => None,
    }
}

thread_local! {
    /// Per thread: a zstd compression context (its tables are allocated once, not per block),
    /// a decompression context, and scratch room for lz4's output.
    static CODECS: RefCell<Codecs> = RefCell::new(Codecs::default());
}

#[derive(Default)]
struct Codecs {
    cctx: Option<zstd::zstd_safe::CCtx<'static>>,
    /// The level `cctx` is set to: set once, not per block (`zstd`).
    cctx_level: Option<u8>,
    dctx: Option<zstd::zstd_safe::DCtx<'static>>,
    scratch: Vec<u8>,
}

/// What `compress` made of a block: stored bytes (header, output, zeros to the sector) and the
/// codec to record in its pointer.
pub struct Compressed {
    pub codec: u8,
    pub bytes: Vec<u8>,
}

/// `data` (a whole block, a whole number of sectors) compressed as `c` asks, if that saves at
/// least one sector; `None` to store it raw. An all-zero block never gets here: it becomes a
/// hole above.
pub fn compress(c: Compression, data: &[u8]) -> Option<Compressed> {
    // The most the stored bytes may take: a sector less than the block.
    let budget = data.len().checked_sub(SECTOR as usize)?;
    let room = budget.checked_sub(HEADER_BYTES)?;
    if room == 0 {
        return None;
    }
    CODECS.with(|codecs| {
        let codecs = &mut *codecs.borrow_mut();
        match c {
            Compression::Off => None,
            Compression::Lz4 => {
                lz4(codecs, data, room).map(|n| frame(BP_LZ4, 0, &codecs.scratch[..n]))
            }
            Compression::Zstd(level) => {
                if level >= EARLY_ABORT_LEVEL
                    && data.len() >= EARLY_ABORT_BYTES
                    && !sample_compresses(codecs, data)
                    && lz4(codecs, data, room).is_none()
                    && zstd(codecs, data, room, 1, false).is_none()
                {
                    return None;
                }
                let n = zstd(codecs, data, room, level, true)?;
                Some(frame(BP_ZSTD, level, &codecs.scratch[..n]))
            }
        }
    })
}

/// Whether lz4 shrinks the first eighth of `data` by an eighth or more: then the block is
/// worth the asked zstd level at once, and early abort's whole-block lz4 pass (which costs
/// a third of a zstd-3 pass on data that compresses) is skipped. A sample that does not
/// compress proves nothing (the rest may), so the whole-block passes decide then.
fn sample_compresses(codecs: &mut Codecs, data: &[u8]) -> bool {
    let sample = &data[..data.len() / 8];
    lz4(codecs, sample, sample.len() - sample.len() / 8).is_some()
}

/// lz4 of `data` into the scratch buffer; its length if it fits `room`.
fn lz4(codecs: &mut Codecs, data: &[u8], room: usize) -> Option<usize> {
    let max = lz4_flex::block::get_maximum_output_size(data.len());
    if codecs.scratch.len() < max {
        codecs.scratch.resize(max, 0);
    }
    let n = lz4_flex::block::compress_into(data, &mut codecs.scratch).ok()?;
    (n <= room).then_some(n)
}

/// zstd at `level` of `data` into the scratch buffer; its length if it fits `room`. With
/// `whole`, the buffer has zstd's worst-case bound: given less, zstd compresses through a
/// buffer of its own and copies out, a tenth slower on 16K blocks (`zeta bench compress`).
/// Without, zstd gets only `room` and gives up as soon as its output would not fit: early
/// abort's trial pass, cheap on noise.
fn zstd(codecs: &mut Codecs, data: &[u8], room: usize, level: u8, whole: bool) -> Option<usize> {
    let max = match whole {
        true => zstd::zstd_safe::compress_bound(data.len()),
        false => room,
    };
    if codecs.scratch.len() < max {
        codecs.scratch.resize(max, 0);
    }
    let cctx = codecs
        .cctx
        .get_or_insert_with(zstd::zstd_safe::CCtx::create);
    // The level stays in the context between blocks: `compress2` keeps the context's
    // parameters, where a one-shot call with a level sets them up again for every block.
    if codecs.cctx_level != Some(level) {
        let param = zstd::zstd_safe::CParameter::CompressionLevel(level as i32);
        cctx.set_parameter(param).ok()?;
        codecs.cctx_level = Some(level);
    }
    let n = cctx.compress2(&mut codecs.scratch[..max], data).ok()?;
    (n <= room).then_some(n)
}

/// A compressed block's stored bytes: header, `out`, zeros to the next sector.
fn frame(codec: u8, level: u8, out: &[u8]) -> Compressed {
    let stored = (HEADER_BYTES + out.len()).next_multiple_of(SECTOR as usize);
    // Built by appending, so each byte is written once, not zeroed and then copied over.
    let mut bytes = Vec::with_capacity(stored);
    bytes.extend_from_slice(&(out.len() as u32).to_le_bytes());
    bytes.push(level);
    bytes.resize(HEADER_BYTES, 0);
    bytes.extend_from_slice(out);
    bytes.resize(stored, 0);
    Compressed { codec, bytes }
}

/// Decompresses the stored bytes of a block whose pointer names `codec` into `out`, which is
/// its logical size. The stored bytes verified against their checksum, so an error here is a
/// bug or a crafted pool, and is reported, never a panic: a header that lies about the length,
/// output that does not fill `out` exactly, or an unknown codec.
pub fn decompress(codec: u8, stored: &[u8], out: &mut [u8]) -> Result<(), String> {
    if codec == BP_OFF {
        if stored.len() != out.len() {
            return Err(format!(
                "an uncompressed block of {} bytes stored in {}",
                out.len(),
                stored.len()
            ));
        }
        out.copy_from_slice(stored);
        return Ok(());
    }
    let Some(name) = codec_name(codec) else {
        return Err(format!("unknown compression {codec}"));
    };
    let header = stored
        .get(..HEADER_BYTES)
        .ok_or_else(|| format!("{name} block of {} bytes has no header", stored.len()))?;
    let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
    let Some(input) = stored.get(HEADER_BYTES..HEADER_BYTES.saturating_add(len)) else {
        return Err(format!(
            "{name} header says {len} bytes, the block stores {}",
            stored.len() - HEADER_BYTES
        ));
    };
    let n = match codec {
        BP_LZ4 => lz4_flex::block::decompress_into(input, out).map_err(|e| e.to_string())?,
        _ => CODECS.with(|codecs| {
            let codecs = &mut *codecs.borrow_mut();
            let dctx = codecs
                .dctx
                .get_or_insert_with(zstd::zstd_safe::DCtx::create);
            dctx.decompress(out, input)
                .map_err(|code| zstd::zstd_safe::get_error_name(code).to_string())
        })?,
    };
    if n != out.len() {
        return Err(format!(
            "{name} block decompressed to {n} bytes, not its {}",
            out.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};

    fn every_setting() -> Vec<Compression> {
        let mut all = vec![Compression::Lz4];
        all.extend((1..=ZSTD_MAX).map(Compression::Zstd));
        all
    }

    fn samples(len: usize) -> Vec<(&'static str, Vec<u8>)> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut random = vec![0u8; len];
        rng.fill_bytes(&mut random);
        let repetitive: Vec<u8> = (0..len).map(|i| b"zeta pool "[i % 10]).collect();
        // Text-like: words from a small vocabulary, as logs and source are.
        let words = [
            "block ", "pointer ", "txg ", "sync ", "vdev ", "mirror\n", "raidz ",
        ];
        let mut text = Vec::with_capacity(len);
        while text.len() < len {
            text.extend_from_slice(words[rng.gen_range(0..words.len())].as_bytes());
        }
        text.truncate(len);
        // Half zeros, half random: compresses by about half.
        let mut half = vec![0u8; len];
        rng.fill_bytes(&mut half[..len / 2]);
        vec![
            ("random", random),
            ("repetitive", repetitive),
            ("text", text),
            ("half", half),
        ]
    }

    #[test]
    fn every_codec_and_level_round_trips_and_saves_a_sector_or_stores_raw() {
        for len in [4096, 8192, 16384, 131072] {
            for (what, data) in samples(len) {
                for c in every_setting() {
                    match compress(c, &data) {
                        Some(z) => {
                            assert!(z.bytes.len() < len, "{what} {c:?} {len}");
                            assert!(z.bytes.len().is_multiple_of(SECTOR as usize));
                            let mut back = vec![0u8; len];
                            decompress(z.codec, &z.bytes, &mut back).unwrap();
                            assert!(back == data, "{what} {c:?} {len}");
                        }
                        None => assert!(
                            what == "random" || len == 4096 || (what == "half" && len == 8192),
                            "{what} {c:?} {len} did not compress"
                        ),
                    }
                }
            }
        }
        // Random bytes never shrink; a 4K block never can by a sector.
        assert!(compress(Compression::Lz4, &samples(16384)[0].1).is_none());
        assert!(compress(Compression::Zstd(3), &samples(4096)[1].1).is_none());
        assert!(compress(Compression::Off, &samples(16384)[1].1).is_none());
    }

    #[test]
    fn early_abort_gives_up_on_noise_only() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for len in [16384usize, 131072] {
            let mut noise = vec![0u8; len];
            rng.fill_bytes(&mut noise);
            assert!(compress(Compression::Zstd(3), &noise).is_none());
            // Sixteen symbols at random: no repeats for lz4 to find, but half the entropy of
            // a byte, which zstd-1's entropy coder finds; early abort must not give up.
            let nibbles: Vec<u8> = noise
                .iter()
                .map(|b| b"0123456789abcdef"[(b & 15) as usize])
                .collect();
            let z = compress(Compression::Zstd(3), &nibbles).expect("zstd shrinks it");
            assert!(z.bytes.len() <= len * 3 / 4, "{len}: {}", z.bytes.len());
            // Noise after a compressible first eighth: the sample says compress, zstd tries,
            // and the block is stored raw all the same.
            let mut tail = noise.clone();
            tail[..len / 8].fill(b'a');
            let got = compress(Compression::Zstd(3), &tail);
            assert!(got.is_none_or(|z| z.bytes.len() < len));
        }
    }

    #[test]
    fn property_values_parse_and_print_as_zfs_names_them() {
        for (s, c) in [
            ("off", Compression::Off),
            ("on", Compression::Lz4),
            ("lz4", Compression::Lz4),
            ("zstd", Compression::Zstd(3)),
            ("zstd-1", Compression::Zstd(1)),
            ("zstd-19", Compression::Zstd(19)),
        ] {
            assert_eq!(Compression::parse(s), Ok(c));
            let (codec, level) = c.to_phys();
            assert_eq!(Compression::from_phys(codec, level), Some(c));
        }
        assert_eq!(Compression::Zstd(3).name(), "zstd");
        assert_eq!(Compression::Zstd(7).name(), "zstd-7");
        for bad in ["zstd-0", "zstd-20", "gzip", "", "zstd-", "lz4 "] {
            assert!(Compression::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Compression::from_phys(BP_ZSTD, 0), None);
        assert_eq!(Compression::from_phys(9, 0), None);
    }

    /// Stored bytes that verified against a checksum but are not what the writer made (a bug,
    /// or a crafted pool) are refused with an error, never a panic or a short block: flipped
    /// bytes, cuts, lying headers and random junk, for every codec, for a bounded time.
    #[test]
    fn corrupt_stored_bytes_never_panic_or_pass_as_a_whole_block() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let sources: Vec<(u8, Vec<u8>, Vec<u8>)> = samples(16384)
            .into_iter()
            .skip(1)
            .flat_map(|(_, data)| {
                [Compression::Lz4, Compression::Zstd(3)].map(|c| {
                    let z = compress(c, &data).expect("compressible");
                    (z.codec, z.bytes, data.clone())
                })
            })
            .collect();
        let mut out = vec![0u8; 16384];
        let (mut rounds, mut unchanged) = (0u64, 0u64);
        while std::time::Instant::now() < until {
            let (codec, stored, data) = &sources[rng.gen_range(0..sources.len())];
            let mut bad = stored.clone();
            match rng.gen_range(0..4) {
                0 => {
                    for _ in 0..rng.gen_range(1..8) {
                        let i = rng.gen_range(0..bad.len());
                        bad[i] ^= 1 << rng.gen_range(0..8);
                    }
                }
                1 => bad.truncate(rng.gen_range(0..bad.len())),
                2 => {
                    let len = rng.gen::<u32>();
                    bad[0..4].copy_from_slice(&len.to_le_bytes());
                }
                _ => rng.fill_bytes(&mut bad),
            }
            let codec = if rng.gen_ratio(1, 16) {
                rng.gen()
            } else {
                *codec
            };
            // A flipped literal can decompress to other bytes of the right length: the
            // checksum of the stored bytes, checked first, is what catches that. What must
            // hold is that nothing panics and an answer is a whole block or an error.
            if decompress(codec, &bad, &mut out).is_ok() && out == *data {
                unchanged += 1;
            }
            rounds += 1;
        }
        assert!(
            rounds > 100 && unchanged < rounds,
            "{rounds} rounds, {unchanged} unchanged"
        );
        assert!(decompress(BP_OFF, &[0; 4096], &mut [0; 8192]).is_err());
        assert!(decompress(77, &[0; 4096], &mut [0; 8192]).is_err());
    }
}
