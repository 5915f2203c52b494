//! Time from a synchronous profile request to the merged file, for a 1 s
//! capture across 1, 10 and 50 agents (in-process stand-in agents on
//! loopback, each answering after the duration with one isolate's profile).
//! The goal (DESIGN.md §6, issue 4) is duration + under 1 s at 50 agents;
//! the report's `capture/N` times minus 1 s are the control plane's overhead.
//! Measured on the shared 2-core dev machine (SQLite, release): 1 agent
//! 1.041 s, 10 agents 1.091 s, 50 agents 1.185 s (median estimates).

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

#[allow(dead_code, unreachable_code)]
#[path = "../tests/it/support.rs"]
mod support;

fn capture(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("capture");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(12));
    for agents in [1usize, 10, 50] {
        let (_dir, db) = support::sqlite();
        let (cp, _agents, heartbeats) = rt.block_on(async {
            let cp = support::Cp::start(support::config(&db)).await;
            let v = cp.deploy("api", None).await;
            let mut list = Vec::new();
            let mut heartbeats = Vec::new();
            for i in 0..agents {
                let dc = ["lhr", "sjc", "nrt"][i % 3];
                let a = support::Agent::start(
                    &format!("m{i}"),
                    dc,
                    support::Behavior::Answer,
                    vec![support::isolate(&format!("i{i}"), "api", &v)],
                )
                .await;
                a.heartbeat(cp.cp.grpc_addr).await;
                // Keep heartbeating: the run outlasts the 12.5 s expiry.
                let a = std::sync::Arc::new(a);
                let (beating, registry) = (a.clone(), cp.cp.grpc_addr);
                heartbeats.push(tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        beating.heartbeat(registry).await;
                    }
                }));
                list.push(a);
            }
            (cp, list, heartbeats)
        });
        group.bench_with_input(BenchmarkId::from_parameter(agents), &agents, |b, &n| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let t0 = Instant::now();
                        let (status, _, _, bytes) = cp
                            .post_json(
                                "/v1/accounts/acme/scripts/api/versions/latest/profile",
                                Some(&cp.token),
                                &serde_json::json!({"duration_ms": 1000}),
                            )
                            .await;
                        total += t0.elapsed();
                        assert_eq!(status, 200);
                        assert_eq!(support::sample_sources(&bytes).len(), n);
                    }
                    total
                })
            });
        });
        for h in heartbeats {
            h.abort();
        }
    }
    group.finish();
}

criterion_group!(benches, capture);
criterion_main!(benches);
