//! Integration tests of the sampler: real Wasmtime isolates, real workers.

mod cpu;
mod discipline;
mod limits;
mod support;
mod workers;
