//! The processor time a measurement took: the server process's own (`/proc/PID/stat`), per
//! write the clients made, and how busy the whole machine was (`/proc/stat`). Where the
//! machine is busy throughout, a server shares its cores with the load generator and the
//! kernel's work for both, and the server that needs less time per write goes further: there
//! the time per write, not the device, bounds each target's figure.
//!
//! Not counted as the server's: the kernel's writeback threads, which write back what a
//! server left in the page cache (all of `nbdkit file`'s writes, zeta's txg writes), and the
//! part of the loopback connections' kernel work that runs in the other end's process (a
//! send delivers into the receiving socket there and then). Both count in the machine's
//! share. Nor is a zeta server's last txg, which it syncs as it stops, after the clients'
//! run: the counters are read while the server still runs (a reaped process has none).

/// Processor time of the server (if it has a process) and of the whole machine, from `start`.
pub(super) struct CpuUse {
    server: Option<(u32, u64)>,
    machine: Option<MachineTicks>,
}

/// What `CpuUse::finish` found; `None` where there was nothing to read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct CpuFigures {
    /// Seconds of processor time the server process used.
    pub(super) server_secs: Option<f64>,
    /// The share of all the machine's processor time that was busy (not idle or waiting for
    /// I/O), from 0 to 1.
    pub(super) machine_busy: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct MachineTicks {
    busy: u64,
    total: u64,
}

impl CpuUse {
    /// Reads the counters now: the process `server_pid`'s (if given) and the machine's.
    pub(super) fn start(server_pid: Option<u32>) -> CpuUse {
        CpuUse {
            server: server_pid.and_then(|pid| Some((pid, process_ticks_of(pid)?))),
            machine: machine_ticks_now(),
        }
    }

    /// The processor time used since `start`. Call it while the server still runs: the
    /// counters of a process that has been reaped are gone.
    pub(super) fn finish(self) -> CpuFigures {
        let per_sec = clock_ticks_per_sec();
        let server_secs = self.server.and_then(|(pid, before)| {
            let after = process_ticks_of(pid)?;
            Some(after.checked_sub(before)? as f64 / per_sec?)
        });
        let machine_busy = self.machine.and_then(|before| {
            let after = machine_ticks_now()?;
            let total = after.total.checked_sub(before.total)?;
            let busy = after.busy.checked_sub(before.busy)?;
            (total > 0).then(|| busy as f64 / total as f64)
        });
        CpuFigures {
            server_secs,
            machine_busy,
        }
    }
}

fn process_ticks_of(pid: u32) -> Option<u64> {
    process_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn machine_ticks_now() -> Option<MachineTicks> {
    machine_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn clock_ticks_per_sec() -> Option<f64> {
    // SAFETY: sysconf takes an integer and returns one; it touches no memory of ours.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (t > 0).then_some(t as f64)
}

/// User and system time, in clock ticks, from a `/proc/PID/stat` line: its 14th and 15th
/// fields. The 2nd, the command name in parentheses, may hold spaces and parentheses, so the
/// count starts after the last `)`.
fn process_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// Busy and total clock ticks of all processors, from the `cpu` line of `/proc/stat`: user,
/// nice, system, idle, iowait, irq, softirq, steal (guest time is counted within user and
/// nice already). Idle and iowait are the time not busy.
fn machine_ticks(stat: &str) -> Option<MachineTicks> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let t: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if t.len() < 5 {
        return None;
    }
    let total: u64 = t.iter().sum();
    Some(MachineTicks {
        busy: total - t[3] - t[4],
        total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_ticks_are_user_plus_system_after_the_name() {
        let line = "4242 (nbd worker) (x) S 1 4242 4242 0 -1 4194560 5 0 0 0 1234 567 3 4 20 0 \
                    9 0 100 1000 10 18446744073709551615";
        assert_eq!(process_ticks(line), Some(1234 + 567));
        assert_eq!(process_ticks("4242 (zeta) S 1 2"), None);
        assert_eq!(process_ticks("no name here"), None);
    }

    #[test]
    fn machine_ticks_leave_out_idle_and_iowait() {
        let stat = "cpu  100 10 50 800 40 5 5 0 7 0\ncpu0 50 5 25 400 20 2 3 0 0 0\nintr 1\n";
        assert_eq!(
            machine_ticks(stat),
            Some(MachineTicks {
                busy: 100 + 10 + 50 + 5 + 5,
                total: 1010
            })
        );
        assert_eq!(machine_ticks("cpu0 1 2 3 4 5\n"), None);
        assert_eq!(machine_ticks("cpu  1 2 x 4 5\n"), None);
    }

    #[test]
    fn a_busy_process_and_machine_are_counted() {
        let use_ = CpuUse::start(Some(std::process::id()));
        // Spin for a quarter of a second of this thread's time: well over a clock tick.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(250) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let f = use_.finish();
        if std::path::Path::new("/proc/stat").exists() {
            let secs = f.server_secs.expect("this process's time");
            assert!(secs >= 0.1, "{secs}");
            let busy = f.machine_busy.expect("the machine's time");
            assert!(busy > 0.0 && busy <= 1.0, "{busy}");
        }
        assert_eq!(CpuUse::start(None).finish().server_secs, None);
    }
}
