//! Continuous-profiling storage, measured on SQLite and on PostgreSQL in
//! one run (issue 13): a simulated day of a 6-machine edge (3 isolates per
//! machine, one 10 s window per machine every 10 s, as agents push them:
//! each machine's 10 min of windows in one gRPC push when the clock is at
//! its end, the six machines concurrently) through the real gRPC hop into
//! a real database; then
//! - ingest: windows per second the control plane stored, over the pushes'
//!   wall time only (the windows are built before the clock starts);
//! - storage: stored bytes per isolate-hour as pushed, after the day's
//!   compaction (10 s → 1 min for all but the last hour) and a day later
//!   (→ 10 min);
//! - query: the 24 h merged profile and the 24 h timeline (10 min step,
//!   by machine) over real HTTP, median of 5, at each stage (an
//!   uncompacted day is over the merge's bound of windows: refused).
//!
//! `cargo bench -p edgeprof-control-plane --bench history` runs the day;
//! under `cargo test` (no `--bench` argument) one simulated hour, so CI
//! checks that the benchmark still runs. Windows are synthetic: ~190
//! samples each (19 Hz of one busy core) over stacks drawn, skewed, from a
//! recurring pool of 300 stacks 8–24 frames deep, as one worker's code
//! paths recur from window to window.

#![allow(missing_docs)]

use std::time::{Duration, Instant};

use edgeprof_control_plane::store::WindowFilter;
use edgeprof_pprof::{LineSpec, MappingSpec, ProfileBuilder};
use edgeprof_proto::rest::ProfileKind;
use edgeprof_proto::v1;

#[allow(dead_code, unreachable_code)]
#[path = "../tests/it/support.rs"]
mod support;

const MACHINES: usize = 6;
const ISOLATES: usize = 3;
const TEN_MIN: i64 = 600_000;
const HOUR: i64 = 3_600_000;
/// Distinct window payloads per machine, reused cyclically.
const VARIANTS: usize = 24;
/// Stacks in the pool the samples are drawn from.
const POOL: usize = 300;
/// Distinct functions of the worker (json-gateway has ~45 with samples).
const FUNCTIONS: usize = 120;

/// A deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Stacks as indices into [`FUNCTIONS`] names, root first: each extends a
/// prefix of an earlier one, so they share callers as real code does.
fn stack_pool(rng: &mut Rng) -> Vec<Vec<usize>> {
    let mut pool: Vec<Vec<usize>> = vec![vec![0]];
    while pool.len() < POOL {
        let base = &pool[rng.below(pool.len())];
        let keep = 1 + rng.below(base.len());
        let mut s = base[..keep].to_vec();
        let depth = 8 + rng.below(17);
        while s.len() < depth {
            s.push(1 + rng.below(FUNCTIONS - 1));
        }
        pool.push(s);
    }
    pool
}

/// One machine's window: its isolates' samples labelled with `isolate`,
/// and a `requests: N` comment, gzip'd.
fn window_payload(pool: &[Vec<usize>], machine: usize, rng: &mut Rng) -> (Vec<u8>, u64) {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 52_631_578);
    let m = b.mapping(&MappingSpec {
        filename: "worker.wasm",
        build_id: "bench",
        ..Default::default()
    });
    // Functions and locations as samples use them, as an agent's window
    // holds only what its samples reference.
    let mut locations = std::collections::HashMap::new();
    let mut location = |b: &mut ProfileBuilder, i: usize| {
        *locations.entry(i).or_insert_with(|| {
            let name = format!("worker::module_{}::function_{i}", i % 23);
            let f = b.function(&name, &name, "src/lib.rs", i as i64);
            let line = LineSpec {
                function_id: f,
                line: i as i64 + 3,
                column: 0,
            };
            b.location(m, 0x1000 + 16 * i as u64, &[line])
        })
    };
    let mut requests = 0;
    for isolate in 0..ISOLATES {
        let name = format!("m{machine}-i{isolate}");
        for _ in 0..20 {
            // Skewed toward the pool's first stacks (a few hot paths).
            let r = rng.below(1 << 16) as f64 / f64::from(1 << 16);
            let stack = &pool[(r * r * POOL as f64) as usize];
            let leaf_first: Vec<u64> = stack.iter().rev().map(|&f| location(&mut b, f)).collect();
            let n = 1 + rng.below(5) as i64;
            let label = b.label_str("isolate", &name);
            b.add_sample(&leaf_first, &[n, n * 52_631_578], &[label]);
        }
        requests += 40 + rng.below(20) as u64;
    }
    let mut p = b.build();
    edgeprof_pprof::add_comment(&mut p, &format!("requests: {requests}"));
    (edgeprof_pprof::encode(&p), requests)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Stored windows and bytes of the whole range, from the index columns.
async fn stored(cp: &support::Cp, from: i64, to: i64) -> (i64, i64) {
    let filter = WindowFilter {
        account: "acme",
        script: "api",
        kind: ProfileKind::Cpu,
        from_ms: from,
        to_ms: to,
        version_id: None,
        data_center: None,
        machine_id: None,
    };
    cp.cp.store.window_totals(&filter).await.expect("totals")
}

/// Median latency of the range's merged profile and of its timeline.
async fn query(cp: &support::Cp, from: i64, to: i64, reps: usize) -> String {
    if reps == 0 {
        return "not queried under cargo test".into();
    }
    let (mut profile, mut timeline, mut size) = (Vec::new(), Vec::new(), 0);
    for _ in 0..reps {
        let t = Instant::now();
        let (status, body, bytes) = cp
            .get(&format!(
                "/v1/accounts/acme/scripts/api/history/profile?from={from}&to={to}"
            ))
            .await;
        profile.push(t.elapsed());
        if status == 400 && body["error"]["code"] == "range_too_large" {
            // The merge's bound: a range this store holds too finely.
            return format!("profile refused in {:.2?} (range_too_large)", t.elapsed());
        }
        assert_eq!(status, 200, "{body}");
        size = bytes.len();
        let t = Instant::now();
        let (status, body, _) = cp
            .get(&format!(
                "/v1/accounts/acme/scripts/api/history/timeline?from={from}&to={to}&step=10m&group_by=machine"
            ))
            .await;
        timeline.push(t.elapsed());
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["series"].as_array().map(Vec::len), Some(MACHINES));
    }
    format!(
        "profile {:.2?} ({size} B), timeline {:.2?}",
        median(profile),
        median(timeline)
    )
}

/// Compacts until a pass does nothing; the blocks made.
async fn compact_all(cp: &support::Cp) -> u64 {
    let mut blocks = 0;
    loop {
        let done = cp.cp.compact_history().await.expect("compaction");
        blocks += done.blocks;
        if done.blocks == 0 && done.raced == 0 {
            return blocks;
        }
    }
}

async fn day(name: &str, db: &str, hours: i64, reps: usize) {
    // Under `cargo test` only the last stage is queried (a debug build
    // takes seconds per query of an uncompacted hour).
    let quick_reps = if hours < 24 { 0 } else { reps };
    let cp = support::Cp::start(support::config(db)).await;
    let version = cp.deploy("api", None).await;
    let mut rng = Rng(42);
    let pool = stack_pool(&mut rng);
    let payloads: Vec<Vec<(Vec<u8>, u64)>> = (0..MACHINES)
        .map(|m| {
            (0..VARIANTS)
                .map(|_| window_payload(&pool, m, &mut rng))
                .collect()
        })
        .collect();
    let now = cp.cp.clock.now_ms();
    let t0 = (now / TEN_MIN + 1) * TEN_MIN;
    cp.advance(Duration::from_millis((t0 + TEN_MIN - now) as u64));
    let mut clients = Vec::new();
    for _ in 0..MACHINES {
        clients.push(support::registry_client(cp.cp.grpc_addr, support::SECRET).await);
    }
    let chunks = hours * 6;
    let (mut pushing, mut windows) = (Duration::ZERO, 0u64);
    for chunk in 0..chunks {
        let requests: Vec<v1::PushWindowsRequest> = (0..MACHINES)
            .map(|m| v1::PushWindowsRequest {
                machine: Some(support::machine(
                    &format!("m{m}"),
                    ["lhr", "fra", "sjc"][m % 3],
                )),
                windows: (0..60)
                    .map(|k| {
                        let (pprof, requests) =
                            payloads[m][(chunk as usize * 60 + k) % VARIANTS].clone();
                        let start = t0 + chunk * TEN_MIN + k as i64 * 10_000;
                        support::profile_window(&version, start, pprof, requests)
                    })
                    .collect(),
                dropped_total: 0,
            })
            .collect();
        let t = Instant::now();
        let mut pushes = tokio::task::JoinSet::new();
        for (mut client, request) in clients.drain(..).zip(requests) {
            pushes.spawn(async move {
                let resp = client.push_windows(request).await;
                (client, resp)
            });
        }
        while let Some(done) = pushes.join_next().await {
            let (client, resp) = done.expect("push task");
            clients.push(client);
            let resp = resp.expect("push").into_inner();
            assert_eq!((resp.accepted, resp.rejected.len()), (60, 0), "{resp:?}");
            windows += 60;
        }
        pushing += t.elapsed();
        if chunk + 1 < chunks {
            cp.advance(Duration::from_millis(TEN_MIN as u64));
        }
    }
    let (from, to) = (t0, t0 + chunks * TEN_MIN);
    let isolate_hours = (MACHINES * ISOLATES) as f64 * hours as f64;
    let per_isolate_hour = |bytes: i64| bytes as f64 / isolate_hours / 1024.0;
    let (raw_n, raw_bytes) = stored(&cp, from, to).await;
    let raw_query = query(&cp, from, to, quick_reps).await;

    let t = Instant::now();
    let blocks = compact_all(&cp).await;
    let compacting = t.elapsed();
    let (day_n, day_bytes) = stored(&cp, from, to).await;
    let day_query = query(&cp, from, to, quick_reps).await;

    cp.advance(Duration::from_millis((24 * HOUR) as u64));
    let later_blocks = compact_all(&cp).await;
    let (later_n, later_bytes) = stored(&cp, from, to).await;
    let later_query = query(&cp, from, to, reps).await;

    println!(
        "history/{name}: {hours} h of {MACHINES} machines x {ISOLATES} isolates, {windows} windows pushed in {:.2?}: {:.0} windows/s",
        pushing,
        windows as f64 / pushing.as_secs_f64()
    );
    println!(
        "history/{name}: stored as pushed {raw_n} windows, {:.1} KiB per isolate-hour; {hours} h query: {raw_query}",
        per_isolate_hour(raw_bytes)
    );
    println!(
        "history/{name}: after the day's compaction ({blocks} blocks in {compacting:.2?}) {day_n} blobs, {:.1} KiB per isolate-hour ({:.1}x smaller); query: {day_query}",
        per_isolate_hour(day_bytes),
        raw_bytes as f64 / day_bytes as f64
    );
    println!(
        "history/{name}: a day later ({later_blocks} more blocks) {later_n} blobs, {:.1} KiB per isolate-hour ({:.1}x smaller); query: {later_query}",
        per_isolate_hour(later_bytes),
        raw_bytes as f64 / later_bytes as f64
    );
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (hours, reps) = if bench { (24, 5) } else { (1, 1) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (_dir, sqlite) = support::sqlite();
        day("sqlite", &sqlite, hours, reps).await;
        if let Some(pg) = support::postgres().await {
            day("postgres", &pg, hours, reps).await;
            support::drop_postgres_schema(&pg).await;
        }
    });
}
