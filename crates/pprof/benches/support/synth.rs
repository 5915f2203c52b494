//! Realistic synthetic CPU profiles for benchmarks: one "script" whose call
//! graph is shared by many isolates, each profile sampling thousands of
//! distinct stacks of it. Deterministic for a given seed.

use edgeprof_pprof::{LineSpec, MappingSpec, Profile, ProfileBuilder};

/// Shape of the generated profiles.
pub struct Shape {
    /// Distinct functions in the script.
    pub functions: u64,
    /// Distinct stacks per profile.
    pub stacks: usize,
    /// Deepest stack.
    pub max_depth: usize,
}

/// About what one 10 s capture of a busy isolate holds.
pub const ISOLATE: Shape = Shape {
    functions: 800,
    stacks: 3000,
    max_depth: 40,
};

/// xorshift64*: enough randomness for a benchmark, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Profile number `seed` of the shape: stacks are random walks down a fixed
/// call graph (the same for every seed, as for isolates of one script), so
/// merged profiles share most functions and locations.
pub fn cpu_profile(shape: &Shape, seed: u64) -> Profile {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 1_000_000)
        .time_nanos(1_767_225_600_000_000_000 + seed as i64 * 1_000_000_000)
        .duration_nanos(10_000_000_000);
    let m = b.mapping(&MappingSpec {
        memory_start: 0,
        memory_limit: 1 << 24,
        filename: "worker.wasm",
        build_id: "5f1c0a9e",
        has_functions: true,
        has_filenames: true,
        has_line_numbers: true,
        has_inline_frames: true,
        ..Default::default()
    });
    let functions: Vec<u64> = (0..shape.functions)
        .map(|i| {
            let name = format!("worker::module_{}::function_{i}", i % 37);
            let mangled = format!(
                "_ZN6worker9module_{}10function_{i}17h0123456789abcdefE",
                i % 37
            );
            b.function(
                &name,
                &mangled,
                &format!("src/module_{}.rs", i % 37),
                i as i64 * 7,
            )
        })
        .collect();
    // The call graph: each function calls a few fixed others.
    let mut graph = Rng(0x9e37_79b9_7f4a_7c15);
    let callees: Vec<[u64; 4]> = (0..shape.functions)
        .map(|_| std::array::from_fn(|_| graph.below(shape.functions)))
        .collect();
    let mut rng = Rng(seed.wrapping_mul(0x1000_0000_01b3) ^ 0xcbf2_9ce4_8422_2325);
    let mut stack = Vec::with_capacity(shape.max_depth);
    for _ in 0..shape.stacks {
        stack.clear();
        let depth = 3 + rng.below(shape.max_depth as u64 - 2) as usize;
        let mut f = rng.below(8); // a few entry points
        let mut frames = Vec::with_capacity(depth);
        for _ in 0..depth {
            frames.push(f);
            f = callees[f as usize][rng.below(4) as usize];
        }
        for &f in frames.iter().rev() {
            // A few call sites per function, every 5th with an inlined callee.
            let site = rng.below(3) as i64;
            let mut lines = vec![LineSpec {
                function_id: functions[f as usize],
                line: f as i64 * 7 + site + 1,
                column: 0,
            }];
            if f % 5 == 0 {
                let inlined = callees[f as usize][0];
                lines.insert(
                    0,
                    LineSpec {
                        function_id: functions[inlined as usize],
                        line: inlined as i64 * 7 + 2,
                        column: 0,
                    },
                );
            }
            let address = 0x1000 + f * 0x100 + site as u64 * 4;
            stack.push(b.location(m, address, &lines));
        }
        let n = 1 + rng.below(20) as i64;
        b.add_sample(&stack, &[n, n * 1_000_000], &[]);
    }
    b.build()
}
