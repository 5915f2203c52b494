//! CPU time of the calling thread: the weight of a CPU sample.
//!
//! This is the one module of the crate that uses `unsafe`: reading
//! `CLOCK_THREAD_CPUTIME_ID` needs `libc::clock_gettime`, an FFI call.

/// Nanoseconds of CPU the calling thread has used, or 0 if the clock is
/// unavailable (then samples carry no CPU weight rather than a wrong one).
#[allow(unsafe_code)]
pub(crate) fn thread_cpu_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call,
    // and CLOCK_THREAD_CPUTIME_ID is a clock id every Linux kernel supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn thread_cpu_time_advances_with_work() {
        let before = super::thread_cpu_nanos();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let after = super::thread_cpu_nanos();
        assert!(after > before, "{after} <= {before} (x={x})");
    }
}
