//! The loopback peer emulator: the neighbours on the far side of a `loopback = true`
//! port, played in-process over a net_ring pair. At this stage each peer resolves the
//! appliance's MAC with ARP and pings its address; every `garbage_every`th frame is
//! malformed on purpose, so the demo shows the drop counters at work. It checks every
//! reply it gets and counts anything wrong. Later issues extend it into clients and real
//! servers.
pub mod frames;

use crate::config::{Ipv4Cidr, LoopbackConfig};
use crate::dpdk::{register_thread, tsc, tsc_hz, Burst, Mempool, RxQueue, TxQueue, BURST_SIZE};
use frames::{Garbage, Reply};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the emulated peers saw. Written by the emulator thread, read by anyone.
#[derive(Default, Debug)]
pub struct EmulatorStats {
    pub arp_requests: AtomicU64,
    pub arp_replies: AtomicU64,
    pub echo_requests: AtomicU64,
    pub echo_replies: AtomicU64,
    /// Replies that were wrong in any field or checksum.
    pub bad_replies: AtomicU64,
    /// Frames the peers did not expect at all.
    pub unexpected: AtomicU64,
    /// Malformed frames sent on purpose.
    pub garbage_sent: AtomicU64,
    /// Frames that could not be sent (mempool empty or TX ring full).
    pub send_failures: AtomicU64,
    pub rtt_sum_ns: AtomicU64,
    pub rtt_max_ns: AtomicU64,
}

impl EmulatorStats {
    pub fn summary(&self) -> String {
        let replies = self.echo_replies.load(Relaxed);
        let avg_us = if replies == 0 {
            0.0
        } else {
            self.rtt_sum_ns.load(Relaxed) as f64 / replies as f64 / 1000.0
        };
        format!(
            "arp {}/{} echo {}/{} (replies/requests), rtt avg {:.1} us max {:.1} us, bad {} unexpected {} garbage sent {} send failures {}",
            self.arp_replies.load(Relaxed),
            self.arp_requests.load(Relaxed),
            replies,
            self.echo_requests.load(Relaxed),
            avg_us,
            self.rtt_max_ns.load(Relaxed) as f64 / 1000.0,
            self.bad_replies.load(Relaxed),
            self.unexpected.load(Relaxed),
            self.garbage_sent.load(Relaxed),
            self.send_failures.load(Relaxed),
        )
    }
}

/// One emulated neighbour.
struct Peer {
    mac: [u8; 6],
    ip: Ipv4Addr,
    queue: u16,
    /// The appliance's MAC once ARP resolved it.
    resolved: Option<[u8; 6]>,
    seq: u16,
}

pub struct Emulator {
    stats: Arc<EmulatorStats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Emulator {
    /// Starts the peers on the far port's queue pairs, towards the appliance at
    /// `appliance_mac` / `appliance`.
    pub fn start(
        queues: Vec<(RxQueue, TxQueue)>,
        pool: Arc<Mempool>,
        cfg: &LoopbackConfig,
        appliance_mac: [u8; 6],
        appliance: Ipv4Cidr,
    ) -> Result<Emulator, String> {
        let peers = make_peers(cfg.peers, queues.len() as u16, appliance)?;
        let stats = Arc::new(EmulatorStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut run = Run {
            queues,
            pool,
            peers,
            appliance_mac,
            appliance_ip: appliance.addr,
            interval: Duration::from_millis(cfg.ping_interval_ms),
            garbage_every: cfg.garbage_every,
            stats: stats.clone(),
            stop: stop.clone(),
            frames_sent: 0,
            garbage_kind: 0,
        };
        let thread = std::thread::Builder::new()
            .name("sluice-peers".into())
            .spawn(move || {
                if let Err(e) = register_thread() {
                    log::error!("peer emulator: {e}");
                    return;
                }
                run.run();
            })
            .map_err(|e| e.to_string())?;
        log::info!(
            "peer emulator: {} peer(s) at {} +1.. pinging every {} ms",
            cfg.peers,
            appliance.addr,
            cfg.ping_interval_ms
        );
        Ok(Emulator {
            stats,
            stop,
            thread: Some(thread),
        })
    }

    pub fn stats(&self) -> &EmulatorStats {
        &self.stats
    }

    /// Stops the peers and returns their final counts.
    pub fn stop(mut self) -> Arc<EmulatorStats> {
        self.shutdown();
        self.stats.clone()
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn make_peers(count: u16, queues: u16, appliance: Ipv4Cidr) -> Result<Vec<Peer>, String> {
    let base = u32::from(appliance.addr);
    (0..count)
        .map(|k| {
            let ip = Ipv4Addr::from(base.wrapping_add(1 + k as u32));
            if !appliance.contains(ip) {
                return Err(format!(
                    "peer {} ({ip}) falls outside {appliance}: use fewer peers or a wider prefix",
                    k + 1
                ));
            }
            Ok(Peer {
                mac: [0x02, 0x50, 0x45, 0x45, 0x52, k as u8 + 1],
                ip,
                queue: k % queues,
                resolved: None,
                seq: 0,
            })
        })
        .collect()
}

/// The emulator thread's state.
struct Run {
    queues: Vec<(RxQueue, TxQueue)>,
    pool: Arc<Mempool>,
    peers: Vec<Peer>,
    appliance_mac: [u8; 6],
    appliance_ip: Ipv4Addr,
    interval: Duration,
    garbage_every: u32,
    stats: Arc<EmulatorStats>,
    stop: Arc<AtomicBool>,
    frames_sent: u64,
    garbage_kind: usize,
}

impl Run {
    fn run(&mut self) {
        let ns_per_tick = 1e9 / tsc_hz() as f64;
        let mut next_round = Instant::now();
        let mut rx = Burst::new();
        while !self.stop.load(Relaxed) {
            if Instant::now() >= next_round {
                next_round += self.interval;
                for p in 0..self.peers.len() {
                    let q = self.peers[p].queue as usize;
                    let mut out = Burst::new();
                    self.round_for_peer(p, &mut out);
                    let n = out.len();
                    let sent = self.queues[q].1.tx(&mut out);
                    if sent < n {
                        self.stats
                            .send_failures
                            .fetch_add((n - sent) as u64, Relaxed);
                    }
                }
            }
            for q in 0..self.queues.len() {
                while self.queues[q].0.rx(&mut rx) > 0 {
                    for i in 0..rx.len() {
                        self.check_reply(rx.packet(i), ns_per_tick);
                    }
                    rx.free_all();
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Queues one round of frames for peer `p` into `out`: ARP until resolved (and
    /// every 16th round after, as a neighbour refreshes its cache), then an echo
    /// request, plus a malformed frame when one is due.
    fn round_for_peer(&mut self, p: usize, out: &mut Burst) {
        let seq = self.peers[p].seq;
        self.peers[p].seq = seq.wrapping_add(1);
        let peer = &self.peers[p];
        let (mac, ip) = (peer.mac, peer.ip);
        if peer.resolved.is_none() || seq.is_multiple_of(16) {
            let target = self.appliance_ip;
            if self.emit(out, |buf| frames::arp_request(buf, mac, ip, target)) {
                self.stats.arp_requests.fetch_add(1, Relaxed);
            }
        }
        if let Some(dst_mac) = self.peers[p].resolved {
            let (dst_ip, id, stamp) = (self.appliance_ip, p as u16 + 1, tsc());
            if self.emit(out, |buf| {
                frames::echo_request(buf, mac, dst_mac, ip, dst_ip, id, seq, stamp)
            }) {
                self.stats.echo_requests.fetch_add(1, Relaxed);
            }
        }
        if self.garbage_every > 0 && self.frames_sent.is_multiple_of(self.garbage_every as u64) {
            let kind = Garbage::ALL[self.garbage_kind % Garbage::ALL.len()];
            self.garbage_kind += 1;
            let (amac, aip) = (self.appliance_mac, self.appliance_ip);
            if self.emit(out, |buf| frames::garbage(buf, kind, mac, amac, ip, aip)) {
                self.stats.garbage_sent.fetch_add(1, Relaxed);
            }
        }
    }

    /// Allocates one mbuf, lets `build` write the frame, and appends it to `out`.
    fn emit(&mut self, out: &mut Burst, build: impl FnOnce(&mut [u8]) -> usize) -> bool {
        if out.len() >= BURST_SIZE || !out.alloc_from(&self.pool, 1) {
            self.stats.send_failures.fetch_add(1, Relaxed);
            return false;
        }
        let i = out.len() - 1;
        out.set_packet_len(i, frames::MAX_FRAME as u16);
        let len = build(out.packet_mut(i));
        out.set_packet_len(i, len as u16);
        self.frames_sent += 1;
        true
    }

    fn check_reply(&mut self, frame: &[u8], ns_per_tick: f64) {
        match frames::parse_reply(frame, self.appliance_mac, self.appliance_ip) {
            Reply::Arp {
                target_mac,
                target_ip,
            } => {
                match self
                    .peers
                    .iter_mut()
                    .find(|p| p.mac == target_mac && p.ip == target_ip)
                {
                    Some(peer) => {
                        peer.resolved = Some(self.appliance_mac);
                        self.stats.arp_replies.fetch_add(1, Relaxed);
                    }
                    None => {
                        self.stats.bad_replies.fetch_add(1, Relaxed);
                    }
                }
            }
            Reply::Echo {
                dst_mac,
                dst_ip,
                id,
                stamp,
            } => {
                let ok = self
                    .peers
                    .get(id as usize - 1)
                    .is_some_and(|p| p.mac == dst_mac && p.ip == dst_ip);
                if ok {
                    let rtt = (tsc().wrapping_sub(stamp) as f64 * ns_per_tick) as u64;
                    self.stats.echo_replies.fetch_add(1, Relaxed);
                    self.stats.rtt_sum_ns.fetch_add(rtt, Relaxed);
                    self.stats.rtt_max_ns.fetch_max(rtt, Relaxed);
                } else {
                    self.stats.bad_replies.fetch_add(1, Relaxed);
                }
            }
            Reply::Bad(why) => {
                log::warn!("peer emulator: bad reply: {why}");
                self.stats.bad_replies.fetch_add(1, Relaxed);
            }
            Reply::Unexpected => {
                self.stats.unexpected.fetch_add(1, Relaxed);
            }
        }
    }
}
