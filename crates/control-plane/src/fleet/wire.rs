//! The fleet's types from the agents' wire messages, once the registry
//! has checked them (the same conversion serves calls received directly
//! and calls read back from the replicas' fleet log).

use edgeprof_proto::v1;

use super::{Chunk, Isolate, Machine};

impl From<v1::Machine> for Machine {
    fn from(m: v1::Machine) -> Self {
        Machine {
            id: m.id,
            data_center: m.data_center,
            grpc_address: m.grpc_address,
            http_address: m.http_address,
        }
    }
}

impl From<v1::IsolateStatus> for Isolate {
    fn from(i: v1::IsolateStatus) -> Self {
        Isolate {
            id: i.isolate_id,
            account: i.account,
            script: i.script,
            version_id: i.version_id,
            requests_last_60s: i.requests_last_60s,
            last_request_unix_ms: i.last_request_unix_ms,
            durable_objects: i.durable_objects,
            memory_bytes: i.memory_bytes,
            evictions: i.evictions,
            memory_evictions: i.memory_evictions,
        }
    }
}

impl Chunk {
    /// Where a checked heartbeat stands in its heartbeat: `chunks` 0 or 1
    /// is a whole heartbeat.
    pub fn of(req: &v1::HeartbeatRequest) -> Chunk {
        match req.chunks {
            0 | 1 => Chunk::WHOLE,
            n => Chunk {
                heartbeat_id: req.heartbeat_id,
                index: req.chunk,
                count: n,
            },
        }
    }
}
