//! The simulation core: one [`Scenario`] run through one scheduler kind gives one
//! [`RunResult`]. Pure: no printing, no files, no clock; the same scenario (seed
//! included) always gives the same result.
//!
//! Model, in discrete time steps of `step_s` seconds:
//!
//! - **Servers** are [`RealServer`] values in list order, exactly what a service's
//!   snapshot holds; each also has a `speed` (only used for the lifetime of arriving
//!   connections). Any change to the list (add, remove, weight) rebuilds every
//!   worker's scheduler with [`sched::build_with`] (default parameters, a per-worker
//!   seed derived from the scenario's), carrying on from the one it replaces
//!   ([`sched::Scheduler::inherit`]), as the data plane does when it adopts a new
//!   snapshot: round robin keeps its place (modulo the new list), the random ones
//!   their generator, hash tables are rebuilt. Every pick
//!   gets the simulated clock (`with_now_ms`) and the service address [`VIP`] as the
//!   destination (`with_destination`).
//! - **Long-lived connections** belong to clients (an address each). They are opened
//!   through the scheduler before t = 0 (client by client, interleaved). Each step,
//!   each one closes with the probability that makes `churn_percent` of them close per
//!   minute, and reconnects at once from a new source port through the scheduler.
//! - **Arriving connections** (an open workload): Poisson arrivals at `arrival_rate`
//!   per second, at uniform times inside the step, from `arrival_sources` client
//!   addresses. Each lives an exponential time with mean `mean_lifetime_s / speed` of
//!   the server it lands on: a server twice as fast finishes its connections twice as
//!   soon. Departures and arrivals inside a step are handled in time order.
//! - **Loads** are what `ipvsadm -Ln` would show and what the scheduler is handed in
//!   [`PickContext`]: `active` = open connections; `inactive` = closed ones still
//!   lingering (TIME_WAIT-like) for `linger_s` seconds.
//! - **Workers**: as in the data plane, each worker has its own scheduler instance and
//!   its own per-real-server gauges, and a connection is handled by the worker its
//!   (client address, port) hashes to, so with several workers a least-connection
//!   scheduler only sees its own worker's share of the connections.
//! - **Persistence** (`ipvsadm -p timeout -M netmask`): a template per client network
//!   (address & netmask) names the server; while it lives, new connections from that
//!   network go there without asking the scheduler, even if the server's weight is 0
//!   (IPVS with `expire_quiescent_template = 0`, the default). Each use re-arms it for
//!   `timeout`, it does not expire while connections it placed are open, and it goes
//!   away with its server.
//! - **Events** (add a server, remove one, set a weight) happen at whole minutes. A
//!   removed server's long-lived connections reconnect through the scheduler at once;
//!   its arriving connections are broken (counted in `dropped`). Weight 0 drains: no
//!   new connections, existing ones stay.
//!
//! Samples are taken at every whole minute, after that minute's events.
use crate::model::SchedulerKind;
use crate::model::{ForwardMode, Persistence, RealServer};
use crate::sched::{self, PickContext, Scheduler, SchedulerParams, ServerLoad};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::net::Ipv4Addr;

use crate::model::rng::{mix, Rng};

/// The real-server port used for every simulated server (it plays no part).
const SERVER_PORT: u16 = 80;
/// Ephemeral source ports, Linux's default range.
const PORT_FIRST: u16 = 32768;
const PORT_COUNT: u64 = 28232;
/// The service's address: the destination every connection is for (what `dh`,
/// `lblc` and `lblcr` hash).
pub const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// First source address of arriving (short) connections.
pub const ARRIVAL_BASE: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
/// The longest simulation accepted (one week).
pub const MAX_MINUTES: u32 = 7 * 24 * 60;

/// A real server as a workload describes it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ServerSpec {
    pub ip: Ipv4Addr,
    /// 0..=65535; 0 takes no new connections.
    pub weight: u32,
    /// Relative speed (> 0): arriving connections on this server last `1 / speed` as long.
    pub speed: f64,
}

impl ServerSpec {
    pub fn new(ip: Ipv4Addr, weight: u32) -> Self {
        ServerSpec {
            ip,
            weight,
            speed: 1.0,
        }
    }
}

/// A change to the server list.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Append a server (as `ipvsadm -a`).
    Add(ServerSpec),
    /// Remove the server with this address (as `ipvsadm -d`).
    Remove(Ipv4Addr),
    /// Set the weight of the server with this address (as `ipvsadm -e -w`).
    SetWeight(Ipv4Addr, u32),
}

/// A change at a whole minute (0 = right after the initial connections are placed).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Event {
    pub minute: u32,
    pub change: Change,
}

/// A client host holding long-lived connections.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ClientSpec {
    pub ip: Ipv4Addr,
    pub connections: u32,
}

/// Everything one simulation run needs besides the scheduler kind.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scenario {
    /// The servers before t = 0, in list (scheduling) order.
    pub servers: Vec<ServerSpec>,
    /// Changes, applied in minute order (file order within a minute).
    pub events: Vec<Event>,
    /// Long-lived connections, opened before t = 0.
    pub clients: Vec<ClientSpec>,
    /// Percent of the long-lived connections that close and reconnect per minute.
    pub churn_percent: f64,
    /// New short connections per second (0: none).
    pub arrival_rate: f64,
    /// Mean lifetime of an arriving connection on a server of speed 1, in seconds.
    pub mean_lifetime_s: f64,
    /// Distinct source addresses of arriving connections (from [`ARRIVAL_BASE`]).
    pub arrival_sources: u32,
    /// Simulated time, in minutes.
    pub minutes: u32,
    /// Step length in seconds; divides 60.
    pub step_s: u32,
    pub seed: u64,
    /// Data-plane workers, each with its own scheduler and gauges.
    pub workers: u32,
    pub persistence: Option<Persistence>,
    /// Seconds a closed connection stays counted as inactive (0: not at all).
    pub linger_s: u32,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            servers: Vec::new(),
            events: Vec::new(),
            clients: Vec::new(),
            churn_percent: 0.0,
            arrival_rate: 0.0,
            mean_lifetime_s: 1.0,
            arrival_sources: 1000,
            minutes: 60,
            step_s: 1,
            seed: 1,
            workers: 1,
            persistence: None,
            linger_s: 0,
        }
    }
}

impl Scenario {
    /// Checks the numbers and that every event names a server that exists (or, for
    /// `Add`, does not yet exist) at its minute.
    pub fn validate(&self) -> Result<(), String> {
        if self.minutes == 0 || self.minutes > MAX_MINUTES {
            return Err(format!("minutes must be 1..={MAX_MINUTES}"));
        }
        if self.step_s == 0 || 60 % self.step_s != 0 {
            return Err(format!(
                "step of {} s does not divide a minute (use 1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30 or 60)",
                self.step_s
            ));
        }
        if !(0.0..=100.0).contains(&self.churn_percent) {
            return Err(format!("churn {} is not 0..=100 %", self.churn_percent));
        }
        if !(self.arrival_rate.is_finite() && self.arrival_rate >= 0.0) {
            return Err(format!("arrival rate {} is not >= 0", self.arrival_rate));
        }
        if self.arrival_rate > 1_000_000.0 {
            return Err("arrival rate above 1000000 per second".into());
        }
        if !(self.mean_lifetime_s.is_finite() && self.mean_lifetime_s > 0.0) {
            return Err(format!("lifetime {} is not > 0", self.mean_lifetime_s));
        }
        if self.arrival_sources == 0 {
            return Err("arrival sources must be at least 1".into());
        }
        if self.workers == 0 || self.workers > 256 {
            return Err("workers must be 1..=256".into());
        }
        if let Some(p) = self.persistence {
            if p.timeout_s == 0 {
                return Err("persistence timeout must be at least 1 s".into());
            }
            if !p.netmask_is_contiguous() {
                return Err(format!("netmask {} is not contiguous", p.netmask));
            }
        }
        let connections: u64 = self.clients.iter().map(|c| u64::from(c.connections)).sum();
        if connections > 10_000_000 {
            return Err("more than 10000000 long-lived connections".into());
        }
        let mut present: Vec<Ipv4Addr> = Vec::new();
        for s in &self.servers {
            check_server(s)?;
            if present.contains(&s.ip) {
                return Err(format!("server {} is listed twice", s.ip));
            }
            present.push(s.ip);
        }
        for e in sorted_events(&self.events) {
            if e.minute > self.minutes {
                return Err(format!(
                    "event at minute {} is after the end (minute {})",
                    e.minute, self.minutes
                ));
            }
            match e.change {
                Change::Add(s) => {
                    check_server(&s)?;
                    if present.contains(&s.ip) {
                        return Err(format!(
                            "minute {}: server {} is already present",
                            e.minute, s.ip
                        ));
                    }
                    present.push(s.ip);
                }
                Change::Remove(ip) | Change::SetWeight(ip, _) => {
                    let Some(i) = present.iter().position(|&p| p == ip) else {
                        return Err(format!("minute {}: no server {ip} at that time", e.minute));
                    };
                    if let Change::Remove(_) = e.change {
                        present.remove(i);
                    }
                    if let Change::SetWeight(_, w) = e.change {
                        check_weight(w)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn check_weight(weight: u32) -> Result<(), String> {
    if weight > crate::model::MAX_WEIGHT {
        return Err(format!("weight {weight} is above 65535"));
    }
    Ok(())
}

fn check_server(s: &ServerSpec) -> Result<(), String> {
    check_weight(s.weight)?;
    if !(s.speed.is_finite() && s.speed > 0.0) {
        return Err(format!("server {}: speed {} is not > 0", s.ip, s.speed));
    }
    Ok(())
}

/// Events in minute order, stable within a minute.
fn sorted_events(events: &[Event]) -> Vec<Event> {
    let mut sorted = events.to_vec();
    sorted.sort_by_key(|e| e.minute);
    sorted
}

/// Per-server outcome of a run. Servers appear in the order they were first added.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServerResult {
    /// As the service table would assign it: 1, 2, ... in order of addition.
    pub id: u32,
    pub ip: Ipv4Addr,
    /// Weight at the end (or when removed).
    pub weight: u32,
    pub speed: f64,
    /// Still in the server list at the end.
    pub present: bool,
    /// Connections the scheduler (or a persistence template) sent here at t >= 0,
    /// reconnections included.
    pub new_connections: u64,
    /// Mean of the active count over the step ends of the run (0 while absent).
    pub mean_active: f64,
    /// Highest active count at a step end.
    pub peak_active: u32,
    pub final_active: u32,
    pub final_inactive: u32,
}

/// The active connections per server at a whole minute, after that minute's events.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sample {
    pub minute: u32,
    /// Indexed like [`RunResult::servers`]; `None` while the server is not in the list.
    pub active: Vec<Option<u32>>,
}

impl Sample {
    /// Active connections on all servers present.
    pub fn total(&self) -> u64 {
        self.active.iter().flatten().map(|&a| u64::from(a)).sum()
    }

    /// max / mean of the active counts over the servers present (1.0 = perfectly
    /// even; 0.0 when there are no connections).
    pub fn skew(&self) -> f64 {
        let counts: Vec<u32> = self.active.iter().flatten().copied().collect();
        skew(&counts)
    }
}

/// max / mean of `counts` (0.0 when empty or all zero).
pub fn skew(counts: &[u32]) -> f64 {
    let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    if counts.is_empty() || total == 0 {
        return 0.0;
    }
    let max = counts.iter().copied().max().unwrap_or(0);
    f64::from(max) * counts.len() as f64 / total as f64
}

/// The outcome of one scenario under one scheduler kind.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunResult {
    pub scheduler: SchedulerKind,
    pub servers: Vec<ServerResult>,
    /// One per whole minute, 0..=minutes.
    pub samples: Vec<Sample>,
    /// Connections placed at t >= 0 (the sum of `new_connections`).
    pub scheduled: u64,
    /// New connections no server could take (no server with weight > 0).
    pub refused: u64,
    /// Arriving connections broken because their server was removed.
    pub dropped: u64,
}

impl RunResult {
    /// Index into `servers` of the server with this address (its first appearance, if
    /// it was removed and added again).
    pub fn server_index(&self, ip: Ipv4Addr) -> Option<usize> {
        self.servers.iter().position(|s| s.ip == ip)
    }

    /// Fraction (0..=1) of all active connections held by `ips` at `minute`.
    pub fn share_at(&self, minute: u32, ips: &[Ipv4Addr]) -> f64 {
        let Some(sample) = self.samples.get(minute as usize) else {
            return 0.0;
        };
        let total = sample.total();
        if total == 0 {
            return 0.0;
        }
        let held: u64 = ips
            .iter()
            .filter_map(|&ip| self.server_index(ip))
            .filter_map(|i| sample.active.get(i).copied().flatten())
            .map(u64::from)
            .sum();
        held as f64 / total as f64
    }

    /// Fraction (0..=1) of the connections placed at t >= 0 that went to `ip`.
    pub fn new_share(&self, ip: Ipv4Addr) -> f64 {
        match self.server_index(ip) {
            Some(i) if self.scheduled > 0 => {
                self.servers[i].new_connections as f64 / self.scheduled as f64
            }
            _ => 0.0,
        }
    }

    /// The last sample (the end of the run).
    pub fn last(&self) -> &Sample {
        self.samples
            .last()
            .expect("a run has at least the minute-0 sample")
    }
}

/// Runs `scenario` under `kind`. The scenario must be valid (see
/// [`Scenario::validate`]); an invalid one is reported as an error here too.
pub fn run(scenario: &Scenario, kind: SchedulerKind) -> Result<RunResult, String> {
    scenario.validate()?;
    let mut sim = Sim::new(scenario, kind);
    Ok(sim.run())
}

/// A template's key (client network) and serial (so a connection placed by an expired
/// template never touches a newer one for the same network).
type TemplateRef = (u32, u64);

#[derive(Clone, Copy, Debug)]
struct Template {
    server: u32,
    serial: u64,
    /// Open connections this template placed.
    controlled: u32,
    expires_ms: u64,
}

/// Where an open connection is: real-server id and worker.
#[derive(Clone, Copy, Debug)]
struct Placement {
    server: u32,
    worker: usize,
    template: Option<TemplateRef>,
}

#[derive(Clone, Copy, Debug)]
struct Pooled {
    client: usize,
    placement: Option<Placement>,
}

#[derive(Clone, Copy, Debug)]
struct Short {
    placement: Placement,
    /// false once its server was removed (the heap entry is then skipped).
    alive: bool,
}

struct Sim<'a> {
    sc: &'a Scenario,
    kind: SchedulerKind,
    events: Vec<Event>,
    next_event: usize,
    now_ms: u64,
    /// Count placements into the results (false while placing before t = 0).
    counting: bool,
    /// Independent random streams, so what one part draws does not shift another
    /// (schedulers see the same churn and arrivals whatever they pick).
    churn_rng: Rng,
    arrival_rng: Rng,
    port_rng: Rng,
    /// The current server list, in scheduling order, and each one's speed.
    servers: Vec<RealServer>,
    speeds: Vec<f64>,
    schedulers: Vec<Box<dyn Scheduler>>,
    /// Gauges by [worker][real-server id].
    active: Vec<Vec<u32>>,
    inactive: Vec<Vec<u32>>,
    loads: Vec<ServerLoad>,
    pooled: Vec<Pooled>,
    short: Vec<Short>,
    free_short: Vec<usize>,
    /// (end time, slot) of arriving connections.
    departures: BinaryHeap<Reverse<(u64, usize)>>,
    /// (expiry time, real-server id, worker), in time order (the linger is constant).
    lingering: VecDeque<(u64, u32, usize)>,
    templates: BTreeMap<u32, Template>,
    template_serial: u64,
    results: Vec<ServerResult>,
    active_sums: Vec<u64>,
    steps_counted: u64,
    samples: Vec<Sample>,
    refused: u64,
    dropped: u64,
}

impl<'a> Sim<'a> {
    fn new(sc: &'a Scenario, kind: SchedulerKind) -> Self {
        let workers = sc.workers as usize;
        let mut sim = Sim {
            sc,
            kind,
            events: sorted_events(&sc.events),
            next_event: 0,
            now_ms: 0,
            counting: false,
            churn_rng: Rng::derive(sc.seed, 1),
            arrival_rng: Rng::derive(sc.seed, 2),
            port_rng: Rng::derive(sc.seed, 3),
            servers: Vec::new(),
            speeds: Vec::new(),
            schedulers: Vec::new(),
            active: vec![vec![0]; workers],
            inactive: vec![vec![0]; workers],
            loads: Vec::new(),
            pooled: Vec::new(),
            short: Vec::new(),
            free_short: Vec::new(),
            departures: BinaryHeap::new(),
            lingering: VecDeque::new(),
            templates: BTreeMap::new(),
            template_serial: 0,
            results: Vec::new(),
            active_sums: Vec::new(),
            steps_counted: 0,
            samples: Vec::new(),
            refused: 0,
            dropped: 0,
        };
        for s in &sc.servers {
            sim.add_server(*s);
        }
        sim.rebuild();
        sim
    }

    fn run(&mut self) -> RunResult {
        self.place_clients();
        self.counting = true;
        self.apply_events(0);
        self.record_sample(0);
        let step_ms = u64::from(self.sc.step_s) * 1000;
        let end_ms = u64::from(self.sc.minutes) * 60_000;
        // Probability that a long-lived connection closes within one step: churn C %
        // per minute means C % of the connections close (and reconnect) per minute,
        // and with one-minute steps it is exactly seed 002's per-minute coin flip.
        let step_churn = self.sc.churn_percent / 100.0 * f64::from(self.sc.step_s) / 60.0;
        let mut t = 0;
        while t < end_ms {
            let step_end = t + step_ms;
            self.arrivals(t, step_end);
            self.depart_until(step_end);
            self.now_ms = step_end;
            self.expire_lingering();
            self.expire_templates();
            self.churn(step_churn);
            self.accumulate();
            t = step_end;
            if t % 60_000 == 0 {
                let minute = (t / 60_000) as u32;
                self.apply_events(minute);
                self.record_sample(minute);
            }
        }
        self.finish()
    }

    // --- server list ---------------------------------------------------------------

    fn add_server(&mut self, spec: ServerSpec) {
        let id = self.results.len() as u32 + 1;
        self.servers.push(RealServer {
            id,
            ip: spec.ip.into(),
            port: SERVER_PORT,
            weight: spec.weight,
            mode: ForwardMode::Dr,
            upper: 0,
            lower: 0,
        });
        self.speeds.push(spec.speed);
        for w in 0..self.active.len() {
            self.active[w].push(0);
            self.inactive[w].push(0);
        }
        self.results.push(ServerResult {
            id,
            ip: spec.ip,
            weight: spec.weight,
            speed: spec.speed,
            present: true,
            new_connections: 0,
            mean_active: 0.0,
            peak_active: 0,
            final_active: 0,
            final_inactive: 0,
        });
        self.active_sums.push(0);
    }

    /// A new scheduler per worker for the current list, carrying on from the one it
    /// replaces ([`Scheduler::inherit`]), as a worker does when it adopts a new
    /// snapshot.
    fn rebuild(&mut self) {
        let previous = std::mem::take(&mut self.schedulers);
        self.schedulers = (0..self.sc.workers)
            .map(|worker| {
                let params = SchedulerParams {
                    seed: mix(self.sc.seed ^ mix(u64::from(worker) + 1)),
                    ..SchedulerParams::default()
                };
                let mut scheduler = sched::build_with(self.kind, &self.servers, &params);
                if let Some(old) = previous.get(worker as usize) {
                    scheduler.inherit(old.as_ref());
                }
                scheduler
            })
            .collect();
    }

    fn position(&self, ip: Ipv4Addr) -> Option<usize> {
        self.servers.iter().position(|s| s.ip == ip)
    }

    fn apply_events(&mut self, minute: u32) {
        let mut changed = false;
        let mut orphans = Vec::new();
        while let Some(e) = self.events.get(self.next_event).copied() {
            if e.minute > minute {
                break;
            }
            self.next_event += 1;
            changed = true;
            match e.change {
                Change::Add(spec) => self.add_server(spec),
                Change::SetWeight(ip, weight) => {
                    if let Some(i) = self.position(ip) {
                        self.servers[i].weight = weight;
                        let id = self.servers[i].id;
                        self.results[id as usize - 1].weight = weight;
                    }
                }
                Change::Remove(ip) => {
                    if let Some(i) = self.position(ip) {
                        let id = self.servers.remove(i).id;
                        self.speeds.remove(i);
                        self.results[id as usize - 1].present = false;
                        orphans.extend(self.remove_server_state(id));
                    }
                }
            }
        }
        if changed {
            self.rebuild();
        }
        // Long-lived connections of removed servers reconnect under the new list.
        for index in orphans {
            self.reconnect(index);
        }
    }

    /// Forgets everything about server `id`; returns the long-lived connections that
    /// were on it (now unplaced).
    fn remove_server_state(&mut self, id: u32) -> Vec<usize> {
        for w in 0..self.active.len() {
            self.active[w][id as usize] = 0;
            self.inactive[w][id as usize] = 0;
        }
        self.templates.retain(|_, t| t.server != id);
        for s in self.short.iter_mut() {
            if s.alive && s.placement.server == id {
                s.alive = false;
                self.dropped += 1;
            }
        }
        let mut orphans = Vec::new();
        for (index, p) in self.pooled.iter_mut().enumerate() {
            if p.placement.is_some_and(|pl| pl.server == id) {
                p.placement = None;
                orphans.push(index);
            }
        }
        orphans
    }

    // --- connections ---------------------------------------------------------------

    fn next_port(&mut self) -> u16 {
        PORT_FIRST + self.port_rng.below(PORT_COUNT) as u16
    }

    fn worker_of(&self, ip: Ipv4Addr, port: u16) -> usize {
        let key = (u64::from(u32::from(ip)) << 16) | u64::from(port);
        (mix(key) % u64::from(self.sc.workers)) as usize
    }

    /// Index into `servers` chosen by `worker`'s scheduler, with that worker's loads.
    fn pick(&mut self, worker: usize, ip: Ipv4Addr, port: u16) -> Option<u32> {
        self.loads.clear();
        for rs in &self.servers {
            self.loads.push(ServerLoad {
                active: self.active[worker][rs.id as usize],
                inactive: self.inactive[worker][rs.id as usize],
            });
        }
        let ctx = PickContext::new(ip, port, &self.loads)
            .with_destination(VIP)
            .with_now_ms(self.now_ms);
        let index = self.schedulers[worker].pick(&self.servers, &ctx)?;
        let Some(rs) = self.servers.get(index) else {
            panic!(
                "scheduler {} picked index {index} of {} servers",
                self.kind,
                self.servers.len()
            );
        };
        Some(rs.id)
    }

    /// Opens a connection from `ip:port`: persistence template first, else the
    /// scheduler. None when no server can take it.
    fn open(&mut self, ip: Ipv4Addr, port: u16) -> Option<Placement> {
        let worker = self.worker_of(ip, port);
        let mut template = None;
        let server = match self.sc.persistence {
            Some(p) => {
                let key = u32::from(ip) & u32::from(p.netmask);
                let expires_ms = self.now_ms + u64::from(p.timeout_s) * 1000;
                if let Some(t) = self.templates.get_mut(&key) {
                    t.controlled += 1;
                    t.expires_ms = t.expires_ms.max(expires_ms);
                    template = Some((key, t.serial));
                    Some(t.server)
                } else if let Some(server) = self.pick(worker, ip, port) {
                    self.template_serial += 1;
                    self.templates.insert(
                        key,
                        Template {
                            server,
                            serial: self.template_serial,
                            controlled: 1,
                            expires_ms,
                        },
                    );
                    template = Some((key, self.template_serial));
                    Some(server)
                } else {
                    None
                }
            }
            None => self.pick(worker, ip, port),
        };
        let Some(server) = server else {
            self.refused += 1;
            return None;
        };
        self.active[worker][server as usize] += 1;
        if self.counting {
            self.results[server as usize - 1].new_connections += 1;
        }
        Some(Placement {
            server,
            worker,
            template,
        })
    }

    fn close(&mut self, p: Placement) {
        let gauge = &mut self.active[p.worker][p.server as usize];
        *gauge = gauge.saturating_sub(1);
        if self.sc.linger_s > 0 {
            self.inactive[p.worker][p.server as usize] += 1;
            let until = self.now_ms + u64::from(self.sc.linger_s) * 1000;
            self.lingering.push_back((until, p.server, p.worker));
        }
        if let Some((key, serial)) = p.template {
            if let Some(t) = self.templates.get_mut(&key) {
                if t.serial == serial {
                    t.controlled = t.controlled.saturating_sub(1);
                }
            }
        }
    }

    fn place_clients(&mut self) {
        for (client, c) in self.sc.clients.iter().enumerate() {
            for _ in 0..c.connections {
                self.pooled.push(Pooled {
                    client,
                    placement: None,
                });
            }
        }
        // Open them interleaved: every client's first connection, then every
        // client's second, ... as connection pools that start together would.
        let mut order: Vec<(u32, usize)> = Vec::with_capacity(self.pooled.len());
        let mut first = 0;
        for c in &self.sc.clients {
            for k in 0..c.connections {
                order.push((k, first + k as usize));
            }
            first += c.connections as usize;
        }
        order.sort_by_key(|&(k, index)| (k, index));
        for (_, index) in order {
            self.reconnect(index);
        }
    }

    /// Opens long-lived connection `index` afresh (new source port).
    fn reconnect(&mut self, index: usize) {
        let ip = self.sc.clients[self.pooled[index].client].ip;
        let port = self.next_port();
        self.pooled[index].placement = self.open(ip, port);
    }

    fn churn(&mut self, probability: f64) {
        for index in 0..self.pooled.len() {
            // Drawn for every connection so the sequence does not depend on placement.
            let closes = self.churn_rng.chance(probability);
            match self.pooled[index].placement {
                Some(p) if closes => {
                    self.close(p);
                    self.reconnect(index);
                }
                Some(_) => {}
                // Refused earlier: try again.
                None => self.reconnect(index),
            }
        }
    }

    fn arrivals(&mut self, from_ms: u64, to_ms: u64) {
        if self.sc.arrival_rate <= 0.0 {
            return;
        }
        let span = to_ms - from_ms;
        let count = self
            .arrival_rng
            .poisson(self.sc.arrival_rate * span as f64 / 1000.0);
        let mut times: Vec<u64> = (0..count)
            .map(|_| from_ms + 1 + self.arrival_rng.below(span))
            .collect();
        times.sort_unstable();
        let base = u32::from(ARRIVAL_BASE);
        for at in times {
            self.depart_until(at);
            self.now_ms = at;
            let source = self.arrival_rng.below(u64::from(self.sc.arrival_sources)) as u32;
            let ip = Ipv4Addr::from(base.wrapping_add(source));
            let unit_lifetime = self.arrival_rng.exp1();
            let port = self.next_port();
            let Some(placement) = self.open(ip, port) else {
                continue;
            };
            let speed = self
                .position_of_id(placement.server)
                .map_or(1.0, |i| self.speeds[i]);
            let lifetime_ms = (unit_lifetime * self.sc.mean_lifetime_s * 1000.0 / speed)
                .round()
                .max(1.0) as u64;
            let short = Short {
                placement,
                alive: true,
            };
            let slot = match self.free_short.pop() {
                Some(slot) => {
                    self.short[slot] = short;
                    slot
                }
                None => {
                    self.short.push(short);
                    self.short.len() - 1
                }
            };
            self.departures.push(Reverse((at + lifetime_ms, slot)));
        }
    }

    fn position_of_id(&self, id: u32) -> Option<usize> {
        self.servers.iter().position(|s| s.id == id)
    }

    /// Closes the arriving connections that end at or before `until`.
    fn depart_until(&mut self, until: u64) {
        while let Some(&Reverse((at, slot))) = self.departures.peek() {
            if at > until {
                break;
            }
            self.departures.pop();
            self.now_ms = at;
            let s = self.short[slot];
            if s.alive {
                self.close(s.placement);
            }
            self.short[slot].alive = false;
            self.free_short.push(slot);
        }
    }

    fn expire_lingering(&mut self) {
        while let Some(&(until, server, worker)) = self.lingering.front() {
            if until > self.now_ms {
                break;
            }
            self.lingering.pop_front();
            let gauge = &mut self.inactive[worker][server as usize];
            *gauge = gauge.saturating_sub(1);
        }
    }

    fn expire_templates(&mut self) {
        let Some(p) = self.sc.persistence else {
            return;
        };
        let now = self.now_ms;
        let rearm = u64::from(p.timeout_s) * 1000;
        self.templates.retain(|_, t| {
            if t.expires_ms > now {
                return true;
            }
            // IPVS re-arms a template that still controls connections.
            if t.controlled > 0 {
                t.expires_ms = now + rearm;
                return true;
            }
            false
        });
    }

    // --- measurements --------------------------------------------------------------

    fn server_active(&self, id: u32) -> u32 {
        self.active.iter().map(|w| w[id as usize]).sum()
    }

    fn accumulate(&mut self) {
        self.steps_counted += 1;
        for i in 0..self.servers.len() {
            let id = self.servers[i].id;
            let active = self.server_active(id);
            self.active_sums[id as usize - 1] += u64::from(active);
            let r = &mut self.results[id as usize - 1];
            r.peak_active = r.peak_active.max(active);
        }
    }

    fn record_sample(&mut self, minute: u32) {
        let mut active = vec![None; self.results.len()];
        for rs in &self.servers {
            active[rs.id as usize - 1] = Some(self.server_active(rs.id));
        }
        self.samples.push(Sample { minute, active });
    }

    fn finish(&mut self) -> RunResult {
        let width = self.results.len();
        for s in &mut self.samples {
            s.active.resize(width, None);
        }
        for i in 0..self.servers.len() {
            let id = self.servers[i].id;
            let active = self.server_active(id);
            let inactive: u32 = self.inactive.iter().map(|w| w[id as usize]).sum();
            let r = &mut self.results[id as usize - 1];
            r.final_active = active;
            r.final_inactive = inactive;
        }
        let steps = self.steps_counted.max(1) as f64;
        for (r, sum) in self.results.iter_mut().zip(&self.active_sums) {
            r.mean_active = *sum as f64 / steps;
        }
        RunResult {
            scheduler: self.kind,
            servers: self.results.clone(),
            samples: std::mem::take(&mut self.samples),
            scheduled: self.results.iter().map(|r| r.new_connections).sum(),
            refused: self.refused,
            dropped: self.dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 0, last)
    }

    fn servers(n: u8) -> Vec<ServerSpec> {
        (1..=n).map(|i| ServerSpec::new(ip(i), 1)).collect()
    }

    fn clients(n: u32, each: u32) -> Vec<ClientSpec> {
        (0..n)
            .map(|i| ClientSpec {
                ip: Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 1)) + i),
                connections: each,
            })
            .collect()
    }

    #[test]
    fn initial_placement_under_rr_is_even_and_not_counted_as_new() {
        let sc = Scenario {
            servers: servers(4),
            clients: clients(10, 10),
            minutes: 1,
            ..Scenario::default()
        };
        let r = run(&sc, SchedulerKind::Rr).unwrap();
        assert_eq!(r.samples[0].active, vec![Some(25); 4]);
        assert_eq!(
            r.scheduled, 0,
            "no churn, no arrivals: nothing placed at t >= 0"
        );
        assert_eq!(r.samples.len(), 2);
        assert_eq!(r.last().total(), 100);
    }

    #[test]
    fn churn_reconnects_about_the_configured_fraction() {
        let sc = Scenario {
            servers: servers(4),
            clients: clients(10, 100),
            churn_percent: 10.0,
            minutes: 30,
            ..Scenario::default()
        };
        let r = run(&sc, SchedulerKind::Rr).unwrap();
        // 1000 connections x 10 %/min x 30 min = 3000 reconnections expected.
        assert!((2800..3200).contains(&r.scheduled), "{}", r.scheduled);
        assert_eq!(r.last().total(), 1000, "reconnecting keeps the total");
    }

    #[test]
    fn remove_moves_connections_and_weight_zero_drains() {
        let sc = Scenario {
            servers: servers(3),
            clients: clients(3, 10),
            arrival_rate: 20.0,
            mean_lifetime_s: 5.0,
            churn_percent: 5.0,
            minutes: 10,
            events: vec![
                Event {
                    minute: 2,
                    change: Change::Remove(ip(2)),
                },
                Event {
                    minute: 4,
                    change: Change::SetWeight(ip(3), 0),
                },
            ],
            ..Scenario::default()
        };
        let r = run(&sc, SchedulerKind::Rr).unwrap();
        assert_eq!(
            r.samples[2].active[1], None,
            "removed server absent from minute 2"
        );
        assert!(r.samples[1].active[1].unwrap() > 0);
        // Arriving connections open on the removed server broke: about a third of the
        // 20/s x 5 s = 100 open ones, not the thousands it had over the two minutes.
        assert!((10..70).contains(&r.dropped), "dropped {}", r.dropped);
        assert!(!r.servers[1].present);
        // From minute 4 the drained server gets nothing new: its count only falls.
        let drained: Vec<u32> = r.samples[4..]
            .iter()
            .map(|s| s.active[2].unwrap())
            .collect();
        assert!(drained.windows(2).all(|w| w[1] <= w[0]), "{drained:?}");
        assert!(drained[0] > 0 && *drained.last().unwrap() < drained[0]);
        assert_eq!(r.servers[2].weight, 0);
        // Without arrivals or churn, the removed server's long-lived connections all come back
        // on the others at once.
        let quiet = Scenario {
            arrival_rate: 0.0,
            churn_percent: 0.0,
            ..sc.clone()
        };
        let r = run(&quiet, SchedulerKind::Rr).unwrap();
        assert_eq!(r.samples[1].active, vec![Some(10); 3]);
        assert_eq!(r.samples[2].total(), 30);
        assert_eq!(r.samples[2].active[1], None);
        assert_eq!(r.dropped, 0);
    }

    #[test]
    fn removing_a_drained_server_breaks_nothing() {
        // Drained at minute 1, removed at minute 3: its 1-second connections are long
        // gone, so nothing is dropped (a finished connection is not "broken").
        let sc = Scenario {
            servers: servers(3),
            arrival_rate: 30.0,
            mean_lifetime_s: 1.0,
            minutes: 5,
            events: vec![
                Event {
                    minute: 1,
                    change: Change::SetWeight(ip(2), 0),
                },
                Event {
                    minute: 3,
                    change: Change::Remove(ip(2)),
                },
            ],
            ..Scenario::default()
        };
        let r = run(&sc, SchedulerKind::Rr).unwrap();
        assert!(r.servers[1].new_connections > 0);
        assert_eq!(r.samples[2].active[1], Some(0));
        assert_eq!(r.dropped, 0);
    }

    #[test]
    fn validation_names_the_problem() {
        let mut sc = Scenario {
            servers: servers(2),
            ..Scenario::default()
        };
        sc.events.push(Event {
            minute: 3,
            change: Change::Remove(ip(9)),
        });
        assert!(sc.validate().unwrap_err().contains("no server 10.0.0.9"));
        sc.events[0].change = Change::Add(ServerSpec::new(ip(1), 1));
        assert!(sc.validate().unwrap_err().contains("already present"));
        sc.events.clear();
        sc.step_s = 7;
        assert!(sc.validate().unwrap_err().contains("does not divide"));
        sc.step_s = 1;
        sc.churn_percent = 120.0;
        assert!(run(&sc, SchedulerKind::Rr).is_err());
    }

    #[test]
    fn persistence_pins_a_client_network_and_dies_with_its_server() {
        // Four clients in one /24, persistence with a /24 netmask: one template.
        let sc = Scenario {
            servers: servers(4),
            clients: clients(4, 5),
            churn_percent: 20.0,
            minutes: 10,
            persistence: Some(Persistence {
                netmask: Ipv4Addr::new(255, 255, 255, 0),
                ..Persistence::new(300)
            }),
            events: vec![Event {
                minute: 5,
                change: Change::Remove(ip(1)),
            }],
            ..Scenario::default()
        };
        let r = run(&sc, SchedulerKind::Rr).unwrap();
        for sample in &r.samples {
            let holding = sample.active.iter().flatten().filter(|&&a| a > 0).count();
            assert_eq!(holding, 1, "minute {}: {:?}", sample.minute, sample.active);
        }
        // rr's first pick is server 1; after its removal the template goes with it.
        assert_eq!(r.samples[4].active[0], Some(20));
        assert_eq!(r.samples[5].active[0], None);
        assert_eq!(r.samples[5].total(), 20);
        // Without persistence the same run spreads over all four.
        let loose = run(
            &Scenario {
                persistence: None,
                ..sc.clone()
            },
            SchedulerKind::Rr,
        )
        .unwrap();
        assert_eq!(loose.samples[0].active, vec![Some(5); 4]);
    }

    #[test]
    fn persistence_template_expires_after_idle_timeout() {
        // Short connections of 1 s from one source, arriving every ~10 s on average,
        // a 2 s template: most arrivals find no template and rr moves on, so all
        // four servers get some. With a 1 h template, one server gets everything.
        let base = Scenario {
            servers: servers(4),
            arrival_rate: 0.1,
            arrival_sources: 1,
            mean_lifetime_s: 1.0,
            minutes: 30,
            ..Scenario::default()
        };
        let short = Scenario {
            persistence: Some(Persistence::new(2)),
            ..base.clone()
        };
        let r = run(&short, SchedulerKind::Rr).unwrap();
        assert!(r.servers.iter().all(|s| s.new_connections > 0), "{r:?}");
        let long = Scenario {
            persistence: Some(Persistence::new(3600)),
            ..base
        };
        let r = run(&long, SchedulerKind::Rr).unwrap();
        let used = r.servers.iter().filter(|s| s.new_connections > 0).count();
        assert_eq!(used, 1);
    }

    #[test]
    fn workers_each_run_their_own_round_robin() {
        // 8 connections, 8 workers: each worker's rr starts at the first server, so
        // with about one connection per worker the first servers collect most of
        // them, while one worker spreads them exactly.
        let sc = Scenario {
            servers: servers(8),
            clients: clients(8, 1),
            minutes: 1,
            workers: 8,
            ..Scenario::default()
        };
        let many = run(&sc, SchedulerKind::Rr).unwrap();
        let one = run(
            &Scenario {
                workers: 1,
                ..sc.clone()
            },
            SchedulerKind::Rr,
        )
        .unwrap();
        assert_eq!(one.samples[0].skew(), 1.0);
        assert!(many.samples[0].skew() > 1.0, "{:?}", many.samples[0]);
        assert!(many.samples[0].active[0].unwrap() >= 2);
    }

    #[test]
    fn lingering_connections_show_as_inactive() {
        let sc = Scenario {
            servers: servers(2),
            clients: clients(2, 50),
            churn_percent: 50.0,
            linger_s: 120,
            minutes: 5,
            ..Scenario::default()
        };
        let r = run(&sc, SchedulerKind::Rr).unwrap();
        let inactive: u32 = r.servers.iter().map(|s| s.final_inactive).sum();
        // About 50 closes a minute, each lingering 2 minutes: ~100 inactive.
        assert!((75..125).contains(&inactive), "{inactive}");
        let none = run(
            &Scenario {
                linger_s: 0,
                ..sc.clone()
            },
            SchedulerKind::Rr,
        )
        .unwrap();
        assert!(none.servers.iter().all(|s| s.final_inactive == 0));
    }

    #[test]
    fn skew_is_max_over_mean() {
        assert_eq!(skew(&[47, 6, 5, 4, 4, 3, 3, 2]), 47.0 * 8.0 / 74.0);
        assert_eq!(skew(&[3, 3]), 1.0);
        assert_eq!(skew(&[]), 0.0);
        assert_eq!(skew(&[0, 0]), 0.0);
    }
}
