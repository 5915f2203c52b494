//! Integration tests of `edgeprof-pprof`: malformed input, properties over
//! random profiles, and the semantics of the reports.

mod corpus;
mod props;
mod reports;
mod support;
