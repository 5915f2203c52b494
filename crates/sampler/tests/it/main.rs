//! Integration tests of the sampler: real Wasmtime isolates, real workers.

mod continuous;
mod cpu;
mod discipline;
mod limits;
mod support;
mod workers;
