//! The binary: restarts, `token create`, `--check-config`.
