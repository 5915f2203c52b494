//! The `NodeAgent` gRPC service: profile named isolates for a while.
//!
//! Starting and stopping only flips each isolate's profiler; requests keep
//! running on the isolate threads meanwhile. If the caller goes away (deadline
//! or cancel), the future is dropped and [`ActiveCapture`]'s `Drop` stops every
//! profile it started, freeing the sample buffers.

use std::sync::Arc;
use std::time::Duration;

use edgeprof_proto::v1::{self, node_agent_server::NodeAgent};
use edgeprof_sampler::{ProfileKind, ProfilerHandle};
use tonic::{Request, Response, Status};

use crate::hosting::{Hosting, Slot};
use crate::metrics::Metrics;

/// Longest capture an agent accepts.
pub const MAX_CAPTURE: Duration = Duration::from_secs(60);

/// The service.
#[derive(Debug, Clone)]
pub struct CaptureService {
    /// Isolates of this machine.
    pub hosting: Arc<Hosting>,
    /// This machine, echoed in replies.
    pub machine: v1::Machine,
    /// Required bearer secret.
    pub secret: String,
    /// Interval used when the request leaves it 0.
    pub default_interval: Duration,
    /// Counters.
    pub metrics: Arc<Metrics>,
}

struct ActiveCapture {
    started: Vec<(Arc<Slot>, ProfilerHandle)>,
}

impl Drop for ActiveCapture {
    fn drop(&mut self) {
        for (_, handle) in self.started.drain(..) {
            // Discards the samples of an abandoned capture.
            let _ = handle.stop();
        }
    }
}

/// Checks the `authorization: Bearer <secret>` metadata.
pub fn check_secret<T>(req: &Request<T>, secret: &str) -> Result<(), Status> {
    let got = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match got {
        Some(s) if constant_time_eq(s.as_bytes(), secret.as_bytes()) => Ok(()),
        Some(_) => Err(Status::unauthenticated("wrong agent secret")),
        None => Err(Status::unauthenticated(
            "missing `authorization: Bearer <agent secret>`",
        )),
    }
}

/// Equality of secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[tonic::async_trait]
impl NodeAgent for CaptureService {
    async fn capture(
        &self,
        req: Request<v1::CaptureRequest>,
    ) -> Result<Response<v1::CaptureResponse>, Status> {
        check_secret(&req, &self.secret)?;
        let req = req.into_inner();
        let kind = match v1::ProfileKind::try_from(req.kind) {
            Ok(v1::ProfileKind::Cpu) => ProfileKind::Cpu,
            Ok(v1::ProfileKind::Heap) => ProfileKind::Heap,
            _ => {
                return Err(Status::invalid_argument(format!(
                    "kind {}: must be CPU or HEAP",
                    req.kind
                )));
            }
        };
        let duration = Duration::from_millis(u64::from(req.duration_ms));
        if duration.is_zero() || duration > MAX_CAPTURE {
            return Err(Status::invalid_argument(format!(
                "duration_ms {}: must be 1–{}",
                req.duration_ms,
                MAX_CAPTURE.as_millis()
            )));
        }
        let interval = if req.interval_us == 0 {
            self.default_interval
        } else {
            Duration::from_micros(u64::from(req.interval_us))
        };
        if req.isolate_ids.is_empty() {
            return Err(Status::invalid_argument(
                "isolate_ids: name at least one isolate",
            ));
        }

        let mut results: Vec<v1::IsolateCapture> = Vec::new();
        let mut active = ActiveCapture {
            started: Vec::new(),
        };
        for id in &req.isolate_ids {
            match self.hosting.find(id) {
                None => results.push(v1::IsolateCapture {
                    isolate_id: id.clone(),
                    error: "isolate not found on this machine (evicted or reclaimed)".into(),
                    ..Default::default()
                }),
                Some(slot) => {
                    let started = match slot.profiler() {
                        Some(handle) => handle
                            .start(kind, interval)
                            .map(|()| handle)
                            .map_err(|e| e.to_string()),
                        None => Err("the isolate is still starting".to_owned()),
                    };
                    match started {
                        Ok(handle) => active.started.push((slot, handle)),
                        Err(e) => results.push(v1::IsolateCapture {
                            isolate_id: id.clone(),
                            script: slot.key.script.clone(),
                            version_id: slot.version_id.clone(),
                            error: format!("cannot start profiling: {e}"),
                            ..Default::default()
                        }),
                    }
                }
            }
        }

        tokio::time::sleep(duration).await;

        let started = std::mem::take(&mut active.started);
        // Stopping flips each isolate, and encoding gzips its profile: both
        // off the async workers, which keep serving traffic meanwhile.
        let stopped = tokio::task::spawn_blocking(move || {
            started
                .into_iter()
                .map(|(slot, handle)| {
                    let stopped = handle.stop().map(|r| {
                        let pprof = edgeprof_pprof::encode(&r.profile);
                        (r, pprof)
                    });
                    (slot, stopped)
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|_| Status::internal("stopping profiles panicked"))?;
        for (slot, result) in stopped {
            let mut capture = v1::IsolateCapture {
                isolate_id: slot.id.clone(),
                script: slot.key.script.clone(),
                version_id: slot.version_id.clone(),
                durable_objects: slot.durable_object.iter().map(|o| o.wire()).collect(),
                ..Default::default()
            };
            match result {
                Ok((r, pprof)) => {
                    capture.samples = r.samples;
                    capture.dropped = r.dropped;
                    capture.requests = Some(r.requests);
                    capture.pprof = pprof;
                }
                Err(e) => capture.error = format!("profiling failed: {e}"),
            }
            results.push(capture);
        }
        let ok = results.iter().any(|r| r.error.is_empty());
        self.metrics.capture(ok);
        Ok(Response::new(v1::CaptureResponse {
            machine: Some(self.machine.clone()),
            isolates: results,
        }))
    }
}
