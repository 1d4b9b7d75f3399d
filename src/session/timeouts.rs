//! How long an idle session lives, per TCP state and for UDP, as in IPVS.
//!
//! Kept in milliseconds so tests can shorten them below a second; the data plane works
//! in timer ticks and converts once, with [`Timeouts::in_ticks`], whenever the settings
//! change, so the per-packet path reads a small array and never divides.
use core::fmt;

use super::state::TcpState;
use crate::model::Protocol;

/// The largest timeout accepted, in seconds: what IPVS accepts with `HZ=1000`
/// (`INT_MAX / HZ`). It also keeps every deadline within half the range of the `u32`
/// tick counter, which the timer wheel's wrapping comparisons need.
pub const MAX_TIMEOUT_SECS: u32 = i32::MAX as u32 / 1000;

const MAX_TIMEOUT_MS: u32 = MAX_TIMEOUT_SECS * 1000;

/// Per-state session timeouts, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    tcp_ms: [u32; TcpState::COUNT],
    udp_ms: u32,
}

/// A timeout out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeoutTooLong {
    pub secs: u64,
}

impl fmt::Display for TimeoutTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "timeout {} s is too long (maximum {MAX_TIMEOUT_SECS} s)",
            self.secs
        )
    }
}

impl std::error::Error for TimeoutTooLong {}

impl Default for Timeouts {
    /// The IPVS defaults (`tcp_timeouts[]`, `udp_timeouts[]`).
    fn default() -> Self {
        let mut tcp_ms = [0; TcpState::COUNT];
        for state in TcpState::ALL {
            tcp_ms[state as usize] = 1000 * default_tcp_secs(state);
        }
        Timeouts {
            tcp_ms,
            udp_ms: 300 * 1000,
        }
    }
}

const fn default_tcp_secs(state: TcpState) -> u32 {
    match state {
        TcpState::None => 2,
        TcpState::Established => 15 * 60,
        TcpState::SynSent => 2 * 60,
        TcpState::SynRecv => 60,
        TcpState::FinWait => 2 * 60,
        TcpState::TimeWait => 2 * 60,
        TcpState::Close => 10,
        TcpState::CloseWait => 60,
        TcpState::LastAck => 30,
        TcpState::Listen => 2 * 60,
        TcpState::SynAck => 2 * 60,
    }
}

impl Timeouts {
    /// The timeout of a TCP session in `state`, in milliseconds.
    #[inline]
    pub fn tcp_ms(&self, state: TcpState) -> u32 {
        self.tcp_ms[state as usize]
    }

    /// The longest timeout of any state or protocol, in milliseconds: how long a
    /// session can outlive the last packet that renewed it.
    pub fn longest_ms(&self) -> u32 {
        self.tcp_ms
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .max(self.udp_ms)
    }

    /// The timeout of a UDP session, in milliseconds.
    #[inline]
    pub fn udp_ms(&self) -> u32 {
        self.udp_ms
    }

    /// The timeout of a session of `proto` in `state` (ignored for UDP), in milliseconds.
    #[inline]
    pub fn session_ms(&self, proto: Protocol, state: TcpState) -> u32 {
        match proto {
            Protocol::Tcp => self.tcp_ms(state),
            Protocol::Udp => self.udp_ms,
        }
    }

    /// Sets one TCP state's timeout. Values above [`MAX_TIMEOUT_SECS`] are clamped, and
    /// zero becomes 1 ms: a session always outlives the packet that armed it.
    pub fn set_tcp_ms(&mut self, state: TcpState, ms: u32) {
        self.tcp_ms[state as usize] = ms.clamp(1, MAX_TIMEOUT_MS);
    }

    /// Sets the UDP timeout; clamped as [`Timeouts::set_tcp_ms`].
    pub fn set_udp_ms(&mut self, ms: u32) {
        self.udp_ms = ms.clamp(1, MAX_TIMEOUT_MS);
    }

    /// `ipvsadm --set tcp tcpfin udp`, in seconds: `tcp` is the ESTABLISHED timeout,
    /// `tcpfin` the FIN_WAIT one. Zero leaves a value unchanged, as with ipvsadm. A
    /// value out of range changes nothing at all.
    pub fn set_tcp_tcpfin_udp(
        &mut self,
        tcp: u32,
        tcpfin: u32,
        udp: u32,
    ) -> Result<(), TimeoutTooLong> {
        for secs in [tcp, tcpfin, udp] {
            if secs > MAX_TIMEOUT_SECS {
                return Err(TimeoutTooLong { secs: secs.into() });
            }
        }
        if tcp != 0 {
            self.set_tcp_ms(TcpState::Established, tcp * 1000);
        }
        if tcpfin != 0 {
            self.set_tcp_ms(TcpState::FinWait, tcpfin * 1000);
        }
        if udp != 0 {
            self.set_udp_ms(udp * 1000);
        }
        Ok(())
    }

    /// `ipvsadm -L --timeout`: (tcp, tcpfin, udp) in whole seconds.
    pub fn get(&self) -> (u32, u32, u32) {
        (
            self.tcp_ms(TcpState::Established) / 1000,
            self.tcp_ms(TcpState::FinWait) / 1000,
            self.udp_ms / 1000,
        )
    }

    /// The same timeouts in ticks of `tick_ms` milliseconds, rounded up so a session
    /// never expires early.
    pub fn in_ticks(&self, tick_ms: u32) -> TickTimeouts {
        assert!(tick_ms > 0, "a tick lasts at least one millisecond");
        let to_ticks = |ms: u32| ms.div_ceil(tick_ms).max(1);
        let mut tcp = [0; TcpState::COUNT];
        for (ticks, ms) in tcp.iter_mut().zip(self.tcp_ms) {
            *ticks = to_ticks(ms);
        }
        TickTimeouts {
            tcp,
            udp: to_ticks(self.udp_ms),
        }
    }
}

/// [`Timeouts`] converted to timer ticks: what a worker reads per packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TickTimeouts {
    tcp: [u32; TcpState::COUNT],
    udp: u32,
}

impl TickTimeouts {
    #[inline]
    pub fn tcp(&self, state: TcpState) -> u32 {
        self.tcp[state as usize]
    }

    #[inline]
    pub fn udp(&self) -> u32 {
        self.udp
    }

    /// The timeout of a session of `proto` in `state` (ignored for UDP), in ticks.
    #[inline]
    pub fn session(&self, proto: Protocol, state: TcpState) -> u32 {
        match proto {
            Protocol::Tcp => self.tcp(state),
            Protocol::Udp => self.udp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_ipvs_defaults() {
        let t = Timeouts::default();
        let want = [
            (TcpState::None, 2),
            (TcpState::Established, 900),
            (TcpState::SynSent, 120),
            (TcpState::SynRecv, 60),
            (TcpState::FinWait, 120),
            (TcpState::TimeWait, 120),
            (TcpState::Close, 10),
            (TcpState::CloseWait, 60),
            (TcpState::LastAck, 30),
            (TcpState::Listen, 120),
            (TcpState::SynAck, 120),
        ];
        assert_eq!(want.len(), TcpState::COUNT);
        for (state, secs) in want {
            assert_eq!(t.tcp_ms(state), secs * 1000, "{state}");
        }
        assert_eq!(t.udp_ms(), 300_000);
        assert_eq!(t.get(), (900, 120, 300));
        assert_eq!(t.session_ms(Protocol::Udp, TcpState::Established), 300_000);
        assert_eq!(t.session_ms(Protocol::Tcp, TcpState::Close), 10_000);
    }

    #[test]
    fn set_like_ipvsadm_zero_keeps() {
        let mut t = Timeouts::default();
        t.set_tcp_tcpfin_udp(3600, 0, 60).unwrap();
        assert_eq!(t.get(), (3600, 120, 60));
        t.set_tcp_tcpfin_udp(0, 30, 0).unwrap();
        assert_eq!(t.get(), (3600, 30, 60));
        // Other states are untouched.
        assert_eq!(t.tcp_ms(TcpState::TimeWait), 120_000);
        assert_eq!(t.tcp_ms(TcpState::SynRecv), 60_000);
    }

    #[test]
    fn out_of_range_changes_nothing() {
        let mut t = Timeouts::default();
        let err = t
            .set_tcp_tcpfin_udp(10, 10, MAX_TIMEOUT_SECS + 1)
            .unwrap_err();
        assert_eq!(err.secs, u64::from(MAX_TIMEOUT_SECS) + 1);
        assert_eq!(t, Timeouts::default());
        t.set_tcp_tcpfin_udp(MAX_TIMEOUT_SECS, 0, 0).unwrap();
        assert_eq!(t.get().0, MAX_TIMEOUT_SECS);
    }

    #[test]
    fn ticks_round_up_and_are_never_zero() {
        let mut t = Timeouts::default();
        t.set_tcp_ms(TcpState::Close, 25);
        t.set_tcp_ms(TcpState::None, 0);
        t.set_udp_ms(1);
        let ticks = t.in_ticks(10);
        assert_eq!(ticks.tcp(TcpState::Established), 90_000);
        assert_eq!(ticks.tcp(TcpState::Close), 3);
        assert_eq!(ticks.tcp(TcpState::None), 1);
        assert_eq!(ticks.udp(), 1);
        assert_eq!(ticks.session(Protocol::Udp, TcpState::Close), 1);
        assert_eq!(ticks.session(Protocol::Tcp, TcpState::Close), 3);
        // The longest timeout at 1 ms ticks stays below 2^31 ticks.
        t.set_tcp_tcpfin_udp(MAX_TIMEOUT_SECS, 0, 0).unwrap();
        assert!(t.in_ticks(1).tcp(TcpState::Established) < 1 << 31);
    }
}
