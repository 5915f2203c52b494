//! Issue 15: a simulated edge (one `edgeprof-node-agent --simulate-machines`
//! process) against a real control plane. Every simulated machine
//! registers and heartbeats on its own, serves its isolate of the tiny WAT
//! worker under the simulation's own traffic, and a capture through the
//! CLI reaches each over gRPC: the merged pprof's `machine` labels are
//! exactly the simulated machines.

use std::collections::BTreeSet;
use std::time::Duration;

use edgeprof_e2e::{Cluster, ClusterOptions, SimulatedTraffic};

use crate::capture::labels;
use crate::{state_dir, worker};

#[test]
fn a_capture_covers_every_simulated_machine() {
    let Some(wat) = worker("tiny.wat") else {
        return;
    };
    let mut o = ClusterOptions::new(state_dir("simulated"));
    o.data_centers = 3;
    o.machines_per_dc = 2;
    o.heartbeat = Duration::from_millis(500);
    o.continuous_hz = 0;
    o.simulated = Some(SimulatedTraffic {
        scripts: vec!["tiny".into()],
        rate: 4.0,
    });
    let mut cluster = Cluster::start(o).expect("the control plane and the simulated edge start");
    let machines: BTreeSet<String> = cluster.machines().map(|(_, m)| m.id.clone()).collect();
    assert_eq!(machines.len(), 6, "{:?}", cluster.data_centers);
    assert_eq!(cluster.live_machines().unwrap(), 6);
    // One process: every machine is in it.
    assert_eq!(
        cluster.pids().len(),
        2,
        "the control plane and one agent process"
    );

    // The CLI compiles the text format itself.
    cluster.deploy("tiny", &wat, 100).unwrap();
    cluster
        .wait_serving_everywhere(&["tiny"], Duration::from_secs(30))
        .unwrap();

    let out_file = state_dir("simulated").join("out.pprof");
    let out = cluster
        .cli()
        .args(["profile", "tiny", "--duration", "2s", "-o"])
        .arg(&out_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "edgeprof profile failed (exit {:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let profile = edgeprof_pprof::decode(&std::fs::read(&out_file).unwrap()).unwrap();
    assert_eq!(
        labels(&profile, "machine"),
        machines,
        "every simulated machine's real samples are in the merged profile"
    );
    assert_eq!(
        labels(&profile, "data_center"),
        ["lhr", "nrt", "sjc"].map(String::from).into()
    );
}
