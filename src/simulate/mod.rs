//! What-if simulation: `sluice simulate` replays a connection workload through the
//! same scheduler code the data plane uses ([`crate::sched::build`]) and reports what
//! each scheduler does with it — before anything changes in production. No DPDK, no
//! root, no network: a deterministic discrete-time model (see [`engine`] for exactly
//! what it models and `docs/SIMULATE.md` for what it does not).
//!
//! - [`engine`]: the core. A [`engine::Scenario`] (servers, events, clients with
//!   long-lived connections, churn, arrivals, persistence, workers) run under one
//!   [`SchedulerKind`](crate::model::SchedulerKind) gives an [`engine::RunResult`]
//!   of plain numbers.
//! - [`workloads`]: the built-in workloads after the seed articles — `scale-out`
//!   (seed 002), `few-clients` (seed 000), `hetero` (seed 001) — as parameter structs
//!   whose `run` returns a report.
//! - [`custom`]: a workload from a TOML file, with `file:line:column: field: message`
//!   errors.
//! - [`report`]: the text tables; [`cli`]: `sluice simulate ...`.
//! - [`rng`]: the seeded PRNG (SplitMix64) that makes every run reproducible.
pub mod cli;
pub mod custom;
pub mod engine;
pub mod report;
pub mod workloads;

pub use engine::{run, RunResult, Scenario};
