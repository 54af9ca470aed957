//! CLOCK_MONOTONIC, the one timeline every process of the node shares, and sleeping on it.

/// Now on CLOCK_MONOTONIC, in ns.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Now on CLOCK_REALTIME, in ns since the Unix epoch (NVML reports wall-clock stamps).
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Sleeps until CLOCK_MONOTONIC reaches `deadline_ns` (an absolute sleep, so signals and
/// early wake-ups only cost another round).
///
/// This is how every synchronisation of the simulated driver waits for the device, so it
/// wakes as a real driver's does, within microseconds of the work's end: the thread's timer
/// slack (50 µs by default, which would make every `cuCtxSynchronize` up to 50 µs late and
/// show as GPU idle time in a program that synchronises every step) is set to 1 µs for the
/// sleep and put back after it.
pub fn sleep_until(deadline_ns: u64) {
    if now_ns() >= deadline_ns {
        return;
    }
    // SAFETY: PR_GET_TIMERSLACK takes no pointer and only reads the thread's own slack.
    let old = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    // SAFETY: PR_SET_TIMERSLACK changes only the calling thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64, 0, 0, 0) };
    sleep_precisely(deadline_ns);
    if old > 0 {
        // SAFETY: as above; the value is the one the thread had.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, old as u64, 0, 0, 0) };
    }
}

fn sleep_precisely(deadline_ns: u64) {
    loop {
        if now_ns() >= deadline_ns {
            return;
        }
        let ts = libc::timespec {
            tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: `ts` is a valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if rc != 0 && rc != libc::EINTR {
            // Cannot sleep (should not happen): fall back to yielding until the deadline.
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleep_until_reaches_the_deadline() {
        let target = now_ns() + 2_000_000;
        sleep_until(target);
        assert!(now_ns() >= target);
    }
}
