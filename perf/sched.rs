//! Micro-benchmark of the schedulers: nanoseconds per `pick` for every kind with 10,
//! 100, 1000 and 10000 real servers, and the Maglev table build time (1000 servers,
//! M = 65537). No DPDK, no root.
//!
//! Run: `cargo bench --bench sched -- [PICKS] [SCHEDULER...]` (default 1000000 picks
//! per cell, every scheduler). Prints a markdown table.
//!
//! Each pick sees a new client (address and port from a counter, spread by a
//! multiplicative hash) and, for lblc/lblcr, one of 4096 destinations with a clock
//! advancing 1 ms per pick. Loads are synthetic and move: the picked server gains an
//! active connection and a pseudo-randomly chosen one loses one, so the load-based
//! schedulers see changing counts. The timed loop includes that bookkeeping (a few
//! nanoseconds), the same for every scheduler. Schedulers that track loads (lc, wlc,
//! sed, nq, lblc, lblcr) are told both changes with `set_load` and pick with tracked loads, as the
//! data plane does: their figure includes those two O(log n) updates. The others get
//! the whole load slice in the context.
//!
//! wrr replays its recorded cycle once the first one is picked (see `src/sched/wrr.rs`),
//! which the warm-up covers at weights 1..=5; the extra row `wrr, weights to 65535`
//! uses pseudo-random weights up to 65535, whose cycle is too long to record, so it
//! measures the tournament itself. A second table splits the load-tracking
//! schedulers' cost into a pick alone and one `set_load` alone.
use sluice::model::SchedulerKind;
use sluice::model::{ForwardMode, RealServer};
use sluice::sched::{self, PickContext, SchedulerParams, ServerLoad};
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Instant;

const SIZES: [usize; 4] = [10, 100, 1000, 10000];

/// `n` servers 10.h.l.1:80 with weights 1..=5.
fn servers(n: usize) -> Vec<RealServer> {
    servers_weighted(n, |i| 1 + (i % 5) as u32)
}

/// `n` servers 10.h.l.1:80 with weights `weight(i)`.
fn servers_weighted(n: usize, weight: impl Fn(usize) -> u32) -> Vec<RealServer> {
    (0..n)
        .map(|i| RealServer {
            id: i as u32 + 1,
            ip: Ipv4Addr::new(10, (i >> 8) as u8, i as u8, 1).into(),
            port: 80,
            weight: weight(i),
            mode: ForwardMode::Dr,
            upper: 0,
            lower: 0,
        })
        .collect()
}

/// Nanoseconds per pick over `picks` picks.
fn ns_per_pick(kind: SchedulerKind, servers: &[RealServer], picks: u32) -> f64 {
    let n = servers.len();
    let params = SchedulerParams {
        flags: "sh-port,mh-port".parse().unwrap(),
        seed: 0x1234_5678,
        ..SchedulerParams::default()
    };
    let mut scheduler = sched::build_with(kind, servers, &params);
    // Synthetic loads: a few active connections each, some inactive.
    let mut loads: Vec<ServerLoad> = (0..n)
        .map(|i| ServerLoad::new((i * 7 % 13) as u32, (i * 11 % 17) as u32))
        .collect();
    let tracked = scheduler.tracks_loads();
    if tracked {
        for (i, load) in loads.iter().enumerate() {
            scheduler.set_load(i, *load);
        }
    }
    let mut run = |count: u32, loads: &mut Vec<ServerLoad>| {
        let mut checksum = 0usize;
        for i in 0..count {
            let spread = i.wrapping_mul(0x9e37_79b1);
            let client = Ipv4Addr::from(0x6440_0000 | (spread >> 10));
            let destination = Ipv4Addr::from(0xc612_0000 | (spread >> 20));
            let ctx = if tracked {
                PickContext::new(client, 1024 + (i & 0x7fff) as u16, &[]).with_tracked_loads()
            } else {
                PickContext::new(client, 1024 + (i & 0x7fff) as u16, loads)
            }
            .with_destination(destination)
            .with_now_ms(u64::from(i));
            let pick = scheduler.pick(servers, &ctx);
            if let Some(p) = pick {
                checksum = checksum.wrapping_add(p);
                loads[p].active += 1;
                let other = (spread as usize >> 7) % n;
                loads[other].active = loads[other].active.saturating_sub(1);
                if tracked {
                    scheduler.set_load(p, loads[p]);
                    scheduler.set_load(other, loads[other]);
                }
            }
        }
        black_box(checksum);
    };
    run(picks / 10, &mut loads); // warm up: tables, caches, branch predictors
    let start = Instant::now();
    run(picks, &mut loads);
    start.elapsed().as_nanos() as f64 / f64::from(picks)
}

/// For a scheduler that tracks loads: nanoseconds per pick alone (no load change in
/// between, so one read) and per `set_load` alone (a pseudo-random server's active
/// count moves by one), over `count` calls each.
fn pick_and_update_ns(kind: SchedulerKind, n: usize, count: u32) -> (f64, f64) {
    let servers = servers(n);
    let mut scheduler = sched::build(kind, &servers);
    let mut loads: Vec<ServerLoad> = (0..n)
        .map(|i| ServerLoad::new((i * 7 % 13) as u32, (i * 11 % 17) as u32))
        .collect();
    for (i, load) in loads.iter().enumerate() {
        scheduler.set_load(i, *load);
    }
    let ctx = PickContext::new(Ipv4Addr::new(100, 64, 0, 1), 1024, &[]).with_tracked_loads();
    let start = Instant::now();
    let mut checksum = 0usize;
    for _ in 0..count {
        checksum = checksum.wrapping_add(black_box(scheduler.pick(&servers, &ctx)).unwrap_or(0));
    }
    let pick = start.elapsed().as_nanos() as f64 / f64::from(count);
    let start = Instant::now();
    for i in 0..count {
        let spread = i.wrapping_mul(0x9e37_79b1) as usize;
        let index = (spread >> 7) % n;
        let load = &mut loads[index];
        load.active = if spread & 1 == 0 {
            load.active + 1
        } else {
            load.active.saturating_sub(1)
        };
        scheduler.set_load(index, *load);
    }
    let update = start.elapsed().as_nanos() as f64 / f64::from(count);
    black_box(checksum);
    (pick, update)
}

/// Median build time of a 1000-server Maglev table, and all samples.
fn maglev_build(samples: usize) -> (f64, Vec<f64>) {
    let servers = servers(1000);
    let mut times: Vec<f64> = (0..samples)
        .map(|_| {
            let start = Instant::now();
            let table = sched::Maglev::new(&servers, 65537, Default::default()).unwrap();
            let elapsed = start.elapsed().as_secs_f64() * 1e3;
            black_box(table);
            elapsed
        })
        .collect();
    let all = times.clone();
    times.sort_by(f64::total_cmp);
    (times[samples / 2], all)
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let picks: u32 = args
        .iter()
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let only: Vec<SchedulerKind> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let wanted = |kind: SchedulerKind| only.is_empty() || only.contains(&kind);
    println!("ns per pick ({picks} picks per cell, weights 1..=5, moving synthetic loads):");
    println!();
    println!("| scheduler | 10 servers | 100 servers | 1000 servers | 10000 servers |");
    println!("|---|---:|---:|---:|---:|");
    for &kind in SchedulerKind::ALL.iter().filter(|&&k| wanted(k)) {
        let cells: Vec<String> = SIZES
            .iter()
            .map(|&n| format!("{:.1}", ns_per_pick(kind, &servers(n), picks)))
            .collect();
        println!("| {kind} | {} |", cells.join(" | "));
    }
    if wanted(SchedulerKind::Wrr) {
        let cells: Vec<String> = SIZES
            .iter()
            .map(|&n| {
                // Weights spread over 1..=65535 by a multiplicative hash.
                let weighted = servers_weighted(n, |i| {
                    1 + ((i as u32).wrapping_mul(0x9e37_79b1) >> 16) % 65535
                });
                format!("{:.1}", ns_per_pick(SchedulerKind::Wrr, &weighted, picks))
            })
            .collect();
        println!("| wrr, weights to 65535 | {} |", cells.join(" | "));
    }
    let tracking: Vec<SchedulerKind> = SchedulerKind::ALL
        .iter()
        .copied()
        .filter(|&k| wanted(k) && sched::build(k, &servers(1)).tracks_loads())
        .collect();
    if !tracking.is_empty() {
        println!();
        println!("Schedulers that track loads, ns per pick alone / per set_load alone:");
        println!();
        println!("| part | 10 servers | 100 servers | 1000 servers | 10000 servers |");
        println!("|---|---:|---:|---:|---:|");
        for kind in tracking {
            let cells: Vec<(f64, f64)> = SIZES
                .iter()
                .map(|&n| pick_and_update_ns(kind, n, picks))
                .collect();
            let show = |part: fn(&(f64, f64)) -> f64| {
                cells
                    .iter()
                    .map(|c| format!("{:.1}", part(c)))
                    .collect::<Vec<_>>()
                    .join(" | ")
            };
            println!("| {kind} pick | {} |", show(|c| c.0));
            println!("| {kind} set_load | {} |", show(|c| c.1));
        }
    }
    if wanted(SchedulerKind::Mh) {
        let (median, all) = maglev_build(15);
        println!();
        println!(
            "Maglev table build, 1000 servers, M = 65537: median {median:.3} ms over {} builds \
             (min {:.3}, max {:.3})",
            all.len(),
            all.iter().copied().fold(f64::INFINITY, f64::min),
            all.iter().copied().fold(0.0, f64::max),
        );
    }
}
