//! Persistence templates over sync: the active node sends its persistence templates to the standby too.
//!
//! Templates live in the [`PersistTable`] every worker shares, so the management core
//! tells the peers about them, not the packet path: a [`TemplateTracker`] scans the
//! table a slice per management tick and picks the templates that are new, changed
//! (real server or expiry) since it last sent them, or unchanged for a while (a lost
//! datagram heals); a peer's templates go straight into this node's table
//! ([`apply`]), the management core being just another writer of that lock-free
//! table. Messages carry identities, not ids: [`ServicesById::record`] and
//! [`identify`] map between the two through each node's own [`ServiceTable`]. IPv4
//! and IPv6 templates (the table's two halves) travel alike, each in a record of its
//! family; a [`TemplateId`] names one of either.
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::model::{Service, ServiceKey};
use crate::service::ServiceTable;
use crate::session::persist::{
    later_tick, prefix_mask6, Bind, PersistTable, Template, TemplateKey, TemplateKey6, Trust,
};
use crate::session::replication::{RecordOp, RecordRepr};

/// One template of the shared table: of an IPv4 service or of an IPv6 one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TemplateId {
    V4(TemplateKey),
    V6(TemplateKey6),
}

impl From<TemplateKey> for TemplateId {
    fn from(key: TemplateKey) -> TemplateId {
        TemplateId::V4(key)
    }
}

impl From<TemplateKey6> for TemplateId {
    fn from(key: TemplateKey6) -> TemplateId {
        TemplateId::V6(key)
    }
}

impl TemplateId {
    /// The live template of this id in `table` at `now`.
    pub fn lookup(self, table: &PersistTable, now: u32) -> Option<Template> {
        match self {
            TemplateId::V4(key) => table.lookup(key, now),
            TemplateId::V6(key) => table.lookup6(key, now),
        }
    }

    fn bind(self, table: &PersistTable, template: Template, now: u32) -> Bind {
        match self {
            TemplateId::V4(key) => table.bind(key, template, now),
            TemplateId::V6(key) => table.bind6(key, template, now),
        }
    }

    fn refresh(self, table: &PersistTable, expires: u32, now: u32) {
        match self {
            TemplateId::V4(key) => table.refresh(key, expires, now),
            TemplateId::V6(key) => table.refresh6(key, expires, now),
        }
    }

    fn remove(self, table: &PersistTable) {
        match self {
            TemplateId::V4(key) => table.remove(key),
            TemplateId::V6(key) => table.remove6(key),
        }
    }
}

/// This node's services by id, to map many templates at once.
pub struct ServicesById<'a>(HashMap<u32, &'a Service>);

impl<'a> ServicesById<'a> {
    pub fn new(table: &'a ServiceTable) -> ServicesById<'a> {
        ServicesById(table.services().map(|s| (s.id, s)).collect())
    }

    /// The update record of `key`'s template at `now` (session-clock ticks of
    /// `tick_ms`): the time left in milliseconds, the service and real server by
    /// address. None when the template expired or is unconfirmed (a handshake in
    /// flight, perhaps a spoofed SYN's: the peer hears of it once its connection
    /// raises it, and installs what it hears as [`Trust::Unverified`]: its trust does
    /// not travel), or its service, the service's
    /// persistence or its real server are gone, or the network no longer fits the
    /// service's netmask (edited since): the peer would reject the whole message.
    pub fn record(
        &self,
        key: impl Into<TemplateId>,
        template: Template,
        now: u32,
        tick_ms: u32,
    ) -> Option<RecordRepr> {
        if !template.is_live(now) || template.trust < Trust::Unverified {
            return None;
        }
        let key = key.into();
        let service_id = match key {
            TemplateId::V4(k) => k.service,
            TemplateId::V6(k) => k.service,
        };
        let service = self.0.get(&service_id)?;
        let persistence = service.persistence?;
        let rs = service.pinnable_server_by_id(template.real)?;
        let left_ms = u64::from(template.expires.wrapping_sub(now)) * u64::from(tick_ms);
        let left_ms = left_ms.min(u64::from(u32::MAX)) as u32;
        match (key, service.key.vip) {
            (TemplateId::V4(key), IpAddr::V4(vip)) => {
                let mask = u32::from(persistence.netmask);
                if !persistence.netmask_is_contiguous() || key.network & !mask != 0 {
                    return None;
                }
                let IpAddr::V4(rip) = rs.ip else {
                    return None;
                };
                Some(RecordRepr::template(
                    RecordOp::Update,
                    service.key.proto,
                    SocketAddrV4::new(vip, service.key.port),
                    Ipv4Addr::from(key.network),
                    mask.leading_ones() as u8,
                    SocketAddrV4::new(rip, rs.port),
                    rs.mode,
                    left_ms,
                ))
            }
            (TemplateId::V6(key), IpAddr::V6(vip)) => {
                let prefix = persistence.prefix6.min(128);
                if u128::from(key.network) & !prefix_mask6(prefix) != 0 {
                    return None;
                }
                Some(RecordRepr::template6(
                    RecordOp::Update,
                    service.key.proto,
                    SocketAddrV6::new(vip, service.key.port, 0, 0),
                    key.network,
                    prefix,
                    SocketAddr::new(rs.ip, rs.port),
                    rs.mode,
                    left_ms,
                ))
            }
            // A service whose address family changed under the template.
            _ => None,
        }
    }
}

/// Why a received template record was not installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// No such virtual service here (the receiver's checks make this rare).
    NoService,
    /// The service here has no persistence.
    NotPersistent,
    /// The service here persists per another netmask: the network means nothing here.
    OtherNetmask,
    /// The real server is not in the service here.
    UnknownReal,
    /// Less than one tick left.
    Expired,
}

/// Which of this node's templates a template record names, and for an update what it
/// becomes at `now`: `expires = now + timeout / tick_ms` (rounded down, so the copy
/// never outlives the original by more than the transit time). `None` for a removal.
/// The record's prefix length must be the service's here: its netmask (IPv4), or its
/// IPv6 prefix length (`-M` of an IPv6 service).
pub fn identify(
    table: &ServiceTable,
    record: &RecordRepr,
    now: u32,
    tick_ms: u32,
) -> Result<(TemplateId, Option<Template>), Skip> {
    let vs = record.virtual_service;
    let service = table
        .get(ServiceKey::new(record.proto, vs.ip(), vs.port()))
        .ok_or(Skip::NoService)?;
    let persistence = service.persistence.ok_or(Skip::NotPersistent)?;
    let key = match record.client.ip() {
        IpAddr::V4(network) => {
            if !persistence.netmask_is_contiguous()
                || u32::from(persistence.netmask).leading_ones()
                    != u32::from(record.client_prefix_len)
            {
                return Err(Skip::OtherNetmask);
            }
            TemplateId::V4(TemplateKey {
                service: service.id,
                network: u32::from(network),
            })
        }
        IpAddr::V6(network) => {
            if persistence.prefix6.min(128) != record.client_prefix_len {
                return Err(Skip::OtherNetmask);
            }
            TemplateId::V6(TemplateKey6::new(
                service.id,
                network,
                record.client_prefix_len,
            ))
        }
    };
    if record.op == RecordOp::Remove {
        return Ok((key, None));
    }
    let rs = service
        .pinnable_server(record.real_server.ip(), record.real_server.port())
        .ok_or(Skip::UnknownReal)?;
    let ticks = record.timeout_ms / tick_ms.max(1);
    if ticks == 0 {
        return Err(Skip::Expired);
    }
    Ok((
        key,
        // The peer's trust in it does not travel: as high as can be taken on its word.
        Some(Template::new(
            rs.id,
            now.wrapping_add(ticks),
            Trust::Unverified,
        )),
    ))
}

/// What [`apply`] did to this node's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// No live template for the network: the peer's is installed.
    Created,
    /// A live template to the same real server: it now expires at the later time.
    Refreshed,
    /// A live template to another real server expired sooner: the peer's replaces it.
    Replaced,
    /// A live template to another real server expires later: it stays (the later
    /// template wins on both nodes, as each sends its own).
    Kept,
    /// Removed (a removal record).
    Removed,
    /// A worker was writing the slot: nothing recorded (the peer resends).
    Busy,
}

/// Installs a peer's template for `key` (`None`: removes it) into `table` at `now`.
pub fn apply(
    table: &PersistTable,
    key: impl Into<TemplateId>,
    template: Option<Template>,
    now: u32,
) -> Applied {
    let key = key.into();
    let Some(template) = template else {
        key.remove(table);
        return Applied::Removed;
    };
    match key.bind(table, template, now) {
        Bind::Created | Bind::CreatedEvicting => Applied::Created,
        // A full bucket of confirmed templates keeps them: the peer resends.
        Bind::Busy | Bind::NoRoom => Applied::Busy,
        Bind::Raised => Applied::Refreshed,
        Bind::Existing(real) if real == template.real => {
            key.refresh(table, template.expires, now);
            Applied::Refreshed
        }
        Bind::Existing(_) => {
            // Kept when it expires later and this node tells its peers of it (an
            // unconfirmed one it does not: the two would never settle).
            match key.lookup(table, now) {
                Some(local)
                    if local.trust >= Trust::Unverified
                        && later_tick(template.expires, local.expires) == local.expires =>
                {
                    Applied::Kept
                }
                _ => {
                    key.remove(table);
                    match key.bind(table, template, now) {
                        Bind::Created | Bind::CreatedEvicting => Applied::Replaced,
                        _ => Applied::Busy,
                    }
                }
            }
        }
    }
}

/// What the tracker last knew of a template.
#[derive(Clone, Copy, Debug)]
struct Known {
    real: u32,
    expires: u32,
    /// Tick it was last sent or received.
    at: u32,
    /// The pass that last saw it in the table.
    seen: u32,
    /// Installed from a peer and unchanged here since: neither echoed back nor resent.
    from_peer: bool,
}

/// Which templates to send: the table (its IPv4 slots, then its IPv6 ones) is scanned
/// a slice per call, a whole pass every `ticks_per_pass` calls; a live template standing at least unverified is due when it is new, its real server or
/// expiry changed since it was last sent, or `resend_ticks` passed since then. What
/// it remembers (one entry per live template it sent or received) is dropped for
/// templates a whole pass did not see (expired, removed, evicted). Management core
/// only: a plain map.
#[derive(Debug)]
pub struct TemplateTracker {
    known: HashMap<TemplateId, Known>,
    cursor: usize,
    pass: u32,
    slots_per_tick: usize,
    resend_ticks: u32,
}

impl TemplateTracker {
    /// For `table` (its [`PersistTable::capacity`] and
    /// [`PersistTable::capacity6`] slots).
    pub fn new(table: &PersistTable, ticks_per_pass: usize, resend_ticks: u32) -> TemplateTracker {
        let slots = table.capacity() + table.capacity6();
        TemplateTracker {
            known: HashMap::new(),
            cursor: 0,
            pass: 0,
            slots_per_tick: slots.div_ceil(ticks_per_pass.max(1)).max(1),
            resend_ticks: resend_ticks.max(1),
        }
    }

    /// Templates remembered.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Scans the next slice of `table` at `now`, calling `send` for every template
    /// due; `send` says whether it went out (false: it cannot be described, e.g. its
    /// real server left: it is tried again next pass). Returns how many went out.
    pub fn scan(
        &mut self,
        table: &PersistTable,
        now: u32,
        mut send: impl FnMut(TemplateId, Template) -> bool,
    ) -> usize {
        let (v4, total) = (table.capacity(), table.capacity() + table.capacity6());
        let start = self.cursor.min(total);
        let end = (start + self.slots_per_tick).min(total);
        let live4 = table
            .live_in(start.min(v4)..end.min(v4), now)
            .map(|(k, t)| (TemplateId::V4(k), t));
        let live6 = table
            .live6_in(start.max(v4) - v4..end.max(v4) - v4, now)
            .map(|(k, t)| (TemplateId::V6(k), t));
        let mut sent = 0;
        // An unconfirmed template is a handshake in flight, perhaps a spoofed SYN's:
        // the peer hears of it once its connection raises it.
        let told = |(_, t): &(TemplateId, Template)| t.trust >= Trust::Unverified;
        for (key, t) in live4.chain(live6).filter(told) {
            let due = match self.known.get_mut(&key) {
                None => true,
                Some(k) => {
                    k.seen = self.pass;
                    k.real != t.real
                        || k.expires != t.expires
                        || (!k.from_peer && now.wrapping_sub(k.at) >= self.resend_ticks)
                }
            };
            if due && send(key, t) {
                sent += 1;
                self.known.insert(
                    key,
                    Known {
                        real: t.real,
                        expires: t.expires,
                        at: now,
                        seen: self.pass,
                        from_peer: false,
                    },
                );
            }
        }
        self.cursor = end;
        if self.cursor >= total {
            let pass = self.pass;
            self.known.retain(|_, k| k.seen == pass);
            self.pass = pass.wrapping_add(1);
            self.cursor = 0;
        }
        sent
    }

    /// `key`'s template as this node's table holds it after a peer's record was
    /// applied: the peer knows it, so it is not sent back unless it changes here.
    pub fn received(&mut self, key: impl Into<TemplateId>, template: Template, now: u32) {
        self.known.insert(
            key.into(),
            Known {
                real: template.real,
                expires: template.expires,
                at: now,
                seen: self.pass,
                from_peer: true,
            },
        );
    }

    /// Forgets `key`: if a template for it lives, it is sent at the next pass.
    pub fn forget(&mut self, key: impl Into<TemplateId>) {
        self.known.remove(&key.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;
    use crate::model::SchedulerKind;
    use crate::model::{ForwardMode, Persistence, RealServerSpec, SorryServerSpec};
    use crate::session::replication::{RecordKind, MAX_TIMEOUT_MS};
    use std::net::Ipv6Addr;

    const VIP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
    const RS1: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 21);
    const RS2: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 22);
    const NET: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 0);

    fn service_key() -> ServiceKey {
        ServiceKey::new(Protocol::Tcp, VIP, 80)
    }

    /// A node's table: a decoy service first (so ids differ between nodes when
    /// `decoys` differ), then the persistent service with its real servers in order.
    fn node(decoys: u8, netmask: Ipv4Addr, servers: &[Ipv4Addr]) -> ServiceTable {
        let mut table = ServiceTable::new();
        for d in 0..decoys {
            let k = ServiceKey::new(Protocol::Udp, Ipv4Addr::new(203, 0, 113, 100 + d), 53);
            table.add_service(k, SchedulerKind::Rr, None).unwrap();
            table
                .add_server(
                    k,
                    RealServerSpec::new(Ipv4Addr::new(10, 9, 0, d), 53, 1, ForwardMode::Dr),
                )
                .unwrap();
        }
        let persistence = Persistence {
            netmask,
            ..Persistence::new(300)
        };
        table
            .add_service(service_key(), SchedulerKind::Rr, Some(persistence))
            .unwrap();
        for &ip in servers {
            table
                .add_server(
                    service_key(),
                    RealServerSpec::new(ip, 8080, 1, ForwardMode::Nat),
                )
                .unwrap();
        }
        table
    }

    fn ids(table: &ServiceTable, rs: Ipv4Addr) -> (u32, u32) {
        let s = table.get(service_key()).unwrap();
        let r = s.real_servers.iter().find(|r| r.ip == rs).unwrap();
        (s.id, r.id)
    }

    const MASK24: Ipv4Addr = Ipv4Addr::new(255, 255, 255, 0);

    #[test]
    fn a_template_maps_to_the_peers_own_ids_by_identity() {
        let active = node(0, MASK24, &[RS1, RS2]);
        let standby = node(2, MASK24, &[RS2, RS1]);
        let (service, real) = ids(&active, RS2);
        let key = TemplateKey {
            service,
            network: u32::from(NET),
        };
        // 600 ticks of 100 ms left.
        let template = Template::new(real, 1000 + 600, Trust::Unverified);
        let record = ServicesById::new(&active)
            .record(key, template, 1000, 100)
            .unwrap();
        assert_eq!(record.kind, RecordKind::Template);
        assert_eq!(record.op, RecordOp::Update);
        assert_eq!(record.client, SocketAddrV4::new(NET, 0).into());
        assert_eq!(record.client_prefix_len, 24);
        assert_eq!(record.virtual_service, SocketAddrV4::new(VIP, 80).into());
        assert_eq!(record.real_server, SocketAddrV4::new(RS2, 8080).into());
        assert_eq!(record.mode, ForwardMode::Nat);
        assert_eq!(record.timeout_ms, 60_000);
        // An unconfirmed template (a handshake in flight) is not told, live or dumped.
        let unconfirmed = Template::new(real, 1000 + 600, Trust::Unconfirmed);
        assert_eq!(
            ServicesById::new(&active).record(key, unconfirmed, 1000, 100),
            None
        );

        // On the standby (other ids, another tick clock and tick length).
        let (service2, real2) = ids(&standby, RS2);
        assert_ne!((service, real), (service2, real2));
        let (k, t) = identify(&standby, &record, 50, 10).unwrap();
        assert_eq!(
            k,
            TemplateId::V4(TemplateKey {
                service: service2,
                network: u32::from(NET)
            })
        );
        assert_eq!(t, Some(Template::new(real2, 50 + 6000, Trust::Unverified)));
        // A removal needs no real server.
        let removal = RecordRepr {
            op: RecordOp::Remove,
            ..record
        };
        assert_eq!(identify(&standby, &removal, 50, 10), Ok((k, None)));
        // Rounded down: 59 999 ms of 100 ms ticks are 599 ticks.
        let short = RecordRepr {
            timeout_ms: 59_999,
            ..record
        };
        assert_eq!(
            identify(&standby, &short, 0, 100)
                .unwrap()
                .1
                .unwrap()
                .expires,
            599
        );
        // Huge timeouts stay within the wire's limit.
        let far = Template::new(real, 1000 + (1 << 30), Trust::Unverified);
        let r = ServicesById::new(&active)
            .record(key, far, 1000, 100)
            .unwrap();
        assert_eq!(r.timeout_ms, MAX_TIMEOUT_MS);
    }

    #[test]
    fn templates_that_cannot_be_described_or_placed_are_skipped() {
        let active = node(0, MASK24, &[RS1, RS2]);
        let (service, real) = ids(&active, RS2);
        let key = TemplateKey {
            service,
            network: u32::from(NET),
        };
        let template = Template::new(real, 1600, Trust::Unverified);
        let by_id = ServicesById::new(&active);
        assert!(by_id.record(key, template, 1600, 100).is_none(), "expired");
        assert!(by_id
            .record(TemplateKey { service: 99, ..key }, template, 1000, 100)
            .is_none());
        assert!(by_id
            .record(
                key,
                Template {
                    real: 99,
                    ..template
                },
                1000,
                100
            )
            .is_none());
        // The netmask was edited to /16 since: the /24 network has host bits now.
        let mut edited = active.clone();
        edited
            .edit_service(
                service_key(),
                SchedulerKind::Rr,
                Some(Persistence {
                    netmask: Ipv4Addr::new(255, 255, 0, 0),
                    ..Persistence::new(300)
                }),
            )
            .unwrap();
        let odd = TemplateKey {
            network: u32::from(Ipv4Addr::new(198, 51, 100, 0)),
            ..key
        };
        assert!(ServicesById::new(&edited)
            .record(odd, template, 1000, 100)
            .is_none());
        let record = by_id.record(key, template, 1000, 100).unwrap();

        // The receiving side.
        let only_rs1 = node(0, MASK24, &[RS1]);
        assert_eq!(identify(&only_rs1, &record, 0, 100), Err(Skip::UnknownReal));
        let per_client = node(0, Ipv4Addr::BROADCAST, &[RS1, RS2]);
        assert_eq!(
            identify(&per_client, &record, 0, 100),
            Err(Skip::OtherNetmask)
        );
        let mut plain = node(0, MASK24, &[RS1, RS2]);
        plain
            .edit_service(service_key(), SchedulerKind::Rr, None)
            .unwrap();
        assert_eq!(identify(&plain, &record, 0, 100), Err(Skip::NotPersistent));
        assert_eq!(
            identify(&ServiceTable::new(), &record, 0, 100),
            Err(Skip::NoService)
        );
        let brief = RecordRepr {
            timeout_ms: 99,
            ..record
        };
        assert_eq!(identify(&active, &brief, 0, 100), Err(Skip::Expired));
    }

    fn k(network: u32) -> TemplateKey {
        TemplateKey {
            service: 1,
            network,
        }
    }

    fn t(real: u32, expires: u32) -> Template {
        Template::new(real, expires, Trust::Unverified)
    }

    #[test]
    fn applying_a_peers_template() {
        let table = PersistTable::with_capacity(64);
        assert_eq!(apply(&table, k(1), Some(t(7, 100)), 0), Applied::Created);
        assert_eq!(table.lookup(k(1), 0), Some(t(7, 100)));
        // Same real server: the later expiry wins, never shortened.
        assert_eq!(apply(&table, k(1), Some(t(7, 150)), 10), Applied::Refreshed);
        assert_eq!(apply(&table, k(1), Some(t(7, 120)), 10), Applied::Refreshed);
        assert_eq!(table.lookup(k(1), 10), Some(t(7, 150)));
        // Another real server: the later template wins.
        assert_eq!(apply(&table, k(1), Some(t(8, 140)), 10), Applied::Kept);
        assert_eq!(table.lookup(k(1), 10), Some(t(7, 150)));
        assert_eq!(apply(&table, k(1), Some(t(8, 200)), 10), Applied::Replaced);
        assert_eq!(table.lookup(k(1), 10), Some(t(8, 200)));
        assert_eq!(apply(&table, k(1), None, 10), Applied::Removed);
        assert_eq!(table.lookup(k(1), 10), None);
        // An expired local template is simply replaced.
        apply(&table, k(2), Some(t(3, 20)), 10);
        assert_eq!(apply(&table, k(2), Some(t(4, 90)), 30), Applied::Created);
    }

    /// Scans whole passes (`ticks` calls each) and returns what was sent.
    fn passes(
        tracker: &mut TemplateTracker,
        table: &PersistTable,
        now: u32,
        n: usize,
    ) -> Vec<(TemplateId, Template)> {
        let mut out = Vec::new();
        for _ in 0..n * 8 {
            tracker.scan(table, now, |k, t| {
                out.push((k, t));
                true
            });
        }
        out
    }

    #[test]
    fn the_tracker_sends_what_is_new_or_changed_and_resends_the_rest_periodically() {
        // Buckets are seeded at random: 10 templates in 1024 four-way buckets never
        // find one full (in 16 they would about once in 300 runs).
        let table = PersistTable::with_capacity(4096);
        // 8 calls per pass; resend after 100 ticks.
        let mut tracker = TemplateTracker::new(&table, 8, 100);
        for n in 0..10 {
            table.bind(k(n), t(n, 1000), 0);
        }
        let sent = passes(&mut tracker, &table, 0, 1);
        assert_eq!(sent.len(), 10, "every new template once");
        assert_eq!(tracker.len(), 10);
        assert!(passes(&mut tracker, &table, 50, 2).is_empty(), "unchanged");

        // One refreshed (a new connection used it): sent again, once.
        table.refresh(k(3), 1200, 60);
        assert_eq!(
            passes(&mut tracker, &table, 60, 2),
            [(k(3).into(), t(3, 1200))]
        );
        // One re-pinned to another real server.
        table.remove(k(4));
        table.bind(k(4), t(9, 1100), 70);
        assert_eq!(
            passes(&mut tracker, &table, 70, 1),
            [(k(4).into(), t(9, 1100))]
        );

        // 100 ticks after they were sent, the unchanged ones go again.
        let again = passes(&mut tracker, &table, 100, 1);
        assert_eq!(again.len(), 8, "all but the two sent at 60 and 70");
        assert!(passes(&mut tracker, &table, 120, 1).is_empty());

        // Gone templates are forgotten after a pass that did not see them.
        table.remove(k(0));
        passes(&mut tracker, &table, 130, 2);
        assert_eq!(tracker.len(), 9);
        // Expired ones too.
        assert!(passes(&mut tracker, &table, 1000, 2).len() == 2);
        assert_eq!(tracker.len(), 2, "only the two that expire later");
    }

    /// A peer's template to another real server replaces a local unconfirmed one even
    /// when that one expires later: the local one is never sent, so the two nodes
    /// would otherwise never settle on one.
    #[test]
    fn a_peers_template_replaces_a_local_unconfirmed_one() {
        let table = PersistTable::with_capacity(64);
        table.bind(k(2), Template::new(7, 900, Trust::Unconfirmed), 0);
        assert_eq!(apply(&table, k(2), Some(t(8, 500)), 10), Applied::Replaced);
        assert_eq!(table.lookup(k(2), 10), Some(t(8, 500)));
        // A local one the peer hears of, expiring later, is kept.
        assert_eq!(apply(&table, k(2), Some(t(9, 400)), 10), Applied::Kept);
    }

    /// An unconfirmed template (a handshake in flight, perhaps a spoofed SYN's) is not
    /// sent; once its connection raises it, it is, at the next pass.
    #[test]
    fn the_tracker_sends_a_template_once_it_is_raised() {
        let table = PersistTable::with_capacity(64);
        let mut tracker = TemplateTracker::new(&table, 8, 100);
        table.bind(k(1), Template::new(5, 1000, Trust::Unconfirmed), 0);
        assert!(passes(&mut tracker, &table, 0, 2).is_empty());
        assert_eq!(tracker.len(), 0);
        assert_eq!(table.bind(k(1), t(5, 900), 10), Bind::Raised);
        assert_eq!(
            passes(&mut tracker, &table, 10, 1),
            [(k(1).into(), t(5, 1000))]
        );
    }

    #[test]
    fn the_tracker_does_not_echo_a_peers_templates_and_retries_unsendable_ones() {
        let table = PersistTable::with_capacity(64);
        let mut tracker = TemplateTracker::new(&table, 8, 100);
        assert_eq!(apply(&table, k(1), Some(t(5, 500)), 0), Applied::Created);
        tracker.received(k(1), table.lookup(k(1), 0).unwrap(), 0);
        assert!(passes(&mut tracker, &table, 0, 1).is_empty(), "not echoed");
        assert!(
            passes(&mut tracker, &table, 300, 1).is_empty(),
            "nor resent periodically: the peer owns it"
        );
        // Used here (this node took over): from now on it is ours to send.
        table.refresh(k(1), 900, 310);
        assert_eq!(
            passes(&mut tracker, &table, 310, 1),
            [(k(1).into(), t(5, 900))]
        );

        // A template whose real server cannot be described is retried every pass.
        table.bind(k(2), t(6, 800), 320);
        let mut tries = 0;
        for _ in 0..16 {
            tracker.scan(&table, 320, |key, _| {
                tries += usize::from(key == k(2).into());
                false
            });
        }
        assert_eq!(tries, 2);
        // Forgotten: sent at the next pass although unchanged.
        tracker.forget(k(1));
        assert_eq!(passes(&mut tracker, &table, 330, 1).len(), 2);
    }
    const VIP6: &str = "2001:db8:18::100";
    const RS6: &str = "2001:db8:1a::11";

    /// An IPv6 node: a decoy service first when `decoy`, then a TCP service on
    /// [VIP6]:80 persisting per `/prefix6` with an IPv6 NAT real server and an IPv4
    /// one behind NAT64 (FullNAT, one IPv4 local address).
    fn node6(decoy: bool, prefix6: u8) -> ServiceTable {
        let mut table = ServiceTable::new();
        if decoy {
            table
                .add_service(service_key(), SchedulerKind::Rr, None)
                .unwrap();
        }
        let key = ServiceKey::new(Protocol::Tcp, VIP6.parse::<Ipv6Addr>().unwrap(), 80);
        table
            .add_service(
                key,
                SchedulerKind::Rr,
                Some(Persistence::with_prefix6(300, prefix6)),
            )
            .unwrap();
        let rs6: Ipv6Addr = RS6.parse().unwrap();
        table
            .add_server(key, RealServerSpec::new(rs6, 8080, 1, ForwardMode::Nat))
            .unwrap();
        table
            .add_laddr(key, Ipv4Addr::new(10, 1, 255, 1).into())
            .unwrap();
        table
            .add_server(key, RealServerSpec::new(RS1, 8080, 1, ForwardMode::FullNat))
            .unwrap();
        table
    }

    /// IPv6 templates travel as IPv6 template records, to the peer's own ids, for an
    /// IPv6 and a NAT64 real server; the prefix length must be the service's there.
    #[test]
    fn an_ipv6_template_maps_to_the_peers_own_ids_by_identity() {
        let (active, standby) = (node6(false, 64), node6(true, 64));
        let client: Ipv6Addr = "2001:db8:2:0:1:2:3:4".parse().unwrap();
        for rs in [RS6.parse::<IpAddr>().unwrap(), IpAddr::V4(RS1)] {
            let id = |table: &ServiceTable| {
                let s = table
                    .get(ServiceKey::new(
                        Protocol::Tcp,
                        VIP6.parse::<IpAddr>().unwrap(),
                        80,
                    ))
                    .unwrap();
                (s.id, s.real_servers.iter().find(|r| r.ip == rs).unwrap().id)
            };
            let (service, real) = id(&active);
            let key = TemplateKey6::new(service, client, 64);
            let record = ServicesById::new(&active)
                .record(key, t(real, 1600), 1000, 100)
                .unwrap();
            assert!(record.is_ipv6());
            assert_eq!(record.client, "[2001:db8:2::]:0".parse().unwrap());
            assert_eq!(record.client_prefix_len, 64);
            assert_eq!(record.real_server, SocketAddr::new(rs, 8080));
            assert_eq!(record.timeout_ms, 60_000);
            let (service2, real2) = id(&standby);
            assert_ne!(service, service2);
            let (k, template) = identify(&standby, &record, 50, 10).unwrap();
            assert_eq!(k, TemplateId::V6(TemplateKey6::new(service2, client, 64)));
            assert_eq!(template, Some(t(real2, 50 + 6000)));
            // Into the standby's table, where its workers look IPv6 clients up.
            let table = PersistTable::with_capacity(64);
            assert_eq!(apply(&table, k, template, 50), Applied::Created);
            assert_eq!(
                table.lookup6(TemplateKey6::new(service2, client, 64), 60),
                template
            );
            assert_eq!(apply(&table, k, None, 60), Applied::Removed);
            assert_eq!(k.lookup(&table, 60), None);
            // Another prefix length here: the network means nothing here.
            assert_eq!(
                identify(&node6(false, 48), &record, 50, 10),
                Err(Skip::OtherNetmask)
            );
        }
        // A network with bits past the service's prefix (edited since) is not sent.
        let odd = TemplateKey6 {
            service: 0,
            network: client,
        };
        assert!(ServicesById::new(&active)
            .record(odd, t(0, 1600), 1000, 100)
            .is_none());
    }

    /// The tracker's pass covers the IPv6 half of the table too.
    #[test]
    fn the_tracker_sends_ipv6_templates_too() {
        let table = PersistTable::with_capacity(64);
        let mut tracker = TemplateTracker::new(&table, 8, 100);
        let key6 = TemplateKey6::new(1, "2001:db8::7".parse().unwrap(), 128);
        table.bind(k(1), t(1, 1000), 0);
        table.bind6(key6, t(2, 1000), 0);
        let mut sent = passes(&mut tracker, &table, 0, 1);
        sent.sort_by_key(|(id, _)| matches!(id, TemplateId::V6(_)));
        assert_eq!(sent, [(k(1).into(), t(1, 1000)), (key6.into(), t(2, 1000))]);
        assert!(passes(&mut tracker, &table, 10, 1).is_empty());
        table.refresh6(key6, 1200, 20);
        assert_eq!(
            passes(&mut tracker, &table, 20, 1),
            [(key6.into(), t(2, 1200))]
        );
        tracker.received(key6, t(2, 1200), 30);
        table.remove6(key6);
        passes(&mut tracker, &table, 40, 2);
        assert_eq!(tracker.len(), 1, "the gone IPv6 template forgotten");
    }

    #[test]
    fn a_template_pinned_to_the_sorry_server_maps_by_identity() {
        const SORRY: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 99);
        let with_sorry = |decoys| {
            let mut t = node(decoys, MASK24, &[RS1]);
            t.set_sorry_server(
                service_key(),
                Some(SorryServerSpec {
                    ip: SORRY.into(),
                    port: 80,
                    mode: ForwardMode::Nat,
                    inhibit: false,
                }),
            )
            .unwrap();
            t
        };
        let sorry_id = |t: &ServiceTable| {
            let s = t.get(service_key()).unwrap();
            (s.id, s.sorry_server.unwrap().id)
        };
        let active = with_sorry(0);
        let standby = with_sorry(2);
        let (service, real) = sorry_id(&active);
        let key = TemplateKey {
            service,
            network: u32::from(NET),
        };
        let template = Template::new(real, 1600, Trust::Unverified);
        let record = ServicesById::new(&active)
            .record(key, template, 1000, 100)
            .expect("a template to the sorry server is described");
        assert_eq!(record.real_server, SocketAddrV4::new(SORRY, 80).into());
        assert_eq!(record.mode, ForwardMode::Nat);

        let (service2, real2) = sorry_id(&standby);
        assert_ne!(real, real2);
        assert_eq!(
            identify(&standby, &record, 0, 100),
            Ok((
                TemplateId::V4(TemplateKey {
                    service: service2,
                    network: u32::from(NET)
                }),
                Some(Template::new(real2, 600, Trust::Unverified))
            ))
        );
        // A standby without that sorry server cannot place it.
        let bare = node(0, MASK24, &[RS1]);
        assert_eq!(identify(&bare, &record, 0, 100), Err(Skip::UnknownReal));
    }
}
