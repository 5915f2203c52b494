//! Integration tests of the viewer: the model through its public API, and
//! the terminal front rendered into ratatui's `TestBackend`.

mod compare;
mod invariants;
mod model;
mod properties;
mod sandwich;
// The realistic profiles are for the terminal snapshots.
#[cfg_attr(not(feature = "terminal"), allow(dead_code))]
mod profiles;
#[cfg(feature = "terminal")]
mod terminal;
#[cfg(feature = "terminal")]
mod terminal_diff;
#[cfg(feature = "terminal")]
mod terminal_labels;
