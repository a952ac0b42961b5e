//! Process measurements: CPU seconds of this process (getrusage self: the servers and the
//! PouchDB replicator are children and do not count), CPU seconds of another process from
//! `/proc/<pid>/stat`, and peak RSS of this process over a window (VmHWM after resetting it
//! through `/proc/self/clear_refs`).

/// User + system CPU seconds of this process (all threads).
pub fn self_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage struct; RUSAGE_SELF is a valid `who`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU seconds of process `pid` (`/proc/<pid>/stat` fields 14 and 15).
pub fn proc_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let tck = if tck > 0 { tck as f64 } else { 100.0 };
    Some((utime + stime) / tck)
}

/// Resets this process's peak RSS so [`peak_rss_mb`] measures from now; false if the kernel
/// does not allow it (then the peak covers the whole run).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Peak resident set size of this process in MiB (VmHWM).
pub fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Samples, every 10 ms on its own thread, whether each watched process is runnable (state
/// `R`: running or waiting for a core). A server runnable nearly all the time is CPU-bound;
/// one that is mostly sleeping is waiting for requests.
pub struct RunnableSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<f64>>,
}

impl RunnableSampler {
    /// Starts sampling `pids`.
    pub fn start(pids: Vec<u32>) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut runnable = vec![0u64; pids.len()];
            let mut samples = 0u64;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                for (i, pid) in pids.iter().enumerate() {
                    if proc_state(*pid) == Some('R') {
                        runnable[i] += 1;
                    }
                }
                samples += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            runnable
                .iter()
                .map(|r| *r as f64 / samples.max(1) as f64)
                .collect()
        });
        Self { stop, thread }
    }

    /// Stops and returns, per pid, the fraction of samples it was runnable.
    pub fn stop(self) -> Vec<f64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}
