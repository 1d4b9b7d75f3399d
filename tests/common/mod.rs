//! Shared fixtures for Sluice's integration tests (tiers 2 and 3 of docs/TESTING.md),
//! one file per job; everything is re-exported here, so a test says `use common::*`.
//!
//! - `process`: [`run_bounded`] runs a command with a deadline (every external command
//!   goes through it, so no test can hang); [`BackgroundProcess`] for helpers that run
//!   alongside a test; [`require_root`] fails (never skips) a test not run as root;
//!   [`unique_tag`] gives short names unique per process and call, so test binaries and
//!   tests can run side by side (DPDK file prefixes, test-bed names, sockets).
//! - `testbed`: [`Testbed`] runs `scripts/testbed.sh up` with a unique name; `Drop` runs
//!   `down`, also when the test panics.
//! - `config`: [`DaemonConfig`], the TOML a test runs `sluice` with.
//! - `daemon`: [`Daemon`] starts `sluice` (optionally inside a network namespace),
//!   waits until `sluicectl status` answers, stops it with a signal within a bound;
//!   `Drop` kills it if still running and prints its output when the test failed.
//!   Accessors for its JSON reports.
//! - `applab`: [`AppLab`], a test bed whose real servers run `tests/tools/e2e_apps.py`.
//! - `golden`: [`golden_counter_mismatches`], the daemon's counters against a golden
//!   tool's expectations; [`assert_checker_selftest`]; [`run_live_golden`], a golden
//!   tool that plays client and real servers live against the daemon.
//! - [`eal`]: the in-process EAL test bed of `eal_ring` and `eal_held`.
#![allow(dead_code)]

mod applab;
mod config;
mod daemon;
pub mod eal;
mod golden;
mod process;
mod testbed;

// Each test binary uses only part of the fixtures.
#[allow(unused_imports)]
pub use applab::*;
#[allow(unused_imports)]
pub use config::*;
#[allow(unused_imports)]
pub use daemon::*;
#[allow(unused_imports)]
pub use golden::*;
#[allow(unused_imports)]
pub use process::*;
#[allow(unused_imports)]
pub use testbed::*;
