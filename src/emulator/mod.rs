//! The loopback peer emulator: the network on the far side of a `loopback = true` port,
//! played in-process over a net_ring pair by one thread. Three kinds of host live there:
//!
//! * **Peers** (`[loopback] peers`, at the port's address +1, +2, ...) resolve the
//!   appliance's MAC with ARP and ping its address.
//! * **Clients** (as many as peers, at the next free addresses of the subnet) resolve
//!   each VIP with ARP, then open TCP connections to every TCP service (handshake,
//!   request, response, FIN exchange) and send request datagrams to every UDP service,
//!   each client once per service per `ping_interval_ms`.
//! * **Real servers**: every configured real server is emulated (a peer when its
//!   address is one, a host of its own otherwise). It answers the appliance's ARP
//!   who-has and serves what the appliance forwards: NAT replies go back through the
//!   appliance (its gateway), FullNAT replies go back to the appliance's local address;
//!   DR and TUN replies go from the VIP straight to the client, handed over inside the
//!   emulator as a switch would. It answers the appliance's health probes (TCP from the
//!   appliance's address to its own) as a healthy host with the port open.
//!
//! **RSS.** A net_ring port has no hash of its own, so the emulator plays the NIC's
//! part: it sends every frame on the queue a NIC with the appliance's Toeplitz key and
//! redirection table would deliver it to (TCP/UDP over addresses and ports, other IPv4
//! over addresses, anything else to queue 0), and checks for each reply through the
//! appliance whether that queue is the one the connection's client packets land on
//! (the owner worker's). Multi-worker tests compare that count with the appliance's
//! redirect counter.
//!
//! Every frame received is checked (addresses, ports, sequence numbers, checksums) and
//! anything wrong is counted as bad and logged once per kind. Every `garbage_every`th
//! frame sent is malformed on purpose, so the drop counters move too. Everything is
//! bounded: one TX burst per queue, a fixed table of [`conn::TABLE_SIZE`] exchanges, and
//! exchanges that do not complete within [`EXCHANGE_TIMEOUT`] count as failed.
pub mod conn;
pub mod frames;

use crate::config::{Ipv4Cidr, LoopbackConfig, ServiceConfig};
use crate::dpdk::{register_thread, spawn_helper, tsc, tsc_hz, Burst, Mempool, RxQueue, TxQueue};
use crate::flow::rss::{HashFields, Reta, Toeplitz};
use crate::model::rng::Rng;
use crate::model::ForwardMode;
use crate::model::Protocol;
use conn::{Conn, Out, Stage, Step, TABLE_SIZE};
use frames::{Arp, Endpoints, Frame, Garbage, Segment};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A client retransmits what it last sent after this long without the reply.
pub const RETRANSMIT_AFTER: Duration = Duration::from_millis(100);
/// An exchange not complete this long after it was opened counts as failed.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);
/// Ceiling on new exchanges per second and service, whatever `[loopback]` says.
pub const MAX_RATE_PER_SERVICE: u64 = 2000;
/// At most this many exchanges are opened per poll (a late poll does not burst).
const MAX_OPENS_PER_POLL: u64 = 64;
/// How often the connection table is scanned for retransmissions and timeouts.
const TIMER_PERIOD: Duration = Duration::from_millis(5);

/// What the emulated hosts saw. Written by the emulator thread, read by anyone.
#[derive(Default, Debug)]
pub struct EmulatorStats {
    /// ARP requests the peers (for the appliance) and clients (for VIPs) sent, and the
    /// correct replies they got.
    pub arp_requests: AtomicU64,
    pub arp_replies: AtomicU64,
    pub echo_requests: AtomicU64,
    pub echo_replies: AtomicU64,
    /// Frames from the appliance that were wrong in any field or checksum (replies to
    /// peers and clients, and packets forwarded to real servers).
    pub bad_replies: AtomicU64,
    /// Frames nobody expected: late copies for exchanges already over, ARP for
    /// addresses nobody here has, protocols the hosts do not speak.
    pub unexpected: AtomicU64,
    /// Malformed frames sent on purpose.
    pub garbage_sent: AtomicU64,
    /// Frames that could not be sent (mempool empty or TX ring full).
    pub send_failures: AtomicU64,
    pub rtt_sum_ns: AtomicU64,
    pub rtt_max_ns: AtomicU64,
    /// The appliance's ARP requests for an emulated host, answered.
    pub arp_answered: AtomicU64,
    /// Segments of the appliance's health probes that an emulated real server answered
    /// (SYN-ACKs and HTTP responses).
    pub probes_answered: AtomicU64,
    /// TCP connections the clients opened, completed (last ACK sent after a correct
    /// FIN-ACK) and failed (timed out or a wrong reply).
    pub tcp_opened: AtomicU64,
    pub tcp_completed: AtomicU64,
    pub tcp_failed: AtomicU64,
    /// Open to last ACK, over completed connections.
    pub tcp_time_sum_ns: AtomicU64,
    pub tcp_time_max_ns: AtomicU64,
    /// UDP requests sent (first transmissions), correct responses, failures.
    pub udp_requests: AtomicU64,
    pub udp_round_trips: AtomicU64,
    pub udp_failed: AtomicU64,
    /// Segments and datagrams the clients sent again for want of a reply.
    pub retransmits: AtomicU64,
    /// Replies to retransmissions that arrived after the first copy had been used.
    pub duplicates: AtomicU64,
    /// Exchanges not opened because the connection table had no free slot.
    pub table_full: AtomicU64,
    /// Real servers' replies sent through the appliance (NAT, FullNAT), and how many of
    /// them went on a queue other than the one their connection's client packets use
    /// (RSS emulation: a worker that does not own the session receives them).
    pub replies_via_appliance: AtomicU64,
    pub replies_off_owner: AtomicU64,
    /// Completed exchanges per service and real server, by the server the response
    /// named, in config order.
    pub real_servers: Vec<ServedBy>,
}

/// Services whose spread [`EmulatorStats::summary`] lists: a loopback daemon with
/// thousands of services would otherwise print megabytes a second, on the management
/// core.
pub const SUMMARY_SERVICES: usize = 32;

/// Completed exchanges of one real server of one service.
#[derive(Debug)]
pub struct ServedBy {
    /// As ipvsadm prints it, `TCP 198.18.1.1:80`.
    pub service: String,
    /// `198.18.0.2:8080`.
    pub server: String,
    pub count: AtomicU64,
}

impl EmulatorStats {
    /// One line for the peers, and when there are services one for the clients and one
    /// per service with its real servers' counts (the first [`SUMMARY_SERVICES`], then
    /// how many more). Continuation lines are indented to sit
    /// under the daemon's `  peers:  ` label.
    pub fn summary(&self) -> String {
        let replies = self.echo_replies.load(Relaxed);
        let avg_us = if replies == 0 {
            0.0
        } else {
            self.rtt_sum_ns.load(Relaxed) as f64 / replies as f64 / 1000.0
        };
        let mut out = format!(
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
        );
        if self.real_servers.is_empty() {
            return out;
        }
        let (opened, completed, failed) = (
            self.tcp_opened.load(Relaxed),
            self.tcp_completed.load(Relaxed),
            self.tcp_failed.load(Relaxed),
        );
        let (requests, round_trips, udp_failed) = (
            self.udp_requests.load(Relaxed),
            self.udp_round_trips.load(Relaxed),
            self.udp_failed.load(Relaxed),
        );
        let avg_ms = if completed == 0 {
            0.0
        } else {
            self.tcp_time_sum_ns.load(Relaxed) as f64 / completed as f64 / 1e6
        };
        out += &format!(
            "\n          tcp opened {opened} completed {completed} failed {failed} in flight {}, time avg {avg_ms:.2} ms max {:.2} ms; udp round trips {round_trips}/{requests} failed {udp_failed} in flight {}; retransmits {} duplicates {} table full {} arp answered {} health probes answered {}; replies via the appliance {} (off the owner's queue {})",
            opened.saturating_sub(completed + failed),
            self.tcp_time_max_ns.load(Relaxed) as f64 / 1e6,
            requests.saturating_sub(round_trips + udp_failed),
            self.retransmits.load(Relaxed),
            self.duplicates.load(Relaxed),
            self.table_full.load(Relaxed),
            self.arp_answered.load(Relaxed),
            self.probes_answered.load(Relaxed),
            self.replies_via_appliance.load(Relaxed),
            self.replies_off_owner.load(Relaxed),
        );
        let mut last_service = "";
        let mut services = 0;
        for rs in &self.real_servers {
            let first_of_service = rs.service != last_service;
            if first_of_service {
                services += 1;
                last_service = &rs.service;
            }
            if services > SUMMARY_SERVICES {
                continue;
            }
            if first_of_service {
                out += &format!("\n          {} ->", rs.service);
            } else {
                out.push(',');
            }
            out += &format!(" {} {}", rs.server, rs.count.load(Relaxed));
        }
        if services > SUMMARY_SERVICES {
            let more = services - SUMMARY_SERVICES;
            out += &format!("\n          and {more} more service(s): sluicectl -Ln --stats");
        }
        out
    }
}

/// The clients' traffic, derived from `[loopback]` (it has no keys of its own): as many
/// clients as peers, each opening one exchange per service every `ping_interval_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Traffic {
    pub clients: u16,
    /// New exchanges per second and service, at most [`MAX_RATE_PER_SERVICE`].
    pub per_service_per_second: u64,
}

impl Traffic {
    pub fn from_config(cfg: &LoopbackConfig) -> Traffic {
        let per_second = u64::from(cfg.peers) * 1000 / cfg.ping_interval_ms.max(1);
        Traffic {
            clients: cfg.peers,
            per_service_per_second: per_second.clamp(1, MAX_RATE_PER_SERVICE),
        }
    }
}

/// The hash a NIC with several RX queues applies to what it receives: the appliance
/// port's Toeplitz key and redirection table.
#[derive(Clone, Debug)]
pub struct NicRss {
    pub toeplitz: Toeplitz,
    pub reta: Reta,
}

impl NicRss {
    /// The RX queue a NIC puts `frame` on: TCP/UDP by addresses and ports, other IPv4 by
    /// addresses, everything else (ARP) on queue 0. Fragments hash by addresses only.
    pub fn queue(&self, frame: &[u8]) -> u16 {
        if frame.len() < 34 || frame[12..14] != [0x08, 0x00] {
            return 0;
        }
        let ip = &frame[14..];
        let ihl = (ip[0] & 0x0f) as usize * 4;
        let addr = |o: usize| Ipv4Addr::new(ip[o], ip[o + 1], ip[o + 2], ip[o + 3]);
        let (src, dst) = (addr(12), addr(16));
        let fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0;
        let l4 = matches!(ip[9], 6 | 17) && !fragment && ip.len() >= ihl + 4;
        let hash = if l4 {
            let port = |o: usize| u16::from_be_bytes([ip[ihl + o], ip[ihl + o + 1]]);
            self.toeplitz
                .hash_tuple(HashFields::L3L4, src, dst, port(0), port(2))
        } else {
            self.toeplitz.hash_tuple(HashFields::L3, src, dst, 0, 0)
        };
        self.reta.queue(hash)
    }
}

type ServerSideKey = (Ipv4Addr, u16, Ipv4Addr, u16);

/// One emulated neighbour that pings the appliance.
struct Peer {
    mac: [u8; 6],
    ip: Ipv4Addr,
    queue: u16,
    /// The appliance's MAC once ARP resolved it.
    resolved: Option<[u8; 6]>,
    seq: u16,
}

/// Any emulated host: a peer, a client, or a real server that is neither.
#[derive(Clone, Copy, Debug)]
struct Host {
    mac: [u8; 6],
    ip: Ipv4Addr,
    peer: Option<usize>,
    client: Option<usize>,
}

struct Client {
    mac: [u8; 6],
    ip: Ipv4Addr,
    queue: u16,
    /// Per VIP (index into `Run::vips`): the MAC ARP resolved, and when we last asked.
    vip_mac: Vec<Option<[u8; 6]>>,
    asked_tsc: Vec<u64>,
}

/// Where an emulated real server takes requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Endpoint {
    host: usize,
    proto: Protocol,
    mode: ForwardMode,
    /// The address and port packets arrive for: the real server's own for NAT, the
    /// service's VIP and port for DR and TUN.
    ip: Ipv4Addr,
    port: u16,
}

struct Service {
    proto: Protocol,
    vip: Ipv4Addr,
    port: u16,
    /// Index into `Run::vips`.
    vip_index: usize,
    /// (address, port, index into `EmulatorStats::real_servers`) of its real servers.
    real_servers: Vec<(Ipv4Addr, u16, usize)>,
}

pub struct Emulator {
    stats: Arc<EmulatorStats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Emulator {
    /// Starts the emulated hosts on the far port's queue pairs, towards the appliance at
    /// `appliance_mac` / `appliance`, with clients and real servers for `services`.
    /// With `rss`, frames go on the queue that hash selects (see the module docs).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        queues: Vec<(RxQueue, TxQueue)>,
        rss: Option<NicRss>,
        pool: Arc<Mempool>,
        cfg: &LoopbackConfig,
        services: &[ServiceConfig],
        appliance_mac: [u8; 6],
        appliance: Ipv4Cidr,
    ) -> Result<Emulator, String> {
        let queue_count = queues.len().max(1) as u16;
        let traffic = Traffic::from_config(cfg);
        let world = World::build(cfg.peers, traffic.clients, queue_count, appliance, services)?;
        let stats = Arc::new(EmulatorStats {
            real_servers: world.tallies,
            ..EmulatorStats::default()
        });
        let stop = Arc::new(AtomicBool::new(false));
        let hz = tsc_hz().max(1);
        let ticks = |d: Duration| (d.as_nanos() * u128::from(hz) / 1_000_000_000) as u64;
        let rate = if world.clients.is_empty() {
            0
        } else {
            traffic.per_service_per_second * world.services.len() as u64
        };
        let (client_count, service_count) = (world.clients.len(), world.services.len());
        let mut run = Run {
            rss: rss.filter(|_| queues.len() > 1),
            by_isn: HashMap::new(),
            server_side: HashMap::new(),
            server_key: vec![None; TABLE_SIZE],
            out: (0..queues.len()).map(|_| Burst::new()).collect(),
            queues,
            pool,
            peers: world.peers,
            hosts: world.hosts,
            by_mac: world.by_mac,
            by_ip: world.by_ip,
            clients: world.clients,
            endpoints: world.endpoints,
            services: world.services,
            vips: world.vips,
            conns: vec![Conn::default(); TABLE_SIZE].into_boxed_slice(),
            open: 0,
            appliance_mac,
            appliance_ip: appliance.addr,
            interval: Duration::from_millis(cfg.ping_interval_ms),
            garbage_every: cfg.garbage_every,
            stats: stats.clone(),
            stop: stop.clone(),
            frames_sent: 0,
            garbage_kind: 0,
            hz,
            retransmit_ticks: ticks(RETRANSMIT_AFTER),
            timeout_ticks: ticks(EXCHANGE_TIMEOUT),
            rate,
            started_tsc: 0,
            paced: 0,
            cursor: 0,
            next_port: conn::FIRST_PORT,
            token: 0,
            rng: Rng::new(tsc()),
            rounds: 0,
            logged: Vec::new(),
        };
        let thread = spawn_helper(
            std::thread::Builder::new().name("sluice-peers".into()),
            move || {
                if let Err(e) = register_thread() {
                    log::error!("peer emulator: {e}");
                    return;
                }
                run.run();
            },
        )
        .map_err(|e| e.to_string())?;
        log::info!(
            "peer emulator: {} peer(s) at {} +1.. pinging every {} ms; {client_count} client(s) opening {} exchange(s)/s to each of {service_count} service(s)",
            cfg.peers,
            appliance.addr,
            cfg.ping_interval_ms,
            if client_count == 0 { 0 } else { traffic.per_service_per_second },
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

    /// Stops the emulated hosts and returns their final counts.
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

/// The emulated hosts and services, laid out before the thread starts.
struct World {
    peers: Vec<Peer>,
    hosts: Vec<Host>,
    by_mac: HashMap<[u8; 6], usize>,
    by_ip: HashMap<Ipv4Addr, usize>,
    clients: Vec<Client>,
    endpoints: Vec<Endpoint>,
    services: Vec<Service>,
    vips: Vec<Ipv4Addr>,
    tallies: Vec<ServedBy>,
}

/// A locally administered MAC: `prefix`, then a 16-bit index.
fn mac(prefix: [u8; 4], index: usize) -> [u8; 6] {
    let [hi, lo] = (index as u16).to_be_bytes();
    [prefix[0], prefix[1], prefix[2], prefix[3], hi, lo]
}

impl World {
    fn build(
        peer_count: u16,
        client_count: u16,
        queues: u16,
        appliance: Ipv4Cidr,
        services: &[ServiceConfig],
    ) -> Result<World, String> {
        let mut w = World {
            peers: Vec::new(),
            hosts: Vec::new(),
            by_mac: HashMap::new(),
            by_ip: HashMap::new(),
            clients: Vec::new(),
            endpoints: Vec::new(),
            services: Vec::new(),
            vips: Vec::new(),
            tallies: Vec::new(),
        };
        let base = u32::from(appliance.addr);
        for k in 0..peer_count {
            let ip = Ipv4Addr::from(base.wrapping_add(1 + k as u32));
            if !appliance.contains(ip) {
                return Err(format!(
                    "peer {} ({ip}) falls outside {appliance}: use fewer peers or a wider prefix",
                    k + 1
                ));
            }
            // "PEER" and the peer number, as before clients existed.
            let mac = [0x02, 0x50, 0x45, 0x45, 0x52, k as u8 + 1];
            let host = w.add_host(mac, ip);
            w.hosts[host].peer = Some(w.peers.len());
            w.peers.push(Peer {
                mac,
                ip,
                queue: k % queues,
                resolved: None,
                seq: 0,
            });
        }
        if services.is_empty() {
            return Ok(w);
        }
        // Real servers that are not peers become hosts of their own ("RS").
        // The emulator speaks IPv4: IPv6 services and real servers get no hosts.
        for svc in services.iter().filter(|s| !s.key.is_ipv6()) {
            for rs in svc.real_servers.iter().filter(|rs| rs.ip.is_ipv4()) {
                let IpAddr::V4(ip) = rs.ip else { continue };
                if ip != appliance.addr && !w.by_ip.contains_key(&ip) {
                    let n = w.hosts.len();
                    w.add_host(mac([0x02, 0x52, 0x53, 0x00], n), ip);
                }
            }
        }
        // Clients take the next free addresses of the subnet ("CL").
        let taken = |ip: Ipv4Addr, w: &World| {
            ip == appliance.addr
                || w.by_ip.contains_key(&ip)
                || services.iter().any(|s| s.key.vip == ip)
        };
        let mut candidate = base.wrapping_add(1 + peer_count as u32);
        while w.clients.len() < client_count as usize {
            let ip = Ipv4Addr::from(candidate);
            let usable = appliance.prefix_len > 30 || ip != appliance.broadcast();
            if !appliance.contains(ip) || !usable {
                log::warn!(
                    "peer emulator: only {} of {client_count} client(s) fit in {appliance} after the peers",
                    w.clients.len()
                );
                break;
            }
            candidate = candidate.wrapping_add(1);
            if taken(ip, &w) {
                continue;
            }
            let index = w.clients.len();
            let mac = mac([0x02, 0x43, 0x4c, 0x00], index + 1);
            let host = w.add_host(mac, ip);
            w.hosts[host].client = Some(index);
            w.clients.push(Client {
                mac,
                ip,
                queue: index as u16 % queues,
                vip_mac: Vec::new(),
                asked_tsc: Vec::new(),
            });
        }
        for svc in services {
            let Some(vip) = svc.key.vip4() else {
                continue;
            };
            let vip_index = match w.vips.iter().position(|&v| v == vip) {
                Some(i) => i,
                None => {
                    w.vips.push(vip);
                    w.vips.len() - 1
                }
            };
            let mut real_servers = Vec::new();
            for rs in svc.real_servers.iter().filter(|rs| rs.ip.is_ipv4()) {
                let IpAddr::V4(rip) = rs.ip else { continue };
                real_servers.push((rip, rs.port, w.tallies.len()));
                w.tallies.push(ServedBy {
                    service: svc.key.to_string(),
                    server: std::net::SocketAddr::new(rs.ip, rs.port).to_string(),
                    count: AtomicU64::new(0),
                });
                let Some(&host) = w.by_ip.get(&rip) else {
                    continue;
                };
                let (ip, port) = match rs.mode {
                    ForwardMode::Nat | ForwardMode::FullNat => (rip, rs.port),
                    ForwardMode::Dr | ForwardMode::Tun => (vip, svc.key.port),
                };
                let ep = Endpoint {
                    host,
                    proto: svc.key.proto,
                    mode: rs.mode,
                    ip,
                    port,
                };
                if !w.endpoints.contains(&ep) {
                    w.endpoints.push(ep);
                }
            }
            w.services.push(Service {
                proto: svc.key.proto,
                vip,
                port: svc.key.port,
                vip_index,
                real_servers,
            });
        }
        for c in &mut w.clients {
            c.vip_mac = vec![None; w.vips.len()];
            c.asked_tsc = vec![0; w.vips.len()];
        }
        Ok(w)
    }

    fn add_host(&mut self, mac: [u8; 6], ip: Ipv4Addr) -> usize {
        let i = self.hosts.len();
        self.hosts.push(Host {
            mac,
            ip,
            peer: None,
            client: None,
        });
        self.by_mac.insert(mac, i);
        self.by_ip.insert(ip, i);
        i
    }
}

/// Where a frame came from: the ring (the appliance sent it), or an emulated real
/// server replying directly to a client (DR, TUN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Ring,
    Direct { host: usize },
}

/// The emulator thread's state.
struct Run {
    queues: Vec<(RxQueue, TxQueue)>,
    /// The NIC hash to emulate; None with one queue.
    rss: Option<NicRss>,
    /// Open TCP exchanges by the client's initial sequence number (which no mode
    /// rewrites), so a real server can tell which exchange a SYN belongs to.
    by_isn: HashMap<u32, usize>,
    /// The tuple a real server sees (source, source port, its own address and port)
    /// -> exchange slot, learned from the SYN (TCP) or the request (UDP); and per slot
    /// its key, to forget it. FullNAT may use one local port towards several real
    /// servers at once, so the real server's side is part of the key.
    server_side: HashMap<ServerSideKey, usize>,
    server_key: Vec<Option<ServerSideKey>>,
    /// One TX burst per queue, sent when full and after every poll.
    out: Vec<Burst>,
    pool: Arc<Mempool>,
    peers: Vec<Peer>,
    hosts: Vec<Host>,
    by_mac: HashMap<[u8; 6], usize>,
    by_ip: HashMap<Ipv4Addr, usize>,
    clients: Vec<Client>,
    endpoints: Vec<Endpoint>,
    services: Vec<Service>,
    vips: Vec<Ipv4Addr>,
    /// The client exchanges, slot = client port % TABLE_SIZE.
    conns: Box<[Conn]>,
    /// Slots not free.
    open: usize,
    appliance_mac: [u8; 6],
    appliance_ip: Ipv4Addr,
    interval: Duration,
    garbage_every: u32,
    stats: Arc<EmulatorStats>,
    stop: Arc<AtomicBool>,
    frames_sent: u64,
    garbage_kind: usize,
    hz: u64,
    retransmit_ticks: u64,
    timeout_ticks: u64,
    /// New exchanges per second over all services.
    rate: u64,
    started_tsc: u64,
    /// Exchanges due so far by the rate (opened or skipped).
    paced: u64,
    /// Round robin over (service, client).
    cursor: u64,
    next_port: u16,
    token: u32,
    rng: Rng,
    rounds: u64,
    /// Kinds of bad frame already logged (each kind is logged once).
    logged: Vec<&'static str>,
}

impl Run {
    fn run(&mut self) {
        let ns_per_tick = 1e9 / self.hz as f64;
        let mut next_round = Instant::now();
        self.started_tsc = tsc();
        let timer_ticks = self.hz / 1000 * TIMER_PERIOD.as_millis() as u64;
        let mut next_timers = self.started_tsc;
        let mut rx = Burst::new();
        while !self.stop.load(Relaxed) {
            if Instant::now() >= next_round {
                next_round += self.interval;
                for p in 0..self.peers.len() {
                    self.round_for_peer(p);
                }
                self.refresh_vips();
                self.rounds += 1;
            }
            let now = tsc();
            self.open_due(now);
            if now >= next_timers {
                next_timers = now + timer_ticks;
                self.timers(now);
            }
            for q in 0..self.queues.len() {
                while self.queues[q].0.rx(&mut rx) > 0 {
                    for i in 0..rx.len() {
                        self.receive(q, rx.packet(i), ns_per_tick);
                    }
                    rx.free_all();
                }
            }
            self.flush();
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    // --- sending ---------------------------------------------------------------------

    /// Appends one frame written by `build` to queue `q`'s TX burst; then, when one is
    /// due, a malformed frame from a peer.
    fn emit(&mut self, q: usize, build: impl FnOnce(&mut [u8]) -> usize) -> bool {
        if !self.push(q, build) {
            return false;
        }
        self.frames_sent += 1;
        let every = u64::from(self.garbage_every);
        if every > 0 && (self.frames_sent + 1).is_multiple_of(every) && !self.peers.is_empty() {
            let kind = Garbage::ALL[self.garbage_kind % Garbage::ALL.len()];
            let peer = &self.peers[self.garbage_kind % self.peers.len()];
            self.garbage_kind += 1;
            let (mac, ip, amac, aip) = (peer.mac, peer.ip, self.appliance_mac, self.appliance_ip);
            if self.push(q, |buf| frames::garbage(buf, kind, mac, amac, ip, aip)) {
                self.frames_sent += 1;
                self.stats.garbage_sent.fetch_add(1, Relaxed);
            }
        }
        true
    }

    fn push(&mut self, q: usize, build: impl FnOnce(&mut [u8]) -> usize) -> bool {
        let mut frame = [0u8; frames::MAX_FRAME];
        let len = build(&mut frame);
        let q = match &self.rss {
            Some(rss) => rss.queue(&frame[..len]) as usize,
            None => q,
        };
        if self.out[q].is_full() {
            self.flush_queue(q);
        }
        let out = &mut self.out[q];
        if out.is_full() || !out.alloc_from(&self.pool, 1) {
            self.stats.send_failures.fetch_add(1, Relaxed);
            return false;
        }
        let i = out.len() - 1;
        out.set_packet_len(i, len as u16);
        out.packet_mut(i).copy_from_slice(&frame[..len]);
        true
    }

    fn flush_queue(&mut self, q: usize) {
        let n = self.out[q].len();
        if n == 0 {
            return;
        }
        let sent = self.queues[q].1.tx(&mut self.out[q]);
        if sent < n {
            self.stats
                .send_failures
                .fetch_add((n - sent) as u64, Relaxed);
            self.out[q].free_all();
        }
    }

    fn flush(&mut self) {
        for q in 0..self.out.len() {
            self.flush_queue(q);
        }
    }

    /// One round of peer `p`: ARP until resolved (and every 16th round after, as a
    /// neighbour refreshes its cache), then an echo request.
    fn round_for_peer(&mut self, p: usize) {
        let seq = self.peers[p].seq;
        self.peers[p].seq = seq.wrapping_add(1);
        let peer = &self.peers[p];
        let (mac, ip, q) = (peer.mac, peer.ip, peer.queue as usize);
        if peer.resolved.is_none() || seq.is_multiple_of(16) {
            let target = self.appliance_ip;
            if self.emit(q, |buf| frames::arp_request(buf, mac, ip, target)) {
                self.stats.arp_requests.fetch_add(1, Relaxed);
            }
        }
        if let Some(dst_mac) = self.peers[p].resolved {
            let (dst_ip, id, stamp) = (self.appliance_ip, p as u16 + 1, tsc());
            if self.emit(q, |buf| {
                frames::echo_request(buf, mac, dst_mac, ip, dst_ip, id, seq, stamp)
            }) {
                self.stats.echo_requests.fetch_add(1, Relaxed);
            }
        }
    }

    /// Every 16th round the clients ask for every VIP's MAC again.
    fn refresh_vips(&mut self) {
        if !self.rounds.is_multiple_of(16) {
            return;
        }
        let now = tsc();
        for c in 0..self.clients.len() {
            for v in 0..self.vips.len() {
                self.ask_vip(c, v, now);
            }
        }
    }

    fn ask_vip(&mut self, c: usize, v: usize, now: u64) {
        let client = &self.clients[c];
        let (mac, ip, q, vip) = (client.mac, client.ip, client.queue as usize, self.vips[v]);
        self.clients[c].asked_tsc[v] = now;
        if self.emit(q, |buf| frames::arp_request(buf, mac, ip, vip)) {
            self.stats.arp_requests.fetch_add(1, Relaxed);
        }
    }

    // --- client exchanges ------------------------------------------------------------

    /// Opens the exchanges the rate says are due by `now`.
    fn open_due(&mut self, now: u64) {
        if self.rate == 0 {
            return;
        }
        let elapsed = now.saturating_sub(self.started_tsc);
        let due = (u128::from(elapsed) * u128::from(self.rate) / u128::from(self.hz)) as u64;
        let mut n = due.saturating_sub(self.paced);
        if n > MAX_OPENS_PER_POLL {
            // Late (the thread did not run): skip the backlog rather than burst.
            n = MAX_OPENS_PER_POLL;
            self.paced = due - n;
        }
        self.paced += n;
        for _ in 0..n {
            self.open_one(now);
        }
    }

    fn open_one(&mut self, now: u64) {
        let services = self.services.len() as u64;
        let service = (self.cursor % services) as usize;
        let client = ((self.cursor / services) % self.clients.len() as u64) as usize;
        self.cursor += 1;
        let mut slot = None;
        for _ in 0..8 {
            let port = self.next_port;
            self.next_port = port.checked_add(1).unwrap_or(conn::FIRST_PORT);
            let s = port as usize % TABLE_SIZE;
            if self.conns[s].stage == Stage::Free {
                slot = Some((s, port));
                break;
            }
        }
        let Some((slot, port)) = slot else {
            self.stats.table_full.fetch_add(1, Relaxed);
            return;
        };
        let svc = &self.services[service];
        let udp = svc.proto == Protocol::Udp;
        // The queue the client's packets land on: the owner worker's.
        let queue = match &self.rss {
            Some(rss) => rss.reta.queue(rss.toeplitz.hash_tuple(
                HashFields::L3L4,
                self.clients[client].ip,
                svc.vip,
                port,
                svc.port,
            )),
            None => (slot % self.queues.len().max(1)) as u16,
        };
        self.token = self.token.wrapping_add(1);
        let isn = self.rng.next_u64() as u32;
        self.conns[slot] = Conn {
            stage: Stage::Resolving,
            udp,
            client: client as u16,
            service: service as u16,
            queue,
            port,
            token: self.token,
            iss: isn,
            opened_tsc: now,
            ..Conn::default()
        };
        self.open += 1;
        if !udp {
            self.by_isn.insert(isn, slot);
        }
        let counter = if udp {
            &self.stats.udp_requests
        } else {
            &self.stats.tcp_opened
        };
        counter.fetch_add(1, Relaxed);
        self.kick(slot, now);
    }

    /// A resolving exchange: starts it once the client knows the VIP's MAC, else asks
    /// (at most once per retransmission interval and VIP).
    fn kick(&mut self, slot: usize, now: u64) {
        let c = self.conns[slot];
        let v = self.services[c.service as usize].vip_index;
        let client = &self.clients[c.client as usize];
        if client.vip_mac[v].is_some() {
            if let Some(out) = self.conns[slot].start() {
                self.send(slot, out);
            }
            self.conns[slot].sent_tsc = now;
        } else if now.saturating_sub(client.asked_tsc[v]) >= self.retransmit_ticks {
            self.ask_vip(c.client as usize, v, now);
        }
    }

    /// Sends `out` for the exchange in `slot`.
    fn send(&mut self, slot: usize, out: Out) {
        let c = self.conns[slot];
        let svc = &self.services[c.service as usize];
        let client = &self.clients[c.client as usize];
        let Some(vip_mac) = client.vip_mac[svc.vip_index] else {
            return;
        };
        let e = Endpoints {
            src_mac: client.mac,
            dst_mac: vip_mac,
            src: client.ip,
            dst: svc.vip,
            sport: c.port,
            dport: svc.port,
        };
        let request = conn::request(c.token, client.ip, c.port);
        let payload: &[u8] = if out.request { &request } else { &[] };
        let q = c.queue as usize;
        if c.udp {
            self.emit(q, |buf| frames::udp_datagram(buf, &e, payload));
        } else {
            self.emit(q, |buf| {
                frames::tcp_segment(buf, &e, out.seq, out.ack, out.flags, payload)
            });
        }
    }

    /// Retransmissions, resolutions and timeouts.
    fn timers(&mut self, now: u64) {
        if self.open == 0 {
            return;
        }
        for slot in 0..TABLE_SIZE {
            let c = self.conns[slot];
            match c.stage {
                Stage::Free => continue,
                _ if now.saturating_sub(c.opened_tsc) >= self.timeout_ticks => {
                    self.note_once(match c.stage {
                        Stage::Resolving => "exchange timed out: the VIP's MAC never resolved",
                        Stage::SynSent => "connection timed out waiting for the SYN-ACK",
                        Stage::RequestSent => "connection timed out waiting for the response",
                        Stage::FinSent => "connection timed out waiting for the FIN-ACK",
                        _ => "UDP request timed out waiting for the response",
                    });
                    self.fail(slot);
                }
                Stage::Resolving => self.kick(slot, now),
                _ if now.saturating_sub(c.sent_tsc) >= self.retransmit_ticks => {
                    if let Some(out) = c.pending() {
                        self.stats.retransmits.fetch_add(1, Relaxed);
                        self.send(slot, out);
                    }
                    self.conns[slot].sent_tsc = now;
                }
                _ => {}
            }
        }
    }

    fn fail(&mut self, slot: usize) {
        let counter = if self.conns[slot].udp {
            &self.stats.udp_failed
        } else {
            &self.stats.tcp_failed
        };
        counter.fetch_add(1, Relaxed);
        self.free(slot);
    }

    fn free(&mut self, slot: usize) {
        if !self.conns[slot].udp {
            self.by_isn.remove(&self.conns[slot].iss);
        }
        if let Some(key) = self.server_key[slot].take() {
            self.server_side.remove(&key);
        }
        self.conns[slot] = Conn::default();
        self.open -= 1;
    }

    // --- receiving -------------------------------------------------------------------

    /// Counts a wrong frame and logs the first of each kind.
    fn bad(&mut self, why: &'static str) {
        self.stats.bad_replies.fetch_add(1, Relaxed);
        if !self.logged.contains(&why) {
            self.logged.push(why);
            log::warn!("peer emulator: bad frame from the appliance: {why} (logged once)");
        }
    }

    fn note_once(&mut self, what: &'static str) {
        if !self.logged.contains(&what) {
            self.logged.push(what);
            log::warn!("peer emulator: {what} (logged once)");
        }
    }

    fn unexpected(&self) {
        self.stats.unexpected.fetch_add(1, Relaxed);
    }

    /// A frame the appliance sent on queue `q`.
    fn receive(&mut self, q: usize, f: &[u8], ns_per_tick: f64) {
        if f.len() >= 12 && f[6..12] != self.appliance_mac {
            return self.bad("source MAC is not the appliance's");
        }
        match frames::parse(f) {
            Frame::Arp(a) => self.on_arp(q, &a),
            Frame::Echo {
                dst_mac,
                src,
                dst_ip,
                id,
                stamp,
            } => {
                let ok = self
                    .peers
                    .get((id as usize).wrapping_sub(1))
                    .is_some_and(|p| p.mac == dst_mac && p.ip == dst_ip);
                if src != self.appliance_ip {
                    self.bad("echo reply not from the appliance's address");
                } else if !ok {
                    self.bad("echo reply to the wrong peer");
                } else {
                    let rtt = (tsc().wrapping_sub(stamp) as f64 * ns_per_tick) as u64;
                    self.stats.echo_replies.fetch_add(1, Relaxed);
                    self.stats.rtt_sum_ns.fetch_add(rtt, Relaxed);
                    self.stats.rtt_max_ns.fetch_max(rtt, Relaxed);
                }
            }
            Frame::Tcp(s) => self.on_segment(q, Protocol::Tcp, &s),
            Frame::Udp(s) => self.on_segment(q, Protocol::Udp, &s),
            Frame::Ipip {
                dst_mac,
                src_mac,
                outer_src,
                outer_dst,
                inner,
            } => self.on_tunnelled(q, dst_mac, src_mac, outer_src, outer_dst, inner),
            Frame::Bad(why) => self.bad(why),
            Frame::Other => self.unexpected(),
        }
    }

    fn on_arp(&mut self, q: usize, a: &Arp) {
        if a.sender_mac != self.appliance_mac {
            return self.bad("ARP sender MAC is not the appliance's");
        }
        if a.operation == 1 {
            if a.sender_ip != self.appliance_ip {
                return self
                    .bad("ARP request from the appliance with a sender address not its own");
            }
            if a.eth_dst != [0xff; 6] && !self.by_mac.contains_key(&a.eth_dst) {
                return self.bad("ARP request neither broadcast nor to an emulated host");
            }
            let Some(&h) = self.by_ip.get(&a.target_ip) else {
                return self.unexpected();
            };
            let (mac, ip, amac, aip) = (
                self.hosts[h].mac,
                self.hosts[h].ip,
                self.appliance_mac,
                self.appliance_ip,
            );
            if self.emit(q, |buf| frames::arp_reply(buf, mac, ip, amac, aip)) {
                self.stats.arp_answered.fetch_add(1, Relaxed);
            }
            return;
        }
        let host = self
            .by_mac
            .get(&a.target_mac)
            .copied()
            .filter(|&h| self.hosts[h].ip == a.target_ip);
        let Some(h) = host else {
            return self.bad("ARP reply to a MAC and address no emulated host has");
        };
        if a.eth_dst != a.target_mac {
            return self.bad("ARP reply not sent to the requester's MAC");
        }
        let host = self.hosts[h];
        if a.sender_ip == self.appliance_ip {
            match host.peer {
                Some(p) => {
                    self.peers[p].resolved = Some(a.sender_mac);
                    self.stats.arp_replies.fetch_add(1, Relaxed);
                }
                None => self.unexpected(),
            }
        } else if let Some(v) = self.vips.iter().position(|&v| v == a.sender_ip) {
            match host.client {
                Some(c) => {
                    self.clients[c].vip_mac[v] = Some(a.sender_mac);
                    self.stats.arp_replies.fetch_add(1, Relaxed);
                }
                None => self.unexpected(),
            }
        } else {
            self.bad("ARP reply for an address that is neither the appliance's nor a VIP");
        }
    }

    /// A TCP segment or UDP datagram from the ring: for a real server, or a reply to a
    /// client.
    fn on_segment(&mut self, q: usize, proto: Protocol, s: &Segment) {
        let Some(&h) = self.by_mac.get(&s.e.dst_mac) else {
            return self.bad("packet to a MAC no emulated host has");
        };
        // The appliance's own address sends TCP only as a health probe (clients' packets
        // keep the client's address, FullNAT's leave from local addresses, which are
        // never a port's address).
        if proto == Protocol::Tcp && s.e.src == self.appliance_ip {
            return self.answer_probe(q, h, s);
        }
        let ep = self.endpoints.iter().position(|e| {
            e.host == h
                && e.proto == proto
                && e.ip == s.e.dst
                && e.port == s.e.dport
                && matches!(
                    e.mode,
                    ForwardMode::Nat | ForwardMode::FullNat | ForwardMode::Dr
                )
        });
        if let Some(ep) = ep {
            return self.serve(q, ep, proto, s);
        }
        match self.hosts[h].client {
            Some(c) => self.client_reply(c, proto, s, Via::Ring),
            None => self.bad("packet for an address and port no emulated real server serves"),
        }
    }

    /// Host `h` answers a health probe's segment `s` if one of its real servers listens
    /// on the port (in any mode: the probe goes to the server's own address), else
    /// resets it as a kernel with the port closed would.
    fn answer_probe(&mut self, q: usize, h: usize, s: &Segment) {
        let me = self.hosts[h];
        if me.ip != s.e.dst {
            return self.bad("health probe to an address its MAC's host does not have");
        }
        let listens = self
            .endpoints
            .iter()
            .any(|e| e.host == h && e.proto == Protocol::Tcp && e.port == s.e.dport);
        let answer = if listens {
            conn::serve_probe(s)
        } else if s.flags & frames::tcp_flags::RST == 0 {
            // RFC 9293 3.10.7.1: a segment with ACK gets a bare reset at its ack; one
            // without (the SYN) a reset acknowledging it.
            Some(if s.flags & frames::tcp_flags::ACK != 0 {
                conn::Answer {
                    seq: s.ack,
                    ack: 0,
                    flags: frames::tcp_flags::RST,
                    response: None,
                }
            } else {
                conn::Answer {
                    seq: 0,
                    ack: s.seq.wrapping_add(1),
                    flags: frames::tcp_flags::RST | frames::tcp_flags::ACK,
                    response: None,
                }
            })
        } else {
            None
        };
        let Some(a) = answer else {
            return;
        };
        let e = Endpoints {
            src_mac: me.mac,
            dst_mac: self.appliance_mac,
            src: s.e.dst,
            dst: s.e.src,
            sport: s.e.dport,
            dport: s.e.sport,
        };
        let payload: &[u8] = if a.flags & frames::tcp_flags::FIN != 0 {
            conn::PROBE_RESPONSE
        } else {
            &[]
        };
        let sent = self.emit(q, |buf| {
            frames::tcp_segment(buf, &e, a.seq, a.ack, a.flags, payload)
        });
        if sent && listens {
            self.stats.probes_answered.fetch_add(1, Relaxed);
        }
    }

    /// An IP-in-IP packet: for a real server in TUN mode.
    fn on_tunnelled(
        &mut self,
        q: usize,
        dst_mac: [u8; 6],
        src_mac: [u8; 6],
        outer_src: Ipv4Addr,
        outer_dst: Ipv4Addr,
        inner: &[u8],
    ) {
        if outer_src != self.appliance_ip {
            return self.bad("tunnelled packet whose outer source is not the appliance");
        }
        let host = self
            .by_mac
            .get(&dst_mac)
            .copied()
            .filter(|&h| self.hosts[h].ip == outer_dst);
        let Some(h) = host else {
            return self.bad("tunnelled packet to a MAC and address no emulated host has");
        };
        let (proto, s) = match frames::parse_ipv4(dst_mac, src_mac, inner) {
            Frame::Tcp(s) => (Protocol::Tcp, s),
            Frame::Udp(s) => (Protocol::Udp, s),
            Frame::Bad(why) => return self.bad(why),
            _ => return self.bad("tunnelled packet that is neither TCP nor UDP"),
        };
        let ep = self.endpoints.iter().position(|e| {
            e.host == h
                && e.proto == proto
                && e.ip == s.e.dst
                && e.port == s.e.dport
                && e.mode == ForwardMode::Tun
        });
        match ep {
            Some(ep) => self.serve(q, ep, proto, &s),
            None => self.bad("tunnelled packet for no TUN service of this host"),
        }
    }

    /// A real server answers `s`: through the appliance for NAT and FullNAT, straight
    /// to the client for DR and TUN.
    fn serve(&mut self, q: usize, ep: usize, proto: Protocol, s: &Segment) {
        let ep = self.endpoints[ep];
        let me = self.hosts[ep.host];
        let via_appliance = matches!(ep.mode, ForwardMode::Nat | ForwardMode::FullNat);
        // FullNAT: the real server sees one of the appliance's local addresses.
        let sees_client = ep.mode != ForwardMode::FullNat;
        let client = self.by_ip.get(&s.e.src).and_then(|&h| self.hosts[h].client);
        let c = match client {
            Some(c) => c,
            None if !sees_client => usize::MAX,
            None => {
                return self.bad("packet for a real server from an address no emulated client has")
            }
        };
        if !sees_client && client.is_some() {
            return self.bad("FullNAT real server sees a client's own address (no source NAT)");
        }
        let dst_mac = if via_appliance {
            self.appliance_mac
        } else {
            self.clients[c].mac
        };
        let e = Endpoints {
            src_mac: me.mac,
            dst_mac,
            src: s.e.dst,
            dst: s.e.src,
            sport: s.e.dport,
            dport: s.e.sport,
        };
        let mut frame = [0u8; frames::MAX_FRAME];
        let len = match proto {
            Protocol::Tcp => match conn::serve_tcp(s, me.ip, sees_client) {
                Ok(Some(a)) => {
                    let payload: &[u8] = match &a.response {
                        Some(r) => r,
                        None => &[],
                    };
                    frames::tcp_segment(&mut frame, &e, a.seq, a.ack, a.flags, payload)
                }
                Ok(None) => return,
                Err(why) => return self.bad(why),
            },
            Protocol::Udp => match conn::serve_udp(s, me.ip, sees_client) {
                Ok(r) => frames::udp_datagram(&mut frame, &e, &r),
                Err(why) => return self.bad(why),
            },
        };
        if via_appliance {
            let off_owner = self.reply_off_owner(proto, s, &frame[..len]);
            let sent = self.emit(q, |buf| {
                buf[..len].copy_from_slice(&frame[..len]);
                len
            });
            if let (true, Some(off)) = (sent, off_owner) {
                self.stats.replies_via_appliance.fetch_add(1, Relaxed);
                if off {
                    self.stats.replies_off_owner.fetch_add(1, Relaxed);
                }
            }
        } else {
            // The client reads the very bytes a switch would have carried.
            match frames::parse(&frame[..len]) {
                Frame::Tcp(r) => {
                    self.client_reply(c, Protocol::Tcp, &r, Via::Direct { host: ep.host })
                }
                Frame::Udp(r) => {
                    self.client_reply(c, Protocol::Udp, &r, Via::Direct { host: ep.host })
                }
                _ => unreachable!("the emulator's own frame does not parse"),
            }
        }
    }

    /// RSS emulation: whether the NIC hash puts a real server's `reply` to `s` on
    /// another queue than its connection's client packets (the owner worker's); None
    /// without RSS or when the connection is unknown. The connection is found by the
    /// client's initial sequence number on a SYN (no mode rewrites it), by the
    /// request's payload for UDP, then by the source the real server sees.
    fn reply_off_owner(&mut self, proto: Protocol, s: &Segment, reply: &[u8]) -> Option<bool> {
        let rss = self.rss.as_ref()?;
        let key = (s.e.src, s.e.sport, s.e.dst, s.e.dport);
        let learned = match proto {
            Protocol::Tcp if s.flags == frames::tcp_flags::SYN => self.by_isn.get(&s.seq).copied(),
            Protocol::Udp => conn::read_request(s.payload)
                .map(|(_, _, port)| (port, port as usize % TABLE_SIZE))
                .filter(|&(port, slot)| {
                    self.conns[slot].stage != Stage::Free && self.conns[slot].port == port
                })
                .map(|(_, slot)| slot),
            Protocol::Tcp => None,
        };
        if let Some(slot) = learned {
            if let Some(old) = self.server_key[slot].replace(key) {
                self.server_side.remove(&old);
            }
            self.server_side.insert(key, slot);
        }
        let slot = *self.server_side.get(&key)?;
        Some(rss.queue(reply) != self.conns[slot].queue)
    }

    /// A reply for client `c`.
    fn client_reply(&mut self, c: usize, proto: Protocol, s: &Segment, via: Via) {
        if s.e.dst != self.clients[c].ip {
            return self.bad("packet to a client's MAC but another address");
        }
        let slot = s.e.dport as usize % TABLE_SIZE;
        let conn = self.conns[slot];
        if conn.stage == Stage::Free || conn.client as usize != c || conn.port != s.e.dport {
            // A late copy for an exchange already over (or never ours).
            return self.unexpected();
        }
        let svc = &self.services[conn.service as usize];
        if proto != svc.proto {
            return self.bad("reply of the wrong protocol");
        }
        if s.e.src != svc.vip || s.e.sport != svc.port {
            return self.bad("reply not from the service's VIP and port");
        }
        if let Via::Direct { host } = via {
            let direct = self.endpoints.iter().any(|e| {
                e.host == host
                    && e.proto == proto
                    && e.ip == svc.vip
                    && e.port == svc.port
                    && matches!(e.mode, ForwardMode::Dr | ForwardMode::Tun)
            });
            if !direct {
                return self
                    .bad("direct reply from a host that is no DR/TUN real server of the service");
            }
        }
        let step = self.conns[slot].on_reply(s);
        let now = tsc();
        match step {
            Err(why) => {
                self.bad(why);
                self.fail(slot);
            }
            Ok(Step::Duplicate) => {
                self.stats.duplicates.fetch_add(1, Relaxed);
            }
            Ok(Step::Send(outs)) => {
                for out in outs.into_iter().flatten() {
                    self.send(slot, out);
                }
                self.conns[slot].sent_tsc = now;
            }
            Ok(Step::Done { last, server }) => {
                if let Some(out) = last {
                    self.send(slot, out);
                }
                let svc = &self.services[conn.service as usize];
                let Some(&(_, _, tally)) = svc
                    .real_servers
                    .iter()
                    .find(|&&(ip, port, _)| (ip, port) == server)
                else {
                    self.bad("response names a server that is not a real server of the service");
                    return self.fail(slot);
                };
                self.stats.real_servers[tally].count.fetch_add(1, Relaxed);
                if conn.udp {
                    self.stats.udp_round_trips.fetch_add(1, Relaxed);
                } else {
                    let ns = (now.wrapping_sub(conn.opened_tsc) as u128 * 1_000_000_000
                        / u128::from(self.hz)) as u64;
                    self.stats.tcp_completed.fetch_add(1, Relaxed);
                    self.stats.tcp_time_sum_ns.fetch_add(ns, Relaxed);
                    self.stats.tcp_time_max_ns.fetch_max(ns, Relaxed);
                }
                self.free(slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RealServerConfig;
    use crate::model::SchedulerKind;
    use crate::model::ServiceKey;

    fn service(
        proto: Protocol,
        vip: [u8; 4],
        port: u16,
        rs: &[([u8; 4], u16, ForwardMode)],
    ) -> ServiceConfig {
        ServiceConfig {
            key: ServiceKey::new(proto, std::net::Ipv4Addr::from(vip), port),
            scheduler: SchedulerKind::Rr,
            persistence: None,
            real_servers: rs
                .iter()
                .map(|&(ip, port, mode)| RealServerConfig {
                    ip: ip.into(),
                    port,
                    weight: 1,
                    mode,
                    health: Default::default(),
                    upper: 0,
                    lower: 0,
                })
                .collect(),
            local_addresses: Vec::new(),
            sched_flags: Default::default(),
            mh_table_size: None,
            toa: false,
            sloppy_tcp: false,
            synproxy: crate::model::SynProxy::default(),
            health: Default::default(),
            all_down: None,
            acl: Vec::new(),
            rate_limit: None,
            sorry_server: None,
            line: 1,
        }
    }

    fn cidr() -> Ipv4Cidr {
        Ipv4Cidr {
            addr: [198, 18, 0, 1].into(),
            prefix_len: 24,
        }
    }

    #[test]
    fn hosts_clients_and_endpoints_are_laid_out_from_the_config() {
        let services = [
            service(
                Protocol::Tcp,
                [198, 18, 1, 1],
                80,
                &[
                    ([198, 18, 0, 2], 8080, ForwardMode::Nat),
                    ([198, 18, 0, 3], 8080, ForwardMode::Nat),
                ],
            ),
            service(
                Protocol::Tcp,
                [198, 18, 1, 2],
                80,
                &[([198, 18, 0, 20], 80, ForwardMode::Dr)],
            ),
        ];
        let w = World::build(4, 4, 1, cidr(), &services).unwrap();
        assert_eq!(w.peers.len(), 4);
        // .20 is not a peer: it gets a host of its own; clients follow the peers.
        let ips: Vec<Ipv4Addr> = w.hosts.iter().map(|h| h.ip).collect();
        assert!(ips.contains(&Ipv4Addr::new(198, 18, 0, 20)));
        let clients: Vec<Ipv4Addr> = w.clients.iter().map(|c| c.ip).collect();
        assert_eq!(
            clients,
            (6..=9)
                .map(|d| Ipv4Addr::new(198, 18, 0, d))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            w.vips,
            vec![Ipv4Addr::new(198, 18, 1, 1), Ipv4Addr::new(198, 18, 1, 2)]
        );
        assert_eq!(w.endpoints.len(), 3);
        let dr = w
            .endpoints
            .iter()
            .find(|e| e.mode == ForwardMode::Dr)
            .unwrap();
        assert_eq!((dr.ip, dr.port), (Ipv4Addr::new(198, 18, 1, 2), 80));
        assert_eq!(w.tallies.len(), 3);
        assert_eq!(w.tallies[0].service, "TCP 198.18.1.1:80");
        assert_eq!(w.tallies[1].server, "198.18.0.3:8080");
        // MACs are unique.
        assert_eq!(w.by_mac.len(), w.hosts.len());
        assert_eq!(w.clients[0].vip_mac.len(), 2);
    }

    #[test]
    fn clients_skip_taken_addresses_and_stop_at_the_subnet_edge() {
        let services = [service(
            Protocol::Udp,
            [198, 18, 0, 4],
            53,
            &[([198, 18, 0, 3], 53, ForwardMode::Nat)],
        )];
        let small = Ipv4Cidr {
            addr: [198, 18, 0, 1].into(),
            prefix_len: 29,
        };
        // Peer .2; .3 is a real server, .4 the VIP; clients .5 and .6; .7 is broadcast.
        let w = World::build(1, 4, 1, small, &services).unwrap();
        let clients: Vec<Ipv4Addr> = w.clients.iter().map(|c| c.ip).collect();
        assert_eq!(
            clients,
            vec![Ipv4Addr::new(198, 18, 0, 5), Ipv4Addr::new(198, 18, 0, 6)]
        );
        // No services: no clients, as before.
        let w = World::build(2, 4, 1, cidr(), &[]).unwrap();
        assert!(w.clients.is_empty());
    }

    #[test]
    fn the_rate_follows_peers_and_ping_interval() {
        let cfg = LoopbackConfig::default();
        assert_eq!(
            Traffic::from_config(&cfg),
            Traffic {
                clients: 4,
                per_service_per_second: 40
            }
        );
        let fast = LoopbackConfig {
            peers: 250,
            ping_interval_ms: 1,
            ..LoopbackConfig::default()
        };
        assert_eq!(
            Traffic::from_config(&fast).per_service_per_second,
            MAX_RATE_PER_SERVICE
        );
    }

    #[test]
    fn summary_lists_the_spread() {
        let stats = EmulatorStats {
            real_servers: vec![
                ServedBy {
                    service: "TCP 198.18.1.1:80".into(),
                    server: "198.18.0.2:8080".into(),
                    count: AtomicU64::new(5),
                },
                ServedBy {
                    service: "TCP 198.18.1.1:80".into(),
                    server: "198.18.0.3:8080".into(),
                    count: AtomicU64::new(6),
                },
            ],
            ..EmulatorStats::default()
        };
        stats.tcp_opened.store(12, Relaxed);
        stats.tcp_completed.store(11, Relaxed);
        let s = stats.summary();
        assert!(s.contains("bad 0 "), "{s}");
        assert!(
            s.contains("tcp opened 12 completed 11 failed 0 in flight 1"),
            "{s}"
        );
        assert!(
            s.contains("TCP 198.18.1.1:80 -> 198.18.0.2:8080 5, 198.18.0.3:8080 6"),
            "{s}"
        );
        assert_eq!(EmulatorStats::default().summary().lines().count(), 1);
    }

    #[test]
    fn summary_lists_the_first_services_then_how_many_more() {
        let served = |service: usize, server: usize| ServedBy {
            service: format!("TCP 198.18.1.{service}:80"),
            server: format!("198.18.0.{server}:8080"),
            count: AtomicU64::new(1),
        };
        let mut stats = EmulatorStats::default();
        for service in 0..SUMMARY_SERVICES + 8 {
            stats
                .real_servers
                .extend([served(service, 2), served(service, 3)]);
        }
        let s = stats.summary();
        let spread: Vec<&str> = s.lines().filter(|l| l.contains(" -> ")).collect();
        assert_eq!(spread.len(), SUMMARY_SERVICES, "{s}");
        let last = format!("TCP 198.18.1.{}:80 ->", SUMMARY_SERVICES - 1);
        assert!(spread[SUMMARY_SERVICES - 1].contains(&last), "{s}");
        assert!(
            spread.iter().all(|l| l.ends_with("198.18.0.3:8080 1")),
            "{s}"
        );
        assert!(
            s.ends_with("and 8 more service(s): sluicectl -Ln --stats"),
            "{s}"
        );
        stats.real_servers.truncate(2 * SUMMARY_SERVICES);
        assert!(!stats.summary().contains("more service"));
    }
}
