//! The tables `zeta bench sync` prints.

use std::io::Write;

use super::{Gen, Plan, Point, Row, BASELINE, DEPTH, NBDKIT, RAW, VOLUMES};
use zeta_server::fmt::human;

pub(super) fn print_latency_table(rows: &[&Row]) {
    let raw = rows
        .iter()
        .find(|r| r.zil.commit == RAW.commit)
        .and_then(|r| r.m.lat_mean_us);
    println!();
    println!(
        "4K random writes at queue depth 1, each durable when answered (NBD FUA; raw: pwrite + \
         fdatasync). xraw: mean latency over the raw file's. worst 1s: the mean latency of the \
         run's slowest second (zeta-load)"
    );
    println!(
        "{:<10} {:<22} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "generator", "target", "IOPS", "mean us", "p99 us", "worst 1s", "xraw"
    );
    for r in rows {
        let target = match r.volblocksize {
            Some(vb) => format!("zeta group/global {}", kib(vb)),
            None => r.zil.commit.to_string(),
        };
        let x = match (r.m.lat_mean_us, raw) {
            (Some(l), Some(b)) if b > 0.0 && r.zil.commit != RAW.commit => format!("{:.2}", l / b),
            _ => String::new(),
        };
        let line = format!(
            "{:<10} {:<22} {:>9.0} {:>9} {:>9} {:>9} {:>6}",
            r.gen.name(),
            target,
            r.m.iops,
            opt(r.m.lat_mean_us, 0),
            opt(r.m.lat_p99_us, 0),
            opt(r.m.worst_second_lat_mean_us, 0),
            x
        );
        println!("{}", line.trim_end());
    }
    let _ = std::io::stdout().flush();
}

pub(super) fn print_header(plan: &Plan) {
    println!(
        "zeta bench sync: random writes with a flush every N, {VOLUMES} volumes of {} on a pool \
         of {VOLUMES} file vdevs of {} (--pool-scale {}), one client per volume with {DEPTH} \
         I/Os in flight, {} s per measurement, each zeta one on a new pool",
        human(plan.size_bytes),
        human(plan.leaf_bytes()),
        plan.pool_scale,
        plan.runtime.as_secs()
    );
    if plan.runs > 1 {
        println!(
            "{} runs of every measurement, taking turns; each row is its target's run of median \
             IOPS, and the ratios are between those rows",
            plan.runs
        );
    }
    println!(
        "latency: fio = write lat (submission to completion), zeta-load = request sent to reply \
         read. w/flush: writes per flush actually sent. wr amp: bytes written to the device \
         under the files per byte the clients wrote (\"-\": not counted). cpu us/wr: the \
         server process's processor time per write. busy: % of the whole machine's processor \
         time in use. log blk/dev: log blocks written per device."
    );
    println!(
        "xbase, xraw, xnbdkit: IOPS of group/global over per-request/per-volume, over the raw \
         files (fio, libaio, fdatasync every N; fio is raw's only generator) and over nbdkit \
         file, with the same generator"
    );
}

/// The device's reference line (`peers::measure_device`), under the header.
pub(super) fn print_device(plan: &Plan) {
    match plan.device_mb_per_s {
        Some(mb) => println!(
            "device: {mb:.0} MB/s of durable writes (fio: 1M writes at random offsets of the \
             plain files, O_DIRECT, fdatasync every 4, one job per file), as a commit batch \
             makes them. dev MB/s: what a target wrote to the device per second (writeback \
             flushed once a txg or fsync can pass the figure above); near it with the \
             processor not all busy, the device is the target's bound"
        ),
        None => println!(
            "device: not measured (the files are on no block device whose writes the kernel \
             counts)"
        ),
    }
    let _ = std::io::stdout().flush();
}

/// Block and write sizes, all whole KiB here: "4K", "128K".
pub(super) fn kib(bytes: u32) -> String {
    format!("{}K", bytes / 1024)
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

pub(super) fn print_table(plan: &Plan, p: Point, vb: u32, rows: &[&Row]) {
    let same = |r: &&&Row| {
        r.point.bs_bytes == p.bs_bytes
            && r.point.writes_per_flush == p.writes_per_flush
            && r.volblocksize.is_none_or(|v| v == vb)
    };
    let find = |gen: Gen, commit: &str| {
        rows.iter()
            .filter(same)
            .find(|r| r.gen == gen && r.zil.commit == commit)
    };
    println!();
    println!(
        "{} random writes, a flush every {}, volblocksize {}{}",
        kib(p.bs_bytes),
        p.writes_per_flush,
        kib(vb),
        if plan.zil_props {
            ""
        } else {
            " (--no-zil-props: both configurations are the default pool)"
        }
    );
    println!(
        "{:<10} {:<12} {:<11} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>9} {:>5} {:>16} {:>6} {:>6} {:>8}",
        "generator",
        "commit",
        "placement",
        "IOPS",
        "mean us",
        "p99 us",
        "w/flush",
        "wr amp",
        "dev MB/s",
        "cpu us/wr",
        "busy",
        "log blk/dev",
        "xbase",
        "xraw",
        "xnbdkit"
    );
    for r in rows.iter().filter(same) {
        let ratio = |other: Option<&&Row>| match (r.zil.commit, other) {
            ("group", Some(o)) if o.m.iops > 0.0 => format!("{:.2}", r.m.iops / o.m.iops),
            _ => String::new(),
        };
        let blocks = r.m.log_blocks_per_device.as_ref().map_or("-".into(), |b| {
            b.iter().map(u64::to_string).collect::<Vec<_>>().join("/")
        });
        let line = format!(
            "{:<10} {:<12} {:<11} {:>9.0} {:>9} {:>9} {:>7} {:>7} {:>8} {:>9} {:>5} {:>16} {:>6} {:>6} {:>8}",
            r.gen.name(),
            r.zil.commit,
            r.zil.placement,
            r.m.iops,
            opt(r.m.lat_mean_us, 0),
            opt(r.m.lat_p99_us, 0),
            opt(r.m.writes_per_flush, 2),
            opt(r.write_amplification(plan), 2),
            opt(r.m.device_mb_per_s(plan.runtime), 0),
            opt(r.m.server_cpu_us_per_write(plan.runtime), 1),
            opt(r.m.cpu.machine_busy.map(|b| b * 100.0), 0),
            if r.volblocksize.is_some() {
                blocks
            } else {
                String::new()
            },
            ratio(find(r.gen, BASELINE.commit)),
            ratio(find(Gen::Fio, RAW.commit)),
            ratio(find(r.gen, NBDKIT.commit)),
        );
        println!("{}", line.trim_end());
    }
    let _ = std::io::stdout().flush();
}
