//! The monitor end to end without a network: probes leave as frames, answers come
//! back as frames built by the probe module, time is given.
use super::probe::{parse_segment, write_segment, Endpoints, MAX_FRAME_LEN};
use super::*;
use crate::model::Protocol;
use crate::model::SchedulerKind;
use crate::model::{ForwardMode, RealServerSpec};
use crate::wire::tcp::TcpFlags;

const SOURCE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

fn key() -> ServiceKey {
    ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 1), 80)
}

fn table(servers: u8) -> ServiceTable {
    let mut t = ServiceTable::new();
    t.add_service(key(), SchedulerKind::Rr, None).unwrap();
    for i in 0..servers {
        let spec =
            RealServerSpec::new(Ipv4Addr::new(198, 18, 0, 11 + i), 8080, 1, ForwardMode::Nat);
        t.add_server(key(), spec).unwrap();
    }
    t
}

fn monitor(kind: CheckKind) -> HealthMonitor {
    let cfg = HealthConfig {
        defaults: CheckSpec {
            kind,
            interval_ms: 100,
            timeout_ms: 50,
            fall: 2,
            rise: 2,
            retry_ms: 300,
            ..Default::default()
        },
        ..Default::default()
    };
    HealthMonitor::new(cfg, SOURCE, Overrides::default(), 42)
}

/// A real server's segment back to the probe segment `to`, at `seq`, acknowledging
/// `ack`.
fn reply_to(to: &probe::Segment, seq: u32, ack: u32, flags: TcpFlags, payload: &[u8]) -> Vec<u8> {
    let ends = Endpoints {
        local: to.to,
        remote: to.from,
    };
    let mut buf = [0u8; MAX_FRAME_LEN];
    let n = write_segment(&mut buf, &ends, seq, ack, flags, None, payload);
    buf[..n].to_vec()
}

/// A real server's answer to the probe frame `probe` (flags given), from ISN 5000.
fn answer(probe: &[u8], flags: TcpFlags, payload: &[u8]) -> Vec<u8> {
    let p = parse_segment(probe).unwrap();
    reply_to(&p, 5000, p.seq.wrapping_add(1), flags, payload)
}

/// The real server's data after the probe's request `req` (its SYN-ACK's ISN being
/// 5000): at its next sequence number, acknowledging the whole request.
fn server_data(req: &probe::Segment, payload: &[u8]) -> Vec<u8> {
    let ack = req.seq.wrapping_add(req.payload.len() as u32);
    reply_to(req, 5001, ack, TcpFlags::ACK | TcpFlags::PSH, payload)
}

struct Net {
    sent: Vec<Vec<u8>>,
}

impl Net {
    fn tick(&mut self, m: &mut HealthMonitor, t: &ServiceTable, now: u64) -> Vec<HealthEvent> {
        let mut send = |f: &[u8]| {
            self.sent.push(f.to_vec());
            true
        };
        m.tick(t, now, |_| PassiveTotals::default(), &mut send).0
    }

    /// SYNs sent since the last call.
    fn syns(&mut self) -> Vec<Vec<u8>> {
        let out = self
            .sent
            .iter()
            .filter(|f| parse_segment(f).unwrap().flags == TcpFlags::SYN)
            .cloned()
            .collect();
        self.sent.clear();
        out
    }
}

#[test]
fn probes_are_spread_over_the_first_interval_and_then_repeat() {
    let t = table(20);
    let mut m = monitor(CheckKind::Tcp);
    let mut net = Net { sent: Vec::new() };
    let mut first_at = Vec::new();
    for now in 0..100 {
        net.tick(&mut m, &t, now);
        for _ in net.syns() {
            first_at.push(now);
        }
    }
    assert_eq!(first_at.len(), 20, "one probe each in the first interval");
    let distinct: std::collections::HashSet<_> = first_at.iter().collect();
    assert!(
        distinct.len() >= 10,
        "spread out, not one burst: {first_at:?}"
    );
    // Unanswered, they time out after 50 ms: one failure each, nobody evicted yet.
    for now in 100..150 {
        assert!(net.tick(&mut m, &t, now).is_empty());
    }
    assert_eq!(m.stats.probes_timed_out, 20);
}

#[test]
fn silent_server_is_evicted_after_fall_timeouts_and_restored_after_rise_answers() {
    let t = table(1);
    let mut m = monitor(CheckKind::Tcp);
    let mut net = Net { sent: Vec::new() };
    let mut events = Vec::new();
    let mut now = 0;
    while events.is_empty() && now < 1000 {
        events = net.tick(&mut m, &t, now);
        now += 1;
    }
    let evicted_at = now - 1;
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0].line(),
        "lb=evict svc=198.18.1.1:80/tcp rs=198.18.0.11:8080 reason=2fail"
    );
    // Two probes, each failing at its 50 ms timeout, the second within 2 intervals + timeout.
    assert!(
        evicted_at <= 2 * 100 + 50 + 10,
        "evicted at {evicted_at} ms"
    );
    assert_eq!(m.overlay().evicted.len(), 1);
    net.syns();
    // Evicted: the next probe starts retry_ms (300 ms) after the failed one started
    // (which timed out 50 ms later).
    let mut next_syn = None;
    for n in evicted_at + 1..evicted_at + 400 {
        net.tick(&mut m, &t, n);
        if let Some(s) = net.syns().pop() {
            next_syn = Some((n, s));
            break;
        }
    }
    let (at, syn) = next_syn.expect("a retry probe");
    assert!(at >= evicted_at + 250, "retry after {} ms", at - evicted_at);
    // It answers twice (rise 2): restored.
    let synack = answer(&syn, TcpFlags::SYN | TcpFlags::ACK, &[]);
    let mut send = |_: &[u8]| true;
    assert!(m.on_frame(&synack, at + 1, &mut send).is_empty());
    let mut restored = Vec::new();
    for n in at + 2..at + 300 {
        net.tick(&mut m, &t, n);
        if let Some(s) = net.syns().pop() {
            let a = answer(&s, TcpFlags::SYN | TcpFlags::ACK, &[]);
            restored = m.on_frame(&a, n, &mut send);
            break;
        }
    }
    assert_eq!(restored.len(), 1, "restored by the second answer");
    assert!(
        restored[0].line().starts_with("lb=restore"),
        "{}",
        restored[0].line()
    );
    assert!(m.overlay().evicted.is_empty());
    assert_eq!(m.stats.probes_ok, 2);
}

#[test]
fn refused_probes_evict_without_waiting_for_the_timeout() {
    let t = table(1);
    let mut m = monitor(CheckKind::Tcp);
    let mut net = Net { sent: Vec::new() };
    let mut send = |_: &[u8]| true;
    let mut events = Vec::new();
    for now in 0..300 {
        net.tick(&mut m, &t, now);
        for s in net.syns() {
            let rst = answer(&s, TcpFlags::RST | TcpFlags::ACK, &[]);
            events.extend(m.on_frame(&rst, now, &mut send));
        }
        if !events.is_empty() {
            // Second refusal: at most one interval after the first probe.
            assert!(now < 200, "evicted at {now}");
            break;
        }
    }
    assert_eq!(events.len(), 1);
    assert_eq!(m.stats.probes_timed_out, 0);
    assert_eq!(m.report(0)[0].last_outcome.as_deref(), Some("refused"));
}

#[test]
fn http_check_evicts_a_server_answering_500() {
    let t = table(1);
    let mut m = monitor(CheckKind::Http);
    let mut net = Net { sent: Vec::new() };
    let mut send = |_: &[u8]| true;
    let mut events = Vec::new();
    for now in 0..300 {
        net.tick(&mut m, &t, now);
        for s in net.syns() {
            let synack = answer(&s, TcpFlags::SYN | TcpFlags::ACK, &[]);
            let mut request = Vec::new();
            let mut capture = |f: &[u8]| {
                request.push(f.to_vec());
                true
            };
            assert!(m.on_frame(&synack, now, &mut capture).is_empty());
            let req = parse_segment(&request[0]).unwrap();
            assert!(req.payload.starts_with(b"GET / HTTP/1.0"));
            // The server's status line, at its next sequence number.
            let status = server_data(&req, b"HTTP/1.0 500 Internal Server Error\r\n\r\n");
            events.extend(m.on_frame(&status, now, &mut send));
        }
        if !events.is_empty() {
            break;
        }
    }
    assert_eq!(events.len(), 1, "two 500s evict");
    assert_eq!(m.report(0)[0].last_outcome.as_deref(), Some("status 500"));
}

#[test]
fn answers_from_elsewhere_are_stray() {
    let t = table(1);
    let mut m = monitor(CheckKind::Tcp);
    let mut net = Net { sent: Vec::new() };
    let mut syn = None;
    for now in 0..100 {
        net.tick(&mut m, &t, now);
        if let Some(s) = net.syns().pop() {
            syn = Some(s);
            break;
        }
    }
    let syn = syn.unwrap();
    let p = parse_segment(&syn).unwrap();
    // The right ports, the wrong server.
    let ends = Endpoints {
        local: SocketAddr::new(Ipv4Addr::new(198, 18, 0, 99).into(), p.to.port()),
        remote: p.from,
    };
    let mut buf = [0u8; MAX_FRAME_LEN];
    let n = write_segment(
        &mut buf,
        &ends,
        1,
        p.seq + 1,
        TcpFlags::SYN | TcpFlags::ACK,
        None,
        &[],
    );
    let mut send = |_: &[u8]| true;
    assert!(m.on_frame(&buf[..n], 100, &mut send).is_empty());
    assert!(m.on_frame(b"not a frame", 100, &mut send).is_empty());
    assert_eq!(m.stats.stray_replies, 2);
    assert_eq!(m.stats.probes_ok, 0);
}

#[test]
fn passive_counts_evict_and_removal_ends_an_eviction() {
    let mut t = table(2);
    let cfg = HealthConfig {
        defaults: CheckSpec {
            passive: true,
            passive_fall: 3,
            retry_ms: 1000,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut m = HealthMonitor::new(cfg, SOURCE, Overrides::default(), 7);
    let ids: Vec<u32> = t
        .get(key())
        .unwrap()
        .real_servers
        .iter()
        .map(|r| r.id)
        .collect();
    let mut send = |_: &[u8]| -> bool { panic!("no active check: nothing is sent") };
    let counts = std::cell::Cell::new(0u32);
    let passive = |id: u32| PassiveTotals {
        unanswered: if id == ids[0] { counts.get() } else { 0 },
        answered: if id == ids[1] { counts.get() } else { 0 },
        refused: 0,
    };
    assert!(m.tick(&t, 0, passive, &mut send).0.is_empty());
    counts.set(2);
    assert!(m.tick(&t, 1, passive, &mut send).0.is_empty());
    counts.set(3);
    let (events, _) = m.tick(&t, 2, passive, &mut send);
    assert_eq!(events.len(), 1);
    assert!(
        events[0].line().ends_with("reason=passive-3fail"),
        "{}",
        events[0].line()
    );
    assert_eq!(m.overlay().evicted, [ids[0]].into_iter().collect());
    // After the back-off it is tried again (probation).
    let (events, _) = m.tick(&t, 1002, passive, &mut send);
    assert!(events[0].line().starts_with("lb=restore"), "{events:?}");
    // Evict again, then remove it from the service: the eviction goes with it.
    counts.set(10);
    assert_eq!(m.tick(&t, 1003, passive, &mut send).0.len(), 1);
    t.delete_server(key(), Ipv4Addr::new(198, 18, 0, 11).into(), 8080)
        .unwrap();
    m.tick(&t, 1004, passive, &mut send);
    assert!(m.overlay().evicted.is_empty());
}

#[test]
fn overrides_and_all_down_per_service() {
    let t = table(2);
    let mut o = Overrides::default();
    o.services.insert(
        key(),
        (
            CheckOverride {
                kind: Some(CheckKind::Http),
                path: Some("/health".into()),
                ..Default::default()
            },
            Some(AllDown::Rst),
        ),
    );
    o.servers.insert(
        (key(), Ipv4Addr::new(198, 18, 0, 12).into(), 8080),
        CheckOverride {
            kind: Some(CheckKind::Tcp),
            port: Some(9000),
            ..Default::default()
        },
    );
    let mut m = HealthMonitor::new(HealthConfig::default(), SOURCE, o, 1);
    let mut send = |_: &[u8]| true;
    m.tick(&t, 0, |_| PassiveTotals::default(), &mut send);
    let r = m.report(0);
    assert_eq!((r[0].check, r[0].probe_port), (CheckKind::Http, 8080));
    assert_eq!((r[1].check, r[1].probe_port), (CheckKind::Tcp, 9000));
    assert_eq!(m.overlay().reset_when_down, [key()].into_iter().collect());
}

#[test]
fn a_global_tcp_check_probes_a_udp_service_only_where_a_port_is_given() {
    let dns = |vip: u8| ServiceKey::new(Protocol::Udp, Ipv4Addr::new(198, 18, 1, vip), 53);
    let mut t = table(1);
    for vip in [2, 3] {
        t.add_service(dns(vip), SchedulerKind::Rr, None).unwrap();
        for i in 0..2 {
            let ip = Ipv4Addr::new(198, 18, 0, 20 + vip * 2 + i);
            t.add_server(dns(vip), RealServerSpec::new(ip, 53, 1, ForwardMode::Nat))
                .unwrap();
        }
    }
    // The global default names a port too: it is meant for the TCP services.
    let cfg = HealthConfig {
        defaults: CheckSpec {
            kind: CheckKind::Tcp,
            interval_ms: 100,
            timeout_ms: 50,
            port: Some(8081),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut o = Overrides::default();
    // The second UDP service's first server names the TCP port to probe.
    o.servers.insert(
        (dns(3), Ipv4Addr::new(198, 18, 0, 26).into(), 53),
        CheckOverride {
            port: Some(5353),
            ..Default::default()
        },
    );
    let mut m = HealthMonitor::new(cfg, SOURCE, o, 7);
    let mut net = Net { sent: Vec::new() };
    let mut probed = std::collections::BTreeSet::new();
    for now in 0..100 {
        net.tick(&mut m, &t, now);
        for syn in net.syns() {
            let p = parse_segment(&syn).unwrap();
            let IpAddr::V4(to) = p.to.ip() else {
                panic!("an IPv4 server's probe is IPv4: {p:?}")
            };
            probed.insert((to.octets()[3], p.to.port()));
        }
    }
    // The TCP service's server on the global port; of the four UDP servers only the
    // one with a port of its own.
    assert_eq!(probed, [(11, 8081), (26, 5353)].into_iter().collect());
    let spec = m.spec_for(dns(2), Ipv4Addr::new(198, 18, 0, 24).into(), 53);
    assert_eq!(spec.kind, CheckKind::None);
    assert!(m.overlay().evicted.is_empty());
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// A service on an IPv6 VIP with one IPv6 real server, 2001:db8:1a::11 port 8080.
fn table6() -> (ServiceTable, ServiceKey) {
    let key = ServiceKey::new(Protocol::Tcp, v6("2001:db8:18::100"), 80);
    let mut t = ServiceTable::new();
    t.add_service(key, SchedulerKind::Rr, None).unwrap();
    let spec = RealServerSpec::new(v6("2001:db8:1a::11"), 8080, 1, ForwardMode::Nat);
    t.add_server(key, spec).unwrap();
    (t, key)
}

#[test]
fn an_ipv6_server_is_probed_from_the_address_on_its_link_evicted_and_restored() {
    let (t, _) = table6();
    let sources = vec![v6("2001:db8:18::1"), v6("2001:db8:1a::1")];
    let mut m = monitor(CheckKind::Tcp).with_sources6(sources);
    let mut net = Net { sent: Vec::new() };
    let mut send = |_: &[u8]| true;
    let mut events = Vec::new();
    let mut syns = 0;
    for now in 0..300 {
        net.tick(&mut m, &t, now);
        for s in net.syns() {
            syns += 1;
            let p = parse_segment(&s).unwrap();
            assert_eq!(p.from.ip(), IpAddr::V6(v6("2001:db8:1a::1")), "{p:?}");
            assert_eq!(p.to, "[2001:db8:1a::11]:8080".parse().unwrap());
            // An answer to the wrong address (the other source) is not this probe's.
            let mut stray = answer(&s, TcpFlags::RST | TcpFlags::ACK, &[]);
            stray[14 + 24..14 + 40].copy_from_slice(&v6("2001:db8:18::1").octets());
            assert!(m.on_frame(&stray, now, &mut send).is_empty());
            let rst = answer(&s, TcpFlags::RST | TcpFlags::ACK, &[]);
            events.extend(m.on_frame(&rst, now, &mut send));
        }
        if !events.is_empty() {
            break;
        }
    }
    assert_eq!(syns, 2, "two refusals evict (fall 2)");
    assert_eq!(
        events[0].line(),
        "lb=evict svc=[2001:db8:18::100]:80/tcp rs=[2001:db8:1a::11]:8080 reason=2fail"
    );
    assert_eq!(m.stats.stray_replies, 2);
    assert_eq!(m.overlay().evicted.len(), 1);
    let report = &m.report(0)[0];
    assert_eq!(
        (report.ip.as_str(), report.evicted),
        ("2001:db8:1a::11", true)
    );
    let mut restored = Vec::new();
    for now in 300..2000 {
        net.tick(&mut m, &t, now);
        for s in net.syns() {
            let a = answer(&s, TcpFlags::SYN | TcpFlags::ACK, &[]);
            restored.extend(m.on_frame(&a, now, &mut send));
        }
        if !restored.is_empty() {
            break;
        }
    }
    assert!(restored[0].line().starts_with("lb=restore"), "{restored:?}");
    assert!(m.overlay().evicted.is_empty());
}

#[test]
fn without_an_ipv6_source_an_ipv6_server_is_not_probed_and_says_why() {
    let (t, _) = table6();
    let mut m = monitor(CheckKind::Tcp);
    let mut net = Net { sent: Vec::new() };
    for now in 0..1000 {
        assert!(net.tick(&mut m, &t, now).is_empty());
        assert!(net.syns().is_empty(), "no frame without a source");
    }
    let report = &m.report(1000)[0];
    assert_eq!(report.last_outcome.as_deref(), Some(NO_SOURCE6));
    assert!(!report.evicted);
    // Once per interval, not once per tick.
    assert!((9..=11).contains(&m.stats.probes_skipped), "{:?}", m.stats);
    assert_eq!(m.stats.probes_sent, 0);
}

/// A reload's new settings apply, except the probes' source ports (and addresses):
/// the workers hand back only answers to the ports they were told at start, so
/// probes from a new range would go unanswered and evict every server.
#[test]
fn a_reload_keeps_the_probes_source_ports() {
    let t = table(4);
    let mut m = monitor(CheckKind::Tcp);
    let started_with = m.source_ports();
    let mut net = Net { sent: Vec::new() };
    let mut cfg = m.cfg.clone();
    cfg.source_ports = 50000..=50999;
    cfg.source = Some(Ipv4Addr::new(198, 18, 0, 99));
    cfg.defaults.interval_ms = 1000;
    m.reconfigure(cfg, Overrides::default());
    assert_eq!(m.source_ports(), started_with);
    assert_eq!(m.cfg.defaults.interval_ms, 1000);
    let mut probes = Vec::new();
    for now in 0..1000 {
        net.tick(&mut m, &t, now);
        probes.extend(net.syns());
    }
    assert_eq!(probes.len(), 4, "one probe each in the new 1 s interval");
    for probe in &probes {
        let p = parse_segment(probe).unwrap();
        assert!(started_with.contains(&p.from.port()), "{}", p.from);
        assert_eq!(p.from.ip(), std::net::IpAddr::V4(SOURCE));
    }
}

/// Ticks from `from` until an event, answering nothing; returns the events and when.
fn run_until_event(
    m: &mut HealthMonitor,
    t: &ServiceTable,
    net: &mut Net,
    from: u64,
) -> (Vec<HealthEvent>, u64) {
    for now in from..from + 100_000 {
        let events = net.tick(m, t, now);
        if !events.is_empty() {
            return (events, now);
        }
    }
    panic!("no event after {from} ms");
}

/// Passive counts in which every connection to the server was refused `n` times.
/// `m` reloaded with its settings as `change` leaves them (no overrides).
fn reload(m: &mut HealthMonitor, change: impl FnOnce(&mut HealthConfig)) {
    let mut cfg = m.cfg.clone();
    change(&mut cfg);
    m.reconfigure(cfg, Overrides::default());
}

/// The line of the one event in `events`.
fn one_event(events: &[HealthEvent]) -> String {
    assert_eq!(events.len(), 1, "{events:?}");
    events[0].line()
}

fn refused(n: u32) -> impl Fn(u32) -> PassiveTotals {
    move |_: u32| PassiveTotals {
        refused: n,
        ..Default::default()
    }
}

/// A monitor with `kind` checks (every 100 s), passive detection on (one refusal
/// evicts) and `retry_ms`, whose one server of `t` passive detection evicted at 1 ms.
fn passively_evicted(t: &ServiceTable, kind: CheckKind, retry_ms: u32) -> HealthMonitor {
    let cfg = HealthConfig {
        defaults: CheckSpec {
            kind,
            interval_ms: 100_000,
            timeout_ms: 50,
            retry_ms,
            passive: true,
            passive_fall: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut m = HealthMonitor::new(cfg, SOURCE, Overrides::default(), 5);
    let mut send = |_: &[u8]| true;
    m.tick(t, 0, refused(0), &mut send);
    let (events, _) = m.tick(t, 1, refused(1), &mut send);
    assert!(
        events[0].line().ends_with("reason=passive-1fail"),
        "{events:?}"
    );
    m
}

/// With no check and no passive detection anywhere a change of the table watches
/// nothing; one real server's own `health` table turning a check on (or passive
/// detection, for another) is enough to watch that server and no other.
#[test]
fn a_check_in_one_servers_table_alone_is_watched() {
    let mut t = table(3);
    let cfg = HealthConfig::default();
    let mut m = HealthMonitor::new(cfg.clone(), SOURCE, Overrides::default(), 1);
    let mut net = Net { sent: Vec::new() };
    net.tick(&mut m, &t, 0);
    assert!(m.report(0).is_empty());
    let spec = RealServerSpec::new(Ipv4Addr::new(198, 18, 0, 20), 8080, 1, ForwardMode::Nat);
    t.add_server(key(), spec).unwrap();
    net.tick(&mut m, &t, 1);
    assert!(
        m.report(1).is_empty(),
        "a new server, still nothing to watch"
    );
    let servers = t.get(key()).unwrap().real_servers.clone();
    let mut o = Overrides::default();
    let check = CheckOverride {
        kind: Some(CheckKind::Tcp),
        ..Default::default()
    };
    o.servers
        .insert((key(), servers[1].ip, servers[1].port), check);
    let passive = CheckOverride {
        passive: Some(true),
        ..Default::default()
    };
    o.servers
        .insert((key(), servers[3].ip, servers[3].port), passive);
    m.reconfigure(cfg, o);
    net.tick(&mut m, &t, 2);
    let mut watched: Vec<_> = (m.report(2).iter())
        .map(|r| (r.ip.clone(), r.check, r.passive))
        .collect();
    watched.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        watched,
        [
            ("198.18.0.12".to_string(), CheckKind::Tcp, false),
            ("198.18.0.20".to_string(), CheckKind::None, true),
        ]
    );
}

/// Turning a server's active check off ends the eviction that check decided: no probe
/// would ever restore it, and passive detection neither watches an evicted server nor
/// restores one it did not evict. A passive eviction keeps its back-off.
#[test]
fn a_reload_that_turns_the_check_off_restores_what_the_check_evicted() {
    let t = table(1);
    let mut m = monitor(CheckKind::Tcp);
    let mut net = Net { sent: Vec::new() };
    let (events, at) = run_until_event(&mut m, &t, &mut net, 0);
    assert!(events[0].line().starts_with("lb=evict"), "{events:?}");
    // Off, with passive detection still watching the server.
    reload(&mut m, |c| {
        c.defaults.kind = CheckKind::None;
        c.defaults.passive = true;
    });
    let events = net.tick(&mut m, &t, at + 1);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0].line(),
        "lb=restore svc=198.18.1.1:80/tcp rs=198.18.0.11:8080 reason=check-off"
    );
    assert!(m.overlay().evicted.is_empty());
    assert_eq!(m.report(at + 1)[0].restores, 1);
    net.syns();
    for now in at + 2..at + 1000 {
        assert!(net.tick(&mut m, &t, now).is_empty());
        assert!(net.syns().is_empty(), "no check, no probe");
    }

    // Off, with nothing left watching it: restored, and said so, as well.
    let mut m = monitor(CheckKind::Tcp);
    let (_, at) = run_until_event(&mut m, &t, &mut net, 0);
    m.reconfigure(HealthConfig::default(), Overrides::default());
    let events = net.tick(&mut m, &t, at + 1);
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].line().ends_with("reason=check-off"), "{events:?}");
    assert!(m.overlay().evicted.is_empty());

    // A UDP service's server whose health.port goes away has no active check left.
    let dns = ServiceKey::new(Protocol::Udp, Ipv4Addr::new(198, 18, 1, 2), 53);
    let mut udp = ServiceTable::new();
    udp.add_service(dns, SchedulerKind::Rr, None).unwrap();
    let ip = Ipv4Addr::new(198, 18, 0, 21);
    udp.add_server(dns, RealServerSpec::new(ip, 53, 1, ForwardMode::Nat))
        .unwrap();
    let mut o = Overrides::default();
    let port = CheckOverride {
        port: Some(5353),
        passive: Some(true),
        ..Default::default()
    };
    o.services.insert(dns, (port, None));
    let mut m = HealthMonitor::new(monitor(CheckKind::Tcp).cfg, SOURCE, o, 3);
    let (_, at) = run_until_event(&mut m, &udp, &mut net, 0);
    assert_eq!(m.overlay().evicted.len(), 1);
    let mut o = Overrides::default();
    let passive_only = CheckOverride {
        passive: Some(true),
        ..Default::default()
    };
    o.services.insert(dns, (passive_only, None));
    m.reconfigure(m.cfg.clone(), o);
    let events = net.tick(&mut m, &udp, at + 1);
    assert!(events[0].line().ends_with("reason=check-off"), "{events:?}");
    assert!(m.overlay().evicted.is_empty());

    // Evicted by passive detection under an active check: turning the check off
    // leaves it to the passive back-off (retry_ms, 300 ms here).
    let mut m = passively_evicted(&t, CheckKind::Tcp, 300);
    let mut send = |_: &[u8]| true;
    reload(&mut m, |c| c.defaults.kind = CheckKind::None);
    for now in 2..301 {
        assert!(m.tick(&t, now, refused(1), &mut send).0.is_empty(), "{now}");
    }
    let (events, _) = m.tick(&t, 301, refused(1), &mut send);
    assert!(
        events[0].line().ends_with("reason=backoff-300ms"),
        "{events:?}"
    );
}

/// A server passive detection evicted, with no active check, whose `passive` a reload
/// turns off: nothing watches it any more, so it is restored, and the event names what
/// was turned off.
#[test]
fn turning_passive_off_restores_what_it_evicted_as_passive_off() {
    let t = table(1);
    let mut m = passively_evicted(&t, CheckKind::None, 100_000);
    let mut send = |_: &[u8]| true;
    reload(&mut m, |c| c.defaults.passive = false);
    let (events, _) = m.tick(&t, 2, refused(1), &mut send);
    assert!(
        one_event(&events).ends_with("reason=passive-off"),
        "{events:?}"
    );
    assert!(m.overlay().evicted.is_empty());
}

/// Counts from before a reload turned passive detection on (again) are not its
/// failures: the server is judged on what happens after, and evicted by that.
#[test]
fn passive_detection_turned_on_counts_from_then_on() {
    let t = table(1);
    let cfg = HealthConfig {
        defaults: CheckSpec {
            kind: CheckKind::Tcp,
            interval_ms: 100_000,
            timeout_ms: 50,
            passive: true,
            passive_fall: 3,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut m = HealthMonitor::new(cfg, SOURCE, Overrides::default(), 5);
    let mut send = |_: &[u8]| true;
    assert!(m.tick(&t, 0, refused(0), &mut send).0.is_empty());
    reload(&mut m, |c| c.defaults.passive = false);
    // 100 refusals while passive detection is off.
    for now in 1..11 {
        assert!(m
            .tick(&t, now, refused(10 * now as u32), &mut send)
            .0
            .is_empty());
    }
    reload(&mut m, |c| c.defaults.passive = true);
    for now in 11..20 {
        let (events, _) = m.tick(&t, now, refused(100), &mut send);
        assert!(events.is_empty(), "at {now}: {events:?}");
    }
    // Three more: passive_fall.
    let (events, _) = m.tick(&t, 20, refused(103), &mut send);
    assert!(
        one_event(&events).ends_with("reason=passive-3fail"),
        "{events:?}"
    );
}

/// Reloads that re-plan every probe again and again leave the queue of due probes
/// no bigger than a small multiple of the servers, and every server keeps being
/// probed at the pace the reloads set.
#[test]
fn the_due_probes_queue_stays_small_through_replanning_reloads() {
    let t = table(20);
    let mut m = monitor(CheckKind::Tcp);
    // Nobody is evicted (which would space their probes by `retry_ms`, which the
    // reloads leave alone): every reload moves every planned probe.
    m.cfg.defaults.fall = 1000;
    let mut net = Net { sent: Vec::new() };
    let mut per_server = std::collections::BTreeMap::new();
    for now in 0..4000 {
        if now % 10 == 0 {
            // Each reload shortens the interval, from 1000 to 202 ms.
            reload(&mut m, |c| {
                c.defaults.interval_ms = 1000 - (now / 10) as u32 * 2
            });
        }
        net.tick(&mut m, &t, now);
        for syn in net.syns() {
            *per_server
                .entry(parse_segment(&syn).unwrap().to.ip())
                .or_insert(0) += 1;
        }
        assert!(
            m.due.heap.len() <= 2 * 20 + 64,
            "at {now}: {}",
            m.due.heap.len()
        );
    }
    // A probe every 1000 ms at first, every 202 ms at the end: about 9 each in 4 s.
    assert_eq!(per_server.len(), 20, "{per_server:?}");
    assert!(per_server.values().all(|&n| n >= 7), "{per_server:?}");
}

/// A probe in flight when a reload turns its check off decides nothing: an eviction
/// by it could never be undone.
#[test]
fn a_probe_whose_check_was_turned_off_meanwhile_evicts_nobody() {
    let t = table(1);
    let mut m = monitor(CheckKind::Tcp);
    m.cfg.defaults.fall = 1;
    let mut net = Net { sent: Vec::new() };
    let mut now = 0;
    while net.syns().is_empty() {
        net.tick(&mut m, &t, now);
        now += 1;
    }
    reload(&mut m, |c| {
        c.defaults.kind = CheckKind::None;
        c.defaults.passive = true;
    });
    for n in now..now + 1000 {
        assert!(net.tick(&mut m, &t, n).is_empty(), "at {n}");
    }
    assert!(m.overlay().evicted.is_empty());
}

/// The SYN times from `from` (exclusive) to `to`, answering nothing.
fn syn_times(
    m: &mut HealthMonitor,
    t: &ServiceTable,
    net: &mut Net,
    from: u64,
    to: u64,
) -> Vec<u64> {
    let mut at = Vec::new();
    for now in from..to {
        net.tick(m, t, now);
        at.extend(net.syns().iter().map(|_| now));
    }
    at
}

/// A reloaded `retry_ms` or `interval_ms` applies to the probe already planned: the
/// next one is due no later than the new value after the last one started.
#[test]
fn a_reloaded_interval_or_retry_applies_to_the_probe_already_planned() {
    let t = table(1);
    let mut net = Net { sent: Vec::new() };
    // An evicted server retried every 10 minutes; the operator reloads 300 ms.
    let mut m = monitor(CheckKind::Tcp);
    m.cfg.defaults.retry_ms = 600_000;
    let mut syns = Vec::new();
    let mut evicted_at = None;
    for now in 0..1000 {
        if !net.tick(&mut m, &t, now).is_empty() {
            evicted_at = Some(now);
            break;
        }
        syns.extend(net.syns().iter().map(|_| now));
    }
    let evicted_at = evicted_at.expect("evicted");
    let last_start = *syns.last().unwrap();
    reload(&mut m, |c| c.defaults.retry_ms = 300);
    let next = syn_times(&mut m, &t, &mut net, evicted_at + 1, evicted_at + 2000);
    assert_eq!(
        next.first(),
        Some(&(last_start + 300)),
        "last probe at {last_start}, evicted at {evicted_at}"
    );

    // An up server probed every 100 s; the operator reloads 200 ms.
    let mut m = monitor(CheckKind::Tcp);
    m.cfg.defaults.interval_ms = 100_000;
    m.cfg.defaults.fall = 1000;
    let mut first = None;
    let mut now = 0;
    while first.is_none() {
        first = syn_times(&mut m, &t, &mut net, now, now + 1).pop();
        now += 1;
    }
    let first = first.unwrap();
    reload(&mut m, |c| c.defaults.interval_ms = 200);
    let next = syn_times(&mut m, &t, &mut net, first + 100, first + 1000);
    assert_eq!(
        next,
        [200, 400, 600, 800].map(|d| first + d),
        "then every 200 ms"
    );
    // A longer setting leaves the planned probe where it was.
    reload(&mut m, |c| c.defaults.interval_ms = 5000);
    let next = syn_times(&mut m, &t, &mut net, first + 1000, first + 10_000);
    assert_eq!(next, [first + 1000, first + 6000]);
}

/// A reload that shortens the interval keeps the servers' probes apart: a probe the
/// new interval puts in the past goes at the next point of its own grid (its last
/// start plus a multiple of the interval), not at the next tick with every other.
#[test]
fn a_shortened_interval_keeps_the_probes_spread() {
    let t = table(50);
    let mut net = Net { sent: Vec::new() };
    let mut m = monitor(CheckKind::Tcp);
    m.cfg.defaults.interval_ms = 10_000;
    m.cfg.defaults.fall = 1000;
    // Each server's first probe at a random point of the first 10 s.
    let first = syn_times(&mut m, &t, &mut net, 0, 10_000);
    assert_eq!(first.len(), 50);
    syn_times(&mut m, &t, &mut net, 10_000, 15_000);
    reload(&mut m, |c| c.defaults.interval_ms = 500);
    let next = syn_times(&mut m, &t, &mut net, 15_000, 15_500);
    assert_eq!(next.len(), 50, "each server once in the new interval");
    let mut per_ms = std::collections::BTreeMap::new();
    for at in &next {
        *per_ms.entry(*at).or_insert(0) += 1;
    }
    let busiest = per_ms.values().max().copied().unwrap_or(0);
    assert!(
        busiest <= 5,
        "{busiest} probes in one millisecond: {per_ms:?}"
    );
}

/// A probe's ISN is the one thing a blind forger of a real server's answers has to
/// guess. Two monitors built alike (same seed, settings, servers, clock: all an
/// outsider can know or try) send the same SYNs from the same ports at the same
/// moments, yet with other ISNs: the ISNs come from a secret the inputs do not give.
#[test]
fn twin_monitors_send_the_same_probes_with_other_isns() {
    let t = table(4);
    let (mut a, mut b) = (monitor(CheckKind::Tcp), monitor(CheckKind::Tcp));
    let (mut net_a, mut net_b) = (Net { sent: Vec::new() }, Net { sent: Vec::new() });
    let mut probes = 0;
    for now in 0..1000 {
        net_a.tick(&mut a, &t, now);
        net_b.tick(&mut b, &t, now);
        let (syns_a, syns_b) = (net_a.syns(), net_b.syns());
        assert_eq!(syns_a.len(), syns_b.len(), "at {now} ms");
        for (fa, fb) in syns_a.iter().zip(&syns_b) {
            let (sa, sb) = (parse_segment(fa).unwrap(), parse_segment(fb).unwrap());
            assert_eq!((sa.from, sa.to), (sb.from, sb.to), "at {now} ms");
            assert_ne!(sa.seq, sb.seq, "probe {probes} from {}", sa.from);
            probes += 1;
        }
    }
    assert!(probes >= 12, "{probes} probes");
}

/// With more probes due than source ports, the ports all in flight, the due probes
/// wait for the ports the timeouts free, the longest due first: every server gets its
/// share (none waits behind others due again and again), no port and no server has
/// two probes at once, and a tick spent waiting counts one skipped probe, not one per
/// waiting server.
#[test]
fn when_every_source_port_is_in_flight_due_probes_wait_for_one() {
    let t = table(10);
    let mut m = monitor(CheckKind::Tcp);
    let mut cfg = m.cfg.clone();
    cfg.source_ports = 61000..=61003;
    // Nobody is evicted (which would slow their probes to `retry_ms`): the demand
    // stays 10 servers every 100 ms, each probe holding its port for the 50 ms
    // timeout, 5 ports' worth for 4.
    cfg.defaults.fall = 1000;
    m = HealthMonitor::new(cfg, SOURCE, Overrides::default(), 42);
    let mut net = Net { sent: Vec::new() };
    // (tick, source port, server) of every probe; none is answered.
    let mut probes = Vec::new();
    for now in 0..2000 {
        let skipped = m.stats.probes_skipped;
        net.tick(&mut m, &t, now);
        assert!(
            m.stats.probes_skipped <= skipped + 1,
            "at {now}: {:?}",
            m.stats
        );
        for syn in net.syns() {
            let seg = parse_segment(&syn).unwrap();
            probes.push((now, seg.from.port(), seg.to.ip()));
        }
    }
    let overlapping =
        |a: &(u64, u16, IpAddr), b: &(u64, u16, IpAddr)| a.0 < b.0 + 50 && b.0 < a.0 + 50;
    for (i, a) in probes.iter().enumerate() {
        assert!((61000..=61003).contains(&a.1));
        for b in &probes[i + 1..] {
            assert!(
                !(a.1 == b.1 && overlapping(a, b)),
                "port {} twice: {a:?} {b:?}",
                a.1
            );
            assert!(
                !(a.2 == b.2 && overlapping(a, b)),
                "server {} twice: {a:?} {b:?}",
                a.2
            );
        }
    }
    let mut per_server = std::collections::BTreeMap::new();
    for p in &probes {
        *per_server.entry(p.2).or_insert(0) += 1;
    }
    // The ports allow about 80 probes a second, 8 a server a second.
    assert_eq!(per_server.len(), 10, "{per_server:?}");
    assert!(per_server.values().all(|&n| n >= 12), "{per_server:?}");
    assert!(
        m.stats.probes_skipped > 0,
        "the ports ran out: {:?}",
        m.stats
    );
}

/// The overlay is given again only when it changed: at the start and after a tick
/// with an eviction or restoration (here also one a reconfiguration makes); not after
/// quiet ticks nor after a change of the table that evicts nobody, and not within
/// `OVERLAY_SPACING_MS` of the last time it was given (a change then waits for the
/// spacing, not for another change). Each time it is given, it is the overlay of that
/// moment.
#[test]
fn the_overlay_is_given_again_only_when_it_may_have_changed() {
    let mut t = table(2);
    let mut m = monitor(CheckKind::Tcp);
    let mut net = Net { sent: Vec::new() };
    assert_eq!(m.overlay_if_changed(0), Some(HealthOverlay::default()));
    assert_eq!(m.overlay_if_changed(0), None);
    net.tick(&mut m, &t, 100);
    assert_eq!(
        m.overlay_if_changed(100),
        None,
        "the table, seen for the first time, evicts nobody"
    );
    // (tick, evicted then) of each eviction and of each overlay given.
    let (mut evictions, mut given_at) = (Vec::new(), Vec::new());
    for now in 101..1100 {
        let events = net.tick(&mut m, &t, now);
        if !events.is_empty() {
            evictions.push((now, m.overlay().evicted.len()));
        }
        if let Some(given) = m.overlay_if_changed(now) {
            assert_eq!(given, m.overlay(), "at {now}");
            given_at.push((now, given.evicted.len()));
        }
    }
    assert_eq!(m.overlay().evicted.len(), 2, "unanswered probes evict");
    assert!(!evictions.is_empty());
    // Every eviction is given: at once when the last overlay was given at least the
    // spacing before, else at the first tick the spacing allows; nothing else is.
    let mut last = 0;
    let mut expected = Vec::new();
    for &(at, evicted) in &evictions {
        let due = at.max(last + OVERLAY_SPACING_MS);
        match expected.last_mut() {
            Some((when, n)) if *when >= at => *n = evicted,
            _ => {
                expected.push((due, evicted));
                last = due;
            }
        }
    }
    assert_eq!(given_at, expected, "evictions {evictions:?}");
    let spec = RealServerSpec::new(Ipv4Addr::new(198, 18, 0, 40), 8080, 1, ForwardMode::Nat);
    t.add_server(key(), spec).unwrap();
    net.tick(&mut m, &t, 1200);
    assert_eq!(m.overlay_if_changed(1200), None, "a change of the table");
    // A reload turns the check off: both evicted servers are restored, given at once
    // (the table's change just before held nothing back).
    reload(&mut m, |c| c.defaults.kind = CheckKind::None);
    assert_eq!(
        net.tick(&mut m, &t, 1250).len(),
        2,
        "check-off restorations"
    );
    assert_eq!(
        m.overlay_if_changed(1250),
        Some(HealthOverlay::default()),
        "the restorations"
    );
    assert_eq!(m.overlay_if_changed(1400), None, "nothing since");
}

/// Passive detection on for one server of many watched ones: the tick reads that
/// one's counts (looked up by id: the others are not walked for counts), evicts it on
/// them, and the back-off restores it.
#[test]
fn passive_detection_on_one_server_of_many_judges_that_one() {
    let t = table(20);
    let watched = Ipv4Addr::new(198, 18, 0, 25);
    let watched_id = t
        .get(key())
        .unwrap()
        .real_servers
        .iter()
        .find(|r| r.ip == IpAddr::V4(watched))
        .unwrap()
        .id;
    let mut o = Overrides::default();
    o.servers.insert(
        (key(), IpAddr::V4(watched), 8080),
        CheckOverride {
            kind: Some(CheckKind::None),
            passive: Some(true),
            ..Default::default()
        },
    );
    // The others have an active check that evicts nobody.
    let cfg = HealthConfig {
        defaults: CheckSpec {
            kind: CheckKind::Tcp,
            interval_ms: 100_000,
            timeout_ms: 50,
            fall: 1000,
            passive_fall: 3,
            retry_ms: 1000,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut m = HealthMonitor::new(cfg, SOURCE, o, 7);
    let mut send = |_: &[u8]| true;
    let read = std::cell::RefCell::new(Vec::new());
    let refused = |n: u32| {
        let read = &read;
        move |id: u32| {
            read.borrow_mut().push(id);
            PassiveTotals {
                refused: n,
                ..Default::default()
            }
        }
    };
    assert!(m.tick(&t, 0, refused(0), &mut send).0.is_empty());
    assert_eq!(m.report(0).len(), 20, "all are watched");
    assert!(m.tick(&t, 1, refused(2), &mut send).0.is_empty());
    let (events, _) = m.tick(&t, 2, refused(3), &mut send);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0].line(),
        "lb=evict svc=198.18.1.1:80/tcp rs=198.18.0.25:8080 reason=passive-3fail"
    );
    let (events, _) = m.tick(&t, 1002, refused(3), &mut send);
    assert!(
        one_event(&events).ends_with("reason=backoff-1000ms"),
        "{events:?}"
    );
    assert_eq!(
        *read.borrow(),
        [watched_id; 4],
        "its counts only, once a tick"
    );
}

/// Many servers evicted over many ticks (an outage) give one overlay every
/// `OVERLAY_SPACING_MS`, not one a tick, and the last one given holds them all.
#[test]
fn an_outage_of_many_servers_gives_an_overlay_at_most_every_spacing() {
    let t = table(100);
    let mut m = monitor(CheckKind::Tcp);
    let mut net = Net { sent: Vec::new() };
    let (mut ticks_with_evictions, mut given_at) = (0, Vec::new());
    let mut last_given = None;
    for now in 0..2000 {
        if !net.tick(&mut m, &t, now).is_empty() {
            ticks_with_evictions += 1;
        }
        if let Some(given) = m.overlay_if_changed(now) {
            given_at.push(now);
            last_given = Some(given);
        }
    }
    assert_eq!(m.overlay().evicted.len(), 100);
    assert_eq!(last_given.unwrap().evicted.len(), 100);
    // The first probes spread over 100 ms, evictions over about as long again.
    assert!(ticks_with_evictions >= 20, "{ticks_with_evictions}");
    assert!(
        given_at
            .windows(2)
            .all(|w| w[1] - w[0] >= OVERLAY_SPACING_MS),
        "{given_at:?}"
    );
    assert!(given_at.len() <= 5, "{given_at:?}");
}

/// Each probe's ISN reaches the workers' filter before its SYN is handed to them, and
/// every answer the probe reads (the SYN-ACK, the server's data after a long request)
/// passes that filter; the next probe from the port takes the place of the last.
#[test]
fn the_workers_let_through_every_answer_a_probe_reads_and_learn_it_before_the_syn() {
    let t = table(1);
    // One source port: every probe goes out from it.
    let port = 61000;
    let acks = Arc::new(ProbeAcks::new(port..=port));
    let path = format!("/{}", "p".repeat(300));
    let cfg = HealthConfig {
        defaults: CheckSpec {
            kind: CheckKind::Http,
            interval_ms: 100,
            timeout_ms: 50,
            path: path.clone(),
            ..Default::default()
        },
        source_ports: port..=port,
        ..Default::default()
    };
    let mut m = HealthMonitor::new(cfg, SOURCE, Overrides::default(), 42)
        .with_probe_acks(Arc::clone(&acks));
    let passes = |f: &[u8]| {
        let seg = parse_segment(f).unwrap();
        acks.answers(seg.to.port(), seg.flags, seg.ack)
    };
    let mut syns = Vec::new();
    for now in 0..300 {
        let mut sent = Vec::new();
        let mut send = |f: &[u8]| {
            // The filter already knows the probe: its SYN-ACK would pass.
            let synack = answer(f, TcpFlags::SYN | TcpFlags::ACK, &[]);
            assert!(passes(&synack), "an ISN published after its SYN");
            sent.push(f.to_vec());
            true
        };
        m.tick(&t, now, |_| PassiveTotals::default(), &mut send);
        for syn in sent {
            let synack = answer(&syn, TcpFlags::SYN | TcpFlags::ACK, &[]);
            let mut request = Vec::new();
            let mut capture = |f: &[u8]| {
                request.push(f.to_vec());
                true
            };
            m.on_frame(&synack, now, &mut capture);
            let req = parse_segment(&request[0]).unwrap();
            assert!(
                req.payload.len() > path.len(),
                "the request carries the path"
            );
            let data = server_data(&req, b"HTTP/1.0 200 OK\r\n\r\n");
            assert!(
                passes(&data),
                "the server's data, acknowledging the request"
            );
            let mut ignore = |_: &[u8]| true;
            m.on_frame(&data, now, &mut ignore);
            let ack = req.seq.wrapping_add(req.payload.len() as u32);
            for wrong in [ack.wrapping_add(ProbeAcks::SPAN), ack ^ 0x8000_0000] {
                assert!(!acks.answers(port, TcpFlags::ACK, wrong), "ack {wrong}");
            }
            syns.push(syn);
        }
    }
    assert!(syns.len() >= 2, "{} probes", syns.len());
    assert_eq!(m.stats.probes_timed_out, 0, "every probe was answered");
    // The first probe's answer no longer passes: the port sent others since.
    assert!(!passes(&answer(
        &syns[0],
        TcpFlags::SYN | TcpFlags::ACK,
        &[]
    )));
}
