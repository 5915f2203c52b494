//! An agent given several control-plane replicas (`--control-plane A,B`)
//! calls one and fails over to the next when it cannot be reached: at
//! start (the first URL has nothing listening), and later (a replica that
//! answers only `Unavailable`), then stays with the one that answers.

use std::sync::atomic::Ordering;

use crate::support::{ControlPlane, agent, get, wait_until};

/// Heartbeats `cp` has answered.
fn beats(cp: &ControlPlane) -> u64 {
    cp.state.heartbeats.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_fails_over_between_control_plane_replicas() {
    // Nothing listens at the first URL.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let (a, b) = (ControlPlane::start().await, ControlPlane::start().await);
    let urls = format!("{dead},{},{}", a.url, b.url);
    let agent = agent(&a, &[("--control-plane", &urls), ("--continuous-hz", "0")]).await;

    // Registered, heartbeating and serving through the first replica that
    // answers (the deployment and the module came from it).
    wait_until("heartbeats reach A", 30, || async { beats(&a) >= 3 }).await;
    get(&agent, "/").await;
    assert_eq!(beats(&b), 0, "B is not asked while A answers");

    // A stops answering: the agent moves to B, and stays there once A is
    // back (no flapping).
    a.state.down.store(true, Ordering::SeqCst);
    let at = beats(&b);
    wait_until("heartbeats reach B", 30, || async { beats(&b) >= at + 3 }).await;
    a.state.down.store(false, Ordering::SeqCst);
    let (a_then, b_then) = (beats(&a), beats(&b));
    wait_until("B keeps answering", 30, || async {
        beats(&b) >= b_then + 3
    })
    .await;
    assert_eq!(beats(&a), a_then, "the agent stays with B");

    // B goes down: past the dead URL, back to A.
    b.state.down.store(true, Ordering::SeqCst);
    let at = beats(&a);
    wait_until("heartbeats return to A", 30, || async {
        beats(&a) >= at + 3
    })
    .await;
    get(&agent, "/").await;
}
