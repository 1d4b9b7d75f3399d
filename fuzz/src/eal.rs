//! One EAL per fuzzing process (no huge pages, no PCI, no shared config, a file
//! prefix of its own) and a small mempool: `Forwarder::handle` works on DPDK bursts.
use sluice::dpdk::{Burst, Eal, Mempool};
use std::sync::OnceLock;

struct Dpdk {
    _eal: Eal,
    pool: Mempool,
}

static DPDK: OnceLock<Dpdk> = OnceLock::new();

/// The process's mempool (64 mbufs of 2048 bytes), the EAL started on first use.
pub fn pool() -> &'static Mempool {
    &DPDK
        .get_or_init(|| {
            let prefix = format!("sl-fuzz-{}", std::process::id());
            let args: Vec<String> = [
                "sluice-fuzz",
                "-l",
                "0",
                "--no-huge",
                "-m",
                "64",
                "--no-shconf",
                "--no-pci",
                "--file-prefix",
                &prefix,
                "--log-level",
                "lib.eal:error",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let eal = Eal::init(&args).expect("EAL init (needs root)");
            let pool = Mempool::new("fuzz_pool", 63, 0, 2048).expect("mempool");
            Dpdk { _eal: eal, pool }
        })
        .pool
}

/// A burst of one packet holding `frame` (cut to the mbuf's room).
pub fn burst_of(frame: &[u8]) -> Burst {
    let mut burst = Burst::new();
    assert!(
        burst.alloc_from(pool(), 1),
        "mempool exhausted: an mbuf leaked"
    );
    let room = burst.packet_with_tailroom_mut(0);
    let len = frame.len().min(room.len());
    room[..len].copy_from_slice(&frame[..len]);
    assert!(burst.set_packet_len(0, len as u16));
    burst
}
