//! The VRRPv3 state machine (RFC 5798 section 6.4) for one virtual router, as a pure
//! function: [`Router::step`] takes an event and the time and returns the next router
//! and what to do. No socket, no clock, no timer thread: the management core feeds it
//! received advertisements (already checked: TTL 255, this VRID, valid checksum, see
//! `crate::wire::vrrp`), a timer tick whenever [`Router::next_deadline`] passes, and
//! startup/shutdown; it sends what the returned [`Actions`] ask for.
//!
//! Times are milliseconds on any monotonic clock; intervals are centiseconds, as on
//! the wire, so the RFC's integer formulas give the RFC's (and keepalived's) results:
//!
//! - `Skew_Time = ((256 - Priority) * Master_Adver_Interval) / 256`
//! - `Master_Down_Interval = 3 * Master_Adver_Interval + Skew_Time`
//!
//! Priority 255 is the address owner (it becomes master at once on startup); a
//! master that shuts down sends priority 0, and backups then take over after
//! `Skew_Time` instead of `Master_Down_Interval`. The higher priority wins; equal
//! priorities are broken by the higher primary address. Accept_Mode is not modelled:
//! Sluice owns the VIPs' traffic while master and nothing else.
use std::net::Ipv4Addr;

/// Priority of the router that owns the virtual addresses.
pub const OWNER_PRIORITY: u8 = 255;
/// Priority a master sends when it gives up the role.
pub const RESIGN_PRIORITY: u8 = 0;
/// The default priority of a backup (RFC 5798 section 6.1).
pub const DEFAULT_PRIORITY: u8 = 100;
/// The default advertisement interval: 1 s.
pub const DEFAULT_ADVERT_INTERVAL_CS: u16 = 100;

/// One virtual router's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VrrpConfig {
    pub vrid: u8,
    /// 1..=255; 255 only on the router owning the addresses.
    pub priority: u8,
    /// Our advertisement interval, in centiseconds (1..=4095).
    pub advert_interval_cs: u16,
    /// Whether a higher-priority backup takes over from a lower-priority master.
    pub preempt: bool,
    /// Our primary address: the advertisements' source, the tie breaker.
    pub primary_addr: Ipv4Addr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    Initialize,
    Backup,
    Master,
}

/// A received advertisement, reduced to what the state machine uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advert {
    pub priority: u8,
    /// The sender's Max Adver Int, in centiseconds.
    pub max_advert_interval_cs: u16,
    /// The IPv4 source of the advertisement: the sender's primary address.
    pub sender: Ipv4Addr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Startup,
    Shutdown,
    /// Time has passed; timers due at `now` fire.
    Tick,
    Advert(Advert),
}

/// What to do after a step; several may be set at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Actions(u8);

impl Actions {
    /// Send an advertisement with our priority and interval.
    pub const SEND_ADVERT: Actions = Actions(1 << 0);
    /// Send an advertisement with priority 0: we stop being master.
    pub const SEND_RESIGN: Actions = Actions(1 << 1);
    /// Send a gratuitous ARP for each VIP, so switches and hosts learn our MAC.
    pub const SEND_GRATUITOUS_ARP: Actions = Actions(1 << 2);
    /// Start answering ARP for the VIPs and forwarding their traffic.
    pub const START_SERVING_VIPS: Actions = Actions(1 << 3);
    /// Stop answering ARP for the VIPs and forwarding their traffic.
    pub const STOP_SERVING_VIPS: Actions = Actions(1 << 4);

    pub const fn none() -> Actions {
        Actions(0)
    }

    pub const fn contains(self, other: Actions) -> bool {
        self.0 & other.0 == other.0
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl core::ops::BitOr for Actions {
    type Output = Actions;
    fn bitor(self, other: Actions) -> Actions {
        Actions(self.0 | other.0)
    }
}

/// `((256 - priority) * interval) / 256`, in centiseconds.
pub const fn skew_time_cs(priority: u8, master_adver_interval_cs: u16) -> u32 {
    ((256 - priority as u32) * master_adver_interval_cs as u32) / 256
}

/// `3 * interval + skew`, in centiseconds.
pub const fn master_down_interval_cs(priority: u8, master_adver_interval_cs: u16) -> u32 {
    3 * master_adver_interval_cs as u32 + skew_time_cs(priority, master_adver_interval_cs)
}

/// A master answers another router's resignation (priority 0) at once, but at most
/// this often: anyone on the link can send one from a peer's address (VRRPv3 has no
/// authentication), and each answer goes to every peer in unicast mode.
pub const RESIGN_ANSWER_GAP_MS: u64 = 100;

/// The interval learned from an advertisement, at least 1 cs: an interval of 0 (no
/// router sends one) would make the master-down time 0 and the backup take over at
/// once after every advertisement.
fn learned_interval_cs(advertised: u16) -> u16 {
    advertised.max(1)
}

const fn cs_to_ms(cs: u32) -> u64 {
    cs as u64 * 10
}

/// One virtual router: its configuration, state and timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Router {
    pub config: VrrpConfig,
    pub state: State,
    /// The master's advertisement interval, learned from its advertisements.
    pub master_adver_interval_cs: u16,
    /// Master: when the next advertisement is due.
    pub adver_deadline_ms: Option<u64>,
    /// Backup: when the master is declared down.
    pub master_down_deadline_ms: Option<u64>,
    /// Master: when it last answered a resignation at once.
    pub resign_answered_ms: Option<u64>,
}

impl Router {
    pub fn new(config: VrrpConfig) -> Router {
        Router {
            config,
            state: State::Initialize,
            master_adver_interval_cs: config.advert_interval_cs,
            adver_deadline_ms: None,
            master_down_deadline_ms: None,
            resign_answered_ms: None,
        }
    }

    /// When the next [`Event::Tick`] is needed.
    pub fn next_deadline(&self) -> Option<u64> {
        match self.state {
            State::Initialize => None,
            State::Backup => self.master_down_deadline_ms,
            State::Master => self.adver_deadline_ms,
        }
    }

    pub fn skew_time_cs(&self) -> u32 {
        skew_time_cs(self.config.priority, self.master_adver_interval_cs)
    }

    pub fn master_down_interval_cs(&self) -> u32 {
        master_down_interval_cs(self.config.priority, self.master_adver_interval_cs)
    }

    /// The router after `event` at `now_ms`, and what to do.
    #[must_use]
    pub fn step(&self, event: Event, now_ms: u64) -> (Router, Actions) {
        let mut next = *self;
        let actions = next.apply(event, now_ms);
        (next, actions)
    }

    fn apply(&mut self, event: Event, now: u64) -> Actions {
        match (self.state, event) {
            (State::Initialize, Event::Startup) => {
                if self.config.priority == OWNER_PRIORITY {
                    self.become_master(now)
                } else {
                    self.master_adver_interval_cs = self.config.advert_interval_cs;
                    self.become_backup(now);
                    Actions::none()
                }
            }
            (State::Initialize, _) => Actions::none(),

            (State::Backup, Event::Shutdown) => {
                self.enter_initialize();
                Actions::none()
            }
            (State::Backup, Event::Tick) => match self.master_down_deadline_ms {
                Some(deadline) if now >= deadline => self.become_master(now),
                _ => Actions::none(),
            },
            (State::Backup, Event::Advert(advert)) => {
                if advert.priority == RESIGN_PRIORITY {
                    // The master is leaving: take over after the skew only, so the
                    // highest-priority backup answers first.
                    self.master_down_deadline_ms = Some(now + cs_to_ms(self.skew_time_cs()));
                } else if !self.config.preempt || advert.priority >= self.config.priority {
                    self.master_adver_interval_cs =
                        learned_interval_cs(advert.max_advert_interval_cs);
                    self.become_backup(now);
                }
                // Else: a lower-priority master and we preempt; let the timer run out.
                Actions::none()
            }
            (State::Backup, Event::Startup) => Actions::none(),

            (State::Master, Event::Shutdown) => {
                self.enter_initialize();
                Actions::SEND_RESIGN | Actions::STOP_SERVING_VIPS
            }
            (State::Master, Event::Tick) => match self.adver_deadline_ms {
                Some(deadline) if now >= deadline => {
                    self.arm_advert(now);
                    Actions::SEND_ADVERT
                }
                _ => Actions::none(),
            },
            (State::Master, Event::Advert(advert)) => {
                if advert.priority == RESIGN_PRIORITY {
                    // Another master resigned (a split brain ending): assert ourselves,
                    // unless that was just done (the regular advertisement follows).
                    if self
                        .resign_answered_ms
                        .is_some_and(|t| now.saturating_sub(t) < RESIGN_ANSWER_GAP_MS)
                    {
                        return Actions::none();
                    }
                    self.resign_answered_ms = Some(now);
                    self.arm_advert(now);
                    Actions::SEND_ADVERT
                } else if advert.priority > self.config.priority
                    || (advert.priority == self.config.priority
                        && advert.sender > self.config.primary_addr)
                {
                    self.adver_deadline_ms = None;
                    self.master_adver_interval_cs =
                        learned_interval_cs(advert.max_advert_interval_cs);
                    self.become_backup(now);
                    Actions::STOP_SERVING_VIPS
                } else {
                    Actions::none()
                }
            }
            (State::Master, Event::Startup) => Actions::none(),
        }
    }

    /// Applies a reloaded priority, advertisement interval and preempt flag (the VRID
    /// and the primary address need a restart). A master advertises the new values at
    /// once; a backup keeps its timer: with preempt and a priority now above the
    /// master's, it ignores the master's advertisements from here on and takes over
    /// when the master-down timer runs out (a planned switchover).
    #[must_use]
    pub fn reconfigure(
        &self,
        priority: u8,
        advert_interval_cs: u16,
        preempt: bool,
        now_ms: u64,
    ) -> (Router, Actions) {
        let mut next = *self;
        next.config.priority = priority;
        next.config.advert_interval_cs = advert_interval_cs;
        next.config.preempt = preempt;
        let actions = if next.state == State::Master {
            next.master_adver_interval_cs = advert_interval_cs;
            next.arm_advert(now_ms);
            Actions::SEND_ADVERT
        } else {
            Actions::none()
        };
        (next, actions)
    }

    fn become_master(&mut self, now: u64) -> Actions {
        self.state = State::Master;
        self.master_down_deadline_ms = None;
        self.arm_advert(now);
        Actions::SEND_ADVERT | Actions::SEND_GRATUITOUS_ARP | Actions::START_SERVING_VIPS
    }

    fn become_backup(&mut self, now: u64) {
        self.state = State::Backup;
        self.master_down_deadline_ms = Some(now + cs_to_ms(self.master_down_interval_cs()));
    }

    fn arm_advert(&mut self, now: u64) {
        self.adver_deadline_ms = Some(now + cs_to_ms(self.config.advert_interval_cs as u32));
    }

    fn enter_initialize(&mut self) {
        self.state = State::Initialize;
        self.adver_deadline_ms = None;
        self.master_down_deadline_ms = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOW_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    const HIGH_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);

    fn config(priority: u8, addr: Ipv4Addr) -> VrrpConfig {
        VrrpConfig {
            vrid: 51,
            priority,
            advert_interval_cs: DEFAULT_ADVERT_INTERVAL_CS,
            preempt: true,
            primary_addr: addr,
        }
    }

    fn advert(priority: u8, sender: Ipv4Addr) -> Event {
        advert_every(priority, 100, sender)
    }

    /// An advert that announces `interval_cs`.
    fn advert_every(priority: u8, interval_cs: u16, sender: Ipv4Addr) -> Event {
        Event::Advert(Advert {
            priority,
            max_advert_interval_cs: interval_cs,
            sender,
        })
    }

    fn started(config: VrrpConfig, now: u64) -> Router {
        Router::new(config).step(Event::Startup, now).0
    }

    const TAKEOVER: Actions = Actions(
        Actions::SEND_ADVERT.0 | Actions::SEND_GRATUITOUS_ARP.0 | Actions::START_SERVING_VIPS.0,
    );

    #[test]
    fn rfc_timer_formulas() {
        // Priority 100 at 1 s: skew 60 cs, master down 3.6 s (keepalived agrees).
        assert_eq!(skew_time_cs(100, 100), 60);
        assert_eq!(master_down_interval_cs(100, 100), 360);
        assert_eq!(skew_time_cs(255, 100), 0);
        assert_eq!(skew_time_cs(1, 100), 99);
        assert_eq!(
            master_down_interval_cs(200, 4095),
            3 * 4095 + 56 * 4095 / 256
        );
        // Higher priority, shorter wait: the best backup speaks first.
        assert!(master_down_interval_cs(200, 100) < master_down_interval_cs(100, 100));
    }

    #[test]
    fn owner_becomes_master_at_once() {
        let (router, actions) = Router::new(config(255, LOW_ADDR)).step(Event::Startup, 0);
        assert_eq!(router.state, State::Master);
        assert_eq!(actions, TAKEOVER);
        assert_eq!(router.next_deadline(), Some(1000));
    }

    #[test]
    fn backup_takes_over_when_the_master_falls_silent() {
        let router = started(config(100, LOW_ADDR), 1_000);
        assert_eq!(router.state, State::Backup);
        assert_eq!(router.next_deadline(), Some(1_000 + 3_600));
        let (same, actions) = router.step(Event::Tick, 4_599);
        assert_eq!((same.state, actions), (State::Backup, Actions::none()));
        let (master, actions) = router.step(Event::Tick, 4_600);
        assert_eq!((master.state, actions), (State::Master, TAKEOVER));
        // Then advertises every interval.
        let (master, actions) = master.step(Event::Tick, 5_599);
        assert!(actions.is_empty());
        let (master, actions) = master.step(Event::Tick, 5_600);
        assert_eq!(actions, Actions::SEND_ADVERT);
        assert_eq!(master.next_deadline(), Some(6_600));
    }

    #[test]
    fn adverts_keep_a_backup_backup_and_teach_the_interval() {
        let mut router = started(config(100, LOW_ADDR), 0);
        for now in (1_000..20_000).step_by(1_000) {
            let (next, actions) = router.step(advert(200, HIGH_ADDR), now);
            assert!(actions.is_empty());
            router = next.step(Event::Tick, now + 1).0;
            assert_eq!(router.state, State::Backup);
        }
        // A master advertising every 2 s: master down becomes 3 * 200 + 121 cs.
        let slow = advert_every(200, 200, HIGH_ADDR);
        let (router, _) = router.step(slow, 50_000);
        assert_eq!(router.master_adver_interval_cs, 200);
        assert_eq!(router.next_deadline(), Some(50_000 + 10 * (600 + 121)));
    }

    /// Resignations sent as fast as a forger can (one a millisecond for a second):
    /// the master answers the first at once and then at most one per 100 ms.
    #[test]
    fn a_master_answers_resignations_at_most_every_100_ms() {
        let mut router = started(config(OWNER_PRIORITY, LOW_ADDR), 0);
        assert_eq!(router.state, State::Master);
        let mut answered = Vec::new();
        for t in 1_000..2_000 {
            let (next, actions) = router.step(advert(RESIGN_PRIORITY, HIGH_ADDR), t);
            router = next;
            if actions.contains(Actions::SEND_ADVERT) {
                answered.push(t);
            }
        }
        assert_eq!(answered, (1_000..2_000).step_by(100).collect::<Vec<_>>());
    }

    /// An advertised interval of 0 is learned as 1 cs: the backup still waits three
    /// intervals and the skew, not 0.
    #[test]
    fn an_interval_of_zero_is_learned_as_one_centisecond() {
        let router = started(config(100, LOW_ADDR), 0);
        let zero = advert_every(200, 0, HIGH_ADDR);
        let (router, _) = router.step(zero, 5_000);
        assert_eq!(router.master_adver_interval_cs, 1);
        assert_eq!(router.next_deadline(), Some(5_000 + 30));
    }

    #[test]
    fn resigning_master_hands_over_after_the_skew() {
        let router = started(config(100, LOW_ADDR), 0);
        let (router, actions) = router.step(advert(RESIGN_PRIORITY, HIGH_ADDR), 500);
        assert!(actions.is_empty());
        assert_eq!(router.next_deadline(), Some(500 + 600), "skew 60 cs");
        let (router, actions) = router.step(Event::Tick, 1_100);
        assert_eq!((router.state, actions), (State::Master, TAKEOVER));
    }

    #[test]
    fn preempt_decides_about_a_lower_priority_master() {
        // With preempt, a lower-priority master's adverts are ignored: we take over.
        let router = started(config(150, LOW_ADDR), 0);
        let deadline = router.next_deadline().unwrap();
        let (router, _) = router.step(advert(100, HIGH_ADDR), deadline - 10);
        assert_eq!(router.next_deadline(), Some(deadline), "timer not reset");
        assert_eq!(router.step(Event::Tick, deadline).0.state, State::Master);

        // Without preempt, it stays master and we stay backup.
        let router = started(
            VrrpConfig {
                preempt: false,
                ..config(150, LOW_ADDR)
            },
            0,
        );
        let (router, _) = router.step(advert(100, HIGH_ADDR), deadline - 10);
        assert_eq!(
            router.next_deadline(),
            Some(deadline - 10 + 3_000 + 10 * 41)
        );
        assert_eq!(router.step(Event::Tick, deadline).0.state, State::Backup);
    }

    fn master(config: VrrpConfig) -> Router {
        let router = started(config, 0);
        let deadline = router.next_deadline().unwrap();
        let (router, _) = router.step(Event::Tick, deadline);
        assert_eq!(router.state, State::Master);
        router
    }

    #[test]
    fn master_yields_to_higher_priority_or_equal_priority_and_higher_address() {
        let low = master(config(100, LOW_ADDR));
        let (r, actions) = low.step(advert(101, LOW_ADDR), 10_000);
        assert_eq!(
            (r.state, actions),
            (State::Backup, Actions::STOP_SERVING_VIPS)
        );
        assert_eq!(r.next_deadline(), Some(10_000 + 3_600));
        // Equal priority: the higher primary address wins.
        let (r, actions) = low.step(advert(100, HIGH_ADDR), 10_000);
        assert_eq!(
            (r.state, actions),
            (State::Backup, Actions::STOP_SERVING_VIPS)
        );
        let high = master(config(100, HIGH_ADDR));
        let (r, actions) = high.step(advert(100, LOW_ADDR), 10_000);
        assert_eq!((r.state, actions), (State::Master, Actions::none()));
        // Lower priority: discarded, whatever the address.
        let (r, actions) = low.step(advert(99, HIGH_ADDR), 10_000);
        assert_eq!((r.state, actions), (State::Master, Actions::none()));
        // Priority 0 from another master: answer at once.
        let (r, actions) = low.step(advert(RESIGN_PRIORITY, HIGH_ADDR), 10_000);
        assert_eq!((r.state, actions), (State::Master, Actions::SEND_ADVERT));
        assert_eq!(r.next_deadline(), Some(11_000));
    }

    #[test]
    fn shutdown_resigns_a_master_and_silences_a_backup() {
        let (r, actions) = master(config(100, LOW_ADDR)).step(Event::Shutdown, 9_000);
        assert_eq!(r.state, State::Initialize);
        assert_eq!(actions, Actions::SEND_RESIGN | Actions::STOP_SERVING_VIPS);
        assert_eq!(r.next_deadline(), None);
        let (r, actions) = started(config(100, LOW_ADDR), 0).step(Event::Shutdown, 1);
        assert_eq!(
            (r.state, actions, r.next_deadline()),
            (State::Initialize, Actions::none(), None)
        );
        // Nothing but startup moves an initialized router.
        let idle = Router::new(config(100, LOW_ADDR));
        for event in [Event::Tick, Event::Shutdown, advert(200, HIGH_ADDR)] {
            assert_eq!(idle.step(event, 5), (idle, Actions::none()));
        }
    }

    /// Two routers on one link, adverts delivered instantly: the higher priority ends
    /// up master, a resigning master is replaced within the skew, and with preempt a
    /// returning higher-priority router takes the role back.
    #[test]
    fn two_routers_converge() {
        let mut a = Router::new(config(200, LOW_ADDR));
        let mut b = Router::new(config(100, HIGH_ADDR));
        fn advert_of(r: &Router, priority: u8) -> Event {
            Event::Advert(Advert {
                priority,
                max_advert_interval_cs: r.config.advert_interval_cs,
                sender: r.config.primary_addr,
            })
        }
        fn tick(me: &mut Router, other: &mut Router, now: u64) {
            let (next, actions) = me.step(Event::Tick, now);
            *me = next;
            if actions.contains(Actions::SEND_ADVERT) {
                *other = other.step(advert_of(me, me.config.priority), now).0;
            }
        }
        // Runs both from `from` to `until` in 10 ms steps.
        fn run(a: &mut Router, b: &mut Router, from: u64, until: u64) {
            for now in (from..=until).step_by(10) {
                tick(a, b, now);
                tick(b, a, now);
            }
        }
        a = a.step(Event::Startup, 0).0;
        b = b.step(Event::Startup, 0).0;
        run(&mut a, &mut b, 0, 10_000);
        assert_eq!((a.state, b.state), (State::Master, State::Backup));

        let (resigned, actions) = a.step(Event::Shutdown, 10_000);
        a = resigned;
        assert!(actions.contains(Actions::SEND_RESIGN));
        b = b.step(advert_of(&a, RESIGN_PRIORITY), 10_000).0;
        run(&mut a, &mut b, 10_000, 10_600);
        assert_eq!(b.state, State::Master, "within skew (60 cs) of the resign");

        a = a.step(Event::Startup, 20_000).0;
        run(&mut a, &mut b, 20_000, 30_000);
        assert_eq!(
            (a.state, b.state),
            (State::Master, State::Backup),
            "preempted"
        );

        // Planned switchover: B's priority raised above A's (a reload). B ignores A's
        // lower adverts from then on and takes over at its master-down time
        // after A's last accepted advert (3 x 1 s + skew of 250: 0.02 s; that advert
        // was at most 1 s before the reload), and A steps down at B's first advert.
        let (reloaded, actions) = b.reconfigure(250, 100, true, 30_000);
        b = reloaded;
        assert_eq!(actions, Actions::none(), "a backup just waits");
        run(&mut a, &mut b, 30_000, 32_000);
        assert_eq!(
            (a.state, b.state),
            (State::Master, State::Backup),
            "not yet"
        );
        run(&mut a, &mut b, 32_000, 34_000);
        assert_eq!(
            (a.state, b.state),
            (State::Backup, State::Master),
            "switched"
        );
        // Without preempt a higher priority changes nothing while a master speaks.
        let (reloaded, actions) = a.reconfigure(254, 100, false, 34_000);
        a = reloaded;
        assert_eq!(actions, Actions::none());
        run(&mut a, &mut b, 34_000, 44_000);
        assert_eq!((a.state, b.state), (State::Backup, State::Master));
        // A master lowering its priority advertises it at once.
        let (reloaded, actions) = b.reconfigure(10, 100, true, 44_000);
        assert_eq!(actions, Actions::SEND_ADVERT);
        assert_eq!(reloaded.adver_deadline_ms, Some(45_000));
    }
}
