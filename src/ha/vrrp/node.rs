//! VRRPv3 on the management core: the state machine of `crate::ha::vrrp::router` fed with
//! the advertisements the workers hand up and with time, its actions turned into
//! frames that worker 0 transmits: advertisements (to 224.0.0.18 or, with `[vrrp]
//! unicast`, to each peer), a gratuitous ARP for every IPv4 virtual address and an
//! unsolicited Neighbor Advertisement for every IPv6 one. While backup, the snapshots say the VIPs are not ours:
//! the workers stop answering ARP and ping for them, so traffic goes to the master.
use crate::ha::vrrp::auth::{AdvertAuth, Refusal};
use crate::ha::vrrp::router::{Actions, Advert, Event, Router, State, VrrpConfig, RESIGN_PRIORITY};
use crate::wire::ethernet::{self, EtherType, MacAddr};
use crate::wire::{icmpv6, ipv4, vrrp};
use std::net::{Ipv4Addr, Ipv6Addr};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VrrpStats {
    /// Frames: with `[vrrp] unicast`, one per peer per advertisement.
    pub adverts_sent: u64,
    pub adverts_received: u64,
    /// Not for our VRID, wrong TTL, bad checksum or version, truncated, or from this
    /// node's own address.
    pub adverts_rejected: u64,
    /// With `[vrrp] key`: no trailer (with `accept_unsealed`, from a peer heard sealed
    /// within a master-down interval) or a wrong tag. Without: a trailer (the peers'
    /// configs disagree).
    #[serde(default)]
    pub adverts_bad_auth: u64,
    /// Authenticated, but not above the sender's last counter: sent before.
    #[serde(default)]
    pub adverts_replayed: u64,
    /// Authenticated, and its counter more than `[vrrp] max_clock_skew_ms` ahead of this
    /// node's clock, or behind it for the sender's first advert since this node started.
    #[serde(default)]
    pub adverts_clock_skew: u64,
    /// With `[vrrp] key` and `accept_unsealed = true`: taken without a trailer (also
    /// in `adverts_received`).
    #[serde(default)]
    pub adverts_unsealed: u64,
    pub gratuitous_arps_sent: u64,
    /// Unsolicited Neighbor Advertisements, one per IPv6 address taken over and one
    /// more each 5 s later (a report from a Sluice that predates them reads 0).
    #[serde(default)]
    pub unsolicited_nas_sent: u64,
    pub transitions: u64,
}

/// The addresses VRRP moves between nodes. The IPv4 ones are listed in the
/// advertisements and announced by gratuitous ARP; the IPv6 ones (VRRPv3 over IPv4
/// cannot list them) are announced by unsolicited Neighbor Advertisements.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VirtualAddresses {
    pub v4: Vec<Ipv4Addr>,
    pub v6: Vec<Ipv6Addr>,
}

impl VirtualAddresses {
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `sluicectl vrrp`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VrrpReport {
    pub vrid: u8,
    pub state: String,
    pub priority: u8,
    pub advert_interval_ms: u32,
    pub preempt: bool,
    pub primary: String,
    /// The master we last heard (none while we are master or heard nobody).
    pub master: Option<String>,
    pub master_priority: Option<u8>,
    pub since_change_ms: u64,
    pub stats: VrrpStats,
    /// `[vrrp] peers`: the only senders whose adverts count; empty with `any_peer =
    /// true` (a report from a Sluice that predates peers reads empty too).
    #[serde(default)]
    pub peers: Vec<String>,
    /// `[vrrp] unicast`: adverts go to each peer's address instead of 224.0.0.18.
    #[serde(default)]
    pub unicast: bool,
    /// `[vrrp] key`: adverts are sealed and only sealed ones count (false from a
    /// Sluice that predates it, which had none).
    #[serde(default)]
    pub authenticated: bool,
    /// `[vrrp] accept_unsealed`: with the key, adverts without a trailer count too.
    #[serde(default)]
    pub accept_unsealed: bool,
}

/// A gratuitous ARP for each of `addrs` (a broadcast who-has for the address, from
/// the address and `mac`), so that neighbours' caches point at `mac`; returns how many
/// `send` took.
pub fn send_gratuitous_arps(
    mac: MacAddr,
    addrs: &[Ipv4Addr],
    send: &mut impl FnMut(&[u8]) -> bool,
) -> u64 {
    let mut sent = 0;
    for &ip in addrs {
        let mut frame = [0u8; 60];
        if let Some(len) =
            crate::wire::arp::write_request(&mut frame, ethernet::HEADER_LEN, mac, ip, ip)
        {
            sent += u64::from(send(&frame[..len]));
        }
    }
    sent
}

/// An unsolicited Neighbor Advertisement for each of `addrs` (RFC 4861 section
/// 7.2.6): from the address itself to all nodes (ff02::1, 33:33:00:00:00:01), hop
/// limit 255, override set, solicited clear, `mac` as target link-layer address, so
/// that neighbours that cached another MAC for the address move to `mac`; returns how
/// many `send` took.
pub fn send_unsolicited_adverts(
    mac: MacAddr,
    addrs: &[Ipv6Addr],
    send: &mut impl FnMut(&[u8]) -> bool,
) -> u64 {
    let mut sent = 0;
    for &ip in addrs {
        // A neighbour never caches these; nor may they be a source (RFC 4291).
        if ip.is_multicast() || ip.is_unspecified() || ip.is_loopback() {
            continue;
        }
        let mut frame = [0u8; ethernet::HEADER_LEN + icmpv6::NDISC_PACKET_LEN];
        if let Some(len) =
            icmpv6::write_unsolicited_advert(&mut frame, ethernet::HEADER_LEN, mac, ip, false)
        {
            sent += u64::from(send(&frame[..len]));
        }
    }
    sent
}

pub struct VrrpNode {
    router: Router,
    mac: MacAddr,
    /// `[vrrp] peers` (the workers filter by them).
    peers: Vec<Ipv4Addr>,
    /// Adverts to each of `peers` rather than to the group.
    unicast: bool,
    /// `[vrrp] key`, and the wall clock (microseconds since the Unix epoch) its
    /// counters come from.
    auth: Option<(AdvertAuth, fn() -> u64)>,
    /// Senders whose refusal was logged, and when (ms): once a minute each.
    refusal_logged: Vec<(Ipv4Addr, u64)>,
    last_heard: Option<(Ipv4Addr, u8)>,
    changed_at_ms: u64,
    /// When to announce the virtual addresses once more after becoming master.
    announce_again_at_ms: Option<u64>,
    pub stats: VrrpStats,
}

/// A new master announces its addresses again this long after the first time, as
/// keepalived does (`vrrp_garp_master_delay`, 5 s): a neighbour that missed the first
/// gratuitous ARP or advertisement (a lost frame, a switch port still coming up) does
/// not keep sending to the old master until its cache entry ages out.
pub const ANNOUNCE_AGAIN_MS: u64 = 5000;

fn state_name(s: State) -> &'static str {
    match s {
        State::Initialize => "INIT",
        State::Backup => "BACKUP",
        State::Master => "MASTER",
    }
}

impl VrrpNode {
    pub fn new(config: VrrpConfig, mac: MacAddr) -> Self {
        VrrpNode {
            router: Router::new(config),
            mac,
            peers: Vec::new(),
            unicast: false,
            auth: None,
            refusal_logged: Vec::new(),
            last_heard: None,
            changed_at_ms: 0,
            announce_again_at_ms: None,
            stats: VrrpStats::default(),
        }
    }

    /// The same node, reporting `peers` as the only senders whose adverts count (the
    /// workers drop anyone else's; empty: any sender's); with `unicast`, advertising
    /// to each of them (keepalived's `unicast_peer`) instead of to 224.0.0.18, which a
    /// keepalived in unicast mode does not listen to. Unicast with no peer would
    /// advertise to nobody: it stays multicast (the config refuses it anyway).
    pub fn with_peers(mut self, peers: &[Ipv4Addr], unicast: bool) -> Self {
        self.peers = peers.to_vec();
        self.unicast = unicast && !peers.is_empty();
        self
    }

    /// The same node, sealing its adverts with `auth` and believing only sealed ones,
    /// their counters read off `wall_clock_us`.
    pub fn with_auth(mut self, auth: AdvertAuth, wall_clock_us: fn() -> u64) -> Self {
        self.auth = Some((auth, wall_clock_us));
        self
    }

    /// Whether this node serves the virtual addresses (it is master).
    pub fn serving(&self) -> bool {
        self.router.state == State::Master
    }

    pub fn start(
        &mut self,
        now_ms: u64,
        addrs: &VirtualAddresses,
        send: &mut impl FnMut(&[u8]) -> bool,
    ) -> Vec<String> {
        self.step(Event::Startup, now_ms, addrs, send)
    }

    /// Gives up the master role (priority 0 advertisement) before the process ends.
    pub fn shutdown(
        &mut self,
        now_ms: u64,
        addrs: &VirtualAddresses,
        send: &mut impl FnMut(&[u8]) -> bool,
    ) -> Vec<String> {
        self.step(Event::Shutdown, now_ms, addrs, send)
    }

    pub fn tick(
        &mut self,
        now_ms: u64,
        addrs: &VirtualAddresses,
        send: &mut impl FnMut(&[u8]) -> bool,
    ) -> Vec<String> {
        if let Some(at) = self.announce_again_at_ms {
            if now_ms >= at {
                self.announce_again_at_ms = None;
                if self.serving() {
                    self.announce(addrs, send);
                }
            }
        }
        match self.router.next_deadline() {
            Some(at) if now_ms >= at => self.step(Event::Tick, now_ms, addrs, send),
            _ => Vec::new(),
        }
    }

    /// A gratuitous ARP for every IPv4 virtual address, an unsolicited Neighbor
    /// Advertisement for every IPv6 one.
    fn announce(&mut self, addrs: &VirtualAddresses, send: &mut impl FnMut(&[u8]) -> bool) {
        self.stats.gratuitous_arps_sent += send_gratuitous_arps(self.mac, &addrs.v4, send);
        self.stats.unsolicited_nas_sent += send_unsolicited_adverts(self.mac, &addrs.v6, send);
    }

    /// `sluicectl reload`: new priority, advertisement interval or preempt flag; the
    /// event line when anything changed.
    pub fn reconfigure(
        &mut self,
        priority: u8,
        advert_interval_cs: u16,
        preempt: bool,
        now_ms: u64,
        addrs: &VirtualAddresses,
        send: &mut impl FnMut(&[u8]) -> bool,
    ) -> Option<String> {
        let old = self.router.config;
        if (old.priority, old.advert_interval_cs, old.preempt)
            == (priority, advert_interval_cs, preempt)
        {
            return None;
        }
        let (next, actions) =
            self.router
                .reconfigure(priority, advert_interval_cs, preempt, now_ms);
        self.router = next;
        if actions.contains(Actions::SEND_ADVERT) {
            self.send_advert(priority, addrs, send);
        }
        Some(format!(
            "lb=vrrp vrid={} op=reconfigure state={} priority={}->{} advert_ms={}->{} preempt={}->{}",
            old.vrid,
            state_name(self.router.state),
            old.priority,
            priority,
            u32::from(old.advert_interval_cs) * 10,
            u32::from(advert_interval_cs) * 10,
            old.preempt,
            preempt
        ))
    }

    /// A frame the workers handed up as VRRP (IPv4 protocol 112 from a peer, to
    /// 224.0.0.18 or to an address of the port).
    pub fn on_frame(
        &mut self,
        frame: &[u8],
        now_ms: u64,
        addrs: &VirtualAddresses,
        send: &mut impl FnMut(&[u8]) -> bool,
    ) -> Vec<String> {
        let advert = match self.check(frame) {
            Ok((advert, unsealed)) => {
                self.stats.adverts_unsealed += u64::from(unsealed);
                advert
            }
            Err(Rejected::Invalid) => {
                self.stats.adverts_rejected += 1;
                return Vec::new();
            }
            Err(Rejected::Refused(sender, refusal)) => {
                return self.refused(sender, refusal, now_ms)
            }
        };
        self.stats.adverts_received += 1;
        if advert.priority != RESIGN_PRIORITY {
            self.last_heard = Some((advert.sender, advert.priority));
        }
        self.step(Event::Advert(advert), now_ms, addrs, send)
    }

    /// Counts an authentication refusal, and logs it unless that sender's was logged in
    /// the last minute (or eight senders' were): each kind is a misconfiguration
    /// (another key, one side unauthenticated, clocks apart) more often than an attack,
    /// and each makes this node take the master role beside a live one.
    fn refused(&mut self, sender: Ipv4Addr, refusal: Refusal, now_ms: u64) -> Vec<String> {
        let why = match refusal {
            Refusal::BadAuth => {
                self.stats.adverts_bad_auth += 1;
                match self.auth.is_some() {
                    true => "bad_auth: no trailer, or a tag not made with this node's key (a \
                             peer with another key, or with unauthenticated = true?)"
                        .to_string(),
                    false => "bad_auth: sealed with a key, and this node has none \
                              (unauthenticated = true); set the peers' key here too"
                        .to_string(),
                }
            }
            Refusal::UnsealedFromSealer(us) => {
                self.stats.adverts_bad_auth += 1;
                format!(
                    "bad_auth: no trailer, from a peer whose sealed advert was believed {:.1} s \
                     ago (accept_unsealed takes a sealing peer's unsealed adverts only once its \
                     sealed ones have stopped for a master-down interval)",
                    us as f64 / 1e6
                )
            }
            Refusal::Replayed(us) => {
                self.stats.adverts_replayed += 1;
                format!(
                    "replayed: its counter is {:.1} s behind the last one believed from it \
                     (sent before, or its clock went back across a restart)",
                    us as f64 / 1e6
                )
            }
            Refusal::ClockSkew(us) => {
                self.stats.adverts_clock_skew += 1;
                let (how, secs) = match us > 0 {
                    true => ("ahead of", us as f64 / 1e6),
                    false => ("behind", -(us as f64) / 1e6),
                };
                format!(
                    "clock_skew: its clock is {secs:.1} s {how} this node's, more than \
                     max_clock_skew_ms; its adverts count once the clocks agree (NTP)"
                )
            }
        };
        // Anyone on the link can make refusals: at most one line per sender, and
        // LOGGED_SENDERS lines in all, per REFUSAL_LOG_MS.
        const REFUSAL_LOG_MS: u64 = 60_000;
        const LOGGED_SENDERS: usize = 8;
        self.refusal_logged
            .retain(|&(_, at)| now_ms.saturating_sub(at) < REFUSAL_LOG_MS);
        if self.refusal_logged.len() == LOGGED_SENDERS
            || self.refusal_logged.iter().any(|&(s, _)| s == sender)
        {
            return Vec::new();
        }
        self.refusal_logged.push((sender, now_ms));
        vec![format!(
            "lb=vrrp vrid={} op=refused from={sender} reason={why}; refused adverts do not count",
            self.router.config.vrid
        )]
    }

    /// RFC 5798 section 7.1: TTL 255, version 3, our VRID, a valid checksum; not from
    /// this node's own address. The message is the whole IP payload (the sender's
    /// checksum covers all of it), so an address count that disagrees with the payload
    /// length is refused: checking only the counted bytes would accept a frame whose
    /// checksum the sender computed over more, by coincidence one time in 65,536. With
    /// a key, the payload is the message and its trailer, which must seal it (or with
    /// `accept_unsealed`, the message alone: then the advert comes with `true`).
    fn check(&mut self, frame: &[u8]) -> Result<(Advert, bool), Rejected> {
        let invalid = |_| Rejected::Invalid;
        let ip =
            ipv4::Packet::new_checked(frame.get(ethernet::HEADER_LEN..).ok_or(Rejected::Invalid)?)
                .map_err(invalid)?;
        if ip.ttl() != vrrp::TTL || ip.protocol() != vrrp::PROTOCOL || !ip.verify_checksum() {
            return Err(Rejected::Invalid);
        }
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        let end = ip.total_len() as usize;
        let body = frame
            .get(ethernet::HEADER_LEN + ip.header_len()..ethernet::HEADER_LEN + end)
            .ok_or(Rejected::Invalid)?;
        let packet = vrrp::Packet::new_checked(body).map_err(invalid)?;
        let message_len = packet.message_len();
        if !vrrp::verify_payload_checksum(body, src, dst)
            || packet.vrid() != self.router.config.vrid
            || src == self.router.config.primary_addr
        {
            return Err(Rejected::Invalid);
        }
        let mut unsealed = false;
        match &mut self.auth {
            None if message_len != body.len() => {
                // A trailer, or bytes no VRRP sender adds: a sealed advert is refused
                // as such, anything else as malformed.
                let sealed = vrrp::auth::parse(&body[message_len..]).is_some();
                return Err(match sealed {
                    true => Rejected::Refused(src, Refusal::BadAuth),
                    false => Rejected::Invalid,
                });
            }
            None => {}
            Some((auth, clock)) if message_len == body.len() && auth.accepts_unsealed() => {
                let hold_us = u64::from(self.router.master_down_interval_cs()) * 10_000;
                auth.admit_unsealed(src, clock(), hold_us)
                    .map_err(|r| Rejected::Refused(src, r))?;
                unsealed = true;
            }
            Some((auth, clock)) => auth
                .admit(body, message_len, src, dst, clock())
                .map_err(|r| Rejected::Refused(src, r))?,
        }
        let advert = Advert {
            priority: packet.priority(),
            max_advert_interval_cs: packet.max_advert_interval(),
            sender: src,
        };
        Ok((advert, unsealed))
    }

    fn step(
        &mut self,
        event: Event,
        now_ms: u64,
        addrs: &VirtualAddresses,
        send: &mut impl FnMut(&[u8]) -> bool,
    ) -> Vec<String> {
        let before = self.router.state;
        let (next, actions) = self.router.step(event, now_ms);
        self.router = next;
        if actions.contains(Actions::SEND_ADVERT) {
            self.send_advert(self.router.config.priority, addrs, send);
        }
        if actions.contains(Actions::SEND_RESIGN) {
            self.send_advert(RESIGN_PRIORITY, addrs, send);
        }
        if actions.contains(Actions::SEND_GRATUITOUS_ARP) {
            self.announce(addrs, send);
            self.announce_again_at_ms = Some(now_ms.saturating_add(ANNOUNCE_AGAIN_MS));
        }
        let after = self.router.state;
        if after == before {
            return Vec::new();
        }
        self.stats.transitions += 1;
        self.changed_at_ms = now_ms;
        if after == State::Master {
            self.last_heard = None;
        }
        let c = &self.router.config;
        vec![format!(
            "lb=vrrp vrid={} state={} from={} priority={} addresses={}",
            c.vrid,
            state_name(after),
            state_name(before),
            c.priority,
            addrs.len()
        )]
    }

    /// One advertisement at `priority` to 224.0.0.18, or with `unicast` one to each
    /// peer, its destination MAC left zero for worker 0 to resolve (RFC 5798's
    /// checksum covers the destination address, so each is summed for its own).
    fn send_advert(
        &mut self,
        priority: u8,
        addrs: &VirtualAddresses,
        send: &mut impl FnMut(&[u8]) -> bool,
    ) {
        let c = self.router.config;
        let repr = vrrp::Repr {
            vrid: c.vrid,
            priority,
            max_advert_interval: c.advert_interval_cs,
            addresses: addrs.v4.iter().copied().take(255).collect(),
        };
        let group = [(vrrp::MULTICAST_MAC, vrrp::MULTICAST_GROUP)];
        let peers: Vec<(MacAddr, Ipv4Addr)> = match self.unicast {
            true => self.peers.iter().map(|&p| (MacAddr::ZERO, p)).collect(),
            false => group.to_vec(),
        };
        let l3 = ethernet::HEADER_LEN;
        let l4 = l3 + ipv4::MIN_HEADER_LEN;
        let message_end = l4 + repr.buffer_len();
        let sealed = self
            .auth
            .as_mut()
            .map(|(auth, clock)| (auth.next_counter(clock()), &*auth));
        let len = message_end + sealed.map_or(0, |_| vrrp::auth::TRAILER_LEN);
        let mut frame = vec![0u8; len.max(60)];
        let mut sent = 0;
        for (mac, to) in peers {
            ethernet::Repr {
                src_addr: self.mac,
                dst_addr: mac,
                ethertype: EtherType::IPV4,
            }
            .emit(&mut ethernet::Frame::new_unchecked(&mut frame[..]));
            ipv4::Repr {
                src_addr: c.primary_addr,
                dst_addr: to,
                protocol: vrrp::PROTOCOL,
                payload_len: len - l4,
                ttl: vrrp::TTL,
            }
            .emit(&mut ipv4::Packet::new_unchecked(&mut frame[l3..len]));
            repr.emit(
                &mut vrrp::Packet::new_unchecked(&mut frame[l4..message_end]),
                c.primary_addr,
                to,
            );
            if let Some((counter, auth)) = sealed {
                auth.seal(&mut frame[l4..len], c.primary_addr, to, counter);
            }
            sent += u64::from(send(&frame));
        }
        self.stats.adverts_sent += sent;
    }

    pub fn report(&self, now_ms: u64) -> VrrpReport {
        let c = self.router.config;
        VrrpReport {
            vrid: c.vrid,
            state: state_name(self.router.state).into(),
            priority: c.priority,
            advert_interval_ms: u32::from(c.advert_interval_cs) * 10,
            preempt: c.preempt,
            primary: c.primary_addr.to_string(),
            master: self.last_heard.map(|(ip, _)| ip.to_string()),
            master_priority: self.last_heard.map(|(_, p)| p),
            since_change_ms: now_ms.saturating_sub(self.changed_at_ms),
            stats: self.stats,
            peers: self.peers.iter().map(Ipv4Addr::to_string).collect(),
            unicast: self.unicast,
            authenticated: self.auth.is_some(),
            accept_unsealed: self
                .auth
                .as_ref()
                .is_some_and(|(auth, _)| auth.accepts_unsealed()),
        }
    }
}

/// Why [`VrrpNode::check`] did not take an advert.
enum Rejected {
    /// Not a valid advert for this router (`adverts_rejected`).
    Invalid,
    /// A valid one that authentication refused, from this sender.
    Refused(Ipv4Addr, Refusal),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4_only(v4: &[Ipv4Addr]) -> VirtualAddresses {
        VirtualAddresses {
            v4: v4.to_vec(),
            v6: Vec::new(),
        }
    }

    fn node(priority: u8, last: u8) -> VrrpNode {
        VrrpNode::new(
            VrrpConfig {
                vrid: 51,
                priority,
                advert_interval_cs: 10,
                preempt: true,
                primary_addr: Ipv4Addr::new(198, 18, 0, last),
            },
            MacAddr([2, 0, 0, 0, 0, last]),
        )
    }

    #[test]
    fn two_nodes_elect_the_higher_priority_over_their_own_frames() {
        let vips = v4_only(&[Ipv4Addr::new(198, 18, 1, 1)]);
        let (mut a, mut b) = (node(150, 1), node(100, 2));
        let mut wire: Vec<(u8, Vec<u8>)> = Vec::new();
        let mut lines = Vec::new();
        lines.extend(a.start(0, &vips, &mut |f: &[u8]| {
            wire.push((1, f.to_vec()));
            true
        }));
        lines.extend(b.start(0, &vips, &mut |f: &[u8]| {
            wire.push((2, f.to_vec()));
            true
        }));
        for now in 0..2000u64 {
            let frames = std::mem::take(&mut wire);
            for (from, f) in frames {
                // Each node hears the other's VRRP frames (not ARP).
                if f[12..14] != [0x08, 0x00] {
                    continue;
                }
                let to = if from == 1 { &mut b } else { &mut a };
                let id = if from == 1 { 2 } else { 1 };
                lines.extend(to.on_frame(&f, now, &vips, &mut |g: &[u8]| {
                    wire.push((id, g.to_vec()));
                    true
                }));
            }
            lines.extend(a.tick(now, &vips, &mut |f: &[u8]| {
                wire.push((1, f.to_vec()));
                true
            }));
            lines.extend(b.tick(now, &vips, &mut |f: &[u8]| {
                wire.push((2, f.to_vec()));
                true
            }));
        }
        assert!(a.serving() && !b.serving(), "{lines:?}");
        // About one advertisement per 100 ms over 2 s.
        assert!(b.stats.adverts_received >= 15, "{:?}", b.stats);
        assert_eq!(b.report(2000).master.as_deref(), Some("198.18.0.1"));
        assert!(a.stats.gratuitous_arps_sent >= 1);
        assert!(
            lines
                .iter()
                .any(|l| l == "lb=vrrp vrid=51 state=MASTER from=BACKUP priority=150 addresses=1"),
            "{lines:?}"
        );
        // a resigns: b takes over after its skew time rather than 3 intervals.
        let mut resign = Vec::new();
        a.shutdown(2000, &vips, &mut |f: &[u8]| {
            resign.push(f.to_vec());
            true
        });
        let mut out = Vec::new();
        b.on_frame(&resign[0], 2000, &vips, &mut |f: &[u8]| {
            out.push(f.to_vec());
            true
        });
        let mut took_over = None;
        for now in 2000..2200 {
            if !b.tick(now, &vips, &mut |_: &[u8]| true).is_empty() {
                took_over = Some(now - 2000);
                break;
            }
        }
        let took = took_over.expect("b takes over");
        // Skew time ((256 - 100) * 10 cs) / 256 = 6 cs, not the 36 cs master-down interval.
        assert_eq!(took, 60, "after the skew time");
        assert!(b.serving());
    }

    #[test]
    fn foreign_and_broken_adverts_are_rejected() {
        let vips = v4_only(&[Ipv4Addr::new(198, 18, 1, 1)]);
        let mut a = node(100, 1);
        let mut other = node(100, 2);
        other.router.config.vrid = 52;
        let mut frames = Vec::new();
        other.start(0, &vips, &mut |f: &[u8]| {
            frames.push(f.to_vec());
            true
        });
        other.tick(10_000, &vips, &mut |f: &[u8]| {
            frames.push(f.to_vec());
            true
        });
        let advert = frames
            .into_iter()
            .find(|f| f[12..14] == [0x08, 0x00])
            .expect("an advert");
        a.on_frame(&advert, 0, &vips, &mut |_: &[u8]| true);
        let mut bad = advert.clone();
        bad[14 + 8] = 64; // TTL
        a.on_frame(&bad, 0, &vips, &mut |_: &[u8]| true);
        a.on_frame(&advert[..30], 0, &vips, &mut |_: &[u8]| true);
        assert_eq!((a.stats.adverts_received, a.stats.adverts_rejected), (0, 3));
    }

    /// Found by the vrrp fuzz target: an advert counting fewer addresses than its IP
    /// payload carries, whose checksum is right for the counted bytes only, is refused.
    #[test]
    fn an_address_count_short_of_the_payload_is_refused() {
        let vips = v4_only(&[Ipv4Addr::new(198, 18, 1, 1)]);
        let mut a = node(100, 1);
        let mut b = node(150, 2);
        let mut frames = Vec::new();
        b.start(0, &vips, &mut |f: &[u8]| {
            frames.push(f.to_vec());
            true
        });
        b.tick(10_000, &vips, &mut |f: &[u8]| {
            frames.push(f.to_vec());
            true
        });
        let advert = frames
            .into_iter()
            .find(|f| f[12..14] == [0x08, 0x00])
            .expect("an advert");
        let accepted = |a: &mut VrrpNode, f: &[u8]| {
            let before = a.stats.adverts_received;
            a.on_frame(f, 0, &vips, &mut |_: &[u8]| true);
            a.stats.adverts_received > before
        };
        assert!(accepted(&mut a, &advert), "the genuine advert");
        // Four more payload bytes, IP total length and header checksum fixed; the VRRP
        // checksum still verifies over the counted message.
        let mut long = advert.clone();
        long.extend_from_slice(&[0, 0, 0, 0]);
        let total = u16::from_be_bytes([long[16], long[17]]) + 4;
        long[16..18].copy_from_slice(&total.to_be_bytes());
        let mut ip = ipv4::Packet::new_unchecked(&mut long[14..34]);
        ip.fill_checksum();
        assert!(!accepted(&mut a, &long), "a count short of the payload");
    }

    /// Taking over sends one unsolicited Neighbor Advertisement per IPv6 address,
    /// besides the gratuitous ARPs; scapy decodes them: from the address to all nodes,
    /// hop limit 255, override without solicited or router, our MAC as target
    /// link-layer address, and a checksum equal to the one scapy computes.
    #[test]
    fn taking_over_advertises_the_ipv6_addresses_as_scapy_reads_them() {
        let addrs = VirtualAddresses {
            v4: vec![Ipv4Addr::new(198, 18, 1, 1)],
            v6: vec![
                "2001:db8:18::80".parse().unwrap(),
                "2001:db8:18::a1".parse().unwrap(),
            ],
        };
        // The owner (255) is master at start.
        let mut a = node(255, 1);
        let mut sent = Vec::new();
        let lines = a.start(0, &addrs, &mut |f: &[u8]| {
            sent.push(f.to_vec());
            true
        });
        assert!(a.serving(), "{lines:?}");
        assert!(lines[0].ends_with("addresses=3"), "{lines:?}");
        assert_eq!(a.stats.gratuitous_arps_sent, 1);
        assert_eq!(a.stats.unsolicited_nas_sent, 2);
        // Once more 5 s later while still master, and not again after that.
        let mut again = Vec::new();
        let mut collect = |f: &[u8]| {
            again.push(f.to_vec());
            true
        };
        a.tick(ANNOUNCE_AGAIN_MS - 1, &addrs, &mut collect);
        assert_eq!(a.stats.gratuitous_arps_sent, 1, "not before its time");
        a.tick(ANNOUNCE_AGAIN_MS, &addrs, &mut collect);
        a.tick(3 * ANNOUNCE_AGAIN_MS, &addrs, &mut collect);
        assert_eq!(a.stats.gratuitous_arps_sent, 2);
        assert_eq!(a.stats.unsolicited_nas_sent, 4);
        let is_arp = |f: &Vec<u8>| f[12..14] == [0x08, 0x06];
        assert_eq!(
            again.iter().filter(|f| is_arp(f)).count(),
            1,
            "one ARP again"
        );
        let nas: Vec<String> = sent
            .iter()
            .filter(|f| f[12..14] == [0x86, 0xdd])
            .map(|f| f.iter().map(|b| format!("{b:02x}")).collect())
            .collect();
        assert_eq!(nas.len(), 2);
        let script = format!(
            r#"
from scapy.all import Ether, raw
from scapy.layers.inet6 import IPv6, ICMPv6ND_NA, ICMPv6NDOptDstLLAddr
for h in {nas:?}:
    p = Ether(bytes.fromhex(h))
    na = p[ICMPv6ND_NA]
    theirs = na.cksum
    na.cksum = None
    recomputed = Ether(raw(p))[ICMPv6ND_NA].cksum
    print(p.src, p.dst, p[IPv6].src, p[IPv6].dst, p[IPv6].hlim, na.type, na.R, na.S, na.O,
          na.tgt, p[ICMPv6NDOptDstLLAddr].lladdr, len(p), theirs == recomputed)
"#
        );
        let output = crate::wire::test_util::run_scapy(&script);
        assert_eq!(
            output,
            "02:00:00:00:00:01 33:33:00:00:00:01 2001:db8:18::80 ff02::1 255 136 0 0 1 \
             2001:db8:18::80 02:00:00:00:00:01 86 True\n\
             02:00:00:00:00:01 33:33:00:00:00:01 2001:db8:18::a1 ff02::1 255 136 0 0 1 \
             2001:db8:18::a1 02:00:00:00:00:01 86 True\n"
        );
        // A backup that takes over announces them too; one that stays backup does not.
        let mut b = node(100, 2);
        b.start(0, &addrs, &mut |_: &[u8]| true);
        assert_eq!(
            b.stats.unsolicited_nas_sent, 0,
            "a backup announces nothing"
        );
        let took_over = (0..10_000)
            .step_by(10)
            .find(|&now| !b.tick(now, &addrs, &mut |_: &[u8]| true).is_empty() && b.serving());
        assert!(took_over.is_some());
        assert_eq!(b.stats.unsolicited_nas_sent, 2);
    }

    /// With `unicast`, each advertisement goes to each peer: to its address, the MAC
    /// left for worker 0 to resolve, TTL 255, the checksum over that destination; and
    /// a peer takes it as an advert from the master.
    #[test]
    fn unicast_adverts_go_to_each_peer_summed_for_its_address() {
        let vips = v4_only(&[Ipv4Addr::new(198, 18, 1, 1)]);
        let peers = [Ipv4Addr::new(198, 18, 0, 2), Ipv4Addr::new(198, 18, 0, 3)];
        let mut a = node(255, 1).with_peers(&peers, true);
        let mut frames = Vec::new();
        a.start(0, &vips, &mut |f: &[u8]| {
            frames.push(f.to_vec());
            true
        });
        let adverts: Vec<&Vec<u8>> = frames.iter().filter(|f| f[12..14] == [8, 0]).collect();
        assert_eq!(adverts.len(), 2, "{frames:?}");
        assert_eq!(a.stats.adverts_sent, 2);
        for (f, &peer) in adverts.iter().zip(&peers) {
            let eth = ethernet::Frame::new_checked(&f[..]).unwrap();
            assert_eq!(eth.dst_addr(), MacAddr::ZERO);
            let ip = ipv4::Packet::new_checked(&f[ethernet::HEADER_LEN..]).unwrap();
            assert_eq!(
                (ip.src_addr(), ip.dst_addr(), ip.ttl(), ip.protocol()),
                (
                    Ipv4Addr::new(198, 18, 0, 1),
                    peer,
                    vrrp::TTL,
                    vrrp::PROTOCOL
                )
            );
            let body = &f[ethernet::HEADER_LEN + ip.header_len()..][..ip.total_len() as usize - 20];
            let packet = vrrp::Packet::new_checked(body).unwrap();
            assert!(packet.verify_checksum(ip.src_addr(), peer));
            assert!(!packet.verify_checksum(ip.src_addr(), vrrp::MULTICAST_GROUP));
        }
        // The gratuitous ARPs still go to everyone.
        assert!(frames.iter().any(|f| f[..6] == [0xff; 6]), "{frames:?}");
        let mut b = node(100, 2).with_peers(&[Ipv4Addr::new(198, 18, 0, 1)], true);
        b.start(0, &vips, &mut |_: &[u8]| true);
        b.on_frame(adverts[0], 1, &vips, &mut |_: &[u8]| true);
        assert_eq!((b.stats.adverts_received, b.stats.adverts_rejected), (1, 0));
        let r = b.report(1);
        assert_eq!((r.master.as_deref(), r.unicast), (Some("198.18.0.1"), true));
        // Unicast with no peer would advertise to nobody: it stays with the group.
        let mut c = node(255, 1).with_peers(&[], true);
        let mut sent = Vec::new();
        c.start(0, &vips, &mut |f: &[u8]| {
            sent.push(f.to_vec());
            true
        });
        assert!(
            sent.iter().any(|f| f[..6] == vrrp::MULTICAST_MAC.0),
            "{sent:?}"
        );
    }

    thread_local! {
        /// The wall clock the keyed nodes of a test read, in microseconds.
        static CLOCK_US: std::cell::Cell<u64> = const { std::cell::Cell::new(1_800_000_000_000_000) };
    }

    fn test_clock() -> u64 {
        CLOCK_US.with(|c| c.get())
    }

    fn keyed(priority: u8, last: u8, key: &[u8]) -> VrrpNode {
        let key = crate::ha::auth::SharedKey::new(key).unwrap();
        node(priority, last).with_auth(AdvertAuth::new(key, 60_000), test_clock)
    }

    const KEY: &[u8] = b"the group's key, 32 bytes long!!";

    /// The adverts `n` sends over `ms` milliseconds from `start`, alone (master).
    fn adverts_of(n: &mut VrrpNode, start: u64, ms: u64, vips: &VirtualAddresses) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        let mut keep = |f: &[u8]| {
            if f[12..14] == [0x08, 0x00] {
                frames.push(f.to_vec());
            }
            true
        };
        n.start(start, vips, &mut keep);
        for now in start..start + ms {
            CLOCK_US.with(|c| c.set(c.get() + 1000));
            n.tick(now, vips, &mut keep);
        }
        frames
    }

    #[test]
    fn keyed_nodes_believe_each_others_sealed_adverts_once_and_nothing_else() {
        let vips = v4_only(&[Ipv4Addr::new(198, 18, 1, 1)]);
        let mut master = keyed(150, 1, KEY);
        let sealed = adverts_of(&mut master, 0, 1000, &vips);
        assert!(master.serving() && sealed.len() >= 5, "{}", sealed.len());
        assert!(master.report(1000).authenticated);
        // Sealed: the message, then the trailer, all under one checksum.
        let ip_len = u16::from_be_bytes([sealed[0][16], sealed[0][17]]) as usize;
        assert_eq!(ip_len, 20 + 8 + 4 + vrrp::auth::TRAILER_LEN);
        let mut backup = keyed(100, 2, KEY);
        let none = &mut |_: &[u8]| true;
        backup.start(0, &vips, none);
        for f in &sealed {
            backup.on_frame(f, 10, &vips, none);
        }
        assert_eq!(backup.stats.adverts_received, sealed.len() as u64);
        assert_eq!(backup.report(10).master.as_deref(), Some("198.18.0.1"));
        // Sent again, in any order: refused, counted, and the node is where it was.
        for f in sealed.iter().rev() {
            backup.on_frame(f, 20, &vips, none);
        }
        assert_eq!(backup.stats.adverts_replayed, sealed.len() as u64);
        assert_eq!(backup.stats.adverts_received, sealed.len() as u64);
        // The same advert unsealed (as keepalived sends it), or sealed under another
        // key: refused as bad auth.
        let mut plain = node(150, 1);
        let unsealed = adverts_of(&mut plain, 0, 1000, &vips);
        let mut stranger = keyed(150, 1, b"not the group's key, 32 bytes!!!");
        let forged = adverts_of(&mut stranger, 0, 1000, &vips);
        backup.on_frame(&unsealed[0], 30, &vips, none);
        backup.on_frame(&forged[forged.len() - 1], 30, &vips, none);
        assert_eq!(backup.stats.adverts_bad_auth, 2, "{:?}", backup.stats);
        // A node without a key refuses a sealed advert as bad auth, not as malformed.
        let mut open = node(100, 3);
        open.start(0, &vips, none);
        open.on_frame(&sealed[0], 10, &vips, none);
        assert_eq!(
            (
                open.stats.adverts_bad_auth,
                open.stats.adverts_received,
                open.stats.adverts_rejected
            ),
            (1, 0, 0)
        );
        // Alone for the master-down interval, the keyed backup takes over: nothing
        // refused kept it back.
        let mut lines = Vec::new();
        for now in 30..2000 {
            lines.extend(backup.tick(now, &vips, none));
        }
        assert!(backup.serving(), "{lines:?}");
    }

    #[test]
    fn a_peer_off_this_nodes_clock_is_refused_and_logged_once() {
        let vips = v4_only(&[Ipv4Addr::new(198, 18, 1, 1)]);
        let mut master = keyed(150, 1, KEY);
        let sealed = adverts_of(&mut master, 0, 500, &vips);
        // A backup started 90 s after those adverts were sent (a recording replayed
        // to a node that just restarted, or a peer whose clock is 90 s behind).
        CLOCK_US.with(|c| c.set(c.get() + 90_000_000));
        let mut backup = keyed(100, 2, KEY);
        let none = &mut |_: &[u8]| true;
        backup.start(0, &vips, none);
        let mut lines = Vec::new();
        for f in &sealed {
            lines.extend(backup.on_frame(f, 10, &vips, none));
        }
        assert_eq!(
            (
                backup.stats.adverts_clock_skew,
                backup.stats.adverts_received
            ),
            (sealed.len() as u64, 0)
        );
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with(
                "lb=vrrp vrid=51 op=refused from=198.18.0.1 reason=clock_skew: its clock is 90."
            ),
            "{lines:?}"
        );
        assert!(lines[0].contains("s behind this node's"), "{lines:?}");
        // Once the clocks agree (the master sends now, on the clock the backup reads),
        // its adverts count.
        let fresh = adverts_of(&mut master, 500, 300, &vips);
        let last = fresh.len() - 1;
        backup.on_frame(&fresh[last], 20, &vips, none);
        assert_eq!(backup.stats.adverts_received, 1, "{:?}", backup.stats);
        // Its refusals are logged once a minute at most: the replay of that advert
        // 59 s after the first line is counted only, one 60 s after is logged.
        assert!(backup
            .on_frame(&fresh[last], 59_009, &vips, none)
            .is_empty());
        let again = backup.on_frame(&fresh[last], 60_010, &vips, none);
        assert_eq!(backup.stats.adverts_replayed, 2);
        assert_eq!(again.len(), 1, "{again:?}");
        assert!(
            again[0].contains("reason=replayed: its counter is 0.0 s behind"),
            "{again:?}"
        );
    }

    #[test]
    fn an_advert_from_this_nodes_own_address_is_rejected() {
        let vips = v4_only(&[Ipv4Addr::new(198, 18, 1, 1)]);
        let mut a = node(150, 1);
        let own = adverts_of(&mut a, 0, 500, &vips);
        let mut b = node(100, 1);
        b.start(0, &vips, &mut |_: &[u8]| true);
        b.on_frame(&own[0], 10, &vips, &mut |_: &[u8]| true);
        assert_eq!((b.stats.adverts_rejected, b.stats.adverts_received), (1, 0));
    }

    /// Switching a running group to a key: a keyed node with `accept_unsealed` takes
    /// the unsealed adverts of a peer that has no key yet (counted), and still refuses
    /// a sealed one that is wrong.
    #[test]
    fn accept_unsealed_takes_a_keyless_peers_adverts_and_still_checks_sealed_ones() {
        let vips = v4_only(&[Ipv4Addr::new(198, 18, 1, 1)]);
        let mut old = node(150, 1);
        let unsealed = adverts_of(&mut old, 0, 500, &vips);
        let mut stranger = keyed(150, 1, b"not the group's key, 32 bytes!!!");
        let forged = adverts_of(&mut stranger, 0, 500, &vips);
        let key = crate::ha::auth::SharedKey::new(KEY).unwrap();
        let auth = AdvertAuth::new(key, 60_000).accepting_unsealed(true);
        let mut switching = node(100, 2).with_auth(auth, test_clock);
        let none = &mut |_: &[u8]| true;
        switching.start(0, &vips, none);
        for f in &unsealed {
            switching.on_frame(f, 10, &vips, none);
        }
        let n = unsealed.len() as u64;
        assert_eq!(
            (
                switching.stats.adverts_received,
                switching.stats.adverts_unsealed
            ),
            (n, n)
        );
        assert_eq!(switching.report(10).master.as_deref(), Some("198.18.0.1"));
        assert!(switching.report(10).accept_unsealed);
        let lines = switching.on_frame(&forged[0], 20, &vips, none);
        assert_eq!(switching.stats.adverts_bad_auth, 1);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0]
                .contains("reason=bad_auth: no trailer, or a tag not made with this node's key"),
            "{lines:?}"
        );
        // Logged once until the sender's adverts count again.
        assert!(switching.on_frame(&forged[1], 20, &vips, none).is_empty());
        // Without accept_unsealed the same unsealed advert is refused.
        let mut strict = keyed(100, 3, KEY);
        strict.start(0, &vips, none);
        strict.on_frame(&unsealed[0], 10, &vips, none);
        assert_eq!(
            (strict.stats.adverts_bad_auth, strict.stats.adverts_received),
            (1, 0)
        );
    }

    /// With `accept_unsealed`, an unsealed advert from the address of a peer whose
    /// sealed adverts are being believed is someone forging it: refused, until that
    /// peer's sealed adverts have stopped for a master-down interval (the peer put
    /// back to `unauthenticated = true`).
    #[test]
    fn accept_unsealed_refuses_unsealed_adverts_from_a_peer_heard_sealed() {
        let vips = v4_only(&[Ipv4Addr::new(198, 18, 1, 1)]);
        let mut forger = node(150, 1);
        let unsealed = adverts_of(&mut forger, 0, 1000, &vips);
        let mut sealing = keyed(150, 1, KEY);
        let sealed = adverts_of(&mut sealing, 0, 500, &vips);
        let key = crate::ha::auth::SharedKey::new(KEY).unwrap();
        let auth = AdvertAuth::new(key, 60_000).accepting_unsealed(true);
        let mut switching = node(100, 2).with_auth(auth, test_clock);
        let none = &mut |_: &[u8]| true;
        switching.start(0, &vips, none);
        switching.on_frame(&sealed[0], 10, &vips, none);
        assert_eq!(switching.stats.adverts_received, 1);
        let lines = switching.on_frame(&unsealed[0], 20, &vips, none);
        assert_eq!(
            (
                switching.stats.adverts_bad_auth,
                switching.stats.adverts_received,
                switching.stats.adverts_unsealed
            ),
            (1, 1, 0)
        );
        assert!(
            lines
                .first()
                .is_some_and(|l| l.contains("reason=bad_auth: no trailer, from a peer whose sealed advert was believed 0.0 s ago")),
            "{lines:?}"
        );
        // Within the master-down interval (360 ms at priority 100 and 100 ms
        // adverts): still refused.
        CLOCK_US.with(|c| c.set(c.get() + 350_000));
        switching.on_frame(&unsealed[1], 30, &vips, none);
        assert_eq!(switching.stats.adverts_bad_auth, 2);
        // Its sealed adverts stopped for longer: the peer went back to none; counted.
        CLOCK_US.with(|c| c.set(c.get() + 20_000));
        switching.on_frame(&unsealed[2], 40, &vips, none);
        assert_eq!(
            (
                switching.stats.adverts_bad_auth,
                switching.stats.adverts_received,
                switching.stats.adverts_unsealed
            ),
            (2, 2, 1)
        );
    }
}
