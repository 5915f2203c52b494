//! Native CPU profile of the agent process itself (pprof-rs, SIGPROF
//! sampling), for operators: `/debug/pprof/profile?seconds=N`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use edgeprof_pprof::{LineSpec, ProfileBuilder};

/// Sampling frequency of the native profiler.
const HZ: i32 = 99;

/// Profiles this process for `duration` and returns gzip'd pprof.
pub async fn profile(duration: Duration) -> Result<Vec<u8>> {
    tokio::task::spawn_blocking(move || {
        let start = SystemTime::now();
        let guard = pprof_native::ProfilerGuardBuilder::default()
            .frequency(HZ)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .map_err(|e| anyhow!("cannot start the native profiler: {e}"))?;
        std::thread::sleep(duration);
        let report = guard
            .report()
            .build()
            .map_err(|e| anyhow!("cannot build the native report: {e}"))?;
        drop(guard);
        let period = 1_000_000_000 / i64::from(HZ);
        let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
        b.period("cpu", "nanoseconds", period)
            .time_nanos(
                start
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos() as i64)
                    .unwrap_or(0),
            )
            .duration_nanos(duration.as_nanos() as i64);
        let mut stack = Vec::new();
        for (frames, count) in &report.data {
            stack.clear();
            for symbols in &frames.frames {
                let mut lines = Vec::new();
                for sym in symbols {
                    let file = sym
                        .filename
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default();
                    let f = b.function(&sym.name(), &sym.name(), &file, 0);
                    lines.push(LineSpec {
                        function_id: f,
                        line: i64::from(sym.lineno.unwrap_or(0)),
                        column: 0,
                    });
                }
                if lines.is_empty() {
                    let f = b.function("<unknown>", "", "", 0);
                    lines.push(LineSpec {
                        function_id: f,
                        line: 0,
                        column: 0,
                    });
                }
                stack.push(b.location(0, 0, &lines));
            }
            let thread = b.label_str("thread", &frames.thread_name);
            let n = *count as i64;
            b.add_sample(&stack, &[n, n * period], &[thread]);
        }
        Ok(edgeprof_pprof::encode(&b.build()))
    })
    .await
    .context("the native profiler thread panicked")?
}
