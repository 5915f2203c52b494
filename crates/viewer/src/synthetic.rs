//! Deterministic large profiles for benchmarks and load tests of both
//! viewers: the same bytes on every run, shaped like a real program's
//! (a few entry points, then handlers, then a long tail of leaves), so a
//! figure measured today compares with one measured tomorrow.

use edgeprof_pprof::{LineSpec, Profile, ProfileBuilder, Sample};

/// Deterministic xorshift.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A CPU profile (`samples/count`, `cpu/nanoseconds`) of `samples` sample
/// records over `stacks` distinct stacks of 8–24 frames drawn from 2 000
/// functions; the first `stacks` samples use each stack once, so all of
/// them occur. Each sample is 1 count, 1 ms.
pub fn profile(samples: usize, stacks: usize) -> Profile {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    let locations: Vec<u64> = (0..2000)
        .map(|i| {
            let f = b.function(
                &format!("module::function_{i}"),
                "",
                &format!("src/m{}.rs", i % 50),
                1,
            );
            b.location(
                0,
                0x1000 + i,
                &[LineSpec {
                    function_id: f,
                    line: (i % 300) as i64 + 1,
                    column: 0,
                }],
            )
        })
        .collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut distinct: Vec<Vec<u64>> = Vec::with_capacity(stacks);
    for _ in 0..stacks {
        let depth = 8 + rng.below(17) as usize;
        let mut stack: Vec<u64> = Vec::with_capacity(depth);
        // Root first here; pprof wants leaf first, reversed below.
        stack.push(locations[rng.below(4) as usize]);
        for d in 1..depth {
            let fanout = (4 * d * d) as u64;
            stack.push(locations[(rng.below(fanout.min(2000))) as usize]);
        }
        stack.reverse();
        distinct.push(stack);
    }
    let mut p = b.build();
    if distinct.is_empty() {
        return p;
    }
    p.sample = (0..samples)
        .map(|i| Sample {
            location_id: distinct[if i < stacks {
                i
            } else {
                rng.below(stacks as u64) as usize
            }]
            .clone(),
            value: vec![1, 1_000_000],
            label: Vec::new(),
        })
        .collect();
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CallTree, TreeOptions};

    #[test]
    fn same_profile_every_time_with_every_stack_present() {
        let p = profile(2_000, 500);
        assert_eq!(p.sample.len(), 2_000);
        assert_eq!(p, profile(2_000, 500));
        let distinct: std::collections::HashSet<&Vec<u64>> =
            p.sample.iter().map(|s| &s.location_id).collect();
        assert!(distinct.len() > 450, "{} distinct stacks", distinct.len());
        let tree = CallTree::build(&p, &TreeOptions::default()).unwrap();
        assert_eq!(tree.total(), 2_000 * 1_000_000);
        assert!(profile(10, 0).sample.is_empty());
    }
}
