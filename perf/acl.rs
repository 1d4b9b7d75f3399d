//! Micro-benchmark of admission: nanoseconds per access-list lookup with 1k, 10k and
//! 100k prefixes (Sluice's range table, `service::acl`, against the `prefix-trie`
//! crate's `PrefixMap::get_lpm` on the same prefixes and addresses), the build time
//! of a 100k list, nanoseconds per rate-limit check (`RateTable::check`), and the
//! resident memory each structure adds (read from /proc/self/statm). No DPDK, no root.
//!
//! Run: `cargo bench --bench acl -- [ROUNDS] [LOOKUPS]` (default 7 rounds of 2 000 000
//! lookups or checks per cell). Prints markdown tables: each cell is the median of
//! the rounds with the range (min-max).
//!
//! Prefixes: lengths as in a routing table (about 60 % /24, the rest spread over /16
//! to /23 and /25 to /32), networks drawn at random over the whole space, half allow
//! and half deny, nested wherever they happen to overlap. Addresses: "random" over
//! the whole space (most match no rule) and "inside" (a random address inside a
//! random rule's network), both precomputed so the loop times the lookup alone.
use sluice::dataplane::forwarder::admission::RateTable;
use sluice::model::rng::Rng;
use sluice::service::{Acl, AclAction, Prefix, RateLimit};
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Instant;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn prefixes(count: usize, seed: u64) -> Vec<(Prefix, AclAction)> {
    let mut rng = Rng::new(seed);
    let mut set = std::collections::BTreeMap::new();
    while set.len() < count {
        let roll = rng.below(100);
        let len = match roll {
            0..=59 => 24,
            60..=89 => 16 + rng.below(8) as u8,
            _ => 25 + rng.below(8) as u8,
        };
        let net = rng.next_u64() as u32 & sluice::service::acl::mask(len);
        let action = if rng.below(2) == 0 {
            AclAction::Allow
        } else {
            AclAction::Deny
        };
        set.insert(Prefix::new(Ipv4Addr::from(net), len).unwrap(), action);
    }
    set.into_iter().collect()
}

fn median_range(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!("{:.1} ({:.1}-{:.1})", v[v.len() / 2], v[0], v[v.len() - 1])
}

/// ns per call of `f` over `addrs`, one figure per round.
fn time_rounds(rounds: usize, addrs: &[u32], mut f: impl FnMut(u32) -> u32) -> Vec<f64> {
    (0..rounds)
        .map(|_| {
            let started = Instant::now();
            let mut sum = 0u32;
            for &a in addrs {
                sum = sum.wrapping_add(f(a));
            }
            black_box(sum);
            started.elapsed().as_nanos() as f64 / addrs.len() as f64
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let rounds: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(7);
    let lookups: usize = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);

    // Memory first, before other allocations can be reused.
    let before = resident_bytes();
    let mut table = black_box(RateTable::new(1));
    let rate_table_rss = resident_bytes() - before;
    let rules = prefixes(100_000, 100);
    let before = resident_bytes();
    let acl = black_box(Acl::build(rules.iter().copied(), 1).unwrap());
    let acl_rss = resident_bytes() - before;
    let before = resident_bytes();
    let mut trie = prefix_trie::PrefixMap::<(u32, u8), AclAction>::new();
    for (p, a) in &rules {
        trie.insert((u32::from(p.addr()), p.prefix_len()), *a);
    }
    let trie = black_box(trie);
    let trie_rss = resident_bytes() - before;
    println!("## Memory (resident bytes added, /proc/self/statm)\n");
    println!("| structure | bytes |\n|---|---:|");
    println!(
        "| rate table, one worker ({} bytes allocated) | {rate_table_rss} |",
        table.heap_bytes()
    );
    println!(
        "| access list, 100k prefixes, one worker row ({} bytes allocated, {} ranges) | {acl_rss} |",
        acl.heap_bytes(),
        acl.ranges()
    );
    println!("| prefix-trie PrefixMap, 100k prefixes | {trie_rss} |");
    drop(trie);
    drop(acl);

    println!("\n## Build of a 100k-prefix list (ms)\n");
    let builds: Vec<f64> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            black_box(Acl::build(rules.iter().copied(), 2).unwrap());
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    let trie_builds: Vec<f64> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            let mut t = prefix_trie::PrefixMap::<(u32, u8), AclAction>::new();
            for (p, a) in &rules {
                t.insert((u32::from(p.addr()), p.prefix_len()), *a);
            }
            black_box(t);
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    println!("| structure | ms |\n|---|---:|");
    println!(
        "| range table (Acl::build, 2 worker rows) | {} |",
        median_range(builds)
    );
    println!(
        "| prefix-trie PrefixMap (100k inserts) | {} |",
        median_range(trie_builds)
    );

    println!("\n## Lookup, ns per address ({rounds} rounds x {lookups} lookups)\n");
    println!("| prefixes | addresses | range table | prefix-trie get_lpm |");
    println!("|---:|---|---:|---:|");
    for count in [1_000usize, 10_000, 100_000] {
        let rules = prefixes(count, count as u64);
        let acl = Acl::build(rules.iter().copied(), 1).unwrap();
        let mut trie = prefix_trie::PrefixMap::<(u32, u8), AclAction>::new();
        for (p, a) in &rules {
            trie.insert((u32::from(p.addr()), p.prefix_len()), *a);
        }
        let mut rng = Rng::new(7);
        let random: Vec<u32> = (0..lookups).map(|_| rng.next_u64() as u32).collect();
        let inside: Vec<u32> = (0..lookups)
            .map(|_| {
                let (p, _) = rules[rng.below(rules.len() as u64) as usize];
                u32::from(p.addr())
                    | (rng.next_u64() as u32 & !sluice::service::acl::mask(p.prefix_len()))
            })
            .collect();
        for (name, addrs) in [("random", &random), ("inside a rule", &inside)] {
            // Both must agree on every address, or the comparison means nothing.
            for &a in addrs.iter().take(100_000) {
                let ours = acl
                    .longest_match(Ipv4Addr::from(a))
                    .map(|i| acl.rules()[i as usize].prefix);
                let theirs = trie
                    .get_lpm(&(a, 32))
                    .map(|((net, len), _)| Prefix::new(Ipv4Addr::from(net), len).unwrap());
                assert_eq!(ours, theirs, "{}", Ipv4Addr::from(a));
            }
            let ours = time_rounds(rounds, addrs, |a| {
                u32::from(acl.decide(Ipv4Addr::from(a)).allowed)
            });
            let theirs = time_rounds(rounds, addrs, |a| match trie.get_lpm(&(a, 32)) {
                Some((_, AclAction::Allow)) => 1,
                Some(_) => 0,
                None => 2,
            });
            println!(
                "| {count} | {name} | {} | {} |",
                median_range(ours),
                median_range(theirs)
            );
        }
    }

    println!("\n## Rate-limit check, ns per new connection ({rounds} rounds x {lookups} checks)\n");
    println!("| sources | ns |\n|---|---:|");
    let hz = 2_600_000_000u64;
    let limit = RateLimit::new(100, 100, 32).unwrap().per_worker(1, hz);
    for (name, sources) in [
        ("1 (one hot bucket)", 1u64),
        ("10 000 (fit the table)", 10_000),
        ("1 000 000 (evicting)", 1_000_000),
    ] {
        let mut now = 1_000 * hz;
        let keys: Vec<u32> = (0..lookups as u64)
            .map(|i| (i % sources) as u32 + 1)
            .collect();
        let figures = time_rounds(rounds, &keys, |k| {
            now += 1_000;
            u32::from(table.check(1 << 32 | u64::from(k), now, &limit).admitted)
        });
        println!("| {name} | {} |", median_range(figures));
    }
    println!(
        "\nresident after the flood of 1 000 000 sources: rate table still {} bytes allocated",
        table.heap_bytes()
    );
}
