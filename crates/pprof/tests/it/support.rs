//! Profiles and raw protobuf bytes for the tests.

use edgeprof_pprof::{LineSpec, MappingSpec, Profile, ProfileBuilder};

/// A small valid CPU profile: `main → work → leaf` and `main → other`, with
/// a mapping, two sample types and a label.
pub fn small_cpu() -> Profile {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 1_000_000)
        .time_nanos(1_700_000_000_000_000_000)
        .duration_nanos(10_000_000_000);
    let m = b.mapping(&MappingSpec {
        memory_start: 0,
        memory_limit: 0x10000,
        filename: "worker.wasm",
        build_id: "b1",
        has_functions: true,
        ..Default::default()
    });
    let ids: Vec<u64> = ["main", "work", "leaf", "other"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let f = b.function(name, name, "src/lib.rs", i as i64 * 10);
            b.location(m, 0x100 * (i as u64 + 1), &[line(f, i as i64 * 10 + 1)])
        })
        .collect();
    let dc = b.label_str("data_center", "lhr");
    b.add_sample(&[ids[2], ids[1], ids[0]], &[3, 3_000_000], &[dc]);
    b.add_sample(&[ids[3], ids[0]], &[1, 1_000_000], &[]);
    b.build()
}

pub fn line(function_id: u64, line: i64) -> LineSpec {
    LineSpec {
        function_id,
        line,
        column: 0,
    }
}

/// Hand-written protobuf, for bytes no valid `Profile` encodes to.
#[derive(Default)]
pub struct Wire(pub Vec<u8>);

impl Wire {
    pub fn varint(mut self, mut v: u64) -> Self {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(byte);
                return self;
            }
            self.0.push(byte | 0x80);
        }
    }
    pub fn key(self, field: u32, wire_type: u8) -> Self {
        self.varint(u64::from(field) << 3 | u64::from(wire_type))
    }
    /// Field `field` as varint `v`.
    pub fn int(self, field: u32, v: u64) -> Self {
        self.key(field, 0).varint(v)
    }
    /// Field `field` as length-delimited `bytes`.
    pub fn bytes(self, field: u32, bytes: &[u8]) -> Self {
        let mut w = self.key(field, 2).varint(bytes.len() as u64);
        w.0.extend_from_slice(bytes);
        w
    }
    /// Field `field` as a nested message.
    pub fn msg(self, field: u32, inner: Wire) -> Self {
        self.bytes(field, &inner.0)
    }
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}
